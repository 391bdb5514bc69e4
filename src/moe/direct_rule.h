#pragma once
// Direct reads of non-resident experts (docs/expert_cache.md, "Direct reads"): in a decode-sized CPU-pool
// pass the GPU reads part of each token's non-resident experts from their pinned host copy over PCIe
// (moe_direct_fetch into staging slots, or the expert kernels themselves) while the CPU pool runs the
// rest. Why: the CPU pool alone leaves host memory bandwidth unused (it is bound per core, docs/gpu.md),
// and the GPU's reads add ~45 GB/s beside it (bench/results/2026-12-01-gpu-session10-h200.md). No host
// call on the layer's path: the GPU's kernels and the host apply the same rule to the same routing and
// table.
//
// The rule, per token t of a pass (k pairs j = 0..k-1, expert ids[t*k+j], table row of the layer):
//   a pair is a miss when its id is >= 0 and table[id] < 0;
//   with m misses in the token, the first direct_count(m, share) misses in j order are read directly;
//   the other misses run on the CPU pool.
// Header-only and free of CUDA headers: the CUDA kernels (moe_kernels.cu) and the host split
// (cuda/pool_io.cpp) include this one definition.
#include <cstdint>
#include <string>

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__ __forceinline__
#else
#define STRATA_HD inline
#endif

namespace strata::moe {

// A share of a token's misses, in 1/256ths (0 = off, 256 = all).
constexpr int kDirectShareOne = 256;

// Misses of m that are read directly at share s (in 1/256ths): m * s / 256 rounded half up.
STRATA_HD int direct_count(int misses, int share) { return (misses * share + kDirectShareOne / 2) / kDirectShareOne; }

// Pair j of a token (its k ids at `ids`, this layer's table row): its rank among the token's direct
// pairs (0, 1, ... < direct_count(k, share)) when it is read directly, else -1.
STRATA_HD int direct_rank(const int32_t* ids, const int32_t* table, int k, int j, int share) {
  if (share <= 0) return -1;
  const int32_t e = ids[j];
  if (e < 0 || table[e] >= 0) return -1;
  int misses = 0, before = 0;
  for (int i = 0; i < k; ++i) {
    const int32_t ei = ids[i];
    const bool miss = ei >= 0 && table[ei] < 0;
    misses += miss;
    before += miss && i < j;
  }
  return before < direct_count(misses, share) ? before : -1;
}
STRATA_HD bool pair_is_direct(const int32_t* ids, const int32_t* table, int k, int j, int share) {
  return direct_rank(ids, table, k, j, share) >= 0;
}

// --decode-direct: "off" (0), or a share of each token's misses in [0, 1], rounded to 1/256ths. Anything
// else is a strata::Error naming `what`. direct_share_str gives it back ("off" or the share).
int parse_direct_share(const std::string& text, const std::string& what);
std::string direct_share_str(int share);

}  // namespace strata::moe

#undef STRATA_HD
