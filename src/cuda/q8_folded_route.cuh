#pragma once
// moe_gate_up_routed's prologue (private to q8_moe.cu; contract: q8_kernels.cuh "The folded router"): every
// block of the launch routes the token and quantizes the ffn norm's output itself, from what wo_router
// wrote, so no router launch sits between wo and gate_up on the decode chain.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/pdl.cuh"
#include "cuda/q8_common.cuh"
#include "cuda/q8_kernels.cuh"
#include "cuda/route_key.cuh"

namespace strata::cuda::q8fr {

constexpr int kThreads = 256;       // the gate_up block
constexpr int kMaxEmbd = 4096;      // wo_router_supported's bounds
constexpr int kMaxExperts = 512;
constexpr int kMaxK = 64;

struct Shared {
  __align__(16) int8_t xq[kMaxEmbd];  // the ffn norm's Q8 activations
  float2 xds[kMaxEmbd / 32];
  uint64_t key[kMaxExperts];          // order keys of raw
  float p[kMaxExperts];               // the weights block: the probabilities
  int32_t sel[kMaxK];                 // the chosen experts, best first
  float selp[kMaxK];
  uint64_t cand[kThreads];             // the warps' top k (FoldedRoute::warp_topk)
  float redf[32];
  float inv, wsum;
};

// The 32 keys of a warp (one a lane) sorted descending by a bitonic network: lane i returns the i-th largest.
__device__ __forceinline__ uint64_t warp_sort_desc(uint64_t key, int lane) {
#pragma unroll
  for (int size = 2; size <= 32; size <<= 1) {
    const bool desc = (lane & size) == 0;  // this lane's run of `size` is sorted descending (all at 32)
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const uint64_t other = __shfl_xor_sync(0xffffffffu, key, stride);
      const bool keep_max = ((lane & stride) == 0) == desc;
      key = keep_max ? (other > key ? other : key) : (other < key ? other : key);
    }
  }
  return key;
}

// Every thread of the (256-thread) block calls it; it waits for the previous kernel (PDL) and ends with a
// barrier. after_loads(): called by every thread once its loads of wo_router's outputs are issued (gate_up's
// prefetch of its predicted rows: its own load then waits beside them, not before them). k <= kMaxK,
// r.n_expert <= kMaxExperts, n_embd a multiple of 256 up to kMaxEmbd.
// Blocks with blockIdx.x < gridDim.x - 1 get the chosen experts (sh.sel) and the Q8 activations and return
// true (they run the product). The launch's last column of blocks returns false: its block y = 0 writes the
// weights (and ids) for moe_down instead (why apart: in a product block it delayed that block's weight
// loads by ~1.5 us, and the launch waits for its slowest block).
// Why the lane layout of the quantization: lane l of warp w takes the 8 values 8 (l & 3) .. of 32-value
// group 8 w + l / 4 (64 groups a pass), so a group's max and sum are 2 shuffles over 4 lanes; one lane per
// value (quantize_warp) took 10 dependent shuffles per group, 8 groups a warp. The same bits: max and the
// integer sum do not depend on the order.
template <typename AfterLoads>
__device__ __forceinline__ bool route_block(const q8::FoldedRoute& r, int k, int64_t n_embd, Shared& sh,
                                            AfterLoads&& after_loads) {
  constexpr int kPasses = kMaxEmbd / 32 / 64;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int groups = int(n_embd / 32);
  const bool product = blockIdx.x + 1 < gridDim.x;
  float4 wv[kPasses][2];
#pragma unroll
  for (int ps = 0; ps < kPasses; ++ps) {
    const int g = 64 * ps + 8 * warp + (lane >> 2);
    const float4* src = reinterpret_cast<const float4*>(r.norm_w + 32 * g + 8 * (lane & 3));
    wv[ps][0] = product && g < groups ? src[0] : make_float4(0.f, 0.f, 0.f, 0.f);  // weights: before the wait
    wv[ps][1] = product && g < groups ? src[1] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  pdl_wait();  // (PDL: mid, ss and raw come from wo_router)
  pdl_launch_dependents();
  // Every load of the block at once: h, the partial sums (every warp all of them), the logits.
  float4 hv[kPasses][2];
#pragma unroll
  for (int ps = 0; ps < kPasses; ++ps) {
    const int g = 64 * ps + 8 * warp + (lane >> 2);
    const float4* src = reinterpret_cast<const float4*>(r.mid + 32 * g + 8 * (lane & 3));
    hv[ps][0] = product && g < groups ? src[0] : make_float4(0.f, 0.f, 0.f, 0.f);
    hv[ps][1] = product && g < groups ? src[1] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  double part = 0.0;
#pragma unroll 8
  for (int i = lane; i < r.n_ss; i += 32) part += double(r.ss[i]);
  float raw[kMaxExperts / kThreads];
#pragma unroll
  for (int i = 0; i < kMaxExperts / kThreads; ++i) {
    const int e = tid + kThreads * i;
    raw[i] = e < r.n_expert ? r.raw[e] : 0.f;
  }
  after_loads();
  // The top k by raw: keys (a NaN and the padding below every real key), then ranks.
  const int n_keys = (r.n_expert + 31) / 32 * 32;
  const bool warp_topk = r.warp_topk && n_keys <= kThreads && k <= 32;
  uint64_t key0 = 0;  // (warp top-k: this thread's key, expert tid)
#pragma unroll
  for (int i = 0; i < kMaxExperts / kThreads; ++i) {
    const int e = tid + kThreads * i;
    if (e < n_keys) {
      const uint64_t key =
          e < r.n_expert && raw[i] == raw[i] ? order_key(raw[i], uint32_t(e)) : bottom_key(uint32_t(e));
      if (i == 0) key0 = key;
      if (!warp_topk) sh.key[e] = key;
    }
  }
  // Warp top-k: every warp holding keys sorts its 32 in registers, and its k largest become candidates (the
  // top k of all keys are among them), ranked below among themselves only. Why: the rank loop over all
  // n_keys keys (128 for Qwen3-30B-A3B) and its barrier took ~1.06 us of the prologue (session 25's trace);
  // the sort needs no barrier before it, and the ranks run over 4 x 8 candidates (session 26: the experts
  // chosen 0.29 us sooner, gate_up's step 11.72 -> 11.44 us).
  if (warp_topk && warp < n_keys / 32) {
    const uint64_t sorted = warp_sort_desc(key0, lane);
    if (lane < k) sh.cand[warp * k + lane] = sorted;
  }
  // s: every warp sums the partial sums itself (lanes strided, then the butterfly: the same order in every
  // warp and block), so no barrier stands before the quantization.
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  const float s = 1.0f / sqrtf(float(part / double(n_embd)) + r.eps);
  if (s != -2.f) pdl_mark();  // (traced builds: the sum of squares known)
  if (product) {
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      const int g = 64 * ps + 8 * warp + (lane >> 2);
      if (64 * ps >= groups) break;  // (uniform: every lane of the pass is past the end)
      const float h[8] = {hv[ps][0].x, hv[ps][0].y, hv[ps][0].z, hv[ps][0].w,
                          hv[ps][1].x, hv[ps][1].y, hv[ps][1].z, hv[ps][1].w};
      const float w[8] = {wv[ps][0].x, wv[ps][0].y, wv[ps][0].z, wv[ps][0].w,
                          wv[ps][1].x, wv[ps][1].y, wv[ps][1].z, wv[ps][1].w};
      float y[8], amax = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        y[i] = h[i] * s * w[i];
        amax = fmaxf(amax, fabsf(y[i]));
      }
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      const float d = amax / 127.f;
      int sum = 0;
      uint32_t packed[2] = {0u, 0u};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int qi = d > 0.f ? max(-127, min(127, int(roundf(y[i] / d)))) : 0;
        sum += qi;
        packed[i / 4] |= uint32_t(uint8_t(int8_t(qi))) << (8 * (i % 4));
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (g < groups) {
        *reinterpret_cast<uint2*>(sh.xq + 32 * g + 8 * (lane & 3)) = make_uint2(packed[0], packed[1]);
        if ((lane & 3) == 0) sh.xds[g] = make_float2(d, d * float(sum));
      }
    }
  }
  __syncthreads();  // the keys (or candidates)
  pdl_mark();  // (traced builds: the keys and the Q8 activations stored)
  if (warp_topk) {
    const int n_cand = n_keys / 32 * k;
    if (tid < n_cand) {
      const uint64_t mine = sh.cand[tid];
      const int rank = key_rank(sh.cand, n_cand, mine);
      if (rank < k) sh.sel[rank] = int(key_id(mine));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kMaxExperts / kThreads; ++i) {
      const int e = tid + kThreads * i;
      if (e < r.n_expert) {
        const int rank = key_rank(sh.key, n_keys, sh.key[e]);
        if (rank < k) sh.sel[rank] = e;
      }
    }
  }
  __syncthreads();  // sel (and xq, xds)
  pdl_mark();  // (traced builds: the experts chosen)
  if (product) return true;
  if (blockIdx.y != 0) return false;
  // The weights for moe_down: softmax of s * raw over every expert (max, expf, the sum in double by warp 0),
  // the k chosen in rank order, renormalized as moe_route does.
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMaxExperts / kThreads; ++i)
    if (tid + kThreads * i < r.n_expert) mx = fmaxf(mx, s * raw[i]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) sh.redf[warp] = mx;
  __syncthreads();
  mx = sh.redf[0];
  for (int w = 1; w < kThreads / 32; ++w) mx = fmaxf(mx, sh.redf[w]);
#pragma unroll
  for (int i = 0; i < kMaxExperts / kThreads; ++i) {
    const int e = tid + kThreads * i;
    if (e < r.n_expert) sh.p[e] = expf(s * raw[i] - mx);
  }
  __syncthreads();
  if (warp == 0) {
    double sum = 0.0;
    for (int e = lane; e < r.n_expert; e += 32) sum += sh.p[e];
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) sh.inv = float(1.0 / sum);
  }
  __syncthreads();
  if (tid < k) sh.selp[tid] = sh.p[sh.sel[tid]] * sh.inv;
  __syncthreads();
  if (tid == 0) {
    float wsum = 0.f;  // in rank order, as moe_route
    for (int j = 0; j < k; ++j) wsum += sh.selp[j];
    sh.wsum = fmaxf(wsum, 6.103515625e-5f);
  }
  __syncthreads();
  if (tid < k) {
    r.ids[tid] = sh.sel[tid];
    r.wts[tid] = r.norm ? sh.selp[tid] / sh.wsum : sh.selp[tid];
  }
  return false;
}

}  // namespace strata::cuda::q8fr
