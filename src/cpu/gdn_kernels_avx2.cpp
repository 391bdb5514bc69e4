// AVX2+FMA primitives for the Gated DeltaNet ops: 8 floats a step, two accumulators for the
// reductions, scalar tails. Compiled with -mavx2 -mfma (CMake, *_avx2.cpp); called only when
// cpu_level() says the CPU has them.
#include <immintrin.h>

#include "cpu/gdn_kernels.h"

namespace strata::gdn_kernels {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

float scale_dot(float* row, float s, const float* k, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(row + i), vs);
    _mm256_storeu_ps(row + i, r);
    acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(k + i), acc);
  }
  float d = hsum(acc);
  for (; i < n; ++i) {
    row[i] *= s;
    d += row[i] * k[i];
  }
  return d;
}

float axpy_dot(float u, const float* k, float* row, const float* q, int64_t n) {
  const __m256 vu = _mm256_set1_ps(u);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 r = _mm256_fmadd_ps(vu, _mm256_loadu_ps(k + i), _mm256_loadu_ps(row + i));
    _mm256_storeu_ps(row + i, r);
    acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(q + i), acc);
  }
  float d = hsum(acc);
  for (; i < n; ++i) {
    row[i] += u * k[i];
    d += row[i] * q[i];
  }
  return d;
}

void dot4(const float* row, const float* const* x, float* out, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 r = _mm256_loadu_ps(row + i);
    a0 = _mm256_fmadd_ps(r, _mm256_loadu_ps(x[0] + i), a0);
    a1 = _mm256_fmadd_ps(r, _mm256_loadu_ps(x[1] + i), a1);
    a2 = _mm256_fmadd_ps(r, _mm256_loadu_ps(x[2] + i), a2);
    a3 = _mm256_fmadd_ps(r, _mm256_loadu_ps(x[3] + i), a3);
  }
  out[0] = hsum(a0);
  out[1] = hsum(a1);
  out[2] = hsum(a2);
  out[3] = hsum(a3);
  for (; i < n; ++i)
    for (int j = 0; j < 4; ++j) out[j] += row[i] * x[j][i];
}

void axpy4(const float* c, const float* const* x, float* y, int64_t n) {
  const __m256 c0 = _mm256_set1_ps(c[0]), c1 = _mm256_set1_ps(c[1]), c2 = _mm256_set1_ps(c[2]),
               c3 = _mm256_set1_ps(c[3]);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 r = _mm256_loadu_ps(y + i);
    r = _mm256_fmadd_ps(c0, _mm256_loadu_ps(x[0] + i), r);
    r = _mm256_fmadd_ps(c1, _mm256_loadu_ps(x[1] + i), r);
    r = _mm256_fmadd_ps(c2, _mm256_loadu_ps(x[2] + i), r);
    r = _mm256_fmadd_ps(c3, _mm256_loadu_ps(x[3] + i), r);
    _mm256_storeu_ps(y + i, r);
  }
  for (; i < n; ++i) y[i] += c[0] * x[0][i] + c[1] * x[1][i] + c[2] * x[2][i] + c[3] * x[3][i];
}

}  // namespace

const Kernels& avx2() {
  static const Kernels k{dot, axpy, scale_dot, axpy_dot, dot4, axpy4};
  return k;
}

}  // namespace strata::gdn_kernels
