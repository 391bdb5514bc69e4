#pragma once
// The routed-expert half of an MoE block, shared by every MoE architecture: given each token's k
// chosen experts and weights, out[t] = sum_j w[t][j] * down_e(silu(gate_e(x[t])) * up_e(x[t])).
// Tokens are grouped by expert (counting sort), so each expert's three products run once over all of
// its tokens; all experts' products go out as one parallel job (cpu/matmul_batch.h).
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/matmul_batch.h"
#include "model/weights.h"

namespace strata {

struct ExpertWeights {
  Weight gate;  // [n_embd][n_ff][n_expert]  (ggml ne order)
  Weight up;    // [n_embd][n_ff][n_expert]
  Weight down;  // [n_ff][n_embd][n_expert]
};

class MoeScratch {
 public:
  MoeScratch(int64_t max_tokens, int k, int n_expert, int64_t n_embd, int64_t n_ff);
  size_t memory_bytes() const;

  std::vector<int32_t> offset;  // [n_expert + 1] first grouped row of each expert
  std::vector<int32_t> fill;    // [n_expert]
  std::vector<int32_t> row_of;  // [max_tokens * k] grouped row of (token, slot)
  std::vector<int32_t> tok_of;  // [max_tokens * k] token of grouped row
  std::vector<float> xe;        // [max_tokens * k][n_embd] gathered inputs
  std::vector<float> g, u;      // [max_tokens * k][n_ff]
  std::vector<float> d;         // [max_tokens * k][n_embd]
  int64_t max_tokens;
  int k;
  // Fused decode path only (grown on first use):
  std::vector<int32_t> active;       // [<= n_expert] experts with at least one pair, ascending
  std::vector<uint8_t> xq_gate, xq_up;  // [n][passes][act row bytes] quantized x for gate / up
  std::vector<uint8_t> hq;           // [max_tokens * k][passes][act row bytes] quantized down inputs
  // Counters of the fused path, each on its own cache line (16 threads update them: no false sharing):
  // [n_expert] gate+up items finished per active expert, [n_expert] its down inputs ready, then
  // [n_embd / 16 + 1] items finished per down row range.
  struct alignas(64) Counter {
    std::atomic<int32_t> v{0};
  };
  size_t n_sync;  // 2 * n_expert + n_embd / 16 + 1
  std::unique_ptr<Counter[]> sync;
};

// How moe_experts runs a decode-sized batch (see moe_ffn.cpp). Every choice gives the same bytes.
struct MoeOptions {
  // The fused decode path (n <= kMoeFusedMaxTokens, fast modes): 1 or 2 parallel regions per call, swiglu
  // and the down-input quantization inside the gate+up region, the weighted sum inside the down region.
  // false: the general path (matmul_many for gate+up, a swiglu region, matmul_many for down, a serial
  // weighted sum).
  bool fused = true;
  // Software prefetch distance in bytes ahead of the weight row being read (0: none). Why: the
  // hardware streamers restart at every 4 KiB page (a 32 KiB item spans 8 of them), and a row kernel's
  // out-of-order window covers ~1 KiB of weights, too little to hide a DRAM miss by itself.
  int prefetch_bytes = 4096;
  // true: prefetch into L2 (prefetcht1: the line does not hold an L1 fill buffer for the whole DRAM
  // latency); false: into L1 (prefetcht0).
  bool prefetch_l2 = true;
  // One parallel region instead of 2: the down items follow the gate+up items in one list, and a down
  // item whose expert's inputs are not quantized yet waits for them (only near the phase boundary).
  bool one_region = true;
  // Target weight bytes per work item (row chunk); at least 8 rows (gate+up) / 16 rows (down). Why
  // this large: every item starts new weight streams, each paying a DRAM latency or more before the
  // prefetchers run ahead (dev box, 2 threads: 32 KiB items 0.75x memcpy, 64 KiB 0.85x, 128 KiB ~1x;
  // H200 box, 16 threads, 6 experts of a decode layer, one run: 32 KiB 200 us, 64 KiB 209-220 us,
  // 128 KiB 192 us; bench/results/2026-11-29-gpu-session3-h200.md).
  int item_bytes = 128 << 10;
  // The same for the down items of the last active expert, the last items handed out: smaller, so the
  // threads run out of work together (0: item_bytes).
  int tail_item_bytes = 16 << 10;
  // A one-token expert's gate and up rows in one call of the two-row kernel where the level has one
  // (q::DotKernel::fn2; AVX-512 Q4_K and Q5_K): the activations are loaded once for both rows.
  bool pair_rows = true;
  // From STRATA_MOE_FUSED (0/1), STRATA_MOE_PREFETCH (bytes), STRATA_MOE_PREFETCH_L2 (0/1),
  // STRATA_MOE_ONE_REGION (0/1), STRATA_MOE_ITEM_KIB, STRATA_MOE_TAIL_KIB, STRATA_MOE_PAIR (0/1); read once.
  static const MoeOptions& from_env();
};
constexpr int64_t kMoeFusedMaxTokens = 8;

// x: [n][n_embd]; ids, w: [n][k]; out: [n][n_embd] (overwritten).
// A negative id means "not here" (the GPU backend sets the pairs its expert cache runs to -1 and gives
// this the rest): the pair is skipped, so out[t] sums only the non-negative ones (0 when none).
void moe_experts(const ExpertWeights& ew, const float* x, int64_t n, const int32_t* ids,
                 const float* w, int k, float* out, MoeScratch& s, cpu::MatmulBatch& mb,
                 ThreadPool& pool, MatmulMode mode);
// As above with explicit options (the benchmark compares them in one process).
void moe_experts(const ExpertWeights& ew, const float* x, int64_t n, const int32_t* ids,
                 const float* w, int k, float* out, MoeScratch& s, cpu::MatmulBatch& mb,
                 ThreadPool& pool, MatmulMode mode, const MoeOptions& opt);

}  // namespace strata
