#pragma once
// Quantization of f32 rows to ggml formats (for `strata quantize`, tests and tools).
// Supported targets: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_K (the
// activation format) and the float types F32/F16/BF16. The scale searches are our own weighted
// least-squares fits (quant_fit.h, docs/quant.md); the outputs are ordinary ggml blocks that any GGUF
// reader (llama.cpp included) loads.
#include <cstdint>

#include "quant/types.h"

namespace strata {

// x: [n] f32 -> dst: row_bytes(type, n) bytes. n must be a multiple of the block size and every value
// finite; otherwise, or for a type without a quantizer, throws strata::Error.
void quantize_row(GgmlType type, const float* x, void* dst, int64_t n);

bool can_quantize(GgmlType type);

}  // namespace strata
