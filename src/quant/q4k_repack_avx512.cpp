// The 8-row x 4-token Q4_K kernel over repacked weights (AVX-512 F/BW/VNNI/VBMI); layout and why it
// is bit-identical to the 1-row kernel: q4k_repack.h / q4k_repack.cpp.
#include <immintrin.h>

#include "quant/blocks.h"
#include "quant/q4k_repack.h"

namespace strata::q {
namespace {

struct Tables {
  alignas(64) uint8_t sc_idx[4][4][64];  // [row pair p][j]: byte 4l -> scale (2j, row), 4l+2 -> (2j+1, row)
  alignas(64) int32_t dpair[4][16];      // [p]: lane l -> row 2p + l / 8
  alignas(64) int32_t dquad[2][16];      // [h]: lane l -> row 4h + l / 4
  Tables() {
    for (int p = 0; p < 4; ++p)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 16; ++l) {
          const int r = 2 * p + l / 8;
          sc_idx[p][j][4 * l + 0] = static_cast<uint8_t>(2 * j * 8 + r);
          sc_idx[p][j][4 * l + 1] = 0;
          sc_idx[p][j][4 * l + 2] = static_cast<uint8_t>((2 * j + 1) * 8 + r);
          sc_idx[p][j][4 * l + 3] = 0;
        }
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 16; ++l) dpair[p][l] = 2 * p + l / 8;
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 16; ++l) dquad[h][l] = 4 * h + l / 4;
  }
};
const Tables kT;

inline const BlockQ8_K* act(const uint8_t* xq, int64_t xs, int t) {
  return reinterpret_cast<const BlockQ8_K*>(xq + t * xs);
}

}  // namespace

void q4k_gemm8x4_avx512(int64_t cols, const RepQ4K8* w, const uint8_t* xq, int64_t xs, const uint8_t* xperm,
                        float* out, int64_t os) {
  constexpr int NT = 4;
  const int64_t nb = cols / QK_K;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  // acc[p][t]: lanes 8h + i = float lane i of the 1-row kernel's acc for row 2p + h, token t.
  // accm[h][t]: lanes 4r' + k = float lane k of its acc_m (min term) for row 4h + r'.
  __m512 acc[4][NT], accm[2][NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) acc[p][t] = _mm512_setzero_ps();
    accm[0][t] = accm[1][t] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const RepQ4K8& blk = w[b];
    const __m512 d16 = _mm512_castps256_ps512(_mm256_load_ps(blk.d));
    const __m512 dm16 = _mm512_castps256_ps512(_mm256_load_ps(blk.dmin));
    const __m512i scz = _mm512_load_si512(blk.sc);
    // mins [row][sub-block] as i16: 4 rows per register
    const __m512i mins0 = _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(&blk.mins[0][0])));
    const __m512i mins1 = _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(&blk.mins[4][0])));
    const __m512 dmin0 = _mm512_permutexvar_ps(_mm512_load_si512(kT.dquad[0]), dm16);
    const __m512 dmin1 = _mm512_permutexvar_ps(_mm512_load_si512(kT.dquad[1]), dm16);
    __m512 xd[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& x = act(xq, xs, t)[b];
      // as the 1-row kernel: pair sums of bsums, madd with the mins, one FMA by (x.d * dmin)
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bsums));
      const __m128i ps = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
      const __m512i ps4 = _mm512_broadcast_i32x4(ps);
      xd[t] = _mm512_set1_ps(x.d);
      accm[0][t] = _mm512_fmadd_ps(_mm512_mul_ps(xd[t], dmin0), _mm512_cvtepi32_ps(_mm512_madd_epi16(mins0, ps4)),
                                   accm[0][t]);
      accm[1][t] = _mm512_fmadd_ps(_mm512_mul_ps(xd[t], dmin1), _mm512_cvtepi32_ps(_mm512_madd_epi16(mins1, ps4)),
                                   accm[1][t]);
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      __m512i S[NT];  // [t] int32 sums, lanes as acc[p][t]
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) S[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512i q = _mm512_load_si512(blk.qs[j][p]);
        const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        const __m512i sc01 = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, _mm512_load_si512(kT.sc_idx[p][j]), scz);
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
          const uint8_t* xp = xperm + (t * nb + b) * QK_K + 64 * j;
          const __m512i xa = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp)));
          const __m512i xb = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + 32)));
          // |sum of 4 products| <= 4 * 15 * 128: the pack to i16 never saturates
          const __m512i pr = _mm512_packs_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xa),
                                                _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, xb));
          S[t] = _mm512_dpwssd_epi32(S[t], pr, sc01);
        }
      }
      const __m512 dp = _mm512_permutexvar_ps(_mm512_load_si512(kT.dpair[p]), d16);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t)
        acc[p][t] = _mm512_fmadd_ps(_mm512_mul_ps(xd[t], dp), _mm512_cvtepi32_ps(S[t]), acc[p][t]);
    }
  }
  // The 1-row kernel's reductions, in its order: hsum(acc) - ((m0 + m2) + (m1 + m3)).
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    alignas(64) float a[4][16], m[2][16];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) _mm512_store_ps(a[p], acc[p][t]);
    _mm512_store_ps(m[0], accm[0][t]);
    _mm512_store_ps(m[1], accm[1][t]);
    for (int r = 0; r < 8; ++r) {
      const float* v = a[r / 2] + 8 * (r % 2);
      const float h = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
      const float* u = m[r / 4] + 4 * (r % 4);
      out[t * os + r] = h - ((u[0] + u[2]) + (u[1] + u[3]));
    }
  }
}

}  // namespace strata::q
