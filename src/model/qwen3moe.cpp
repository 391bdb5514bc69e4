#include "model/qwen3moe.h"

#include <cmath>
#include <cstring>

#include "cpu/matmul_batch.h"
#include "cpu/ops.h"
#include "model/moe_ffn.h"
#include "model/weights.h"
#include "moe/expert_usage.h"

namespace strata {
namespace {

struct Layer {
  Weight attn_norm;  // [n_embd] f32
  Weight wq;         // [n_embd][n_head * head_dim]
  Weight wk;         // [n_embd][n_head_kv * head_dim]
  Weight wv;         // [n_embd][n_head_kv * head_dim_v]
  Weight q_norm;     // [head_dim] f32
  Weight k_norm;     // [head_dim] f32
  Weight wo;         // [n_head * head_dim_v][n_embd]
  Weight ffn_norm;   // [n_embd] f32
  Weight router;     // [n_embd][n_expert]
  ExpertWeights experts;
};

class Qwen3MoeWorkspace final : public Workspace {
 public:
  Qwen3MoeWorkspace(const HParams& hp, int32_t max_tok, int32_t n_ctx, int n_threads)
      : n_tok_max(max_tok),
        n_ctx_max(n_ctx),
        x(size_t(max_tok) * hp.n_embd),
        xn(size_t(max_tok) * hp.n_embd),
        tmp(size_t(max_tok) * hp.n_embd),
        q(size_t(max_tok) * hp.n_head * hp.head_dim),
        k(size_t(max_tok) * hp.n_head_kv * hp.head_dim),
        v(size_t(max_tok) * hp.n_head_kv * hp.head_dim_v),
        att(size_t(max_tok) * hp.n_head * hp.head_dim_v),
        router(size_t(max_tok) * hp.n_expert),
        ids(size_t(max_tok) * hp.n_expert_used),
        wts(size_t(max_tok) * hp.n_expert_used),
        tokens(size_t(max_tok)),
        pos(size_t(max_tok)),
        kv(size_t(max_tok)),
        scores(size_t(n_threads) * n_ctx),
        moe(max_tok, hp.n_expert_used, hp.n_expert, hp.n_embd, hp.n_ff_exp),
        mb(n_threads, max_tok) {}
  int32_t max_tokens() const override { return n_tok_max; }
  size_t memory_bytes() const override {
    return (x.size() + xn.size() + tmp.size() + q.size() + k.size() + v.size() + att.size() +
            router.size() + wts.size() + scores.size()) * 4 + moe.memory_bytes();
  }

  int32_t n_tok_max, n_ctx_max;
  std::vector<float> x;       // [n_tok][n_embd] residual stream
  std::vector<float> xn;      // [n_tok][n_embd] normed input of a sub-block
  std::vector<float> tmp;     // [n_tok][n_embd] sub-block output
  std::vector<float> q;       // [n_tok][n_head][head_dim]
  std::vector<float> k;       // [n_tok][n_head_kv][head_dim]
  std::vector<float> v;       // [n_tok][n_head_kv][head_dim_v]
  std::vector<float> att;     // [n_tok][n_head][head_dim_v]
  std::vector<float> router;  // [n_tok][n_expert]
  std::vector<int32_t> ids;   // [n_tok][n_expert_used]
  std::vector<float> wts;     // [n_tok][n_expert_used]
  std::vector<int32_t> tokens, pos;  // [n_tok]
  std::vector<cpu::AttnKv> kv;       // [n_tok]
  std::vector<float> scores;  // [n_threads][n_ctx] attention scratch
  MoeScratch moe;
  cpu::MatmulBatch mb;
};

class Qwen3Moe final : public Model {
 public:
  Qwen3Moe(gguf::File file, HParams hp) : Model(std::move(file), std::move(hp)) { load(); }

  std::unique_ptr<SequenceState> new_sequence(int32_t n_ctx, KvType kv_type) const override {
    return std::make_unique<SequenceState>(n_ctx, kv_type,
                                           std::vector<bool>(size_t(hp_.n_layer), true),
                                           hp_.n_head_kv, hp_.head_dim, hp_.head_dim_v);
  }
  std::unique_ptr<Workspace> new_workspace(int32_t max_tokens, int32_t n_ctx,
                                           int n_threads) const override {
    STRATA_REQUIRE(max_tokens >= 1 && n_ctx >= 1 && n_threads >= 1,
                   "workspace: batch {}, context {}, threads {} must all be >= 1", max_tokens, n_ctx,
                   n_threads);
    return std::make_unique<Qwen3MoeWorkspace>(hp_, max_tokens, n_ctx, n_threads);
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

  Weight tok_embd_;     // [n_embd][n_vocab]
  Weight output_norm_;  // [n_embd] f32
  Weight output_;       // [n_embd][n_vocab] (token_embd when tied)
  std::vector<Layer> layers_;
  size_t weight_bytes_ = 0;
};

void Qwen3Moe::load() {
  HParams& hp = hp_;
  check_moe_hparams_and_vocab(hp, file_);

  const int64_t E = hp.n_embd, V = hp.n_vocab, D = hp.head_dim, Dv = hp.head_dim_v;
  const int64_t H = hp.n_head, Hkv = hp.n_head_kv, X = hp.n_expert, F = hp.n_ff_exp;
  WeightLoader L(file_);
  tok_embd_ = L.matrix("token_embd.weight", {E, V});
  output_norm_ = L.f32("output_norm.weight", {E});
  output_ = L.optional_matrix("output.weight", {E, V});
  if (!output_) output_ = tok_embd_;  // tied embeddings
  layers_.resize(size_t(hp.n_layer));
  for (int il = 0; il < hp.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    Layer& l = layers_[size_t(il)];
    l.attn_norm = L.f32(p + "attn_norm.weight", {E});
    l.wq = L.matrix(p + "attn_q.weight", {E, H * D});
    l.wk = L.matrix(p + "attn_k.weight", {E, Hkv * D});
    l.wv = L.matrix(p + "attn_v.weight", {E, Hkv * Dv});
    l.q_norm = L.f32(p + "attn_q_norm.weight", {D});
    l.k_norm = L.f32(p + "attn_k_norm.weight", {D});
    l.wo = L.matrix(p + "attn_output.weight", {H * Dv, E});
    l.ffn_norm = L.f32(p + "ffn_norm.weight", {E});
    l.router = L.matrix(p + "ffn_gate_inp.weight", {E, X});
    l.experts.gate = L.matrix(p + "ffn_gate_exps.weight", {E, F, X});
    l.experts.up = L.matrix(p + "ffn_up_exps.weight", {E, F, X});
    l.experts.down = L.matrix(p + "ffn_down_exps.weight", {F, E, X});
  }
  for (const auto& t : file_.tensors()) weight_bytes_ += t.nbytes;
}

void Qwen3Moe::forward(const Batch& batch, Workspace& wsb, float* logits, ThreadPool& pool,
                       const ForwardOptions& opt) const {
  const MatmulMode mode = opt.mode;
  auto& ws = static_cast<Qwen3MoeWorkspace&>(wsb);
  STRATA_REQUIRE(!opt.sampling, "forward: the CPU backend does not sample inside the pass (samples_on_device)");
  const HParams& hp = hp_;
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  STRATA_REQUIRE(n >= 1 && n <= ws.n_tok_max, "forward: batch of {} tokens, workspace holds {}", n,
                 ws.n_tok_max);
  const int64_t E = hp.n_embd, H = hp.n_head, Hkv = hp.n_head_kv, D = hp.head_dim;
  const int64_t Dv = hp.head_dim_v, k_used = hp.n_expert_used;
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& bt = batch.tokens[size_t(t)];
    STRATA_REQUIRE(bt.seq >= 0 && size_t(bt.seq) < batch.seqs.size(), "forward: bad sequence index");
    STRATA_REQUIRE(bt.pos >= 0 && bt.pos < batch.seqs[size_t(bt.seq)]->n_ctx() &&
                       bt.pos < ws.n_ctx_max,
                   "forward: position {} outside the context", bt.pos);
    STRATA_REQUIRE(bt.token >= 0 && bt.token < hp.n_vocab,
                   "token id {} is out of range: the vocabulary has {} tokens (0..{})", bt.token,
                   hp.n_vocab, hp.n_vocab - 1);
    STRATA_REQUIRE(batch.seqs[size_t(bt.seq)]->kv_type() == batch.seqs[0]->kv_type(),
                   "forward: all sequences of a batch must share one KV type");
    ws.tokens[size_t(t)] = bt.token;
    ws.pos[size_t(t)] = bt.pos;
  }
  float* x = ws.x.data();
  float* xn = ws.xn.data();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  STRATA_REQUIRE(!opt.usage || (opt.usage->n_layer() == hp.n_layer &&
                                 opt.usage->n_expert() == hp.n_expert &&
                                 opt.usage->n_expert_used() == hp.n_expert_used),
                 "forward: expert-usage counter shaped for another model");
  cpu::get_rows(tok_embd_.type, tok_embd_.data, E, ws.tokens.data(), n, x);
  for (int il = 0; il < hp.n_layer; ++il) {
    const Layer& l = layers_[size_t(il)];
    // --- attention ---
    cpu::rmsnorm(x, l.attn_norm.f32(), n, E, hp.rms_eps, xn);
    ws.mb.clear();
    ws.mb.add({l.wq.type, l.wq.data, H * D, E, xn, n, ws.q.data()});
    ws.mb.add({l.wk.type, l.wk.data, Hkv * D, E, xn, n, ws.k.data()});
    ws.mb.add({l.wv.type, l.wv.data, Hkv * Dv, E, xn, n, ws.v.data()});
    ws.mb.run(mode, pool);
    cpu::rmsnorm(ws.q.data(), l.q_norm.f32(), n * H, D, hp.rms_eps, ws.q.data());
    cpu::rmsnorm(ws.k.data(), l.k_norm.f32(), n * Hkv, D, hp.rms_eps, ws.k.data());
    cpu::rope_neox(ws.q.data(), ws.pos.data(), n, int(H), int(D), hp.n_rot, hp.rope_base);
    cpu::rope_neox(ws.k.data(), ws.pos.data(), n, int(Hkv), int(D), hp.n_rot, hp.rope_base);
    for (int64_t t = 0; t < n; ++t) {
      const BatchToken& bt = batch.tokens[size_t(t)];
      SequenceState& seq = *batch.seqs[size_t(bt.seq)];
      cpu::kv_store(seq.kv_type(), ws.k.data() + t * Hkv * D, Hkv * D, seq.k_at(il, bt.pos));
      cpu::kv_store(seq.kv_type(), ws.v.data() + t * Hkv * Dv, Hkv * Dv, seq.v_at(il, bt.pos));
      ws.kv[size_t(t)] = {seq.k_at(il, 0), seq.v_at(il, 0), bt.pos + 1};
    }
    cpu::attention(ws.q.data(), ws.kv.data(), n, int(H), int(Hkv), int(D), int(Dv),
                   batch.seqs[0]->kv_type(), scale, ws.att.data(), ws.scores.data(), ws.n_ctx_max,
                   pool, opt.attn);
    matmul_into(l.wo, ws.att.data(), n, ws.tmp.data(), pool, mode);
    cpu::add_inplace(x, ws.tmp.data(), n * E);
    // --- MoE FFN ---
    cpu::rmsnorm(x, l.ffn_norm.f32(), n, E, hp.rms_eps, xn);
    matmul_into(l.router, xn, n, ws.router.data(), pool, mode);
    cpu::moe_route(ws.router.data(), n, hp.n_expert, int(k_used), hp.expert_weights_norm,
                   ws.ids.data(), ws.wts.data());
    if (opt.usage) opt.usage->add(int(il), ws.ids.data(), n);
    moe_experts(l.experts, xn, n, ws.ids.data(), ws.wts.data(), int(k_used), ws.tmp.data(), ws.moe,
                ws.mb, pool, mode);
    cpu::add_inplace(x, ws.tmp.data(), n * E);
  }
  // --- output: only the rows that want logits, packed ---
  int64_t n_out = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (!batch.tokens[size_t(t)].logits) continue;
    if (n_out != t) std::memcpy(x + n_out * E, x + t * E, size_t(E) * 4);
    ++n_out;
  }
  if (n_out == 0) return;
  cpu::rmsnorm(x, output_norm_.f32(), n_out, E, hp.rms_eps, xn);
  matmul_into(output_, xn, n_out, logits, pool, mode);
}

}  // namespace

std::unique_ptr<Model> make_qwen3moe(gguf::File file) {
  HParams hp = read_common_hparams(file);
  STRATA_REQUIRE(hp.arch == "qwen3moe", "{}: architecture '{}' is not qwen3moe", file.path(),
                 hp.arch);
  return std::make_unique<Qwen3Moe>(std::move(file), std::move(hp));
}

}  // namespace strata
