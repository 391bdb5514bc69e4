// MoE routing on the GPU (declarations in cuda/ops.cuh and cuda/ops_fused.cuh): the softmax and top-k of one
// token's router logits (moe_route), and the router product fused with them (router_route, norm_router_route).
// Each follows cpu/ops.cpp's moe_route: the same softmax order and weights bit for bit (see route_token).
#include "cuda/ops.cuh"

#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/dequant_device.cuh"
#include "cuda/ops_common.cuh"
#include "cuda/ops_fused.cuh"
#include "cuda/pdl.cuh"
#include "cuda/q8_common.cuh"
#include "cuda/q8_kernels.cuh"
#include "cuda/route_key.cuh"

namespace strata::cuda::ops {

namespace {

using namespace detail;  // (cuda/ops_common.cuh)

// Shared memory of route_token.
struct RouteShared {
  float p[cpu::kMaxExperts];        // the token's probabilities
  uint64_t key[cpu::kMaxExperts];   // their order keys, padded to a multiple of 32
  float red[32];
  float sel[64];                    // [k] chosen probabilities in rank order
  float inv, wsum;
};

// moe_route of one token by the whole block (blockDim a multiple of 32; threads take experts e = tid,
// tid + blockDim, ...). lr: [n_expert] (read through L2: it may have been written by other blocks of the
// same launch); ids, weights: [k]. The softmax keeps the arithmetic and order of the first GPU kernel
// (max, exp_cr, the double sum lane by lane then the xor butterfly of warp 0), so the weights are the same
// bits. Top-k by rank: an expert's rank is the number of order keys above its own (keys are unique: value
// desc, id asc, as the CPU's partial_sort), so the k first are found in one parallel pass instead of k
// rounds of a warp-wide arg-max. Ends with a barrier (sh may be reused at once).
__device__ void route_token(const float* lr, int n_expert, int k, bool norm, int32_t* ids, float* weights,
                            RouteShared& sh) {
  const int tid = threadIdx.x, lane = tid & 31, nt = blockDim.x;
  float mx = -INFINITY;
  for (int e = tid; e < n_expert; e += nt) {
    const float l = __ldcg(lr + e);  // one L2 round trip: each logit is read once
    sh.p[e] = l;
    mx = fmaxf(mx, l);
  }
  mx = block_reduce(mx, sh.red, MaxOp{});  // exact whatever the order
  for (int e = tid; e < n_expert; e += nt) sh.p[e] = exp_cr(sh.p[e] - mx);  // (only this thread wrote p[e])
  __syncthreads();
  if (tid < 32) {
    double sum = 0.0;
    for (int i = lane; i < n_expert; i += 32) sum += sh.p[i];
    sum = warp_reduce(sum, SumOp{});
    if (lane == 0) sh.inv = static_cast<float>(1.0 / sum);
  }
  __syncthreads();
  // A NaN probability and the padding get keys below every real one (high half 0; unique by id), so the
  // rank loop needs no bounds or exits.
  const int n_keys = (n_expert + 31) / 32 * 32;
  for (int e = tid; e < n_keys; e += nt) {
    const bool on = e < n_expert;
    const float pe = on ? sh.p[e] * sh.inv : 0.0f;
    if (on) sh.p[e] = pe;  // only this thread reads p[e] from here on
    sh.key[e] = on && pe >= 0.0f ? order_key(pe, static_cast<uint32_t>(e)) : bottom_key(uint32_t(e));
  }
  __syncthreads();
  for (int e = tid; e < n_expert; e += nt) {
    const int rank = key_rank(sh.key, n_keys, sh.key[e]);
    if (rank < k) {
      ids[rank] = static_cast<int32_t>(e);
      sh.sel[rank] = sh.p[e];
    }
  }
  __syncthreads();
  if (tid == 0) {
    float wsum = 0.0f;  // the chosen weights summed in rank order, as the CPU
    for (int j = 0; j < k; ++j) wsum += sh.sel[j];
    sh.wsum = fmaxf(wsum, 6.103515625e-5f);
  }
  __syncthreads();
  for (int j = tid; j < k; j += nt) weights[j] = norm ? sh.sel[j] / sh.wsum : sh.sel[j];
  __syncthreads();
}

// logits: [n_tok][n_expert]; ids, weights: [n_tok][k]. One block per token.
__global__ void moe_route_kernel(const float* logits, int n_expert, int k, bool norm, int32_t* ids,
                                 float* weights) {
  __shared__ RouteShared sh;
  const int64_t t = blockIdx.x;
  pdl_wait();
  pdl_launch_dependents();
  route_token(logits + t * n_expert, n_expert, k, norm, ids + t * k, weights + t * k, sh);
}

constexpr int kRouterWarps = 4;  // router rows per block of router_route

// One F32 row dot product per warp with quant::matmul's arithmetic (dq::warp_row_dot: units of 8 values,
// lane i takes units i, i+32, ..., one FMA chain per lane, then the xor butterfly), unrolled further so a
// lane's loads are all in flight (the order of the FMAs is unchanged). wr: [cols] f32; xr: [cols].
template <int A>
__device__ __forceinline__ float router_row_dot(const uint8_t* wr, int64_t cols, const float* xr, bool xvec) {
  using F = dq::Fmt<GgmlType::F32>;
  const int lane = threadIdx.x & 31;
  const int units = int(cols / 8);
  float acc = 0.f;
#pragma unroll 8
  for (int u = lane; u < units; u += 32) {
    float v[8], xv[8];
    F::template deq8<A>(wr + int64_t(u) * F::kBytes, 0, v);
    dq::load_x8(xr, int64_t(u) * 8, xvec, xv);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc = fmaf(v[j], xv[j], acc);
  }
  for (int64_t c = int64_t(units) * 8 + lane; c < cols; c += 32) acc = fmaf(F::one(wr, c), __ldg(xr + c), acc);
  return dq::warp_sum(acc);
}

// The end of a router kernel whose blocks each wrote part of logits ([n_tok][n_expert]): the last block to
// finish (a ticket taken after a fence, as CUDA's threadFenceReduction sample) routes every token into ids
// and weights ([n_tok][k]), one after the other, then zeroes the counter for the next launch (graph replays
// included). Every thread of every block calls it, after its block's last logits write. (Routing a token a
// warp instead, built in session 39, gained nothing at 2 tokens and lost 2% at 8: sessions 41-42.)
__device__ void route_in_last_block(const float* logits, int n_tok, int n_expert, int k, bool norm, int32_t* ids,
                                    float* weights, unsigned* counter, RouteShared& sh) {
  __shared__ bool last;
  __threadfence();  // this block's logits visible to the whole device before its ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int t = 0; t < n_tok; ++t)
    route_token(logits + int64_t(t) * n_expert, n_expert, k, norm, ids + int64_t(t) * k, weights + int64_t(t) * k, sh);
  if (threadIdx.x == 0) *counter = 0u;
}

// w: [n_expert][cols] f32 (rb bytes per row); x: [n_tok][cols]; logits: [n_tok][n_expert]; ids, weights:
// [n_tok][k]; counter: one zero uint32 (left zero). grid: ceil(n_expert / kRouterWarps) blocks of
// 32*kRouterWarps. Warp = one router row for every token; the last block to finish (a ticket taken after
// a fence, as CUDA's threadFenceReduction sample) routes the tokens.
template <int A>
__global__ void __launch_bounds__(32 * kRouterWarps)
    router_route_kernel(const uint8_t* w, int n_expert, int64_t cols, int64_t rb, const float* x, int n_tok,
                        bool xvec, int k, bool norm, float* logits, int32_t* ids, float* weights,
                        unsigned* counter) {
  __shared__ RouteShared sh;
  const int r = blockIdx.x * kRouterWarps + (threadIdx.x >> 5);
  if (r < n_expert) {
    const uint8_t* wr = w + int64_t(r) * rb;
    for (int t = 0; t < n_tok; ++t) {
      const float s = router_row_dot<A>(wr, cols, x + int64_t(t) * cols, xvec);
      if ((threadIdx.x & 31) == 0) logits[int64_t(t) * n_expert + r] = s;
    }
  }
  route_in_last_block(logits, n_tok, n_expert, k, norm, ids, weights, counter, sh);
}

// ---- router_route, block per row (the default; RouterRouteKernel::kBlockPerRow).
// Why: the warp-per-row kernel above runs n_expert / 4 blocks (32 for Qwen3's 128 experts: a quarter of
// the H200's SMs) and each lane's 8 KB-per-warp row arrives only as fast as one warp's loads are in
// flight; ncu showed 10 us for 1 MB. Here one block of kRouterRowThreads takes one router row: all its
// threads load the row (one 16-byte load each per 2 KB, so the whole row is one memory round trip) into
// shared memory, then warp w runs the dot products of tokens w, w + 4, ... from there with exactly the
// per-lane order of router_row_dot (lane i takes units i, i+32, ... of 8 values, one FMA chain, then the
// xor butterfly), so the logits are the same bits. Rows longer than kRouterStage floats go in passes of
// kRouterStage (a multiple of 256 floats = 32 units, so a unit keeps its lane across passes).
constexpr int kRouterRowThreads = 128;
constexpr int kRouterStage = 2048;  // floats of a row staged per pass (8 KB)
static_assert(kRouterStage % 256 == 0, "a pass must hold whole rounds of 32 units");
constexpr int kRouterTokPerWarp = int((kRouterRouteMaxTokens + kRouterRowThreads / 32 - 1) / (kRouterRowThreads / 32));

// w: [n_expert][cols] f32 (rb bytes per row, aligned to A); x: [n_tok][cols]; logits: [n_tok][n_expert];
// ids, weights: [n_tok][k]; counter as router_route_kernel. grid: n_expert blocks of kRouterRowThreads.
template <int A>
__global__ void __launch_bounds__(kRouterRowThreads)
    router_route_row_kernel(const uint8_t* __restrict__ w, int n_expert, int64_t cols, int64_t rb,
                            const float* __restrict__ x, int n_tok, bool xvec, int k, bool norm, float* logits,
                            int32_t* ids, float* weights, unsigned* counter) {
  using F = dq::Fmt<GgmlType::F32>;
  __shared__ __align__(16) float row[kRouterStage];
  __shared__ RouteShared sh;
  const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kWarps = kRouterRowThreads / 32;
  const uint8_t* wr = w + int64_t(r) * rb;
  const int64_t whole = cols / 8 * 8;  // values in whole units; the rest go by the tail loop
  float acc[kRouterTokPerWarp];
#pragma unroll
  for (int i = 0; i < kRouterTokPerWarp; ++i) acc[i] = 0.f;
  for (int64_t c0 = 0; c0 < whole; c0 += kRouterStage) {
    const int len = int(min(int64_t(kRouterStage), whole - c0));  // a multiple of 8
    if constexpr (A >= 16) {
      const float4* src = reinterpret_cast<const float4*>(wr + c0 * 4);  // 16-byte aligned: rb % 16 == 0
      for (int i = threadIdx.x; i < len / 4; i += kRouterRowThreads) reinterpret_cast<float4*>(row)[i] = __ldg(src + i);
    } else {
      for (int i = threadIdx.x; i < len; i += kRouterRowThreads) row[i] = F::one(wr, c0 + i);
    }
    if (c0 == 0) {  // PDL: the first pass of the row (weights) is loaded while the previous kernel ends
      pdl_wait();
      pdl_launch_dependents();
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRouterTokPerWarp; ++i) {
      const int t = warp + i * kWarps;
      if (t >= n_tok) break;
      const float* xr = x + int64_t(t) * cols;
      float a = acc[i];
#pragma unroll 4
      for (int u = lane; u < len / 8; u += 32) {
        const float4 p = reinterpret_cast<const float4*>(row)[2 * u], q = reinterpret_cast<const float4*>(row)[2 * u + 1];
        const float v[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
        float xv[8];
        dq::load_x8(xr, c0 + int64_t(u) * 8, xvec, xv);
#pragma unroll
        for (int j = 0; j < 8; ++j) a = fmaf(v[j], xv[j], a);
      }
      acc[i] = a;
    }
    __syncthreads();  // row is rewritten by the next pass
  }
  pdl_wait();  // (no-op after the first; the one wait of a row shorter than 8)
#pragma unroll
  for (int i = 0; i < kRouterTokPerWarp; ++i) {
    const int t = warp + i * kWarps;
    if (t >= n_tok) break;
    const float* xr = x + int64_t(t) * cols;
    float a = acc[i];
    for (int64_t c = whole + lane; c < cols; c += 32) a = fmaf(F::one(wr, c), __ldg(xr + c), a);
    a = dq::warp_sum(a);
    if (lane == 0) logits[int64_t(t) * n_expert + r] = a;
  }
  route_in_last_block(logits, n_tok, n_expert, k, norm, ids, weights, counter, sh);
}

// ---- norm_router_route: ffn_norm (+ its Q8 activations) and the router in one launch.
// Block = one router row (as router_route_row_kernel): the row and the norm weight are staged in shared
// memory before the PDL wait; then for each token every block computes rmsnorm(x[t]) itself (x is 8 KB,
// read from L2) with ops::rmsnorm's exact arithmetic: the double sum of a 256-thread block (thread j: x[j],
// x[j+256], ...; the xor butterfly per warp; the 8 warp sums in order) emulated by 128 threads holding
// virtual threads j and j + 128; then y = x * scale * w in shared memory, the row's dot product on y with
// router_row_dot's lane order (same bits as quant::matmul F32 on xn), and this block's share of xn and its
// Q8 quantization (32-value groups g = 4 * block + warp, + 4 * gridDim: each written once).
// cols % 32 == 0, cols <= kRouterStage.
// Why the staging and the registers: after the wait this kernel is on the decode chain's critical path
// (the experts wait for its ids). Thread tid's 16 values of x are loaded in one go (one L2 round trip, where
// a loop carrying a double sum waits for each load), and the norm weight is already on chip.
constexpr int kNormRouterPer = kRouterStage / kRouterRowThreads;  // values of x per thread, at most
template <int A>
__global__ void __launch_bounds__(kRouterRowThreads)
    norm_router_route_kernel(const float* __restrict__ x, const float* __restrict__ nw, float eps,
                             const uint8_t* __restrict__ w, int n_expert, int64_t cols, int64_t rb, int n_tok, int k,
                             bool norm, float* __restrict__ xn, int8_t* __restrict__ xq, float2* __restrict__ xds,
                             float* logits, int32_t* ids, float* weights, unsigned* counter) {
  using F = dq::Fmt<GgmlType::F32>;
  static_assert(kRouterRowThreads == 128, "the 256-thread sum order is emulated with 2 values per thread");
  static_assert(kNormRouterPer % 2 == 0, "even / odd values are the two virtual threads");
  __shared__ __align__(16) float row[kRouterStage];
  __shared__ __align__(16) float nws[kRouterStage];  // the norm weight
  __shared__ __align__(16) float ys[kRouterStage];
  __shared__ double red[8];
  __shared__ RouteShared sh;
  const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int len = int(cols);
  const uint8_t* wr = w + int64_t(r) * rb;
  // The row and the norm weight go to shared memory as asynchronous copies where aligned (cp.async: the
  // block reaches its wait at once, the copies land while it waits; staged through registers instead,
  // the block arrived at its wait after the previous kernel had ended, delaying the whole chain).
  if constexpr (A >= 16) {
    for (int i = tid; i < len / 4; i += kRouterRowThreads) __pipeline_memcpy_async(row + 4 * i, wr + 16 * i, 16);
  } else {
    for (int i = tid; i < len; i += kRouterRowThreads) row[i] = F::one(wr, i);
  }
  if (reinterpret_cast<uintptr_t>(nw) % 16 == 0) {
    for (int i = tid; i < len / 4; i += kRouterRowThreads) __pipeline_memcpy_async(nws + 4 * i, nw + 4 * i, 16);
  } else {
    for (int i = tid; i < len; i += kRouterRowThreads) nws[i] = __ldg(nw + i);
  }
  __pipeline_commit();
  pdl_wait();  // (PDL: x comes from the previous kernel; the row and the norm weight are weights)
  pdl_launch_dependents();
  __pipeline_wait_prior(0);
  __syncthreads();
  const int groups = len / 32;
  for (int t = 0; t < n_tok; ++t) {
    const float* xt = x + int64_t(t) * cols;
    float xv[kNormRouterPer];  // xv[j] = x[t][tid + 128 j]: j even = virtual thread tid, j odd = tid + 128
#pragma unroll
    for (int j = 0; j < kNormRouterPer; ++j) xv[j] = tid + 128 * j < len ? xt[tid + 128 * j] : 0.0f;
    double s0 = 0.0, s1 = 0.0;
#pragma unroll
    for (int j = 0; j < kNormRouterPer; j += 2) {
      if (tid + 128 * j < len) s0 += static_cast<double>(xv[j]) * xv[j];
      if (tid + 128 * (j + 1) < len) s1 += static_cast<double>(xv[j + 1]) * xv[j + 1];
    }
    s0 = warp_reduce(s0, SumOp{});
    s1 = warp_reduce(s1, SumOp{});
    if (lane == 0) red[warp] = s0, red[warp + 4] = s1;
    __syncthreads();
    double s = red[0];
    for (int v = 1; v < 8; ++v) s = s + red[v];
    const float mean = static_cast<float>(s / static_cast<double>(cols));
    const float scale = 1.0f / sqrtf(mean + eps);
#pragma unroll
    for (int j = 0; j < kNormRouterPer; ++j) {
      const int i = tid + 128 * j;
      if (i < len) ys[i] = xv[j] * scale * nws[i];
    }
    __syncthreads();
    if (warp == (t & 3)) {  // the token's dot product: one warp, router_row_dot's order
      float a = 0.f;
      for (int u = lane; u < len / 8; u += 32) {
        const float4 p = reinterpret_cast<const float4*>(row)[2 * u], q = reinterpret_cast<const float4*>(row)[2 * u + 1];
        const float4 b = reinterpret_cast<const float4*>(ys)[2 * u], c = reinterpret_cast<const float4*>(ys)[2 * u + 1];
        const float v[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
        const float xv8[8] = {b.x, b.y, b.z, b.w, c.x, c.y, c.z, c.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) a = fmaf(v[j], xv8[j], a);
      }
      a = dq::warp_sum(a);
      if (lane == 0) logits[int64_t(t) * n_expert + r] = a;
    }
    for (int g = blockIdx.x * 4 + warp; g < groups; g += gridDim.x * 4) {  // this block's share of xn / xq
      const float v = ys[32 * g + lane];
      if (xn != nullptr) xn[int64_t(t) * cols + 32 * g + lane] = v;
      if (xq != nullptr) q8c::quantize_warp(v, xq + int64_t(t) * cols + 32 * g, xds + int64_t(t) * groups + g);
    }
    __syncthreads();  // red and ys are rewritten for the next token
  }
  pdl_mark();  // (traced builds: the product done)
  route_in_last_block(logits, n_tok, n_expert, k, norm, ids, weights, counter, sh);
  pdl_end();  // (traced builds: the block's end, every block's in a histogram; the last block to finish routes)
}

}  // namespace

void moe_route(const float* logits, int64_t n_tok, int n_expert, int k, bool norm, int32_t* ids, float* weights,
               cudaStream_t stream) {
  STRATA_REQUIRE(n_expert >= 1 && n_expert <= cpu::kMaxExperts && k >= 1 && k <= n_expert && k <= 64,
                 "moe_route (cuda): {} experts, {} used (supported: 1 <= used <= min(experts, 64), experts <= {})",
                 n_expert, k, cpu::kMaxExperts);
  if (n_tok <= 0) return;
  STRATA_REQUIRE(n_tok <= 0x7fffffff, "moe_route (cuda): {} tokens in one call", n_tok);
  const int threads = (n_expert + 31) / 32 * 32;
  pdl::launch(moe_route_kernel, static_cast<unsigned>(n_tok), unsigned(threads), 0, stream, logits, n_expert, k, norm,
              ids, weights);
}

// Declared in cuda/ops_fused.cuh; here beside moe_route, whose per-token code (route_token) it shares.
namespace {
DigitSetting g_fused_router_tokens("STRATA_CUDA_FUSED_ROUTER_TOKENS", "tokens of the fused router launches", 1,
                                   int(kRouterRouteMaxTokens), int(kFusedRouterMaxTokens));
}  // namespace

void set_fused_router_max_tokens(int n) { g_fused_router_tokens.set(n); }
int64_t fused_router_max_tokens() { return g_fused_router_tokens.get(); }

RouterRouteKernel router_route_default() {
  static const RouterRouteKernel kern = [] {
    const char* e = std::getenv("STRATA_CUDA_ROUTER");
    return e != nullptr && std::string(e) == "warp" ? RouterRouteKernel::kWarpPerRow : RouterRouteKernel::kBlockPerRow;
  }();
  return kern;
}

void router_route(const float* w, int n_expert, int64_t cols, const float* x, int64_t n_tok, int k, bool norm,
                  float* logits, int32_t* ids, float* weights, uint32_t* counter, cudaStream_t stream) {
  router_route(w, n_expert, cols, x, n_tok, k, norm, logits, ids, weights, counter, stream, router_route_default());
}

void router_route(const float* w, int n_expert, int64_t cols, const float* x, int64_t n_tok, int k, bool norm,
                  float* logits, int32_t* ids, float* weights, uint32_t* counter, cudaStream_t stream,
                  RouterRouteKernel kern) {
  STRATA_REQUIRE(n_expert >= 1 && n_expert <= cpu::kMaxExperts && k >= 1 && k <= n_expert && k <= 64,
                 "router_route (cuda): {} experts, {} used (supported: 1 <= used <= min(experts, 64), experts <= {})",
                 n_expert, k, cpu::kMaxExperts);
  STRATA_REQUIRE(n_tok <= kRouterRouteMaxTokens && cols >= 1 && cols / 8 < (int64_t(1) << 30),
                 "router_route (cuda): {} tokens (at most {}), {} columns", n_tok, kRouterRouteMaxTokens, cols);
  if (n_tok <= 0) return;
  const int64_t rb = cols * 4;
  const bool xvec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && cols % 4 == 0;  // as quant::matmul
  const auto* wb = reinterpret_cast<const uint8_t*>(w);
  const bool aligned = dq::aligned_for<dq::Fmt<GgmlType::F32>>(w, rb);
  if (kern == RouterRouteKernel::kBlockPerRow) {
    const unsigned rows = static_cast<unsigned>(n_expert);
    pdl::launch(aligned ? router_route_row_kernel<16> : router_route_row_kernel<1>, rows, kRouterRowThreads, 0, stream,
                wb, n_expert, cols, rb, x, int(n_tok), xvec, k, norm, logits, ids, weights, counter);
    return;
  }
  const unsigned blocks = static_cast<unsigned>((n_expert + kRouterWarps - 1) / kRouterWarps);
  if (aligned)
    router_route_kernel<16><<<blocks, 32 * kRouterWarps, 0, stream>>>(wb, n_expert, cols, rb, x, int(n_tok), xvec, k,
                                                                     norm, logits, ids, weights, counter);
  else
    router_route_kernel<1><<<blocks, 32 * kRouterWarps, 0, stream>>>(wb, n_expert, cols, rb, x, int(n_tok), xvec, k,
                                                                    norm, logits, ids, weights, counter);
  CUDA_CHECK_LAUNCH();
}

bool norm_router_route_supported(int64_t cols) { return cols >= 32 && cols % 32 == 0 && cols <= kRouterStage; }

bool norm_router_route_enabled() {
  static const bool on = env_on_unless_zero("STRATA_CUDA_NORM_ROUTER");
  return on;
}

void norm_router_route(const float* x, const float* norm_w, float eps, const float* w, int n_expert, int64_t cols,
                       int64_t n_tok, int k, bool norm, float* xn, int8_t* xq, float2* xds, float* logits,
                       int32_t* ids, float* weights, uint32_t* counter, cudaStream_t stream) {
  STRATA_REQUIRE(n_expert >= 1 && n_expert <= cpu::kMaxExperts && k >= 1 && k <= n_expert && k <= 64,
                 "norm_router_route (cuda): {} experts, {} used (supported: 1 <= used <= min(experts, 64), experts "
                 "<= {})", n_expert, k, cpu::kMaxExperts);
  STRATA_REQUIRE(n_tok <= kRouterRouteMaxTokens && norm_router_route_supported(cols),
                 "norm_router_route (cuda): {} tokens (at most {}), {} columns (a multiple of 32, at most {})", n_tok,
                 kRouterRouteMaxTokens, cols, kRouterStage);
  STRATA_REQUIRE(xn != x && (xq == nullptr) == (xds == nullptr), "norm_router_route: xn may not alias x; xq and xds "
                 "go together");
  if (n_tok <= 0) return;
  const int64_t rb = cols * 4;
  const auto* wb = reinterpret_cast<const uint8_t*>(w);
  const bool aligned = dq::aligned_for<dq::Fmt<GgmlType::F32>>(w, rb);
  pdl::launch(aligned ? norm_router_route_kernel<16> : norm_router_route_kernel<1>, static_cast<unsigned>(n_expert),
              kRouterRowThreads, 0, stream, x, norm_w, eps, wb, n_expert, cols, rb, int(n_tok), k, norm, xn, xq, xds,
              logits, ids, weights, counter);
}

}  // namespace strata::cuda::ops
