// AVX2 + F16C + FMA kernel of one (token, head) of attention with ggml's flash-attention arithmetic
// (cpu/ops.h AttnMath::GgmlF16): Q rounded to f16, K and V read as f16 values, online softmax with
// an f16 accumulator rounded after every position. Why: the scalar reference converts every K/V
// value and every accumulator update through bit manipulation; F16C does 8 at a time. Same math as
// attend_ggml_f16 in ops.cpp up to the order of the f32 sums in the dot products (here: ggml's).
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
// Q.K in the order of ggml's AVX-512 ggml_vec_dot_f16 (what llama.cpp's CPU flash attention calls):
// steps of 64 values into four 16-lane accumulators (each kept here as two 8-lane halves), reduced
// as (a0 + a2) + (a1 + a3), then the 16 lanes pairwise (l, l + 8), (l, l + 4), (l, l + 2), (0, 1);
// a tail of head_dim % 64 values is added in double. Why this exact order: the products of f16
// values are exact, so the order of the sums is the only rounding, and matching it keeps fast mode's
// attention scores bit-identical to llama.cpp's (a 1-ulp score difference can flip an f16 rounding of
// the V accumulator and, in a chaotic MoE, the routing of later tokens).
float dot_f16_ggml(const __m256* q, const void* k, int64_t kb, int head_dim, KvType type) {
  const int np = head_dim / 64 * 64;
  __m256 a[4][2];  // [16-lane accumulator][half]
  for (auto& r : a) r[0] = r[1] = _mm256_setzero_ps();
  for (int i = 0; i < np; i += 64)
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h) {
        const int o = i + 16 * j + 8 * h;
        a[j][h] = _mm256_fmadd_ps(q[o / 8], load8(k, kb + o, type), a[j][h]);
      }
  float s = 0.0f;
  if (np > 0) {
    const __m256 lo = _mm256_add_ps(_mm256_add_ps(a[0][0], a[2][0]), _mm256_add_ps(a[1][0], a[3][0]));
    const __m256 hi = _mm256_add_ps(_mm256_add_ps(a[0][1], a[2][1]), _mm256_add_ps(a[1][1], a[3][1]));
    s = hsum(_mm256_add_ps(lo, hi));
  }
  if (np == head_dim) return s;
  double sd = s;
  alignas(32) float kt[8], qt[8];
  for (int i = np; i < head_dim; i += 8) {
    _mm256_store_ps(kt, load8(k, kb + i, type));
    _mm256_store_ps(qt, q[i / 8]);
    for (int l = 0; l < 8; ++l) sd += static_cast<double>(qt[l] * kt[l]);
  }
  return static_cast<float>(sd);
}

// Pass 3 of attend_ggml_f16_avx2: acc[head_dim_v] (f16 values) += the V rows weighted by w[p] (see there).
// NV > 0: NV vectors of 8 (the accumulator stays in registers); NV = 0: nv_rt of them, in memory.
template <int NV>
void accumulate_v(const void* v, const float* w, int32_t n, int64_t v_row, int64_t v_off, KvType type, float* acc,
                  int nv_rt = NV) {
  constexpr int kMaxVec = kMaxHeadDim / 8;
  const int nv = NV > 0 ? NV : nv_rt;
  __m256 a[NV > 0 ? NV : kMaxVec];
  for (int j = 0; j < nv; ++j) a[j] = _mm256_loadu_ps(acc + 8 * j);
  for (int32_t p = 0; p < n; ++p) {
    float vs = w[p];
    if (std::signbit(vs)) {
      const __m256 vms = _mm256_set1_ps(-vs);
#pragma GCC unroll 16
      for (int j = 0; j < nv; ++j) a[j] = round16(_mm256_mul_ps(a[j], vms));
      vs = 1.0f;
    }
    const __m256 vvs = _mm256_set1_ps(vs);
    const int64_t vb = p * v_row + v_off;
#pragma GCC unroll 16
    for (int j = 0; j < nv; ++j) a[j] = round16(_mm256_fmadd_ps(load8(v, vb + 8 * j, type), vvs, a[j]));
  }
  for (int j = 0; j < nv; ++j) _mm256_storeu_ps(acc + 8 * j, a[j]);
}
}  // namespace

bool attend_ggml_f16_avx2(const float* qh, const void* k, const void* v, int32_t n, int64_t k_row,
                          int64_t v_row, int64_t k_off, int64_t v_off, int head_dim,
                          int head_dim_v, KvType type, float scale, float* sc, float* oh) {
  constexpr int kMaxVec = kMaxHeadDim / 8;
  if (head_dim % 8 != 0 || head_dim_v % 8 != 0) return false;
  const int nq = head_dim / 8, nv = head_dim_v / 8;
  __m256 q[kMaxVec];
  for (int i = 0; i < nq; ++i) q[i] = round16(_mm256_loadu_ps(qh + 8 * i));
  float acc[kMaxHeadDim];  // f16-representable values
  for (int i = 0; i < head_dim_v; ++i) acc[i] = 0.0f;
  // Three passes over the positions with the operations (and order) of one online-softmax loop, so the
  // same bits: (1) all scores (independent dot products); (2) the softmax chain (max, exp, sum) alone,
  // leaving in sc[p] the V weight vs, or -ms where the max moved (the accumulator is rescaled by ms,
  // then vs = 1; -ms keeps the sign bit even for ms = 0); (3) the f16 V accumulation, which no longer
  // waits on a dot product or an exp.
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
    S = std::fma(S, ms, vs);  // one rounding, as the compiler contracted the single-loop S * ms + vs
  }
  if (nv == 16)
    accumulate_v<16>(v, sc, n, v_row, v_off, type, acc);
  else
    accumulate_v<0>(v, sc, n, v_row, v_off, type, acc, nv);
  const float inv = S == 0.0f ? 0.0f : 1.0f / S;
  for (int i = 0; i < head_dim_v; ++i) oh[i] = acc[i] * inv;
  return true;
}

}  // namespace strata::cpu
