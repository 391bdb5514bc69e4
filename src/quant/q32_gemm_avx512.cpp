// The 16-row Q4_0 / Q8_0 x Q8_32 prefill kernels (AVX-512 F/BW/VNNI); arithmetic and layout: q32_gemm.h.
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
#include "quant/q32_gemm.h"
#include "quant/vec_dot.h"

namespace strata::q {
namespace {

// One 32-value block of 16 rows, transposed: lane r (int32) of every vector is row r.
struct alignas(64) Blk32 {
  uint8_t q[8][64];  // [k]: lane r = codes 4k .. 4k+3 of row r as u8 (Q4_0: 0..15; Q8_0: q + 128)
  float d[16];
};
static_assert(sizeof(Blk32) == 576);

// Rows [0, 16) of W (row_bytes apart), blocks [0, nb) -> out[nb]. Q4_0 (18-byte blocks: d | qs[16], value
// i < 16 the low nibble of qs[i], value 16 + i the high one) or Q8_0 (34 bytes: d | qs[32] int8).
template <bool kQ8>
void transpose16(const uint8_t* w, int64_t row_bytes, int64_t nb, Blk32* out) {
  const __m512i vidx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(static_cast<int>(row_bytes)));
  constexpr int64_t kBlock = kQ8 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
  const __m512i m4 = _mm512_set1_epi8(0x0F), bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b) {
    Blk32& o = out[b];
    const uint8_t* base = w + b * kBlock;
    if constexpr (kQ8) {
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k)
        _mm512_store_si512(o.q[k], _mm512_xor_si512(_mm512_i32gather_epi32(vidx, base + 2 + 4 * k, 1), bias));
    } else {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m512i g = _mm512_i32gather_epi32(vidx, base + 2 + 4 * k, 1);
        _mm512_store_si512(o.q[k], _mm512_and_si512(g, m4));
        _mm512_store_si512(o.q[4 + k], _mm512_and_si512(_mm512_srli_epi32(g, 4), m4));
      }
    }
    // d: the low 16 bits of the dword at the block's start (d and the first two code bytes)
    _mm512_store_ps(o.d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(vidx, base, 1))));
  }
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 16 rows x NT tokens over the transposed blocks; kOff: the code offset taken back through the activation
// sums (Q4_0: 8, its codes stand for u - 8; Q8_0: 128, the bias the transpose added).
template <int NT, int kOff>
void tile(int64_t nb, const Blk32* wb, const uint8_t* xq, int64_t xs, float* out, int64_t os) {
  __m512 acc[NT];
  const BlockQ8A* x[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps(), x[t] = reinterpret_cast<const BlockQ8A*>(xq + t * xs);
  for (int64_t b = 0; b < nb; ++b) {
    const Blk32& B = wb[b];
    __m512i S[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) S[t] = _mm512_set1_epi32(-kOff * x[t][b].sum);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i wq = _mm512_load_si512(B.q[k]);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) S[t] = _mm512_dpbusd_epi32(S[t], wq, _mm512_set1_epi32(load_i32(x[t][b].qs + 4 * k)));
    }
    const __m512 d = _mm512_load_ps(B.d);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t)
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x[t][b].d)), _mm512_cvtepi32_ps(S[t]), acc[t]);
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(out + t * os, acc[t]);
}

template <bool kQ8>
void gemm16(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok, float* out,
            int64_t os) {
  constexpr int kOff = kQ8 ? 128 : 8;
  const int64_t nb = cols / QK;
  thread_local std::vector<Blk32> buf;  // [nb]; grows once, reused
  if (static_cast<int64_t>(buf.size()) < nb) buf.resize(nb);
  transpose16<kQ8>(w, row_bytes, nb, buf.data());
  over_token_tiles(n_tok, [&](auto nt, int64_t t) {
    tile<decltype(nt)::value, kOff>(nb, buf.data(), xq + t * xs, xs, out + t * os, os);
  });
}

}  // namespace

void q40_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os) {
  gemm16<false>(cols, w, row_bytes, xq, xs, n_tok, out, os);
}

void q80_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os) {
  gemm16<true>(cols, w, row_bytes, xq, xs, n_tok, out, os);
}

}  // namespace strata::q
