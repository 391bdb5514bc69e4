// strata mkmodel's generator: files load as qwen3moe, are deterministic (independent of threads),
// follow the requested geometry/format, and the synthetic vocabulary tokenizes.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "engine/engine.h"
#include "model/synthetic.h"
#include "tokenizer/tokenizer.h"

using namespace strata;

namespace {
std::string tmp_path(const std::string& name) {
  return ::testing::TempDir() + "strata_synth_" + name + ".gguf";
}
std::vector<char> slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
SyntheticSpec small() {
  SyntheticSpec s;
  s.n_layer = 3;
  s.n_embd = 256;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.head_dim = 64;
  s.n_expert = 4;
  s.n_expert_used = 2;
  s.n_ff_exp = 256;
  s.n_vocab = 300;
  return s;
}
}  // namespace

TEST(Synthetic, LoadsRunsAndIsDeterministic) {
  for (const char* fmt : {"Q8_0", "Q4_K_M", "F16"}) {
    SyntheticSpec s = small();
    s.format = fmt;
    const std::string a = tmp_path(std::string("a_") + fmt), b = tmp_path(std::string("b_") + fmt);
    ThreadPool one(1), two(2);
    write_synthetic_model(s, a, one);
    write_synthetic_model(s, b, two);
    EXPECT_EQ(slurp(a), slurp(b)) << fmt;  // threads do not change the file
    std::shared_ptr<const Model> m = load_model(a);
    EXPECT_EQ(m->hparams().n_layer, 3);
    EXPECT_EQ(m->n_vocab(), 300);
    EXPECT_EQ(m->file().tensor("blk.0.ffn_gate_inp.weight").type, GgmlType::F32);
    if (std::string(fmt) == "Q8_0") {
      EXPECT_EQ(m->file().tensor("blk.2.ffn_down_exps.weight").type, GgmlType::Q8_0);
    }
    EngineOptions o;
    o.n_ctx = 32;
    o.n_threads = 2;
    Engine eng(m, o);
    auto seq = eng.new_sequence();
    std::vector<float> logits(300);
    std::vector<int32_t> toks = {1, 50, 299, 7};
    eng.prefill(*seq, toks, logits.data());
    float mx = 0;
    for (float x : logits) {
      ASSERT_TRUE(std::isfinite(x));
      mx = std::max(mx, std::abs(x));
    }
    EXPECT_GT(mx, 0.0f);
    // The synthetic vocabulary is a working byte-level BPE.
    const auto tok = tokenizer::Tokenizer::from_gguf(m->file());
    const auto ids = tok.tokenize("ab hello", {.add_special = false});
    EXPECT_EQ(tok.detokenize(ids), "ab hello");
    std::remove(a.c_str());
    std::remove(b.c_str());
  }
}

TEST(Synthetic, RepeatLayersCopiesTheFirstLayer) {
  SyntheticSpec s = small();
  s.repeat_layers = true;
  const std::string p = tmp_path("rep");
  ThreadPool pool(2);
  write_synthetic_model(s, p, pool);
  auto f = gguf::File::open(p);
  const auto& t0 = f.tensor("blk.0.ffn_up_exps.weight");
  const auto& t2 = f.tensor("blk.2.ffn_up_exps.weight");
  ASSERT_EQ(t0.nbytes, t2.nbytes);
  EXPECT_EQ(0, std::memcmp(t0.data, t2.data, t0.nbytes));
  EXPECT_NE(t0.data, t2.data);  // its own bytes in the file
  std::remove(p.c_str());
}

// A mix (Q4_K_M) gives some layers' tensors another type than layer 0's: those are made once for their
// type and repeated from there (the file used to fail: layer 0's bytes for another type's size).
TEST(Synthetic, RepeatLayersWithAMixKeepsEachLayersType) {
  SyntheticSpec s = small();
  s.repeat_layers = true;
  s.n_layer = 8;
  s.format = "Q4_K_M";
  const std::string p = tmp_path("repmix");
  ThreadPool pool(2);
  write_synthetic_model(s, p, pool);
  auto f = gguf::File::open(p);
  int other_type = 0;
  for (int l = 1; l < int(s.n_layer); ++l)
    for (const char* n : {"attn_v.weight", "ffn_down_exps.weight"}) {
      const auto& t0 = f.tensor("blk.0." + std::string(n));
      const auto& tl = f.tensor("blk." + std::to_string(l) + "." + n);
      if (tl.type == t0.type) {
        ASSERT_EQ(t0.nbytes, tl.nbytes);
        EXPECT_EQ(0, std::memcmp(t0.data, tl.data, t0.nbytes));
      } else {
        ++other_type;
        EXPECT_EQ(tl.nbytes, row_bytes(tl.type, tl.ne[0]) * tl.ne[1] * (tl.n_dims > 2 ? tl.ne[2] : 1));
      }
    }
  EXPECT_GT(other_type, 0) << "the mix should give some layers another type";
  EXPECT_NO_THROW(load_model(p));
  std::remove(p.c_str());
}

TEST(Synthetic, BadSpecsAreErrors) {
  ThreadPool pool(1);
  SyntheticSpec s = small();
  s.format = "Q3_K";
  EXPECT_THROW(write_synthetic_model(s, tmp_path("bad"), pool), Error);
  s = small();
  s.n_head = 3;
  EXPECT_THROW(write_synthetic_model(s, tmp_path("bad"), pool), Error);
  s = small();
  EXPECT_THROW(s.apply_preset("llama-7b"), Error);
}
