#include "model/qwen3next.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include "cpu/gdn.h"
#include "cpu/matmul_batch.h"
#include "cpu/ops.h"
#include "model/moe_ffn.h"
#include "model/qwen3next_weights.h"
#include "model/weights.h"
#include "moe/expert_usage.h"
#include "quant/dequant.h"

namespace strata {
namespace {

std::atomic<int>& prefill_form() {
  static std::atomic<int> form = [] {
    const char* e = std::getenv("STRATA_GDN_PREFILL");
    if (!e || std::string(e) == "recurrent") return int(GdnPrefill::Recurrent);
    if (std::string(e) == "chunked") return int(GdnPrefill::Chunked);
    fail("STRATA_GDN_PREFILL='{}': expected recurrent or chunked", e);
  }();
  return form;
}

using qwen3next::AttnWeights;
using qwen3next::GdnWeights;
using qwen3next::Layer;
using qwen3next::NextParams;

// A run of consecutive batch tokens of one sequence: the recurrent layers consume it in order.
struct Run {
  int32_t seq, t0, t1;
};

class Qwen3NextWorkspace final : public Workspace {
 public:
  Qwen3NextWorkspace(const HParams& hp, const NextParams& np, int32_t max_tok, int32_t n_ctx,
                     int n_threads)
      : n_tok_max(max_tok),
        n_ctx_max(n_ctx),
        x(sz(max_tok, hp.n_embd)),
        xn(sz(max_tok, hp.n_embd)),
        tmp(sz(max_tok, hp.n_embd)),
        qkv(sz(max_tok, np.conv_dim())),
        conv(sz(max_tok, np.conv_dim())),
        qkvz(sz(max_tok, np.conv_dim() + np.value_dim())),
        z(sz(max_tok, np.value_dim())),
        ba(sz(max_tok, 2 * np.n_v_heads)),
        g(sz(max_tok, np.n_v_heads)),
        beta(sz(max_tok, np.n_v_heads)),
        gq(sz(max_tok, np.key_dim())),
        gk(sz(max_tok, np.key_dim())),
        gv(sz(max_tok, np.value_dim())),
        go(sz(max_tok, np.value_dim())),
        qg(sz(max_tok, int64_t(hp.n_head) * 2 * hp.head_dim)),
        q(sz(max_tok, int64_t(hp.n_head) * hp.head_dim)),
        qgate(sz(max_tok, int64_t(hp.n_head) * hp.head_dim_v)),
        k(sz(max_tok, int64_t(hp.n_head_kv) * hp.head_dim)),
        v(sz(max_tok, int64_t(hp.n_head_kv) * hp.head_dim_v)),
        att(sz(max_tok, int64_t(hp.n_head) * hp.head_dim_v)),
        router(sz(max_tok, hp.n_expert)),
        ids(sz(max_tok, hp.n_expert_used)),
        wts(sz(max_tok, hp.n_expert_used)),
        sh_g(sz(max_tok, np.n_ff_shexp)),
        sh_u(sz(max_tok, np.n_ff_shexp)),
        sh_out(sz(max_tok, hp.n_embd)),
        sh_logit(sz(max_tok, 1)),
        tokens(size_t(max_tok)),
        pos(size_t(max_tok)),
        kv(size_t(max_tok)),
        runs(size_t(max_tok)),
        scores(sz(n_threads, n_ctx)),
        moe(max_tok, hp.n_expert_used, hp.n_expert, hp.n_embd, hp.n_ff_exp),
        mb(n_threads, max_tok) {}
  static size_t sz(int64_t a, int64_t b) { return size_t(a) * size_t(b); }
  int32_t max_tokens() const override { return n_tok_max; }
  size_t memory_bytes() const override {
    size_t f = 0;
    for (const auto* b : {&x, &xn, &tmp, &qkv, &conv, &qkvz, &z, &ba, &g, &beta, &gq, &gk, &gv, &go,
                          &qg, &q, &qgate, &k, &v, &att, &router, &wts, &sh_g, &sh_u, &sh_out,
                          &sh_logit, &scores})
      f += b->size();
    return f * 4 + moe.memory_bytes();
  }

  int32_t n_tok_max, n_ctx_max;
  std::vector<float> x;      // [n_tok][n_embd] residual stream
  std::vector<float> xn;     // [n_tok][n_embd] normed input of a sub-block
  std::vector<float> tmp;    // [n_tok][n_embd] sub-block output
  // Gated DeltaNet
  std::vector<float> qkv;    // [n_tok][conv_dim]      attn_qkv output (q | k | v)
  std::vector<float> conv;   // [n_tok][conv_dim]      after conv1d + SiLU
  std::vector<float> qkvz;   // [n_tok][conv_dim + value_dim]  legacy ssm_in output
  std::vector<float> z;      // [n_tok][n_v_heads][head_dim]   attn_gate output
  std::vector<float> ba;     // [n_tok][2 * n_v_heads]
  std::vector<float> g;      // [n_tok][n_v_heads]     log-decay
  std::vector<float> beta;   // [n_tok][n_v_heads]
  std::vector<float> gq, gk; // [n_tok][n_k_heads][head_dim]
  std::vector<float> gv, go; // [n_tok][n_v_heads][head_dim]
  // gated attention
  std::vector<float> qg;     // [n_tok][n_head][2 * head_dim]
  std::vector<float> q;      // [n_tok][n_head][head_dim]
  std::vector<float> qgate;  // [n_tok][n_head][head_dim_v]
  std::vector<float> k;      // [n_tok][n_head_kv][head_dim]
  std::vector<float> v;      // [n_tok][n_head_kv][head_dim_v]
  std::vector<float> att;    // [n_tok][n_head][head_dim_v]
  // MoE + shared expert
  std::vector<float> router;   // [n_tok][n_expert]
  std::vector<int32_t> ids;    // [n_tok][n_expert_used]
  std::vector<float> wts;      // [n_tok][n_expert_used]
  std::vector<float> sh_g, sh_u;  // [n_tok][n_ff_shexp]
  std::vector<float> sh_out;   // [n_tok][n_embd]
  std::vector<float> sh_logit; // [n_tok]
  std::vector<int32_t> tokens, pos;  // [n_tok]
  std::vector<cpu::AttnKv> kv;       // [n_tok]
  std::vector<Run> runs;             // [<= n_tok]
  std::vector<float> scores;         // [n_threads][n_ctx] attention scratch
  MoeScratch moe;
  cpu::MatmulBatch mb;
};

class Qwen3Next final : public Model {
 public:
  Qwen3Next(gguf::File file, HParams hp, NextParams np)
      : Model(std::move(file), std::move(hp)), np_(std::move(np)) {
    load();
  }

  int32_t routed_layers() const override { return np_.n_layer; }  // the MTP blocks do not run

  // One object per sequence: the KV cache of each attention layer (n_ctx positions) and the conv +
  // delta-rule state of each Gated DeltaNet layer, all allocated here.
  std::unique_ptr<SequenceState> new_sequence(int32_t n_ctx, KvType kv_type) const override {
    std::vector<bool> attn(size_t(np_.n_layer));
    for (int il = 0; il < np_.n_layer; ++il) attn[size_t(il)] = !np_.recurrent[size_t(il)];
    auto s = std::make_unique<SequenceState>(n_ctx, kv_type, attn, hp_.n_head_kv, hp_.head_dim,
                                             hp_.head_dim_v);
    for (int il = 0; il < np_.n_layer; ++il) {
      if (!np_.recurrent[size_t(il)]) continue;
      LayerRecurrent& r = s->recurrent()[size_t(il)];
      r.conv.assign(size_t(np_.conv_kernel - 1) * size_t(np_.conv_dim()), 0.0f);  // [K-1][conv_dim]
      r.state.assign(size_t(np_.n_v_heads) * np_.head_dim * np_.head_dim, 0.0f);  // [Hv][D][D]
    }
    return s;
  }
  std::unique_ptr<Workspace> new_workspace(int32_t max_tokens, int32_t n_ctx,
                                           int n_threads) const override {
    STRATA_REQUIRE(max_tokens >= 1 && n_ctx >= 1 && n_threads >= 1,
                   "workspace: batch {}, context {}, threads {} must all be >= 1", max_tokens, n_ctx,
                   n_threads);
    return std::make_unique<Qwen3NextWorkspace>(hp_, np_, max_tokens, n_ctx, n_threads);
  }
  size_t weight_bytes() const override { return weight_bytes_; }
  void forward(const Batch& batch, Workspace& ws, float* logits, ThreadPool& pool,
               const ForwardOptions& opt) const override;

 private:
  void load();
  void matmul_into(const Weight& w, const float* x, int64_t n, float* y, ThreadPool& pool,
                   MatmulMode mode) const {
    matmul(w.type, w.data, w.ne[1], w.ne[0], x, n, y, mode, pool);
  }
  int64_t collect_runs(const Batch& batch, Qwen3NextWorkspace& ws) const;
  void gdn_block(const Layer& l, const Batch& batch, Qwen3NextWorkspace& ws, int64_t n,
                 int64_t n_runs, int il, ThreadPool& pool, MatmulMode mode) const;
  void attention_block(const Layer& l, const Batch& batch, Qwen3NextWorkspace& ws, int64_t n,
                       int il, ThreadPool& pool, const ForwardOptions& opt) const;
  // usage: when given, counts the routed experts of layer il (strata profile).
  void ffn_block(const Layer& l, Qwen3NextWorkspace& ws, int64_t n, int il, moe::ExpertUsage* usage,
                 ThreadPool& pool, MatmulMode mode) const;

  NextParams np_;
  qwen3next::Weights w_;  // every tensor, checked (model/qwen3next_weights.h); MTP blocks kept, not run
  size_t weight_bytes_ = 0;
};

// --------------------------------------------------------------------------------------------------------
// Loading

void Qwen3Next::load() {
  check_moe_hparams_and_vocab(hp_, file_);
  qwen3next::load_weights(file_, hp_, np_, w_);
  for (const auto& t : file_.tensors()) weight_bytes_ += t.nbytes;
}

// --------------------------------------------------------------------------------------------------------
// Forward

// Groups the batch into runs of consecutive tokens of one sequence. A recurrent state is a summary of
// every token so far, so each sequence's tokens must come as one run continuing where it stopped.
int64_t Qwen3Next::collect_runs(const Batch& batch, Qwen3NextWorkspace& ws) const {
  const int64_t n = int64_t(batch.tokens.size());
  int64_t n_runs = 0;
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& bt = batch.tokens[size_t(t)];
    if (n_runs > 0 && ws.runs[size_t(n_runs - 1)].seq == bt.seq) {
      STRATA_REQUIRE(bt.pos == batch.tokens[size_t(t - 1)].pos + 1,
                     "forward: qwen3next needs each sequence's tokens in order (position {} after {})",
                     bt.pos, batch.tokens[size_t(t - 1)].pos);
      ws.runs[size_t(n_runs - 1)].t1 = int32_t(t + 1);
      continue;
    }
    for (int64_t r = 0; r < n_runs; ++r)
      STRATA_REQUIRE(ws.runs[size_t(r)].seq != bt.seq,
                     "forward: qwen3next needs each sequence's tokens contiguous in the batch");
    const SequenceState& s = *batch.seqs[size_t(bt.seq)];
    STRATA_REQUIRE(bt.pos == s.n_past(),
                   "forward: qwen3next's recurrent state holds {} tokens, the batch continues at "
                   "position {}",
                   s.n_past(), bt.pos);
    ws.runs[size_t(n_runs++)] = {bt.seq, int32_t(t), int32_t(t + 1)};
  }
  return n_runs;
}

void Qwen3Next::gdn_block(const Layer& l, const Batch& batch, Qwen3NextWorkspace& ws, int64_t n,
                          int64_t n_runs, int il, ThreadPool& pool, MatmulMode mode) const {
  const GdnWeights& w = l.gdn;
  const int64_t E = hp_.n_embd, C = np_.conv_dim(), Vd = np_.value_dim();
  const int64_t Hk = np_.n_k_heads, Hv = np_.n_v_heads, D = np_.head_dim;
  const float* xn = ws.xn.data();
  // input projections: q|k|v (conv channels), z (output gate), b|a (write strength, decay)
  ws.mb.clear();
  if (w.qkv) {
    ws.mb.add({w.qkv.type, w.qkv.data, C, E, xn, n, ws.qkv.data()});
    ws.mb.add({w.gate.type, w.gate.data, Vd, E, xn, n, ws.z.data()});
  } else {
    ws.mb.add({w.qkvz.type, w.qkvz.data, C + Vd, E, xn, n, ws.qkvz.data()});
  }
  ws.mb.add({w.ba.type, w.ba.data, 2 * Hv, E, xn, n, ws.ba.data()});
  ws.mb.run(mode, pool);
  if (!w.qkv) gdn_unpack_qkvz(ws.qkvz.data(), n, Hk, Hv, D, ws.qkv.data(), ws.z.data());
  gdn_gates(ws.ba.data(), n, Hk, Hv, w.a.f32(), w.dt_bias.f32(), ws.g.data(), ws.beta.data());
  // causal conv1d + SiLU, per sequence (each carries its last K-1 inputs)
  for (int64_t r = 0; r < n_runs; ++r) {
    const Run& run = ws.runs[size_t(r)];
    LayerRecurrent& st = batch.seqs[size_t(run.seq)]->recurrent()[size_t(il)];
    gdn_conv1d_silu(ws.qkv.data() + run.t0 * C, run.t1 - run.t0, C, np_.conv_kernel,
                    st.conv.data(), w.conv, ws.conv.data() + run.t0 * C);
  }
  gdn_split_qkv(ws.conv.data(), n, Hk, Hv, D, hp_.rms_eps, ws.gq.data(), ws.gk.data(),
                ws.gv.data());
  // gated delta rule, per sequence (the prompt form: qwen3next.h)
  const float q_scale = 1.0f / std::sqrt(float(D));
  for (int64_t r = 0; r < n_runs; ++r) {
    const Run& run = ws.runs[size_t(r)];
    LayerRecurrent& st = batch.seqs[size_t(run.seq)]->recurrent()[size_t(il)];
    const int64_t t0 = run.t0, len = run.t1 - run.t0;
    const DeltaRuleShape shape{len, Hk, Hv, D};
    const float *q = ws.gq.data() + t0 * Hk * D, *k = ws.gk.data() + t0 * Hk * D;
    const float *v = ws.gv.data() + t0 * Hv * D, *g = ws.g.data() + t0 * Hv;
    const float* beta = ws.beta.data() + t0 * Hv;
    float* o = ws.go.data() + t0 * Hv * D;
    if (len == 1 || qwen3next_gdn_prefill() == GdnPrefill::Recurrent)
      gdn_delta_rule_recurrent(shape, q, k, v, g, beta, q_scale, st.state.data(), o, pool);
    else
      gdn_delta_rule_chunked(shape, q, k, v, g, beta, q_scale, st.state.data(), o, pool);
  }
  gated_rms_norm(ws.go.data(), ws.z.data(), w.norm.f32(), n * Hv, D, hp_.rms_eps, ws.go.data());
  matmul_into(w.out, ws.go.data(), n, ws.tmp.data(), pool, mode);
}

void Qwen3Next::attention_block(const Layer& l, const Batch& batch, Qwen3NextWorkspace& ws,
                                int64_t n, int il, ThreadPool& pool,
                                const ForwardOptions& opt) const {
  const MatmulMode mode = opt.mode;
  const AttnWeights& w = l.attn;
  const int64_t E = hp_.n_embd, H = hp_.n_head, Hkv = hp_.n_head_kv, D = hp_.head_dim;
  const int64_t Dv = hp_.head_dim_v;
  const float* xn = ws.xn.data();
  ws.mb.clear();
  ws.mb.add({w.wq.type, w.wq.data, H * 2 * D, E, xn, n, ws.qg.data()});
  ws.mb.add({w.wk.type, w.wk.data, Hkv * D, E, xn, n, ws.k.data()});
  ws.mb.add({w.wv.type, w.wv.data, Hkv * Dv, E, xn, n, ws.v.data()});
  ws.mb.run(mode, pool);
  split_q_gate(ws.qg.data(), n, H, D, ws.q.data(), ws.qgate.data());
  cpu::rmsnorm(ws.q.data(), w.q_norm.f32(), n * H, D, hp_.rms_eps, ws.q.data());
  cpu::rmsnorm(ws.k.data(), w.k_norm.f32(), n * Hkv, D, hp_.rms_eps, ws.k.data());
  cpu::rope_neox(ws.q.data(), ws.pos.data(), n, int(H), int(D), hp_.n_rot, hp_.rope_base);
  cpu::rope_neox(ws.k.data(), ws.pos.data(), n, int(Hkv), int(D), hp_.n_rot, hp_.rope_base);
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& bt = batch.tokens[size_t(t)];
    SequenceState& seq = *batch.seqs[size_t(bt.seq)];
    cpu::kv_store(seq.kv_type(), ws.k.data() + t * Hkv * D, Hkv * D, seq.k_at(il, bt.pos));
    cpu::kv_store(seq.kv_type(), ws.v.data() + t * Hkv * Dv, Hkv * Dv, seq.v_at(il, bt.pos));
    ws.kv[size_t(t)] = {seq.k_at(il, 0), seq.v_at(il, 0), bt.pos + 1};
  }
  cpu::attention(ws.q.data(), ws.kv.data(), n, int(H), int(Hkv), int(D), int(Dv),
                 batch.seqs[0]->kv_type(), 1.0f / std::sqrt(float(D)), ws.att.data(),
                 ws.scores.data(), ws.n_ctx_max, pool, opt.attn);
  mul_sigmoid(ws.att.data(), ws.qgate.data(), n * H * Dv);
  matmul_into(w.wo, ws.att.data(), n, ws.tmp.data(), pool, mode);
}

void Qwen3Next::ffn_block(const Layer& l, Qwen3NextWorkspace& ws, int64_t n, int il, moe::ExpertUsage* usage,
                          ThreadPool& pool, MatmulMode mode) const {
  const int64_t E = hp_.n_embd, X = hp_.n_expert, Fs = np_.n_ff_shexp;
  const float* xn = ws.xn.data();
  ws.mb.clear();
  ws.mb.add({l.router.type, l.router.data, X, E, xn, n, ws.router.data()});
  ws.mb.add({l.sh_gate.type, l.sh_gate.data, Fs, E, xn, n, ws.sh_g.data()});
  ws.mb.add({l.sh_up.type, l.sh_up.data, Fs, E, xn, n, ws.sh_u.data()});
  ws.mb.add({GgmlType::F32, l.sh_gate_inp.data, 1, E, xn, n, ws.sh_logit.data()});
  ws.mb.run(mode, pool);
  // routed experts
  cpu::moe_route(ws.router.data(), n, hp_.n_expert, hp_.n_expert_used, hp_.expert_weights_norm,
                 ws.ids.data(), ws.wts.data());
  if (usage) usage->add(il, ws.ids.data(), n);
  moe_experts(l.experts, xn, n, ws.ids.data(), ws.wts.data(), hp_.n_expert_used, ws.tmp.data(),
              ws.moe, ws.mb, pool, mode);
  // shared expert, scaled by sigmoid(ffn_gate_inp_shexp . x)
  cpu::swiglu(ws.sh_g.data(), ws.sh_u.data(), n * Fs, ws.sh_g.data());
  matmul_into(l.sh_down, ws.sh_g.data(), n, ws.sh_out.data(), pool, mode);
  add_sigmoid_scaled(ws.tmp.data(), ws.sh_out.data(), ws.sh_logit.data(), n, E);
}

void Qwen3Next::forward(const Batch& batch, Workspace& wsb, float* logits, ThreadPool& pool,
                        const ForwardOptions& opt) const {
  const MatmulMode mode = opt.mode;
  auto& ws = static_cast<Qwen3NextWorkspace&>(wsb);
  STRATA_REQUIRE(!opt.sampling, "forward: the CPU backend does not sample inside the pass (samples_on_device)");
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  STRATA_REQUIRE(n >= 1 && n <= ws.n_tok_max, "forward: batch of {} tokens, workspace holds {}", n,
                 ws.n_tok_max);
  const int64_t E = hp_.n_embd;
  STRATA_REQUIRE(!opt.usage || (opt.usage->n_layer() == np_.n_layer && opt.usage->n_expert() == hp_.n_expert &&
                                opt.usage->n_expert_used() == hp_.n_expert_used),
                 "forward: expert-usage counter shaped for another model");
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& bt = batch.tokens[size_t(t)];
    STRATA_REQUIRE(bt.seq >= 0 && size_t(bt.seq) < batch.seqs.size(), "forward: bad sequence index");
    STRATA_REQUIRE(bt.pos >= 0 && bt.pos < batch.seqs[size_t(bt.seq)]->n_ctx() &&
                       bt.pos < ws.n_ctx_max,
                   "forward: position {} outside the context", bt.pos);
    ws.tokens[size_t(t)] = bt.token;
    ws.pos[size_t(t)] = bt.pos;
  }
  const int64_t n_runs = collect_runs(batch, ws);
  float* x = ws.x.data();
  float* xn = ws.xn.data();

  cpu::get_rows(w_.tok_embd.type, w_.tok_embd.data, E, ws.tokens.data(), n, x);
  for (int il = 0; il < np_.n_layer; ++il) {
    const Layer& l = w_.layers[size_t(il)];
    cpu::rmsnorm(x, l.attn_norm.f32(), n, E, hp_.rms_eps, xn);
    if (l.recurrent)
      gdn_block(l, batch, ws, n, n_runs, il, pool, mode);
    else
      attention_block(l, batch, ws, n, il, pool, opt);
    cpu::add_inplace(x, ws.tmp.data(), n * E);
    cpu::rmsnorm(x, l.post_norm.f32(), n, E, hp_.rms_eps, xn);
    ffn_block(l, ws, n, il, opt.usage, pool, mode);
    cpu::add_inplace(x, ws.tmp.data(), n * E);
  }
  // output: only the rows that want logits, packed
  int64_t n_out = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (!batch.tokens[size_t(t)].logits) continue;
    if (n_out != t) std::memcpy(x + n_out * E, x + t * E, size_t(E) * 4);
    ++n_out;
  }
  if (n_out == 0) return;
  cpu::rmsnorm(x, w_.output_norm.f32(), n_out, E, hp_.rms_eps, xn);
  matmul_into(w_.output, xn, n_out, logits, pool, mode);
}

}  // namespace

void set_qwen3next_gdn_prefill(GdnPrefill form) { prefill_form() = int(form); }
GdnPrefill qwen3next_gdn_prefill() { return GdnPrefill(prefill_form().load()); }

std::unique_ptr<Model> make_qwen3next(gguf::File file) {
  HParams hp = read_common_hparams(file);
  STRATA_REQUIRE(hp.arch == "qwen3next", "{}: architecture '{}' is not qwen3next", file.path(),
                 hp.arch);
  NextParams np = qwen3next::read_next_params(file, hp);
  return std::make_unique<Qwen3Next>(std::move(file), std::move(hp), std::move(np));
}

}  // namespace strata
