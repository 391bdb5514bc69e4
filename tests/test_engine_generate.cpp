// Engine::generate: step after step, each step fed the previous one's picks. On the CPU backend it is a loop
// of decode_sample; on a model that chains decode passes (Model::chains_decode: the CUDA qwen3moe, fully
// resident) the next step is launched before the caller's callback runs and dropped when the callback stops.
// Both are checked here against a plain decode_sample loop: the chained logic on a CPU model dressed as one
// that picks "on the device" and keeps passes pending (ChainingModel below). The GPU side of the same:
// tests/cuda/test_decode_chain_gpu.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <stdexcept>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "generate_test_util.h"
#include "tiny_model.h"

using namespace strata;
using namespace strata::test;

namespace {

// The tiny CPU model, picking "on the device" (inside forward, from ForwardOptions::sampling) and honouring
// chain / defer as the CUDA model does: a deferred pass's picks reach DeviceSampling::out only in
// finish_deferred, at most two passes pend, a chained pass takes the latest pass's picks as its tokens.
// The pick: the row's argmax, moved by floor(3 u) ids when the rule draws (temperature > 0), so the draws'
// order matters.
class ChainingModel final : public Model {
 public:
  ChainingModel(const std::vector<uint8_t>& bytes, std::shared_ptr<const Model> inner)
      : Model(gguf::File::from_memory(bytes.data(), bytes.size(), "tiny.gguf"), inner->hparams()),
        inner_(std::move(inner)) {}
  std::unique_ptr<SequenceState> new_sequence(int32_t n_ctx, KvType t) const override {
    return inner_->new_sequence(n_ctx, t);
  }
  std::unique_ptr<Workspace> new_workspace(int32_t max_tokens, int32_t n_ctx, int n_threads) const override {
    return inner_->new_workspace(max_tokens, n_ctx, n_threads);
  }
  size_t weight_bytes() const override { return inner_->weight_bytes(); }
  bool samples_on_device() const override { return true; }
  bool chains_decode(const Workspace&, int32_t n) const override { return chains && n <= 8; }
  void finish_deferred(Workspace&) const override {
    if (pending_.empty()) return;
    const Pending p = pending_.front();
    pending_.pop_front();
    std::copy(p.picks.begin(), p.picks.end(), p.out);
  }
  void forward(const Batch& batch, Workspace& ws, float* logits, ThreadPool& pool,
               const ForwardOptions& opt) const override {
    STRATA_REQUIRE(!opt.chain || opt.sampling, "chained without sampling");
    if (!opt.chain)
      while (!pending_.empty()) finish_deferred(ws);
    STRATA_REQUIRE(pending_.size() < 2, "two passes pending");
    std::vector<BatchToken> toks(batch.tokens.begin(), batch.tokens.end());
    if (opt.chain) {
      STRATA_REQUIRE(last_.size() == toks.size(), "chained to {} picks with {} tokens", last_.size(), toks.size());
      for (size_t i = 0; i < toks.size(); ++i) toks[i].token = last_[i];
      ++chained;
    }
    ForwardOptions inner = opt;
    inner.sampling = nullptr;
    inner.chain = inner.defer = false;
    if (!opt.sampling) {
      inner_->forward({toks, batch.seqs}, ws, logits, pool, inner);
      last_.clear();
      return;
    }
    const size_t V = size_t(n_vocab());
    std::vector<float> lg(toks.size() * V);
    inner_->forward({toks, batch.seqs}, ws, lg.data(), pool, inner);
    std::vector<int32_t> picks(toks.size());
    for (size_t r = 0; r < toks.size(); ++r) {
      float* row = lg.data() + r * V;
      if (opt.sampling->ban_rows && opt.sampling->ban_rows[r])  // (as the device: banned logits -inf)
        for (int32_t b = 0; b < opt.sampling->n_ban; ++b) row[opt.sampling->ban[b]] = -INFINITY;
      const int32_t best = int32_t(std::max_element(row, row + V) - row);
      const int32_t shift = opt.sampling->temperature > 0.0f ? int32_t(3.0f * opt.sampling->u[r]) : 0;
      picks[r] = (best + shift) % int32_t(V);
    }
    last_ = picks;
    if (opt.defer) {
      pending_.push_back({picks, opt.sampling->out});
      ++deferred;
    } else {
      std::copy(picks.begin(), picks.end(), opt.sampling->out);
    }
  }
  bool chains = true;
  mutable int chained = 0, deferred = 0;
  size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    std::vector<int32_t> picks;
    int32_t* out;
  };
  std::shared_ptr<const Model> inner_;
  mutable std::deque<Pending> pending_;
  mutable std::vector<int32_t> last_;
};

// n_seqs sequences of the tiny model, each prefilled with its own tokens, then generate_run.
GenRun run(std::shared_ptr<const Model> model, bool chained, int n_seqs, float temperature, int max_steps,
           int stop_after, int extra_after = 0) {
  Engine eng(model, exact_opts(64));
  const int V = eng.n_vocab();
  GenSeqs g = gen_seqs(eng, n_seqs, temperature, 7, [&](int i) { return some_tokens(4 + i, V, i + 1); });
  std::vector<int32_t> first_toks(static_cast<size_t>(n_seqs));
  for (int i = 0; i < n_seqs; ++i) first_toks[size_t(i)] = (5 * i + 3) % V;
  return generate_run(eng, g.seqs, g.sp, first_toks, chained, max_steps, stop_after, extra_after);
}

void expect_same(const GenRun& a, const GenRun& b) {
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.picks, b.picks);
  EXPECT_EQ(a.n_past, b.n_past);
  EXPECT_EQ(a.next_draws, b.next_draws);
}

}  // namespace

TEST(EngineGenerate, CpuBackendIsTheDecodeSampleLoop) {
  TinyModel m(TinySpec{});
  EXPECT_FALSE(m.model->chains_decode(*m.model->new_workspace(4, 64, 1), 1));
  for (float t : {0.0f, 0.9f})
    for (int stop : {-1, 0, 4}) {
      SCOPED_TRACE("temperature " + std::to_string(t) + ", stop after " + std::to_string(stop));
      expect_same(run(m.model, true, 2, t, 9, stop, 1), run(m.model, false, 2, t, 9, stop, 1));
    }
}

TEST(EngineGenerate, ChainedStepsGiveTheLoopsPicksAndDropTheStepAhead) {
  TinyModel m(TinySpec{});
  auto chaining = std::make_shared<ChainingModel>(m.bytes, m.model);
  for (int n_seqs : {1, 3})
    for (float t : {0.0f, 0.9f})
      for (int stop : {-1, 0, 1, 5, 8}) {
        SCOPED_TRACE(std::to_string(n_seqs) + " sequences, temperature " + std::to_string(t) + ", stop after " +
                     std::to_string(stop));
        chaining->chained = chaining->deferred = 0;
        const GenRun got = run(chaining, true, n_seqs, t, 9, stop, 2);
        // Every step after the first chained; a dropped step ahead still ran.
        const int steps = stop < 0 ? 9 : stop + 1;
        EXPECT_EQ(chaining->chained, steps - 1 + (stop >= 0 && stop < 8 ? 1 : 0));
        EXPECT_EQ(chaining->pending(), 0u);
        expect_same(got, run(chaining, false, n_seqs, t, 9, stop, 2));
        if (t == 0.0f) expect_same(got, run(m.model, false, n_seqs, t, 9, stop, 2));  // the CPU sampler's argmax
      }
}

TEST(EngineGenerate, StopsAtAFullContextAndOnZeroSteps) {
  TinyModel m(TinySpec{});
  auto chaining = std::make_shared<ChainingModel>(m.bytes, m.model);
  for (bool chain : {false, true}) {
    chaining->chains = chain;
    Engine eng(chaining, exact_opts(8));
    auto seq = eng.new_sequence();
    eng.prefill(*seq, some_tokens(5, eng.n_vocab(), 1), nullptr);
    SequenceState* s = seq.get();
    Sampler greedy(SamplingParams{.temperature = 0.0f}, eng.n_vocab());
    Sampler* sp = &greedy;
    const int32_t t0 = 1;
    int calls = 0;
    const auto count = [&](int, std::span<const int32_t>) { return ++calls > 0; };
    EXPECT_EQ(eng.generate({&s, 1}, {&t0, 1}, {&sp, 1}, 0, count), 0);
    EXPECT_EQ(eng.generate({&s, 1}, {&t0, 1}, {&sp, 1}, 10, count), 3);  // 3 positions left of 8
    EXPECT_EQ(calls, 3);
    EXPECT_EQ(s->n_past(), 8);
    EXPECT_EQ(eng.generate({&s, 1}, {&t0, 1}, {&sp, 1}, 10, count), 0);
    EXPECT_EQ(chaining->pending(), 0u);
  }
}

// A callback that throws: the error reaches the caller, nothing stays pending, and the sequences and
// samplers are where a step-by-step loop that threw at that step leaves them.
TEST(EngineGenerate, ACallbackErrorLeavesTheLoopsState) {
  TinyModel m(TinySpec{});
  auto chaining = std::make_shared<ChainingModel>(m.bytes, m.model);
  int64_t n_past[2];
  double draw[2];
  for (int chain = 0; chain < 2; ++chain) {
    chaining->chains = chain == 1;
    Engine eng(chaining, exact_opts(64));
    auto seq = eng.new_sequence();
    eng.prefill(*seq, some_tokens(5, eng.n_vocab(), 1), nullptr);
    SequenceState* s = seq.get();
    SamplingParams p;
    p.temperature = 0.7f;
    p.seed = 3;
    Sampler smp(p, eng.n_vocab());
    Sampler* sp = &smp;
    const int32_t t0 = 2;
    EXPECT_THROW(eng.generate({&s, 1}, {&t0, 1}, {&sp, 1}, 10,
                              [](int step, std::span<const int32_t>) {
                                if (step == 3) throw std::runtime_error("the caller's error");
                                return true;
                              }),
                 std::runtime_error);
    EXPECT_EQ(chaining->pending(), 0u);
    n_past[chain] = s->n_past();
    draw[chain] = smp.next_draw();
  }
  EXPECT_EQ(n_past[0], 5 + 4);
  EXPECT_EQ(n_past[1], n_past[0]);
  EXPECT_EQ(draw[1], draw[0]);
}

// Bans (a server request's ignore_eos) hold in every step of a generate call, chained or not: the picks
// are the decode_sample loop's with the same bans, a banned id is never picked in a flagged sequence, and
// the unflagged sequence picks as without bans.
TEST(EngineGenerate, BansHoldInEveryStep) {
  TinyModel m(TinySpec{});
  auto chaining = std::make_shared<ChainingModel>(m.bytes, m.model);
  const std::vector<uint8_t> rows = {1, 0};
  // 8 steps of 2 sequences (picks interleaved), by generate or by a decode_sample loop.
  const auto run = [&](bool generate, const std::vector<int32_t>& ids) {
    Engine eng(chaining, exact_opts(64));
    GenSeqs g = gen_seqs(eng, 2, 0.0f, 5, [&](int i) { return some_tokens(4 + i, eng.n_vocab(), i + 1); });
    const std::vector<int32_t> first = {3, 7};
    const SampleBans bans{ids, ids.empty() ? std::span<const uint8_t>() : std::span<const uint8_t>(rows)};
    const GenRun r = generate_run(eng, g.seqs, g.sp, first, generate, 8, -1, 0, bans);
    EXPECT_EQ(r.steps, 8);
    EXPECT_EQ(chaining->pending(), 0u);
    return r.picks;
  };
  for (bool chain : {false, true}) {
    SCOPED_TRACE(chain ? "chained" : "loop");
    chaining->chains = chain;
    chaining->chained = 0;
    const std::vector<int32_t> free = run(true, {});
    // Ban every id sequence 0 picked without bans: its picks must change.
    std::vector<int32_t> ids;
    for (size_t i = 0; i < free.size(); i += 2) ids.push_back(free[i]);
    const std::vector<int32_t> banned = run(true, ids);
    EXPECT_EQ(banned, run(false, ids));
    for (size_t i = 0; i < banned.size(); ++i) {
      if (i % 2 == 0) {
        EXPECT_EQ(std::count(ids.begin(), ids.end(), banned[i]), 0) << "step " << i / 2 << " picked a banned id";
      } else {
        EXPECT_EQ(banned[i], free[i]) << "the unflagged sequence's pick moved at step " << i / 2;
      }
    }
    if (chain) EXPECT_GT(chaining->chained, 0);
  }
}
