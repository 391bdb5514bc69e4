#pragma once
// Shared by the two tensor-core matvec kernels (private to q8_mma_matvec.cu and q8_mma_tile.cu; contract:
// q8_kernels.cuh mma_matvec): launch shape constants and the int8 mma.sync wrappers.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/q8_mma_formats.cuh"
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

// Blocks [b0, b0 + nb) of the 16 rows from row0 into the staged regions at buf (row r at buf + r * stride,
// as q8d::stage_dst places it) by asynchronous 16-byte copies (the caller commits and waits); rows past the
// end copy row0's (valid, never written).
template <typename M>
__device__ __forceinline__ void stage_rows(const uint8_t* w, int64_t rows, int64_t row_bytes, int64_t row0, int64_t b0,
                                           int64_t nb, uint8_t* buf, int64_t stride) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int r = warp; r < kRows; r += kWarps) {
    const int64_t rr = row0 + r < rows ? row0 + r : row0;
    const uint8_t* src = w + rr * row_bytes + b0 * M::kBytes;
    q8d::warp_copy_with(q8d::stage_dst(buf + r * stride, src), src, nb * M::kBytes, lane, q8d::Copy16Async{});
  }
}

// A stage of at most `budget` bytes for rows of `cols` values of M: the format blocks a row's chunk holds
// (at least 1, at most the row) and the bytes of a row's staged region. The region is 16 (mod 32) bytes:
// rows g and g + 8 of a lane group land 4 banks apart (why: the 8 rows a load instruction reads at the same
// offset would otherwise share banks when the stride is 32-aligned).
struct Staging {
  int64_t chunk, stride;
};
template <typename M>
Staging staging(int64_t cols, int64_t budget) {
  Staging st;
  st.chunk = std::max<int64_t>(1, std::min<int64_t>(cols / M::kVals, (budget / kRows - 64) / M::kBytes));
  st.stride = q8d::stage_stride(st.chunk * M::kBytes);
  if (st.stride % 32 == 0) st.stride += 16;
  return st;
}

// One 32-value step s of a chunk into the lane's sums: rows g and g + 8 staged at rg / rg8 (chunk-relative
// block bl = s / kSteps, step j = s % kSteps in it), activation block blk32 of the lane's B token (xb: its int8
// row) and of its C tokens 2q, 2q + 1 (ds0, ds1: their block scales). acc: rows g, g, g+8, g+8 x tokens 2q,
// 2q+1, 2q, 2q+1. One mma (Q6_K: two m16n8k16, one per 16-value scale) into fresh int32 sums, then the
// weight scale times the token's activation scale, minus the min through the activation block sums.
template <typename M>
__device__ __forceinline__ void mma_step(const uint8_t* rg, const uint8_t* rg8, int64_t bl, int j, int q,
                                         const int8_t* xb, const float2* ds0, const float2* ds1, int64_t blk32,
                                         float acc[4]) {
  const q8mma::Step a = M::template step<q8d::kStaged>(rg + bl * M::kBytes, j, q);
  const q8mma::Step b = M::template step<q8d::kStaged>(rg8 + bl * M::kBytes, j, q);
  const uint32_t x_lo = *reinterpret_cast<const uint32_t*>(xb + 32 * blk32 + 4 * q);
  const uint32_t x_hi = *reinterpret_cast<const uint32_t*>(xb + 32 * blk32 + 16 + 4 * q);
  int c[4];
  if constexpr (M::kSplit16) {
    int c1[4];
    mma_k16(c, a.lo, b.lo, x_lo);
    mma_k16(c1, a.hi, b.hi, x_hi);
    c[0] = c[0] * a.sa + c1[0] * a.sb, c[1] = c[1] * a.sa + c1[1] * a.sb;
    c[2] = c[2] * b.sa + c1[2] * b.sb, c[3] = c[3] * b.sa + c1[3] * b.sb;
  } else {
    mma_k32(c, a.lo, b.lo, a.hi, b.hi, x_lo, x_hi);
  }
  const float2 x0 = ds0[blk32], x1 = ds1[blk32];
  acc[0] += float(c[0]) * (a.d * x0.x), acc[1] += float(c[1]) * (a.d * x1.x);
  acc[2] += float(c[2]) * (b.d * x0.x), acc[3] += float(c[3]) * (b.d * x1.x);
  if constexpr (M::kMin) {
    acc[0] -= a.m * x0.y, acc[1] -= a.m * x1.y;
    acc[2] -= b.m * x0.y, acc[3] -= b.m * x1.y;
  }
}

// A tile's end: the 8 warps' sums into part ([8 warps][16 rows][8 tokens] f32, shared), then row r / token
// t added over the warps in order by thread 16 t + r and written (y: [n][rows], tokens from t0, nt of them;
// rows from row0). Has a barrier inside (every thread of the block calls it); the caller syncs before
// part is rewritten.
__device__ __forceinline__ void write_tile(float* part, const float acc[4], int64_t row0, int64_t rows, int64_t t0,
                                           int nt, float* y, bool accumulate) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane & 3, g = lane >> 2;
  float* pw = part + warp * (kRows * kTok);
  pw[g * kTok + 2 * q] = acc[0], pw[g * kTok + 2 * q + 1] = acc[1];
  pw[(g + 8) * kTok + 2 * q] = acc[2], pw[(g + 8) * kTok + 2 * q + 1] = acc[3];
  __syncthreads();
  if (threadIdx.x < kRows * kTok) {
    const int r = threadIdx.x & (kRows - 1), t = threadIdx.x / kRows;
    float sum = part[r * kTok + t];
    for (int v = 1; v < kWarps; ++v) sum += part[v * (kRows * kTok) + r * kTok + t];
    if (row0 + r < rows && t < nt) {
      float* out = y + (t0 + t) * rows + row0 + r;
      *out = accumulate ? *out + sum : sum;
    }
  }
}

// The tile kernel (q8_mma_tile.cu): a block per 16-row tile and 8-token tile, the activations read from
// global memory. Launches it for the formats of mma_matvec_takes (false for another: nothing launched).
bool tile_matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes, const int8_t* xq,
                 const float2* xds, int64_t n, float* y, bool accumulate, cudaStream_t stream);

}  // namespace strata::cuda::q8::mma
