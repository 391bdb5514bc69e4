// AVX2 Q8_K activation quantization, bit for bit the scalar quantize_act_q8_k (vec_dot.cpp): the same
// amax (max is exact), the same "max" (the first value of largest magnitude), the same iscale and
// products (one IEEE multiply each), round-half-even like nearest_int's magic-number add for |v| < 2^22,
// the same clamp to 127 and exact integer block sums. A block containing a NaN (the scalar comparisons
// skip NaNs) or one so small that -127 / max overflows goes to the scalar code. Why: a decoded token's activations are quantized on one thread
// while the others wait (2048 values: ~3 us scalar).
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "quant/vec_dot.h"

namespace strata::q {

void quantize_act_q8_k_avx2(const float* x, BlockQ8_K* y, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    __m256 vmax = _mm256_setzero_ps(), unord = _mm256_setzero_ps();
    for (int i = 0; i < QK_K; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      unord = _mm256_or_ps(unord, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, v));
    }
    if (_mm256_movemask_ps(unord)) {  // NaN somewhere: the scalar rules
      quantize_act_q8_k(x, y + b, QK_K);
      continue;
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float amax = _mm_cvtss_f32(m);
    if (amax == 0.f) {
      std::memset(&y[b], 0, sizeof(BlockQ8_K));
      continue;
    }
    // The first value whose magnitude is amax (the scalar scan keeps the first strict maximum).
    const __m256 va = _mm256_set1_ps(amax);
    float max = 0.f;
    for (int i = 0; i < QK_K; i += 8) {
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), va, _CMP_EQ_OQ));
      if (mask) {
        max = x[i + __builtin_ctz(static_cast<unsigned>(mask))];
        break;
      }
    }
    const float iscale = -127.f / max;
    if (!std::isfinite(iscale)) {  // amax below ~4e-37: the scalar rule's overflowed products
      quantize_act_q8_k(x, y + b, QK_K);
      continue;
    }
    const __m256 vs = _mm256_set1_ps(iscale);
    const __m256i c127 = _mm256_set1_epi32(127);
    for (int g = 0; g < QK_K / 16; ++g) {
      auto q8 = [&](const float* p) {
        const __m256 r = _mm256_round_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(p)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        return _mm256_min_epi32(_mm256_cvtps_epi32(r), c127);
      };
      const __m256i q0 = q8(x + 16 * g), q1 = q8(x + 16 * g + 8);
      __m256i s = _mm256_add_epi32(q0, q1);
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      y[b].bsums[g] = static_cast<int16_t>(_mm_cvtsi128_si32(s4));
      // int32 -> int16 -> int8 (values in [-128, 127]: saturation never changes them); packs works per
      // 128-bit lane, the permute puts the 16 values back in order.
      const __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
      const __m128i p8 = _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs + 16 * g), p8);
    }
    y[b].d = 1.f / iscale;
  }
}

}  // namespace strata::q
