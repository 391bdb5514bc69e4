#pragma once
// Portable kernels for the formats the SIMD code takes as 8 units of 32 values (vec_dot_x86.inc
// dotn_units: Q2_K, Q3_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with the SIMD
// kernels' float arithmetic, so every CPU level gives the same bits for them.
//
// Why: the integer sums of a block are exact on every path, but the SIMD kernels take them to float as 8
// lanes (each lane an FMA into its own accumulator, the 8 summed at the end) while a plain scalar kernel
// takes one sum per block, and the two roundings differ in the last bits. With the same order the scalar
// kernels are an exact reference for the SIMD ones (tests compare bits, not a tolerance), and a product in
// these formats does not depend on the CPU it runs on. (Whole-model results still do: the other formats,
// f32 products, attention and norms keep their own float orders per level; at STRATA_CPU=scalar the IQ4_XS
// fixture's fast KL stays at 9.39e-3, a routing flip that comes from those.)
#include <cstdint>

#include "quant/types.h"

namespace strata::q {

using UnitDotFn = float (*)(int64_t n, const void* w, const void* xq);

// The kernel for `type` (Q8_K activations, n a multiple of 256), or null for a format not taken as units.
UnitDotFn unit_dot_scalar(GgmlType type);

}  // namespace strata::q
