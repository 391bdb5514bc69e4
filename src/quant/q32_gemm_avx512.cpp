// The 16-row x Q8_32 prefill kernels of the 32-value formats (AVX-512 F/BW/VNNI); arithmetic and layout:
// q32_gemm.h.
#include <immintrin.h>

// GCC 12 reports the intrinsics' internal _mm512_undefined_*() as (maybe-)uninitialized (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <cstring>
#include <vector>

#include "quant/blocks.h"
#include "quant/gemm16_tiles.h"
#include "quant/iq_tables.h"
#include "quant/q32_gemm.h"
#include "quant/vec_dot.h"

namespace strata::q {
namespace {

// One 32-value block of 16 rows, transposed: lane r (int32) of every vector is row r.
struct alignas(64) Blk32 {
  uint8_t q[8][64];  // [k]: lane r = codes 4k .. 4k+3 of row r as u8 (q32_gemm.h's u)
  float d[16], m[16];  // m: Q4_1 / Q5_1 only
};
static_assert(sizeof(Blk32) == 640);

// Lane r: byte i (i < 4) = bit i of h's lane r (then moved to bit 4 by the caller): four values' fifth bits.
inline __m512i spread4(__m512i h) {
  const __m512i one = _mm512_set1_epi32(1);
  __m512i r = _mm512_and_si512(h, one);
  r = _mm512_or_si512(r, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 1), one), 8));
  r = _mm512_or_si512(r, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 2), one), 16));
  return _mm512_or_si512(r, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 3), one), 24));
}

// Rows [0, 16) of W (row_bytes apart), blocks [0, nb) -> out[nb]. Nibble formats: value i < 16 is the low
// nibble of qs[i], value 16 + i the high one; Q5's fifth bit of value i is bit i of qh (a little-endian u32).
template <Q32 F>
void transpose16(const uint8_t* w, int64_t row_bytes, int64_t nb, Blk32* out) {
  constexpr Q32Layout L = q32_layout(F);
  const __m512i vidx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(static_cast<int>(row_bytes)));
  const __m512i m4 = _mm512_set1_epi8(0x0F), bias = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i lut = _mm512_setzero_si512();  // IQ4_NL: kvalues_iq4nl + 128 in every 128-bit lane (vpshufb)
  if constexpr (F == Q32::IQ4_NL) {
    alignas(16) uint8_t t[16];
    for (int i = 0; i < 16; ++i) t[i] = static_cast<uint8_t>(iq::kIq4nlValues[i] + 128);
    lut = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
  }
  for (int64_t b = 0; b < nb; ++b) {
    Blk32& o = out[b];
    const uint8_t* base = w + b * L.bytes;
    if constexpr (F == Q32::Q8_0) {
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k)
        _mm512_store_si512(o.q[k], _mm512_xor_si512(_mm512_i32gather_epi32(vidx, base + L.qs + 4 * k, 1), bias));
    } else {
      __m512i qh = _mm512_setzero_si512();
      if constexpr (L.qh >= 0) qh = _mm512_i32gather_epi32(vidx, base + L.qh, 1);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m512i g = _mm512_i32gather_epi32(vidx, base + L.qs + 4 * k, 1);
        __m512i lo = _mm512_and_si512(g, m4), hi = _mm512_and_si512(_mm512_srli_epi32(g, 4), m4);
        if constexpr (L.qh >= 0) {
          lo = _mm512_or_si512(lo, _mm512_slli_epi32(spread4(_mm512_srli_epi32(qh, 4 * k)), 4));
          hi = _mm512_or_si512(hi, _mm512_slli_epi32(spread4(_mm512_srli_epi32(qh, 16 + 4 * k)), 4));
        }
        if constexpr (F == Q32::IQ4_NL) lo = _mm512_shuffle_epi8(lut, lo), hi = _mm512_shuffle_epi8(lut, hi);
        _mm512_store_si512(o.q[k], lo);
        _mm512_store_si512(o.q[4 + k], hi);
      }
    }
    // d: the low 16 bits of the dword at the block's start; m (Q4_1 / Q5_1): its high 16 bits
    const __m512i dm = _mm512_i32gather_epi32(vidx, base, 1);
    _mm512_store_ps(o.d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
    if constexpr (L.m >= 0) _mm512_store_ps(o.m, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16))));
  }
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 16 rows x NT tokens over the transposed blocks: the code offset goes through the activation sums, and
// Q4_1 / Q5_1's min has its own float step.
template <int NT, Q32 F>
void tile(int64_t nb, const Blk32* wb, const uint8_t* xq, int64_t xs, float* out, int64_t os) {
  constexpr Q32Layout L = q32_layout(F);
  __m512 acc[NT];
  const BlockQ8A* x[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps(), x[t] = reinterpret_cast<const BlockQ8A*>(xq + t * xs);
  for (int64_t b = 0; b < nb; ++b) {
    const Blk32& B = wb[b];
    __m512i S[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) S[t] = _mm512_set1_epi32(-L.off * x[t][b].sum);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i wq = _mm512_load_si512(B.q[k]);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) S[t] = _mm512_dpbusd_epi32(S[t], wq, _mm512_set1_epi32(load_i32(x[t][b].qs + 4 * k)));
    }
    const __m512 d = _mm512_load_ps(B.d);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const __m512 xd = _mm512_set1_ps(x[t][b].d);
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(S[t]), acc[t]);
      if constexpr (L.m >= 0)
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(B.m), xd), _mm512_set1_ps(static_cast<float>(x[t][b].sum)),
                                 acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(out + t * os, acc[t]);
}

template <Q32 F>
void gemm16(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok, float* out,
            int64_t os) {
  const int64_t nb = cols / QK;
  thread_local std::vector<Blk32> buf;  // [nb]; grows once, reused
  if (static_cast<int64_t>(buf.size()) < nb) buf.resize(nb);
  transpose16<F>(w, row_bytes, nb, buf.data());
  over_token_tiles(n_tok, [&](auto nt, int64_t t) {
    tile<decltype(nt)::value, F>(nb, buf.data(), xq + t * xs, xs, out + t * os, os);
  });
}

}  // namespace

void q32_gemm16_avx512(Q32 f, int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os) {
  switch (f) {
    case Q32::Q4_0: return gemm16<Q32::Q4_0>(cols, w, row_bytes, xq, xs, n_tok, out, os);
    case Q32::Q4_1: return gemm16<Q32::Q4_1>(cols, w, row_bytes, xq, xs, n_tok, out, os);
    case Q32::Q5_0: return gemm16<Q32::Q5_0>(cols, w, row_bytes, xq, xs, n_tok, out, os);
    case Q32::Q5_1: return gemm16<Q32::Q5_1>(cols, w, row_bytes, xq, xs, n_tok, out, os);
    case Q32::Q8_0: return gemm16<Q32::Q8_0>(cols, w, row_bytes, xq, xs, n_tok, out, os);
    case Q32::IQ4_NL: return gemm16<Q32::IQ4_NL>(cols, w, row_bytes, xq, xs, n_tok, out, os);
  }
}

}  // namespace strata::q
