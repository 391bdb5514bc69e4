// AVX2 + F16C + FMA kernel of one (token, head) of attention with ggml's flash-attention arithmetic
// (cpu/ops.h AttnMath::GgmlF16): Q rounded to f16, K and V read as f16 values, online softmax with
// an f16 accumulator rounded after every position. Why: the scalar reference converts every K/V
// value and every accumulator update through bit manipulation; F16C does 8 at a time. Same math as
// attend_ggml_f16 in ops.cpp up to the order of the f32 sums in the dot products.
#include <immintrin.h>

#include <cmath>

#include "cpu/attention_kernels.h"

namespace strata::cpu {

namespace {
inline __m256 round16(__m256 x) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline __m256 load8(const void* base, int64_t i, KvType type) {
  if (type == KvType::F16)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
        static_cast<const uint16_t*>(base) + i)));
  return round16(_mm256_loadu_ps(static_cast<const float*>(base) + i));
}
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
}  // namespace

bool attend_ggml_f16_avx2(const float* qh, const void* k, const void* v, int32_t n, int64_t k_row,
                          int64_t v_row, int64_t k_off, int64_t v_off, int head_dim,
                          int head_dim_v, KvType type, float scale, float* oh) {
  constexpr int kMaxVec = kMaxHeadDim / 8;
  if (head_dim % 8 != 0 || head_dim_v % 8 != 0) return false;
  const int nq = head_dim / 8, nv = head_dim_v / 8;
  __m256 q[kMaxVec];
  for (int i = 0; i < nq; ++i) q[i] = round16(_mm256_loadu_ps(qh + 8 * i));
  float acc[kMaxHeadDim];  // f16-representable values
  for (int i = 0; i < head_dim_v; ++i) acc[i] = 0.0f;
  float M = -INFINITY, S = 0.0f;
  for (int32_t p = 0; p < n; ++p) {
    __m256 d0 = _mm256_setzero_ps(), d1 = _mm256_setzero_ps();
    const int64_t kb = p * k_row + k_off;
    int i = 0;
    for (; i + 1 < nq; i += 2) {
      d0 = _mm256_fmadd_ps(q[i], load8(k, kb + 8 * i, type), d0);
      d1 = _mm256_fmadd_ps(q[i + 1], load8(k, kb + 8 * i + 8, type), d1);
    }
    if (i < nq) d0 = _mm256_fmadd_ps(q[i], load8(k, kb + 8 * i, type), d0);
    const float s = hsum(_mm256_add_ps(d0, d1)) * scale;
    float ms = 1.0f, vs = 1.0f;
    if (s > M) {
      const float m_old = M;
      M = s;
      ms = std::exp(m_old - M);
      const __m256 vms = _mm256_set1_ps(ms);
      for (int j = 0; j < nv; ++j)
        _mm256_storeu_ps(acc + 8 * j, round16(_mm256_mul_ps(_mm256_loadu_ps(acc + 8 * j), vms)));
    } else {
      vs = std::exp(s - M);
    }
    const __m256 vvs = _mm256_set1_ps(vs);
    const int64_t vb = p * v_row + v_off;
    for (int j = 0; j < nv; ++j)
      _mm256_storeu_ps(acc + 8 * j, round16(_mm256_fmadd_ps(load8(v, vb + 8 * j, type), vvs,
                                                            _mm256_loadu_ps(acc + 8 * j))));
    S = S * ms + vs;
  }
  const float inv = S == 0.0f ? 0.0f : 1.0f / S;
  for (int i = 0; i < head_dim_v; ++i) oh[i] = acc[i] * inv;
  return true;
}

}  // namespace strata::cpu
