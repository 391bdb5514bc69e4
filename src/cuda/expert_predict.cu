// The expert predictor's load-time weight, checks and CPU references (contract: expert_predict.h; the
// predictor blocks themselves: expert_predict.cuh, run inside attn_tile.cu's one-token launch).
#include "cuda/expert_predict.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/cuda_check.cuh"

namespace strata::cuda::predict {
namespace {

// f32 -> bf16, round to nearest even (a NaN stays a quiet NaN).
__host__ __device__ inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// w: [n_expert][n_embd]; one thread per value.
__global__ void build_weight_kernel(const float* __restrict__ router, const float* __restrict__ norm_w,
                                    int64_t n_embd, int64_t total, uint16_t* __restrict__ w) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) w[i] = to_bf16(__fmul_rn(router[i], norm_w[i % n_embd]));
}

}  // namespace

bool supported(int n_expert, int64_t n_embd, int k) {
  return n_embd >= 256 && n_embd <= kMaxEmbd && n_embd % 256 == 0 && n_expert >= 1 && n_expert <= kMaxExperts &&
         k >= 1 && k <= n_expert && k <= kMaxK;
}

void check(const ExpertPrefetch& p) {
  if (!p.on()) return;
  STRATA_REQUIRE(supported(p.n_expert, p.n_embd, p.k),
                 "expert prefetch: {} experts ({} used) of width {} (supported: up to {} experts, up to {} used, width "
                 "a multiple of 256 up to {})", p.n_expert, p.k, p.n_embd, kMaxExperts, kMaxK, kMaxEmbd);
  STRATA_REQUIRE(block_count_ok(p.blocks) && p.blocks * (kThreads / 32) >= p.n_expert,
                 "expert prefetch: {} predictor blocks for {} experts (a power of two, 16..{}, 8 experts a block)",
                 p.blocks, p.n_expert, kMaxBlocks);
  STRATA_REQUIRE(p.x != nullptr && p.logits != nullptr && p.counter != nullptr && p.table != nullptr &&
                     p.slots != nullptr && p.n_ranges >= 0 && p.n_ranges <= kMaxRanges,
                 "expert prefetch: a null pointer or {} ranges", p.n_ranges);
  STRATA_REQUIRE(reinterpret_cast<uintptr_t>(p.w) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0,
                 "expert prefetch: w and x must be 16-byte aligned");
  for (int r = 0; r < p.n_ranges; ++r)
    STRATA_REQUIRE(p.off[r] >= 0 && p.bytes[r] > 0 && p.off[r] % 16 == 0 && p.bytes[r] % 16 == 0 &&
                       p.off[r] + p.bytes[r] <= p.slot_bytes && p.slot_bytes % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(p.slots) % 16 == 0,
                   "expert prefetch: range {} ({} bytes at {}) is not 16-byte aligned inside a slot of {}", r,
                   p.bytes[r], p.off[r], p.slot_bytes);
}

void build_weight(const float* router, const float* norm_w, int n_expert, int64_t n_embd, uint16_t* w,
                  cudaStream_t stream) {
  STRATA_REQUIRE(n_expert >= 1 && n_embd >= 1, "expert predictor weight: {} x {}", n_expert, n_embd);
  const int64_t total = int64_t(n_expert) * n_embd;
  build_weight_kernel<<<unsigned((total + 255) / 256), 256, 0, stream>>>(router, norm_w, n_embd, total, w);
  CUDA_CHECK(cudaGetLastError());
}

void build_weight_ref(const float* router, const float* norm_w, int n_expert, int64_t n_embd, uint16_t* w) {
  for (int64_t i = 0; i < int64_t(n_expert) * n_embd; ++i) w[i] = to_bf16(router[i] * norm_w[i % n_embd]);
}

void predict_ref(const uint16_t* w, const float* x, int n_expert, int64_t n_embd, int k, int32_t* ids,
                 double* logits) {
  for (int e = 0; e < n_expert; ++e) {
    double s = 0.0;
    for (int64_t i = 0; i < n_embd; ++i) {
      const uint32_t u = uint32_t(w[int64_t(e) * n_embd + i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      s += double(f) * double(x[i]);
    }
    logits[e] = s;
  }
  std::vector<int> order(static_cast<size_t>(n_expert));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  for (int j = 0; j < k; ++j) ids[j] = order[size_t(j)];
}

int prefetch_blocks() {
  static const int blocks = [] {
    const char* e = std::getenv("STRATA_CUDA_EXPERT_PREFETCH_BLOCKS");
    const int b = e == nullptr ? kMaxBlocks : std::atoi(e);
    return block_count_ok(b) ? b : kMaxBlocks;
  }();
  return blocks;
}

int prefetch_mode() {
  static const int mode = [] {
    const char* e = std::getenv("STRATA_CUDA_EXPERT_PREFETCH");
    if (e == nullptr) return 0;
    const int m = std::atoi(e);
    return m >= 0 && m <= 4 ? m : 0;
  }();
  return mode;
}

}  // namespace strata::cuda::predict
