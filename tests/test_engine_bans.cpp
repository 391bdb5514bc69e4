// Engine::decode_sample with banned tokens (SampleBans: a server request's ignore_eos). The flagged
// sequences pick as their Sampler would from logits whose banned ids are -inf, the others as without bans;
// on the CPU path (the logits edited in the engine's memory) and through a model that picks inside its pass
// (DeviceSampling::ban, the GPU's path, here a CPU stand-in), across passes of n_batch sequences. Bad bans
// are refused before anything is evaluated. Also samplers with different parameters in one batch
// (DeviceSampling::rules, EngineOptions::mixed_device_sampling).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <vector>

#include "cpu/ops.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "tiny_model.h"

using namespace strata;
using namespace strata::test;

namespace {

// A model that runs another one and, asked to sample (greedy only), picks the argmax of each row after
// cpu::ban_tokens on its flagged rows: what the CUDA models do on the device. Counts the rows it banned and
// records the rows' own rules (DeviceSampling::rules).
class PickingModel final : public Model {
 public:
  PickingModel(gguf::File file, std::shared_ptr<const Model> inner)
      : Model(std::move(file), inner->hparams()), inner_(std::move(inner)) {}

  std::unique_ptr<SequenceState> new_sequence(int32_t n_ctx, KvType kv_type) const override {
    return inner_->new_sequence(n_ctx, kv_type);
  }
  std::unique_ptr<Workspace> new_workspace(int32_t max_tokens, int32_t n_ctx, int n_threads) const override {
    return inner_->new_workspace(max_tokens, n_ctx, n_threads);
  }
  bool samples_on_device() const override { return true; }
  void forward(const Batch& batch, Workspace& ws, float* logits, ThreadPool& pool,
               const ForwardOptions& opt) const override {
    if (!opt.sampling) return inner_->forward(batch, ws, logits, pool, opt);
    const DeviceSampling& s = *opt.sampling;
    const int64_t n = int64_t(batch.tokens.size()), V = n_vocab();
    for (int64_t t = 0; t < n; ++t) {  // the stand-in picks greedily only; it records each row's rule
      EXPECT_LE(s.rules ? s.rules[t].temperature : s.temperature, 0.0f);
      if (s.rules) rule_top_k.push_back(s.rules[t].top_k);
    }
    std::vector<float> rows(size_t(n * V));
    ForwardOptions inner_opt = opt;
    inner_opt.sampling = nullptr;
    inner_->forward(batch, ws, rows.data(), pool, inner_opt);
    EXPECT_LE(s.n_ban, DeviceSampling::kMaxDeviceBans);
    if (s.n_ban > 0 && s.ban_rows) {
      cpu::ban_tokens(rows.data(), n, V, s.ban, s.n_ban, s.ban_rows);
      banned_rows += int(std::count_if(s.ban_rows, s.ban_rows + n, [](uint8_t r) { return r != 0; }));
    }
    for (int64_t t = 0; t < n; ++t) {
      const float* r = rows.data() + t * V;
      s.out[t] = int32_t(std::max_element(r, r + V) - r);  // the lowest id on ties, as the device's argmax
    }
  }
  size_t weight_bytes() const override { return inner_->weight_bytes(); }

  mutable int banned_rows = 0;
  mutable std::vector<int32_t> rule_top_k;  // each row's DeviceSampling::rules top_k, in pass order

 private:
  std::shared_ptr<const Model> inner_;
};

struct Models {
  std::vector<uint8_t> bytes = build_tiny_qwen3moe(TinySpec{});
  std::shared_ptr<const Model> plain = load_model(gguf::File::from_memory(bytes.data(), bytes.size(), "tiny.gguf"));
  std::shared_ptr<const PickingModel> picking =
      std::make_shared<PickingModel>(gguf::File::from_memory(bytes.data(), bytes.size(), "tiny.gguf"), plain);
};

// Three sequences decoded `steps` times with decode_sample (bans on sequences 1 and 2) on `eng`, and the
// reference on `ref`: decode into logits, the banned ids of the flagged rows set to -inf, each Sampler's pick.
// Returns {got, want}, each [3][steps].
using Runs = std::vector<std::vector<int32_t>>;
std::pair<Runs, Runs> run_both(Engine& eng, Engine& ref, const SamplingParams& sp, const std::vector<int32_t>& ban,
                               int steps) {
  const int V = eng.n_vocab();
  const std::vector<uint8_t> flags = {0, 1, 1};
  Runs out[2];
  for (int mode = 0; mode < 2; ++mode) {  // 0: the reference, 1: decode_sample with bans
    Engine& e = mode ? eng : ref;
    std::vector<std::unique_ptr<SequenceState>> seqs;
    std::vector<Sampler> samplers;
    std::vector<int32_t> cur;
    std::vector<float> logits(size_t(V) * 3);
    samplers.reserve(3);
    for (int s = 0; s < 3; ++s) {
      seqs.push_back(e.new_sequence());
      SamplingParams p = sp;
      p.seed = 40 + uint64_t(s);
      samplers.emplace_back(p, V);
      e.prefill(*seqs.back(), some_tokens(3 + s, V, s + 1), logits.data());
      cur.push_back(samplers.back().sample(logits.data()));
    }
    SequenceState* sq[3] = {seqs[0].get(), seqs[1].get(), seqs[2].get()};
    Sampler* sm[3] = {&samplers[0], &samplers[1], &samplers[2]};
    out[mode].resize(3);
    for (int step = 0; step < steps; ++step) {
      for (size_t s = 0; s < 3; ++s) {
        samplers[s].accept(cur[s]);
        out[mode][s].push_back(cur[s]);
      }
      const std::vector<int32_t> in = cur;
      if (mode == 0) {
        e.decode(sq, in, logits.data());
        cpu::ban_tokens(logits.data(), 3, V, ban.data(), int32_t(ban.size()), flags.data());
        for (int s = 0; s < 3; ++s) cur[size_t(s)] = samplers[size_t(s)].sample(logits.data() + size_t(s) * V);
      } else {
        e.decode_sample(sq, in, sm, cur.data(), {ban, flags});
      }
    }
  }
  return {out[1], out[0]};
}

// The unbanned greedy runs, and the first n distinct ids sequences 1 and 2 pick after their prompt's
// pick: banning them changes what those sequences pick.
Runs unbanned(Engine& e) {
  SamplingParams sp;
  sp.temperature = 0.0f;
  return run_both(e, e, sp, {}, 10).second;
}
std::vector<int32_t> later_picks(Engine& e, int n) {
  const Runs r = unbanned(e);
  std::vector<int32_t> ids;
  for (int s : {1, 2})
    for (size_t i = 1; i < r[size_t(s)].size(); ++i)
      if (int(ids.size()) < n && std::find(ids.begin(), ids.end(), r[size_t(s)][i]) == ids.end())
        ids.push_back(r[size_t(s)][i]);
  return ids;
}

}  // namespace

TEST(EngineBans, CpuPicksAsFromLogitsWithBannedIdsAtMinusInfinity) {
  Models m;
  Engine eng(m.plain, exact_opts());
  const std::vector<int32_t> ban = later_picks(eng, 3);
  ASSERT_FALSE(ban.empty());
  for (const float temp : {0.0f, 0.9f}) {
    SamplingParams sp;
    sp.temperature = temp;
    sp.repeat_penalty = temp > 0 ? 1.1f : 1.0f;  // with and without penalties
    const auto [got, want] = run_both(eng, eng, sp, ban, 10);
    EXPECT_EQ(got, want) << "temperature " << temp;
    for (int s : {1, 2})
      for (size_t i = 1; i < got[size_t(s)].size(); ++i)
        EXPECT_EQ(std::count(ban.begin(), ban.end(), got[size_t(s)][i]), 0) << "sequence " << s << " step " << i;
    if (temp == 0.0f) {  // the bans changed the flagged sequences' runs, not the free one's
      const Runs free = unbanned(eng);
      EXPECT_TRUE(got[1] != free[1] || got[2] != free[2]);
      EXPECT_EQ(got[0], free[0]);
    }
  }
}

TEST(EngineBans, PickInsideThePassAcrossBatches) {
  Models m;
  // n_batch 2: three sequences take two passes, so the second pass reads the flags from sequence 2 on
  // (flags 0, 1 | 1: a pass reading the first flags again would not ban its row).
  Engine dev(m.picking, exact_opts(64, 2)), ref(m.plain, exact_opts(64, 2));
  const std::vector<int32_t> ban = later_picks(ref, 3);
  ASSERT_GE(ban.size(), 2u);
  SamplingParams sp;
  sp.temperature = 0.0f;
  const auto [got, want] = run_both(dev, ref, sp, ban, 10);
  EXPECT_EQ(got, want);
  EXPECT_EQ(m.picking->banned_rows, 2 * 10);  // sequences 1 and 2, every step, on the model's path
  // More ids than the device takes: the CPU path, the same picks.
  std::vector<int32_t> many(size_t(DeviceSampling::kMaxDeviceBans) + 1, ban[0]);
  many.back() = ban[1];
  m.picking->banned_rows = 0;
  const auto [got2, want2] = run_both(dev, ref, sp, many, 6);
  EXPECT_EQ(got2, want2);
  EXPECT_EQ(m.picking->banned_rows, 0);
}

TEST(EngineBans, BadBansEvaluateNothing) {
  Models m;
  Engine eng(m.plain, exact_opts());
  const int V = eng.n_vocab();
  auto a = eng.new_sequence(), b = eng.new_sequence();
  eng.prefill(*a, some_tokens(3, V, 1), nullptr);
  eng.prefill(*b, some_tokens(3, V, 2), nullptr);
  SamplingParams sp;
  Sampler sa(sp, V), sb(sp, V);
  SequenceState* seqs[2] = {a.get(), b.get()};
  Sampler* samplers[2] = {&sa, &sb};
  const int32_t in[2] = {1, 2};
  int32_t out[2] = {-1, -1};
  const std::vector<uint8_t> both = {1, 1}, one = {1};
  const std::vector<int32_t> out_of_range = {V}, negative = {-1}, fine = {0};
  EXPECT_THROW(eng.decode_sample(seqs, in, samplers, out, {out_of_range, both}), Error);
  EXPECT_THROW(eng.decode_sample(seqs, in, samplers, out, {negative, both}), Error);
  EXPECT_THROW(eng.decode_sample(seqs, in, samplers, out, {fine, one}), Error);
  EXPECT_EQ(a->n_past(), 3);
  EXPECT_EQ(b->n_past(), 3);
  EXPECT_EQ(out[0], -1);
  // Flags without ids, and ids without flags, ban nothing.
  eng.decode_sample(seqs, in, samplers, out, {{}, both});
  eng.decode_sample(seqs, in, samplers, out, {fine, {}});
  EXPECT_EQ(a->n_past(), 5);
}

// Samplers with different parameters in one batch (greedy, top-k 5 / 10 / 20): with mixed_device_sampling
// the pass picks with a rule per row, read from each pass's own rows (n_batch 2: two passes a step); without
// it, on the CPU. The same picks either way.
TEST(EngineBans, MixedRulesPickInsideThePassWhenAllowed) {
  Models m;
  for (const bool mixed : {true, false}) {
    EngineOptions o = exact_opts(64, 2);
    o.mixed_device_sampling = mixed;
    Engine dev(m.picking, o), ref(m.plain, exact_opts(64, 2));
    const int V = dev.n_vocab();
    m.picking->rule_top_k.clear();
    std::vector<int32_t> got[3], want[3];
    for (int mode = 0; mode < 2; ++mode) {
      Engine& e = mode ? dev : ref;
      std::vector<std::unique_ptr<SequenceState>> seqs;
      std::vector<Sampler> samplers;
      samplers.reserve(3);
      std::vector<int32_t> cur;
      std::vector<float> logits(static_cast<size_t>(V));
      for (int s = 0; s < 3; ++s) {
        SamplingParams p;
        p.temperature = 0.0f;
        p.top_k = 5 << s;
        samplers.emplace_back(p, V);
        seqs.push_back(e.new_sequence());
        e.prefill(*seqs.back(), some_tokens(3 + s, V, s + 1), logits.data());
        cur.push_back(samplers.back().sample(logits.data()));
      }
      SequenceState* sq[3] = {seqs[0].get(), seqs[1].get(), seqs[2].get()};
      Sampler* sm[3] = {&samplers[0], &samplers[1], &samplers[2]};
      for (int step = 0; step < 5; ++step) {
        const std::vector<int32_t> in = cur;
        e.decode_sample(sq, in, sm, cur.data());
        for (size_t s = 0; s < 3; ++s) (mode ? got : want)[s].push_back(cur[s]);
      }
    }
    for (size_t s = 0; s < 3; ++s) EXPECT_EQ(got[s], want[s]) << "mixed " << mixed << " sequence " << s;
    std::vector<int32_t> expect;
    if (mixed)
      for (int step = 0; step < 5; ++step) expect.insert(expect.end(), {5, 10, 20});
    EXPECT_EQ(m.picking->rule_top_k, expect) << "mixed " << mixed;
  }
}
