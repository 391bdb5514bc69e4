// qwen3moe on one GPU (issue 7): the forward pass of model/qwen3moe.cpp op for op, on the compute
// stream, with the routed experts split between the GPU expert cache (resident experts, from slots) and
// the CPU pool (the others, on CPU threads from the mapped file, at the same time). docs/gpu.md has the
// design: stream roles, the per-layer flow, why every cross-stream access is ordered.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>

#include "common/error.h"
#include "cpu/half.h"
#include "cpu/matmul_batch.h"
#include "cuda/backend.h"
#include "cuda/cache_setup.h"
#include "cuda/device.h"
#include "cuda/attn_tile.cuh"
#include "cuda/expert_cache.h"
#include "cuda/expert_predict.h"
#include "cuda/gemm_context.h"
#include "cuda/host/attn_span.h"
#include "cuda/graph.h"
#include "cuda/model_common.h"
#include "cuda/moe_model_base.h"
#include "cuda/moe_kernels.cuh"
#include "cuda/ops.cuh"
#include "cuda/ops_fused.cuh"
#include "cuda/pdl_scope.h"
#include "cuda/pool_io.h"
#include "cuda/q8_kernels.cuh"
#include "cuda/quant_kernels.cuh"
#include "cuda/transfer.h"
#include "model/moe_ffn.h"
#include "model/weights.h"
#include "moe/stream_plan.h"
#include "quant/dequant.h"

namespace strata::cuda {
namespace {

// Batches of up to this many tokens (decode of up to 8 sequences, short verify windows) run as a CUDA
// graph when no layer needs the CPU pool. Larger batches are prefill: few forwards, long kernels, and
// quant::matmul may take a cuBLAS path there; their launch overhead does not matter.
constexpr int64_t kMaxGraphTokens = 8;
// GraphKey::segment of a gated pass (forward_gated), and how many of those graphs (one per residency
// pattern and batch shape) a workspace keeps before it starts over.
constexpr int kGatedSegment = -1;
constexpr size_t kMaxGatedGraphs = 16;

struct Layer {
  DevWeight attn_norm;  // [n_embd] f32
  // The q/k/v products in as few matrices as their kept types allow (stacked matrices need one type, so
  // one row size): wq|wk|wv as one [n_head*head_dim + n_head_kv*(head_dim + head_dim_v)][n_embd] matrix
  // (one product); else wq|wk as [n_head*head_dim + n_head_kv*head_dim][n_embd] and wv (two, e.g. the
  // Q4_K_M mix's Q6_K v in half the layers; model_common.h qk_stack); else wq and wk|wv as
  // [n_head_kv*(head_dim + head_dim_v)][n_embd] (two, e.g. the Q4_K_M mix with Q8_0 K and V of 8-expert
  // models); else the three. Unused ones are empty (rows 0).
  DevWeight wqkv;
  DevWeight wqk;
  DevWeight wkv;
  DevWeight wq;         // [n_head * head_dim][n_embd]      (empty when wqkv is used)
  DevWeight wk;         // [n_head_kv * head_dim][n_embd]   (used when neither stack is)
  DevWeight wv;         // [n_head_kv * head_dim_v][n_embd] (used with wqk, or when no stack is)
  DevWeight q_norm;     // [head_dim] f32
  DevWeight k_norm;     // [head_dim] f32
  DevWeight wo;         // [n_embd][n_head * head_dim_v]
  DevWeight ffn_norm;   // [n_embd] f32
  DevWeight router;     // [n_expert][n_embd]
  DevWeight router_fold;  // [n_expert][n_embd + n_head * head_dim_v] f32 (q8::fold_router); empty: not built
  int64_t fold_ss = 0;    // with router_fold: the partial sums q8::wo_router writes (wo_router_ss_count)
  DevWeight router_pred;  // [n_expert][n_embd] bf16 (predict::build_weight); empty: no expert prefetch
  ExpertWeights experts;  // host, the mapped file: what the CPU pool reads
};

// A sequence's KV cache on the GPU. Always f16 (what llama.cpp's flash attention stores, and what the
// exact mode needs to match the references), whatever the sequence's KvType says.
class DeviceKv final : public BackendState {
 public:
  DeviceBuffer k;  // [n_layer][n_ctx][n_head_kv][head_dim]   f16
  DeviceBuffer v;  // [n_layer][n_ctx][n_head_kv][head_dim_v] f16
  size_t memory_bytes() const override { return k.bytes() + v.bytes(); }
};

// Sizes (in values) of the device activations of a workspace: one formula for the workspace and for
// --expert-cache auto.
struct WsSizes {
  int64_t n, E, q, k, v, qkv, rope, att, router, ids, h, logits, scratch;
  int64_t xq, hq;  // int8 values of the Q8 activations (fast decode): [n][max(n_embd, n_head*head_dim_v)], h
  int64_t mid, ss;  // the folded router's (fast decode): h = x + wo . att [n][n_embd]; wo's partial sums
  WsSizes(const HParams& hp, int64_t n_tok, int64_t n_ctx)
      : n(n_tok),
        E(n_tok * hp.n_embd),
        q(n_tok * hp.n_head * hp.head_dim),
        k(n_tok * hp.n_head_kv * hp.head_dim),
        v(n_tok * hp.n_head_kv * hp.head_dim_v),
        qkv(q + k + v),
        rope(n_tok * hp.n_rot),
        att(n_tok * hp.n_head * hp.head_dim_v),
        router(n_tok * hp.n_expert),
        ids(n_tok * hp.n_expert_used),
        h(n_tok * hp.n_expert_used * hp.n_ff_exp),
        logits(n_tok * hp.n_vocab),
        scratch(int64_t(ops::attention_scratch_floats(n_tok, hp.n_head, hp.head_dim_v, n_ctx))),
        xq(n_tok * std::max<int64_t>(hp.n_embd, int64_t(hp.n_head) * hp.head_dim_v)),
        hq(h),
        mid(E),
        ss(hp.n_embd) {}
  // Bytes of a Q8 activation of `values` int8 values: the values and one float2 per 32.
  static int64_t q8_bytes(int64_t values) { return values + (values + 31) / 32 * 8; }
  // x, xn, moe_out, partial; q k v qkv rope att router; ids per layer + wts; h; logits; scratch;
  // tokens, pos, out_rows (int32) and refs; the Q8 activations xq and hq and the folded router's mid and ss
  // (fast mode only; counted always).
  int64_t device_bytes(int n_layer) const {
    return 4 * (4 * E + q + k + v + qkv + rope + att + router + ids * (n_layer + 1) + h + logits + scratch + 3 * n) +
           n * int64_t(sizeof(ops::KvRef)) + q8_bytes(xq) + q8_bytes(hq) + 4 * (mid + ss);
  }
};

class CudaWorkspace final : public Workspace, public PoolIo {
 public:
  // prefill: when batches of kGemmMinTokens or more fit and the mode is not exact, the dense products take
  // the cuBLAS path (gemm_context.h) and the MoE block the grouped kernels (moe_scratch_bytes of scratch).
  // q8_paths: the Q8 activation buffers of the fast decode (q8_kernels.cuh) are allocated.
  CudaWorkspace(Device& dev, const HParams& hp, int32_t max_tok, int32_t n_ctx, int n_threads,
                bool prefill_paths, size_t moe_scratch_bytes, bool q8_paths)
      : PoolIo(dev, hp.n_layer, max_tok, hp, n_threads), n_tok_max(max_tok), n_ctx_max(n_ctx) {
    const WsSizes z(hp, max_tok, n_ctx);
    x = dev.alloc(size_t(z.E) * 4, "ws.x");
    xn = dev.alloc(size_t(z.E) * 4, "ws.xn");
    q = dev.alloc(size_t(z.q) * 4, "ws.q");
    k = dev.alloc(size_t(z.k) * 4, "ws.k");
    v = dev.alloc(size_t(z.v) * 4, "ws.v");
    qkv = dev.alloc(size_t(z.qkv) * 4, "ws.qkv");
    rope_cs = dev.alloc(size_t(z.rope) * 4, "ws.rope_cs");
    att = dev.alloc(size_t(z.att) * 4, "ws.att");
    router = dev.alloc(size_t(z.router) * 4, "ws.router");
    h = dev.alloc(size_t(z.h) * 4, "ws.h");
    moe_out = dev.alloc(size_t(z.E) * 4, "ws.moe_out");
    step_in = dev.alloc(StepLayout(max_tok).bytes, "ws.step_in");
    route_counter = dev.alloc(4, "ws.route_counter");  // zeroed by new_workspace
    attn_scratch = dev.alloc(size_t(std::max<int64_t>(z.scratch, 1)) * 4, "ws.attn_scratch");
    if (q8_paths) {
      xq = dev.alloc(size_t(z.xq), "ws.xq");
      xds = dev.alloc(size_t(z.xq / 32) * sizeof(float2), "ws.xds");
      hq = dev.alloc(size_t(z.hq), "ws.hq");
      hds = dev.alloc(size_t(z.hq / 32) * sizeof(float2), "ws.hds");
      mid = dev.alloc(size_t(z.mid) * 4, "ws.mid");
      ss = dev.alloc(size_t(z.ss) * 4, "ws.ss");
      pred_counter = dev.alloc(4, "ws.pred_counter");  // zeroed by new_workspace
      pred_logits = dev.alloc(size_t(hp.n_expert) * 4, "ws.pred_logits");
      pred_ids = dev.alloc(size_t(hp.n_layer) * size_t(hp.n_expert_used) * 4, "ws.pred_ids");
      pred_slots = dev.alloc(pred_ids.bytes(), "ws.pred_slots");  // -1 (no slot) by new_workspace
      pred_ids_h = dev.alloc_pinned(pred_ids.bytes(), "ws.pred_ids_h");
      pred_layers.assign(size_t(hp.n_layer), 0);
    }
    step_host.resize(StepLayout(max_tok).bytes);
    if (prefill_paths && max_tok >= std::min(kGemmMinTokens, moe::kMoeGroupedMinTokens)) {
      const int64_t qkv_rows = int64_t(hp.n_head) * hp.head_dim + int64_t(hp.n_head_kv) * (hp.head_dim + hp.head_dim_v);
      const int64_t max_rows = std::max({int64_t(hp.n_vocab), qkv_rows, int64_t(hp.n_embd), int64_t(hp.n_expert)});
      const int64_t max_cols = std::max(int64_t(hp.n_embd), int64_t(hp.n_head) * hp.head_dim_v);
      gemm = make_gemm_context(dev, max_rows, max_cols, max_tok);
      if (moe_scratch_bytes > 0) moe_scratch = dev.alloc(moe_scratch_bytes, "ws.moe_scratch");
    }
  }
  int32_t max_tokens() const override { return n_tok_max; }
  size_t memory_bytes() const override {
    size_t b = PoolIo::memory_bytes() + x.bytes() + xn.bytes() + q.bytes() + k.bytes() + v.bytes() +
               qkv.bytes() + rope_cs.bytes() + att.bytes() + router.bytes() + h.bytes() + moe_out.bytes() +
               step_in.bytes() + route_counter.bytes() + attn_scratch.bytes() + moe_scratch.bytes() + xq.bytes() +
               xds.bytes() + hq.bytes() + hds.bytes() + mid.bytes() + ss.bytes() + pred_counter.bytes() +
               pred_logits.bytes() + pred_ids.bytes() + pred_slots.bytes() + pred_ids_h.bytes();
    return b;
  }

  int32_t n_tok_max, n_ctx_max;
  // device, f32 unless said (and PoolIo's: ids, wts, partial, logits and their host copies)
  DeviceBuffer x, xn;          // [n_tok][n_embd] residual stream, normed input
  DeviceBuffer q;              // [n_tok][n_head][head_dim]
  DeviceBuffer k, v;           // [n_tok][n_head_kv][head_dim], [n_tok][n_head_kv][head_dim_v]
  DeviceBuffer qkv;            // [n_tok][n_head*head_dim + n_head_kv*(head_dim + head_dim_v)] (Layer::wqkv),
                               // or [n_tok][n_head_kv*(head_dim + head_dim_v)] (Layer::wkv)
  DeviceBuffer rope_cs;        // [n_tok][n_rot/2][2] the batch's rope angles (ops::rope_cos_sin)
  DeviceBuffer att;            // [n_tok][n_head][head_dim_v]
  DeviceBuffer router;         // [n_tok][n_expert]
  DeviceBuffer h;              // [n_tok * k][n_ff] resident experts' silu(gate) * up
  DeviceBuffer moe_out;        // [n_tok][n_embd] resident experts' weighted sum
  DeviceBuffer step_in;        // StepLayout(n): refs, tokens, positions, logit rows of the batch
  DeviceBuffer route_counter;  // uint32, zero between launches: ops::router_route's last-block ticket
  DeviceBuffer attn_scratch;   // ops::attention_scratch_floats(n_tok, n_head, head_dim_v, n_ctx)
  // Q8 activations (q8_kernels.cuh layout) of the fast decode; empty in exact mode:
  DeviceBuffer xq, xds;        // [n_tok][max(n_embd, n_head*head_dim_v)] int8, [..][../32] float2: the normed
                               // input of a dense product (attn_norm, ffn_norm, output norm) or att (wo)
  DeviceBuffer hq, hds;        // [n_tok * k][n_ff] int8, [..][n_ff/32] float2: resident experts' silu(gate)*up
  DeviceBuffer mid;            // [n_tok][n_embd] the folded router's h = x + wo . att (moe_down: x = mid + ...)
  DeviceBuffer ss;             // [n_embd] (at least q8::wo_router_ss_count) wo_router's partial sums of h^2
  // The expert predictor's (cuda/expert_predict.h; fast decode):
  DeviceBuffer pred_counter;   // uint32, a multiple of the predictor's block count between launches
  DeviceBuffer pred_logits;    // [n_expert]
  DeviceBuffer pred_ids;       // [n_layer][k] int32: each layer's predicted experts of the latest token
  DeviceBuffer pred_slots;     // [n_layer][k] int32: their slots (-1: none; mode 4: gate_up prefetches them)
  PinnedBuffer pred_ids_h;     // its host copy
  std::vector<uint8_t> pred_layers;  // [n_layer] the latest pass's layers that predicted
  std::unique_ptr<GemmContext> gemm;  // prefill dense products (null: exact mode or small batches)
  DeviceBuffer moe_scratch;    // moe::moe_grouped_scratch_bytes for the largest layer (prefill MoE)
  // host
  std::vector<uint8_t> step_host;  // StepLayout(n), filled by forward() and uploaded in one copy
  // CUDA graphs of the compute section (CudaQwen3Moe::run_graph), one per (n, n_out, attention math,
  // attention kernel switch): they bake in this workspace's buffer addresses, so they live and die with it.
  struct GraphKey {
    int64_t n, n_out;
    int64_t span;  // Pass::kv_span: the attention kernels' split count and chunk
    int attn;
    bool mma;      // attn_tile::prefill_mma(): a process-wide switch that picks the kernel from 8 tokens on
    bool generic;  // quant::generic_only(): a process-wide switch (benchmarks) that turns the fast dots off
    int segment;   // 0: the whole compute section (run_graph); 1 + s: segment s of a CPU-pool pass (run_segment);
                   // kGatedSegment: a gated pass (forward_gated)
    std::vector<uint8_t> layers;  // a gated pass: each layer's kind (gated_layer_kinds, pool_io.h); else empty
    bool operator<(const GraphKey& o) const {
      return std::tie(n, n_out, span, attn, mma, generic, segment, layers) <
             std::tie(o.n, o.n_out, o.span, o.attn, o.mma, o.generic, o.segment, o.layers);
    }
  };
  std::map<GraphKey, Graph> graphs;
  uint64_t graphs_model = 0;            // CudaQwen3Moe::model_id_ of the model that captured them
  const void* graphs_slots = nullptr;   // the expert cache's slot and table allocations they read
  const void* graphs_table = nullptr;
};

class CudaQwen3Moe final : public CudaMoeModel {
 public:
  CudaQwen3Moe(gguf::File file, HParams hp, const CudaOptions& opt)
      : CudaMoeModel(std::move(file), std::move(hp), opt) {
    load();
    loaded_ = true;
  }

  std::unique_ptr<SequenceState> new_sequence(int32_t n_ctx, KvType kv_type) const override {
    STRATA_REQUIRE(n_ctx >= 1, "new sequence: context {} must be >= 1", n_ctx);
    dev_->make_current();
    auto seq = std::make_unique<SequenceState>(n_ctx, kv_type, std::vector<bool>(size_t(hp_.n_layer), false),
                                               hp_.n_head_kv, hp_.head_dim, hp_.head_dim_v);
    auto kv = std::make_unique<DeviceKv>();
    const size_t per_pos = size_t(hp_.n_layer) * size_t(n_ctx) * size_t(hp_.n_head_kv) * 2;
    kv->k = dev_->alloc(per_pos * size_t(hp_.head_dim), "kv.k");
    kv->v = dev_->alloc(per_pos * size_t(hp_.head_dim_v), "kv.v");
    seq->set_backend_state(std::move(kv));
    return seq;
  }
  std::unique_ptr<Workspace> new_workspace(int32_t max_tokens, int32_t n_ctx, int n_threads) const override {
    STRATA_REQUIRE(max_tokens >= 1 && n_ctx >= 1 && n_threads >= 1,
                   "workspace: batch {}, context {}, threads {} must all be >= 1", max_tokens, n_ctx,
                   n_threads);
    dev_->make_current();
    // Exact mode keeps f32 products everywhere: the prefill paths round x and w to bf16.
    const bool prefill_paths = !opt_.exact;
    const size_t moe_scratch = grouped_scratch_bytes(hp_.n_layer, max_tokens, prefill_paths);
    auto ws = std::make_unique<CudaWorkspace>(*dev_, hp_, max_tokens, n_ctx, n_threads, prefill_paths, moe_scratch,
                                              /*q8_paths=*/!opt_.exact);
    std::lock_guard<std::mutex> lock(mu_);  // the transfer module is used by one thread at a time (forward)
    Stream& cs = dev_->compute();
    xfer_->fill(ws->route_counter.span(), 0, cs, {&cs});  // ordered before every forward on compute
    if (ws->pred_counter.bytes() > 0) xfer_->fill(ws->pred_counter.span(), 0, cs, {&cs});
    if (ws->pred_slots.bytes() > 0) xfer_->fill(ws->pred_slots.span(), 0xFF, cs, {&cs});
    return ws;
  }
  ExpertCacheReport cache_report() const override {
    std::lock_guard<std::mutex> lock(mu_);
    ExpertCacheReport r = cache_report_locked(hp_.n_layer);
    r.stream_copy_us = decode_costs_.copy_us();
    r.stream_cpu_us = decode_costs_.cpu_us();
    return r;
  }
  void forward(const Batch& batch, Workspace& ws, float* logits, ThreadPool& pool,
               const ForwardOptions& opt) const override;
  // Decode passes replayed as one graph (every expert resident, graphs on, no expert prediction) may be
  // chained and left pending: nothing of theirs waits for the host (no CPU pool, no residency change).
  bool chains_decode(const Workspace& wsb, int32_t n_seqs) const override {
    const auto* ws = dynamic_cast<const CudaWorkspace*>(&wsb);
    if (ws == nullptr || n_seqs < 1 || n_seqs > ws->n_tok_max || n_seqs > kMaxGraphTokens ||
        n_seqs > kMaxDeferTokens || !graphs_ || predict::prefetch_mode() != 0)
      return false;
    std::lock_guard<std::mutex> lock(mu_);
    const strata::moe::Residency& res = cache_->residency();
    for (int il = 0; il < hp_.n_layer; ++il)
      if (res.resident_in_layer(il) != hp_.n_expert) return false;
    return true;
  }
  void finish_deferred(Workspace& wsb) const override {
    std::lock_guard<std::mutex> lock(mu_);
    dev_->make_current();
    auto& ws = static_cast<CudaWorkspace&>(wsb);
    cuda::finish_deferred(PoolCtx{*xfer_, dev_->compute(), *cache_, work_}, ws);
  }

 private:
  // One forward's compute-only section: the parameters every kernel launch of it depends on. launch =
  // false walks the same sequence for the stream-order checker's notes only (no kernel enqueued).
  struct Pass {
    CudaWorkspace& ws;
    int64_t n, n_out;  // tokens in the batch, rows that want logits
    int64_t kv_span;   // attention's max_kv (cuda/host/attn_span.h)
    cpu::AttnMath attn;
    bool launch;
    bool pool = false;  // the pass runs the CPU pool (some layer's experts are not all resident)
    int direct = 0;     // direct reads of non-resident experts (moe/direct_rule.h share; 0: none)
    // Every token of one sequence, in a pass too large for a graph (ops::attention's one_cache; why not
    // in graphs: their key does not hold it, and a graph replays for any batch of its size).
    bool one_cache = false;
    Pass notes_only() const {  // the same pass with launch off: ops only take their stream-order notes
      Pass q = *this;
      q.launch = false;
      return q;
    }
    template <typename T>
    T* step(size_t offset) const {  // a field of ws.step_in (StepLayout(n))
      return reinterpret_cast<T*>(static_cast<char*>(ws.step_in.data()) + offset);
    }
    int32_t* ids(int il) const;  // layer il's [n][k] in ws.ids
  };
  template <typename F>
  void op(const Pass& p, F&& f) const {
    if (!p.launch) return;
    f();
    ++work_.op_calls;
  }
  // The pieces of a forward pass, all on the compute stream, no copies (so they can be captured).
  void embed(const Pass& p) const;
  void attention_block(const Pass& p, int il) const;
  void route(const Pass& p, int il) const;        // ffn rmsnorm, router, top-k -> ids(il), ws.wts
  // resident experts from their slots -> ws.moe_out (or x); with `row` (a streaming pass's own table row
  // in ws.stage_row, host copy ws.stage_row_h) also the experts staged for this pass.
  void gpu_experts(const Pass& p, int il, bool staged_row = false) const;
  // Streaming (docs/expert_cache.md), after the layer's routing is on the host (ws.ids_cpu = the CPU
  // pool's pairs): copies non-resident experts, busiest first, into staging slots, runs them on the GPU
  // (+ their add into x) and takes their pairs off ws.ids_cpu. Returns the pairs moved to the GPU;
  // *cpu_experts = the distinct experts left to the CPU pool.
  //   prefill: the experts with >= stream_min_tokens_ pairs; the resident ones run in the same launches.
  //   decode: as many as moe::decode_stream_count says; the resident ones already ran (staged row only).
  int64_t stream_experts(const Pass& p, int il, int n_res, bool decode, int* cpu_experts) const;
  void add_moe_out(const Pass& p, int il) const;  // x += ws.moe_out (nothing where gpu_experts added to x)
  void output(const Pass& p) const;               // rows that want logits -> ws.logits
  void compute_resident(const Pass& p) const;     // all of the above for a pass without the CPU pool
  void run_graph(const Pass& p) const;            // compute_resident as a (cached) CUDA graph
  // body(p) as a cached CUDA graph keyed by `segment` (a piece of a CPU-pool pass between its transfers),
  // or called directly when graphs are off or the pass is too large.
  void run_segment(const Pass& p, int segment, const std::function<void(const Pass&)>& body) const;
  void drop_stale_graphs(CudaWorkspace& ws) const;  // the workspace's graphs if made for other buffers
  // The key of pass p's graph (what a capture bakes in besides the buffers: see forward()) for a segment
  // (0: the whole pass, 1 + s: segment s, kGatedSegment) and a gated pass's layer kinds.
  static CudaWorkspace::GraphKey graph_key(const Pass& p, int segment, std::vector<uint8_t> layers = {}) {
    return {p.n, p.n_out, p.kv_span, int(p.attn), attn_tile::prefill_mma(), quant::generic_only(), segment,
            std::move(layers)};
  }
  // Gated passes (docs/gpu.md): a decode-sized CPU-pool pass enqueued whole as one cached graph; the host
  // waits for each CPU-pool layer's signal, runs its pairs, and opens its gate (ws.gates).
  //   gated_piece: piece k of the pass over its CPU-pool layers pl (ascending): piece 0 starts with the
  //     embedding; piece k > 0 with the gated add of pool layer pl[k-1]'s partial into x.
  //     Then the layers up to pl[k] (exclusive) on the GPU alone, and pool layer pl[k]'s attention,
  //     routing, signaled download and resident experts; the last piece ends with the output instead.
  //     With p.launch it enqueues (inside the capture); without, it gives the notes and counts of the
  //     piece where the host releases it.
  void gated_piece(const Pass& p, const PoolCtx& pc, const std::vector<uint8_t>& kinds, const std::vector<int>& pl,
                   size_t k) const;
  void forward_gated(const Pass& p, const PoolCtx& pc, ThreadPool& pool, const ForwardOptions& opt) const;

  void load();
  // Layer l's q8::fold_router weight where the fast decode can use it (else empty), through wo_f32 (the
  // dequantized wo, allocated on first use). After l's wo, ffn_norm and router are uploaded.
  DevWeight fold_router(const Layer& l, DeviceBuffer& wo_f32, const std::string& name);
  // Layer l's expert predictor weight (predict::build_weight) where the fast decode can use it, else empty.
  // After l's router and ffn_norm are uploaded.
  DevWeight predict_router(const Layer& l, const std::string& name);
  // The expert prefetch of layer il's one-token attention launch (predict::ExpertPrefetch; off: not on()).
  predict::ExpertPrefetch expert_prefetch(const Pass& p, int il) const;
  // One-token passes that predicted: every layer's predicted experts to the host (enqueued before
  // finish_forward's end-of-pass wait), then counted against the routing (work_.predicted, predict_hits).
  Ticket download_predictions(const Pass& p) const;
  void count_predictions(const Pass& p, Ticket& t) const;
  // The type of a matrix that only products read as the GPU keeps it (DevWeight::type): the file's bytes,
  // or a repack on the CPU (model_common.h product_type).
  GgmlType product_type(const Weight& w) const { return cuda::product_type(w.type, w.ne[0], opt_.exact); }
  DevWeight upload_matrix(const Weight& w, const std::string& name, RepackLog& log, Use use = Use::products) {
    return cuda::upload_matrix(*dev_, *xfer_, w, name, opt_.exact, log, use);
  }
  DevWeight upload_stacked(std::initializer_list<const Weight*> ws, const std::string& name, RepackLog& log) {
    return cuda::upload_stacked(*dev_, *xfer_, ws, name, opt_.exact, log, Use::products);
  }
  DevWeight upload_f32(const Weight& w, const std::string& name) {
    return cuda::upload_f32(*dev_, *xfer_, w, name);
  }
  // y [n][w.rows] = x [n][w.cols] . W^T on the compute stream.
  void mm(const Pass& p, const DevWeight& w, const DeviceBuffer& x, int64_t n, const DeviceBuffer& y,
          Site site = Site::here()) const {
    note_launch(dev_->compute(), {w.buf.span(), x.span()}, {y.span()}, site);
    // From kGemmMinTokens tokens (prefill) the product runs on cuBLAS over bf16 tiles when the workspace has
    // a GemmContext; decode (and graphs, which capture at most 8 tokens) stays on the f32 kernels.
    op(p, [&] {
      quant::matmul(w.type, w.buf.data(), w.rows, w.cols, x.as<const float>(), n, y.as<float>(), stream(),
                    p.ws.gemm.get());
    });
  }
  // y [n][w.rows] += W . x: one product that adds into y (quant::matmul's accumulate: the same float
  // addition as the product written apart plus an add; on the cuBLAS path its beta = 1).
  void mm_add(const Pass& p, const DevWeight& w, const DeviceBuffer& x, int64_t n, const DeviceBuffer& y,
              Site site = Site::here()) const {
    note_launch(dev_->compute(), {w.buf.span(), x.span(), y.span()}, {y.span()}, site);
    op(p, [&] {
      quant::matmul(w.type, w.buf.data(), w.rows, w.cols, x.as<const float>(), n, y.as<float>(), stream(),
                    p.ws.gemm.get(), /*accumulate=*/true);
    });
  }
  cudaStream_t stream() const { return dev_->compute().handle(); }

  // Fast decode with int8 activations, where the weight's type has a kernel (model_common.h says when).
  bool q8_decode(const Pass& p) const {
    return int8_activations(opt_.exact, p.pool, p.n, p.ws.xq.bytes() > 0);
  }
  bool use_q8(const Pass& p, const DevWeight& w) const { return q8_decode(p) && q8::use_type(w.type); }
  bool experts_grouped(const Pass& p, int il) const {
    return p.n >= moe::kMoeGroupedMinTokens && p.ws.moe_scratch.bytes() > 0 &&
           moe::moe_grouped_supported(cache_->layer_view(il));
  }
  // The resident experts of layer il run q8::moe_gate_up + q8::moe_down, which add into x themselves.
  bool experts_q8(const Pass& p, int il) const {
    return q8_decode(p) && !experts_grouped(p, il) && q8::use_moe(cache_->layer_view(il));
  }
  // Layer il's wo, router and gate_up go through the folded router (q8_kernels.cuh): one token, int8
  // activations for wo and the experts, the fold built at load, the router's fused kernel's conditions.
  bool folded_router(const Pass& p, int il) const {
    const Layer& l = layers_[size_t(il)];
    return p.n == 1 && l.router_fold.rows > 0 && use_q8(p, l.wo) && experts_q8(p, il) && p.ws.mid.bytes() > 0 &&
           l.fold_ss <= int64_t(p.ws.ss.bytes() / 4);
  }
  // ws.xn[0, rows) = rmsnorm(x) * w; with quantize also ws.xq/ws.xds = its Q8 activations (one launch).
  void norm(const Pass& p, const DeviceBuffer& x, const DevWeight& w, int64_t rows, bool quantize,
            Site site = Site::here()) const {
    CudaWorkspace& ws = p.ws;
    const int64_t E = hp_.n_embd;
    if (quantize) {
      note_launch(dev_->compute(), {x.span(), w.buf.span()}, {ws.xn.span(), ws.xq.span(), ws.xds.span()}, site);
      op(p, [&] {
        q8::rmsnorm_quantize(x.as<const float>(), w.f32(), rows, E, hp_.rms_eps, ws.xn.as<float>(), ws.xq.as<int8_t>(),
                             ws.xds.as<float2>(), stream());
      });
    } else {
      note_launch(dev_->compute(), {x.span(), w.buf.span()}, {ws.xn.span()}, site);
      op(p, [&] { ops::rmsnorm(x.as<const float>(), w.f32(), rows, E, hp_.rms_eps, ws.xn.as<float>(), stream()); });
    }
  }
  // y [n][w.rows] (+)= W . x with x given as ws.xq/ws.xds ([n][w.cols] Q8 activations).
  void mm_q8(const Pass& p, const DevWeight& w, int64_t n, const DeviceBuffer& y, bool accumulate,
             Site site = Site::here()) const {
    CudaWorkspace& ws = p.ws;
    if (accumulate)
      note_launch(dev_->compute(), {w.buf.span(), ws.xq.span(), ws.xds.span(), y.span()}, {y.span()}, site);
    else
      note_launch(dev_->compute(), {w.buf.span(), ws.xq.span(), ws.xds.span()}, {y.span()}, site);
    op(p, [&] {
      q8::matvec(w.type, w.buf.data(), w.rows, w.cols, int64_t(row_bytes(w.type, w.cols)), ws.xq.as<const int8_t>(),
                 ws.xds.as<const float2>(), n, y.as<float>(), accumulate, stream());
    });
  }
  // y = W . xn, through the Q8 activations when use_q8 (they must hold xn's).
  void mm_any(const Pass& p, const DevWeight& w, int64_t n, const DeviceBuffer& y, Site site = Site::here()) const {
    if (use_q8(p, w))
      mm_q8(p, w, n, y, false, site);
    else
      mm(p, w, p.ws.xn, n, y, site);
  }

  DevWeight tok_embd_;     // [n_vocab][n_embd]
  DevWeight output_norm_;  // [n_embd] f32
  DevWeight output_;       // [n_vocab][n_embd]; empty when tied (out_w_ = &tok_embd_)
  const DevWeight* out_w_ = nullptr;
  std::vector<Layer> layers_;
  int stream_min_tokens_ = 4;   // STRATA_CUDA_STREAM_MIN_TOKENS: pairs an expert needs to be streamed
  strata::moe::DecodeStreamMode decode_stream_;         // CudaOptions::decode_stream
  int direct_share_ = 0;  // CudaOptions::decode_direct (moe/direct_rule.h), 0 where it cannot run
  mutable strata::moe::DecodeStreamCosts decode_costs_;  // copy cost measured at load, CPU cost averaged
  strata::moe::PrefillStreamMode prefill_stream_;        // CudaOptions::prefill_stream
  mutable strata::moe::PrefillStreamCosts prefill_costs_;  // as decode_costs_, the CPU cost per pair
};

int32_t* CudaQwen3Moe::Pass::ids(int il) const {
  return ws.ids.as<int32_t>() + size_t(il) * size_t(n) * size_t(ws.k_used);
}

void CudaQwen3Moe::load() {
  HParams& hp = hp_;
  check_moe_hparams_and_vocab(hp, file_);
  STRATA_REQUIRE(hp.n_expert <= cpu::kMaxExperts && hp.n_expert_used <= 64,
                 "{}: {} experts ({} used) is more than the GPU router handles ({}, 64)", file_.path(),
                 hp.n_expert, hp.n_expert_used, cpu::kMaxExperts);
  const int count = device_count();
  STRATA_REQUIRE(count > 0, "--backend cuda: no CUDA GPU found (no driver or no device); use --backend cpu");
  STRATA_REQUIRE(opt_.gpu >= 0 && opt_.gpu < count, "--gpu {}: this machine has {} GPU(s) (0..{})", opt_.gpu,
                 count, count - 1);
  dev_ = std::make_unique<Device>(opt_.gpu);
  dev_->make_current();
  xfer_ = std::make_unique<Transfer>(*dev_);

  const int64_t E = hp.n_embd, V = hp.n_vocab, D = hp.head_dim, Dv = hp.head_dim_v;
  const int64_t H = hp.n_head, Hkv = hp.n_head_kv, X = hp.n_expert, F = hp.n_ff_exp;
  WeightLoader L(file_);
  RepackLog log;
  const size_t free0 = dev_->free_bytes();
  tok_embd_ = upload_matrix(L.matrix("token_embd.weight", {E, V}), "token_embd", log, Use::any);  // (get_rows)
  output_norm_ = upload_f32(L.f32("output_norm.weight", {E}), "output_norm");
  const Weight out = L.optional_matrix("output.weight", {E, V});
  if (out) {
    output_ = upload_matrix(out, "output", log);
    out_w_ = &output_;
  } else {
    out_w_ = &tok_embd_;  // tied embeddings
  }
  layers_.resize(size_t(hp.n_layer));
  std::vector<LayerExperts> lexp(size_t(hp.n_layer));
  DeviceBuffer wo_f32;  // fold_router's dequantized wo, reused by every layer; freed before the cache sizes
  for (int il = 0; il < hp.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    Layer& l = layers_[size_t(il)];
    l.attn_norm = upload_f32(L.f32(p + "attn_norm.weight", {E}), p + "attn_norm");
    const Weight wq = L.matrix(p + "attn_q.weight", {E, H * D}), wk = L.matrix(p + "attn_k.weight", {E, Hkv * D}),
                 wv = L.matrix(p + "attn_v.weight", {E, Hkv * Dv});
    // One product for q, k and v when their rows can share a matrix (same kept type; the widths are all
    // n_embd): one launch instead of three. The exact mode's F32 kernel computes each row on its own
    // warp, so its values are those of the three products.
    if (product_type(wq) == product_type(wk) && product_type(wq) == product_type(wv)) {
      l.wqkv = upload_stacked({&wq, &wk, &wv}, p + "attn_qkv", log);
    } else if (product_type(wq) == product_type(wk) && qk_stack()) {
      l.wqk = upload_stacked({&wq, &wk}, p + "attn_qk", log);
      l.wv = upload_matrix(wv, p + "attn_v", log);
    } else if (product_type(wk) == product_type(wv)) {
      l.wq = upload_matrix(wq, p + "attn_q", log);
      l.wkv = upload_stacked({&wk, &wv}, p + "attn_kv", log);
    } else {
      l.wq = upload_matrix(wq, p + "attn_q", log);
      l.wk = upload_matrix(wk, p + "attn_k", log);
      l.wv = upload_matrix(wv, p + "attn_v", log);
    }
    l.q_norm = upload_f32(L.f32(p + "attn_q_norm.weight", {D}), p + "attn_q_norm");
    l.k_norm = upload_f32(L.f32(p + "attn_k_norm.weight", {D}), p + "attn_k_norm");
    l.wo = upload_matrix(L.matrix(p + "attn_output.weight", {H * Dv, E}), p + "attn_output", log);
    l.ffn_norm = upload_f32(L.f32(p + "ffn_norm.weight", {E}), p + "ffn_norm");
    l.router = upload_matrix(L.matrix(p + "ffn_gate_inp.weight", {E, X}), p + "ffn_gate_inp", log, Use::any);
    l.router_fold = fold_router(l, wo_f32, p + "ffn_gate_inp_fold");
    l.router_pred = predict_router(l, p + "ffn_gate_inp_pred");
    if (l.router_fold.rows > 0)
      l.fold_ss = q8::wo_router_ss_count(l.wo.type, E, l.wo.cols, int64_t(row_bytes(l.wo.type, l.wo.cols)));
    l.experts.gate = L.matrix(p + "ffn_gate_exps.weight", {E, F, X});
    l.experts.up = L.matrix(p + "ffn_up_exps.weight", {E, F, X});
    l.experts.down = L.matrix(p + "ffn_down_exps.weight", {F, E, X});
    lexp[size_t(il)] = {{l.experts.gate.type, l.experts.gate.data},
                        {l.experts.up.type, l.experts.up.data},
                        {l.experts.down.type, l.experts.down.data}};
  }
  for (const auto& t : file_.tensors()) weight_bytes_ += t.nbytes;
  dev_->compute().synchronize();  // the folds are done with wo_f32
  wo_f32 = DeviceBuffer();
  const size_t free1 = dev_->free_bytes();
  const int64_t dense_bytes = int64_t(free0) - int64_t(free1);
  print_dense_repacks(log, opt_.exact);

  // --- the expert cache (cache_setup.h) ---
  MadeCache made = make_expert_cache(
      *dev_, *xfer_, opt_,
      {.n_layer = hp.n_layer, .n_expert = hp.n_expert, .n_embd = E, .n_ff = F, .layers = std::move(lexp),
       .kv_bytes = int64_t(std::max(opt_.kv_sequences, 1)) * hp.n_layer * int64_t(std::max(opt_.n_ctx, 1)) * Hkv *
                   (D + Dv) * 2,
       .ws_bytes = WsSizes(hp, std::max(opt_.n_batch, 1), std::max(opt_.n_ctx, 1)).device_bytes(hp.n_layer),
       .dense_bytes = dense_bytes, .free_bytes = free1, .model = "", .kv_what = "KV"});
  cache_ = std::move(made.cache);
  stream_min_tokens_ = made.stream_min_pairs;
  prefill_stream_ = made.prefill_stream;
  prefill_costs_ = strata::moe::PrefillStreamCosts(made.copy_us);
  decode_stream_ = made.decode_stream;
  direct_share_ = made.direct_share;
  if (cache_->n_stage() > 0 && decode_stream_.kind != strata::moe::DecodeStreamMode::Off) {
    decode_costs_ = strata::moe::DecodeStreamCosts(made.copy_us);
    std::fprintf(stderr,
                 "strata: cuda: decode streaming %s: smaller passes copy part of each layer's non-resident experts "
                 "(copy %.1f us per expert, %.1f GB/s) while the CPU pool runs the rest\n",
                 decode_stream_.str().c_str(), decode_costs_.copy_us(),
                 decode_costs_.copy_us() > 0 ? double(cache_->slot_bytes()) / decode_costs_.copy_us() / 1e3 : 0.0);
  }
  dev_->compute().synchronize();  // weights and first slots in place before the first forward
  work_ = HostWork::starting_now(*xfer_);
}

Ticket CudaQwen3Moe::download_predictions(const Pass& p) const {
  CudaWorkspace& ws = p.ws;
  bool any = false;
  for (int il = 0; il < hp_.n_layer && ws.pred_ids.bytes() > 0; ++il) {
    ws.pred_layers[size_t(il)] = expert_prefetch(p, il).on() ? 1 : 0;
    any = any || ws.pred_layers[size_t(il)] != 0;
  }
  if (!any) return Ticket();
  ++work_.transfers;
  return xfer_->download(ws.pred_ids_h.span(), ws.pred_ids.span(), dev_->compute());
}

void CudaQwen3Moe::count_predictions(const Pass& p, Ticket& t) const {
  if (!t.valid()) return;
  t.wait();
  CudaWorkspace& ws = p.ws;
  ws.pred_ids_h.note_host_access(strata::stream_check::Access::Read);
  ws.ids_h.note_host_access(strata::stream_check::Access::Read);
  const int k = hp_.n_expert_used;
  const int32_t* pred = ws.pred_ids_h.as<const int32_t>();
  const int32_t* ids = ws.ids_h.as<const int32_t>();  // [n_layer][1][k]: every layer's routing (finish_forward)
  for (int il = 0; il < hp_.n_layer; ++il) {
    if (!ws.pred_layers[size_t(il)]) continue;
    for (int a = 0; a < k; ++a)
      for (int b = 0; b < k; ++b) work_.predict_hits += ids[il * k + a] == pred[il * k + b] ? 1 : 0;
    work_.predicted += uint64_t(k);
  }
}

predict::ExpertPrefetch CudaQwen3Moe::expert_prefetch(const Pass& p, int il) const {
  const Layer& l = layers_[size_t(il)];
  predict::ExpertPrefetch pf;
  const int mode = predict::prefetch_mode();
  if (l.router_pred.rows == 0 || mode == 0 || p.n != 1 || p.ws.pred_counter.bytes() == 0 || !experts_q8(p, il))
    return pf;
  const moe::ExpertLayerView v = cache_->layer_view(il);
  const int64_t gate = int64_t(row_bytes(v.gate_type, uint64_t(v.n_embd))) * v.n_ff;
  const int64_t up = int64_t(row_bytes(v.up_type, uint64_t(v.n_embd))) * v.n_ff;
  const int64_t down = int64_t(row_bytes(v.down_type, uint64_t(v.n_ff))) * v.n_embd;
  const int64_t off[3] = {v.gate_off, v.up_off, v.down_off}, bytes[3] = {gate, up, down};
  const int n_ranges = mode == 4 ? 0 : mode == 2 ? 3 : 2;  // (4: gate_up's blocks prefetch, from pred_slots)
  for (int r = 0; r < n_ranges; ++r)  // (a slot layout whose ranges are not 16-byte aligned: no prefetch)
    if (off[r] % 16 != 0 || bytes[r] % 16 != 0 || v.slot_bytes % 16 != 0) return pf;
  pf.w = l.router_pred.buf.as<const uint16_t>();
  pf.x = p.ws.x.as<const float>();
  pf.n_embd = int(hp_.n_embd);
  pf.n_expert = hp_.n_expert;
  pf.k = hp_.n_expert_used;
  pf.logits = p.ws.pred_logits.as<float>();
  pf.counter = p.ws.pred_counter.as<uint32_t>();
  pf.blocks = predict::prefetch_blocks();
  pf.table = cache_->device_layer_row(il);
  pf.slots = v.slots;
  pf.slot_bytes = v.slot_bytes;
  for (int r = 0; r < n_ranges; ++r) pf.off[r] = off[r], pf.bytes[r] = bytes[r];
  pf.n_ranges = n_ranges;
  pf.ids = p.ws.pred_ids.as<int32_t>() + int64_t(il) * hp_.n_expert_used;
  pf.lines = mode == 3;
  if (mode == 4) pf.slots_out = p.ws.pred_slots.as<int32_t>() + int64_t(il) * hp_.n_expert_used;
  return pf;
}

DevWeight CudaQwen3Moe::predict_router(const Layer& l, const std::string& name) {
  const HParams& hp = hp_;
  DevWeight w;
  if (opt_.exact || !q8::enabled() || predict::prefetch_mode() == 0 || l.router.type != GgmlType::F32 ||
      !predict::supported(hp.n_expert, hp.n_embd, hp.n_expert_used))
    return w;
  w.type = GgmlType::BF16;
  w.rows = hp.n_expert;
  w.cols = hp.n_embd;
  w.buf = dev_->alloc(size_t(w.rows * w.cols) * 2, name);
  Stream& cs = dev_->compute();
  note_launch(cs, {l.router.buf.span(), l.ffn_norm.buf.span()}, {w.buf.span()});
  predict::build_weight(l.router.f32(), l.ffn_norm.f32(), hp.n_expert, hp.n_embd, w.buf.as<uint16_t>(), cs.handle());
  return w;
}

DevWeight CudaQwen3Moe::fold_router(const Layer& l, DeviceBuffer& wo_f32, const std::string& name) {
  const HParams& hp = hp_;
  const int64_t E = hp.n_embd, A = l.wo.cols;
  DevWeight fold;
  if (opt_.exact || !q8::enabled() || !q8::folded_router_enabled() || l.router.type != GgmlType::F32 ||
      l.wo.rows != E || !q8::use_type(l.wo.type) || !q8::wo_router_supported(l.wo.type, E, A, hp.n_expert) ||
      !quant::has_kernel(l.wo.type))
    return fold;
  if (wo_f32.bytes() == 0) wo_f32 = dev_->alloc(size_t(E * A) * 4, "fold_router.wo_f32");
  fold.type = GgmlType::F32;
  fold.rows = hp.n_expert;
  fold.cols = E + A;
  fold.buf = dev_->alloc(size_t(fold.rows * fold.cols) * 4, name);
  Stream& cs = dev_->compute();
  note_launch(cs, {l.wo.buf.span()}, {wo_f32.span()});
  quant::dequantize(l.wo.type, l.wo.buf.data(), E * A, wo_f32.as<float>(), cs.handle());
  note_launch(cs, {l.router.buf.span(), l.ffn_norm.buf.span(), wo_f32.span()}, {fold.buf.span()});
  q8::fold_router(l.router.f32(), l.ffn_norm.f32(), wo_f32.as<const float>(), hp.n_expert, E, A, fold.buf.as<float>(),
                  cs.handle());
  return fold;
}

void CudaQwen3Moe::embed(const Pass& p) const {
  const StepLayout sl(p.n);
  note_launch(dev_->compute(), {tok_embd_.buf.span(), p.ws.step_in.span()}, {p.ws.x.span()});
  op(p, [&] {
    quant::get_rows(tok_embd_.type, tok_embd_.buf.data(), hp_.n_embd, p.step<const int32_t>(sl.tokens), p.n,
                    p.ws.x.as<float>(), stream());
  });
  // The rope angles of the batch, read by every layer's attn_prep.
  note_launch(dev_->compute(), {p.ws.step_in.span()}, {p.ws.rope_cs.span()});
  op(p, [&] {
    ops::rope_cos_sin(p.step<const int32_t>(sl.pos), p.n, hp_.n_rot, hp_.rope_base, p.ws.rope_cs.as<float>(),
                      stream());
  });
}

void CudaQwen3Moe::attention_block(const Pass& p, int il) const {
  const HParams& hp = hp_;
  const Layer& l = layers_[size_t(il)];
  CudaWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  const cudaStream_t s = stream();
  const int64_t n = p.n, H = hp.n_head, Hkv = hp.n_head_kv, D = hp.head_dim, Dv = hp.head_dim_v;
  const StepLayout sl(n);
  const auto* refs = p.step<const ops::KvRef>(sl.refs);
  float* q = ws.q.as<float>();
  // attn_norm -> xn, and its Q8 activations where a q/k/v product takes them; with one q|k|v product on
  // them in decode, the norm runs inside that product's launch (q8::norm_matvec: one launch fewer); with
  // q|k and v, inside each of their two launches (each norms x itself: with the early norm the first
  // writes no Q8 activations the second could read).
  bool q8_in = false;
  for (const DevWeight* w : {&l.wqkv, &l.wqk, &l.wq, &l.wkv, &l.wk, &l.wv}) q8_in |= w->rows > 0 && use_q8(p, *w);
  const auto takes_norm = [&](const DevWeight& w) {
    return w.rows > 0 && use_q8(p, w) && q8::norm_matvec_takes(w.type) && q8::norm_matvec_enabled() &&
           q8::norm_matvec_supported(hp.n_embd, n);
  };
  const bool norm_in_qkv = takes_norm(l.wqkv) || (takes_norm(l.wqk) && takes_norm(l.wv));
  if (!norm_in_qkv) norm(p, ws.x, l.attn_norm, n, q8_in);
  // y = w . rmsnorm(x) in one launch (norm_in_qkv).
  const auto norm_product = [&](const DevWeight& w, const DeviceBuffer& y) {
    note_launch(cs, {ws.x.span(), l.attn_norm.buf.span(), w.buf.span()},
                {ws.xn.span(), ws.xq.span(), ws.xds.span(), y.span()});
    op(p, [&] {
      const pdl::PlainLaunches late(pdl::launch_late("qkv"));
      q8::norm_matvec(w.type, w.buf.data(), w.rows, w.cols, int64_t(row_bytes(w.type, w.cols)), ws.x.as<const float>(),
                      l.attn_norm.f32(), hp.rms_eps, n, ws.xn.as<float>(), ws.xq.as<int8_t>(), ws.xds.as<float2>(),
                      y.as<float>(), /*accumulate=*/false, s);
    });
  };
  // q, k, v: one product into qkv's rows, or q|k (into qkv) and v, or q and k|v (into qkv), or three into
  // q, k, v.
  const float *qi, *ki, *vi;
  int64_t q_ld, k_ld, v_ld;
  const DeviceBuffer* qkv_in[3];
  if (l.wqkv.rows > 0) {
    if (norm_in_qkv) norm_product(l.wqkv, ws.qkv);
    else mm_any(p, l.wqkv, n, ws.qkv);
    qi = ws.qkv.as<const float>();
    ki = qi + H * D;
    vi = ki + Hkv * D;
    q_ld = k_ld = v_ld = l.wqkv.rows;
    qkv_in[0] = qkv_in[1] = qkv_in[2] = &ws.qkv;
  } else if (l.wqk.rows > 0) {
    if (norm_in_qkv) {
      norm_product(l.wqk, ws.qkv);
      norm_product(l.wv, ws.v);
    } else {
      mm_any(p, l.wqk, n, ws.qkv);
      mm_any(p, l.wv, n, ws.v);
    }
    qi = ws.qkv.as<const float>();
    ki = qi + H * D;
    vi = ws.v.as<const float>();
    q_ld = k_ld = l.wqk.rows;
    v_ld = Hkv * Dv;
    qkv_in[0] = qkv_in[1] = &ws.qkv;
    qkv_in[2] = &ws.v;
  } else if (l.wkv.rows > 0) {
    mm_any(p, l.wq, n, ws.q);
    mm_any(p, l.wkv, n, ws.qkv);
    qi = q;
    ki = ws.qkv.as<const float>();
    vi = ki + Hkv * D;
    q_ld = H * D;
    k_ld = v_ld = l.wkv.rows;
    qkv_in[0] = &ws.q;
    qkv_in[1] = qkv_in[2] = &ws.qkv;
  } else {
    mm_any(p, l.wq, n, ws.q);
    mm_any(p, l.wk, n, ws.k);
    mm_any(p, l.wv, n, ws.v);
    qi = q;
    ki = ws.k.as<const float>();
    vi = ws.v.as<const float>();
    q_ld = H * D;
    k_ld = Hkv * D;
    v_ld = Hkv * Dv;
    qkv_in[0] = &ws.q;
    qkv_in[1] = &ws.k;
    qkv_in[2] = &ws.v;
  }
  const ops::AttnPrepShape shape{int(H), int(Hkv), int(D), int(Dv), hp.n_rot, hp.rms_eps};
  const ops::AttnPrepIn prep_in{qi, q_ld, ki, k_ld, vi, v_ld, l.q_norm.f32(), l.k_norm.f32(),
                                ws.rope_cs.as<const float>()};
  const std::initializer_list<DevSpan> prep_reads{qkv_in[0]->span(), qkv_in[1]->span(), qkv_in[2]->span(),
                                                     ws.rope_cs.span(), ws.step_in.span(), l.q_norm.buf.span(),
                                                     l.k_norm.buf.span()};
  // Decode of one token: the attention kernel prepares its own heads (ops::prep_attention_q8: no attn_prep step).
  const bool prep_in_attention = use_q8(p, l.wo) && p.attn == cpu::AttnMath::F32 && ops::attention_q8_fused() &&
                                 ops::prep_attention_enabled() && ops::prep_attention_supported(n, shape);
  if (!prep_in_attention) {
    // q_norm, k_norm, rope of q and k, K/V into the cache, in one launch (ops_fused.cuh).
    note_launch(cs, prep_reads, {ws.q.span()});
    op(p, [&] {
      ops::attn_prep(qi, q_ld, ki, k_ld, vi, v_ld, l.q_norm.f32(), l.k_norm.f32(), ws.rope_cs.as<const float>(),
                     refs, n, il, shape, q, s);
    });
  }
  // The split count of the F32 kernel depends on (n, n_head, kv_span) only (ops.cu attn_splits), and the
  // graphs are keyed by kv_span: what a graph bakes in holds at every step it is replayed for.
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (use_q8(p, l.wo)) {
    // x += wo . att: att also as Q8 activations (by the attention's combine kernel when it runs: ops_fused.cuh),
    // the product adds into x (no separate add).
    if (prep_in_attention) {
      note_launch(cs, prep_reads, {ws.att.span(), ws.attn_scratch.span(), ws.xq.span(), ws.xds.span()});
      const predict::ExpertPrefetch pf = expert_prefetch(p, il);
      if (pf.on()) {
        note_launch(cs, {ws.x.span(), l.router_pred.buf.span()},
                    {ws.pred_counter.span(), ws.pred_logits.span(), ws.pred_ids.span(), ws.pred_slots.span()});
        cache_->note_expert_reads(cs, il);  // (its table row; the slots are only asked into L2)
      }
      op(p, [&] {
        ops::prep_attention_q8(prep_in, shape, refs, il, scale, p.kv_span, ws.attn_scratch.as<float>(),
                               ws.att.as<float>(), ws.xq.as<int8_t>(), ws.xds.as<float2>(), s,
                               pf.on() ? &pf : nullptr);
      });
    } else {
      note_launch(cs, {ws.step_in.span(), ws.q.span()},
                  {ws.att.span(), ws.attn_scratch.span(), ws.xq.span(), ws.xds.span()});
      op(p, [&] {
        ops::attention_q8(q, refs, n, il, int(H), int(Hkv), int(D), int(Dv), scale, p.attn, p.kv_span,
                          ws.attn_scratch.as<float>(), ws.att.as<float>(), ws.xq.as<int8_t>(), ws.xds.as<float2>(),
                          s);
      });
    }
    const pdl::PlainLaunches late(pdl::launch_late("wo"));
    if (folded_router(p, il)) {
      // mid = x + wo . att, and the router's logits and h's partial sums beside it (q8_kernels.cuh).
      note_launch(cs, {l.wo.buf.span(), ws.xq.span(), ws.xds.span(), ws.att.span(), ws.x.span(), l.router_fold.buf.span()},
                  {ws.mid.span(), ws.router.span(), ws.ss.span()});
      op(p, [&] {
        q8::wo_router(l.wo.type, l.wo.buf.data(), hp.n_embd, l.wo.cols, int64_t(row_bytes(l.wo.type, l.wo.cols)),
                      ws.xq.as<const int8_t>(), ws.xds.as<const float2>(), ws.att.as<const float>(),
                      ws.x.as<const float>(), l.router_fold.f32(), hp.n_expert, ws.mid.as<float>(),
                      ws.router.as<float>(), ws.ss.as<float>(), s);
      });
    } else {
      mm_q8(p, l.wo, n, ws.x, /*accumulate=*/true);
    }
  } else {
    note_launch(cs, {ws.step_in.span(), ws.q.span()}, {ws.att.span(), ws.attn_scratch.span()});
    op(p, [&] {
      ops::attention(q, refs, n, il, int(H), int(Hkv), int(D), int(Dv), scale, p.attn, p.kv_span,
                     ws.attn_scratch.as<float>(), ws.att.as<float>(), s, p.one_cache);
    });
    mm_add(p, l.wo, ws.att, n, ws.x);  // x += wo . att
  }
}

void CudaQwen3Moe::route(const Pass& p, int il) const {
  const HParams& hp = hp_;
  const Layer& l = layers_[size_t(il)];
  CudaWorkspace& ws = p.ws;
  const int64_t n = p.n;
  if (folded_router(p, il)) return;  // wo_router ran the router's product; gate_up routes
  // ffn_norm -> xn (the router and the CPU pool read it), and its Q8 activations for the q8 experts.
  if (l.router.type == GgmlType::F32 && n <= ops::fused_router_max_tokens() && ops::norm_router_route_enabled() &&
      ops::norm_router_route_supported(hp.n_embd)) {
    // Decode: the norm, the router product and the top-k in one launch (same values as norm + router_route).
    const bool q8e = experts_q8(p, il);
    if (q8e)
      note_launch(dev_->compute(), {ws.x.span(), l.ffn_norm.buf.span(), l.router.buf.span(), ws.route_counter.span()},
                  {ws.xn.span(), ws.xq.span(), ws.xds.span(), ws.router.span(), ws.ids.span(), ws.wts.span(),
                   ws.route_counter.span()});
    else
      note_launch(dev_->compute(), {ws.x.span(), l.ffn_norm.buf.span(), l.router.buf.span(), ws.route_counter.span()},
                  {ws.xn.span(), ws.router.span(), ws.ids.span(), ws.wts.span(), ws.route_counter.span()});
    op(p, [&] {
      ops::norm_router_route(ws.x.as<const float>(), l.ffn_norm.f32(), hp.rms_eps, l.router.f32(), hp.n_expert,
                             hp.n_embd, n, hp.n_expert_used, hp.expert_weights_norm, ws.xn.as<float>(),
                             q8e ? ws.xq.as<int8_t>() : nullptr, q8e ? ws.xds.as<float2>() : nullptr,
                             ws.router.as<float>(), p.ids(il), ws.wts.as<float>(), ws.route_counter.as<uint32_t>(),
                             stream());
    });
    return;
  }
  norm(p, ws.x, l.ffn_norm, n, experts_q8(p, il));
  if (l.router.type == GgmlType::F32 && n <= ops::fused_router_max_tokens()) {
    // Decode: the router product and the top-k in one launch (same values as the two below).
    note_launch(dev_->compute(), {l.router.buf.span(), ws.xn.span(), ws.route_counter.span()},
                {ws.router.span(), ws.ids.span(), ws.wts.span(), ws.route_counter.span()});
    op(p, [&] {
      ops::router_route(l.router.f32(), hp.n_expert, hp.n_embd, ws.xn.as<const float>(), n, hp.n_expert_used,
                        hp.expert_weights_norm, ws.router.as<float>(), p.ids(il), ws.wts.as<float>(),
                        ws.route_counter.as<uint32_t>(), stream());
    });
    return;
  }
  mm(p, l.router, ws.xn, n, ws.router);
  note_launch(dev_->compute(), {ws.router.span()}, {ws.ids.span(), ws.wts.span()});
  op(p, [&] {
    ops::moe_route(ws.router.as<const float>(), n, hp.n_expert, hp.n_expert_used, hp.expert_weights_norm,
                   p.ids(il), ws.wts.as<float>(), stream());
  });
}

void CudaQwen3Moe::gpu_experts(const Pass& p, int il, bool staged_row) const {
  CudaWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  if (staged_row)
    cache_->note_row_reads(cs, ws.stage_row.span(), ws.stage_row_h.data());  // the row and every slot it names
  else
    cache_->note_expert_reads(cs, il);  // the table and every slot the layer's row points to
  // Kernel arguments: the slots' base pointer and layout (fixed for the cache's lifetime) and this layer's
  // row of the device table (a fixed address); which slot holds an expert is read from the table when
  // the kernel runs. See forward() for why a graph of these launches survives residency changes.
  // Direct pairs (p.direct) read the pinned host copy; only with the layer's own table row.
  const bool direct = p.direct > 0 && !staged_row;
  const int32_t* table = staged_row ? ws.stage_row.as<const int32_t>() : cache_->device_layer_row(il);
  const int k_used = hp_.n_expert_used;
  STRATA_REQUIRE(!direct || (!experts_q8(p, il) && !experts_grouped(p, il)),
                 "cuda: direct reads in a pass that runs its experts on the int8 or grouped kernels");
  const moe::ExpertLayerView view = experts_view(PoolCtx{*xfer_, cs, *cache_, work_}, il, direct ? p.direct : 0, p.n,
                                                 k_used, table, p.ids(il), p.launch);
  if (folded_router(p, il)) {
    // The folded router: gate_up's blocks route the token from wo_router's outputs (an extra column of
    // blocks writes the ids and weights), moe_down writes x = mid + the weighted sum.
    const Layer& l = layers_[size_t(il)];
    // (mode 4 of the expert predictor: the slots it wrote beside this layer's attention, from the cache's
    // table; only when gate_up reads that table's slots, not a streaming pass's staged row)
    const int32_t* pred_slots = nullptr;
    if (predict::prefetch_mode() == 4 && !staged_row && !direct && expert_prefetch(p, il).on()) {
      const moe::ExpertLayerView cached = cache_->layer_view(il);
      if (view.slots == cached.slots && view.slot_bytes == cached.slot_bytes)
        pred_slots = ws.pred_slots.as<const int32_t>() + int64_t(il) * k_used;
    }
    note_launch(cs, {ws.mid.span(), l.ffn_norm.buf.span(), ws.ss.span(), ws.router.span(),
                     pred_slots != nullptr ? ws.pred_slots.span() : DevSpan{}},  // (an empty span: not checked)
                {ws.hq.span(), ws.hds.span(), ws.ids.span(), ws.wts.span()});
    const q8::FoldedRoute route{.mid = ws.mid.as<const float>(),
                                .norm_w = l.ffn_norm.f32(),
                                .eps = hp_.rms_eps,
                                .ss = ws.ss.as<const float>(),
                                .n_ss = int(l.fold_ss),
                                .raw = ws.router.as<const float>(),
                                .n_expert = hp_.n_expert,
                                .norm = hp_.expert_weights_norm,
                                .ids = p.ids(il),
                                .wts = ws.wts.as<float>(),
                                .pred_slots = pred_slots};
    op(p, [&] {
      const pdl::PlainLaunches late(pdl::launch_late("gate_up"));
      q8::moe_gate_up_routed(view, table, route, k_used, ws.hq.as<int8_t>(), ws.hds.as<float2>(), stream());
    });
    note_launch(cs, {ws.hq.span(), ws.hds.span(), ws.ids.span(), ws.wts.span(), ws.mid.span()}, {ws.x.span()});
    op(p, [&] {
      const pdl::PlainLaunches late(pdl::launch_late("down"));
      // (no prefetch: gate_up writes the ids this launch would read before its wait)
      q8::moe_down(view, table, ws.hq.as<const int8_t>(), ws.hds.as<const float2>(), p.ids(il),
                   ws.wts.as<const float>(), p.n, k_used, ws.x.as<float>(), stream(), /*after_gate_up=*/false,
                   ws.mid.as<const float>());
    });
    return;
  }
  if (experts_q8(p, il)) {
    // Decode with Q8 activations: h only as Q8 activations, and the weighted sum added into x by moe_down.
    note_launch(cs, {ws.xq.span(), ws.xds.span(), ws.ids.span()}, {ws.hq.span(), ws.hds.span()});
    op(p, [&] {
      const pdl::PlainLaunches late(pdl::launch_late("gate_up"));
      q8::moe_gate_up(view, table, ws.xq.as<const int8_t>(), ws.xds.as<const float2>(), p.ids(il), p.n, k_used,
                      ws.hq.as<int8_t>(), ws.hds.as<float2>(), stream());
    });
    note_launch(cs, {ws.hq.span(), ws.hds.span(), ws.ids.span(), ws.wts.span(), ws.x.span()}, {ws.x.span()});
    op(p, [&] {
      const pdl::PlainLaunches late(pdl::launch_late("down"));
      q8::moe_down(view, table, ws.hq.as<const int8_t>(), ws.hds.as<const float2>(), p.ids(il),
                   ws.wts.as<const float>(), p.n, k_used, ws.x.as<float>(), stream(), /*after_gate_up=*/true);
    });
    return;
  }
  // Prefill: tokens grouped by expert, each expert's weights read once per tile on the tensor cores
  // (measured 7-9x faster than per-pair products at 512 tokens on the H200); the weighted sum added into x.
  if (experts_grouped(p, il)) {
    note_launch(cs, {ws.xn.span(), ws.ids.span(), ws.wts.span(), ws.x.span()}, {ws.moe_scratch.span(), ws.x.span()});
    op(p, [&] {
      moe::moe_experts_grouped(view, table, hp_.n_expert, ws.xn.as<const float>(), p.ids(il),
                               ws.wts.as<const float>(), p.n, k_used, ws.x.as<float>(), ws.moe_scratch.data(),
                               ws.moe_scratch.bytes(), stream(), /*accumulate=*/true);
    });
    return;
  }
  note_launch(cs, {ws.xn.span(), ws.ids.span(), ws.wts.span()}, {ws.h.span(), ws.moe_out.span()});
  op(p, [&] { moe::moe_gate_up(view, table, ws.xn.as<const float>(), p.ids(il), p.n, k_used, ws.h.as<float>(), stream()); });
  op(p, [&] {
    moe::moe_down(view, table, ws.h.as<const float>(), p.ids(il), ws.wts.as<const float>(), p.n, k_used,
                  ws.moe_out.as<float>(), stream());
  });
}

void CudaQwen3Moe::add_moe_out(const Pass& p, int il) const {
  if (experts_q8(p, il) || experts_grouped(p, il)) return;  // q8::moe_down or the grouped combine added into x
  op(p, [&] { ops::add_inplace(p.ws.x.as<float>(), p.ws.moe_out.as<const float>(), p.n * hp_.n_embd, stream()); });
}

void CudaQwen3Moe::output(const Pass& p) const {
  if (p.n_out == 0) return;
  CudaWorkspace& ws = p.ws;
  const StepLayout sl(p.n);
  note_launch(dev_->compute(), {ws.x.span(), ws.step_in.span()}, {ws.xn.span()});
  op(p, [&] {
    quant::get_rows(GgmlType::F32, ws.x.data(), hp_.n_embd, p.step<const int32_t>(sl.rows), p.n_out,
                    ws.xn.as<float>(), stream());
  });
  const bool q8 = int8_output(opt_.exact, p.n, ws.xq.bytes() > 0) && q8::use_type(out_w_->type);
  norm(p, ws.xn, output_norm_, p.n_out, q8);  // in place
  if (q8)
    mm_q8(p, *out_w_, p.n_out, ws.logits, /*accumulate=*/false);
  else
    mm(p, *out_w_, ws.xn, p.n_out, ws.logits);
}

void CudaQwen3Moe::compute_resident(const Pass& p) const {
  embed(p);
  for (int il = 0; il < hp_.n_layer; ++il) {
    attention_block(p, il);
    route(p, il);
    gpu_experts(p, il);
    add_moe_out(p, il);
  }
  output(p);
}

// Why a captured graph stays valid, and what invalidates it. A graph bakes in every kernel argument of
// compute_resident() for one (n, n_out, attention math):
//  * the workspace's buffers (x, q, ..., logits, ids, step_in at StepLayout(n) offsets): the graphs live
//    in the workspace, so a new workspace starts with none;
//  * the model's weights: fixed after load(); a workspace used with another model drops its graphs
//    (model_id_);
//  * the expert cache's slot allocation and layer views (base pointer, slot size, types and offsets) and
//    the address of each layer's row of the device residency table: fixed for the cache's lifetime;
//    checked anyway (graphs_slots / graphs_table), so a cache that ever reallocates recaptures;
//  * scalars: n, n_out, the shapes and eps/rope constants of the model, and attention's max_kv =
//    Pass::kv_span (in the key; cuda/host/attn_span.h: a power of two from the pass's positions), from
//    which (with n and n_head) alone the F32 kernel's split count and chunk are derived (ops.cu
//    attn_splits); host-side kernel choices: the attention math (in the key) and attn_tile::prefill_mma(),
//    a process-wide switch that matters from 8 tokens on, and quant::generic_only() (benchmarks: fast dot
//    kernels off), both in the key too (graph_key builds it); the fast-dot choice otherwise depends on
//    n, the weights' and slots' alignment and types: fixed.
//    Which tokens of a tile share a cache is decided in the kernel from refs, not on the host.
// Everything that changes per step is read from device memory by the kernels: tokens, positions, the
// KvRef array (each sequence's K/V pointers, n_ctx, pos; attention's n_kv = pos + 1), the logit rows, and
// which slot holds each expert (the table's contents). So residency changes do not invalidate a graph:
// begin_step() admits/evicts by uploading the table with producer = consumer = compute and copies into a
// slot only with producer = compute, i.e. ordered before/after a graph launch on compute exactly like
// before/after direct launches; a replay reads the new table as a direct launch would. The graph path is
// taken only when every layer is fully resident this step (the CPU pool needs copies mid-pass, which a
// graph may not contain), and the kernels skip a non-resident pair whatever path launched them.
void CudaQwen3Moe::drop_stale_graphs(CudaWorkspace& ws) const {
  const void* slots = cache_->slots_span().ptr;
  const void* table = cache_->table_span().ptr;
  if (ws.graphs_model != model_id_ || ws.graphs_slots != slots || ws.graphs_table != table) {
    ws.graphs.clear();
    ws.graphs_model = model_id_;
    ws.graphs_slots = slots;
    ws.graphs_table = table;
  }
}

void CudaQwen3Moe::run_graph(const Pass& p) const {
  CudaWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  drop_stale_graphs(ws);
  const CudaWorkspace::GraphKey key = graph_key(p, 0);
  auto it = ws.graphs.find(key);
  if (it == ws.graphs.end()) {
    // The checker's notes are taken while capturing: the launch below follows them on the same stream.
    Graph g = Graph::capture(cs, [&] { compute_resident(p); });
    ++work_.captures;
    it = ws.graphs.emplace(key, std::move(g)).first;
  } else if (strata::stream_check::enabled()) {
    compute_resident(p.notes_only());  // the replayed launches' notes, no kernel
  }
  it->second.launch(cs);
  ++work_.graph_forwards;
}

// Why: a CPU-pool pass cannot be one graph (each layer waits for its routing on the host), so it launched
// ~11 kernels per layer one by one: ~100 us of host time per layer on the critical path (5 of the 21 ms
// of a token at 25% resident on the H200 box). Each piece between the pass's transfers (attention +
// routing; the resident experts) is captured once per (segment, n) and replayed: the same kernels, the
// same order, what run_graph argues for the whole pass holds for each piece.
void CudaQwen3Moe::run_segment(const Pass& p, int segment, const std::function<void(const Pass&)>& body) const {
  if (!graphs_ || p.n > kMaxGraphTokens) return body(p);
  CudaWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  drop_stale_graphs(ws);
  const CudaWorkspace::GraphKey key = graph_key(p, 1 + segment);
  auto it = ws.graphs.find(key);
  if (it == ws.graphs.end()) {
    Graph g = Graph::capture(cs, [&] { body(p); });
    ++work_.captures;
    it = ws.graphs.emplace(key, std::move(g)).first;
  } else if (strata::stream_check::enabled()) {
    body(p.notes_only());  // the replayed launches' notes, no kernel
  }
  it->second.launch(cs);
}

void CudaQwen3Moe::gated_piece(const Pass& p, const PoolCtx& pc, const std::vector<uint8_t>& kinds,
                               const std::vector<int>& pl, size_t k) const {
  CudaWorkspace& ws = p.ws;
  const int64_t E = hp_.n_embd;
  const GatedPiece g = gated_piece_layers(pl, k, hp_.n_layer);
  if (g.after < 0)
    embed(p);
  else
    pool_add_gated(pc, ws, ws.x, g.after, p.n, E, p.launch);  // x += the CPU's partial, once the gate opens
  for (int il = g.first; il < g.end; ++il) {  // every expert resident
    attention_block(p, il);
    route(p, il);
    gpu_experts(p, il);
    add_moe_out(p, il);
  }
  if (g.pool < 0) {
    output(p);
    return;
  }
  const int last = g.pool;
  attention_block(p, last);
  route(p, last);
  pool_download_signaled(pc, ws, ws.xn, last, p.n, E, p.launch);
  // The resident (and direct) pairs meanwhile (x += their sum; before the CPU's partial).
  if (kinds[size_t(last)] == 1 || p.direct > 0) {
    gpu_experts(p, last);
    add_moe_out(p, last);
  }
}

// Why: a CPU-pool pass made ~5 CUDA calls a layer (segment graphs, the pool's copies, the event wait),
// each on the critical path between the CPU pool's layers: ~1.5-2 ms of host time a token plus the
// launches' latency (H200 box, 48 layers at 25% resident, bench/results/2026-12-01-gpu-session7-h200.md).
// Gated, the whole pass is one graph launch; between two CPU-pool layers the host only polls a flag and
// sets one, and the GPU goes on as soon as the gate opens. Ordered by construction: the host reads a
// layer's routing and activations after its signal, which the GPU raises after writing them; the GPU
// reads the partial after the gate, which the host opens after writing it; the host rewrites partial_h
// and xn_h only after a later signal, raised after the kernels that read them. The same kernels run in
// the same order as the segmented pass, so the logits are the same bits.
void CudaQwen3Moe::forward_gated(const Pass& p, const PoolCtx& pc, ThreadPool& pool, const ForwardOptions& opt) const {
  CudaWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  std::vector<int> pl;
  const std::vector<uint8_t> kinds = gated_layer_kinds(cache_->residency(), hp_.n_layer, hp_.n_expert, &pl);
  drop_stale_graphs(ws);
  ws.gates->reset();  // no kernel of an earlier pass polls them: each pass ends with the stream drained
  CudaWorkspace::GraphKey key = graph_key(p, kGatedSegment, kinds);
  auto it = ws.graphs.find(key);
  if (it == ws.graphs.end()) {
    size_t gated = 0;
    for (const auto& [k, g] : ws.graphs) gated += k.segment == kGatedSegment;
    if (gated >= kMaxGatedGraphs)
      std::erase_if(ws.graphs, [](const auto& kv) { return kv.first.segment == kGatedSegment; });
    // The notes follow in run_gated_host, piece by piece, where the host releases each piece: in enqueue
    // order the checker would see the GPU read partial_h before the host wrote it.
    const strata::stream_check::PauseNotes quiet;
    Graph g = Graph::capture(cs, [&] {
      for (size_t k = 0; k <= pl.size(); ++k) gated_piece(p, pc, kinds, pl, k);
    });
    ++work_.captures;
    it = ws.graphs.emplace(std::move(key), std::move(g)).first;
  }
  it->second.launch(cs);
  ++work_.gated_forwards;
  const Pass release = p.notes_only();
  run_gated_host(pc, ws,
                 GatedHost{pl, p.n, hp_.n_embd, hp_.n_expert, p.direct,
                           [&](int il) -> const ExpertWeights& { return layers_[size_t(il)].experts; },
                           [&](size_t k) { gated_piece(release, pc, kinds, pl, k); }},
                 pool, opt.mode, opt.usage);
}

int64_t CudaQwen3Moe::stream_experts(const Pass& p, int il, int n_res, bool decode, int* cpu_experts) const {
  CudaWorkspace& ws = p.ws;
  const int X = hp_.n_expert;
  const int misses = stream_candidates(ws, p.n, X, decode ? 1 : stream_min_tokens_, cache_->n_stage());
  if (!decode && prefill_stream_.kind == strata::moe::PrefillStreamMode::Auto)
    balance_prefill_candidates(ws, X, prefill_costs_);
  if (decode) {
    const int keep = strata::moe::decode_stream_count(int(ws.stage_order.size()), decode_stream_, decode_costs_,
                                                      cache_->n_stage());
    ws.stage_order.resize(std::min(ws.stage_order.size(), size_t(std::max(keep, 0))));
  }
  *cpu_experts = misses - int(ws.stage_order.size());
  if (ws.stage_order.empty()) {  // nothing worth a copy: the resident experts as usual (decode: done)
    if (!decode && n_res > 0) {
      gpu_experts(p, il);
      add_moe_out(p, il);
    }
    return 0;
  }
  // The pass's row: the staged experts' staging slots, and for prefill the resident experts' slots.
  const int64_t moved = stage_experts(PoolCtx{*xfer_, dev_->compute(), *cache_, work_}, ws, il, p.n, X, !decode);
  gpu_experts(p, il, /*staged_row=*/true);
  add_moe_out(p, il);
  return moved;
}

void CudaQwen3Moe::forward(const Batch& batch, Workspace& wsb, float* logits, ThreadPool& pool,
                           const ForwardOptions& opt) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto t_start = std::chrono::steady_clock::now();
  dev_->make_current();
  auto& ws = static_cast<CudaWorkspace&>(wsb);
  const HParams& hp = hp_;
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  STRATA_REQUIRE(n >= 1 && n <= ws.n_tok_max, "forward: batch of {} tokens, workspace holds {}", n,
                 ws.n_tok_max);
  const int64_t E = hp.n_embd, V = hp.n_vocab;
  STRATA_REQUIRE(!opt.usage || (opt.usage->n_layer() == hp.n_layer && opt.usage->n_expert() == hp.n_expert &&
                                opt.usage->n_expert_used() == hp.n_expert_used),
                 "forward: expert-usage counter shaped for another model");
  STRATA_REQUIRE(!opt.chain || opt.sampling, "forward: a chained pass must pick on the device");
  const PoolCtx pc{*xfer_, dev_->compute(), *cache_, work_};
  // Passes left pending (ForwardOptions::defer) end first, unless this one chains to the latest of them.
  if (!opt.chain)
    while (!ws.deferred.empty()) cuda::finish_deferred(pc, ws);
  STRATA_REQUIRE(ws.deferred.size() < 2, "forward: two passes are pending (Model::finish_deferred)");
  const StepLayout sl(n);
  auto* refs_host = reinterpret_cast<ops::KvRef*>(ws.step_host.data() + sl.refs);
  auto* tok_host = reinterpret_cast<int32_t*>(ws.step_host.data() + sl.tokens);
  auto* pos_host = reinterpret_cast<int32_t*>(ws.step_host.data() + sl.pos);
  auto* rows_host = reinterpret_cast<int32_t*>(ws.step_host.data() + sl.rows);
  int64_t n_out = 0, n_kv = 1;  // n_kv: the most positions a token attends to
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& bt = batch.tokens[size_t(t)];
    STRATA_REQUIRE(bt.seq >= 0 && size_t(bt.seq) < batch.seqs.size(), "forward: bad sequence index");
    SequenceState& seq = *batch.seqs[size_t(bt.seq)];
    STRATA_REQUIRE(bt.pos >= 0 && bt.pos < seq.n_ctx() && bt.pos < ws.n_ctx_max,
                   "forward: position {} outside the context", bt.pos);
    n_kv = std::max<int64_t>(n_kv, int64_t(bt.pos) + 1);
    // (a chained pass's tokens are the previous pass's picks, copied on the device below)
    STRATA_REQUIRE(opt.chain || (bt.token >= 0 && bt.token < hp.n_vocab),
                   "token id {} is out of range: the vocabulary has {} tokens (0..{})", bt.token, hp.n_vocab,
                   hp.n_vocab - 1);
    auto* kv = dynamic_cast<DeviceKv*>(seq.backend_state());
    STRATA_REQUIRE(kv != nullptr, "forward: sequence {} was not made by this CUDA model", bt.seq);
    tok_host[t] = opt.chain ? 0 : bt.token;
    pos_host[t] = bt.pos;
    refs_host[t] = {kv->k.as<uint16_t>(), kv->v.as<uint16_t>(), seq.n_ctx(), bt.pos};
    if (bt.logits) rows_host[n_out++] = int32_t(t);
  }
  for (int64_t t = n_out; t < n; ++t) rows_host[t] = 0;  // unused entries: defined bytes
  check_logits_target(ws, logits, n_out, hp.n_vocab, opt.sampling);
  STRATA_REQUIRE(!opt.chain || n_out == n, "forward: every token of a chained pass picks ({} of {} do)", n_out, n);
  if (opt.chain) check_chain(ws, n);  // (before begin_forward: a refused pass starts no expert-cache step)
  Stream& cs = dev_->compute();
  const cudaStream_t s = stream();
  const strata::moe::Residency& res = cache_->residency();
  const pdl::PlainLaunches plain(n > kMaxGraphTokens);  // PDL for decode-sized passes only (pdl_scope.h)
  begin_forward(pc, ws, ws.step_in, ws.step_host.data(), sl.bytes);
  if (opt.chain) chain_tokens(pc, ws, head(ws.step_in, sl.bytes), sl.tokens, n);

  bool all_resident = true;
  for (int il = 0; il < hp.n_layer && all_resident; ++il) all_resident = res.resident_in_layer(il) == hp.n_expert;
  const bool decode_stream_on = n < moe::kMoeGroupedMinTokens && cache_->n_stage() > 0 &&
                                decode_stream_.kind != strata::moe::DecodeStreamMode::Off;
  // Direct reads in decode-sized CPU-pool passes without decode streaming (moe/direct_rule.h).
  const int direct = !all_resident && n < moe::kMoeGroupedMinTokens && !decode_stream_on ? direct_share_ : 0;
  const bool one_seq = std::all_of(batch.tokens.begin(), batch.tokens.end(),
                                   [&](const BatchToken& bt) { return bt.seq == batch.tokens[0].seq; });
  const Pass p{ws, n, n_out, pass_attention_span(n_kv, ws.n_ctx_max), opt.attn, true, !all_resident, direct,
               one_seq && n > kMaxGraphTokens};
  if (all_resident && graphs_ && n <= kMaxGraphTokens) {
    run_graph(p);
    // Why a pending end: the next (chained) pass is enqueued before the host takes this one's picks, so
    // the GPU goes from one pass to the next without the host's round trip in between.
    if (opt.defer && predict::prefetch_mode() == 0 && can_defer(ws, n, n_out, opt.sampling)) {
      finish_forward_deferred(pc, ws, n, V, *opt.sampling, opt.usage, t_start);
      return;
    }
  } else if (all_resident) {
    compute_resident(p);
  } else if (gated_ && n <= kMaxGraphTokens && !decode_stream_on && pool_fits_gated(ws, *xfer_, n, E)) {
    forward_gated(p, pc, pool, opt);
    Ticket predicted = download_predictions(p);
    finish_forward(pc, ws, n, n_out, V, logits, opt.sampling, opt.usage, t_start);
    count_predictions(p, predicted);
    ws.gates->check();  // the stream drained
    return;
  } else {
    embed(p);
    float* x = ws.x.as<float>();
    for (int il = 0; il < hp.n_layer; ++il) {
      const Layer& l = layers_[size_t(il)];
      run_segment(p, 2 * il, [&](const Pass& q) {
        attention_block(q, il);
        route(q, il);
      });
      // The resident pairs (x += their sum; before the CPU's partial, as without the pool).
      const auto resident_experts = [&](const Pass& q) {
        gpu_experts(q, il);
        add_moe_out(q, il);
      };
      const int n_res = res.resident_in_layer(il);
      if (n_res == hp.n_expert) {
        // Every expert of the layer is resident: all on the GPU. The ids go to the host with the other
        // layers' after the last layer (statistics, adaptation).
        run_segment(p, 2 * il + 1, resident_experts);
        continue;
      }
      // The CPU pool: routing and activations to the host; the GPU runs the resident pairs meanwhile.
      const PoolDownloads dl = pool_download(pc, ws, ws.xn, il, n, E);
      // Prefill-sized passes may stream the busiest non-resident experts to the GPU: then the GPU's
      // experts wait for the routing on the host (stream_experts); otherwise they run meanwhile, and a
      // decode-sized pass may then stream part of its misses (the rest run on the CPU pool meanwhile).
      const bool prefill_streaming = n >= moe::kMoeGroupedMinTokens && cache_->n_stage() > 0;
      const bool decode_streaming = !prefill_streaming && cache_->n_stage() > 0 &&
                                    decode_stream_.kind != strata::moe::DecodeStreamMode::Off;
      if (!prefill_streaming && (n_res > 0 || p.direct > 0)) run_segment(p, 2 * il + 1, resident_experts);
      int64_t n_cpu = pool_split(pc, ws, dl, il, n, hp.n_expert, opt.usage, p.direct);
      int cpu_experts = 0;
      if ((prefill_streaming || decode_streaming) && n_cpu > 0)
        n_cpu -= stream_experts(p, il, n_res, decode_streaming, &cpu_experts);
      else if (prefill_streaming && n_res > 0)
        run_segment(p, 2 * il + 1, resident_experts);
      if (n_cpu == 0) continue;  // every pair runs on the GPU
      const double pool_us = pool_compute(pc, ws, l.experts, n, E, pool, opt.mode);
      if (decode_streaming) decode_costs_.note_cpu(pool_us, cpu_experts);
      if (prefill_streaming) prefill_costs_.note_cpu(pool_us, n_cpu);
      note_launch(cs, {ws.partial.span()}, {ws.x.span()});
      op(p, [&] { ops::add_inplace(x, ws.partial.as<const float>(), n * E, s); });
    }
    output(p);
  }
  Ticket predicted = download_predictions(p);
  finish_forward(pc, ws, n, n_out, V, logits, opt.sampling, opt.usage, t_start);
  count_predictions(p, predicted);
}

}  // namespace

std::unique_ptr<Model> make_qwen3moe_cuda(gguf::File file, const CudaOptions& opt) {
  HParams hp = read_common_hparams(file);
  STRATA_REQUIRE(hp.arch == "qwen3moe", "{}: architecture '{}' is not qwen3moe", file.path(), hp.arch);
  return std::make_unique<CudaQwen3Moe>(std::move(file), std::move(hp), opt);
}

}  // namespace strata::cuda
