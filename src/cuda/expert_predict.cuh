#pragma once
// The predictor blocks (contract: expert_predict.h), device code, private to attn_tile.cu: the one-token
// attention launch appends p.blocks of them to its grid; each calls run_block once (256 threads).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/expert_predict.h"
#include "cuda/pdl.cuh"
#include "cuda/route_key.cuh"

namespace strata::cuda::predict {

__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Block pb (0 .. p.blocks-1) of a launch. Warp g = pb * 8 + warp computes logit g (its row of w before the
// PDL wait: weights are uploads, pdl.cuh's contract; x after it), lane sums in a fixed order then a
// butterfly. The blocks meet at `counter` (each adds 1, then waits for the launch's p.blocks arrivals),
// then each ranks all logits itself (order_key: value desc, id asc), looks up the k winners' slots and
// prefetches its share of their ranges: kChunk pieces (bulk prefetches, or with p.lines 128-byte line
// prefetches), chunk c by block c % p.blocks. Block 0 writes the ids and slots (when asked).
// Why the wait cannot starve: every block of the launch arrives before it waits, the attention blocks
// beside them never wait on them, and the dependent kernel launches only once every block has started.
// The wait still gives up after ~30 ms (a hint is all it makes; the counter stays aligned, since each
// block adds exactly once).
__device__ __forceinline__ void run_block(const ExpertPrefetch& p, int pb) {
  constexpr int kMaxRuns = kMaxEmbd / 256;  // 16-byte runs of 8 values a lane
  __shared__ uint64_t key[kMaxExperts];
  __shared__ int32_t sel[kMaxK];
  __shared__ int32_t slot[kMaxK];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row = pb * (kThreads / 32) + warp;  // warp-uniform
  const int runs = p.n_embd / 256;
  uint4 wv[kMaxRuns];
  if (row < p.n_expert) {
    const uint4* wr = reinterpret_cast<const uint4*>(p.w + int64_t(row) * p.n_embd);
#pragma unroll
    for (int r = 0; r < kMaxRuns; ++r)
      if (r < runs) wv[r] = wr[lane + 32 * r];  // values 8 (lane + 32 r) .. + 8
  }
  pdl_wait();  // (PDL: x comes from the previous layer's kernels)
  pdl_launch_dependents();
  if (row < p.n_expert) {
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxRuns; ++r) {
      if (r >= runs) break;
      const float4* xr = reinterpret_cast<const float4*>(p.x + 8 * (lane + 32 * r));
      const float4 a = xr[0], b = xr[1];
      acc = fmaf(bf16_lo(wv[r].x), a.x, acc);
      acc = fmaf(bf16_hi(wv[r].x), a.y, acc);
      acc = fmaf(bf16_lo(wv[r].y), a.z, acc);
      acc = fmaf(bf16_hi(wv[r].y), a.w, acc);
      acc = fmaf(bf16_lo(wv[r].z), b.x, acc);
      acc = fmaf(bf16_hi(wv[r].z), b.y, acc);
      acc = fmaf(bf16_lo(wv[r].w), b.z, acc);
      acc = fmaf(bf16_hi(wv[r].w), b.w, acc);
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) {
      p.logits[row] = acc;
      __threadfence();  // the logit before this block's arrival
    }
  }
  __syncthreads();
  if (tid == 0) {
    const uint32_t old = atomicAdd(p.counter, 1u);
    const uint32_t nb = uint32_t(p.blocks);
    const uint32_t target = old - old % nb + nb;  // this launch's arrivals all in
    for (int spin = 0; spin < (1 << 20) && int32_t(load_acquire(p.counter) - target) < 0; ++spin) __nanosleep(32);
  }
  __syncthreads();
  pdl_mark();  // (traced builds: every block arrived)
  const int n_keys = (p.n_expert + 31) / 32 * 32;
  if (tid < n_keys) {
    const float v = tid < p.n_expert ? __ldcg(p.logits + tid) : 0.f;
    key[tid] = tid < p.n_expert && v == v ? order_key(v, uint32_t(tid)) : bottom_key(uint32_t(tid));
  }
  __syncthreads();
  if (tid < p.n_expert) {
    const int rank = key_rank(key, n_keys, key[tid]);
    if (rank < p.k) sel[rank] = tid;
  }
  __syncthreads();
  if (tid < p.k) {
    slot[tid] = p.table[sel[tid]];
    if (pb == 0 && p.ids != nullptr) p.ids[tid] = sel[tid];
    if (pb == 0 && p.slots_out != nullptr) p.slots_out[tid] = slot[tid];
  }
  __syncthreads();
  pdl_mark();  // (traced builds: the experts chosen and their slots known)
  int chunks[kMaxRanges], per_expert = 0;  // kChunk pieces of each range, of an expert
  for (int r = 0; r < p.n_ranges; ++r) per_expert += chunks[r] = int((p.bytes[r] + kChunk - 1) / kChunk);
  for (int c = pb; c < p.k * per_expert; c += p.blocks) {
    const int j = c / per_expert;
    int rest = c % per_expert, r = 0;
    for (; rest >= chunks[r]; ++r) rest -= chunks[r];  // (rest < per_expert: r stays below n_ranges)
    if (slot[j] < 0) continue;  // (block-uniform)
    const int64_t at = int64_t(rest) * kChunk;
    const int64_t len = p.bytes[r] - at < kChunk ? p.bytes[r] - at : kChunk;
    const uint8_t* src = p.slots + int64_t(slot[j]) * p.slot_bytes + p.off[r] + at;
    if (p.lines) {
      for (int64_t o = int64_t(tid) * 128; o < len; o += int64_t(kThreads) * 128) prefetch_l2(src + o);
    } else if (tid == (c / p.blocks) % kThreads) {
      prefetch_l2_bulk(src, uint32_t(len));  // (ranges 16-byte aligned: check())
    }
  }
  pdl_end();  // (traced builds: the block's end, and every block's in a histogram)
}

}  // namespace strata::cuda::predict
