// Engine::decode_logits / prefill_logits: where a model offers memory for its logits
// (Model::logits_in_place, the CUDA backend's pinned download buffer) the engine hands that to the pass and
// returns a view of it; elsewhere (more rows than it holds, several passes of all logits, the switch off)
// its own memory. Either way the logits are those of decode() / prefill() into the caller's memory, bit
// for bit; and perplexity, which scores its rows on the engine's threads, sums them as one thread would.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/perplexity.h"
#include "engine_test_util.h"
#include "tiny_model.h"

using namespace strata;
using namespace strata::test;

namespace {

// A model that runs another one and offers a buffer of `rows` logits rows in each workspace, counting
// the passes whose logits argument pointed at it.
class InPlaceModel final : public Model {
 public:
  InPlaceModel(gguf::File file, std::shared_ptr<const Model> inner, int64_t rows)
      : Model(std::move(file), inner->hparams()), inner_(std::move(inner)), rows_(rows) {}

  std::unique_ptr<SequenceState> new_sequence(int32_t n_ctx, KvType kv_type) const override {
    return inner_->new_sequence(n_ctx, kv_type);
  }
  std::unique_ptr<Workspace> new_workspace(int32_t max_tokens, int32_t n_ctx, int n_threads) const override {
    auto w = std::make_unique<Ws>();
    w->inner = inner_->new_workspace(max_tokens, n_ctx, n_threads);
    w->buf.assign(size_t(rows_) * size_t(n_vocab()), std::numeric_limits<float>::quiet_NaN());
    return w;
  }
  void forward(const Batch& batch, Workspace& ws, float* logits, ThreadPool& pool,
               const ForwardOptions& opt) const override {
    auto& w = static_cast<Ws&>(ws);
    if (logits != nullptr) ++(logits == w.buf.data() ? in_place : elsewhere);
    inner_->forward(batch, *w.inner, logits, pool, opt);
  }
  float* logits_in_place(Workspace& ws, int64_t n_rows) const override {
    return n_rows <= rows_ ? static_cast<Ws&>(ws).buf.data() : nullptr;
  }
  size_t weight_bytes() const override { return inner_->weight_bytes(); }

  mutable int in_place = 0, elsewhere = 0;  // passes with logits at the buffer / anywhere else

 private:
  struct Ws final : Workspace {
    std::unique_ptr<Workspace> inner;
    std::vector<float> buf;  // [rows][n_vocab]
    int32_t max_tokens() const override { return inner->max_tokens(); }
    size_t memory_bytes() const override { return inner->memory_bytes() + buf.size() * 4; }
  };
  std::shared_ptr<const Model> inner_;
  int64_t rows_;
};

struct Models {
  std::vector<uint8_t> bytes = build_tiny_qwen3moe(TinySpec{});
  std::shared_ptr<const Model> plain;
  std::shared_ptr<const InPlaceModel> in_place;
  explicit Models(int64_t rows) {
    plain = load_model(gguf::File::from_memory(bytes.data(), bytes.size(), "tiny.gguf"));
    in_place = std::make_shared<InPlaceModel>(gguf::File::from_memory(bytes.data(), bytes.size(), "tiny.gguf"),
                                              plain, rows);
  }
};

std::vector<float> copy(std::span<const float> s) { return {s.begin(), s.end()}; }

}  // namespace

TEST(EngineLogits, InPlaceEqualsTheCallersMemory) {
  unsetenv("STRATA_LOGITS_IN_PLACE");  // (the switch is read by each Engine; the last block below sets it)
  Models m(/*rows=*/2);
  Engine a(m.in_place, exact_opts()), b(m.plain, exact_opts());
  ASSERT_TRUE(a.options().logits_in_place);
  const int V = a.n_vocab();
  auto a1 = a.new_sequence(), a2 = a.new_sequence(), b1 = b.new_sequence(), b2 = b.new_sequence();

  // prefill: the last token's row, in the model's buffer
  const std::vector<int32_t> p1 = some_tokens(5, V, 1), p2 = some_tokens(3, V, 2);
  std::vector<float> want(size_t(V) * 2);
  b.prefill(*b1, p1, want.data());
  const std::vector<float> got = copy(a.prefill_logits(*a1, p1));
  EXPECT_EQ(got, std::vector<float>(want.begin(), want.begin() + V));
  EXPECT_EQ(m.in_place->in_place, 1);
  b.prefill(*b2, p2, want.data());
  a.prefill_logits(*a2, p2);

  // decode of two sequences: one pass, both rows in the buffer
  SequenceState* as[2] = {a1.get(), a2.get()};
  SequenceState* bs[2] = {b1.get(), b2.get()};
  for (int step = 0; step < 4; ++step) {
    const std::vector<int32_t> toks = some_tokens(2, V, 10 + step);
    b.decode(bs, toks, want.data());
    EXPECT_EQ(copy(a.decode_logits(as, toks)), want) << "step " << step;
  }
  EXPECT_EQ(m.in_place->in_place, 2 + 4);
  EXPECT_EQ(m.in_place->elsewhere, 0);
}

TEST(EngineLogits, FallsBackToTheEnginesMemory) {
  Models m(/*rows=*/1);
  const int V = m.plain->n_vocab();
  {  // more rows than the model's buffer holds: a decode of two sequences
    Engine a(m.in_place, exact_opts()), b(m.plain, exact_opts());
    auto a1 = a.new_sequence(), a2 = a.new_sequence(), b1 = b.new_sequence(), b2 = b.new_sequence();
    SequenceState* as[2] = {a1.get(), a2.get()};
    SequenceState* bs[2] = {b1.get(), b2.get()};
    const std::vector<int32_t> toks = some_tokens(2, V, 3);
    std::vector<float> want(size_t(V) * 2);
    b.decode(bs, toks, want.data());
    EXPECT_EQ(copy(a.decode_logits(as, toks)), want);
    EXPECT_EQ(m.in_place->in_place, 0);
    EXPECT_EQ(m.in_place->elsewhere, 1);
  }
  {  // every row of a prefill in several passes (batch 4, 9 tokens), with room for all of them
    Models big(/*rows=*/16);
    Engine a(big.in_place, exact_opts(64, /*batch=*/4)), b(big.plain, exact_opts(64, /*batch=*/4));
    auto sa = a.new_sequence(), sb = b.new_sequence();
    const std::vector<int32_t> p = some_tokens(9, V, 4);
    std::vector<float> want(size_t(V) * p.size());
    b.prefill(*sb, p, want.data(), /*all_logits=*/true);
    EXPECT_EQ(copy(a.prefill_logits(*sa, p, /*all_logits=*/true)), want);
    EXPECT_EQ(big.in_place->in_place, 0);
    EXPECT_EQ(big.in_place->elsewhere, 3);
    // one token's row after several passes still goes to the model's buffer (only the last pass writes)
    sa->reset();
    sb->reset();
    b.prefill(*sb, p, want.data());
    EXPECT_EQ(copy(a.prefill_logits(*sa, p)), std::vector<float>(want.begin(), want.begin() + V));
    EXPECT_EQ(big.in_place->in_place, 3);  // the three passes of that prefill
  }
  {  // switched off in the options, and by the environment
    Models off(/*rows=*/4);
    EngineOptions o = exact_opts();
    o.logits_in_place = false;
    Engine a(off.in_place, o);
    auto s = a.new_sequence();
    a.prefill_logits(*s, some_tokens(3, V, 5));
    EXPECT_EQ(off.in_place->in_place, 0);
    ASSERT_EQ(setenv("STRATA_LOGITS_IN_PLACE", "0", 1), 0);
    Engine e(off.in_place, exact_opts());
    unsetenv("STRATA_LOGITS_IN_PLACE");
    EXPECT_FALSE(e.options().logits_in_place);
    Engine on(off.in_place, exact_opts());
    EXPECT_TRUE(on.options().logits_in_place);
  }
}

TEST(EngineLogits, BadInputsSizeNothing) {
  Models m(/*rows=*/2);
  Engine a(m.in_place, exact_opts());
  auto s = a.new_sequence();
  const int V = a.n_vocab();
  EXPECT_THROW(a.prefill_logits(*s, {}), Error);
  EXPECT_THROW(a.prefill_logits(*s, some_tokens(65, V, 1), /*all_logits=*/true), Error);  // past --ctx 64
  const std::vector<int32_t> bad = {V};
  EXPECT_THROW(a.prefill_logits(*s, bad), Error);
  SequenceState* seqs[1] = {s.get()};
  EXPECT_THROW(a.decode_logits(seqs, some_tokens(2, V, 1)), Error);  // 1 sequence, 2 tokens
  EXPECT_THROW(a.decode_logits(seqs, bad), Error);
  EXPECT_EQ(m.in_place->in_place + m.in_place->elsewhere, 0);
  EXPECT_EQ(s->n_past(), 0);
}

TEST(EngineLogits, PerplexitySumsRowsInOrderOnAnyThreads) {
  unsetenv("STRATA_LOGITS_IN_PLACE");
  Models m(/*rows=*/16);
  const int V = m.plain->n_vocab();
  const int n_ctx = 8;
  const std::vector<int32_t> toks = some_tokens(3 * n_ctx, V, 6);
  // The sum one thread makes, from prefill() into our memory.
  Engine ref(m.plain, exact_opts());
  double want = 0;
  std::vector<double> want_chunks;
  for (int c = 0; c < 3; ++c) {
    auto s = ref.new_sequence();
    const std::span<const int32_t> chunk(toks.data() + c * n_ctx, size_t(n_ctx));
    std::vector<float> lg(size_t(n_ctx) * size_t(V));
    ref.prefill(*s, chunk, lg.data(), /*all_logits=*/true);
    double nll = 0;
    for (int i = 0; i + 1 < n_ctx; ++i) {
      const float* row = lg.data() + size_t(i) * size_t(V);
      double mx = row[0];
      for (int v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
      double sum = 0;
      for (int v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
      nll += mx + std::log(sum) - double(row[chunk[size_t(i) + 1]]);
    }
    want_chunks.push_back(nll);
    want += nll;
  }
  for (const auto& model : {m.plain, std::shared_ptr<const Model>(m.in_place)}) {
    Engine eng(model, exact_opts());
    const PerplexityResult r = perplexity(eng, toks, n_ctx);
    EXPECT_EQ(r.nll_sum, want);
    EXPECT_EQ(r.chunk_nll, want_chunks);
    EXPECT_EQ(r.n_scored, 3 * (n_ctx - 1));
  }
  EXPECT_EQ(m.in_place->in_place, 3);  // one pass a chunk, in the model's buffer
}
