#pragma once
// Q6_K_P (quant/types.h): Q6_K with every super-block padded to 224 bytes, the GPU's storage for Q6_K expert
// down matrices (llama.cpp's Q4_K_M gives ffn_down_exps Q6_K in half the layers).
//   block b (values 256b .. 256b+255) = bytes [224b, 224b + 224):
//     [0, 210):   the Q6_K block, unchanged (ql[128] | qh[64] | scales[16] | d f16)
//     [210, 224): zero
// Why: a Q6_K block is 210 bytes, so an expert down row (768 columns: 3 blocks, 630 bytes) is only 2-byte
// aligned and moe_down stages every row in shared memory before reading it (13.3 us a layer against Q4_K
// down's 6.6 in bench/cuda_matvec, session 42, on 1.46x the bytes); padded, every block is 16-byte aligned
// and read in place. The same values; 224 / 210 = 1.067x the bytes. (Q6_K_X8's regrouping needs rows of
// whole 2048-value groups, which an expert's 768-column row is not.)
#include <cstdint>

namespace strata {

constexpr int64_t kQ6_KPValues = 256;  // values per block
constexpr int64_t kQ6_KPBytes = 224;   // bytes per block (a Q6_K block of 210 and 14 bytes of zeros)

// dst = the n values of the Q6_K data at src as Q6_K_P. n must be a multiple of 256 (strata::Error if not).
// src and dst must not overlap.
void repack_q6_k_p(const void* src, void* dst, int64_t n);

// dst[0..n) = the values of Q6_K_P data: each block dequantized as Q6_K.
void dequantize_q6_k_p(const void* src, float* dst, int64_t n);

}  // namespace strata
