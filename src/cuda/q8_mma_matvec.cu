// The dense int8-activation product of a few tokens (2..8 a tile) on tensor cores (contract: q8_kernels.cuh
// matvec / mma_matvec; formats: q8_mma_formats.cuh; CPU reference: host/q8_reference.h matvec): the mode
// switch, and the persistent kernel (mma_mode 2; 3, the default, for 4..7 tokens). The first kernel, the
// tile kernel (mode 1; modes 3 from 8 tokens): q8_mma_tile.cu.
//
// Why: the dp4a kernel (q8_matvec.cuh) multiplies each weight task by up to 8 tokens' activations with
// dp4a, loading every token's 32-64 activation bytes per task: at n = 8 the 151936 x 2048 Q6_K output
// product took 531 us against 120 at n = 1 (H100, session 38), and the q product 10.0 against 4.1 us, so
// a decode step of 8 sequences (a server's batch, a speculative verify window) was bound by issue, not by
// weight reads. One mma.sync m16n8k32 multiplies 16 weight rows by 8 tokens over 32 values; the weights are
// decoded to int8 once per step for all 8 tokens, and a lane holds only two words of activations.
//
// A block (8 warps) takes 16-row tiles of W (tile blockIdx.x, + gridDim.x, ...; a grid of a few blocks an
// SM) for one tile of up to 8 tokens (blockIdx.y). It copies the tokens' activations into shared memory
// once, then walks its tiles' row chunks (whole rows where they fit the stage budget) through two stage
// buffers: cp.async copies chunk i + 1 (16-byte coalesced copies) while the warps multiply chunk i. Warp
// w takes the chunk's steps w, w + 8, ...: one mma (Q6_K: two m16n8k16, one per 16-value scale) per step
// into fresh int32 sums, scaled into float sums per step (the weight scale times the token's activation
// scale, minus the min through the activation block sums). At a tile's end the 8 warps' partial sums meet
// in shared memory and are added in warp order (deterministic). The first chunk is copied before the PDL
// wait (weights are never written by a kernel of the stream).
// Why persistent and staged: the first kernel (q8_mma_tile.cu: a block per tile, the activations read from
// global memory in every step) ran the 151936 x 2048 Q4_0 output at 43% of the read roofline and small
// matrices slower than dp4a at n = 2 (H100, session 39): each block waited for its copy, then for L2 loads
// in every step, with nothing in flight between.
// Measured (session 41, H100, bench/results/2026-12-06-gpu-session41-h100.md): its tests pass; it reads the
// output product at ~44% of the read roofline for every n (Q4_0: 124.6 us at n = 2 against dp4a's 92.5,
// 124.4 at n = 4 against 152.5); a decode step of 4 sequences (48-layer Q4_0) 903 / 911 against 893 / 894
// tok/s with dp4a, of 8 1188 / 1197 against the tile kernel's 1203 / 1214, of 2 591 / 589 against 636 / 637.
// So it is used, in mode 3 (the default), for 4..7 tokens only: steps of 4 and 6 sequences 879.4 and
// 1110.2 / 1112.4 tok/s against 859.7 and 1030.7 / 1029.4 with dp4a (the same call).
#include <cuda_pipeline.h>

#include <algorithm>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/pdl.cuh"
#include "cuda/q8_kernels.cuh"
#include "cuda/q8_mma_common.cuh"
#include "cuda/q8_mma_formats.cuh"
#include "cuda/smem_cap.cuh"

namespace strata::cuda::q8 {
namespace {

using mma::kRows, mma::kThreads, mma::kTok, mma::kWarps, mma::stage_rows;
constexpr int64_t kStageBudget = 20 * 1024;  // staged weight bytes a stage (two stages a block)

DigitSetting g_mma("STRATA_CUDA_Q8_MMA", "the tensor-core matvec (0 off, 1 tiles of 8 tokens, 2 the persistent "
                   "kernel from 2 tokens, 3 the persistent kernel for 4-7 tokens and tiles from 8)", 0, 3, 3);

struct Layout {         // the kernel's shared memory, in bytes from its start
  int64_t xs_stride;    // bytes of a token's int8 row (cols + 16: rows 4 banks apart)
  int64_t ds_stride;    // float2 of a token's block scales (cols / 32 + 1)
  int64_t act, ds, stage0, stage1, part, total;
  int64_t chunk, stride;  // format blocks a stage holds; bytes of a row's staged region
};

// y[t][r] (+)= W[r] . x[t] for the block's tiles and tokens [8 blockIdx.y, +8).
//   w: [rows][row_bytes]  xq: [n][cols] int8  xds: [n][cols/32]  y: [n][rows]
template <typename M>
__global__ void __launch_bounds__(kThreads, 2)
    mma_matvec_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int64_t cols, Layout L,
                      const int8_t* __restrict__ xq, const float2* __restrict__ xds, int64_t n, float* y,
                      bool accumulate) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int8_t* xs = reinterpret_cast<const int8_t*>(smem + L.act);  // [nt][xs_stride]
  float2* ds = reinterpret_cast<float2*>(smem + L.ds);                // [nt][ds_stride]
  float* part = reinterpret_cast<float*>(smem + L.part);              // [8 warps][16 rows][8 tokens]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane & 3, g = lane >> 2;
  const int64_t t0 = int64_t(blockIdx.y) * kTok;
  const int nt = int(n - t0 < kTok ? n - t0 : kTok);
  constexpr int kSteps = M::kVals / 32;  // steps a format block
  const int64_t blocks = cols / M::kVals, dss = cols / 32;
  const int64_t tiles = (rows + kRows - 1) / kRows, cpt = (blocks + L.chunk - 1) / L.chunk;  // chunks a tile
  const int64_t my_tiles = (tiles - int64_t(blockIdx.x) + gridDim.x - 1) / gridDim.x, items = my_tiles * cpt;
  const auto item_tile = [&](int64_t it) { return int64_t(blockIdx.x) + (it / cpt) * gridDim.x; };
  const auto item_nb = [&](int64_t it) { return std::min(L.chunk, blocks - (it % cpt) * L.chunk); };
  const auto stage = [&](int64_t it) { return smem + ((it & 1) ? L.stage1 : L.stage0); };  // chunk it's buffer
  if (items > 0) stage_rows<M>(w, rows, row_bytes, item_tile(0) * kRows, 0, item_nb(0), stage(0), L.stride);
  __pipeline_commit();
  pdl_wait();
  pdl_launch_dependents();
  // The tile's tokens: int8 rows by 16-byte asynchronous copies, block scales by plain loads.
  for (int64_t i = threadIdx.x; i < int64_t(nt) * (cols / 16); i += kThreads) {
    const int64_t t = i / (cols / 16), c = i % (cols / 16);
    __pipeline_memcpy_async(smem + L.act + t * L.xs_stride + 16 * c, xq + (t0 + t) * cols + 16 * c, 16);
  }
  __pipeline_commit();
  for (int64_t i = threadIdx.x; i < int64_t(nt) * dss; i += kThreads)
    ds[(i / dss) * L.ds_stride + i % dss] = xds[(t0 + i / dss) * dss + i % dss];
  // This lane's token for B (g) and its two tokens for C (2q, 2q + 1); tokens past nt read token 0's
  // values (valid) and are never written.
  const int8_t* xb = xs + (g < nt ? g : 0) * L.xs_stride;
  const float2* ds0 = ds + (2 * q < nt ? 2 * q : 0) * L.ds_stride;
  const float2* ds1 = ds + (2 * q + 1 < nt ? 2 * q + 1 : 0) * L.ds_stride;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};  // rows g, g, g+8, g+8 x tokens 2q, 2q+1, 2q, 2q+1
  for (int64_t it = 0; it < items; ++it) {
    if (it + 1 < items)
      stage_rows<M>(w, rows, row_bytes, item_tile(it + 1) * kRows, ((it + 1) % cpt) * L.chunk, item_nb(it + 1),
                    stage(it + 1), L.stride);
    __pipeline_commit();
    __pipeline_wait_prior(1);  // chunk it (and the activations) landed; chunk it + 1 may be in flight
    __syncthreads();
    const int64_t tile = item_tile(it), row0 = tile * kRows, c0 = (it % cpt) * L.chunk, nb = item_nb(it);
    // Rows g and g + 8 where stage_rows put them (a row past the end: row0's copy).
    const int64_t ra = row0 + g < rows ? row0 + g : row0, rb = row0 + g + 8 < rows ? row0 + g + 8 : row0;
    uint8_t* buf = stage(it);
    const uint8_t* rg = q8d::stage_dst(buf + g * L.stride, w + ra * row_bytes + c0 * M::kBytes);
    const uint8_t* rg8 = q8d::stage_dst(buf + (g + 8) * L.stride, w + rb * row_bytes + c0 * M::kBytes);
#pragma unroll 2
    for (int64_t s = warp; s < nb * kSteps; s += kWarps)
      mma::mma_step<M>(rg, rg8, s / kSteps, int(s % kSteps), q, xb, ds0, ds1, (c0 + s / kSteps) * kSteps + s % kSteps,
                       acc);
    if (it % cpt == cpt - 1) {  // the tile's last chunk
      mma::write_tile(part, acc, row0, rows, t0, nt, y, accumulate);
      acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    }
    __syncthreads();  // this stage (and the partial sums) may be rewritten from here
  }
  pdl_end();
}

template <typename M>
Layout layout(int64_t cols, int nt) {
  Layout L;
  const mma::Staging st = mma::staging<M>(cols, kStageBudget);
  L.chunk = st.chunk, L.stride = st.stride;
  L.xs_stride = cols + 16;
  L.ds_stride = cols / 32 + 1;
  L.act = 0;
  L.ds = (L.act + nt * L.xs_stride + 15) / 16 * 16;
  L.stage0 = (L.ds + nt * L.ds_stride * 8 + 15) / 16 * 16;
  L.stage1 = L.stage0 + kRows * L.stride;
  L.part = L.stage1 + kRows * L.stride;
  L.total = L.part + int64_t(kWarps * kRows * kTok) * 4;
  return L;
}

template <typename M>
bool launch(const uint8_t* w, int64_t rows, int64_t cols, int64_t row_bytes, const int8_t* xq, const float2* xds,
            int64_t n, float* y, bool accumulate, cudaStream_t stream) {
  const Layout L = layout<M>(cols, int(std::min<int64_t>(n, kTok)));
  const void* kern = reinterpret_cast<const void*>(mma_matvec_kernel<M>);
  if (L.total > dynamic_limit(kern)) return false;  // (very long rows: the dp4a kernel)
  allow_dynamic_bytes(kern, L.total);
  const int64_t tiles = (rows + kRows - 1) / kRows, grid_y = (n + kTok - 1) / kTok;
  const int64_t grid_x = std::min<int64_t>(tiles, int64_t(sm_count()) * 2);  // (2 blocks an SM: launch bounds)
  STRATA_REQUIRE(grid_y <= 65535, "q8 mma matvec: {} tokens is too many", n);
  pdl::launch(mma_matvec_kernel<M>, dim3(unsigned(grid_x), unsigned(grid_y)), kThreads, size_t(L.total), stream, w,
              rows, row_bytes, cols, L, xq, xds, n, y, accumulate);
  return true;
}

}  // namespace

void set_mma_mode(int mode) { g_mma.set(mode); }

int mma_mode() { return g_mma.get(); }

bool mma_matvec_takes(GgmlType t) {
  return q8mma::with_format(t, [](auto) {});
}

bool mma_matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes, const int8_t* xq,
                const float2* xds, int64_t n, float* y, bool accumulate, cudaStream_t stream) {
  const int mode = mma_mode();
  if ((mode == 1 || mode == 3) && n >= kTok)
    return mma::tile_matvec(type, w, rows, cols, row_bytes, xq, xds, n, y, accumulate, stream);
  if (!(mode == 2 && n >= 2) && !(mode == 3 && n >= 4)) return false;
  bool ran = false;
  q8mma::with_format(type, [&](auto m) {
    ran = launch<decltype(m)>(static_cast<const uint8_t*>(w), rows, cols, row_bytes, xq, xds, n, y, accumulate, stream);
  });
  return ran;
}

}  // namespace strata::cuda::q8
