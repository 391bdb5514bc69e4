#pragma once
// The common interface of every architecture (one file each: qwen3moe.cpp, later qwen3next.cpp, ...).
// A Model owns the mapped GGUF file and the checked weight views; it is immutable after loading and
// can serve any number of sequences. Mutable things live elsewhere:
//   SequenceState (kv/sequence_state.h): per-sequence KV cache (+ recurrent state), made by the model
//   Workspace: the activations of one forward pass, allocated up front for max_tokens tokens
// forward() evaluates a batch whose tokens may belong to different sequences (prefill: many tokens of
// one sequence; decode: one token of each of several sequences), writes their K/V into the sequences'
// states at their positions and returns the logits of the tokens that ask for them.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu/thread_pool.h"
#include "gguf/gguf.h"
#include "kv/sequence_state.h"
#include "model/hparams.h"
#include "quant/matmul.h"

namespace strata {
namespace moe {
class ExpertUsage;
}  // namespace moe


struct BatchToken {
  int32_t token;  // id in [0, n_vocab)
  int32_t pos;    // position in its sequence; positions [0, pos) must already be in the cache
  int32_t seq;    // index into Batch::seqs
  bool logits;    // write this token's logits
};

struct Batch {
  std::span<const BatchToken> tokens;  // [n_tokens]
  std::span<SequenceState* const> seqs;
};

// A pick per logits row made by the backend where the logits are (Model::samples_on_device): the
// engine's Sampler rule without penalties (top-k -> top-p -> min-p -> temperature -> draw; temperature
// <= 0: greedy) with the caller's uniform draws, so no logits are copied back.
struct DeviceSampling {
  float temperature = 0.8f;
  int32_t top_k = 40;    // <= 0: off
  float top_p = 0.95f;   // 1: off
  float min_p = 0.05f;   // 0: off
  const float* u = nullptr;  // [n_out] draws in [0, 1) (ignored when greedy)
  int32_t* out = nullptr;    // [n_out] the picked ids, in the order of the rows that want logits
  // Rows with rules of their own (a batch of requests with different parameters): rules[r] for row r,
  // the four fields above ignored (null: those fields for every row).
  struct Rule {
    float temperature;
    int32_t top_k;  // <= 0: off
    float top_p;
    float min_p;
  };
  const Rule* rules = nullptr;  // [n_out]
  // Tokens some rows never pick (a request's ignore_eos; cpu::ban_tokens): ban[0, n_ban) in [0, n_vocab),
  // applied to row r where ban_rows[r] is nonzero (null: no row). n_ban <= kMaxDeviceBans.
  static constexpr int32_t kMaxDeviceBans = 64;
  const int32_t* ban = nullptr;       // [n_ban]
  int32_t n_ban = 0;
  const uint8_t* ban_rows = nullptr;  // [n_out]
};

struct ForwardOptions {
  MatmulMode mode = MatmulMode::Fast;
  cpu::AttnMath attn = cpu::AttnMath::GgmlF16;  // see cpu/ops.h
  moe::ExpertUsage* usage = nullptr;  // when set, every MoE layer adds its tokens' top-k expert ids
  // When set (only for a model whose samples_on_device() is true): the rows that want logits are
  // sampled by the backend into sampling->out and forward's logits argument is not written (may be null).
  const DeviceSampling* sampling = nullptr;
  // Chained decode (Engine::generate), only where chains_decode() said yes for this workspace and batch:
  // chain: token i of the batch is the previous pass's device pick of row i (the batch's token values are
  //   not read); that pass sampled on the device (sampling set) with the same rows, one per token.
  // defer: forward may return before the pass ends: sampling->out (which must stay valid), the statistics
  //   and the expert cache's step are completed by finish_deferred(ws). At most two passes are left
  //   pending at once; a forward without chain first completes any pending one.
  bool chain = false;
  bool defer = false;
};

// What a backend with a GPU expert cache reports (issue 7); `present` is false on the CPU backend.
struct ExpertCacheReport {
  bool present = false;
  int64_t hits = 0, misses = 0;  // routed-expert selections served from a GPU slot / by the CPU pool
  int64_t swaps = 0;             // adaptation admissions
  int64_t streamed = 0;          // non-resident experts copied to the GPU for one pass (prefill and decode streaming)
  int64_t direct = 0;            // of the misses, those the GPU read straight from host memory (--decode-direct)
  double stream_copy_us = 0, stream_cpu_us = 0;  // decode streaming's split: costs of one expert (0: not in use)
  int slots_used = 0, n_slots = 0, n_experts_total = 0;  // n_experts_total = n_layer * n_expert
  uint64_t bytes_h2d = 0, bytes_d2h = 0;  // bytes moved by the transfer module
  uint64_t slot_bytes = 0;                // bytes of one slot (capacity = n_slots * slot_bytes)
  uint64_t direct_bytes = 0, streamed_bytes = 0;  // host bytes of the direct pairs' / streamed experts' copies
  // Host work of the forward passes (counted, not timed): how many replayed a CUDA graph, and the calls
  // into kernel launchers and the transfer module the host made for them.
  bool graphs_enabled = false;
  int64_t forwards = 0, graph_forwards = 0, graph_captures = 0, op_calls = 0, transfers = 0;
  int64_t gated_forwards = 0;  // CPU-pool passes enqueued whole as one graph (docs/gpu.md "Gated passes")
  double host_s = 0, wait_s = 0;  // wall time in forward(): blocked on the end-of-pass wait / the rest
  double pool_s = 0, route_wait_s = 0;  // of host_s: in the CPU pool's experts / waiting for a layer's routing
  // Decode expert prediction (prefetch into L2): routed experts of the layers that predicted, of them named
  int64_t predicted = 0, predict_hits = 0;
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
};

// Activations of one architecture, sized at creation; forward() allocates nothing.
class Workspace {
 public:
  virtual ~Workspace() = default;
  virtual int32_t max_tokens() const = 0;
  virtual size_t memory_bytes() const = 0;
};

class Model {
 public:
  virtual ~Model();  // frees the Q4_K repack cache (its keys are weight pointers of some model)
  const HParams& hparams() const { return hp_; }
  const gguf::File& file() const { return file_; }
  int32_t n_vocab() const { return hp_.n_vocab; }

  // A fresh sequence with its caches allocated for n_ctx tokens.
  virtual std::unique_ptr<SequenceState> new_sequence(int32_t n_ctx, KvType kv_type) const = 0;
  // Activations for batches of up to max_tokens tokens attending to up to n_ctx positions, split over
  // n_threads threads.
  virtual std::unique_ptr<Workspace> new_workspace(int32_t max_tokens, int32_t n_ctx,
                                                   int n_threads) const = 0;
  // logits: [number of tokens with .logits][n_vocab], in batch order. Does not advance the sequences
  // (the engine does). Tokens and positions are validated by the caller (Engine).
  virtual void forward(const Batch& batch, Workspace& ws, float* logits, ThreadPool& pool,
                       const ForwardOptions& opt) const = 0;
  // Host memory of ws for n_rows rows of logits ([n_rows][n_vocab]) that forward()'s logits argument may
  // point to, at its start: the backend then leaves the logits where its own download put them instead of
  // copying them to the caller's memory (the CUDA backend: the pass's pinned download buffer; why: a 152k
  // vocabulary's row is 608 KB, copied on the host between one decode step and the next). nullptr where
  // the backend has none or it holds fewer rows. What a forward wrote there stays until the next forward
  // on ws.
  virtual float* logits_in_place(Workspace& ws, int64_t n_rows) const {
    (void)ws;
    (void)n_rows;
    return nullptr;
  }
  // Bytes of weights (mapped).
  virtual size_t weight_bytes() const = 0;
  // "cpu", or "cuda:N" for the GPU backend.
  virtual std::string backend_name() const { return "cpu"; }
  // Layers whose routed experts the forward counts in ForwardOptions::usage (the shape of an expert
  // usage profile for this model): every layer, except e.g. qwen3next's MTP blocks, which do not run.
  virtual int32_t routed_layers() const { return hp_.n_layer; }
  // Expert-cache statistics since the last reset (a GPU model's cache is shared by its sequences, so
  // these are the model's, not a sequence's).
  virtual ExpertCacheReport cache_report() const { return {}; }
  // The backend can pick tokens where it computes the logits (ForwardOptions::sampling).
  virtual bool samples_on_device() const { return false; }
  // Whether a decode pass of n_seqs one-token sequences on ws, picking on the device, may chain to the
  // previous pass's picks and return before it ends (ForwardOptions::chain / defer). Why: the device then
  // runs pass t + 1 while the host takes pass t's picks (streams the text, checks stop strings), and no
  // round trip through the host stands between two passes.
  virtual bool chains_decode(const Workspace& ws, int32_t n_seqs) const {
    (void)ws;
    (void)n_seqs;
    return false;
  }
  // Completes the oldest pass that forward() left pending on ws (ForwardOptions::defer); nothing when none is.
  virtual void finish_deferred(Workspace& ws) const { (void)ws; }
  virtual void reset_cache_stats() const {}
  // Measured bandwidths of the backend's own memories in GB/s (1e9), for a roofline: device memory and
  // host -> device copies. 0 where the backend has none (the CPU backend) or a measurement failed.
  struct DeviceBandwidth {
    double device_gbs = 0, h2d_gbs = 0;
  };
  virtual DeviceBandwidth measure_device_bandwidth() const { return {}; }

 protected:
  Model(gguf::File file, HParams hp) : file_(std::move(file)), hp_(std::move(hp)) {}
  gguf::File file_;
  HParams hp_;
};

// Opens a GGUF file and builds the model of its architecture (the one dispatch point). Throws
// strata::Error for an unknown architecture or a file that does not match it.
// Maps every page of the file's tensor data now (MADV_POPULATE_READ), so the first forward passes take no
// page faults; skipped by STRATA_POPULATE=0 and, unless STRATA_POPULATE=1, for weights over half the
// memory. load_model(path) and the CUDA backend's loader call it (model.cpp says why and what it saved).
void populate_weights(const gguf::File& f);
std::unique_ptr<Model> load_model(const std::string& path);
std::unique_ptr<Model> load_model(gguf::File file);

// The architectures load_model knows.
std::vector<std::string> supported_architectures();

}  // namespace strata
