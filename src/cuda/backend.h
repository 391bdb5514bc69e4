#pragma once
// The CUDA backend's entry point (issue 7): loads a GGUF model onto one GPU with an expert cache and
// the CPU pool for the experts that are not resident. Free of CUDA headers (the CLI includes it).
#include <cstdint>
#include <memory>
#include <string>

#include "model/model.h"

namespace strata::cuda {

struct CudaOptions {
  int gpu = 0;
  std::string expert_cache = "auto";  // N slots, N% of n_layer * n_expert, or auto (what fits)
  double vram_budget_gib = 0;         // 0: all free memory of the GPU
  int64_t vram_reserve_mib = 1024;    // left free by auto sizing
  std::string expert_profile;         // strata profile JSON: first residency (optional)
  int adapt_every = 32;               // forward passes between adaptation plans; 0: off
  bool exact = false;                 // dense weights and slots in f32 (the exact mode)
  int32_t n_ctx = 4096, n_batch = 512;  // for auto sizing: KV per sequence, workspace tokens
  int kv_sequences = 1;                 // sequences whose KV auto sizing leaves room for
  // Staging slots for streaming non-resident experts into prefill passes (docs/expert_cache.md):
  // -1: one layer's experts when some experts are not resident (0 when all are), 0: no streaming.
  int stream_slots = -1;
  // Decode-sized passes with staging slots: which share of a layer's non-resident experts is copied to
  // the GPU while the CPU pool runs the rest: off, auto (balanced by measured costs; the split then
  // depends on timings, so logits may differ in the last bits from run to run), or a share in [0, 1].
  // Off by default: on the H200 box the CPU pool alone already takes the host memory's bandwidth, and
  // copies only took from it (docs/expert_cache.md).
  std::string decode_stream = "off";
  // Prefill passes with staging slots: fixed (every non-resident expert with enough pairs, up to the
  // staging slots) or auto (the busiest of them, as many as balance the copies against the CPU pool's
  // measured time for the rest: moe/stream_plan.h; timing-dependent, so off by default).
  std::string prefill_stream = "fixed";
  // Decode-sized CPU-pool passes without decode streaming: the share of each token's non-resident experts
  // the GPU reads straight from their pinned host copy over PCIe while the CPU pool runs the rest
  // (moe/direct_rule.h, docs/expert_cache.md): "off" or a share in [0, 1]. Deterministic (a fixed rule on
  // the routing). Not in the exact mode (the host copy is f32 there: 4-8x the bytes of a quantized expert).
  std::string decode_direct = "0.375";
  bool cuda_graphs = true;  // replay passes of up to 8 tokens without the CPU pool as CUDA graphs
                            // (also off when the environment sets STRATA_CUDA_GRAPHS=0)
  // CPU-pool passes of up to 8 tokens enqueued whole as one graph, the host releasing each layer through
  // flags in pinned memory (docs/gpu.md "Gated passes"; qwen3moe; needs cuda_graphs). Off also when the
  // environment sets STRATA_CUDA_GATED=0.
  bool gated_passes = true;
};

// Dispatches on general.architecture; an architecture without a CUDA implementation is a
// strata::Error that names it and says to use --backend cpu.
std::unique_ptr<Model> load_model_cuda(const std::string& path, const CudaOptions& opt);

// The qwen3moe implementation (qwen3moe_cuda.cpp).
std::unique_ptr<Model> make_qwen3moe_cuda(gguf::File file, const CudaOptions& opt);
// The qwen3next implementation (qwen3next_cuda.cpp).
std::unique_ptr<Model> make_qwen3next_cuda(gguf::File file, const CudaOptions& opt);

}  // namespace strata::cuda
