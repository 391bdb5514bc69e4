// qwen3next on one GPU (issue 10's GPU path): the forward pass of model/qwen3next.cpp op for op on the
// compute stream. Gated DeltaNet layers run the GDN ops of cuda/gdn.cuh with each sequence's conv and
// delta-rule state on the device; full-attention layers run the attention ops of cuda/ops.cuh on each
// sequence's f16 device KV; the routed experts go through the expert cache and the CPU pool exactly as
// in qwen3moe_cuda.cpp (resident pairs from slots, the others on CPU threads at the same time, partial
// sums added on the GPU); the shared expert is a dense weight, always on the GPU. docs/gpu.md has the
// design and the limits (recurrent delta rule for prefill, no CUDA graphs yet).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "common/error.h"
#include "cpu/matmul_batch.h"
#include "cuda/backend.h"
#include "cuda/device.h"
#include "cuda/expert_cache.h"
#include "cuda/gdn.cuh"
#include "cuda/attn_tile.cuh"
#include "cuda/gemm_context.h"
#include "cuda/graph.h"
#include "cuda/host/slot_spec.h"
#include "cuda/model_common.h"
#include "cuda/moe_kernels.cuh"
#include "cuda/ops.cuh"
#include "cuda/quant_kernels.cuh"
#include "cuda/transfer.h"
#include "model/moe_ffn.h"
#include "model/qwen3next_weights.h"
#include "model/weights.h"
#include "moe/expert_usage.h"

namespace strata::cuda {
namespace {

using qwen3next::NextParams;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = kMiB * 1024.0;
// Batches of up to this many tokens (decode) run as a CUDA graph when no layer needs the CPU pool (as
// qwen3moe_cuda.cpp); larger ones are prefill, whose launch overhead does not matter.
constexpr int64_t kMaxGraphTokens = 8;
// Graphs kept per workspace: one per (batch shape, sequences), so a server cycling through many
// conversations would otherwise collect them without bound; past this many the cache starts over.
constexpr size_t kMaxGraphs = 64;

struct GdnLayer {
  DevWeight qkv;      // [conv_dim][n_embd]   attn_qkv (legacy ssm_in: its q|k|v rows, regrouped at load)
  DevWeight gate;     // [value_dim][n_embd]  attn_gate (z)
  DevWeight ba;       // [2*Hv][n_embd]       ssm_ba
  DevWeight conv;     // [conv_dim][K] f32    ssm_conv1d
  DevWeight a;        // [Hv] f32             ssm_a
  DevWeight dt_bias;  // [Hv] f32             ssm_dt.bias
  DevWeight norm;     // [D] f32              ssm_norm
  DevWeight out;      // [n_embd][value_dim]  ssm_out
};

struct AttnLayer {
  DevWeight wq;      // [n_head * 2 * head_dim][n_embd]  query and output gate per head
  DevWeight wk;      // [n_head_kv * head_dim][n_embd]
  DevWeight wv;      // [n_head_kv * head_dim_v][n_embd]
  DevWeight q_norm;  // [head_dim] f32
  DevWeight k_norm;  // [head_dim] f32
  DevWeight wo;      // [n_embd][n_head * head_dim_v]
};

struct Layer {
  bool recurrent = false;
  int index = 0;        // among the GDN layers (recurrent) or among the attention layers (its KV layer)
  DevWeight attn_norm;  // [n_embd] f32
  DevWeight post_norm;  // [n_embd] f32
  GdnLayer gdn;
  AttnLayer attn;
  DevWeight router;       // [n_expert][n_embd]
  DevWeight sh_gate_inp;  // [1][n_embd]   ffn_gate_inp_shexp (a one-row matrix: logit = w . x)
  DevWeight sh_gate;      // [n_ff_shexp][n_embd]
  DevWeight sh_up;        // [n_ff_shexp][n_embd]
  DevWeight sh_down;      // [n_embd][n_ff_shexp]
  ExpertWeights experts;  // host, the mapped file: what the CPU pool reads
};

// A sequence's state on the GPU, owned by its SequenceState (so it lives, dies and is kept with it):
// the KV of the attention layers (f16, as qwen3moe's DeviceKv) and the recurrent state of the GDN layers.
// Sized up front; zeroed on the device when a forward pass starts the sequence at position 0.
class DeviceState final : public BackendState {
 public:
  DeviceBuffer k;     // [n_attn][n_ctx][n_head_kv][head_dim]   f16
  DeviceBuffer v;     // [n_attn][n_ctx][n_head_kv][head_dim_v] f16
  DeviceBuffer conv;  // [n_gdn][K-1][conv_dim] f32   last K-1 inputs of the conv, oldest first
  DeviceBuffer ssm;   // [n_gdn][Hv][D][D] f32        delta-rule state per value head, [value][key]
  size_t memory_bytes() const override { return k.bytes() + v.bytes() + conv.bytes() + ssm.bytes(); }
};

// A run of consecutive batch tokens of one sequence (the recurrent layers consume it in order).
struct Run {
  int32_t t0, t1;
  DeviceState* st;
  bool fresh;  // starts at position 0: the recurrent state is zeroed first
};

// Sizes (in values) of the device activations: one formula for the workspace and --expert-cache auto.
struct WsSizes {
  int64_t E, C, Kd, Vd, Hv, qg, q, k, v, att, router, ids, h, fs, logits, scratch, n;
  WsSizes(const HParams& hp, const NextParams& np, int64_t n_tok, int64_t n_ctx)
      : E(n_tok * hp.n_embd),
        C(n_tok * np.conv_dim()),
        Kd(n_tok * np.key_dim()),
        Vd(n_tok * np.value_dim()),
        Hv(n_tok * np.n_v_heads),
        qg(n_tok * hp.n_head * 2 * hp.head_dim),
        q(n_tok * hp.n_head * hp.head_dim),
        k(n_tok * hp.n_head_kv * hp.head_dim),
        v(n_tok * hp.n_head_kv * hp.head_dim_v),
        att(n_tok * hp.n_head * hp.head_dim_v),
        router(n_tok * hp.n_expert),
        ids(n_tok * hp.n_expert_used),
        h(n_tok * hp.n_expert_used * hp.n_ff_exp),
        fs(n_tok * np.n_ff_shexp),
        logits(n_tok * hp.n_vocab),
        scratch(int64_t(ops::attention_scratch_floats(n_tok, hp.n_head, hp.head_dim_v, n_ctx))),
        n(n_tok) {}
  // x xn tmp moe_out partial; qkv conv; z gv go; ba; g beta; gq gk; qg q qgate k v att; router; ids per
  // layer + wts; h; sh_g sh_u sh_logit; logits; scratch; step inputs.
  int64_t device_bytes(int n_layer) const {
    return 4 * (5 * E + 2 * C + 3 * Vd + 2 * Hv + 2 * Hv + 2 * Kd + qg + 2 * q + k + v + att + router +
                ids * (n_layer + 1) + h + 2 * fs + n + logits + scratch + 3 * n) +
           n * int64_t(sizeof(ops::KvRef));
  }
};

class NextWorkspace final : public Workspace {
 public:
  NextWorkspace(Device& dev, const HParams& hp, const NextParams& np, int32_t max_tok, int32_t n_ctx,
                int n_threads, bool prefill_paths, size_t moe_scratch_bytes)
      : n_tok_max(max_tok),
        n_ctx_max(n_ctx),
        k_used(hp.n_expert_used),
        moe(max_tok, hp.n_expert_used, hp.n_expert, hp.n_embd, hp.n_ff_exp),
        mb(n_threads, max_tok) {
    const WsSizes z(hp, np, max_tok, n_ctx);
    auto f32 = [&](int64_t values, const char* name) { return dev.alloc(size_t(std::max<int64_t>(values, 1)) * 4, name); };
    x = f32(z.E, "ws.x");
    xn = f32(z.E, "ws.xn");
    tmp = f32(z.E, "ws.tmp");
    qkv = f32(z.C, "ws.qkv");
    conv = f32(z.C, "ws.conv");
    zg = f32(z.Vd, "ws.z");
    ba = f32(2 * z.Hv, "ws.ba");
    g = f32(z.Hv, "ws.g");
    beta = f32(z.Hv, "ws.beta");
    gq = f32(z.Kd, "ws.gq");
    gk = f32(z.Kd, "ws.gk");
    gv = f32(z.Vd, "ws.gv");
    go = f32(z.Vd, "ws.go");
    qg = f32(z.qg, "ws.qg");
    q = f32(z.q, "ws.q");
    qgate = f32(z.q, "ws.qgate");
    k = f32(z.k, "ws.k");
    v = f32(z.v, "ws.v");
    att = f32(z.att, "ws.att");
    router = f32(z.router, "ws.router");
    ids = dev.alloc(size_t(z.ids) * size_t(np.n_layer) * 4, "ws.ids");
    wts = f32(z.ids, "ws.wts");
    h = f32(z.h, "ws.h");
    moe_out = f32(z.E, "ws.moe_out");
    partial = f32(z.E, "ws.partial");
    sh_g = f32(z.fs, "ws.sh_g");
    sh_u = f32(z.fs, "ws.sh_u");
    sh_logit = f32(z.n, "ws.sh_logit");
    step_in = dev.alloc(StepLayout(max_tok).bytes, "ws.step_in");
    attn_scratch = f32(z.scratch, "ws.attn_scratch");
    logits = f32(z.logits, "ws.logits");
    ids_h = dev.alloc_pinned(size_t(z.ids) * size_t(np.n_layer) * 4, "ws.ids_h");
    wts_h = dev.alloc_pinned(size_t(z.ids) * 4, "ws.wts_h");
    xn_h = dev.alloc_pinned(size_t(z.E) * 4, "ws.xn_h");
    partial_h = dev.alloc_pinned(size_t(z.E) * 4, "ws.partial_h");
    logits_h = dev.alloc_pinned(size_t(z.logits) * 4, "ws.logits_h");
    step_host.resize(StepLayout(max_tok).bytes);
    ids_cpu.resize(size_t(z.ids));
    layer_recorded.resize(size_t(np.n_layer));
    runs.resize(size_t(max_tok));
    if (prefill_paths && max_tok >= std::min(kGemmMinTokens, moe::kMoeGroupedMinTokens)) {
      const int64_t max_rows =
          std::max({int64_t(hp.n_vocab), int64_t(hp.n_head) * 2 * hp.head_dim, int64_t(hp.n_embd), int64_t(hp.n_expert),
                    np.conv_dim(), np.value_dim(), int64_t(np.n_ff_shexp), int64_t(2 * np.n_v_heads)});
      const int64_t max_cols = std::max({int64_t(hp.n_embd), int64_t(hp.n_head) * hp.head_dim_v, np.value_dim(),
                                         int64_t(np.n_ff_shexp)});
      gemm = make_gemm_context(dev, max_rows, max_cols, max_tok);
      if (moe_scratch_bytes > 0) moe_scratch = dev.alloc(moe_scratch_bytes, "ws.moe_scratch");
    }
  }
  int32_t max_tokens() const override { return n_tok_max; }
  size_t memory_bytes() const override {
    size_t b = moe.memory_bytes() + moe_scratch.bytes();
    for (const DeviceBuffer* d : {&x, &xn, &tmp, &qkv, &conv, &zg, &ba, &g, &beta, &gq, &gk, &gv, &go, &qg, &q,
                                  &qgate, &k, &v, &att, &router, &ids, &wts, &h, &moe_out, &partial, &sh_g, &sh_u,
                                  &sh_logit, &step_in, &attn_scratch, &logits})
      b += d->bytes();
    for (const PinnedBuffer* p : {&ids_h, &wts_h, &xn_h, &partial_h, &logits_h}) b += p->bytes();
    return b;
  }

  int32_t n_tok_max, n_ctx_max;
  int k_used;  // experts per token
  // device, f32 unless said
  DeviceBuffer x, xn, tmp;      // [n_tok][n_embd] residual stream, normed input, sub-block output
  DeviceBuffer qkv, conv;       // [n_tok][conv_dim] attn_qkv output; after conv1d + SiLU
  DeviceBuffer zg;              // [n_tok][Hv][D] attn_gate output (z)
  DeviceBuffer ba;              // [n_tok][2*Hv]
  DeviceBuffer g, beta;         // [n_tok][Hv] log-decay, write strength
  DeviceBuffer gq, gk;          // [n_tok][Hk][D] L2-normalised
  DeviceBuffer gv, go;          // [n_tok][Hv][D] values, delta-rule output (then gated-normed in place)
  DeviceBuffer qg;              // [n_tok][n_head][2*head_dim] attn_q output
  DeviceBuffer q, qgate;        // [n_tok][n_head][head_dim]
  DeviceBuffer k, v;            // [n_tok][n_head_kv][head_dim], [n_tok][n_head_kv][head_dim_v]
  DeviceBuffer att;             // [n_tok][n_head][head_dim_v]
  DeviceBuffer router;          // [n_tok][n_expert]
  DeviceBuffer ids;             // [n_layer][n][k] int32 (layer stride n*k, as qwen3moe_cuda.cpp)
  DeviceBuffer wts;             // [n_tok][k]
  DeviceBuffer h;               // [n_tok * k][n_ff] resident experts' silu(gate) * up
  DeviceBuffer moe_out;         // [n_tok][n_embd] resident experts' weighted sum
  DeviceBuffer partial;         // [n_tok][n_embd] the CPU pool's weighted sum, uploaded
  DeviceBuffer sh_g, sh_u;      // [n_tok][n_ff_shexp] shared expert gate / up (then swiglu in sh_g)
  DeviceBuffer sh_logit;        // [n_tok] ffn_gate_inp_shexp . x
  DeviceBuffer step_in;         // StepLayout(n): refs, tokens, positions, logit rows of the batch
  DeviceBuffer attn_scratch;    // ops::attention_scratch_floats(n_tok, n_head, head_dim_v, n_ctx)
  DeviceBuffer logits;          // [n_tok][n_vocab]
  std::unique_ptr<GemmContext> gemm;  // prefill dense products (null: exact mode or small batches)
  DeviceBuffer moe_scratch;           // moe::moe_grouped_scratch_bytes for the largest layer
  // pinned host
  PinnedBuffer ids_h;      // [n_layer][n][k] int32, as ids
  PinnedBuffer wts_h;      // [n_tok][k]
  PinnedBuffer xn_h;       // [n_tok][n_embd]
  PinnedBuffer partial_h;  // [n_tok][n_embd] written by the CPU pool
  PinnedBuffer logits_h;   // [n_tok][n_vocab]
  // host
  std::vector<uint8_t> step_host;       // StepLayout(n), filled by forward() and uploaded in one copy
  std::vector<int32_t> ids_cpu;         // [n_tok][k]: expert id, or -1 where the GPU runs the pair
  std::vector<uint8_t> layer_recorded;  // [n_layer] this forward's routing already recorded
  std::vector<Run> runs;                // [<= n_tok]
  Ticket ids_ticket;                    // pending end-of-forward download of ids_h
  Ticket partial_ticket;                // last upload that reads partial_h
  // CUDA graphs of the compute section (CudaQwen3Next::run_graph). Besides what qwen3moe's key holds,
  // the key names each run's tokens and its sequence's state buffers: the GDN ops take the state
  // pointers as kernel arguments, so a graph is valid for those sequences' device state only (an address
  // reused by a later sequence holds a state of the same layout, so the graph is right for it too).
  struct GraphKey {
    int64_t n, n_out;
    int attn;
    bool mma, generic;  // attn_tile::prefill_mma(), quant::generic_only(): process-wide switches
    std::vector<std::tuple<int32_t, int32_t, const void*, const void*>> runs;  // t0, t1, conv, ssm
    bool operator<(const GraphKey& o) const {
      return std::tie(n, n_out, attn, mma, generic, runs) < std::tie(o.n, o.n_out, o.attn, o.mma, o.generic, o.runs);
    }
  };
  std::map<GraphKey, Graph> graphs;
  uint64_t graphs_model = 0;           // CudaQwen3Next::model_id_ of the model that captured them
  const void* graphs_slots = nullptr;  // the expert cache's slot and table allocations they read
  const void* graphs_table = nullptr;
  MoeScratch moe;
  cpu::MatmulBatch mb;
};

// Legacy files carry one fused `ssm_in` per GDN layer, rows grouped per key head j (r = Hv / Hk):
// q_j (D rows), k_j (D), v of heads j*r.. (r*D), z of heads j*r.. (r*D) (cpu/gdn.h gdn_unpack_qkvz).
// The GPU runs the attn_qkv layout: the same rows, permuted (exact for any type: a row is whole blocks).
//   qkv: [2*Hk*D + Hv*D rows] q | k | v     z: [Hv*D rows]
void regroup_qkvz(const Weight& w, const NextParams& np, std::vector<uint8_t>& qkv, std::vector<uint8_t>& z) {
  const int64_t D = np.head_dim, Hk = np.n_k_heads, r = np.n_v_heads / np.n_k_heads, Kd = np.key_dim();
  const size_t rb = size_t(w.row_bytes());
  qkv.resize(size_t(np.conv_dim()) * rb);
  z.resize(size_t(np.value_dim()) * rb);
  const int64_t per_head = 2 * D + 2 * r * D;
  auto rows = [&](std::vector<uint8_t>& dst, int64_t dst_row, int64_t src_row, int64_t n) {
    std::memcpy(dst.data() + size_t(dst_row) * rb, w.data + size_t(src_row) * rb, size_t(n) * rb);
  };
  for (int64_t j = 0; j < Hk; ++j) {
    const int64_t s = j * per_head;
    rows(qkv, j * D, s, D);                          // q_j
    rows(qkv, Kd + j * D, s + D, D);                 // k_j
    rows(qkv, 2 * Kd + j * r * D, s + 2 * D, r * D);  // v of heads j*r..
    rows(z, j * r * D, s + 2 * D + r * D, r * D);     // z of heads j*r..
  }
}

// A view of host bytes as a [rows][cols] matrix of `type` (for upload_matrix).
Weight host_matrix(const Weight& like, const std::vector<uint8_t>& bytes, int64_t rows) {
  Weight w = like;
  w.data = bytes.data();
  w.ne[1] = rows;
  w.ne[2] = w.ne[3] = 1;
  return w;
}

class CudaQwen3Next final : public Model {
 public:
  CudaQwen3Next(gguf::File file, HParams hp, NextParams np, const CudaOptions& opt)
      : Model(std::move(file), std::move(hp)),
        np_(std::move(np)),
        opt_(opt),
        graphs_(opt.cuda_graphs && graphs_enabled_by_env()),
        model_id_(next_model_id()) {
    load();
  }
  ~CudaQwen3Next() override {
    if (dev_) dev_->make_current();
  }

  // One object per sequence: host SequenceState (no host KV or recurrent buffers: the GDN layers are
  // marked as holding device state, so the server knows it cannot be rewound) plus the DeviceState.
  std::unique_ptr<SequenceState> new_sequence(int32_t n_ctx, KvType kv_type) const override {
    STRATA_REQUIRE(n_ctx >= 1, "new sequence: context {} must be >= 1", n_ctx);
    dev_->make_current();
    auto seq = std::make_unique<SequenceState>(n_ctx, kv_type, std::vector<bool>(size_t(np_.n_layer), false),
                                               hp_.n_head_kv, hp_.head_dim, hp_.head_dim_v);
    for (int il = 0; il < np_.n_layer; ++il)
      if (np_.recurrent[size_t(il)]) seq->recurrent()[size_t(il)].on_device = true;
    auto st = std::make_unique<DeviceState>();
    const size_t per_pos = size_t(n_attn_) * size_t(n_ctx) * size_t(hp_.n_head_kv) * 2;
    st->k = dev_->alloc(std::max<size_t>(per_pos * size_t(hp_.head_dim), 2), "seq.k");
    st->v = dev_->alloc(std::max<size_t>(per_pos * size_t(hp_.head_dim_v), 2), "seq.v");
    st->conv = dev_->alloc(std::max<size_t>(size_t(n_gdn_) * conv_state_values() * 4, 4), "seq.conv");
    st->ssm = dev_->alloc(std::max<size_t>(size_t(n_gdn_) * ssm_state_values() * 4, 4), "seq.ssm");
    seq->set_backend_state(std::move(st));
    return seq;
  }
  std::unique_ptr<Workspace> new_workspace(int32_t max_tokens, int32_t n_ctx, int n_threads) const override {
    STRATA_REQUIRE(max_tokens >= 1 && n_ctx >= 1 && n_threads >= 1,
                   "workspace: batch {}, context {}, threads {} must all be >= 1", max_tokens, n_ctx, n_threads);
    dev_->make_current();
    // Exact mode keeps f32 products everywhere: the prefill paths round x and w to bf16.
    const bool prefill_paths = !opt_.exact;
    size_t moe_scratch = 0;
    if (prefill_paths && max_tokens >= moe::kMoeGroupedMinTokens)
      for (int il = 0; il < np_.n_layer; ++il)
        moe_scratch = std::max(moe_scratch, moe::moe_grouped_scratch_bytes(cache_->layer_view(il), hp_.n_expert,
                                                                           max_tokens, hp_.n_expert_used));
    return std::make_unique<NextWorkspace>(*dev_, hp_, np_, max_tokens, n_ctx, n_threads, prefill_paths, moe_scratch);
  }
  size_t weight_bytes() const override { return weight_bytes_; }
  std::string backend_name() const override { return "cuda:" + std::to_string(dev_->ordinal()); }
  ExpertCacheReport cache_report() const override {
    std::lock_guard<std::mutex> lock(mu_);
    const ExpertCache::Stats s = cache_->stats();
    ExpertCacheReport r;
    r.present = true;
    r.hits = s.hits;
    r.misses = s.misses;
    r.swaps = s.swaps;
    r.slots_used = s.slots_used;
    r.n_slots = s.n_slots;
    r.n_experts_total = np_.n_layer * hp_.n_expert;
    r.bytes_h2d = xfer_->bytes_h2d() - h2d_base_;
    r.bytes_d2h = xfer_->bytes_d2h() - d2h_base_;
    r.slot_bytes = uint64_t(cache_->slot_bytes());
    r.graphs_enabled = graphs_;
    r.forwards = int64_t(work_.forwards);
    r.graph_forwards = int64_t(work_.graph_forwards);
    r.graph_captures = int64_t(work_.captures);
    r.op_calls = int64_t(work_.op_calls);
    r.transfers = int64_t(work_.transfers);
    r.host_s = std::chrono::duration<double>(work_.host).count();
    r.wait_s = std::chrono::duration<double>(work_.wait).count();
    return r;
  }
  void reset_cache_stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_->reset_stats();
    work_ = HostWork();
    h2d_base_ = xfer_->bytes_h2d();
    d2h_base_ = xfer_->bytes_d2h();
  }
  void forward(const Batch& batch, Workspace& ws, float* logits, ThreadPool& pool,
               const ForwardOptions& opt) const override;

 private:
  // One forward's parameters every kernel launch of it depends on. launch = false walks the same
  // sequence for the stream-order checker's notes only (no kernel enqueued: a graph replay).
  struct Pass {
    NextWorkspace& ws;
    int64_t n, n_out;  // tokens in the batch, rows that want logits
    int64_t n_runs;    // ws.runs[0, n_runs): the batch's sequences
    cpu::AttnMath attn;
    bool launch;
    template <typename T>
    T* step(size_t offset) const {  // a field of ws.step_in (StepLayout(n))
      return reinterpret_cast<T*>(static_cast<char*>(ws.step_in.data()) + offset);
    }
    int32_t* ids(int il) const {  // layer il's [n][k] in ws.ids
      return ws.ids.as<int32_t>() + size_t(il) * size_t(n) * size_t(ws.k_used);
    }
  };
  struct HostWork {
    uint64_t forwards = 0, graph_forwards = 0, captures = 0, op_calls = 0, transfers = 0;
    std::chrono::steady_clock::duration host{}, wait{};
  };
  template <typename F>
  void op(const Pass& p, F&& f) const {
    if (!p.launch) return;
    f();
    ++work_.op_calls;
  }
  size_t conv_state_values() const { return size_t(np_.conv_kernel - 1) * size_t(np_.conv_dim()); }
  size_t ssm_state_values() const { return size_t(np_.n_v_heads) * size_t(np_.head_dim) * size_t(np_.head_dim); }

  // The pieces of a forward pass, all on the compute stream.
  void embed(const Pass& p) const;
  void gdn_block(const Pass& p, const Layer& l) const;        // ws.xn -> ws.tmp
  void attention_block(const Pass& p, const Layer& l) const;  // ws.xn -> ws.tmp
  void route(const Pass& p, int il) const;          // post norm -> ws.xn, router, top-k -> ids(il), ws.wts
  void shared_expert(const Pass& p, const Layer& l) const;  // ws.xn -> ws.tmp (ungated), ws.sh_logit
  void gpu_experts(const Pass& p, int il) const;    // resident experts from their slots -> ws.moe_out
  void add_ffn_out(const Pass& p) const;            // x += moe_out + sigmoid(sh_logit) * tmp
  void output(const Pass& p) const;                 // rows that want logits -> ws.logits
  void layer_front(const Pass& p, int il) const;    // attn norm, GDN or attention block, residual, route
  void compute_resident(const Pass& p) const;       // the whole pass when every expert is resident
  void run_graph(const Pass& p) const;              // compute_resident as a (cached) CUDA graph
  // The CPU pool's part of layer il's routed experts (the GPU runs the resident pairs meanwhile):
  // downloads routing and activations, runs the others on CPU threads, uploads and adds their sum.
  void pool_experts(const Pass& p, int il, ThreadPool& pool, const ForwardOptions& opt) const;

  void load();
  DevWeight upload(const Weight& w, const std::string& name, RepackLog& log) {
    return upload_matrix(*dev_, *xfer_, w, name, opt_.exact, log);
  }
  // y [n][w.rows] = x [n][w.cols] . W^T on the compute stream.
  void mm(const Pass& p, const DevWeight& w, const DeviceBuffer& x, int64_t n, const DeviceBuffer& y,
          Site site = Site::here()) const {
    note_launch(dev_->compute(), {w.buf.span(), x.span()}, {y.span()}, site);
    op(p, [&] {
      quant::matmul(w.type, w.buf.data(), w.rows, w.cols, x.as<const float>(), n, y.as<float>(), stream(),
                    p.ws.gemm.get());
    });
  }
  cudaStream_t stream() const { return dev_->compute().handle(); }
  static uint64_t next_model_id() {
    static std::atomic<uint64_t> next{1};
    return next++;
  }

  NextParams np_;
  CudaOptions opt_;
  const bool graphs_;        // CUDA graphs for decode passes without the CPU pool
  const uint64_t model_id_;  // unique in the process: a workspace's graphs belong to one model
  int n_attn_ = 0, n_gdn_ = 0;  // attention / Gated DeltaNet layers
  std::unique_ptr<Device> dev_;
  std::unique_ptr<Transfer> xfer_;
  qwen3next::Weights host_;  // every tensor of the file, checked (the CPU pool reads the experts here)
  DevWeight tok_embd_;       // [n_vocab][n_embd]
  DevWeight output_norm_;    // [n_embd] f32
  DevWeight output_;         // [n_vocab][n_embd]; empty when tied (out_w_ = &tok_embd_)
  const DevWeight* out_w_ = nullptr;
  std::vector<Layer> layers_;
  std::unique_ptr<ExpertCache> cache_;  // declared last: destroyed first (its copies use xfer_, dev_)
  size_t weight_bytes_ = 0;
  mutable std::mutex mu_;  // one forward at a time (the expert cache's step protocol); stats
  mutable uint64_t h2d_base_ = 0, d2h_base_ = 0;
  mutable HostWork work_;
};

void CudaQwen3Next::load() {
  HParams& hp = hp_;
  check_moe_hparams_and_vocab(hp, file_);
  STRATA_REQUIRE(hp.n_expert <= cpu::kMaxExperts && hp.n_expert_used <= 64,
                 "{}: {} experts ({} used) is more than the GPU router handles ({}, 64)", file_.path(), hp.n_expert,
                 hp.n_expert_used, cpu::kMaxExperts);
  STRATA_REQUIRE(np_.head_dim <= 256, "{}: ssm.state_size {} is more than the GPU delta rule takes (256)",
                 file_.path(), np_.head_dim);
  STRATA_REQUIRE(hp.head_dim == hp.head_dim_v,
                 "{}: gated attention needs key and value heads of one size (key_length {}, value_length {})",
                 file_.path(), hp.head_dim, hp.head_dim_v);
  qwen3next::load_weights(file_, hp, np_, host_);  // checks every tensor before any GPU work
  const int count = device_count();
  STRATA_REQUIRE(count > 0, "--backend cuda: no CUDA GPU found (no driver or no device); use --backend cpu");
  STRATA_REQUIRE(opt_.gpu >= 0 && opt_.gpu < count, "--gpu {}: this machine has {} GPU(s) (0..{})", opt_.gpu, count,
                 count - 1);
  dev_ = std::make_unique<Device>(opt_.gpu);
  dev_->make_current();
  xfer_ = std::make_unique<Transfer>(*dev_);

  const int64_t E = hp.n_embd, F = hp.n_ff_exp;
  RepackLog log;
  const size_t free0 = dev_->free_bytes();
  tok_embd_ = upload(host_.tok_embd, "token_embd", log);
  output_norm_ = upload_f32(*dev_, *xfer_, host_.output_norm, "output_norm");
  if (!host_.tied) {
    output_ = upload(host_.output, "output", log);
    out_w_ = &output_;
  } else {
    out_w_ = &tok_embd_;  // tied embeddings
  }
  layers_.resize(size_t(np_.n_layer));
  std::vector<LayerExperts> lexp(size_t(np_.n_layer));
  for (int il = 0; il < np_.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const qwen3next::Layer& hl = host_.layers[size_t(il)];
    Layer& l = layers_[size_t(il)];
    l.recurrent = hl.recurrent;
    l.index = l.recurrent ? n_gdn_++ : n_attn_++;
    l.attn_norm = upload_f32(*dev_, *xfer_, hl.attn_norm, p + "attn_norm");
    l.post_norm = upload_f32(*dev_, *xfer_, hl.post_norm, p + "post_attention_norm");
    if (l.recurrent) {
      const qwen3next::GdnWeights& w = hl.gdn;
      if (w.qkv) {
        l.gdn.qkv = upload(w.qkv, p + "attn_qkv", log);
        l.gdn.gate = upload(w.gate, p + "attn_gate", log);
      } else {
        std::vector<uint8_t> qkv, z;
        regroup_qkvz(w.qkvz, np_, qkv, z);
        l.gdn.qkv = upload(host_matrix(w.qkvz, qkv, np_.conv_dim()), p + "ssm_in(qkv)", log);
        l.gdn.gate = upload(host_matrix(w.qkvz, z, np_.value_dim()), p + "ssm_in(z)", log);
      }
      l.gdn.ba = upload(w.ba, p + "ssm_ba", log);
      l.gdn.conv = upload_f32_values(*dev_, *xfer_, w.conv, int64_t(np_.conv_kernel) * np_.conv_dim(), p + "ssm_conv1d");
      l.gdn.a = upload_f32(*dev_, *xfer_, w.a, p + "ssm_a");
      l.gdn.dt_bias = upload_f32(*dev_, *xfer_, w.dt_bias, p + "ssm_dt.bias");
      l.gdn.norm = upload_f32(*dev_, *xfer_, w.norm, p + "ssm_norm");
      l.gdn.out = upload(w.out, p + "ssm_out", log);
    } else {
      const qwen3next::AttnWeights& w = hl.attn;
      l.attn.wq = upload(w.wq, p + "attn_q", log);
      l.attn.wk = upload(w.wk, p + "attn_k", log);
      l.attn.wv = upload(w.wv, p + "attn_v", log);
      l.attn.q_norm = upload_f32(*dev_, *xfer_, w.q_norm, p + "attn_q_norm");
      l.attn.k_norm = upload_f32(*dev_, *xfer_, w.k_norm, p + "attn_k_norm");
      l.attn.wo = upload(w.wo, p + "attn_output", log);
    }
    l.router = upload(hl.router, p + "ffn_gate_inp", log);
    l.sh_gate_inp = upload_f32(*dev_, *xfer_, hl.sh_gate_inp, p + "ffn_gate_inp_shexp");
    l.sh_gate = upload(hl.sh_gate, p + "ffn_gate_shexp", log);
    l.sh_up = upload(hl.sh_up, p + "ffn_up_shexp", log);
    l.sh_down = upload(hl.sh_down, p + "ffn_down_shexp", log);
    l.experts = hl.experts;
    lexp[size_t(il)] = {{l.experts.gate.type, l.experts.gate.data},
                        {l.experts.up.type, l.experts.up.data},
                        {l.experts.down.type, l.experts.down.data}};
  }
  for (const auto& t : file_.tensors()) weight_bytes_ += t.nbytes;
  const size_t free1 = dev_->free_bytes();
  const int64_t dense_bytes = int64_t(free0) - int64_t(free1);
  if (opt_.exact)
    std::fprintf(stderr, "strata: cuda: exact mode: %d dense tensors dequantized to F32 on the CPU (%.1f MiB in the file -> %.1f MiB on the GPU)\n",
                 log.n, log.file_bytes / kMiB, log.gpu_bytes / kMiB);
  else if (log.n > 0)
    std::fprintf(stderr, "strata: cuda: repacked %d dense tensors without a GPU kernel (%s): %.1f MiB in the file -> %.1f MiB on the GPU\n",
                 log.n, log.types.c_str(), log.file_bytes / kMiB, log.gpu_bytes / kMiB);
  if (np_.n_nextn > 0)
    std::fprintf(stderr, "strata: cuda: %d MTP block(s) (%zu tensors) kept on the host, not run\n", np_.n_nextn,
                 host_.nextn.size());

  // --- expert cache sizing (as qwen3moe_cuda.cpp) ---
  const int total = np_.n_layer * hp.n_expert;
  const int64_t slot_bytes = ExpertCache::slot_bytes_for(E, F, lexp, opt_.exact);
  const int64_t n_seq = std::max(opt_.kv_sequences, 1), n_ctx = std::max(opt_.n_ctx, 1);
  const int64_t kv_bytes =
      n_seq * (int64_t(n_attn_) * n_ctx * hp.n_head_kv * (hp.head_dim + hp.head_dim_v) * 2 +
               int64_t(n_gdn_) * int64_t(conv_state_values() + ssm_state_values()) * 4);
  const int64_t ws_bytes = WsSizes(hp, np_, std::max(opt_.n_batch, 1), n_ctx).device_bytes(np_.n_layer);
  const int64_t reserve = opt_.vram_reserve_mib * (int64_t(1) << 20);
  STRATA_REQUIRE(opt_.vram_reserve_mib >= 0, "--vram-reserve-mib must be >= 0, got {}", opt_.vram_reserve_mib);
  STRATA_REQUIRE(opt_.vram_budget_gib >= 0, "--vram-budget must be >= 0 GiB, got {}", opt_.vram_budget_gib);
  int64_t budget = int64_t(free1);
  if (opt_.vram_budget_gib > 0) budget = std::min<int64_t>(budget, int64_t(opt_.vram_budget_gib * kGiB) - dense_bytes);
  const int n_slots =
      opt_.expert_cache == "auto"
          ? strata::moe::auto_expert_slots(size_t(std::max<int64_t>(budget, 0)), size_t(reserve),
                                           size_t(kv_bytes + ws_bytes + int64_t(total) * 4), slot_bytes, total)
          : expert_slots_from_spec(opt_.expert_cache, total, slot_bytes, 0);
  std::fprintf(stderr,
               "strata: cuda: %s (%.1f GiB), qwen3next %d GDN + %d attention layers, dense weights %.2f GiB; "
               "expert cache %d/%d slots of %.2f MiB (%.2f GiB)",
               dev_->info().name.c_str(), double(dev_->info().total_bytes) / kGiB, n_gdn_, n_attn_,
               double(dense_bytes) / kGiB, n_slots, total, double(slot_bytes) / kMiB,
               double(slot_bytes) * n_slots / kGiB);
  if (opt_.expert_cache == "auto")
    std::fprintf(stderr, " = what fits in %.2f GiB after KV + recurrent state %.2f GiB (%lld x %lld tokens), workspace %.2f GiB, reserve %.2f GiB",
                 double(budget) / kGiB, double(kv_bytes) / kGiB, (long long)n_seq, (long long)n_ctx,
                 double(ws_bytes) / kGiB, double(reserve) / kGiB);
  std::fprintf(stderr, "\n");

  std::unique_ptr<strata::moe::ExpertUsage> profile;
  if (!opt_.expert_profile.empty()) {
    std::ifstream f(opt_.expert_profile, std::ios::binary);
    STRATA_REQUIRE(f.good(), "--expert-profile {}: cannot open", opt_.expert_profile);
    std::stringstream ss;
    ss << f.rdbuf();
    profile = std::make_unique<strata::moe::ExpertUsage>(strata::moe::ExpertUsage::from_json(ss.str()));
    STRATA_REQUIRE(profile->n_layer() == np_.n_layer && profile->n_expert() == hp.n_expert,
                   "--expert-profile {}: made for {} layers x {} experts, the model has {} x {}", opt_.expert_profile,
                   profile->n_layer(), profile->n_expert(), np_.n_layer, hp.n_expert);
  }
  STRATA_REQUIRE(opt_.adapt_every >= 0, "--adapt-every must be >= 0, got {}", opt_.adapt_every);
  ExpertCacheConfig cfg;
  cfg.n_slots = n_slots;
  cfg.exact = opt_.exact;
  cfg.adapt_every = opt_.adapt_every;
  cache_ = std::make_unique<ExpertCache>(*dev_, *xfer_, E, F, hp.n_expert, std::move(lexp), cfg, profile.get());
  std::fprintf(stderr, "strata: cuda: %s\n", cache_->residency().summary().c_str());
  dev_->compute().synchronize();  // weights and first slots in place before the first forward
  h2d_base_ = xfer_->bytes_h2d();
  d2h_base_ = xfer_->bytes_d2h();
}

void CudaQwen3Next::embed(const Pass& p) const {
  const StepLayout sl(p.n);
  note_launch(dev_->compute(), {tok_embd_.buf.span(), p.ws.step_in.span()}, {p.ws.x.span()});
  op(p, [&] {
    quant::get_rows(tok_embd_.type, tok_embd_.buf.data(), hp_.n_embd, p.step<const int32_t>(sl.tokens), p.n,
                    p.ws.x.as<float>(), stream());
  });
}

// Gated DeltaNet (model/qwen3next.cpp gdn_block): projections, gates, per-sequence conv1d + SiLU, split
// + L2 norm, per-sequence delta rule (the recurrent form over the run's tokens, state on chip), gated
// RMSNorm, output projection.
void CudaQwen3Next::gdn_block(const Pass& p, const Layer& l) const {
  const GdnLayer& w = l.gdn;
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  const cudaStream_t s = stream();
  const int64_t n = p.n, C = np_.conv_dim(), Kd = np_.key_dim(), Vd = np_.value_dim();
  const int64_t Hk = np_.n_k_heads, Hv = np_.n_v_heads, D = np_.head_dim;
  const int K = np_.conv_kernel;
  mm(p, w.qkv, ws.xn, n, ws.qkv);
  mm(p, w.gate, ws.xn, n, ws.zg);
  mm(p, w.ba, ws.xn, n, ws.ba);
  note_launch(cs, {ws.ba.span(), w.a.buf.span(), w.dt_bias.buf.span()}, {ws.g.span(), ws.beta.span()});
  op(p, [&] { gdn::gates(ws.ba.as<const float>(), n, Hk, Hv, w.a.f32(), w.dt_bias.f32(), ws.g.as<float>(), ws.beta.as<float>(), s); });
  const size_t conv_off = size_t(l.index) * conv_state_values(), ssm_off = size_t(l.index) * ssm_state_values();
  for (int64_t r = 0; r < p.n_runs; ++r) {
    const Run& run = ws.runs[size_t(r)];
    const int64_t len = run.t1 - run.t0;
    note_launch(cs, {ws.qkv.span(), w.conv.buf.span(), run.st->conv.span()}, {ws.conv.span(), run.st->conv.span()});
    op(p, [&] {
      gdn::conv1d_silu(ws.qkv.as<const float>() + run.t0 * C, len, C, K, run.st->conv.as<float>() + conv_off,
                       w.conv.f32(), ws.conv.as<float>() + run.t0 * C, s);
    });
  }
  note_launch(cs, {ws.conv.span()}, {ws.gq.span(), ws.gk.span(), ws.gv.span()});
  op(p, [&] {
    gdn::split_qkv(ws.conv.as<const float>(), n, Hk, Hv, D, hp_.rms_eps, ws.gq.as<float>(), ws.gk.as<float>(),
                   ws.gv.as<float>(), s);
  });
  const float q_scale = 1.0f / std::sqrt(float(D));
  for (int64_t r = 0; r < p.n_runs; ++r) {
    const Run& run = ws.runs[size_t(r)];
    const int64_t t0 = run.t0, len = run.t1 - run.t0;
    note_launch(cs, {ws.gq.span(), ws.gk.span(), ws.gv.span(), ws.g.span(), ws.beta.span(), run.st->ssm.span()},
                {ws.go.span(), run.st->ssm.span()});
    op(p, [&] {
      gdn::delta_rule(len, Hk, Hv, D, ws.gq.as<const float>() + t0 * Kd, ws.gk.as<const float>() + t0 * Kd,
                      ws.gv.as<const float>() + t0 * Vd, ws.g.as<const float>() + t0 * Hv,
                      ws.beta.as<const float>() + t0 * Hv, q_scale, run.st->ssm.as<float>() + ssm_off,
                      ws.go.as<float>() + t0 * Vd, s);
    });
  }
  note_launch(cs, {ws.go.span(), ws.zg.span(), w.norm.buf.span()}, {ws.go.span()});
  op(p, [&] {
    gdn::gated_rms_norm(ws.go.as<const float>(), ws.zg.as<const float>(), w.norm.f32(), n * Hv, D, hp_.rms_eps,
                        ws.go.as<float>(), s);
  });
  mm(p, w.out, ws.go, n, ws.tmp);
}

// Gated attention (model/qwen3next.cpp attention_block): attn_q yields query and output gate per head;
// per-head q/k RMSNorm, partial NeoX RoPE (n_rot), f16 KV of the sequence's attention layer l.index,
// causal attention, output gated by sigmoid(gate), output projection.
void CudaQwen3Next::attention_block(const Pass& p, const Layer& l) const {
  const HParams& hp = hp_;
  const AttnLayer& w = l.attn;
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  const cudaStream_t s = stream();
  const int64_t n = p.n, H = hp.n_head, Hkv = hp.n_head_kv, D = hp.head_dim, Dv = hp.head_dim_v;
  const StepLayout sl(n);
  const auto* refs = p.step<const ops::KvRef>(sl.refs);
  const auto* pos = p.step<const int32_t>(sl.pos);
  float* q = ws.q.as<float>();
  float* k = ws.k.as<float>();
  mm(p, w.wq, ws.xn, n, ws.qg);
  mm(p, w.wk, ws.xn, n, ws.k);
  mm(p, w.wv, ws.xn, n, ws.v);
  note_launch(cs, {ws.qg.span()}, {ws.q.span(), ws.qgate.span()});
  op(p, [&] { gdn::split_q_gate(ws.qg.as<const float>(), n, H, D, q, ws.qgate.as<float>(), s); });
  note_launch(cs, {w.q_norm.buf.span(), w.k_norm.buf.span()}, {ws.q.span(), ws.k.span()});
  op(p, [&] { ops::rmsnorm(q, w.q_norm.f32(), n * H, D, hp.rms_eps, q, s); });
  op(p, [&] { ops::rmsnorm(k, w.k_norm.f32(), n * Hkv, D, hp.rms_eps, k, s); });
  note_launch(cs, {ws.step_in.span()}, {ws.q.span(), ws.k.span()});
  op(p, [&] { ops::rope_neox(q, pos, n, int(H), int(D), hp.n_rot, hp.rope_base, s); });
  op(p, [&] { ops::rope_neox(k, pos, n, int(Hkv), int(D), hp.n_rot, hp.rope_base, s); });
  note_launch(cs, {ws.step_in.span(), ws.k.span(), ws.v.span()}, {});
  op(p, [&] { ops::kv_store(k, ws.v.as<const float>(), refs, n, l.index, Hkv * D, Hkv * Dv, s); });
  note_launch(cs, {ws.step_in.span(), ws.q.span()}, {ws.att.span(), ws.attn_scratch.span()});
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  op(p, [&] {
    ops::attention(q, refs, n, l.index, int(H), int(Hkv), int(D), int(Dv), scale, p.attn, ws.n_ctx_max,
                   ws.attn_scratch.as<float>(), ws.att.as<float>(), s);
  });
  note_launch(cs, {ws.qgate.span()}, {ws.att.span()});
  op(p, [&] { gdn::mul_sigmoid(ws.att.as<float>(), ws.qgate.as<const float>(), n * H * Dv, s); });
  mm(p, w.wo, ws.att, n, ws.tmp);
}

void CudaQwen3Next::route(const Pass& p, int il) const {
  const HParams& hp = hp_;
  const Layer& l = layers_[size_t(il)];
  NextWorkspace& ws = p.ws;
  const int64_t n = p.n;
  note_launch(dev_->compute(), {ws.x.span(), l.post_norm.buf.span()}, {ws.xn.span()});
  op(p, [&] { ops::rmsnorm(ws.x.as<const float>(), l.post_norm.f32(), n, hp.n_embd, hp.rms_eps, ws.xn.as<float>(), stream()); });
  mm(p, l.router, ws.xn, n, ws.router);
  note_launch(dev_->compute(), {ws.router.span()}, {ws.ids.span(), ws.wts.span()});
  op(p, [&] {
    ops::moe_route(ws.router.as<const float>(), n, hp.n_expert, hp.n_expert_used, hp.expert_weights_norm, p.ids(il),
                   ws.wts.as<float>(), stream());
  });
}

// The shared expert, dense on the GPU: tmp = down(silu(gate x) * up x), sh_logit = ffn_gate_inp_shexp . x
// (the sigmoid gate is applied in add_ffn_out).
void CudaQwen3Next::shared_expert(const Pass& p, const Layer& l) const {
  NextWorkspace& ws = p.ws;
  const int64_t n = p.n;
  mm(p, l.sh_gate, ws.xn, n, ws.sh_g);
  mm(p, l.sh_up, ws.xn, n, ws.sh_u);
  mm(p, l.sh_gate_inp, ws.xn, n, ws.sh_logit);
  note_launch(dev_->compute(), {ws.sh_g.span(), ws.sh_u.span()}, {ws.sh_g.span()});
  op(p, [&] { ops::swiglu(ws.sh_g.as<const float>(), ws.sh_u.as<const float>(), n * np_.n_ff_shexp, ws.sh_g.as<float>(), stream()); });
  mm(p, l.sh_down, ws.sh_g, n, ws.tmp);
}

void CudaQwen3Next::gpu_experts(const Pass& p, int il) const {
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  cache_->note_expert_reads(cs, il);  // the table and every slot the layer's row points to
  note_launch(cs, {ws.xn.span(), ws.ids.span(), ws.wts.span()}, {ws.h.span(), ws.moe_out.span()});
  const moe::ExpertLayerView view = cache_->layer_view(il);
  const int32_t* table = cache_->device_layer_row(il);
  const int k_used = hp_.n_expert_used;
  // Prefill: tokens grouped by expert on the tensor cores (qwen3moe_cuda.cpp gpu_experts says why).
  if (p.n >= moe::kMoeGroupedMinTokens && ws.moe_scratch.bytes() > 0 && moe::moe_grouped_supported(view)) {
    note_launch(cs, {ws.xn.span(), ws.ids.span(), ws.wts.span()}, {ws.moe_scratch.span(), ws.moe_out.span()});
    op(p, [&] {
      moe::moe_experts_grouped(view, table, hp_.n_expert, ws.xn.as<const float>(), p.ids(il), ws.wts.as<const float>(),
                               p.n, k_used, ws.moe_out.as<float>(), ws.moe_scratch.data(), ws.moe_scratch.bytes(),
                               stream());
    });
    return;
  }
  op(p, [&] { moe::moe_gate_up(view, table, ws.xn.as<const float>(), p.ids(il), p.n, k_used, ws.h.as<float>(), stream()); });
  op(p, [&] {
    moe::moe_down(view, table, ws.h.as<const float>(), p.ids(il), ws.wts.as<const float>(), p.n, k_used,
                  ws.moe_out.as<float>(), stream());
  });
}

void CudaQwen3Next::add_ffn_out(const Pass& p) const {
  NextWorkspace& ws = p.ws;
  note_launch(dev_->compute(), {ws.moe_out.span(), ws.tmp.span(), ws.sh_logit.span()}, {ws.x.span()});
  op(p, [&] { ops::add_inplace(ws.x.as<float>(), ws.moe_out.as<const float>(), p.n * hp_.n_embd, stream()); });
  op(p, [&] {
    gdn::add_sigmoid_scaled(ws.x.as<float>(), ws.tmp.as<const float>(), ws.sh_logit.as<const float>(), p.n, hp_.n_embd,
                            stream());
  });
}

void CudaQwen3Next::output(const Pass& p) const {
  if (p.n_out == 0) return;
  NextWorkspace& ws = p.ws;
  const StepLayout sl(p.n);
  note_launch(dev_->compute(), {ws.x.span(), ws.step_in.span()}, {ws.xn.span()});
  op(p, [&] {
    quant::get_rows(GgmlType::F32, ws.x.data(), hp_.n_embd, p.step<const int32_t>(sl.rows), p.n_out, ws.xn.as<float>(),
                    stream());
  });
  note_launch(dev_->compute(), {ws.xn.span(), output_norm_.buf.span()}, {ws.xn.span()});
  op(p, [&] {
    ops::rmsnorm(ws.xn.as<const float>(), output_norm_.f32(), p.n_out, hp_.n_embd, hp_.rms_eps, ws.xn.as<float>(),
                 stream());
  });
  mm(p, *out_w_, ws.xn, p.n_out, ws.logits);
}

void CudaQwen3Next::layer_front(const Pass& p, int il) const {
  const Layer& l = layers_[size_t(il)];
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  const int64_t n = p.n, E = hp_.n_embd;
  note_launch(cs, {ws.x.span(), l.attn_norm.buf.span()}, {ws.xn.span()});
  op(p, [&] { ops::rmsnorm(ws.x.as<const float>(), l.attn_norm.f32(), n, E, hp_.rms_eps, ws.xn.as<float>(), stream()); });
  if (l.recurrent)
    gdn_block(p, l);
  else
    attention_block(p, l);
  note_launch(cs, {ws.tmp.span()}, {ws.x.span()});
  op(p, [&] { ops::add_inplace(ws.x.as<float>(), ws.tmp.as<const float>(), n * E, stream()); });
  route(p, il);
}

void CudaQwen3Next::compute_resident(const Pass& p) const {
  embed(p);
  for (int il = 0; il < np_.n_layer; ++il) {
    layer_front(p, il);
    gpu_experts(p, il);
    shared_expert(p, layers_[size_t(il)]);
    add_ffn_out(p);
  }
  output(p);
}

// As qwen3moe_cuda.cpp run_graph (its comment says why a graph survives residency changes and what
// invalidates it), with one difference: the GDN ops get each sequence's conv and delta-rule state as
// kernel arguments, so the key holds the runs (token ranges and state addresses). Every other per-step
// input (tokens, positions, KV refs, logit rows, the residency table's contents) is read from device
// memory. The zeroing of a fresh sequence's state is a transfer enqueued before the launch, not part of
// the graph.
void CudaQwen3Next::run_graph(const Pass& p) const {
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  const void* slots = cache_->slots_span().ptr;
  const void* table = cache_->table_span().ptr;
  if (ws.graphs_model != model_id_ || ws.graphs_slots != slots || ws.graphs_table != table ||
      ws.graphs.size() >= kMaxGraphs) {
    ws.graphs.clear();
    ws.graphs_model = model_id_;
    ws.graphs_slots = slots;
    ws.graphs_table = table;
  }
  NextWorkspace::GraphKey key{p.n, p.n_out, int(p.attn), attn_tile::prefill_mma(), quant::generic_only(), {}};
  for (int64_t r = 0; r < p.n_runs; ++r) {
    const Run& run = ws.runs[size_t(r)];
    key.runs.emplace_back(run.t0, run.t1, run.st->conv.data(), run.st->ssm.data());
  }
  auto it = ws.graphs.find(key);
  if (it == ws.graphs.end()) {
    // The checker's notes are taken while capturing: the launch below follows them on the same stream.
    Graph g = Graph::capture(cs, [&] { compute_resident(p); });
    ++work_.captures;
    it = ws.graphs.emplace(std::move(key), std::move(g)).first;
  } else if (strata::stream_check::enabled()) {
    compute_resident(Pass{ws, p.n, p.n_out, p.n_runs, p.attn, false});  // the replayed launches' notes only
  }
  it->second.launch(cs);
  ++work_.graph_forwards;
}

// As the CPU-pool branch of qwen3moe_cuda.cpp forward(): routing, weights and activations go to the host
// (the host waits for them before it enqueues anything that rewrites xn or the layer's ids), the
// non-resident pairs run on CPU threads, their sum goes up and is added to x on the compute stream.
void CudaQwen3Next::pool_experts(const Pass& p, int il, ThreadPool& pool, const ForwardOptions& opt) const {
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  const Layer& l = layers_[size_t(il)];
  const int64_t n = p.n, E = hp_.n_embd, nk = n * hp_.n_expert_used;
  const size_t ib = size_t(nk) * 4, ioff = size_t(il) * ib;
  const Ticket t_ids = xfer_->download(slice(ws.ids_h, ioff, ib), slice(ws.ids, ioff, ib), cs);
  const Ticket t_wts = xfer_->download(head(ws.wts_h, size_t(nk) * 4), head(ws.wts, size_t(nk) * 4), cs);
  const Ticket t_xn = xfer_->download(head(ws.xn_h, size_t(n * E) * 4), head(ws.xn, size_t(n * E) * 4), cs);
  work_.transfers += 3;
  const strata::moe::Residency& res = cache_->residency();
  const int n_res = res.resident_in_layer(il);
  if (n_res > 0) gpu_experts(p, il);
  shared_expert(p, l);  // reads xn, writes tmp / sh_*: nothing the downloads read
  t_ids.wait();
  t_wts.wait();
  t_xn.wait();
  ws.ids_h.note_host_access(strata::stream_check::Access::Read);
  ws.wts_h.note_host_access(strata::stream_check::Access::Read);
  ws.xn_h.note_host_access(strata::stream_check::Access::Read);
  const int32_t* hid = ws.ids_h.as<const int32_t>() + size_t(il) * size_t(nk);
  const int32_t* row = res.layer_row(il);
  int64_t n_cpu = 0;
  for (int64_t i = 0; i < nk; ++i) {
    STRATA_REQUIRE(hid[i] >= 0 && hid[i] < hp_.n_expert, "cuda: router of layer {} gave expert id {}", il, hid[i]);
    const bool on_gpu = row[hid[i]] >= 0;
    ws.ids_cpu[size_t(i)] = on_gpu ? -1 : hid[i];
    n_cpu += !on_gpu;
  }
  cache_->record(il, hid, nk);
  if (opt.usage) opt.usage->add(il, hid, n);
  ws.layer_recorded[size_t(il)] = 1;
  // x += moe_out (the resident pairs; zero when none ran: the kernels are skipped, so add only if they
  // ran) + sigmoid(sh_logit) * shared expert
  note_launch(cs, {ws.tmp.span(), ws.sh_logit.span()}, {ws.x.span()});
  if (n_res > 0) {
    note_launch(cs, {ws.moe_out.span()}, {ws.x.span()});
    op(p, [&] { ops::add_inplace(ws.x.as<float>(), ws.moe_out.as<const float>(), n * E, stream()); });
  }
  op(p, [&] {
    gdn::add_sigmoid_scaled(ws.x.as<float>(), ws.tmp.as<const float>(), ws.sh_logit.as<const float>(), n, E, stream());
  });
  if (n_cpu == 0) return;  // this batch only picked resident experts
  if (ws.partial_ticket.valid()) ws.partial_ticket.wait();  // the previous upload has read partial_h
  ws.partial_h.note_host_access(strata::stream_check::Access::Write);
  moe_experts(l.experts, ws.xn_h.as<const float>(), n, ws.ids_cpu.data(), ws.wts_h.as<const float>(),
              hp_.n_expert_used, ws.partial_h.as<float>(), ws.moe, ws.mb, pool, opt.mode);
  ws.partial_ticket =
      xfer_->upload(head(ws.partial, size_t(n * E) * 4), head(ws.partial_h, size_t(n * E) * 4), cs, {&cs});
  ++work_.transfers;
  note_launch(cs, {ws.partial.span()}, {ws.x.span()});
  op(p, [&] { ops::add_inplace(ws.x.as<float>(), ws.partial.as<const float>(), n * E, stream()); });
}

void CudaQwen3Next::forward(const Batch& batch, Workspace& wsb, float* logits, ThreadPool& pool,
                            const ForwardOptions& opt) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto t_start = std::chrono::steady_clock::now();
  dev_->make_current();
  auto& ws = static_cast<NextWorkspace&>(wsb);
  const HParams& hp = hp_;
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  STRATA_REQUIRE(n >= 1 && n <= ws.n_tok_max, "forward: batch of {} tokens, workspace holds {}", n, ws.n_tok_max);
  const int64_t V = hp.n_vocab;
  const int64_t nk = n * hp.n_expert_used;
  STRATA_REQUIRE(!opt.usage || (opt.usage->n_layer() >= np_.n_layer && opt.usage->n_expert() == hp.n_expert &&
                                opt.usage->n_expert_used() == hp.n_expert_used),
                 "forward: expert-usage counter shaped for another model");
  const StepLayout sl(n);
  auto* refs_host = reinterpret_cast<ops::KvRef*>(ws.step_host.data() + sl.refs);
  auto* tok_host = reinterpret_cast<int32_t*>(ws.step_host.data() + sl.tokens);
  auto* pos_host = reinterpret_cast<int32_t*>(ws.step_host.data() + sl.pos);
  auto* rows_host = reinterpret_cast<int32_t*>(ws.step_host.data() + sl.rows);
  int64_t n_out = 0, n_runs = 0;
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& bt = batch.tokens[size_t(t)];
    STRATA_REQUIRE(bt.seq >= 0 && size_t(bt.seq) < batch.seqs.size(), "forward: bad sequence index");
    SequenceState& seq = *batch.seqs[size_t(bt.seq)];
    STRATA_REQUIRE(bt.pos >= 0 && bt.pos < seq.n_ctx() && bt.pos < ws.n_ctx_max, "forward: position {} outside the context",
                   bt.pos);
    STRATA_REQUIRE(bt.token >= 0 && bt.token < hp.n_vocab,
                   "token id {} is out of range: the vocabulary has {} tokens (0..{})", bt.token, hp.n_vocab,
                   hp.n_vocab - 1);
    auto* st = dynamic_cast<DeviceState*>(seq.backend_state());
    STRATA_REQUIRE(st != nullptr, "forward: sequence {} was not made by this CUDA model", bt.seq);
    // Runs of consecutive tokens of one sequence, continuing where its recurrent state stopped (as
    // model/qwen3next.cpp collect_runs, same errors).
    if (n_runs > 0 && batch.tokens[size_t(t - 1)].seq == bt.seq) {
      STRATA_REQUIRE(bt.pos == batch.tokens[size_t(t - 1)].pos + 1,
                     "forward: qwen3next needs each sequence's tokens in order (position {} after {})", bt.pos,
                     batch.tokens[size_t(t - 1)].pos);
      ws.runs[size_t(n_runs - 1)].t1 = int32_t(t + 1);
    } else {
      for (int64_t r = 0; r < n_runs; ++r)
        STRATA_REQUIRE(ws.runs[size_t(r)].st != st,
                       "forward: qwen3next needs each sequence's tokens contiguous in the batch");
      STRATA_REQUIRE(bt.pos == seq.n_past(),
                     "forward: qwen3next's recurrent state holds {} tokens, the batch continues at position {}",
                     seq.n_past(), bt.pos);
      ws.runs[size_t(n_runs++)] = {int32_t(t), int32_t(t + 1), st, bt.pos == 0};
    }
    tok_host[t] = bt.token;
    pos_host[t] = bt.pos;
    refs_host[t] = {st->k.as<uint16_t>(), st->v.as<uint16_t>(), seq.n_ctx(), bt.pos};
    if (bt.logits) rows_host[n_out++] = int32_t(t);
  }
  for (int64_t t = n_out; t < n; ++t) rows_host[t] = 0;  // unused entries: defined bytes
  Stream& cs = dev_->compute();
  const strata::moe::Residency& res = cache_->residency();

  // Leftovers of a forward pass that threw half-way: its copies must be done before buffers are reused.
  if (ws.ids_ticket.valid()) ws.ids_ticket.wait(), ws.ids_ticket = Ticket();
  if (ws.partial_ticket.valid()) ws.partial_ticket.wait(), ws.partial_ticket = Ticket();
  cache_->begin_step();  // host and device tables fixed from here to end_step()
  ++work_.forwards;
  // A sequence starting at position 0 starts from a zero recurrent state (a new or reset sequence; its
  // device state may hold an earlier conversation's). Ordered on compute before this pass's kernels.
  for (int64_t r = 0; r < n_runs; ++r) {
    const Run& run = ws.runs[size_t(r)];
    if (!run.fresh) continue;
    xfer_->fill(run.st->conv.span(), 0, cs, {&cs});
    xfer_->fill(run.st->ssm.span(), 0, cs, {&cs});
    work_.transfers += 2;
  }
  // All inputs of the pass in one copy (producer = consumer = compute).
  xfer_->upload(head(ws.step_in, sl.bytes), ws.step_host.data(), sl.bytes, cs, {&cs});
  ++work_.transfers;
  std::fill(ws.layer_recorded.begin(), ws.layer_recorded.end(), uint8_t(0));

  const Pass p{ws, n, n_out, n_runs, opt.attn, true};
  bool all_resident = true;
  for (int il = 0; il < np_.n_layer && all_resident; ++il) all_resident = res.resident_in_layer(il) == hp.n_expert;
  if (all_resident && graphs_ && n <= kMaxGraphTokens) {
    run_graph(p);
  } else if (all_resident) {
    compute_resident(p);
  } else {
    embed(p);
    for (int il = 0; il < np_.n_layer; ++il) {
      layer_front(p, il);
      if (res.resident_in_layer(il) == hp.n_expert) {
        // Every expert of the layer is resident: all on the GPU. The ids go to the host with the other
        // layers' after the last layer (statistics, adaptation).
        gpu_experts(p, il);
        shared_expert(p, layers_[size_t(il)]);
        add_ffn_out(p);
      } else {
        pool_experts(p, il, pool, opt);
      }
    }
    output(p);
  }
  // Routing of the fully resident layers: one download of every layer's ids (the CPU pool's layers'
  // slices come along unchanged), read after the end-of-forward wait.
  bool any_unrecorded = false;
  for (uint8_t r : ws.layer_recorded) any_unrecorded |= r == 0;
  if (any_unrecorded) {
    const size_t ib = size_t(np_.n_layer) * size_t(nk) * 4;
    ws.ids_ticket = xfer_->download(head(ws.ids_h, ib), head(ws.ids, ib), cs);
    ++work_.transfers;
  }
  const auto t_wait = std::chrono::steady_clock::now();
  if (n_out > 0) {
    const size_t lb = size_t(n_out) * size_t(V) * 4;
    xfer_->download(head(ws.logits_h, lb), head(ws.logits, lb), cs).wait();
    ++work_.transfers;
    ws.logits_h.note_host_access(strata::stream_check::Access::Read);
    std::memcpy(logits, ws.logits_h.data(), lb);
  } else {
    cs.synchronize();
  }
  const auto t_waited = std::chrono::steady_clock::now();
  if (ws.ids_ticket.valid()) {
    ws.ids_ticket.wait();
    ws.ids_ticket = Ticket();
    ws.ids_h.note_host_access(strata::stream_check::Access::Read);
    for (int il = 0; il < np_.n_layer; ++il) {
      if (ws.layer_recorded[size_t(il)]) continue;
      const int32_t* hid = ws.ids_h.as<const int32_t>() + size_t(il) * size_t(nk);
      cache_->record(il, hid, nk);
      if (opt.usage) opt.usage->add(il, hid, n);
    }
  }
  if (ws.partial_ticket.valid()) {
    ws.partial_ticket.wait();
    ws.partial_ticket = Ticket();
  }
  cache_->end_step();
  work_.wait += t_waited - t_wait;
  work_.host += (t_wait - t_start) + (std::chrono::steady_clock::now() - t_waited);
}

}  // namespace

std::unique_ptr<Model> make_qwen3next_cuda(gguf::File file, const CudaOptions& opt) {
  HParams hp = read_common_hparams(file);
  STRATA_REQUIRE(hp.arch == "qwen3next", "{}: architecture '{}' is not qwen3next", file.path(), hp.arch);
  NextParams np = qwen3next::read_next_params(file, hp);
  return std::make_unique<CudaQwen3Next>(std::move(file), std::move(hp), std::move(np), opt);
}

}  // namespace strata::cuda
