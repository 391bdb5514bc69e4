#pragma once
// Expert prediction and prefetch for one-token decode (issue 7), declarations only. Device code:
// expert_predict.cuh (the predictor blocks that the one-token attention launch appends, attn_tile.cu);
// load-time weight and CPU reference: expert_predict.cu; tests: tests/cuda/test_ops_fused.cu.
//
// Why: gate_up learns which 8 experts a token uses only after wo_router, then reads their 14 MB from
// HBM in ~5.6 us of its ~12 us step (bench/results/2026-12-03-gpu-session20-h200.md). The router's
// choice from the layer's input x (before attention adds to it) names most of the same experts: on the
// 48-layer 30B-A3B synthetic model 92.4% of them on the H200 (an 8-layer copy on the CPU path: 7% in the
// first layer, 85-89% from the fourth on: the residual stream grows, attention's share of it shrinks).
// While attention runs (4 blocks at contexts up to 64), most SMs and the HBM
// are idle: blocks appended to its grid compute that prediction and ask L2 for the predicted experts'
// bytes (Hopper bulk prefetches), so gate_up (and moe_down) find them there.
// A prediction only warms L2: the experts the kernels read, and every value, are the router's own.
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda::predict {

constexpr int kMaxBlocks = 128;         // predictor blocks per launch (ExpertPrefetch::blocks; 256 threads each)
// A predictor block count the launch takes: a power of two from 16 to kMaxBlocks.
constexpr bool block_count_ok(int b) { return b >= 16 && b <= kMaxBlocks && (b & (b - 1)) == 0; }
constexpr int kThreads = 256;
constexpr int kMaxExperts = kThreads;   // one thread per key when ranking
constexpr int kMaxK = 64;
constexpr int kMaxEmbd = 4096;
constexpr int64_t kChunk = 32 * 1024;   // bytes per bulk prefetch
constexpr int kMaxRanges = 3;           // gate, up, down

// What the predictor blocks of one launch read and write. All device pointers.
struct ExpertPrefetch {
  const uint16_t* w = nullptr;      // [n_expert][n_embd] bf16: the router times the ffn norm's weight
  const float* x = nullptr;         // [n_embd] the layer's input (the residual stream before attention)
  int n_embd = 0, n_expert = 0, k = 0;
  float* logits = nullptr;          // [n_expert] scratch
  uint32_t* counter = nullptr;      // one uint32, a multiple of `blocks` before the first launch (0)
  int blocks = 32;                  // predictor blocks: a power of two, 16..kMaxBlocks, blocks * 8 >= n_expert
  const int32_t* table = nullptr;   // [n_expert] the layer's residency row: slot or -1
  const uint8_t* slots = nullptr;   // [n_slots][slot_bytes]
  int64_t slot_bytes = 0;
  int64_t off[kMaxRanges] = {}, bytes[kMaxRanges] = {};  // ranges of a slot to prefetch (16-byte multiples)
  int n_ranges = 0;
  int32_t* ids = nullptr;           // [k] the predicted experts, best first; null: not written
  int32_t* slots_out = nullptr;     // [k] their slots (-1: not resident), as ids; null: not written. Mode 4:
                                    // gate_up's blocks read it after their wait (q8::FoldedRoute::pred_slots)
  bool lines = false;               // 128-byte line prefetches instead of bulk ones (prefetch_mode 3)
  __host__ __device__ bool on() const { return w != nullptr; }
};

// Shapes the predictor takes: n_embd a multiple of 256 up to kMaxEmbd, 1 <= k <= min(n_expert, kMaxK),
// n_expert <= kMaxExperts, ranges 16-byte aligned.
bool supported(int n_expert, int64_t n_embd, int k);
// Throws strata::Error when p is on but out of supported()'s shapes or misses a pointer.
void check(const ExpertPrefetch& p);

// The predictor's weight: w[e][i] = bf16(router[e][i] * norm_w[i]) (round to nearest even).
//   router: [n_expert][n_embd] f32   norm_w: [n_embd] f32   w: [n_expert][n_embd] bf16
void build_weight(const float* router, const float* norm_w, int n_expert, int64_t n_embd, uint16_t* w,
                  cudaStream_t stream);

// CPU references. build_weight_ref: the same bits as build_weight. predict_ref: the logits w . x in
// double and the k best (value desc, id asc), as the device computes them up to the f32 sums' rounding.
void build_weight_ref(const float* router, const float* norm_w, int n_expert, int64_t n_embd, uint16_t* w);
void predict_ref(const uint16_t* w, const float* x, int n_expert, int64_t n_embd, int k, int32_t* ids,
                 double* logits);

// STRATA_CUDA_EXPERT_PREFETCH_BLOCKS: the predictor's block count (16..128, a power of two; default 128:
// the prefetches' issue spread over that many SMs). Read once.
int prefetch_blocks();
// STRATA_CUDA_EXPERT_PREFETCH: 0 off (the default), 1 gate and up, 2 gate, up and down, 3 gate and up by
// line prefetches, 4 the predictor only writes the predicted slots and each of gate_up's product blocks
// asks L2 for its own rows of its pair's predicted expert right after its wait, while it routes (the
// prefetches issued from every SM, the attention's step not lengthened) (read once). Off by default: on
// the H200, modes 1-3 cost 4-9% fully resident and gained nothing at 25% (session 20: with 32 blocks they
// ended 10 us after their wait, 4 us after the attention's, most of it issuing the prefetches; gate_up
// gained only 1.3 us); mode 4 changed nothing (session 21: gate_up's median block ended 0.75 us earlier,
// its slowest ones did not). See docs/gpu.md.
int prefetch_mode();

}  // namespace strata::cuda::predict
