#pragma once
// CPU references of the low-bit formats' int8-activation tasks (private to q8_reference.cpp; the kernels:
// cuda/q8_formats_low.cuh and cuda/q8_formats_iq.cuh): Q2_K, Q3_K, IQ4_XS, IQ4_NL, IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M. Per task the same integer sums and the same float expression as the kernel.
#include <cstdint>

#include "cuda/host/q8_reference.h"
#include "quant/types.h"

namespace strata::cuda::q8ref::low {

struct Format {
  int vals, bytes, tasks;  // per (super-)block
};

// The block shape of a low-bit format (q8ref::low_bit); false for any other type.
bool format_of(GgmlType t, Format& f);

// Task tt of the block at b (a low-bit type; strata::Error otherwise); xq / xds: the activations of the
// block's first column.
float task(GgmlType t, const uint8_t* b, int tt, const int8_t* xq, const Q8Ds* xds);

}  // namespace strata::cuda::q8ref::low
