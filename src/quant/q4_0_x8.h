#pragma once
// Q4_0_X8 (quant/types.h): Q4_0 regrouped into 256-value groups, the GPU's storage for Q4_0 experts.
//   group g (values 256g .. 256g+255) = 8 Q4_0 blocks b = 0..7:
//     bytes [0, 16):         d of block b at 2b (f16, as in the block)
//     bytes [16 + 16b, +16): block b's 16 code bytes, unchanged (low nibble: value j, high: value j + 16)
// Why: a Q4_0 block is 18 bytes, so its codes are only 2-byte aligned and the GPU's decode kernels must
// read them with 16-bit loads or stage whole rows in shared memory first; here every block's codes are one
// aligned 16-byte load, as Q4_K's are. The same values and the same bytes per row (144 per 256 values).
#include <cstdint>

namespace strata {

constexpr int64_t kQ4_0X8Values = 256;  // values per group
constexpr int64_t kQ4_0X8Bytes = 144;   // bytes per group (8 Q4_0 blocks of 18)

// dst = the n values of the Q4_0 data at src as Q4_0_X8. n must be a multiple of 256 (strata::Error if
// not). src and dst must not overlap.
void repack_q4_0_x8(const void* src, void* dst, int64_t n);

// dst[0..n) = the values of Q4_0_X8 data: each group put back in Q4_0's layout and dequantized as Q4_0.
void dequantize_q4_0_x8(const void* src, float* dst, int64_t n);

}  // namespace strata
