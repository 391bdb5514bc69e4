// Engine and model on a tiny random qwen3moe built in memory: bad inputs give clear errors; batching
// (chunked prefill, several sequences per decode step) does not change exact-mode results.
#include <gtest/gtest.h>

#include <memory>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "tiny_model.h"

using namespace strata;
using namespace strata::test;

namespace {

std::string load_error(const TinySpec& s) {
  try {
    TinyModel m(s);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(EngineErrors, UnknownArchitecture) {
  TinySpec s;
  s.arch = "llama9";
  const std::string e = load_error(s);
  EXPECT_NE(e.find("unknown architecture 'llama9'"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen3moe"), std::string::npos) << e;
}

TEST(EngineErrors, MissingTensor) {
  TinySpec s;
  s.drop = "blk.1.ffn_up_exps.weight";
  const std::string e = load_error(s);
  EXPECT_NE(e.find("missing tensor 'blk.1.ffn_up_exps.weight' (expected shape [32, 32, 4])"),
            std::string::npos) << e;
}

TEST(EngineErrors, MisShapedTensor) {
  TinySpec s;
  s.reshape = "blk.0.attn_k.weight";
  const std::string e = load_error(s);
  EXPECT_NE(e.find("tensor 'blk.0.attn_k.weight' has shape [64, 32], expected [32, 32]"),
            std::string::npos) << e;
}

TEST(EngineErrors, NormMustBeF32) {
  TinySpec s;
  s.norm_f16 = "blk.0.attn_q_norm.weight";
  const std::string e = load_error(s);
  EXPECT_NE(e.find("'blk.0.attn_q_norm.weight' has type f16, expected f32"), std::string::npos) << e;
}

TEST(EngineErrors, BadPromptsAndContextOverflow) {
  TinyModel m(TinySpec{});
  Engine eng(m.model, exact_opts(8));
  auto seq = eng.new_sequence();
  std::vector<float> logits(size_t(eng.n_vocab()) * 16);
  auto msg = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(msg([&] { eng.prefill(*seq, {}, logits.data()); }), "empty prompt: nothing to evaluate");
  std::vector<int32_t> bad = {1, 64};
  EXPECT_EQ(msg([&] { eng.prefill(*seq, bad, logits.data()); }),
            "token id 64 is out of range: the vocabulary has 64 tokens (0..63)");
  std::vector<int32_t> neg = {-3};
  EXPECT_NE(msg([&] { eng.prefill(*seq, neg, logits.data()); }).find("token id -3"), std::string::npos);
  EXPECT_EQ(seq->n_past(), 0);  // a rejected prompt changes nothing
  auto nine = some_tokens(9, 64, 1);
  EXPECT_EQ(msg([&] { eng.prefill(*seq, nine, logits.data()); }),
            "context overflow: 0 tokens already in the sequence + 9 new > --ctx 8");
  eng.prefill(*seq, std::span(nine).first(8), logits.data());
  SequenceState* sp = seq.get();
  int32_t t = 1;
  EXPECT_EQ(msg([&] { eng.decode({&sp, 1}, {&t, 1}, logits.data()); }),
            "context overflow: the sequence holds --ctx 8 tokens");
}

TEST(Engine, TiedOutputUsesTokenEmbedding) {
  TinySpec s;
  s.tied = true;
  TinyModel m(s);
  Engine eng(m.model, exact_opts());
  auto seq = eng.new_sequence();
  std::vector<float> logits(size_t(eng.n_vocab()));
  auto toks = some_tokens(5, 64, 2);
  eng.prefill(*seq, toks, logits.data());
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

// Exact mode computes every token independently of its batch neighbours (per-row dots, per-token
// attention and routing), so chunked prefill and multi-sequence decode are bit-identical to one
// sequence evaluated token by token.
TEST(Engine, ChunkedPrefillIsBitIdentical) {
  TinyModel m(TinySpec{});
  const auto toks = some_tokens(23, 64, 3);
  const size_t V = 64;
  std::vector<std::vector<float>> results;
  for (int batch : {512, 7, 1}) {
    Engine eng(m.model, exact_opts(64, batch));
    auto seq = eng.new_sequence();
    std::vector<float> logits(toks.size() * V);
    eng.prefill(*seq, toks, logits.data(), true);
    EXPECT_EQ(seq->n_past(), 23);
    results.push_back(logits);
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

TEST(Engine, MultiSequenceDecodeMatchesSingle) {
  TinyModel m(TinySpec{});
  const size_t V = 64;
  const int n_seq = 4;
  // Reference: each sequence alone.
  std::vector<std::vector<float>> alone(n_seq);
  {
    Engine eng(m.model, exact_opts());
    for (int s = 0; s < n_seq; ++s) {
      auto seq = eng.new_sequence();
      auto prompt = some_tokens(3 + 2 * s, 64, s);  // different lengths: different positions
      std::vector<float> lg(V);
      eng.prefill(*seq, prompt, lg.data());
      SequenceState* sp = seq.get();
      for (int step = 0; step < 5; ++step) {
        int32_t t = (s * 7 + step * 3) % 64;
        eng.decode({&sp, 1}, {&t, 1}, lg.data());
        alone[size_t(s)].insert(alone[size_t(s)].end(), lg.begin(), lg.end());
      }
    }
  }
  // Together: one decode call per step for all sequences.
  Engine eng(m.model, exact_opts());
  std::vector<std::unique_ptr<SequenceState>> seqs;
  std::vector<SequenceState*> ptrs;
  std::vector<float> lg(V * n_seq);
  for (int s = 0; s < n_seq; ++s) {
    seqs.push_back(eng.new_sequence());
    ptrs.push_back(seqs.back().get());
    eng.prefill(*seqs.back(), some_tokens(3 + 2 * s, 64, s), lg.data());
  }
  std::vector<std::vector<float>> together(n_seq);
  for (int step = 0; step < 5; ++step) {
    std::vector<int32_t> toks;
    for (int s = 0; s < n_seq; ++s) toks.push_back((s * 7 + step * 3) % 64);
    eng.decode(ptrs, toks, lg.data());
    for (int s = 0; s < n_seq; ++s)
      together[size_t(s)].insert(together[size_t(s)].end(), lg.begin() + s * V, lg.begin() + (s + 1) * V);
  }
  for (int s = 0; s < n_seq; ++s) EXPECT_EQ(alone[size_t(s)], together[size_t(s)]) << "sequence " << s;
  // A sequence twice in one batch is refused.
  std::vector<SequenceState*> dup = {ptrs[0], ptrs[0]};
  std::vector<int32_t> two = {1, 2};
  EXPECT_THROW(eng.decode(dup, two, lg.data()), Error);
}

TEST(Engine, F16CacheAndF32AttentionStayClose) {
  TinyModel m(TinySpec{});
  const auto toks = some_tokens(20, 64, 5);
  auto run = [&](KvType kv, cpu::AttnMath am) {
    EngineOptions o = exact_opts();
    o.kv_type = kv;
    o.attn = am;
    Engine eng(m.model, o);
    auto seq = eng.new_sequence();
    std::vector<float> lg(toks.size() * 64);
    eng.prefill(*seq, toks, lg.data(), true);
    return lg;
  };
  const auto a = run(KvType::F32, cpu::AttnMath::F32);
  const auto b = run(KvType::F16, cpu::AttnMath::F32);
  const auto c = run(KvType::F32, cpu::AttnMath::GgmlF16);
  const auto d = run(KvType::F16, cpu::AttnMath::GgmlF16);
  double db = 0, dc = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    db = std::max(db, double(std::abs(a[i] - b[i])));
    dc = std::max(dc, double(std::abs(a[i] - c[i])));
  }
  EXPECT_GT(db, 0.0);  // the cache type is really used
  EXPECT_LT(db, 1e-2);
  EXPECT_LT(dc, 1e-2);
  EXPECT_EQ(c, d);  // ggml arithmetic rounds K/V to f16 anyway: the cache type does not matter
}

// decode_sample on the CPU backend (which does not sample inside the pass): the same picks as decode
// followed by each sequence's Sampler, with penalties on; a CPU forward asked to sample is an error.
TEST(Engine, DecodeSampleOnCpuEqualsDecodeThenSample) {
  TinyModel m(TinySpec{});
  EXPECT_FALSE(m.model->samples_on_device());
  Engine eng(m.model, exact_opts());
  const int V = eng.n_vocab();
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.repeat_penalty = 1.2f;
  std::vector<int32_t> got[2], want[2];
  for (int mode = 0; mode < 2; ++mode) {
    auto a = eng.new_sequence(), b = eng.new_sequence();
    std::vector<float> logits(size_t(V) * 2);
    eng.prefill(*a, some_tokens(5, V, 1), logits.data());
    eng.prefill(*b, some_tokens(3, V, 2), logits.data() + V);
    sp.seed = 5;
    Sampler sa(sp, V);
    sp.seed = 6;
    Sampler sb(sp, V);
    std::vector<int32_t> cur = {sa.sample(logits.data()), sb.sample(logits.data() + V)};
    SequenceState* seqs[2] = {a.get(), b.get()};
    Sampler* samplers[2] = {&sa, &sb};
    for (int step = 0; step < 10; ++step) {
      sa.accept(cur[0]);
      sb.accept(cur[1]);
      (mode ? got : want)[0].push_back(cur[0]);
      (mode ? got : want)[1].push_back(cur[1]);
      const std::vector<int32_t> in = cur;
      if (mode == 0) {
        eng.decode(seqs, in, logits.data());
        cur = {sa.sample(logits.data()), sb.sample(logits.data() + V)};
      } else {
        eng.decode_sample(seqs, in, samplers, cur.data());
      }
    }
  }
  EXPECT_EQ(got[0], want[0]);
  EXPECT_EQ(got[1], want[1]);

  auto seq = eng.new_sequence();
  const int32_t tok = 1;
  BatchToken bt{tok, 0, 0, true};
  SequenceState* sp_seq = seq.get();
  auto ws = m.model->new_workspace(4, 64, 1);
  ThreadPool pool(1);
  float u = 0.5f;
  int32_t out = -1;
  DeviceSampling ds;
  ds.u = &u;
  ds.out = &out;
  ForwardOptions fo;
  fo.sampling = &ds;
  EXPECT_THROW(m.model->forward({std::span<const BatchToken>(&bt, 1), std::span<SequenceState* const>(&sp_seq, 1)},
                                *ws, nullptr, pool, fo),
               Error);
}
