#include "cpu/gdn_kernels.h"

#include "cpu/cpu_features.h"

namespace strata::gdn_kernels {
namespace {

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

float scale_dot(float* row, float s, const float* k, int64_t n) {
  float d = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    row[i] *= s;
    d += row[i] * k[i];
  }
  return d;
}

float axpy_dot(float u, const float* k, float* row, const float* q, int64_t n) {
  float d = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    row[i] += u * k[i];
    d += row[i] * q[i];
  }
  return d;
}

void dot4(const float* row, const float* const* x, float* out, int64_t n) {
  for (int j = 0; j < 4; ++j) out[j] = dot(row, x[j], n);
}

void axpy4(const float* c, const float* const* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += c[0] * x[0][i] + c[1] * x[1][i] + c[2] * x[2][i] + c[3] * x[3][i];
}

}  // namespace

const Kernels& scalar() {
  static const Kernels k{dot, axpy, scale_dot, axpy_dot, dot4, axpy4};
  return k;
}

const Kernels& best() { return cpu_level() >= CpuLevel::Avx2 ? avx2() : scalar(); }

}  // namespace strata::gdn_kernels
