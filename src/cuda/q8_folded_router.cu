// The folded router (contract: q8_kernels.cuh "The folded router"): fold_router at load, wo_router in the
// decode chain. moe_gate_up_routed, which consumes wo_router's outputs, is in q8_moe.cu. CPU references:
// host/q8_reference.cpp fold_router / wo_router; tests: tests/cuda/test_folded_router.cu.
#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/host/q8_reference.h"
#include "cuda/q8_common.cuh"
#include "cuda/q8_formats.cuh"
#include "cuda/q8_kernels.cuh"
#include "cuda/q8_matvec.cuh"
#include "cuda/pdl.cuh"

namespace strata::cuda::q8 {
namespace {

constexpr int kThreads = q8mv::kThreads;
constexpr int kFoldPer = 8;  // float4 of a fold row per thread, at most: rows of up to 8192 values
constexpr int kMaxExperts = 512;

// Block (x: 256 columns, y: expert e). fold[e][c] for c < n_embd is router[e][c] * norm_w[c]; for
// c = n_embd + i it is sum over r of router[e][r] * norm_w[r] * wo[r][i] in double (r in order).
// router: [n_expert][n_embd], norm_w: [n_embd], wo: [n_embd][n_att], fold: [n_expert][n_embd + n_att].
__global__ void fold_kernel(const float* __restrict__ router, const float* __restrict__ norm_w,
                            const float* __restrict__ wo, int64_t n_embd, int64_t n_att, float* __restrict__ fold) {
  const int64_t e = blockIdx.y, c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const float* re = router + e * n_embd;
  float* out = fold + e * (n_embd + n_att);
  if (c < n_embd) out[c] = float(double(re[c]) * double(norm_w[c]));
  if (c < n_att) {
    double acc = 0.0;
    for (int64_t r = 0; r < n_embd; ++r) acc += double(re[r]) * double(norm_w[r]) * double(wo[r * n_att + c]);
    out[n_embd + c] = float(acc);
  }
}

// *dst = the sum of v over the block's threads: a butterfly in each warp, then the warps' sums in order by
// thread 0. Every thread calls it. part: [kThreads / 32] shared.
__device__ __forceinline__ void write_block_sum(float v, float* part, float* dst) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = part[0];
    for (int w = 1; w < kThreads / 32; ++w) s += part[w];
    *dst = s;
  }
}

// Blocks [0, wo_blocks): wo's rows, as q8_kernels.cu matvec_kernel with y = mid, add = x; then
// ss[block] = the sum of the squares of the block's rows of mid (its 8 warps' sums in order).
// Blocks [wo_blocks, wo_blocks + n_expert): expert e = block - wo_blocks, raw[e] = fold[e] . [x; att]:
// thread t takes the float4s t, t + 256, ... of the row (loaded before the PDL wait: weights), then the
// block sum (warp butterfly, then the 8 warps in order).
//   wo: [n_embd][row_bytes]  attq: [n_att] int8  attds: [n_att/32]  att: [n_att]  x, mid: [n_embd]
//   fold: [n_expert][n_embd + n_att]  raw: [n_expert]  ss: [wo_blocks]
template <typename F, int A, int R>
__global__ void __launch_bounds__(kThreads)
    wo_router_kernel(const uint8_t* __restrict__ wo, int64_t n_embd, int64_t n_att, int64_t row_bytes, int lpr_log2,
                     int64_t stride, int64_t wo_blocks, const int8_t* __restrict__ attq,
                     const float2* __restrict__ attds, const float* __restrict__ att, const float* __restrict__ x,
                     const float* __restrict__ fold, float* __restrict__ mid, float* __restrict__ raw,
                     float* __restrict__ ss) {
  __shared__ float part[kThreads / 32];
  if (int64_t(blockIdx.x) < wo_blocks) {
    q8mv::prefetch_warp_rows<R>(wo, n_embd, row_bytes, lpr_log2);
    pdl_wait();
    pdl_launch_dependents();
    extern __shared__ __align__(16) uint8_t stage[];  // [warps][stride] (A == kStaged)
    float sq = q8mv::matvec_warp<F, A, 1, R>(wo, n_embd, row_bytes, n_att, lpr_log2, stride, stage, attq, attds, 1,
                                             mid, x);
    write_block_sum(sq, part, ss + blockIdx.x);
  } else {
    const int64_t e = int64_t(blockIdx.x) - wo_blocks, len = n_embd + n_att;
    const float4* row = reinterpret_cast<const float4*>(fold + e * len);
    const int64_t n4 = len / 4;
    float4 wv[kFoldPer];
#pragma unroll
    for (int j = 0; j < kFoldPer; ++j) {
      const int64_t i = threadIdx.x + int64_t(kThreads) * j;
      wv[j] = i < n4 ? __ldg(row + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    pdl_wait();  // (PDL: x and att come from earlier kernels)
    pdl_launch_dependents();
    float4 in[kFoldPer];
#pragma unroll
    for (int j = 0; j < kFoldPer; ++j) {
      const int64_t c = 4 * (threadIdx.x + int64_t(kThreads) * j);  // n_embd % 4 == 0: never straddles
      in[j] = c >= len ? make_float4(0.f, 0.f, 0.f, 0.f)
                       : c < n_embd ? *reinterpret_cast<const float4*>(x + c)
                                    : *reinterpret_cast<const float4*>(att + (c - n_embd));
    }
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < kFoldPer; ++j) {
      acc = fmaf(wv[j].x, in[j].x, acc);
      acc = fmaf(wv[j].y, in[j].y, acc);
      acc = fmaf(wv[j].z, in[j].z, acc);
      acc = fmaf(wv[j].w, in[j].w, acc);
    }
    write_block_sum(acc, part, raw + e);
  }
  pdl_end();  // (traced builds: the block's end, and every block's in a histogram)
}

// The wo geometry of wo_router (that of matvec at n = 1).
template <typename F, int A>
q8mv::Geometry wo_geometry(int64_t n_embd, int64_t n_att, int64_t row_bytes) {
  return q8mv::geometry<F, A>(n_embd, n_att, row_bytes, 1);
}

}  // namespace

namespace {
EnvSwitch g_folded;
}  // namespace

void set_folded_router(bool on) { g_folded.set(on); }

bool folded_router_enabled() {
  return g_folded.get([] { return env_on_unless_zero("STRATA_CUDA_FOLDED_ROUTER"); });
}

bool wo_router_supported(GgmlType type, int64_t n_embd, int64_t n_att, int n_expert) {
  return supported(type) && n_embd > 0 && n_embd % 256 == 0 && n_embd <= 4096 && n_att > 0 &&
         (n_embd + n_att) % 4 == 0 && n_embd + n_att <= int64_t(4) * kThreads * kFoldPer && n_expert >= 1 &&
         n_expert <= kMaxExperts;
}

void fold_router(const float* router, const float* norm_w, const float* wo, int n_expert, int64_t n_embd,
                 int64_t n_att, float* fold, cudaStream_t stream) {
  STRATA_REQUIRE(n_expert >= 1 && n_expert <= 65535 && n_embd > 0 && n_att > 0, "fold_router: {} experts, n_embd {}, "
                 "n_att {}", n_expert, n_embd, n_att);
  const int64_t cols = n_embd > n_att ? n_embd : n_att;
  const dim3 grid(unsigned((cols + 255) / 256), unsigned(n_expert));
  fold_kernel<<<grid, 256, 0, stream>>>(router, norm_w, wo, n_embd, n_att, fold);
  CUDA_CHECK_LAUNCH();
}

int64_t wo_router_ss_count(GgmlType type, int64_t n_embd, int64_t n_att, int64_t row_bytes) {
  int64_t blocks = 0;
  q8d::dispatch_dense(type, q8d::Align{16}, [&](auto f, auto) {  // (any A: only F matters here)
    blocks = wo_geometry<decltype(f), 2>(n_embd, n_att, row_bytes).blocks;
  });
  return blocks;
}

void wo_router(GgmlType type, const void* wo, int64_t n_embd, int64_t n_att, int64_t row_bytes, const int8_t* attq,
               const float2* attds, const float* att, const float* x, const float* fold, int n_expert, float* mid,
               float* raw, float* ss, cudaStream_t stream) {
  STRATA_REQUIRE(wo_router_supported(type, n_embd, n_att, n_expert), "wo_router: type {}, n_embd {}, n_att {}, {} "
                 "experts: unsupported (q8_kernels.cuh wo_router_supported)", type_name(type), n_embd, n_att,
                 n_expert);
  q8ref::check_matvec_shape(type, n_att, row_bytes, "wo_router");
  const q8d::Align al = q8mv::checked_alignment(type, wo, row_bytes, attq, "wo_router");
  STRATA_REQUIRE(reinterpret_cast<uintptr_t>(fold) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(att) % 16 == 0, "wo_router: fold, x and att must be 16-byte aligned");
  STRATA_REQUIRE(mid + n_embd <= x || x + n_embd <= mid, "wo_router: mid must not overlap x");
  const auto* wb = static_cast<const uint8_t*>(wo);
  const bool ran = q8d::dispatch_dense(type, al, [&](auto f, auto a) {
    using F = decltype(f);
    constexpr int A = decltype(a)::value;
    const q8mv::Geometry g = wo_geometry<F, A>(n_embd, n_att, row_bytes);
    const unsigned grid = unsigned(g.blocks + n_expert);
    auto run = [&](auto kernel, int64_t stride) {
      pdl::launch(kernel, grid, kThreads, size_t(stride * (kThreads / 32)), stream, wb, n_embd, n_att, row_bytes,
                  g.lpr_log2, stride, g.blocks, attq, attds, att, x, fold, mid, raw, ss);
    };
    auto run_r = [&](auto r) {
      constexpr int R = decltype(r)::value;
      if constexpr (A == 2) {
        if (g.stride > 0) return run(wo_router_kernel<F, q8d::kStaged, R>, g.stride);
      }
      run(wo_router_kernel<F, A, R>, int64_t(0));
    };
    if (g.r == 2) run_r(std::integral_constant<int, 2>{});
    else run_r(std::integral_constant<int, 1>{});
  });
  STRATA_REQUIRE(ran, "wo_router: no kernel for {} rows at {}-byte alignment", type_name(type), al.bytes);
}

}  // namespace strata::cuda::q8
