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
#include <map>
#include <mutex>
#include <tuple>

#include "common/error.h"
#include "cpu/matmul_batch.h"
#include "cuda/backend.h"
#include "cuda/cache_setup.h"
#include "cuda/device.h"
#include "cuda/expert_cache.h"
#include "cuda/gdn.cuh"
#include "cuda/attn_tile.cuh"
#include "cuda/gemm_context.h"
#include "cuda/host/attn_span.h"
#include "cuda/graph.h"
#include "cuda/model_common.h"
#include "cuda/moe_model_base.h"
#include "cuda/moe_kernels.cuh"
#include "cuda/next_fused.cuh"
#include "cuda/ops.cuh"
#include "cuda/ops_fused.cuh"
#include "cuda/pdl_scope.h"
#include "cuda/pool_io.h"
#include "cuda/q8_kernels.cuh"
#include "cuda/quant_kernels.cuh"
#include "cuda/transfer.h"
#include "model/moe_ffn.h"
#include "model/qwen3next_weights.h"
#include "model/weights.h"
#include "moe/stream_plan.h"

namespace strata::cuda {
namespace {

using qwen3next::NextParams;

// Batches of up to this many tokens (decode) run as a CUDA graph when no layer needs the CPU pool (as
// qwen3moe_cuda.cpp); larger ones are prefill, whose launch overhead does not matter.
constexpr int64_t kMaxGraphTokens = 8;
// Graphs kept per workspace: one per (batch shape, sequences), so a server cycling through many
// conversations would otherwise collect them without bound; past this many the cache starts over.
constexpr size_t kMaxGraphs = 64;

// Dense products that read one input, stacked at load into as few device matrices as their kept types
// allow (a stack is one type and one width, so one row size). Two output layouts for a pass of n tokens:
//   per part: part i as [n][rows_i] at y + n * col_i (one product per part: the values of separate
//     matrices; the exact mode and any consumer that needs contiguous rows);
//   stacked: stack s as [n][rows_s] at y + n * col_s (col of its first part), part i inside it at
//     column col_i - col_s with row stride rows_s (one product per stack: fewer launches).
// The parts of a stack have consecutive cols, so for one token the two layouts are the same.
struct Proj {
  struct Part {
    int stack;    // index into stacks
    int64_t row0;  // first row of the part in its stack
    int64_t rows;  // the part's [rows][cols]
    int64_t col;   // offset of its output (values): y + n * col
  };
  std::vector<DevWeight> stacks;  // [sum of its parts' rows][cols], one type each
  std::vector<int64_t> stack_col;  // col of each stack's first part
  std::vector<Part> parts;         // in the order given at load
  int64_t rows = 0;                // sum over the parts (the output's values per token)
};

// The shared expert in one buffer laid out as an expert-cache slot, so that the int8-activation MoE
// kernels can run it as a one-expert layer (fast decode: swiglu, the Q8 h and the sigmoid-gated add into x
// inside q8::moe_gate_up / moe_down); the other paths run its three products from the same bytes.
struct SharedExpert {
  DeviceBuffer buf;                          // gate [F][n_embd] at 0 | up [F][n_embd] | down [n_embd][F]
  GgmlType gate_t{}, up_t{}, down_t{};       // kept types
  int64_t up_off = 0, down_off = 0;          // byte offsets (16-byte aligned)
  int64_t n_ff = 0, n_embd = 0;              // F, n_embd
  bool gate_up_stacked = false;              // same type and up right after gate: one [2F][n_embd] matrix
  moe::ExpertLayerView view;                 // buf as slot 0 (slot_bytes = the buffer)
  bool q8 = false;                           // fast mode and q8::use_moe(view)
};

struct GdnLayer {
  Proj proj;          // attn_qkv [conv_dim] | attn_gate (z) [value_dim] | ssm_ba [2*Hv], all [..][n_embd]
                      // (legacy ssm_in: its q|k|v and z rows, regrouped at load)
  DevWeight conv;     // [conv_dim][K] f32    ssm_conv1d
  DevWeight a;        // [Hv] f32             ssm_a
  DevWeight dt_bias;  // [Hv] f32             ssm_dt.bias
  DevWeight norm;     // [D] f32              ssm_norm
  DevWeight out;      // [n_embd][value_dim]  ssm_out
};

struct AttnLayer {
  Proj proj;         // attn_q [n_head*2*head_dim] (query and output gate per head) | attn_k
                     // [n_head_kv*head_dim] | attn_v [n_head_kv*head_dim_v], all [..][n_embd]
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
  Proj route;             // ffn_gate_inp [n_expert] | ffn_gate_inp_shexp [1] (the shared expert's logit),
                          // both [..][n_embd]
  SharedExpert shexp;     // ffn_{gate,up,down}_shexp
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
  int64_t E, C, Kd, Vd, Hv, gproj, aproj, rproj, q, rope, att, ids, h, fs, logits, scratch, n;
  int64_t xq, hq;  // int8 values of the Q8 activations of the fast decode (dense inputs; expert h)
  WsSizes(const HParams& hp, const NextParams& np, int64_t n_tok, int64_t n_ctx)
      : E(n_tok * hp.n_embd),
        C(n_tok * np.conv_dim()),
        Kd(n_tok * np.key_dim()),
        Vd(n_tok * np.value_dim()),
        Hv(n_tok * np.n_v_heads),
        gproj(n_tok * (np.conv_dim() + np.value_dim() + 2 * np.n_v_heads)),
        aproj(n_tok * (int64_t(hp.n_head) * 2 * hp.head_dim + int64_t(hp.n_head_kv) * (hp.head_dim + hp.head_dim_v))),
        rproj(n_tok * (hp.n_expert + 1)),
        q(n_tok * hp.n_head * hp.head_dim),
        rope(n_tok * hp.n_rot),
        att(n_tok * hp.n_head * hp.head_dim_v),
        ids(n_tok * hp.n_expert_used),
        h(n_tok * hp.n_expert_used * hp.n_ff_exp),
        fs(n_tok * np.n_ff_shexp),
        logits(n_tok * hp.n_vocab),
        scratch(int64_t(ops::attention_scratch_floats(n_tok, hp.n_head, hp.head_dim_v, n_ctx))),
        n(n_tok),
        xq(n_tok * std::max({int64_t(hp.n_embd), np.value_dim(), int64_t(hp.n_head) * hp.head_dim_v})),
        hq(std::max(h, fs)) {}
  // Bytes of Q8 activations of `values` int8 values: the values and one float2 per 32.
  static int64_t q8_bytes(int64_t values) { return values + (values + 31) / 32 * 8; }
  // x xn tmp moe_out partial; gproj; conv; gv go; g beta; gq gk; aproj; q qgate rope att; rproj; ids per
  // layer + wts; h; sh_g (gate | up); sh_w, sh_ids; logits; scratch; step inputs; route counter; the Q8
  // activations (fast mode only; counted always).
  int64_t device_bytes(int n_layer) const {
    return 4 * (5 * E + gproj + C + 2 * Vd + 2 * Hv + 2 * Kd + aproj + 2 * q + rope + att + rproj +
                ids * (n_layer + 1) + h + 2 * fs + 2 * n + logits + scratch + 3 * n + 1) +
           n * int64_t(sizeof(ops::KvRef)) + q8_bytes(xq) + q8_bytes(hq);
  }
};

class NextWorkspace final : public Workspace, public PoolIo {
 public:
  NextWorkspace(Device& dev, const HParams& hp, const NextParams& np, int32_t max_tok, int32_t n_ctx,
                int n_threads, bool prefill_paths, size_t moe_scratch_bytes, bool q8_paths)
      : PoolIo(dev, np.n_layer, max_tok, hp, n_threads), n_tok_max(max_tok), n_ctx_max(n_ctx) {
    const WsSizes z(hp, np, max_tok, n_ctx);
    auto f32 = [&](int64_t values, const char* name) { return dev.alloc(size_t(std::max<int64_t>(values, 1)) * 4, name); };
    x = f32(z.E, "ws.x");
    xn = f32(z.E, "ws.xn");
    tmp = f32(z.E, "ws.tmp");
    gproj = f32(z.gproj, "ws.gproj");
    conv = f32(z.C, "ws.conv");
    g = f32(z.Hv, "ws.g");
    beta = f32(z.Hv, "ws.beta");
    gq = f32(z.Kd, "ws.gq");
    gk = f32(z.Kd, "ws.gk");
    gv = f32(z.Vd, "ws.gv");
    go = f32(z.Vd, "ws.go");
    aproj = f32(z.aproj, "ws.aproj");
    q = f32(z.q, "ws.q");
    qgate = f32(z.q, "ws.qgate");
    rope_cs = f32(z.rope, "ws.rope_cs");
    att = f32(z.att, "ws.att");
    rproj = f32(z.rproj, "ws.rproj");
    h = f32(z.h, "ws.h");
    moe_out = f32(z.E, "ws.moe_out");
    sh_g = f32(2 * z.fs, "ws.sh_g");
    sh_w = f32(z.n, "ws.sh_w");
    sh_ids = dev.alloc(size_t(z.n) * 4, "ws.sh_ids");  // zeroed by new_workspace
    if (q8_paths) {
      xq = dev.alloc(size_t(z.xq), "ws.xq");
      xds = dev.alloc(size_t(z.xq / 32) * sizeof(float2), "ws.xds");
      hq = dev.alloc(size_t(z.hq), "ws.hq");
      hds = dev.alloc(size_t(z.hq / 32) * sizeof(float2), "ws.hds");
    }
    step_in = dev.alloc(StepLayout(max_tok).bytes, "ws.step_in");
    route_counter = dev.alloc(4, "ws.route_counter");  // zeroed by new_workspace
    attn_scratch = f32(z.scratch, "ws.attn_scratch");
    step_host.resize(StepLayout(max_tok).bytes);
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
    size_t b = PoolIo::memory_bytes() + moe_scratch.bytes();
    for (const DeviceBuffer* d : {&x, &xn, &tmp, &gproj, &conv, &g, &beta, &gq, &gk, &gv, &go, &aproj, &q, &qgate,
                                  &rope_cs, &att, &rproj, &h, &moe_out, &sh_g, &sh_w, &sh_ids, &step_in,
                                  &route_counter, &attn_scratch, &xq, &xds, &hq, &hds})
      b += d->bytes();
    return b;
  }

  int32_t n_tok_max, n_ctx_max;
  // (PoolIo: ids, wts, partial, logits and their host copies)
  // device, f32 unless said
  DeviceBuffer x, xn, tmp;      // [n_tok][n_embd] residual stream, normed input, sub-block output
  DeviceBuffer gproj;           // GdnLayer::proj's output: qkv [n_tok][conv_dim], z [n_tok][Hv][D], ba [n_tok][2*Hv]
  DeviceBuffer conv;            // [n_tok][conv_dim] after conv1d + SiLU (prefill-sized runs only)
  DeviceBuffer g, beta;         // [n_tok][Hv] log-decay, write strength
  DeviceBuffer gq, gk;          // [n_tok][Hk][D] L2-normalised
  DeviceBuffer gv, go;          // [n_tok][Hv][D] values, delta-rule output (then gated-normed in place)
  DeviceBuffer aproj;           // AttnLayer::proj's output: qg [n_tok][n_head][2*head_dim],
                                // k [n_tok][n_head_kv][head_dim], v [n_tok][n_head_kv][head_dim_v]
  DeviceBuffer q, qgate;        // [n_tok][n_head][head_dim]
  DeviceBuffer rope_cs;         // [n_tok][n_rot/2][2] the batch's rope angles (ops::rope_cos_sin)
  DeviceBuffer att;             // [n_tok][n_head][head_dim_v]
  DeviceBuffer rproj;           // Layer::route's output: router logits [n_tok][n_expert], shared logit [n_tok]
  DeviceBuffer h;               // [n_tok * k][n_ff] resident experts' silu(gate) * up
  DeviceBuffer moe_out;         // [n_tok][n_embd] resident experts' weighted sum
  DeviceBuffer sh_g;            // shared expert gate [n_tok][n_ff_shexp] (then swiglu), up [n_tok][n_ff_shexp]
                                // (one token: gate | up of the stacked product, the same places)
  DeviceBuffer sh_w;            // [n_tok] sigmoid(shared logit): the one-expert moe_down's weight (q8)
  DeviceBuffer sh_ids;          // [n_tok] int32 zeros: every token's "expert" is the shared one (q8)
  // Q8 activations (q8_kernels.cuh layout) of the fast decode; empty in exact mode:
  DeviceBuffer xq, xds;         // [n_tok][max(n_embd, value_dim, n_head*head_dim_v)] int8, [..][../32] float2:
                                // the input of the next dense product (a normed x, the gated-normed GDN
                                // output, the gated attention output)
  DeviceBuffer hq, hds;         // [max(n_tok*k*n_ff, n_tok*n_ff_shexp)] int8 (+ float2 per 32): expert h
  DeviceBuffer step_in;         // StepLayout(n): refs, tokens, positions, logit rows of the batch
  DeviceBuffer route_counter;   // uint32, zero between launches: ops::router_route's last-block ticket
  DeviceBuffer attn_scratch;    // ops::attention_scratch_floats(n_tok, n_head, head_dim_v, n_ctx)
  std::unique_ptr<GemmContext> gemm;  // prefill dense products (null: exact mode or small batches)
  DeviceBuffer moe_scratch;           // moe::moe_grouped_scratch_bytes for the largest layer
  // host
  std::vector<uint8_t> step_host;       // StepLayout(n), filled by forward() and uploaded in one copy
  std::vector<Run> runs;                // [<= n_tok]
  // CUDA graphs of the compute section (CudaQwen3Next::run_graph). Besides what qwen3moe's key holds,
  // the key names each run's tokens and its sequence's state buffers: the GDN ops take the state
  // pointers as kernel arguments, so a graph is valid for those sequences' device state only (an address
  // reused by a later sequence holds a state of the same layout, so the graph is right for it too).
  struct GraphKey {
    int64_t n, n_out;
    int64_t span;  // Pass::kv_span: the attention kernels' split count and chunk
    int attn;
    bool mma, generic;  // attn_tile::prefill_mma(), quant::generic_only(): process-wide switches
    std::vector<std::tuple<int32_t, int32_t, const void*, const void*>> runs;  // t0, t1, conv, ssm
    std::vector<uint8_t> layers;  // a gated pass (forward_gated): each layer's kind (gated_layer_kinds); else empty
    bool operator<(const GraphKey& o) const {
      return std::tie(n, n_out, span, attn, mma, generic, runs, layers) <
             std::tie(o.n, o.n_out, o.span, o.attn, o.mma, o.generic, o.runs, o.layers);
    }
  };
  std::map<GraphKey, Graph> graphs;
  uint64_t graphs_model = 0;           // CudaQwen3Next::model_id_ of the model that captured them
  const void* graphs_slots = nullptr;  // the expert cache's slot and table allocations they read
  const void* graphs_table = nullptr;
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

class CudaQwen3Next final : public CudaMoeModel {
 public:
  CudaQwen3Next(gguf::File file, HParams hp, NextParams np, const CudaOptions& opt)
      : CudaMoeModel(std::move(file), std::move(hp), opt), np_(std::move(np)) {
    load();
    loaded_ = true;
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
    const size_t moe_scratch = grouped_scratch_bytes(np_.n_layer, max_tokens, prefill_paths);
    auto ws = std::make_unique<NextWorkspace>(*dev_, hp_, np_, max_tokens, n_ctx, n_threads, prefill_paths,
                                              moe_scratch, /*q8_paths=*/!opt_.exact);
    std::lock_guard<std::mutex> lock(mu_);  // the transfer module is used by one thread at a time (forward)
    Stream& cs = dev_->compute();
    xfer_->fill(ws->sh_ids.span(), 0, cs, {&cs});  // ordered before every forward on compute
    xfer_->fill(ws->route_counter.span(), 0, cs, {&cs});
    return ws;
  }
  int32_t routed_layers() const override { return np_.n_layer; }  // the MTP blocks do not run
  ExpertCacheReport cache_report() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return cache_report_locked(np_.n_layer);
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
    int64_t kv_span;   // attention's max_kv (cuda/host/attn_span.h)
    cpu::AttnMath attn;
    bool launch;
    bool pool = false;  // the pass runs the CPU pool (some layer's experts are not all resident)
    int direct = 0;     // direct reads of non-resident experts (moe/direct_rule.h share; 0: none)
    Pass notes_only() const {  // the same pass with launch off: ops only take their stream-order notes
      Pass q = *this;
      q.launch = false;
      return q;
    }
    template <typename T>
    T* step(size_t offset) const {  // a field of ws.step_in (StepLayout(n))
      return reinterpret_cast<T*>(static_cast<char*>(ws.step_in.data()) + offset);
    }
    int32_t* ids(int il) const {  // layer il's [n][k] in ws.ids
      return ws.ids.as<int32_t>() + size_t(il) * size_t(n) * size_t(ws.k_used);
    }
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
  void gdn_block(const Pass& p, const Layer& l) const;        // ws.xn (xq) -> x += block output
  void attention_block(const Pass& p, const Layer& l) const;  // ws.xn (xq) -> x += block output
  void route(const Pass& p, int il) const;          // post norm -> ws.xn, router, top-k -> ids(il), ws.wts
  // ws.xn -> ws.tmp (ungated; the sigmoid gate is applied in add_ffn_out), or with shexp_q8 straight into
  // x, gated (one-expert q8 MoE launches)
  void shared_expert(const Pass& p, const Layer& l) const;
  // resident experts from their slots -> ws.moe_out, or with experts_q8 added into x; with staged_row
  // through the streaming pass's own table row (ws.stage_row: resident and staged experts)
  void gpu_experts(const Pass& p, int il, bool staged_row = false) const;
  // x += moe_out + sigmoid(shared logit) * tmp, for the parts that did not add into x themselves (q8)
  void add_ffn_out(const Pass& p, int il) const;
  void add_shared_out(const Pass& p, const Layer& l) const;  // x += sigmoid(shared logit) * tmp (not q8)
  // The post-attention norm's output is taken as Q8 activations by some product of the layer's FFN part.
  bool ffn_q8_input(const Pass& p, int il) const;
  void output(const Pass& p) const;                 // rows that want logits -> ws.logits
  void layer_front(const Pass& p, int il) const;    // attn norm, GDN or attention block (+ residual), route
  void compute_resident(const Pass& p) const;       // the whole pass when every expert is resident
  void run_graph(const Pass& p) const;              // compute_resident as a (cached) CUDA graph
  // The workspace's graph cache, emptied if made for another model or allocation, or full; key of a pass.
  void prepare_graphs(NextWorkspace& ws) const;
  NextWorkspace::GraphKey graph_key(const Pass& p) const;
  // Gated CPU-pool passes, as qwen3moe_cuda.cpp's (docs/gpu.md "Gated passes"): piece k of the pass over
  // its CPU-pool layers pl: piece 0 starts with the embedding, piece k > 0 with the gated add of pool
  // layer pl[k-1]'s partial into x; then the layers up to pl[k] on the GPU alone, and pool layer pl[k]'s
  // front, signaled download, resident experts and shared expert; the last piece ends with the output.
  void gated_piece(const Pass& p, const PoolCtx& pc, const std::vector<uint8_t>& kinds, const std::vector<int>& pl,
                   size_t k) const;
  void forward_gated(const Pass& p, ThreadPool& pool, const ForwardOptions& opt) const;
  // The CPU pool's part of layer il's routed experts (the GPU runs the resident pairs meanwhile):
  // downloads routing and activations, runs the others on CPU threads, uploads and adds their sum.
  void pool_experts(const Pass& p, int il, ThreadPool& pool, const ForwardOptions& opt) const;

  void load();
  DevWeight upload(const Weight& w, const std::string& name, RepackLog& log) {
    return upload_matrix(*dev_, *xfer_, w, name, opt_.exact, log);
  }
  // A dense matrix's bytes as the GPU keeps it (model_common.h host_matrix).
  HostMatrix host_rows(const Weight& w, const std::string& name, RepackLog& log) const {
    return host_matrix(w, name, opt_.exact, log);
  }
  // The matrices of `parts` (all [..][cols], one input) as a Proj: parts of one kept type and width share a
  // stack, in the order given.
  Proj upload_proj(const std::vector<std::pair<const Weight*, std::string>>& parts, RepackLog& log);
  SharedExpert upload_shexp(const Weight& gate, const Weight& up, const Weight& down, const std::string& name,
                            RepackLog& log);

  // Rows [row0, row0 + rows) of a device matrix, for one product.
  struct MatRef {
    GgmlType type;
    const uint8_t* data;  // row row0
    int64_t rows, cols;
    const DeviceBuffer* buf;  // the whole allocation (the checker's unit)
  };
  static MatRef ref(const DevWeight& w) { return {w.type, w.buf.as<const uint8_t>(), w.rows, w.cols, &w.buf}; }
  static MatRef sub(const DevWeight& w, int64_t row0, int64_t rows) {
    return {w.type, w.buf.as<const uint8_t>() + size_t(row0) * row_bytes(w.type, w.cols), rows, w.cols, &w.buf};
  }
  // y [n][w.rows] = x [n][w.cols] . W^T on the compute stream, at yp (inside y).
  void mm(const Pass& p, const MatRef& w, const DeviceBuffer& x, int64_t n, const DeviceBuffer& y, float* yp,
          Site site = Site::here()) const {
    note_launch(dev_->compute(), {w.buf->span(), x.span()}, {y.span()}, site);
    op(p, [&] {
      quant::matmul(w.type, w.data, w.rows, w.cols, x.as<const float>(), n, yp, stream(), p.ws.gemm.get());
    });
  }
  void mm(const Pass& p, const DevWeight& w, const DeviceBuffer& x, int64_t n, const DeviceBuffer& y,
          Site site = Site::here()) const {
    mm(p, ref(w), x, n, y, y.as<float>(), site);
  }
  // ws.x [n][E] += W . x: one product that adds into ws.x (quant::matmul's accumulate: the same float
  // addition as the product into ws.tmp plus an add; on the cuBLAS path its beta = 1).
  void mm_add_x(const Pass& p, const DevWeight& w, const DeviceBuffer& x, int64_t n, Site site = Site::here()) const {
    NextWorkspace& ws = p.ws;
    note_launch(dev_->compute(), {w.buf.span(), x.span(), ws.x.span()}, {ws.x.span()}, site);
    op(p, [&] {
      quant::matmul(w.type, w.buf.data(), w.rows, w.cols, x.as<const float>(), n, ws.x.as<float>(), stream(),
                    ws.gemm.get(), /*accumulate=*/true);
    });
  }

  // Fast decode with int8 activations, where the weight's type has a kernel (model_common.h says when).
  bool q8_decode(const Pass& p) const {
    return int8_activations(opt_.exact, p.pool, p.n, p.ws.xq.bytes() > 0);
  }
  bool use_q8(const Pass& p, GgmlType t, int64_t cols) const {
    return q8_decode(p) && q8::use_type(t) && cols % 32 == 0;
  }
  bool use_q8(const Pass& p, const DevWeight& w) const { return use_q8(p, w.type, w.cols); }
  bool use_q8(const Pass& p, const Proj& pr) const {  // some product of pr takes the Q8 activations
    for (const DevWeight& w : pr.stacks)
      if (use_q8(p, w)) return true;
    return false;
  }
  bool experts_q8(const Pass& p, int il) const { return q8_decode(p) && q8::use_moe(cache_->layer_view(il)); }
  // The shared expert as a one-expert q8 MoE layer; its gate weight sigmoid(w . xn) by nextf::dot_sigmoid,
  // which takes an F32 ffn_gate_inp_shexp (route part 1).
  bool shexp_q8(const Pass& p, const Layer& l) const {
    return q8_decode(p) && l.shexp.q8 && l.route.stacks[size_t(l.route.parts[1].stack)].type == GgmlType::F32;
  }
  // ws.xn[0, rows) = rmsnorm(x) * w; with quantize also ws.xq/ws.xds = its Q8 activations (one launch).
  void norm(const Pass& p, const DeviceBuffer& x, const DevWeight& w, int64_t rows, bool quantize,
            Site site = Site::here()) const;
  // y (+)= W . x at yp, x given as ws.xq/ws.xds ([n][w.cols] Q8 activations).
  void mm_q8(const Pass& p, const MatRef& w, int64_t n, const DeviceBuffer& y, float* yp, bool accumulate,
             Site site = Site::here()) const;
  // W . xn at yp, through the Q8 activations when use_q8 (they must hold xn's then).
  void mm_any(const Pass& p, const MatRef& w, int64_t n, const DeviceBuffer& y, float* yp,
              Site site = Site::here()) const {
    if (use_q8(p, w.type, w.cols))
      mm_q8(p, w, n, y, yp, false, site);
    else
      mm(p, w, p.ws.xn, n, y, yp, site);
  }
  // Every part of pr on xn (xq), in the stacked or the per-part layout (see Proj).
  void project(const Pass& p, const Proj& pr, const DeviceBuffer& y, bool stacked, Site site = Site::here()) const;
  // Part i of pr alone, at y + n * col_i.
  void project_part(const Pass& p, const Proj& pr, size_t i, const DeviceBuffer& y, Site site = Site::here()) const {
    const Proj::Part& part = pr.parts[i];
    mm_any(p, sub(pr.stacks[size_t(part.stack)], part.row0, part.rows), p.n, y, part_out(p, pr, i, y), site);
  }
  // Part i's output in y for this pass, per-part layout.
  static float* part_out(const Pass& p, const Proj& pr, size_t i, const DeviceBuffer& y) {
    return y.as<float>() + p.n * pr.parts[i].col;
  }
  // Part i's output in y in either layout: token t's rows_i values at ptr + t * ld.
  struct PartView {
    float* ptr;
    int64_t ld;
  };
  static PartView part_view(const Pass& p, const Proj& pr, size_t i, const DeviceBuffer& y, bool stacked) {
    const Proj::Part& part = pr.parts[i];
    if (!stacked) return {y.as<float>() + p.n * part.col, part.rows};
    const int64_t sc = pr.stack_col[size_t(part.stack)];
    return {y.as<float>() + p.n * sc + (part.col - sc), pr.stacks[size_t(part.stack)].rows};
  }
  cudaStream_t stream() const { return dev_->compute().handle(); }
  NextParams np_;
  int n_attn_ = 0, n_gdn_ = 0;  // attention / Gated DeltaNet layers
  int stream_min_tokens_ = 4;   // STRATA_CUDA_STREAM_MIN_TOKENS: pairs an expert needs to be streamed
  int direct_share_ = 0;        // CudaOptions::decode_direct (moe/direct_rule.h), 0 where it cannot run
  strata::moe::PrefillStreamMode prefill_stream_;          // CudaOptions::prefill_stream
  mutable strata::moe::PrefillStreamCosts prefill_costs_;  // copy cost measured at load, CPU cost per pair
  qwen3next::Weights host_;  // every tensor of the file, checked (the CPU pool reads the experts here)
  DevWeight tok_embd_;       // [n_vocab][n_embd]
  DevWeight output_norm_;    // [n_embd] f32
  DevWeight output_;         // [n_vocab][n_embd]; empty when tied (out_w_ = &tok_embd_)
  const DevWeight* out_w_ = nullptr;
  std::vector<Layer> layers_;
  DeviceBuffer sh_table_;  // int32 [1] = 0: the shared expert's one-expert residency table (slot 0)
};

Proj CudaQwen3Next::upload_proj(const std::vector<std::pair<const Weight*, std::string>>& parts, RepackLog& log) {
  Proj pr;
  std::vector<HostMatrix> host;
  std::vector<std::vector<size_t>> members;  // per stack: indexes into parts
  for (const auto& [w, name] : parts) {
    host.push_back(host_rows(*w, name, log));
    const HostMatrix& m = host.back();
    int s = 0;
    while (s < int(members.size()) && !(host[members[size_t(s)][0]].type == m.type && host[members[size_t(s)][0]].cols == m.cols))
      ++s;
    if (s == int(members.size())) members.emplace_back();
    members[size_t(s)].push_back(host.size() - 1);
  }
  pr.parts.resize(parts.size());
  Stream& cs = dev_->compute();
  for (size_t s = 0; s < members.size(); ++s) {
    DevWeight d;
    std::string name;
    size_t bytes = 0;
    d.type = host[members[s][0]].type;
    d.cols = host[members[s][0]].cols;
    pr.stack_col.push_back(pr.rows);
    for (size_t i : members[s]) {
      pr.parts[i] = {int(s), d.rows, host[i].rows, pr.rows};
      d.rows += host[i].rows;
      pr.rows += host[i].rows;
      bytes += host[i].bytes;
      name += (name.empty() ? "" : "|") + parts[i].second;
    }
    d.buf = dev_->alloc(bytes, name);
    size_t off = 0;
    for (size_t i : members[s]) {  // staged uploads: the host bytes may go once this returns
      xfer_->upload(slice(d.buf, off, host[i].bytes), host[i].data, host[i].bytes, cs, {&cs});
      off += host[i].bytes;
    }
    pr.stacks.push_back(std::move(d));
  }
  return pr;
}

SharedExpert CudaQwen3Next::upload_shexp(const Weight& gate, const Weight& up, const Weight& down,
                                         const std::string& name, RepackLog& log) {
  SharedExpert sh;
  const HostMatrix g = host_rows(gate, name + "ffn_gate_shexp", log), u = host_rows(up, name + "ffn_up_shexp", log),
                 d = host_rows(down, name + "ffn_down_shexp", log);
  STRATA_REQUIRE(g.rows == u.rows && g.cols == u.cols && d.rows == g.cols && d.cols == g.rows,
                 "cuda: {}: shared expert shapes gate [{}][{}], up [{}][{}], down [{}][{}] do not fit", name, g.rows,
                 g.cols, u.rows, u.cols, d.rows, d.cols);
  auto align16 = [](size_t b) { return (b + 15) / 16 * 16; };
  sh.gate_t = g.type, sh.up_t = u.type, sh.down_t = d.type;
  sh.n_ff = g.rows;
  sh.n_embd = g.cols;
  sh.up_off = int64_t(align16(g.bytes));
  sh.down_off = int64_t(align16(size_t(sh.up_off) + u.bytes));
  const size_t total = align16(size_t(sh.down_off) + d.bytes);
  sh.gate_up_stacked = g.type == u.type && size_t(sh.up_off) == g.bytes;
  sh.buf = dev_->alloc(total, name + "shexp");
  Stream& cs = dev_->compute();
  xfer_->fill(sh.buf.span(), 0, cs, {&cs});  // the padding: defined bytes
  xfer_->upload(slice(sh.buf, 0, g.bytes), g.data, g.bytes, cs, {&cs});
  xfer_->upload(slice(sh.buf, size_t(sh.up_off), u.bytes), u.data, u.bytes, cs, {&cs});
  xfer_->upload(slice(sh.buf, size_t(sh.down_off), d.bytes), d.data, d.bytes, cs, {&cs});
  moe::ExpertLayerView& v = sh.view;
  v.slots = sh.buf.as<const uint8_t>();
  v.slot_bytes = int64_t(total);
  v.gate_type = sh.gate_t, v.up_type = sh.up_t, v.down_type = sh.down_t;
  v.gate_off = 0, v.up_off = sh.up_off, v.down_off = sh.down_off;
  v.n_embd = sh.n_embd;
  v.n_ff = sh.n_ff;
  v.n_expert = 1;  // sh_table_ = {0}
  sh.q8 = !opt_.exact && q8::use_moe(v);
  return sh;
}

void CudaQwen3Next::norm(const Pass& p, const DeviceBuffer& x, const DevWeight& w, int64_t rows, bool quantize,
                         Site site) const {
  NextWorkspace& ws = p.ws;
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

void CudaQwen3Next::mm_q8(const Pass& p, const MatRef& w, int64_t n, const DeviceBuffer& y, float* yp,
                          bool accumulate, Site site) const {
  NextWorkspace& ws = p.ws;
  if (accumulate)
    note_launch(dev_->compute(), {w.buf->span(), ws.xq.span(), ws.xds.span(), y.span()}, {y.span()}, site);
  else
    note_launch(dev_->compute(), {w.buf->span(), ws.xq.span(), ws.xds.span()}, {y.span()}, site);
  op(p, [&] {
    q8::matvec(w.type, w.data, w.rows, w.cols, int64_t(row_bytes(w.type, w.cols)), ws.xq.as<const int8_t>(),
               ws.xds.as<const float2>(), n, yp, accumulate, stream());
  });
}

void CudaQwen3Next::project(const Pass& p, const Proj& pr, const DeviceBuffer& y, bool stacked, Site site) const {
  if (stacked) {  // one product per stack
    for (size_t s = 0; s < pr.stacks.size(); ++s)
      mm_any(p, ref(pr.stacks[s]), p.n, y, y.as<float>() + p.n * pr.stack_col[s], site);
    return;
  }
  for (size_t i = 0; i < pr.parts.size(); ++i) project_part(p, pr, i, y, site);
}

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
  sh_table_ = dev_->alloc(4, "shexp_table");
  xfer_->fill(sh_table_.span(), 0, dev_->compute(), {&dev_->compute()});
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
      // q|k|v, z and ba read the normed x: stacked where their kept types agree (gdn_block reads each
      // part's output at its own place, so any grouping works).
      if (w.qkv) {
        l.gdn.proj = upload_proj({{&w.qkv, p + "attn_qkv"}, {&w.gate, p + "attn_gate"}, {&w.ba, p + "ssm_ba"}}, log);
      } else {
        std::vector<uint8_t> qkv, z;
        regroup_qkvz(w.qkvz, np_, qkv, z);
        const Weight wqkv = host_matrix(w.qkvz, qkv, np_.conv_dim()), wz = host_matrix(w.qkvz, z, np_.value_dim());
        l.gdn.proj = upload_proj({{&wqkv, p + "ssm_in(qkv)"}, {&wz, p + "ssm_in(z)"}, {&w.ba, p + "ssm_ba"}}, log);
      }
      l.gdn.conv = upload_f32_values(*dev_, *xfer_, w.conv, int64_t(np_.conv_kernel) * np_.conv_dim(), p + "ssm_conv1d");
      l.gdn.a = upload_f32(*dev_, *xfer_, w.a, p + "ssm_a");
      l.gdn.dt_bias = upload_f32(*dev_, *xfer_, w.dt_bias, p + "ssm_dt.bias");
      l.gdn.norm = upload_f32(*dev_, *xfer_, w.norm, p + "ssm_norm");
      l.gdn.out = upload(w.out, p + "ssm_out", log);
    } else {
      const qwen3next::AttnWeights& w = hl.attn;
      l.attn.proj = upload_proj({{&w.wq, p + "attn_q"}, {&w.wk, p + "attn_k"}, {&w.wv, p + "attn_v"}}, log);
      l.attn.q_norm = upload_f32(*dev_, *xfer_, w.q_norm, p + "attn_q_norm");
      l.attn.k_norm = upload_f32(*dev_, *xfer_, w.k_norm, p + "attn_k_norm");
      l.attn.wo = upload(w.wo, p + "attn_output", log);
    }
    // The router's and the shared expert gate's logits, one stack when both are kept in one type (F32).
    STRATA_REQUIRE(hl.sh_gate_inp.ne[0] == E && hl.sh_gate_inp.ne[1] * hl.sh_gate_inp.ne[2] * hl.sh_gate_inp.ne[3] == 1,
                   "{}: {}ffn_gate_inp_shexp must hold {} values", file_.path(), p, E);
    l.route = upload_proj({{&hl.router, p + "ffn_gate_inp"}, {&hl.sh_gate_inp, p + "ffn_gate_inp_shexp"}}, log);
    l.shexp = upload_shexp(hl.sh_gate, hl.sh_up, hl.sh_down, p, log);
    l.experts = hl.experts;
    lexp[size_t(il)] = {{l.experts.gate.type, l.experts.gate.data},
                        {l.experts.up.type, l.experts.up.data},
                        {l.experts.down.type, l.experts.down.data}};
  }
  for (const auto& t : file_.tensors()) weight_bytes_ += t.nbytes;
  const size_t free1 = dev_->free_bytes();
  const int64_t dense_bytes = int64_t(free0) - int64_t(free1);
  print_dense_repacks(log, opt_.exact);
  if (np_.n_nextn > 0)
    std::fprintf(stderr, "strata: cuda: %d MTP block(s) (%zu tensors) kept on the host, not run\n", np_.n_nextn,
                 host_.nextn.size());

  // --- the expert cache (cache_setup.h) ---
  const int64_t n_seq = std::max(opt_.kv_sequences, 1), n_ctx = std::max(opt_.n_ctx, 1);
  MadeCache made = make_expert_cache(
      *dev_, *xfer_, opt_,
      {.n_layer = np_.n_layer, .n_expert = hp.n_expert, .n_embd = E, .n_ff = F, .layers = std::move(lexp),
       .kv_bytes = n_seq * (int64_t(n_attn_) * n_ctx * hp.n_head_kv * (hp.head_dim + hp.head_dim_v) * 2 +
                            int64_t(n_gdn_) * int64_t(conv_state_values() + ssm_state_values()) * 4),
       .ws_bytes = WsSizes(hp, np_, std::max(opt_.n_batch, 1), n_ctx).device_bytes(np_.n_layer),
       .dense_bytes = dense_bytes, .free_bytes = free1,
       .model = "qwen3next " + std::to_string(n_gdn_) + " GDN + " + std::to_string(n_attn_) + " attention layers, ",
       .kv_what = "KV + recurrent state"});
  cache_ = std::move(made.cache);
  stream_min_tokens_ = made.stream_min_pairs;
  direct_share_ = made.direct_share;
  prefill_stream_ = made.prefill_stream;
  prefill_costs_ = strata::moe::PrefillStreamCosts(made.copy_us);
  if (made.decode_stream.kind != strata::moe::DecodeStreamMode::Off)
    std::fprintf(stderr, "strata: cuda: --decode-stream %s: decode streaming is built for qwen3moe only; qwen3next "
                 "runs its decode misses on the CPU pool\n", opt_.decode_stream.c_str());
  dev_->compute().synchronize();  // weights and first slots in place before the first forward
  work_ = HostWork::starting_now(*xfer_);
}

void CudaQwen3Next::embed(const Pass& p) const {
  const StepLayout sl(p.n);
  note_launch(dev_->compute(), {tok_embd_.buf.span(), p.ws.step_in.span()}, {p.ws.x.span()});
  op(p, [&] {
    quant::get_rows(tok_embd_.type, tok_embd_.buf.data(), hp_.n_embd, p.step<const int32_t>(sl.tokens), p.n,
                    p.ws.x.as<float>(), stream());
  });
  if (n_attn_ == 0) return;
  // The rope angles of the batch, read by every attention layer's attn_prep.
  note_launch(dev_->compute(), {p.ws.step_in.span()}, {p.ws.rope_cs.span()});
  op(p, [&] {
    ops::rope_cos_sin(p.step<const int32_t>(sl.pos), p.n, hp_.n_rot, hp_.rope_base, p.ws.rope_cs.as<float>(),
                      stream());
  });
}

// Gated DeltaNet (model/qwen3next.cpp gdn_block): attn norm, the input projections (one Proj), gates,
// per-sequence conv1d + SiLU, split + L2 norm, per-sequence delta rule (the recurrent form over the run's
// tokens, state on chip), gated RMSNorm, output projection, residual add. Decode-sized runs take conv,
// split and gates in one launch per run (nextf::conv_split_gates: the same values as the three ops). The
// fast decode quantizes the gated norm's output in the same launch, and an int8-activation ssm_out adds
// into x (no separate add).
void CudaQwen3Next::gdn_block(const Pass& p, const Layer& l) const {
  const GdnLayer& w = l.gdn;
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  const cudaStream_t s = stream();
  const int64_t n = p.n, C = np_.conv_dim(), Kd = np_.key_dim(), Vd = np_.value_dim();
  const int64_t Hk = np_.n_k_heads, Hv = np_.n_v_heads, D = np_.head_dim;
  const int K = np_.conv_kernel;
  bool fused = D % 32 == 0 && D <= 256;  // conv, split and gates in one launch per run
  for (int64_t r = 0; r < p.n_runs; ++r)
    fused = fused && ws.runs[size_t(r)].t1 - ws.runs[size_t(r)].t0 <= nextf::kConvSplitMaxTokens;
  const bool q8_out = use_q8(p, w.out) && D % 32 == 0;  // gated norm + quantize, int8 ssm_out into x
  // The stacked layout where every reader of the outputs takes a row stride (conv_split_gates for qkv and
  // ba, gated_norm_quantize for z), or for one token; decode-sized passes only (the prefill GEMM context is
  // sized for single matrices).
  const bool stacked = !opt_.exact && n < kGemmMinTokens && (n == 1 || (fused && q8_out));
  norm(p, ws.x, l.attn_norm, n, use_q8(p, w.proj));
  project(p, w.proj, ws.gproj, stacked);
  const PartView qkv = part_view(p, w.proj, 0, ws.gproj, stacked);  // [n][C], row stride qkv.ld
  const PartView z = part_view(p, w.proj, 1, ws.gproj, stacked);    // [n][Hv][D]
  const PartView ba = part_view(p, w.proj, 2, ws.gproj, stacked);   // [n][2*Hv]
  float* gq = ws.gq.as<float>();
  float* gk = ws.gk.as<float>();
  float* gv = ws.gv.as<float>();
  float* g = ws.g.as<float>();
  float* beta = ws.beta.as<float>();
  const size_t conv_off = size_t(l.index) * conv_state_values(), ssm_off = size_t(l.index) * ssm_state_values();
  if (fused) {
    for (int64_t r = 0; r < p.n_runs; ++r) {
      const Run& run = ws.runs[size_t(r)];
      const int64_t t0 = run.t0, len = run.t1 - run.t0;
      note_launch(cs, {ws.gproj.span(), w.conv.buf.span(), run.st->conv.span(), w.a.buf.span(), w.dt_bias.buf.span()},
                  {ws.gq.span(), ws.gk.span(), ws.gv.span(), ws.g.span(), ws.beta.span(), run.st->conv.span()});
      op(p, [&] {
        nextf::conv_split_gates(qkv.ptr + t0 * qkv.ld, qkv.ld, len, Hk, Hv, D, K, run.st->conv.as<float>() + conv_off,
                                w.conv.f32(), hp_.rms_eps, gq + t0 * Kd, gk + t0 * Kd, gv + t0 * Vd,
                                ba.ptr + t0 * ba.ld, ba.ld, w.a.f32(), w.dt_bias.f32(), g + t0 * Hv, beta + t0 * Hv, s);
      });
    }
  } else {  // contiguous outputs here (per-part layout, or one token)
    note_launch(cs, {ws.gproj.span(), w.a.buf.span(), w.dt_bias.buf.span()}, {ws.g.span(), ws.beta.span()});
    op(p, [&] { gdn::gates(ba.ptr, n, Hk, Hv, w.a.f32(), w.dt_bias.f32(), g, beta, s); });
    for (int64_t r = 0; r < p.n_runs; ++r) {
      const Run& run = ws.runs[size_t(r)];
      const int64_t len = run.t1 - run.t0;
      note_launch(cs, {ws.gproj.span(), w.conv.buf.span(), run.st->conv.span()}, {ws.conv.span(), run.st->conv.span()});
      op(p, [&] {
        gdn::conv1d_silu(qkv.ptr + run.t0 * C, len, C, K, run.st->conv.as<float>() + conv_off, w.conv.f32(),
                         ws.conv.as<float>() + run.t0 * C, s);
      });
    }
    note_launch(cs, {ws.conv.span()}, {ws.gq.span(), ws.gk.span(), ws.gv.span()});
    op(p, [&] { gdn::split_qkv(ws.conv.as<const float>(), n, Hk, Hv, D, hp_.rms_eps, gq, gk, gv, s); });
  }
  const float q_scale = 1.0f / std::sqrt(float(D));
  for (int64_t r = 0; r < p.n_runs; ++r) {
    const Run& run = ws.runs[size_t(r)];
    const int64_t t0 = run.t0, len = run.t1 - run.t0;
    note_launch(cs, {ws.gq.span(), ws.gk.span(), ws.gv.span(), ws.g.span(), ws.beta.span(), run.st->ssm.span()},
                {ws.go.span(), run.st->ssm.span()});
    op(p, [&] {
      gdn::delta_rule(len, Hk, Hv, D, gq + t0 * Kd, gk + t0 * Kd, gv + t0 * Vd, g + t0 * Hv, beta + t0 * Hv, q_scale,
                      run.st->ssm.as<float>() + ssm_off, ws.go.as<float>() + t0 * Vd, s);
    });
  }
  if (q8_out) {
    // x += ssm_out . gated_norm(o, z): the norm's output only as Q8 activations, the product adds into x.
    note_launch(cs, {ws.go.span(), ws.gproj.span(), w.norm.buf.span()}, {ws.xq.span(), ws.xds.span()});
    op(p, [&] {
      nextf::gated_norm_quantize(ws.go.as<const float>(), z.ptr, z.ld, w.norm.f32(), n, Hv, D, hp_.rms_eps,
                                 ws.xq.as<int8_t>(), ws.xds.as<float2>(), s);
    });
    mm_q8(p, ref(w.out), n, ws.x, ws.x.as<float>(), /*accumulate=*/true);
    return;
  }
  // z contiguous here (not q8_out: per-part layout, or one token)
  note_launch(cs, {ws.go.span(), ws.gproj.span(), w.norm.buf.span()}, {ws.go.span()});
  op(p, [&] {
    gdn::gated_rms_norm(ws.go.as<const float>(), z.ptr, w.norm.f32(), n * Hv, D, hp_.rms_eps, ws.go.as<float>(), s);
  });
  mm_add_x(p, w.out, ws.go, n);  // x += ssm_out . gated_norm(o, z)
}

// Gated attention (model/qwen3next.cpp attention_block): attn norm, q|k|v (one Proj; attn_q yields query
// and output gate per head), per-head q/k RMSNorm, partial NeoX RoPE (n_rot), f16 KV of the sequence's
// attention layer l.index, causal attention, output gated by sigmoid(gate), output projection, residual
// add. The fast decode quantizes the gated output in the gating launch and attn_output adds into x.
void CudaQwen3Next::attention_block(const Pass& p, const Layer& l) const {
  const HParams& hp = hp_;
  const AttnLayer& w = l.attn;
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  const cudaStream_t s = stream();
  const int64_t n = p.n, H = hp.n_head, Hkv = hp.n_head_kv, D = hp.head_dim, Dv = hp.head_dim_v;
  const StepLayout sl(n);
  const auto* refs = p.step<const ops::KvRef>(sl.refs);
  float* q = ws.q.as<float>();
  // The stacked layout when attn_q's output stays contiguous (split_q_gate needs it; attn_prep takes row
  // strides for k and v), or for one token; decode-sized passes only (as gdn_block).
  const Proj::Part& qpart = w.proj.parts[0];
  const bool q_alone = w.proj.stacks[size_t(qpart.stack)].rows == qpart.rows;
  const bool stacked = !opt_.exact && n < kGemmMinTokens && (n == 1 || q_alone);
  norm(p, ws.x, l.attn_norm, n, use_q8(p, w.proj));
  project(p, w.proj, ws.aproj, stacked);
  const float* qg = part_view(p, w.proj, 0, ws.aproj, stacked).ptr;  // [n][H][2*D] contiguous
  const PartView k = part_view(p, w.proj, 1, ws.aproj, stacked);     // [n][Hkv][D], row stride k.ld
  const PartView v = part_view(p, w.proj, 2, ws.aproj, stacked);     // [n][Hkv][Dv], row stride v.ld
  note_launch(cs, {ws.aproj.span()}, {ws.q.span(), ws.qgate.span()});
  op(p, [&] { gdn::split_q_gate(qg, n, H, D, q, ws.qgate.as<float>(), s); });
  // q_norm, k_norm, rope of q and k, K/V into the sequence's cache, in one launch (ops_fused.cuh: bit for
  // bit the five ops), q normed and rotated in place.
  note_launch(cs,
              {ws.q.span(), ws.aproj.span(), ws.rope_cs.span(), ws.step_in.span(), w.q_norm.buf.span(),
               w.k_norm.buf.span()},
              {ws.q.span()});
  const ops::AttnPrepShape shape{int(H), int(Hkv), int(D), int(Dv), hp.n_rot, hp.rms_eps};
  op(p, [&] {
    ops::attn_prep(q, H * D, k.ptr, k.ld, v.ptr, v.ld, w.q_norm.f32(), w.k_norm.f32(), ws.rope_cs.as<const float>(),
                   refs, n, l.index, shape, q, s);
  });
  note_launch(cs, {ws.step_in.span(), ws.q.span()}, {ws.att.span(), ws.attn_scratch.span()});
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  op(p, [&] {
    ops::attention(q, refs, n, l.index, int(H), int(Hkv), int(D), int(Dv), scale, p.attn, p.kv_span,
                   ws.attn_scratch.as<float>(), ws.att.as<float>(), s);
  });
  if (use_q8(p, w.wo)) {
    // x += wo . (att * sigmoid(gate)): the gated output only as Q8 activations, the product adds into x.
    note_launch(cs, {ws.att.span(), ws.qgate.span()}, {ws.xq.span(), ws.xds.span()});
    op(p, [&] {
      nextf::mul_sigmoid_quantize(ws.att.as<const float>(), ws.qgate.as<const float>(), n, H * Dv, ws.xq.as<int8_t>(),
                                  ws.xds.as<float2>(), s);
    });
    mm_q8(p, ref(w.wo), n, ws.x, ws.x.as<float>(), /*accumulate=*/true);
    return;
  }
  note_launch(cs, {ws.qgate.span()}, {ws.att.span()});
  op(p, [&] { gdn::mul_sigmoid(ws.att.as<float>(), ws.qgate.as<const float>(), n * H * Dv, s); });
  mm_add_x(p, w.wo, ws.att, n);  // x += wo . (att * sigmoid(gate))
}

bool CudaQwen3Next::ffn_q8_input(const Pass& p, int il) const {
  const Layer& l = layers_[size_t(il)];
  const SharedExpert& sh = l.shexp;
  return use_q8(p, l.route) || experts_q8(p, il) || shexp_q8(p, l) || use_q8(p, sh.gate_t, sh.n_embd) ||
         use_q8(p, sh.up_t, sh.n_embd);
}

void CudaQwen3Next::route(const Pass& p, int il) const {
  const HParams& hp = hp_;
  const Layer& l = layers_[size_t(il)];
  NextWorkspace& ws = p.ws;
  const int64_t n = p.n;
  // -> xn (the router, the experts, the shared expert and the CPU pool read it), and its Q8 activations
  // where one of them takes them.
  norm(p, ws.x, l.post_norm, n, ffn_q8_input(p, il));
  const Proj::Part& rp = l.route.parts[0];
  const DevWeight& rw = l.route.stacks[size_t(rp.stack)];
  if (rw.type == GgmlType::F32 && n <= ops::fused_router_max_tokens()) {
    // Decode: the router product and the top-k in one launch (the values of the product + moe_route).
    note_launch(dev_->compute(), {rw.buf.span(), ws.xn.span(), ws.route_counter.span()},
                {ws.rproj.span(), ws.ids.span(), ws.wts.span(), ws.route_counter.span()});
    op(p, [&] {
      ops::router_route(rw.f32() + rp.row0 * hp.n_embd, hp.n_expert, hp.n_embd, ws.xn.as<const float>(), n,
                        hp.n_expert_used, hp.expert_weights_norm, part_out(p, l.route, 0, ws.rproj), p.ids(il),
                        ws.wts.as<float>(), ws.route_counter.as<uint32_t>(), stream());
    });
    if (!shexp_q8(p, l)) project_part(p, l.route, 1, ws.rproj);  // the shared expert's logit
    return;
  }
  if (shexp_q8(p, l))
    project_part(p, l.route, 0, ws.rproj);  // router logits (the shared gate: dot_sigmoid in shared_expert)
  else
    project(p, l.route, ws.rproj, /*stacked=*/!opt_.exact && n == 1);  // router logits, shared logit
  const float* router = part_out(p, l.route, 0, ws.rproj);
  note_launch(dev_->compute(), {ws.rproj.span()}, {ws.ids.span(), ws.wts.span()});
  op(p, [&] {
    ops::moe_route(router, n, hp.n_expert, hp.n_expert_used, hp.expert_weights_norm, p.ids(il), ws.wts.as<float>(),
                   stream());
  });
}

// The shared expert, dense on the GPU. Fast decode with int8-activation kernels for its types: a
// one-expert MoE layer on its slot-shaped buffer, weight sigmoid(logit): x += sigmoid(logit) *
// down(silu(gate x) * up x) in three launches. Otherwise tmp = down(silu(gate x) * up x) (gate|up in one
// product for one token when they share a type), the sigmoid gate applied in add_ffn_out.
void CudaQwen3Next::shared_expert(const Pass& p, const Layer& l) const {
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  const cudaStream_t s = stream();
  const SharedExpert& sh = l.shexp;
  const int64_t n = p.n, F = sh.n_ff, E = sh.n_embd;
  if (shexp_q8(p, l)) {
    const Proj::Part& gp = l.route.parts[1];
    const DevWeight& gw = l.route.stacks[size_t(gp.stack)];  // F32 (shexp_q8): row gp.row0 is ffn_gate_inp_shexp
    note_launch(cs, {gw.buf.span(), ws.xn.span()}, {ws.sh_w.span()});
    op(p, [&] { nextf::dot_sigmoid(gw.f32() + gp.row0 * E, ws.xn.as<const float>(), n, E, ws.sh_w.as<float>(), s); });
    note_launch(cs, {sh.buf.span(), sh_table_.span(), ws.xq.span(), ws.xds.span(), ws.sh_ids.span()},
                {ws.hq.span(), ws.hds.span()});
    op(p, [&] {
      q8::moe_gate_up(sh.view, sh_table_.as<const int32_t>(), ws.xq.as<const int8_t>(), ws.xds.as<const float2>(),
                      ws.sh_ids.as<const int32_t>(), n, 1, ws.hq.as<int8_t>(), ws.hds.as<float2>(), s);
    });
    note_launch(cs, {sh.buf.span(), sh_table_.span(), ws.hq.span(), ws.hds.span(), ws.sh_ids.span(), ws.sh_w.span(),
                     ws.x.span()},
                {ws.x.span()});
    op(p, [&] {
      q8::moe_down(sh.view, sh_table_.as<const int32_t>(), ws.hq.as<const int8_t>(), ws.hds.as<const float2>(),
                   ws.sh_ids.as<const int32_t>(), ws.sh_w.as<const float>(), n, 1, ws.x.as<float>(), s,
                   /*after_gate_up=*/true);
    });
    return;
  }
  const auto* base = sh.buf.as<const uint8_t>();
  const MatRef gate{sh.gate_t, base, F, E, &sh.buf}, up{sh.up_t, base + sh.up_off, F, E, &sh.buf},
      down{sh.down_t, base + sh.down_off, E, F, &sh.buf};
  float* gp = ws.sh_g.as<float>();  // [n][F] gate, then [n][F] up
  float* up_out = gp + n * F;
  if (n == 1 && !opt_.exact && sh.gate_up_stacked) {
    mm_any(p, MatRef{sh.gate_t, base, 2 * F, E, &sh.buf}, 1, ws.sh_g, gp);
  } else {
    mm_any(p, gate, n, ws.sh_g, gp);
    mm_any(p, up, n, ws.sh_g, up_out);
  }
  note_launch(cs, {ws.sh_g.span()}, {ws.sh_g.span()});
  op(p, [&] { ops::swiglu(gp, up_out, n * F, gp, s); });
  mm(p, down, ws.sh_g, n, ws.tmp, ws.tmp.as<float>());
}

void CudaQwen3Next::gpu_experts(const Pass& p, int il, bool staged_row) const {
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  if (staged_row)
    cache_->note_row_reads(cs, ws.stage_row.span(), ws.stage_row_h.data());  // the row and every slot it names
  else
    cache_->note_expert_reads(cs, il);  // the table and every slot the layer's row points to
  // Direct pairs (p.direct) read the pinned host copy; only with the layer's own table row.
  const bool direct = p.direct > 0 && !staged_row;
  const int32_t* table = staged_row ? ws.stage_row.as<const int32_t>() : cache_->device_layer_row(il);
  const int k_used = hp_.n_expert_used;
  const bool grouped = p.n >= moe::kMoeGroupedMinTokens && ws.moe_scratch.bytes() > 0 &&
                       moe::moe_grouped_supported(cache_->layer_view(il));
  STRATA_REQUIRE(!direct || (!grouped && !experts_q8(p, il)),
                 "cuda: direct reads in a pass that runs its experts on the grouped or int8 kernels");
  const moe::ExpertLayerView view = experts_view(PoolCtx{*xfer_, cs, *cache_, work_}, il, direct ? p.direct : 0, p.n,
                                                 k_used, table, p.ids(il), p.launch);
  // Prefill: tokens grouped by expert on the tensor cores (qwen3moe_cuda.cpp gpu_experts says why).
  if (grouped) {
    note_launch(cs, {ws.xn.span(), ws.ids.span(), ws.wts.span()}, {ws.moe_scratch.span(), ws.moe_out.span()});
    op(p, [&] {
      moe::moe_experts_grouped(view, table, hp_.n_expert, ws.xn.as<const float>(), p.ids(il), ws.wts.as<const float>(),
                               p.n, k_used, ws.moe_out.as<float>(), ws.moe_scratch.data(), ws.moe_scratch.bytes(),
                               stream());
    });
    return;
  }
  // Fast decode: int8 activations (the post-norm's, from route), h kept as Q8, the weighted sum added
  // into x by moe_down (no moe_out, no add).
  if (experts_q8(p, il)) {
    note_launch(cs, {ws.xq.span(), ws.xds.span(), ws.ids.span()}, {ws.hq.span(), ws.hds.span()});
    op(p, [&] {
      q8::moe_gate_up(view, table, ws.xq.as<const int8_t>(), ws.xds.as<const float2>(), p.ids(il), p.n, k_used,
                      ws.hq.as<int8_t>(), ws.hds.as<float2>(), stream());
    });
    note_launch(cs, {ws.hq.span(), ws.hds.span(), ws.ids.span(), ws.wts.span(), ws.x.span()}, {ws.x.span()});
    op(p, [&] {
      q8::moe_down(view, table, ws.hq.as<const int8_t>(), ws.hds.as<const float2>(), p.ids(il), ws.wts.as<const float>(),
                   p.n, k_used, ws.x.as<float>(), stream(), /*after_gate_up=*/true);
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

void CudaQwen3Next::add_ffn_out(const Pass& p, int il) const {
  NextWorkspace& ws = p.ws;
  const Layer& l = layers_[size_t(il)];
  if (!experts_q8(p, il)) {
    note_launch(dev_->compute(), {ws.moe_out.span()}, {ws.x.span()});
    op(p, [&] { ops::add_inplace(ws.x.as<float>(), ws.moe_out.as<const float>(), p.n * hp_.n_embd, stream()); });
  }
  add_shared_out(p, l);
}

void CudaQwen3Next::add_shared_out(const Pass& p, const Layer& l) const {
  if (shexp_q8(p, l)) return;  // added into x by shared_expert
  NextWorkspace& ws = p.ws;
  note_launch(dev_->compute(), {ws.tmp.span(), ws.rproj.span()}, {ws.x.span()});
  op(p, [&] {
    gdn::add_sigmoid_scaled(ws.x.as<float>(), ws.tmp.as<const float>(), part_out(p, l.route, 1, ws.rproj), p.n,
                            hp_.n_embd, stream());
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
  const bool q8 = int8_output(opt_.exact, p.n, ws.xq.bytes() > 0) && q8::use_type(out_w_->type) &&
                  out_w_->cols % 32 == 0;
  norm(p, ws.xn, output_norm_, p.n_out, q8);  // in place
  if (q8)
    mm_q8(p, ref(*out_w_), p.n_out, ws.logits, ws.logits.as<float>(), /*accumulate=*/false);
  else
    mm(p, ref(*out_w_), ws.xn, p.n_out, ws.logits, ws.logits.as<float>());
}

void CudaQwen3Next::layer_front(const Pass& p, int il) const {
  const Layer& l = layers_[size_t(il)];
  if (l.recurrent)
    gdn_block(p, l);
  else
    attention_block(p, l);
  route(p, il);
}

void CudaQwen3Next::compute_resident(const Pass& p) const {
  embed(p);
  for (int il = 0; il < np_.n_layer; ++il) {
    layer_front(p, il);
    gpu_experts(p, il);
    shared_expert(p, layers_[size_t(il)]);
    add_ffn_out(p, il);
  }
  output(p);
}

// As qwen3moe_cuda.cpp run_graph (its comment says why a graph survives residency changes and what
// invalidates it), with one difference: the GDN ops get each sequence's conv and delta-rule state as
// kernel arguments, so the key holds the runs (token ranges and state addresses). Every other per-step
// input (tokens, positions, KV refs, logit rows, the residency table's contents) is read from device
// memory. The zeroing of a fresh sequence's state is a transfer enqueued before the launch, not part of
// the graph.
void CudaQwen3Next::prepare_graphs(NextWorkspace& ws) const {
  const void* slots = cache_->slots_span().ptr;
  const void* table = cache_->table_span().ptr;
  if (ws.graphs_model != model_id_ || ws.graphs_slots != slots || ws.graphs_table != table ||
      ws.graphs.size() >= kMaxGraphs) {
    ws.graphs.clear();
    ws.graphs_model = model_id_;
    ws.graphs_slots = slots;
    ws.graphs_table = table;
  }
}

NextWorkspace::GraphKey CudaQwen3Next::graph_key(const Pass& p) const {
  NextWorkspace::GraphKey key{p.n, p.n_out, p.kv_span, int(p.attn), attn_tile::prefill_mma(), quant::generic_only(),
                              {}, {}};
  for (int64_t r = 0; r < p.n_runs; ++r) {
    const Run& run = p.ws.runs[size_t(r)];
    key.runs.emplace_back(run.t0, run.t1, run.st->conv.data(), run.st->ssm.data());
  }
  return key;
}

void CudaQwen3Next::run_graph(const Pass& p) const {
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  prepare_graphs(ws);
  NextWorkspace::GraphKey key = graph_key(p);
  auto it = ws.graphs.find(key);
  if (it == ws.graphs.end()) {
    // The checker's notes are taken while capturing: the launch below follows them on the same stream.
    Graph g = Graph::capture(cs, [&] { compute_resident(p); });
    ++work_.captures;
    it = ws.graphs.emplace(std::move(key), std::move(g)).first;
  } else if (strata::stream_check::enabled()) {
    compute_resident(p.notes_only());  // the replayed launches' notes only
  }
  it->second.launch(cs);
  ++work_.graph_forwards;
}

void CudaQwen3Next::gated_piece(const Pass& p, const PoolCtx& pc, const std::vector<uint8_t>& kinds,
                                const std::vector<int>& pl, size_t k) const {
  NextWorkspace& ws = p.ws;
  const int64_t E = hp_.n_embd;
  const GatedPiece g = gated_piece_layers(pl, k, np_.n_layer);
  if (g.after < 0)
    embed(p);
  else
    pool_add_gated(pc, ws, ws.x, g.after, p.n, E, p.launch);  // x += the CPU's partial, once the gate opens
  for (int il = g.first; il < g.end; ++il) {  // every expert resident
    layer_front(p, il);
    gpu_experts(p, il);
    shared_expert(p, layers_[size_t(il)]);
    add_ffn_out(p, il);
  }
  if (g.pool < 0) {
    output(p);
    return;
  }
  const int last = g.pool;
  // As pool_experts without streaming: the resident pairs and the shared expert run while the CPU works.
  const Layer& l = layers_[size_t(last)];
  layer_front(p, last);
  pool_download_signaled(pc, ws, ws.xn, last, p.n, E, p.launch);
  const bool gpu_ran = kinds[size_t(last)] == 1 || p.direct > 0;  // resident or direct pairs
  if (gpu_ran) gpu_experts(p, last);
  shared_expert(p, l);
  if (gpu_ran && !experts_q8(p, last)) {
    note_launch(dev_->compute(), {ws.moe_out.span()}, {ws.x.span()});
    op(p, [&] { ops::add_inplace(ws.x.as<float>(), ws.moe_out.as<const float>(), p.n * E, stream()); });
  }
  add_shared_out(p, l);
}

// As CudaQwen3Moe::forward_gated (its comment says why and how it is ordered).
void CudaQwen3Next::forward_gated(const Pass& p, ThreadPool& pool, const ForwardOptions& opt) const {
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  const PoolCtx pc{*xfer_, cs, *cache_, work_};
  std::vector<int> pl;
  const std::vector<uint8_t> kinds = gated_layer_kinds(cache_->residency(), np_.n_layer, hp_.n_expert, &pl);
  prepare_graphs(ws);
  ws.gates->reset();  // no kernel of an earlier pass polls them: each pass ends with the stream drained
  NextWorkspace::GraphKey key = graph_key(p);
  key.layers = kinds;
  auto it = ws.graphs.find(key);
  if (it == ws.graphs.end()) {
    const strata::stream_check::PauseNotes quiet;  // notes where the host releases each piece
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

// As the CPU-pool branch of qwen3moe_cuda.cpp forward(): routing, weights and activations go to the host
// (the host waits for them before it enqueues anything that rewrites xn or the layer's ids), the
// non-resident pairs run on CPU threads, their sum goes up and is added to x on the compute stream.
// Prefill-sized passes first stream the busiest non-resident experts into staging slots (as qwen3moe's
// stream_experts; docs/expert_cache.md): then the GPU's experts wait for the routing on the host and run
// through the pass's own table row, resident and staged experts in the same launches.
void CudaQwen3Next::pool_experts(const Pass& p, int il, ThreadPool& pool, const ForwardOptions& opt) const {
  NextWorkspace& ws = p.ws;
  Stream& cs = dev_->compute();
  const PoolCtx pc{*xfer_, cs, *cache_, work_};
  const Layer& l = layers_[size_t(il)];
  const int64_t n = p.n, E = hp_.n_embd;
  const PoolDownloads dl = pool_download(pc, ws, ws.xn, il, n, E);
  const int n_res = cache_->residency().resident_in_layer(il);
  const bool streaming = n >= moe::kMoeGroupedMinTokens && cache_->n_stage() > 0;
  const bool gpu_first = !streaming && (n_res > 0 || p.direct > 0);  // resident (and direct) pairs
  if (gpu_first) gpu_experts(p, il);
  shared_expert(p, l);  // reads xn, writes tmp / sh_*: nothing the downloads read
  int64_t n_cpu = pool_split(pc, ws, dl, il, n, hp_.n_expert, opt.usage, p.direct);
  bool gpu_ran = gpu_first;
  if (streaming) {
    ws.stage_order.clear();
    if (n_cpu > 0) stream_candidates(ws, n, hp_.n_expert, stream_min_tokens_, cache_->n_stage());
    if (!ws.stage_order.empty() && prefill_stream_.kind == strata::moe::PrefillStreamMode::Auto)
      balance_prefill_candidates(ws, hp_.n_expert, prefill_costs_);
    if (!ws.stage_order.empty()) {
      n_cpu -= stage_experts(pc, ws, il, n, hp_.n_expert, /*keep_resident=*/true);
      gpu_experts(p, il, /*staged_row=*/true);
      gpu_ran = true;
    } else if (n_res > 0) {
      gpu_experts(p, il);
      gpu_ran = true;
    }
  }
  // x += moe_out (the GPU's pairs; only if their kernels ran; the int8-activation kernels added into x
  // already) + sigmoid(shared logit) * shared expert
  if (gpu_ran && !experts_q8(p, il)) {
    note_launch(cs, {ws.moe_out.span()}, {ws.x.span()});
    op(p, [&] { ops::add_inplace(ws.x.as<float>(), ws.moe_out.as<const float>(), n * E, stream()); });
  }
  add_shared_out(p, l);
  if (n_cpu == 0) return;  // every pair ran on the GPU
  const double pool_us = pool_compute(pc, ws, l.experts, n, E, pool, opt.mode);
  if (streaming) prefill_costs_.note_cpu(pool_us, n_cpu);
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
  STRATA_REQUIRE(!opt.chain, "forward: qwen3next does not chain decode passes (chains_decode)");
  const int64_t V = hp.n_vocab;
  STRATA_REQUIRE(!opt.usage || (opt.usage->n_layer() >= np_.n_layer && opt.usage->n_expert() == hp.n_expert &&
                                opt.usage->n_expert_used() == hp.n_expert_used),
                 "forward: expert-usage counter shaped for another model");
  const StepLayout sl(n);
  auto* refs_host = reinterpret_cast<ops::KvRef*>(ws.step_host.data() + sl.refs);
  auto* tok_host = reinterpret_cast<int32_t*>(ws.step_host.data() + sl.tokens);
  auto* pos_host = reinterpret_cast<int32_t*>(ws.step_host.data() + sl.pos);
  auto* rows_host = reinterpret_cast<int32_t*>(ws.step_host.data() + sl.rows);
  int64_t n_out = 0, n_runs = 0, n_kv = 1;  // n_kv: the most positions a token attends to
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& bt = batch.tokens[size_t(t)];
    STRATA_REQUIRE(bt.seq >= 0 && size_t(bt.seq) < batch.seqs.size(), "forward: bad sequence index");
    SequenceState& seq = *batch.seqs[size_t(bt.seq)];
    STRATA_REQUIRE(bt.pos >= 0 && bt.pos < seq.n_ctx() && bt.pos < ws.n_ctx_max, "forward: position {} outside the context",
                   bt.pos);
    n_kv = std::max<int64_t>(n_kv, int64_t(bt.pos) + 1);
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
  check_logits_target(ws, logits, n_out, hp.n_vocab, opt.sampling);
  Stream& cs = dev_->compute();
  const strata::moe::Residency& res = cache_->residency();
  const PoolCtx pc{*xfer_, cs, *cache_, work_};
  const pdl::PlainLaunches plain(n > kMaxGraphTokens);  // PDL for decode-sized passes only (pdl_scope.h)
  begin_forward(pc, ws, ws.step_in, ws.step_host.data(), sl.bytes);
  // A sequence starting at position 0 starts from a zero recurrent state (a new or reset sequence; its
  // device state may hold an earlier conversation's). Ordered on compute before this pass's kernels.
  for (int64_t r = 0; r < n_runs; ++r) {
    const Run& run = ws.runs[size_t(r)];
    if (!run.fresh) continue;
    xfer_->fill(run.st->conv.span(), 0, cs, {&cs});
    xfer_->fill(run.st->ssm.span(), 0, cs, {&cs});
    work_.transfers += 2;
  }

  bool all_resident = true;
  for (int il = 0; il < np_.n_layer && all_resident; ++il) all_resident = res.resident_in_layer(il) == hp.n_expert;
  // Direct reads in decode-sized CPU-pool passes (moe/direct_rule.h; qwen3next has no decode streaming).
  const int direct = !all_resident && n < moe::kMoeGroupedMinTokens ? direct_share_ : 0;
  const Pass p{ws, n, n_out, n_runs, pass_attention_span(n_kv, ws.n_ctx_max), opt.attn, true, !all_resident, direct};
  if (all_resident && graphs_ && n <= kMaxGraphTokens) {
    run_graph(p);
  } else if (all_resident) {
    compute_resident(p);
  } else if (gated_ && n <= kMaxGraphTokens && pool_fits_gated(ws, *xfer_, n, hp.n_embd)) {
    forward_gated(p, pool, opt);
    finish_forward(pc, ws, n, n_out, V, logits, opt.sampling, opt.usage, t_start);
    ws.gates->check();  // the stream drained
    return;
  } else {
    embed(p);
    for (int il = 0; il < np_.n_layer; ++il) {
      layer_front(p, il);
      if (res.resident_in_layer(il) == hp.n_expert) {
        // Every expert of the layer is resident: all on the GPU. The ids go to the host with the other
        // layers' after the last layer (statistics, adaptation).
        gpu_experts(p, il);
        shared_expert(p, layers_[size_t(il)]);
        add_ffn_out(p, il);
      } else {
        pool_experts(p, il, pool, opt);
      }
    }
    output(p);
  }
  finish_forward(pc, ws, n, n_out, V, logits, opt.sampling, opt.usage, t_start);
}

}  // namespace

std::unique_ptr<Model> make_qwen3next_cuda(gguf::File file, const CudaOptions& opt) {
  HParams hp = read_common_hparams(file);
  STRATA_REQUIRE(hp.arch == "qwen3next", "{}: architecture '{}' is not qwen3next", file.path(), hp.arch);
  NextParams np = qwen3next::read_next_params(file, hp);
  return std::make_unique<CudaQwen3Next>(std::move(file), std::move(hp), std::move(np), opt);
}

}  // namespace strata::cuda
