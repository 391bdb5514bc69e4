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
constexpr int kMaxPer = kMaxEmbd / kThreads;  // values of h per thread
constexpr int kMaxK = 64;

struct Shared {
  __align__(16) int8_t xq[kMaxEmbd];  // the ffn norm's Q8 activations
  float2 xds[kMaxEmbd / 32];
  uint64_t key[kMaxExperts];          // order keys of raw
  float p[kMaxExperts];               // block (0, 0): the probabilities
  int32_t sel[kMaxK];                 // the chosen experts, best first
  float selp[kMaxK];
  double red[32];
  float redf[32];
  float inv, wsum;
};

// Every thread of the (256-thread) block calls it; it waits for the previous kernel (PDL) and ends with a
// barrier. k <= kMaxK, r.n_expert <= kMaxExperts, n_embd a multiple of 256 up to kMaxEmbd.
// Thread t holds h[t + 256 j] (warp w: the 32-value groups w + 8 j), as rmsnorm_quantize_kernel, so each
// warp quantizes whole groups from registers.
__device__ __forceinline__ void route_block(const q8::FoldedRoute& r, int k, int64_t n_embd, Shared& sh) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = int(n_embd / kThreads);
  float wv[kMaxPer], hv[kMaxPer];
#pragma unroll
  for (int j = 0; j < kMaxPer; ++j) wv[j] = j < per ? r.norm_w[tid + kThreads * j] : 0.f;  // weights: before the wait
  pdl_wait();  // (PDL: mid, ss and raw come from wo_router)
  pdl_launch_dependents();
  // Every load of the block at once: h, the partial sums, the logits.
#pragma unroll
  for (int j = 0; j < kMaxPer; ++j) hv[j] = j < per ? r.mid[tid + kThreads * j] : 0.f;
  double part = 0.0;
  for (int i = tid; i < r.n_ss; i += kThreads) part += double(r.ss[i]);
  float raw[kMaxExperts / kThreads];
#pragma unroll
  for (int i = 0; i < kMaxExperts / kThreads; ++i) {
    const int e = tid + kThreads * i;
    raw[i] = e < r.n_expert ? r.raw[e] : 0.f;
  }
  // The top k by raw: keys (a NaN and the padding below every real key), then ranks.
  const int n_keys = (r.n_expert + 31) / 32 * 32;
#pragma unroll
  for (int i = 0; i < kMaxExperts / kThreads; ++i) {
    const int e = tid + kThreads * i;
    if (e < n_keys)
      sh.key[e] = e < r.n_expert && raw[i] == raw[i] ? order_key(raw[i], uint32_t(e)) : uint64_t(0xffffffffu - uint32_t(e));
  }
  const double total = q8c::block_sum_256(part, sh.red);  // (its barriers also publish the keys)
  const float s = 1.0f / sqrtf(float(total / double(n_embd)) + r.eps);
#pragma unroll
  for (int j = 0; j < kMaxPer; ++j)
    if (j < per) {
      const int g = warp + 8 * j;
      q8c::quantize_warp(hv[j] * s * wv[j], sh.xq + 32 * g, sh.xds + g);
    }
#pragma unroll
  for (int i = 0; i < kMaxExperts / kThreads; ++i) {
    const int e = tid + kThreads * i;
    if (e < r.n_expert) {
      const uint64_t mine = sh.key[e];
      int rank = 0;
#pragma unroll 16
      for (int q = 0; q < n_keys; ++q) rank += sh.key[q] > mine;  // broadcast reads, all in flight
      if (rank < k) sh.sel[rank] = e;
    }
  }
  __syncthreads();
  if (blockIdx.x != 0 || blockIdx.y != 0) return;
  // Block (0, 0): the weights for moe_down. Softmax of s * raw over every expert (max, expf, the sum in
  // double by warp 0), the k chosen in rank order, renormalized as moe_route does.
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
}

}  // namespace strata::cuda::q8fr
