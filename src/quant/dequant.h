#pragma once
// Dequantization of every ggml type in quant/types.h, bit-exact with ggml (the reference for the
// fixtures). The scalar reference path; fast kernels are tested against it.
#include <cstdint>

#include "quant/types.h"

namespace strata {

// dst[0..n) = values of the n elements at src (n a multiple of the block size).
// Throws strata::Error for a type with no dequantization ("unsupported type X").
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// True when dequantize_row supports `type` (all weight formats but TQ1_0/TQ2_0/MXFP4/integers).
bool can_dequantize(GgmlType type);

}  // namespace strata
