#pragma once
// Portable kernels for the formats the SIMD code takes as 8 units of 32 values (vec_dot_x86.inc
// dotn_units: Q2_K, Q3_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with the SIMD
// kernels' float arithmetic, so every CPU level gives the same bits for them.
//
// Why: the integer sums of a block are exact on every path, but the SIMD kernels take them to float as 8
// lanes (each lane an FMA into its own accumulator, the 8 summed at the end) while a plain scalar kernel
// takes one sum per block, and the two roundings differ in the last bits. With the same order the scalar
// kernels are an exact reference for the SIMD ones (tests compare bits, not a tolerance), and a product in
// these formats does not depend on the CPU it runs on. Q8_0, Q4_K, Q5_K and Q6_K's scalar kernels
// (vec_dot_scalar.cpp) follow the SIMD order too; Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and the float formats do
// not (their SIMD kernels use 2 FMA chains with AVX2 and 4 with AVX-512, so those two levels differ).
#include <cmath>
#include <cstdint>

#include "quant/types.h"

namespace strata::q {

using UnitDotFn = float (*)(int64_t n, const void* w, const void* xq);

// The SIMD kernels' float steps, for the scalar kernels that follow them (here and vec_dot_scalar.cpp):
// a block's 8 int32 lanes into 8 float accumulators, one FMA each: acc[l] = fma(scale, float(lane[l]), acc[l]);
inline void fma_lanes_simd_order(float acc[8], float scale, const int32_t lane[8]) {
  for (int l = 0; l < 8; ++l) acc[l] = std::fma(scale, static_cast<float>(lane[l]), acc[l]);
}
// and once per row their horizontal sum (vec_dot_x86.inc hsum): ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
inline float hsum8_simd_order(const float a[8]) {
  const float t0 = a[0] + a[4], t1 = a[1] + a[5], t2 = a[2] + a[6], t3 = a[3] + a[7];
  return (t0 + t2) + (t1 + t3);
}

// The kernel for `type` (Q8_K activations, n a multiple of 256), or null for a format not taken as units.
UnitDotFn unit_dot_scalar(GgmlType type);

}  // namespace strata::q
