#pragma once
// The row quantizers behind quantize_row (quantize.cpp, the one dispatch). x: [n] finite f32, n a multiple
// of the block size (checked by the caller) -> y: row_bytes(type, n) bytes.
#include <cstdint>

namespace strata::qimpl {

// 32-value blocks (quantize_32.cpp)
void quantize_q4_0(const float* x, void* y, int64_t n);
void quantize_q4_1(const float* x, void* y, int64_t n);
void quantize_q5_0(const float* x, void* y, int64_t n);
void quantize_q5_1(const float* x, void* y, int64_t n);
void quantize_q8_0(const float* x, void* y, int64_t n);
void quantize_iq4_nl(const float* x, void* y, int64_t n);

// 256-value super-blocks (quantize_k.cpp)
void quantize_q2_k(const float* x, void* y, int64_t n);
void quantize_q3_k(const float* x, void* y, int64_t n);
void quantize_q4_k(const float* x, void* y, int64_t n);
void quantize_q5_k(const float* x, void* y, int64_t n);
void quantize_q6_k(const float* x, void* y, int64_t n);
void quantize_iq4_xs(const float* x, void* y, int64_t n);

}  // namespace strata::qimpl
