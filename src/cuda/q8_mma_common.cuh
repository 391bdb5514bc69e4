#pragma once
// Shared by the two tensor-core matvec kernels (private to q8_mma_matvec.cu and q8_mma_tile.cu; contract:
// q8_kernels.cuh mma_matvec): launch shape constants and the int8 mma.sync wrappers.
#include <cuda_runtime.h>

#include <cstdint>

#include "quant/types.h"

namespace strata::cuda::q8::mma {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kRows = 16;  // weight rows a tile (one m16 tile)
constexpr int kTok = 8;    // tokens a tile (one n8 tile)

// c = A (16 x 32, row) . B (32 x 8, col), s8 in, s32 out.
__device__ __forceinline__ void mma_k32(int c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}
// c = A (16 x 16, row) . B (16 x 8, col), s8 in, s32 out.
__device__ __forceinline__ void mma_k16(int c[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

// The tile kernel (q8_mma_tile.cu): a block per 16-row tile and 8-token tile, the activations read from
// global memory. Launches it for the formats of mma_matvec_takes (false for another: nothing launched).
bool tile_matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes, const int8_t* xq,
                 const float2* xds, int64_t n, float* y, bool accumulate, cudaStream_t stream);

}  // namespace strata::cuda::q8::mma
