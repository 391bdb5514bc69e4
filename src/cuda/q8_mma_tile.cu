// The tensor-core matvec's first kernel (contract: q8_kernels.cuh mma_matvec; shared parts:
// q8_mma_common.cuh; formats: q8_mma_formats.cuh): a block (8 warps) per 16-row tile of W and tile of up to
// 8 tokens (blockIdx.y). It copies its rows into shared memory (cp.async, 16-byte coalesced copies; chunks
// of whole blocks when a row is longer than the budget), then warp w takes the steps w, w + 8, ... of the
// chunk: one mma (Q6_K: two m16n8k16, one per 16-value scale) per step into fresh int32 sums, scaled into
// float sums per step; the 8 warps' partial sums meet in shared memory and are added in warp order.
// Measured (H100, session 39, bench/results/2026-12-06-gpu-session39-h100.md): at n = 8 2.2x dp4a on the
// 151936 x 2048 outputs and 1.7x on q; slower than dp4a at n = 2 (0.4-0.8x); a decode step of 8 sequences
// +9.4% on the 48-layer Q4_0 file. So the models take it for tiles of 8 tokens (mma_mode 1, and 3, the
// default, which takes q8_mma_matvec.cu's persistent kernel for 4..7 tokens).
#include <cuda_pipeline.h>

#include <algorithm>

#include "common/error.h"
#include "cuda/pdl.cuh"
#include "cuda/q8_mma_common.cuh"
#include "cuda/q8_mma_formats.cuh"

namespace strata::cuda::q8::mma {
namespace {

constexpr int64_t kStageBudget = 40 * 1024;  // staged weight bytes a block (with the 4 KB of partial sums:
                                             // under the 48 KB a launch gets without opting in)

// y[t][r] (+)= W[r] . x[t] for the block's 16 rows and tokens [8 blockIdx.y, +8).
//   w: [rows][row_bytes]  xq: [n][cols] int8  xds: [n][cols/32]  y: [n][rows]
//   chunk: blocks of M a stage holds; stride: bytes of a row's staged region (q8d::stage_stride, padded)
template <typename M>
__global__ void __launch_bounds__(kThreads)
    mma_matvec_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int64_t cols, int64_t chunk,
                      int64_t stride, const int8_t* __restrict__ xq, const float2* __restrict__ xds, int64_t n,
                      float* y, bool accumulate) {
  extern __shared__ __align__(16) uint8_t smem[];  // [16][stride] staged rows, then [8 warps][16][8] f32
  float* part = reinterpret_cast<float*>(smem + kRows * stride);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane & 3, g = lane >> 2;
  const int64_t row0 = int64_t(blockIdx.x) * kRows, t0 = int64_t(blockIdx.y) * kTok;
  const int nt = int(n - t0 < kTok ? n - t0 : kTok);
  constexpr int kSteps = M::kVals / 32;  // steps a format block
  const int64_t blocks = cols / M::kVals, dss = cols / 32;
  // This lane's token for B (g) and its two tokens for C (2q, 2q + 1); tokens past n read token t0's
  // activations (valid) and are never written.
  const int8_t* xb = xq + (t0 + (g < nt ? g : 0)) * cols;
  const float2* ds0 = xds + (t0 + (2 * q < nt ? 2 * q : 0)) * dss;
  const float2* ds1 = xds + (t0 + (2 * q + 1 < nt ? 2 * q + 1 : 0)) * dss;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};  // rows g, g, g+8, g+8 x tokens 2q, 2q+1, 2q, 2q+1
  stage_rows<M>(w, rows, row_bytes, row0, 0, std::min(chunk, blocks), smem, stride);
  __pipeline_commit();
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t b0 = 0; b0 < blocks; b0 += chunk) {
    const int64_t nb = std::min(chunk, blocks - b0);
    if (b0 > 0) {
      __syncthreads();  // every warp is done with the previous chunk
      stage_rows<M>(w, rows, row_bytes, row0, b0, nb, smem, stride);
      __pipeline_commit();
    }
    __pipeline_wait_prior(0);
    __syncthreads();
    // Rows g and g + 8 where stage_rows put them (a row past the end: row0's copy).
    const int64_t ra = row0 + g < rows ? row0 + g : row0, rb = row0 + g + 8 < rows ? row0 + g + 8 : row0;
    const uint8_t* rg = q8d::stage_dst(smem + g * stride, w + ra * row_bytes + b0 * M::kBytes);
    const uint8_t* rg8 = q8d::stage_dst(smem + (g + 8) * stride, w + rb * row_bytes + b0 * M::kBytes);
    for (int64_t s = warp; s < nb * kSteps; s += kWarps)
      mma_step<M>(rg, rg8, s / kSteps, int(s % kSteps), q, xb, ds0, ds1, (b0 + s / kSteps) * kSteps + s % kSteps, acc);
  }
  write_tile(part, acc, row0, rows, t0, nt, y, accumulate);
  pdl_end();
}

template <typename M>
void launch(const uint8_t* w, int64_t rows, int64_t cols, int64_t row_bytes, const int8_t* xq, const float2* xds,
            int64_t n, float* y, bool accumulate, cudaStream_t stream) {
  const Staging st = staging<M>(cols, kStageBudget);
  const int64_t chunk = st.chunk, stride = st.stride;
  const size_t smem = size_t(kRows * stride) + size_t(kWarps * kRows * kTok) * sizeof(float);
  const int64_t grid_x = (rows + kRows - 1) / kRows, grid_y = (n + kTok - 1) / kTok;
  STRATA_REQUIRE(grid_x <= 0x7FFFFFFF && grid_y <= 65535, "q8 mma matvec: {} rows x {} tokens is too many", rows, n);
  pdl::launch(mma_matvec_kernel<M>, dim3(unsigned(grid_x), unsigned(grid_y)), kThreads, smem, stream, w, rows,
              row_bytes, cols, chunk, stride, xq, xds, n, y, accumulate);
}

}  // namespace

bool tile_matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes, const int8_t* xq,
                 const float2* xds, int64_t n, float* y, bool accumulate, cudaStream_t stream) {
  return q8mma::with_format(type, [&](auto m) {
    launch<decltype(m)>(static_cast<const uint8_t*>(w), rows, cols, row_bytes, xq, xds, n, y, accumulate, stream);
  });
}

}  // namespace strata::cuda::q8::mma
