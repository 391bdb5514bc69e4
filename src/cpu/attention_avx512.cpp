// AVX-512 version of attend_ggml_f16_avx2 (attention_avx2.cpp): the same arithmetic on 16 lanes. ggml's
// f16 dot keeps 16-lane accumulators (the AVX2 kernel holds each as two 8-lane halves), and every other
// step is element-wise, so the results are the same bits as the AVX2 kernel (tests/test_ops.cpp).
#include <immintrin.h>

#include <cmath>

#include "cpu/attention_kernels.h"

// GCC 12 reports the intrinsics' internal _mm512_undefined_*() as maybe-uninitialized (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace strata::cpu {

namespace {
inline __m512 round16(__m512 x) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline __m512 load16(const void* base, int64_t i, KvType type) {
  if (type == KvType::F16)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i)));
  return round16(_mm512_loadu_ps(static_cast<const float*>(base) + i));
}
// ggml_vec_dot_f16's order (see dot_f16_ggml in attention_avx2.cpp): head_dim a multiple of 64.
inline float dot_f16_ggml(const __m512* q, const void* k, int64_t kb, int head_dim, KvType type) {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int i = 0; i < head_dim; i += 64)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) a[j] = _mm512_fmadd_ps(q[i / 16 + j], load16(k, kb + i + 16 * j, type), a[j]);
  const __m512 t = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));  // lanes (l, l + 8)
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
template <int NV>
void accumulate_v(const void* v, const float* w, int32_t n, int64_t v_row, int64_t v_off, KvType type, float* acc,
                  int nv_rt = NV) {
  constexpr int kMaxVec = kMaxHeadDim / 16;
  const int nv = NV > 0 ? NV : nv_rt;
  __m512 a[NV > 0 ? NV : kMaxVec];
  for (int j = 0; j < nv; ++j) a[j] = _mm512_loadu_ps(acc + 16 * j);
  for (int32_t p = 0; p < n; ++p) {
    float vs = w[p];
    if (std::signbit(vs)) {
      const __m512 vms = _mm512_set1_ps(-vs);
#pragma GCC unroll 8
      for (int j = 0; j < nv; ++j) a[j] = round16(_mm512_mul_ps(a[j], vms));
      vs = 1.0f;
    }
    const __m512 vvs = _mm512_set1_ps(vs);
    const int64_t vb = p * v_row + v_off;
#pragma GCC unroll 8
    for (int j = 0; j < nv; ++j) a[j] = round16(_mm512_fmadd_ps(load16(v, vb + 16 * j, type), vvs, a[j]));
  }
  for (int j = 0; j < nv; ++j) _mm512_storeu_ps(acc + 16 * j, a[j]);
}
}  // namespace

bool attend_ggml_f16_avx512(const float* qh, const void* k, const void* v, int32_t n, int64_t k_row,
                            int64_t v_row, int64_t k_off, int64_t v_off, int head_dim, int head_dim_v, KvType type,
                            float scale, float* sc, float* oh) {
  constexpr int kMaxVec = kMaxHeadDim / 16;
  if (head_dim % 64 != 0 || head_dim_v % 16 != 0) return false;
  const int nq = head_dim / 16, nv = head_dim_v / 16;
  __m512 q[kMaxVec];
  for (int i = 0; i < nq; ++i) q[i] = round16(_mm512_loadu_ps(qh + 16 * i));
  float acc[kMaxHeadDim];  // f16-representable values
  for (int i = 0; i < head_dim_v; ++i) acc[i] = 0.0f;
  // The three passes of attend_ggml_f16_avx2, same operations in the same order.
  for (int32_t p = 0; p < n; ++p) sc[p] = dot_f16_ggml(q, k, p * k_row + k_off, head_dim, type) * scale;
  float M = -INFINITY, S = 0.0f;
  for (int32_t p = 0; p < n; ++p) {
    const float s = sc[p];
    float ms = 1.0f, vs = 1.0f;
    if (s > M) {
      const float m_old = M;
      M = s;
      ms = std::exp(m_old - M);
      sc[p] = -ms;
    } else {
      vs = std::exp(s - M);
      sc[p] = vs;
    }
    S = std::fma(S, ms, vs);
  }
  if (nv == 8)
    accumulate_v<8>(v, sc, n, v_row, v_off, type, acc);
  else
    accumulate_v<0>(v, sc, n, v_row, v_off, type, acc, nv);
  const float inv = S == 0.0f ? 0.0f : 1.0f / S;
  for (int i = 0; i < head_dim_v; ++i) oh[i] = acc[i] * inv;
  return true;
}

}  // namespace strata::cpu
