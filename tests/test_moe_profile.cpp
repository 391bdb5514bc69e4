// Expert-usage counting (src/moe/expert_usage.h), perplexity (src/engine/perplexity.h) and the
// `strata profile` / `strata perplexity` CLIs, on the llama.cpp-made fixture model.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/perplexity.h"
#include "moe/expert_usage.h"
#include "slg.h"

using namespace strata;
using nlohmann::json;

namespace {

const std::string kModels = std::string(STRATA_FIXTURES_DIR) + "/models/";
const std::string kTiny = kModels + "tiny-qwen3moe-A-Q8_0.gguf";

using CliResult = strata::test::CliOut;
CliResult run_cli(const std::string& args) { return strata::test::run_strata(args); }

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("strata_moe_profile_" + name)).string();
}

}  // namespace

TEST(ExpertUsage, StatsOfKnownCounts) {
  moe::ExpertUsage u(2, 8, 2);
  // layer 0: every expert picked equally (4 tokens x 2 = 8 selections, one each)
  const int32_t even[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  u.add(0, even, 4);
  // layer 1: all tokens pick experts 5 and 2
  const int32_t skew[8] = {5, 2, 5, 2, 5, 2, 5, 2};
  u.add(1, skew, 4);
  const auto a = u.layer_stats(0), b = u.layer_stats(1);
  EXPECT_EQ(a.tokens, 4);
  EXPECT_EQ(a.selections, 8);
  EXPECT_NEAR(a.entropy_bits, 3.0, 1e-12);
  EXPECT_NEAR(a.entropy_norm, 1.0, 1e-12);
  EXPECT_NEAR(a.top25_share, 0.25, 1e-12);  // top 2 of 8 experts serve 2 of 8 selections
  EXPECT_EQ(a.n_unused, 0);
  EXPECT_NEAR(b.entropy_bits, 1.0, 1e-12);
  EXPECT_NEAR(b.top25_share, 1.0, 1e-12);
  EXPECT_EQ(b.n_unused, 6);
  EXPECT_EQ(b.ranking[0], 2);  // tie broken by the lower id
  EXPECT_EQ(b.ranking[1], 5);
  EXPECT_EQ(u.count(1, 5), 4);
  const int32_t bad[2] = {0, 8};
  EXPECT_THROW(u.add(0, bad, 1), Error);
  EXPECT_THROW(u.add(2, even, 1), Error);
}

TEST(ExpertUsage, JsonRoundTripAndBadDocuments) {
  moe::ExpertUsage u(3, 4, 1);
  const int32_t ids[5] = {3, 3, 1, 0, 3};
  for (int l = 0; l < 3; ++l) u.add(l, ids + l, 5 - l);
  const moe::ExpertUsage v = moe::ExpertUsage::from_json(u.to_json());
  ASSERT_EQ(v.n_layer(), 3);
  ASSERT_EQ(v.n_expert(), 4);
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(v.tokens(l), u.tokens(l));
    for (int e = 0; e < 4; ++e) EXPECT_EQ(v.count(l, e), u.count(l, e));
    EXPECT_DOUBLE_EQ(v.layer_stats(l).entropy_bits, u.layer_stats(l).entropy_bits);
  }
  json j = json::parse(u.to_json());
  json bad = j;
  bad["layers"][1]["counts"][0] = 99;  // counts no longer sum to tokens * k
  EXPECT_THROW(moe::ExpertUsage::from_json(bad.dump()), Error);
  bad = j;
  bad["format"] = "something-else";
  EXPECT_THROW(moe::ExpertUsage::from_json(bad.dump()), Error);
  bad = j;
  bad["format"] = 2;  // a number where a string belongs: an Error, not a JSON library exception
  EXPECT_THROW(moe::ExpertUsage::from_json(bad.dump()), Error);
  bad = j;
  bad["layers"][0]["counts"] = json::array({1, 2});
  EXPECT_THROW(moe::ExpertUsage::from_json(bad.dump()), Error);
  bad = j;
  bad["layers"][2]["counts"][1] = -1;
  EXPECT_THROW(moe::ExpertUsage::from_json(bad.dump()), Error);
  EXPECT_THROW(moe::ExpertUsage::from_json("{not json"), Error);
  EXPECT_THROW(moe::ExpertUsage(0, 4, 1), Error);
  EXPECT_THROW(moe::ExpertUsage(2, 4, 5), Error);
}

// The router's choices do not depend on how the prompt is batched: counts from a 1-token-per-pass
// prefill equal those from one pass, and every layer saw every token k times (qwen3moe and qwen3next).
namespace {
void check_usage_counts(const std::string& model_file, const std::string& slg_file) {
  SCOPED_TRACE(model_file);
  std::shared_ptr<const Model> model = load_model(model_file);
  const HParams& hp = model->hparams();
  const test::Slg ref = test::read_slg(slg_file);
  ASSERT_EQ(model->routed_layers(), hp.n_layer);  // the fixtures have no MTP block
  moe::ExpertUsage one(hp.n_layer, hp.n_expert, hp.n_expert_used), all(one);
  EngineOptions o;
  o.n_ctx = 256;
  o.n_threads = 2;
  o.mode = MatmulMode::Exact;
  o.usage = &all;
  {
    Engine eng(model, o);
    auto seq = eng.new_sequence();
    eng.prefill(*seq, ref.prompt, nullptr);
  }
  o.usage = &one;
  o.n_batch = 1;
  {
    Engine eng(model, o);
    auto seq = eng.new_sequence();
    eng.prefill(*seq, ref.prompt, nullptr);
  }
  int differing_layers = 0;
  for (int l = 0; l < hp.n_layer; ++l) {
    EXPECT_EQ(all.tokens(l), int64_t(ref.prompt.size()));
    int64_t sum = 0;
    bool same_as_prev = l > 0;
    for (int e = 0; e < hp.n_expert; ++e) {
      EXPECT_EQ(one.count(l, e), all.count(l, e)) << "layer " << l << " expert " << e;
      sum += all.count(l, e);
      if (l > 0 && all.count(l, e) != all.count(l - 1, e)) same_as_prev = false;
    }
    EXPECT_EQ(sum, int64_t(ref.prompt.size()) * hp.n_expert_used);
    differing_layers += !same_as_prev;
  }
  EXPECT_GE(differing_layers, hp.n_layer - 1) << "layers should route differently";
  // a counter shaped for another model is refused
  moe::ExpertUsage wrong(hp.n_layer + 1, hp.n_expert, hp.n_expert_used);
  o.usage = &wrong;
  Engine eng(model, o);
  auto seq = eng.new_sequence();
  EXPECT_THROW(eng.prefill(*seq, ref.prompt, nullptr), Error);
}
}  // namespace

TEST(ExpertUsage, FixtureModelCountsEveryTokenIndependentOfBatching) {
  check_usage_counts(kTiny, kModels + "tiny-qwen3moe-A-Q8_0.logits.slg");
}

TEST(ExpertUsage, Qwen3NextFixtureCountsEveryTokenIndependentOfBatching) {
  check_usage_counts(kModels + "tiny-qwen3next-N-Q4_K_M.gguf", kModels + "tiny-qwen3next-N-Q4_K_M.logits.slg");
}

// Perplexity of the fixture prompt as one chunk (exact mode) equals the one computed from the
// fixture's exact-math reference logits for the same tokens (*.f32ref.slg, made with llama.cpp).
TEST(Perplexity, MatchesLlamaCppLogitsOnFixture) {
  std::shared_ptr<const Model> model = load_model(kTiny);
  const test::Slg ref = test::read_slg(kModels + "tiny-qwen3moe-A-Q8_0.f32ref.slg");
  const int32_t n = static_cast<int32_t>(ref.prompt.size());
  ASSERT_GE(n, 8);
  double nll_ref = 0;
  for (int32_t i = 0; i + 1 < n; ++i) {
    const float* row = ref.logits.data() + size_t(i) * ref.n_vocab;
    double mx = row[0], s = 0;
    for (uint32_t v = 1; v < ref.n_vocab; ++v) mx = std::max(mx, double(row[v]));
    for (uint32_t v = 0; v < ref.n_vocab; ++v) s += std::exp(double(row[v]) - mx);
    nll_ref += mx + std::log(s) - row[ref.prompt[size_t(i) + 1]];
  }
  const double ppl_ref = std::exp(nll_ref / (n - 1));
  EngineOptions o;
  o.n_ctx = n;
  o.n_threads = 2;
  o.mode = MatmulMode::Exact;
  Engine eng(model, o);
  // two copies of the prompt: two chunks from empty contexts, so both score the same
  std::vector<int32_t> twice = ref.prompt;
  twice.insert(twice.end(), ref.prompt.begin(), ref.prompt.end());
  twice.push_back(ref.prompt[0]);  // a tail shorter than a chunk is dropped
  const PerplexityResult r = perplexity(eng, twice, n);
  EXPECT_EQ(r.n_chunks, 2);
  EXPECT_EQ(r.n_scored, 2 * (n - 1));
  EXPECT_NEAR(r.chunk_nll[0], r.chunk_nll[1], 1e-6 * std::abs(r.chunk_nll[0]));
  EXPECT_NEAR(r.ppl() / ppl_ref, 1.0, 2e-4) << "ours " << r.ppl() << " reference " << ppl_ref;
  EXPECT_EQ(perplexity(eng, twice, n, 1).n_chunks, 1);
  EXPECT_THROW(perplexity(eng, std::span<const int32_t>(twice).first(size_t(n - 1)), n), Error);
  EXPECT_THROW(perplexity(eng, twice, n + 1), Error);  // above the engine's context
  EXPECT_THROW(perplexity(eng, twice, 1), Error);
}

TEST(ProfileCli, JsonIsReloadableAndSummaryPrinted) {
  const std::string text = temp_path("text.txt"), out = temp_path("usage.json");
  {
    std::ofstream f(text);
    for (int i = 0; i < 20; ++i) f << "The quick brown fox jumps over the lazy dog. " << i << "\n";
  }
  CliResult r = run_cli("profile -m " + kTiny + " -f " + text + " --ctx 64 -t 2 --json " + out);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("top 25% of experts serve"), std::string::npos) << r.out;
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  const moe::ExpertUsage u = moe::ExpertUsage::from_json(ss.str());
  std::shared_ptr<const Model> model = load_model(kTiny);
  EXPECT_EQ(u.n_layer(), model->hparams().n_layer);
  EXPECT_EQ(u.n_expert(), model->hparams().n_expert);
  const int64_t n_tok = u.tokens(0);
  EXPECT_GT(n_tok, 64);  // more than one chunk
  for (int l = 0; l < u.n_layer(); ++l) EXPECT_EQ(u.tokens(l), n_tok);

  r = run_cli("profile -m " + kTiny + " -f /nonexistent/text.txt");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("strata: error:"), std::string::npos) << r.out;
  // qwen3next: counted too (its file's usage reloads with its shape)
  const std::string next = kModels + "tiny-qwen3next-N-Q4_K_M.gguf";
  r = run_cli("profile -m " + next + " -f " + text + " --ctx 64 -t 2 --json " + out);
  ASSERT_EQ(r.rc, 0) << r.out;
  std::ifstream fn(out);
  std::stringstream sn;
  sn << fn.rdbuf();
  const moe::ExpertUsage un = moe::ExpertUsage::from_json(sn.str());
  std::shared_ptr<const Model> next_model = load_model(next);
  EXPECT_EQ(un.n_layer(), next_model->routed_layers());
  EXPECT_EQ(un.n_expert(), next_model->hparams().n_expert);
  EXPECT_EQ(un.tokens(0), n_tok);  // the same text and tokenizer
  // a file that is not a model
  r = run_cli("profile -m " + std::string(STRATA_FIXTURES_DIR) + "/vocab/ggml-vocab-qwen2.gguf -f " + text);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("strata: error:"), std::string::npos) << r.out;
  std::filesystem::remove(text);
  std::filesystem::remove(out);
}

TEST(PerplexityCli, JsonMatchesLibraryAndErrors) {
  const std::string text = temp_path("ppl.txt");
  {
    std::ofstream f(text);
    for (int i = 0; i < 30; ++i) f << "In the beginning there was text number " << i << ".\n";
  }
  CliResult r = run_cli("perplexity -m " + kTiny + " -f " + text + " --ctx 32 -t 2 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["ctx"], 32);
  EXPECT_EQ(j["chunks"].get<int64_t>(), j["tokens"].get<int64_t>() / 32);
  EXPECT_EQ(j["scored"].get<int64_t>(), j["chunks"].get<int64_t>() * 31);
  double sum = 0;
  for (const auto& c : j["chunk_nll"]) sum += c.get<double>();
  EXPECT_NEAR(std::exp(sum / j["scored"].get<double>()), j["ppl"].get<double>(), 1e-9 * j["ppl"].get<double>());
  r = run_cli("perplexity -m " + kTiny + " -f " + text + " --ctx 32 --chunks 2 -t 2");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("2 chunks of 32"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PPL = "), std::string::npos) << r.out;
  r = run_cli("perplexity -m " + kTiny + " -f " + text + " --ctx 100000");
  EXPECT_EQ(r.rc, 1) << r.out;  // the text does not fill a chunk
  EXPECT_NE(r.out.find("strata: error:"), std::string::npos) << r.out;
  std::filesystem::remove(text);
}
