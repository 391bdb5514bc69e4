#pragma once
// Q6_K_X8 (quant/types.h): Q6_K regrouped into 2048-value groups, the GPU's storage for Q6_K dense products.
//   group g (values 2048g .. 2048g+2047) = 8 Q6_K super-blocks b = 0..7:
//     bytes [0, 16):            d of super-block b at 2b (f16, as in the block)
//     bytes [16 + 208b, +208):  super-block b's ql[128] | qh[64] | scales[16], unchanged
// Why: a Q6_K super-block is 210 bytes, so its codes are only 2-byte aligned and the GPU's int8 decode
// kernels stage whole rows in shared memory before reading them (the output product of llama.cpp's Q4_0,
// Q4_K_M and IQ4_XS files read at 66-70% of the read roofline that way, against 86-94% for Q4_K; sessions
// 38-41). With the scales moved to the group's head every body is 16-byte aligned (208 = 13 x 16). The same
// values and the same bytes per row (1680 per 2048 values); rows must hold whole groups.
#include <cstdint>

namespace strata {

constexpr int64_t kQ6_KX8Values = 2048;  // values per group
constexpr int64_t kQ6_KX8Bytes = 1680;   // bytes per group (8 Q6_K super-blocks of 210)
constexpr int64_t kQ6_KX8Body = 208;     // bytes of a super-block without its d

// dst = the n values of the Q6_K data at src as Q6_K_X8. n must be a multiple of 2048 (strata::Error if
// not). src and dst must not overlap.
void repack_q6_k_x8(const void* src, void* dst, int64_t n);

// dst[0..n) = the values of Q6_K_X8 data: each group put back in Q6_K's layout and dequantized as Q6_K.
void dequantize_q6_k_x8(const void* src, float* dst, int64_t n);

}  // namespace strata
