#pragma once
// The end of a CUDA MoE model's load, the same for every architecture (qwen3moe_cuda.cpp,
// qwen3next_cuda.cpp): the expert cache sized from the options and the memory left after the dense
// weights, with its staging slots for streaming, its first residency (a --expert-profile or spread
// evenly), and the load's lines on stderr.
//
// Sizing (docs/expert_cache.md): --expert-cache N | N% | auto; auto takes what fits in the free device
// memory (or --vram-budget less the dense weights) after the KV cache / recurrent state, the workspace, the
// device table, the staging slots and --vram-reserve-mib. Staging slots: pool_io.h staging_slots.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/backend.h"
#include "cuda/device.h"
#include "cuda/expert_cache.h"
#include "cuda/model_common.h"
#include "cuda/transfer.h"
#include "moe/stream_plan.h"

namespace strata::cuda {

// What the model knows once its dense weights are on the device.
struct CacheGeometry {
  int n_layer = 0, n_expert = 0;  // routed layers x experts per layer
  int64_t n_embd = 0, n_ff = 0;   // an expert's shape
  std::vector<LayerExperts> layers;  // [n_layer] the experts' tensors in the file
  int64_t kv_bytes = 0;     // KV cache (and recurrent state) of opt.kv_sequences sequences of opt.n_ctx
  int64_t ws_bytes = 0;     // one workspace of opt.n_batch tokens
  int64_t dense_bytes = 0;  // device memory the dense weights took
  size_t free_bytes = 0;    // device memory free after them
  std::string model;        // for the first stderr line, e.g. "qwen3next 3 GDN + 1 attention layers, "
  std::string kv_what = "KV";  // what kv_bytes holds, for the auto-sizing line
};

struct MadeCache {
  std::unique_ptr<ExpertCache> cache;
  int stream_min_pairs = 4;  // stream_min_pairs_from_env(): pairs an expert needs to be streamed
  strata::moe::PrefillStreamMode prefill_stream;  // CudaOptions::prefill_stream
  strata::moe::DecodeStreamMode decode_stream;    // CudaOptions::decode_stream
  int direct_share = 0;  // CudaOptions::decode_direct in 1/256ths; 0 when off or where it cannot run
  // Microseconds to copy one expert into a staging slot (ExpertCache::time_stage_copy), measured when a
  // split needs it: staging slots and --prefill-stream auto or --decode-stream not off; else 0.
  double copy_us = 0;
};

// Sizes and builds the expert cache (throws strata::Error for a bad option or profile, naming it).
MadeCache make_expert_cache(Device& dev, Transfer& xfer, const CudaOptions& opt, CacheGeometry g);

// The load's line about dense tensors converted on the CPU (exact mode: all, to F32; else those without
// a GPU kernel), if any.
void print_dense_repacks(const RepackLog& log, bool exact);

}  // namespace strata::cuda
