// The 16-row Q4_K x Q8_K prefill kernel (AVX-512 F/BW/VNNI); arithmetic and layout: q4k_gemm.h.
#include <immintrin.h>

// GCC 12 reports the intrinsics' internal _mm512_undefined_*() as (maybe-)uninitialized (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <cstddef>  // offsetof
#include <cstring>
#include <type_traits>
#include <vector>

#include "quant/blocks.h"
#include "quant/gemm16_tiles.h"
#include "quant/iq_gemm_decode.h"
#include "quant/iq_tables.h"
#include "quant/q4k_gemm.h"

namespace strata::q {
namespace {

// One super-block of 16 rows, transposed: lane r (int32) of every vector is row r.
struct alignas(64) Blk16 {
  uint8_t q[8][8][64];  // [sub-block s][k]: lane r = quants 4k .. 4k+3 of sub-block s of row r (u8, 0..15; Q5_K 0..31)
  int32_t sc[8][16];    // [s][r] 6-bit scale
  int32_t mp[4][16];    // [pair p][r]: i16 pair (min 2p, min 2p+1)  (IQ4_XS: signed scales as the mins)
  float d[16], dmin[16];
};
static_assert(sizeof(Blk16) == 4992);

// 16 x 16 dword transpose: out[c] lane r = in[r] lane c. Stage 1-2 (unpacks) leave u[4i + q] with, in
// 128-bit lane L, rows 4i .. 4i+3 of column 4L + q; stage 3-4 move those 128-bit lanes into place.
inline void transpose16x16(const __m512i in[16], __m512i out[16]) {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const __m512i a0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x44), a1 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xEE);
    const __m512i a2 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x44),
                  a3 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xEE);
    out[q] = _mm512_shuffle_i32x4(a0, a2, 0x88);       // column q      (L = 0)
    out[4 + q] = _mm512_shuffle_i32x4(a0, a2, 0xDD);   // column 4 + q  (L = 1)
    out[8 + q] = _mm512_shuffle_i32x4(a1, a3, 0x88);   // column 8 + q  (L = 2)
    out[12 + q] = _mm512_shuffle_i32x4(a1, a3, 0xDD);  // column 12 + q (L = 3)
  }
}

// Lane r = r * row_bytes: the gathers' byte offsets of a field in each of the 16 rows.
inline __m512i row_offsets(int64_t row_bytes) {
  return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                            _mm512_set1_epi32(static_cast<int>(row_bytes)));
}

// The 64 bytes at p of each of the 16 rows (row_bytes apart), transposed: tr[c] lane r = dword c of row r.
inline void load16_transposed(const uint8_t* p, int64_t row_bytes, __m512i tr[16]) {
  __m512i in[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) in[r] = _mm512_loadu_si512(p + r * row_bytes);
  transpose16x16(in, tr);
}

// rows [0, 16) of W (row_bytes apart), super-blocks [0, nb) -> out[nb]. kQ5: Q5_K (the Q4_K layout with
// qh[32] between the scales and qs: bit s of qh[i] is bit 4 of value i of sub-block s), codes 0..31.
template <bool kQ5>
void transpose16(const uint8_t* w, int64_t row_bytes, int64_t nb, Blk16* out) {
  using Block = std::conditional_t<kQ5, BlockQ5_K, BlockQ4_K>;
  const __m512i vidx = row_offsets(row_bytes);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    Blk16& o = out[b];
    const uint8_t* base = w + b * static_cast<int64_t>(sizeof(Block));
    // quants: dword c = 8j + k of each row's qs (chunk j, low nibbles = sub-block 2j, high = 2j + 1)
    for (int h = 0; h < 2; ++h) {
      __m512i tr[16];
      load16_transposed(base + offsetof(Block, qs) + 64 * h, row_bytes, tr);
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) {
        const int j = 2 * h + c / 8, k = c % 8;
        _mm512_store_si512(o.q[2 * j][k], _mm512_and_si512(tr[c], m4));
        _mm512_store_si512(o.q[2 * j + 1][k], _mm512_and_si512(_mm512_srli_epi32(tr[c], 4), m4));
      }
    }
    if constexpr (kQ5) {  // bit 4 of values 4k..4k+3 of sub-block s: bit s of qh bytes 4k..4k+3
      const __m512i one = _mm512_set1_epi8(1);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const __m512i qh = _mm512_i32gather_epi32(vidx, base + offsetof(BlockQ5_K, qh) + 4 * k, 1);
#pragma GCC unroll 8
        for (int sb = 0; sb < 8; ++sb) {
          const __m512i hi = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qh, sb), one), 4);
          _mm512_store_si512(o.q[sb][k], _mm512_or_si512(_mm512_load_si512(o.q[sb][k]), hi));
        }
      }
    }
    // d, dmin (dword 0), the 12 scale bytes s[0..11] (dwords 1..3) of the 16 rows, lane r = row r
    const __m512i dd = _mm512_i32gather_epi32(vidx, base, 1);
    const __m512i s0 = _mm512_i32gather_epi32(vidx, base + 4, 1), s1 = _mm512_i32gather_epi32(vidx, base + 8, 1),
                  s2 = _mm512_i32gather_epi32(vidx, base + 12, 1);
    _mm512_store_ps(o.d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
    _mm512_store_ps(o.dmin, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
    const __m512i m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15), m3 = _mm512_set1_epi32(3);
    __m512i mn[8];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      // sc[j] = s[j] & 63, m[j] = s[j + 4] & 63
      _mm512_store_si512(o.sc[j], _mm512_and_si512(_mm512_srli_epi32(s0, 8 * j), m63));
      mn[j] = _mm512_and_si512(_mm512_srli_epi32(s1, 8 * j), m63);
      // sc[j + 4] = (s[j + 8] & 15) | (s[j] >> 6) << 4, m[j + 4] = (s[j + 8] >> 4) | (s[j + 4] >> 6) << 4
      _mm512_store_si512(o.sc[j + 4],
                         _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(s2, 8 * j), m15),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(s0, 8 * j + 6), m3), 4)));
      mn[j + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(s2, 8 * j + 4), m15),
                                  _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(s1, 8 * j + 6), m3), 4));
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) _mm512_store_si512(o.mp[p], _mm512_or_si512(mn[2 * p], _mm512_slli_epi32(mn[2 * p + 1], 16)));
  }
}

// IQ4_XS through Q4_K's tile (q4k_gemm.h): codes u = kvalues_iq4nl[index] + 128 (u8), scales sc = ls - 32,
// the "mins" m = sc and dmin = 128 d, so that tile's d*S - dmin*M is d * sum sc * sum (u - 128) x.
// IQ4_XS block: d f16 | scales_h u16 (2 high bits of scale ib at 2ib) | scales_l[4] (low 4 bits: ib / 2,
// nibble ib % 2) | qs[128] (sub-block ib: qs[16 ib + j] low nibble = value j, high = value j + 16).
void transpose16_iq4xs(const uint8_t* w, int64_t row_bytes, int64_t nb, Blk16* out) {
  const __m512i vidx = row_offsets(row_bytes);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  // kvalues_iq4nl + 128 in every 128-bit lane: vpshufb looks a nibble up within its lane
  alignas(16) uint8_t lut_bytes[16];
  for (int i = 0; i < 16; ++i) lut_bytes[i] = static_cast<uint8_t>(iq::kIq4nlValues[i] + 128);
  const __m512i lut = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(lut_bytes)));
  for (int64_t b = 0; b < nb; ++b) {
    Blk16& o = out[b];
    const uint8_t* base = w + b * static_cast<int64_t>(sizeof(BlockIQ4_XS));
    for (int h = 0; h < 2; ++h) {  // qs dword D = 16h + c: sub-block D / 4, values 4 (D % 4) .. (+16 high)
      __m512i tr[16];
      load16_transposed(base + offsetof(BlockIQ4_XS, qs) + 64 * h, row_bytes, tr);
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) {
        const int ib = (16 * h + c) / 4, k = c % 4;
        _mm512_store_si512(o.q[ib][k], _mm512_shuffle_epi8(lut, _mm512_and_si512(tr[c], m4)));
        _mm512_store_si512(o.q[ib][4 + k], _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi32(tr[c], 4), m4)));
      }
    }
    const __m512i dh = _mm512_i32gather_epi32(vidx, base, 1);      // d | scales_h << 16
    const __m512i sl = _mm512_i32gather_epi32(vidx, base + 4, 1);  // scales_l[0..3]
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dh));
    _mm512_store_ps(o.d, d);
    _mm512_store_ps(o.dmin, _mm512_mul_ps(d, _mm512_set1_ps(128.f)));  // exact: a power of two
    const __m512i m15 = _mm512_set1_epi32(15), m3 = _mm512_set1_epi32(3), k32 = _mm512_set1_epi32(32);
    __m512i sc[8];
#pragma GCC unroll 8
    for (int ib = 0; ib < 8; ++ib) {
      const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(sl, 8 * (ib / 2) + 4 * (ib % 2)), m15);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(dh, 16 + 2 * ib), m3);
      sc[ib] = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), k32);
      _mm512_store_si512(o.sc[ib], sc[ib]);
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p)  // i16 pairs (sc 2p, sc 2p+1), each in -32..31
      _mm512_store_si512(o.mp[p], _mm512_or_si512(_mm512_and_si512(sc[2 * p], _mm512_set1_epi32(0xFFFF)),
                                                  _mm512_slli_epi32(sc[2 * p + 1], 16)));
  }
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 16 rows x NT tokens over the transposed blocks.
template <int NT>
void tile(int64_t nb, const Blk16* wb, const uint8_t* xq, int64_t xs, float* out, int64_t os) {
  __m512 acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const Blk16& B = wb[b];
    const BlockQ8_K* x[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) x[t] = reinterpret_cast<const BlockQ8_K*>(xq + t * xs) + b;
    __m512i tot[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) tot[t] = _mm512_setzero_si512();
    for (int s = 0; s < 8; ++s) {
      __m512i S[NT];
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) S[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const __m512i wq = _mm512_load_si512(B.q[s][k]);
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t)
          S[t] = _mm512_dpbusd_epi32(S[t], wq, _mm512_set1_epi32(load_i32(x[t]->qs + 32 * s + 4 * k)));
      }
      const __m512i scv = _mm512_load_si512(B.sc[s]);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(S[t], scv));
    }
    const __m512 d = _mm512_load_ps(B.d), dmin = _mm512_load_ps(B.dmin);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      // (bsums[4p] + bsums[4p+1], bsums[4p+2] + bsums[4p+3]) as an i16 pair, p < 4
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t]->bsums));
      const __m128i ps = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
      __m512i M = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_load_si512(B.mp[0]),
                                      _mm512_set1_epi32(_mm_extract_epi32(ps, 0)));
      M = _mm512_dpwssd_epi32(M, _mm512_load_si512(B.mp[1]), _mm512_set1_epi32(_mm_extract_epi32(ps, 1)));
      M = _mm512_dpwssd_epi32(M, _mm512_load_si512(B.mp[2]), _mm512_set1_epi32(_mm_extract_epi32(ps, 2)));
      M = _mm512_dpwssd_epi32(M, _mm512_load_si512(B.mp[3]), _mm512_set1_epi32(_mm_extract_epi32(ps, 3)));
      const __m512 xd = _mm512_set1_ps(x[t]->d);
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(tot[t]), acc[t]);
      acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, xd), _mm512_cvtepi32_ps(M), acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(out + t * os, acc[t]);
}

// Q6_K, Q3_K, Q2_K (16-value sub-blocks): one super-block of 16 rows, transposed (lane r = row r).
struct alignas(64) Blk6 {
  uint8_t q[64][64];   // [c]: lane r = unsigned quants 4c .. 4c+3 of row r (Q6_K 0..63, Q3_K 0..7, Q2_K 0..3)
  int32_t sc[16][16];  // [s][r] scale (Q6_K int8, Q3_K 6-bit - 32, Q2_K 4-bit)
  int32_t mp[8][16];   // [m][r]: i16 pair (scale 2m, scale 2m+1); Q2_K: (min 2m, min 2m+1)
  float d[16], dmin[16];  // dmin: Q2_K only
};
static_assert(sizeof(Blk6) == 5760);

// Stores the 16 scales of 16 rows (sc[s] lane r) and their i16 pairs (mp; or the pairs of mn where given).
inline void store_scales16(const __m512i sc[16], const __m512i* mn, Blk6& o) {
#pragma GCC unroll 16
  for (int s = 0; s < 16; ++s) _mm512_store_si512(o.sc[s], sc[s]);
  const __m512i* pv = mn ? mn : sc;
#pragma GCC unroll 8
  for (int m = 0; m < 8; ++m)
    _mm512_store_si512(o.mp[m], _mm512_or_si512(_mm512_and_si512(pv[2 * m], _mm512_set1_epi32(0xFFFF)),
                                                _mm512_slli_epi32(pv[2 * m + 1], 16)));
}

// Q3_K and Q2_K codes: values 64 z .. 64 z + 63 of a row are bits 2 j0 .. 2 j0 + 3 of qs[32 h .. 32 h + 31]
// (h = z / 2, j0 = 2 (z % 2); Q3_K: bit 4 h + j of hmask[l] is the third bit of value 32 j + l of half h).
template <bool kQ3>
void transpose16_q23_codes(const uint8_t* base, int64_t row_bytes, size_t qs_off, Blk6& o) {
  const __m256i m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
  for (int z = 0; z < 4; ++z) {
    const int h = z / 2, j0 = 2 * (z % 2);
    __m512i in[16], tr[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const uint8_t* a = base + r * row_bytes;
      const __m256i Q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + qs_off + 32 * h));
      __m256i u0 = _mm256_and_si256(_mm256_srli_epi16(Q, 2 * j0), m3);
      __m256i u1 = _mm256_and_si256(_mm256_srli_epi16(Q, 2 * j0 + 2), m3);
      if constexpr (kQ3) {
        const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + offsetof(BlockQ3_K, hmask)));
        u0 = _mm256_or_si256(u0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4 * h + j0), m1), 2));
        u1 = _mm256_or_si256(u1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4 * h + j0 + 1), m1), 2));
      }
      in[r] = _mm512_inserti64x4(_mm512_castsi256_si512(u0), u1, 1);
    }
    transpose16x16(in, tr);
#pragma GCC unroll 16
    for (int c = 0; c < 16; ++c) _mm512_store_si512(o.q[16 * z + c], tr[c]);
  }
}

// Q3_K: codes u = q + 4 (0..7), the 12 packed bytes of 6-bit scales unpacked as ggml does (q3k_scales).
void transpose16_q3(const uint8_t* w, int64_t row_bytes, int64_t nb, Blk6* out) {
  const __m512i vidx = row_offsets(row_bytes);
  const __m512i m2 = _mm512_set1_epi32(0x0f0f0f0f), m1 = _mm512_set1_epi32(0x03030303);
  for (int64_t b = 0; b < nb; ++b) {
    Blk6& o = out[b];
    const uint8_t* base = w + b * static_cast<int64_t>(sizeof(BlockQ3_K));
    transpose16_q23_codes<true>(base, row_bytes, offsetof(BlockQ3_K, qs), o);
    const uint8_t* sp = base + offsetof(BlockQ3_K, scales);
    const __m512i a0 = _mm512_i32gather_epi32(vidx, sp, 1), a1 = _mm512_i32gather_epi32(vidx, sp + 4, 1),
                  a2 = _mm512_i32gather_epi32(vidx, sp + 8, 1);
    const __m512i A[4] = {
        _mm512_or_si512(_mm512_and_si512(a0, m2), _mm512_slli_epi32(_mm512_and_si512(a2, m1), 4)),
        _mm512_or_si512(_mm512_and_si512(a1, m2), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a2, 2), m1), 4)),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a0, 4), m2),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a2, 4), m1), 4)),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a1, 4), m2),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a2, 6), m1), 4))};
    __m512i sc[16];
#pragma GCC unroll 16
    for (int s = 0; s < 16; ++s)
      sc[s] = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_slli_epi32(A[s / 4], 24 - 8 * (s % 4)), 24), _mm512_set1_epi32(32));
    store_scales16(sc, nullptr, o);
    // d: bytes 108..109, the high half of the dword at 106
    const __m512i dd = _mm512_i32gather_epi32(vidx, base + offsetof(BlockQ3_K, d) - 2, 1);
    _mm512_store_ps(o.d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
  }
}

// Q2_K: codes 0..3, scale = low nibble and min = high nibble of scales[s], d and dmin.
void transpose16_q2(const uint8_t* w, int64_t row_bytes, int64_t nb, Blk6* out) {
  const __m512i vidx = row_offsets(row_bytes);
  const __m512i m4 = _mm512_set1_epi32(0xF);
  for (int64_t b = 0; b < nb; ++b) {
    Blk6& o = out[b];
    const uint8_t* base = w + b * static_cast<int64_t>(sizeof(BlockQ2_K));
    transpose16_q23_codes<false>(base, row_bytes, offsetof(BlockQ2_K, qs), o);
    __m512i g[4], sc[16], mn[16];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) g[k] = _mm512_i32gather_epi32(vidx, base + offsetof(BlockQ2_K, scales) + 4 * k, 1);
#pragma GCC unroll 16
    for (int s = 0; s < 16; ++s) {
      const __m512i byte = _mm512_srli_epi32(_mm512_slli_epi32(g[s / 4], 24 - 8 * (s % 4)), 24);
      sc[s] = _mm512_and_si512(byte, m4);
      mn[s] = _mm512_srli_epi32(byte, 4);
    }
    store_scales16(sc, mn, o);
    const __m512i dd = _mm512_i32gather_epi32(vidx, base + offsetof(BlockQ2_K, d), 1);  // d | dmin << 16
    _mm512_store_ps(o.d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
    _mm512_store_ps(o.dmin, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
  }
}

void transpose16_q6(const uint8_t* w, int64_t row_bytes, int64_t nb, Blk6* out) {
  const __m512i vidx = row_offsets(row_bytes);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m256i m3 = _mm256_set1_epi8(3);
  for (int64_t b = 0; b < nb; ++b) {
    Blk6& o = out[b];
    const uint8_t* base = w + b * static_cast<int64_t>(sizeof(BlockQ6_K));
    for (int z = 0; z < 4; ++z) {  // values 64 z .. 64 z + 63 of each row: half n = z / 2, quarters 2 (z % 2) ..
      const int n = z / 2, hi = z % 2;
      __m512i in[16], tr[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) {
        const uint8_t* a = base + r * row_bytes;
        const __m512i L = _mm512_loadu_si512(a + offsetof(BlockQ6_K, ql) + 64 * n);
        const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + offsetof(BlockQ6_K, qh) + 32 * n));
        // quarters 2 hi and 2 hi + 1: qh bits 4 hi .. 4 hi + 1 and 4 hi + 2 .. 4 hi + 3
        const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(H, 4 * hi), m3);
        const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(H, 4 * hi + 2), m3);
        const __m512i hb = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
        const __m512i lo = hi ? _mm512_and_si512(_mm512_srli_epi16(L, 4), m4) : _mm512_and_si512(L, m4);
        in[r] = _mm512_or_si512(lo, _mm512_slli_epi16(hb, 4));
      }
      transpose16x16(in, tr);
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) _mm512_store_si512(o.q[16 * z + c], tr[c]);
    }
    // scales (bytes 192..207) and d (bytes 208..209, read as the high half of the dword at 206)
    __m512i sg[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) sg[g] = _mm512_i32gather_epi32(vidx, base + offsetof(BlockQ6_K, scales) + 4 * g, 1);
    const __m512i dd = _mm512_i32gather_epi32(vidx, base + offsetof(BlockQ6_K, d) - 2, 1);
    _mm512_store_ps(o.d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
    __m512i sc[16];
#pragma GCC unroll 16
    for (int s = 0; s < 16; ++s) sc[s] = _mm512_srai_epi32(_mm512_slli_epi32(sg[s / 4], 24 - 8 * (s % 4)), 24);
    store_scales16(sc, nullptr, o);
  }
}

// IQ2/IQ3: each row's super-block decoded to iq_gemm_decode.h's integers (scalar), then transposed.
void transpose16_iq(GgmlType t, const uint8_t* w, int64_t row_bytes, int64_t nb, Blk6* out) {
  const int64_t bb = int64_t(type_traits(t).type_size);
  alignas(64) IqBlockInts rows[16];
  for (int64_t b = 0; b < nb; ++b) {
    Blk6& o = out[b];
    for (int r = 0; r < 16; ++r) iq_decode_ints(t, w + r * row_bytes + b * bb, rows[r]);
    for (int z = 0; z < 4; ++z) {
      __m512i in[16], tr[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) in[r] = _mm512_loadu_si512(rows[r].u + 64 * z);
      transpose16x16(in, tr);
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) _mm512_store_si512(o.q[16 * z + c], tr[c]);
    }
    __m512i sc[16];
    for (int s = 0; s < 16; ++s) {
      alignas(64) int32_t lane[16];
      for (int r = 0; r < 16; ++r) lane[r] = rows[r].sc[s];
      sc[s] = _mm512_load_si512(lane);
    }
    store_scales16(sc, nullptr, o);
    for (int r = 0; r < 16; ++r) o.d[r] = rows[r].d;
  }
}

// 16 rows x NT tokens over transposed 16-sub-block super-blocks. kOffShift > 0: the codes carry an offset
// 2^kOffShift (Q6_K 32, Q3_K 4) taken back through M = sum sc bsums in int32 (one float step); 0: Q2_K, whose
// M sums the mins and has its own float step with dmin.
template <int NT, int kOffShift>
void tile_q6(int64_t nb, const Blk6* wb, const uint8_t* xq, int64_t xs, float* out, int64_t os) {
  __m512 acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const Blk6& B = wb[b];
    const BlockQ8_K* x[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) x[t] = reinterpret_cast<const BlockQ8_K*>(xq + t * xs) + b;
    __m512i tot[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) tot[t] = _mm512_setzero_si512();
    for (int s = 0; s < 16; ++s) {
      __m512i S[NT];
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) S[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m512i wq = _mm512_load_si512(B.q[4 * s + k]);
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t)
          S[t] = _mm512_dpbusd_epi32(S[t], wq, _mm512_set1_epi32(load_i32(x[t]->qs + 16 * s + 4 * k)));
      }
      const __m512i scv = _mm512_load_si512(B.sc[s]);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(S[t], scv));
    }
    const __m512 d = _mm512_load_ps(B.d);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      __m512i M = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int m = 0; m < 8; ++m) {
        int32_t pair;
        std::memcpy(&pair, x[t]->bsums + 2 * m, 4);  // (bsums[2m], bsums[2m+1])
        M = _mm512_dpwssd_epi32(M, _mm512_load_si512(B.mp[m]), _mm512_set1_epi32(pair));
      }
      const __m512 xd = _mm512_set1_ps(x[t]->d);
      if constexpr (kOffShift > 0) {
        const __m512i T = _mm512_sub_epi32(tot[t], _mm512_slli_epi32(M, kOffShift));
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(T), acc[t]);
      } else {
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(tot[t]), acc[t]);
        acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_load_ps(B.dmin), xd), _mm512_cvtepi32_ps(M), acc[t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(out + t * os, acc[t]);
}


// One 16-row group: transpose its blocks once, then every token tile over them.
template <typename Blk, typename Transpose, typename Tile>
void gemm16(int64_t nb, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok, float* out,
            int64_t os, Transpose transpose, Tile tile) {
  thread_local std::vector<Blk> buf;  // [nb]; grows once, reused
  if (static_cast<int64_t>(buf.size()) < nb) buf.resize(nb);
  transpose(w, row_bytes, nb, buf.data());
  over_token_tiles(n_tok, [&](auto nt, int64_t t) { tile(nt, nb, buf.data(), xq + t * xs, xs, out + t * os, os); });
}

}  // namespace

void q4k_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os) {
  gemm16<Blk16>(cols / QK_K, w, row_bytes, xq, xs, n_tok, out, os, transpose16<false>,
                [](auto nt, auto... a) { tile<decltype(nt)::value>(a...); });
}

void q5k_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os) {
  gemm16<Blk16>(cols / QK_K, w, row_bytes, xq, xs, n_tok, out, os, transpose16<true>,
                [](auto nt, auto... a) { tile<decltype(nt)::value>(a...); });
}

void iq4xs_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                         int64_t n_tok, float* out, int64_t os) {
  gemm16<Blk16>(cols / QK_K, w, row_bytes, xq, xs, n_tok, out, os, transpose16_iq4xs,
                [](auto nt, auto... a) { tile<decltype(nt)::value>(a...); });
}

void q6k_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os) {
  gemm16<Blk6>(cols / QK_K, w, row_bytes, xq, xs, n_tok, out, os, transpose16_q6,
               [](auto nt, auto... a) { tile_q6<decltype(nt)::value, 5>(a...); });
}

void q3k_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os) {
  gemm16<Blk6>(cols / QK_K, w, row_bytes, xq, xs, n_tok, out, os, transpose16_q3,
               [](auto nt, auto... a) { tile_q6<decltype(nt)::value, 2>(a...); });
}

void iq_gemm16_avx512(GgmlType t, int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                      int64_t n_tok, float* out, int64_t os) {
  gemm16<Blk6>(cols / QK_K, w, row_bytes, xq, xs, n_tok, out, os,
               [t](const uint8_t* wp, int64_t rb, int64_t nb, Blk6* o) { transpose16_iq(t, wp, rb, nb, o); },
               [](auto nt, auto... a) { tile_q6<decltype(nt)::value, 6>(a...); });
}

void q2k_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os) {
  gemm16<Blk6>(cols / QK_K, w, row_bytes, xq, xs, n_tok, out, os, transpose16_q2,
               [](auto nt, auto... a) { tile_q6<decltype(nt)::value, 0>(a...); });
}

}  // namespace strata::q
