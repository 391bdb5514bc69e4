#pragma once
// The host side of a CUDA MoE model's forward pass, the same for every architecture (qwen3moe_cuda.cpp,
// qwen3next_cuda.cpp): the routing / CPU-pool / logits buffers of a workspace, and the steps around
// them — the pass's start, a CPU-pool layer (routing and activations down, the non-resident pairs on CPU
// threads, their sum up), the end-of-pass downloads, and the expert-cache report.
//
// Ordering (every copy through the transfer module; docs/gpu.md, "Why every cross-stream access is
// ordered"): the downloads of a layer's ids / weights / xn are recorded after the kernels that wrote them
// on the compute stream; the host waits for them before it enqueues anything that rewrites xn or that
// layer's slice of ids; the partial goes up on compute (ordered before the add that reads it) and the
// host waits for the previous upload before it writes partial_h again. In a gated pass (docs/gpu.md) the same order holds through flags: the
// host reads a layer's downloads after its signal, and writes partial_h before its gate opens and again
// only after a later signal.
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "cpu/matmul_batch.h"
#include "cuda/device.h"
#include "cuda/expert_cache.h"
#include "cuda/ops.cuh"
#include "cuda/transfer.h"
#include "model/model.h"
#include "model/moe_ffn.h"
#include "moe/stream_plan.h"

namespace strata::cuda {

// Host work of the forward passes (for `strata bench`): counted, never timed.
struct HostWork {
  uint64_t forwards = 0, graph_forwards = 0, captures = 0;
  uint64_t gated_forwards = 0;  // CPU-pool passes run gated (one graph, HostGates)
  uint64_t direct_pairs = 0;    // non-resident pairs the GPU read from host memory (moe/direct_rule.h)
  uint64_t direct_bytes = 0;    // their experts' bytes (each its layer's expert_bytes)
  uint64_t op_calls = 0;   // calls into kernel launchers (an op may launch more than one kernel)
  uint64_t transfers = 0;  // cuda::Transfer calls (each: events, waits and one copy)
  // Decode expert prediction (cuda/expert_predict.h): routed experts of the layers that predicted, and how
  // many of them the prediction named.
  uint64_t predicted = 0, predict_hits = 0;
  // Wall time of forward(): blocked on the end-of-pass wait (the GPU still working), and the rest
  // (enqueueing, and in CPU-pool passes the pool's work and waits). host >> wait = the host is the
  // bottleneck.
  std::chrono::steady_clock::duration host{}, wait{};
  std::chrono::steady_clock::duration pool{}, route_wait{};  // parts of host: CPU experts, routing waits
  uint64_t h2d_base = 0, d2h_base = 0;  // the transfer module's byte totals when counting began
  // Zero counts, bytes counted from the transfer module's totals now.
  static HostWork starting_now(const Transfer& xfer);
};

// A workspace's routing, CPU-pool and logits buffers (the model's workspace derives from it).
struct PoolIo {
  // n_tok tokens a pass at most, k experts per token, n_layer routed layers.
  PoolIo(Device& dev, int n_layer, int32_t n_tok, const HParams& hp, int n_threads);
  // Waits for the copies of passes still pending (ForwardOptions::defer) before their buffers go.
  ~PoolIo();
  PoolIo(const PoolIo&) = delete;
  PoolIo& operator=(const PoolIo&) = delete;
  size_t memory_bytes() const;

  int n_layer;
  int k_used;  // experts per token
  // device
  DeviceBuffer ids;      // [n_layer][n][k] int32 for a batch of n tokens (layer stride n*k, so one
                         // download of n_layer*n*k values takes every layer's routing)
  DeviceBuffer wts;      // [n_tok][k] f32
  DeviceBuffer partial;  // [n_tok][n_embd] f32, the CPU pool's weighted sum, uploaded
  DeviceBuffer logits;   // [n_tok][n_vocab] f32
  DeviceBuffer samp_u;   // [n_tok] f32 draws of device sampling (ForwardOptions::sampling)
  DeviceBuffer samp_ids; // [n_tok] int32 its picks
  DeviceBuffer samp_parts;  // ops::argmax_parts_bytes(n_tok, n_vocab): greedy picks' per-block keys
  DeviceBuffer samp_cand;   // ops::sample_scratch_bytes(n_tok, n_vocab): the sampler's candidate keys
  PinnedBuffer samp_ids_h;  // [n_tok] int32
  DeviceBuffer samp_ban;    // [kMaxDeviceBans] int32 banned ids, then [n_tok] uint8 row flags (DeviceSampling::ban)
  std::vector<uint8_t> samp_ban_h;  // its host image, uploaded through the transfer module
  DeviceBuffer samp_rules;  // [n_tok] ops::SampleParams: per-row rules (DeviceSampling::rules)
  std::vector<ops::SampleParams> samp_rules_h;  // [n_tok] its host image
  // pinned host
  PinnedBuffer ids_h;      // [n_layer][n][k] int32, as ids
  PinnedBuffer wts_h;      // [n_tok][k]
  PinnedBuffer xn_h;       // [n_tok][n_embd]
  PinnedBuffer partial_h;  // [n_tok][n_embd] written by the CPU pool
  PinnedBuffer logits_h;   // [n_tok][n_vocab]
  // host
  std::vector<int32_t> ids_cpu;         // [n_tok][k]: expert id, or -1 where the GPU runs the pair
  std::vector<uint8_t> layer_recorded;  // [n_layer] this forward's routing already recorded
  // streaming (stream_candidates / stage_experts)
  DeviceBuffer stage_row;               // [n_expert] int32: a streaming pass's table row (slot, staging slot or -1)
  std::vector<int32_t> stage_row_h;     // [n_expert] host copy of stage_row
  std::vector<int32_t> stage_count;     // [n_expert] the CPU pool's pairs per expert (streaming choice)
  std::vector<int32_t> stage_order;     // experts to stream, busiest first
  std::vector<int32_t> stage_pairs;     // their pair counts (balance_prefill_candidates)
  Ticket ids_ticket;                    // pending end-of-forward download of ids_h
  Ticket partial_ticket;                // last upload that reads partial_h
  std::unique_ptr<HostGates> gates;     // [n_layer] signal / gate of each layer in a gated pass
  // Decode passes left pending (ForwardOptions::defer; finish_forward_deferred), oldest first, at most
  // two. Each brings its routing and picks down into its own buffer of ahead_h through mapped memory (a
  // copy kernel on the compute stream after its sampler), so the next pass neither waits for the host nor
  // writes what the host is reading: a pass's buffer is written again only by the pass after the next,
  // which is launched after the host completed this one (two pending at most).
  struct Deferred {
    Ticket done;          // the copy kernel's completion
    int buf;              // its ahead_h
    int64_t n, n_out;
    int32_t* out;         // DeviceSampling::out of the pass: [n_out]
    strata::moe::ExpertUsage* usage;
    std::chrono::steady_clock::time_point t_start;
  };
  PinnedBuffer ahead_h[2];  // each [n_layer][kMaxDeferTokens][k] ids, then [kMaxDeferTokens] picks, int32
  std::deque<Deferred> deferred;
  int next_ahead = 0;       // the ahead_h of the next deferred pass
  // Rows the latest pass picked on the device into samp_ids ([pick_rows] int32), what a chained pass
  // (ForwardOptions::chain) takes as its tokens; 0 after a pass that did not pick there.
  int64_t pick_rows = 0;
  MoeScratch moe;
  cpu::MatmulBatch mb;
};

// What the parts below need of the model.
struct PoolCtx {
  Transfer& xfer;
  Stream& cs;  // the compute stream: producer and consumer of every copy here
  ExpertCache& cache;
  HostWork& work;
};

// The start of a forward pass (after the batch's inputs are packed into step_host): waits for the
// copies of a pass that threw half-way, fixes the expert-cache tables for the pass (begin_step), and
// uploads the step inputs (step_bytes of step_host into step_in) in one copy.
void begin_forward(const PoolCtx& c, PoolIo& io, const DeviceBuffer& step_in, const void* step_host,
                   size_t step_bytes);

// Layer il's routing and normed activations on their way to the host (enqueued after the router, one
// transfer for the three copies).
struct PoolDownloads {
  Ticket done;
};
PoolDownloads pool_download(const PoolCtx& c, PoolIo& io, const DeviceBuffer& xn, int il, int64_t n, int64_t n_embd);

// Waits for the downloads, records the layer's routing (expert cache statistics, usage), and splits its
// pairs: io.ids_cpu = the expert id where the CPU runs the pair, -1 where the GPU does (a slot, or a direct
// read at direct_share: moe/direct_rule.h). Returns the number of pairs for the CPU. Throws strata::Error
// for an expert id out of range.
int64_t pool_split(const PoolCtx& c, PoolIo& io, const PoolDownloads& d, int il, int64_t n, int n_expert,
                   strata::moe::ExpertUsage* usage, int direct_share = 0);

// The CPU's pairs (io.ids_cpu) on the pool's threads, their weighted sum uploaded to io.partial on the
// compute stream. The caller then adds io.partial into x with a kernel on the compute stream. Returns the
// pool's microseconds (the streaming splits' CPU cost).
double pool_compute(const PoolCtx& c, PoolIo& io, const ExpertWeights& experts, int64_t n, int64_t n_embd,
                  ThreadPool& pool, MatmulMode mode);

// ---- Gated passes (docs/gpu.md): the pass enqueued whole, the host releasing each CPU-pool layer ----
// The pieces above split at their CUDA calls: the downloads raise layer il's signal of io.gates, the
// partial's upload (and its add into x) waits for its gate. Both: enqueue = true inside the pass's
// capture, false where the host releases the work (Transfer::download_signaled / upload_gated).
void pool_download_signaled(const PoolCtx& c, PoolIo& io, const DeviceBuffer& xn, int il, int64_t n, int64_t n_embd,
                            bool enqueue);
// x [n][n_embd] += layer il's partial, added by the gated kernel itself (Transfer::GatedWrite::AddF32).
void pool_add_gated(const PoolCtx& c, PoolIo& io, const DeviceBuffer& x, int il, int64_t n, int64_t n_embd,
                    bool enqueue);
// False when the environment sets STRATA_CUDA_GATED=0 (read once per process).
bool gated_passes_enabled_by_env();
// False when the environment sets STRATA_CUDA_DIRECT_FETCH=0 (read once per process): direct pairs are
// then read by the expert kernels straight from host memory instead of fetched first (moe_kernels.cuh).
bool direct_fetch_enabled_by_env();
// The view of layer il for a pass's GPU experts: share 0, the layer's view; with direct reads at
// `share` > 0, the direct view, and with staging slots for the pass, moe_direct_fetch launched now (when
// `launch`) on the compute stream, its writes and the expert kernels' reads of the staging slots noted for
// the checker. table: the layer's device row; ids: its [n][k] routing (device).
moe::ExpertLayerView experts_view(const PoolCtx& c, int il, int share, int64_t n, int k, const int32_t* table,
                                  const int32_t* ids, bool launch);
// Whether a pass of n tokens fits the mapped route both ways (else it cannot run gated).
bool pool_fits_gated(const PoolIo& io, const Transfer& xfer, int64_t n, int64_t n_embd);
// Per layer of a gated pass: 0 = every expert resident (no CPU pool), 1 = CPU pool and resident experts,
// 2 = CPU pool only. The pass's kernels follow from it, so it is part of the pass's graph key; the
// CPU-pool layers (kind != 0, ascending) go to *pool_layers.
std::vector<uint8_t> gated_layer_kinds(const strata::moe::Residency& res, int n_layer, int n_expert,
                                       std::vector<int>* pool_layers);
// The layers of piece k of a gated pass over the CPU-pool layers pl (ascending): piece 0 starts with the
// embedding (after = -1), piece k > 0 with the gated add of layer after = pl[k-1]'s partial; layers
// [first, end) run on the GPU alone; then layer pool = end's front, its signaled download and the GPU's
// share of its FFN, or for the last piece (pool = -1, end = n_layer) the output.
struct GatedPiece {
  int after, first, end, pool;
};
GatedPiece gated_piece_layers(const std::vector<int>& pl, size_t k, int n_layer);
// The host's part of a gated pass, after its graph launch: release(0) (the notes of the pass's first
// piece); then per CPU-pool layer il = pool_layers[k]: wait for its signal, record its routing and split
// its pairs (pool_split, with g.direct_share), run the CPU's pairs into io.partial_h (zeros when there are
// none: the pass adds it all the same), open its gate, release(k + 1). If anything throws, the gates not yet opened are
// aborted and the stream drained before the exception goes on (the pass's results are then garbage, and
// the next pass may reset the flags).
struct GatedHost {
  const std::vector<int>& pool_layers;
  int64_t n, n_embd;
  int n_expert;
  int direct_share;  // moe/direct_rule.h: the GPU's kernels read these pairs directly (0: none)
  std::function<const ExpertWeights&(int)> experts;  // layer il's, as the CPU pool reads them
  std::function<void(size_t)> release;               // piece k's notes and counts (launches off)
};
void run_gated_host(const PoolCtx& c, PoolIo& io, const GatedHost& g, ThreadPool& pool, MatmulMode mode,
                    strata::moe::ExpertUsage* usage);

// ---- Streaming non-resident experts into the expert cache's staging slots (docs/expert_cache.md) ----

// The staging slots a model asks its expert cache for: `stream_slots` (>= 0) as given, at most one layer's
// experts; -1 (auto): one layer's experts when some experts are not resident (n_slots < total), else 0.
int staging_slots(int stream_slots, int n_slots, int total, int n_expert);

// STRATA_CUDA_STREAM_MIN_TOKENS: the pairs a non-resident expert needs in a prefill pass to be streamed
// (default 4, measured: docs/expert_cache.md). Throws strata::Error for a value that is not a number >= 1.
int stream_min_pairs_from_env();

// After pool_split: counts the CPU pool's pairs per expert (io.stage_count) and lists the experts with at
// least min_pairs of them in io.stage_order, busiest first (ties: lower id first), at most max_stage.
// Returns the number of distinct experts the CPU pool would run without streaming.
int stream_candidates(PoolIo& io, int64_t n, int n_expert, int min_pairs, int max_stage);

// --prefill-stream auto, after stream_candidates: keeps the first prefill_stream_count of io.stage_order
// (pair counts from io.stage_count; the other CPU pairs of the layer's n_expert experts stay on the pool).
void balance_prefill_candidates(PoolIo& io, int n_expert, const strata::moe::PrefillStreamCosts& costs);

// Copies the experts of io.stage_order (layer il) into staging slots 0, 1, ... (ExpertCache::stage), and
// uploads the pass's table row to io.stage_row: the staged experts' staging slots, and with
// keep_resident the layer's resident experts' own slots (else -1). Every copy and the row upload go
// through the transfer module with producer = consumer = compute, so each follows the kernels that read
// its staging slot in an earlier layer and precedes the launches that read it. The staged experts' pairs
// leave io.ids_cpu (-1). Returns the pairs moved to the GPU. io.stage_order must not be empty.
int64_t stage_experts(const PoolCtx& c, PoolIo& io, int il, int64_t n, int n_expert, bool keep_resident);

// Checks, before a pass enqueues anything, where its n_out logits rows ([n_out][n_vocab]) may go: at the
// start of io.logits_h (Model::logits_in_place: finish_forward leaves them there) or wholly outside it
// (strata::Error otherwise: a copy over itself). Nothing to check without rows or with sampling.
void check_logits_target(const PoolIo& io, const float* logits, int64_t n_out, int64_t n_vocab,
                         const DeviceSampling* sampling);

// The end of a forward pass: the routing of the layers the pool did not record comes down (one copy),
// the n_out rows of logits ([n_out][n_vocab]) are copied to `logits` (unless they are at io.logits_h
// already: check_logits_target) — or with sampling, picked on the
// device (ops::sample on the compute stream, after the draws go up) and only the ids come back —, the
// usage of those layers is recorded, the expert cache's step ends, and the host / wait times are
// counted from t_start.
void finish_forward(const PoolCtx& c, PoolIo& io, int64_t n, int64_t n_out, int64_t n_vocab, float* logits,
                    const DeviceSampling* sampling, strata::moe::ExpertUsage* usage,
                    std::chrono::steady_clock::time_point t_start);

// Passes of at most this many tokens may be left pending (ForwardOptions::defer: PoolIo::ahead_h's size).
constexpr int64_t kMaxDeferTokens = 8;

// Whether a pass may end with finish_forward_deferred: it picks on the device every one of its n tokens
// (n_out == n), at most kMaxDeferTokens, and fewer than two passes are pending.
bool can_defer(const PoolIo& io, int64_t n, int64_t n_out, const DeviceSampling* sampling);

// finish_forward for a pass that picks on the device (can_defer), without waiting: the sampler runs, and
// the layers' routing and the picks come down into the pass's ahead_h; the host part (picks into
// sampling->out, the routing recorded, the expert cache's end_step) is left to finish_deferred. Every
// layer's routing is recorded there (a pass with CPU-pool layers is not deferred).
void finish_forward_deferred(const PoolCtx& c, PoolIo& io, int64_t n, int64_t n_vocab, const DeviceSampling& sampling,
                             strata::moe::ExpertUsage* usage, std::chrono::steady_clock::time_point t_start);

// Completes the oldest pending pass (nothing when none is): waits for its copies, writes its picks to its
// DeviceSampling::out, records its routing and ends its expert-cache step.
void finish_deferred(const PoolCtx& c, PoolIo& io);

// strata::Error unless the previous pass picked exactly n rows on the device (what a chained pass of n
// tokens takes as its tokens: ForwardOptions::chain). Before the pass enqueues anything.
void check_chain(const PoolIo& io, int64_t n);

// A chained pass's tokens: the previous pass's n picks (io.samp_ids) copied into `tokens` ([n] int32 of the
// pass's step inputs, after their upload) by a kernel on the compute stream (check_chain's error first).
void chain_tokens(const PoolCtx& c, PoolIo& io, const DevSpan& step_in, size_t tokens_offset, int64_t n);

// The expert-cache report of a model (n_layer routed layers of n_expert), with the transfer module's
// bytes since `work` began counting.
ExpertCacheReport make_cache_report(const ExpertCache& cache, const Transfer& xfer, int n_layer, int n_expert,
                                    bool graphs, const HostWork& work);

}  // namespace strata::cuda
