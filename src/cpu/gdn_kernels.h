#pragma once
// Vector primitives of the Gated DeltaNet ops (cpu/gdn.cpp), one set per CPU level. The delta rule
// spends its time in length-D dot products and row updates of the [D][D] state; at -O2 without
// -ffast-math the compiler keeps float reductions scalar, so these are written with intrinsics.
#include <cstdint>

namespace strata::gdn_kernels {

struct Kernels {
  float (*dot)(const float* a, const float* b, int64_t n);           // sum a[i]*b[i]
  void (*axpy)(float a, const float* x, float* y, int64_t n);        // y += a*x
  float (*scale_dot)(float* row, float s, const float* k, int64_t n);  // row *= s; return row.k
  float (*axpy_dot)(float u, const float* k, float* row, const float* q, int64_t n);
                                                                     // row += u*k; return row.q
  // out[i] = row . x[i], i < 4 (row is loaded once for four products)
  void (*dot4)(const float* row, const float* const* x, float* out, int64_t n);
  // y += c[0]*x[0] + c[1]*x[1] + c[2]*x[2] + c[3]*x[3] (y is loaded and stored once)
  void (*axpy4)(const float* c, const float* const* x, float* y, int64_t n);
};

const Kernels& scalar();
const Kernels& avx2();   // needs AVX2 + FMA
const Kernels& best();   // by cpu_level()

}  // namespace strata::gdn_kernels
