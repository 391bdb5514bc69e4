// `strata eval` / `strata run` end to end through the real binary: the logits file matches the
// fixture reference, and bad inputs exit 1 with a message that says what is wrong.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include "cli_run.h"
#include "slg.h"

using namespace strata::test;

namespace {

using Out = strata::test::CliOut;
Out sh(const std::string& args) { return strata::test::run_strata(args); }  // stdout + stderr

const std::string kModel = std::string(STRATA_FIXTURES_DIR) + "/models/tiny-qwen3moe-A-Q4_K_M.gguf";

}  // namespace

TEST(CliEngine, EvalWritesReferenceLogitsAndGreedyIds) {
  const Slg ref = read_slg(std::string(STRATA_FIXTURES_DIR) + "/models/tiny-qwen3moe-A-Q4_K_M.f32ref.slg");
  std::string ids;
  for (int32_t t : ref.prompt) ids += std::to_string(t) + " ";
  const std::string out = ::testing::TempDir() + "strata_eval_logits.f32";
  const Out o = sh("eval -m " + kModel + " --exact --tokens \"" + ids + "\" --logits " + out +
                   " --greedy 24 -t 2");
  ASSERT_EQ(o.rc, 0) << o.out;
  std::string expect;
  for (size_t i = 0; i < ref.gen.size(); ++i) expect += (i ? " " : "") + std::to_string(ref.gen[i]);
  EXPECT_EQ(o.out, expect + "\n");
  std::ifstream f(out, std::ios::binary);
  std::vector<float> got(ref.logits.size());
  f.read(reinterpret_cast<char*>(got.data()), std::streamsize(got.size() * 4));
  ASSERT_TRUE(f.good());
  EXPECT_EQ(f.peek(), EOF);  // exactly [n_tokens][n_vocab]
  double kl = 0;
  for (uint32_t p = 0; p < ref.n_prompt; ++p)
    kl += kl_div(&ref.logits[p * ref.n_vocab], &got[p * ref.n_vocab], ref.n_vocab) / ref.n_prompt;
  EXPECT_LE(kl, 1e-5);
  std::remove(out.c_str());
}

TEST(CliEngine, BadInputsExitOneWithAMessage) {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"eval -m " + kModel + " --tokens \"\"", "empty prompt"},
      {"eval -m " + kModel + " --tokens \"1 512\"", "token id 512 is out of range"},
      {"eval -m " + kModel + " --tokens \"1 x2\"", "'x2' is not a token id"},
      {"eval -m " + kModel + " --tokens \"1 2 3\" --ctx 2", "context overflow"},
      {"eval -m /nonexistent.gguf --tokens 1", "/nonexistent.gguf"},
      {"run -m " + kModel + " -p \"\"", "empty prompt"},
      {"run -m " + kModel + " -p hi -n 100 --ctx 50", "context overflow"},
      {"run -m " + kModel + " -p hi --top-p 0", "top-p"},
      {"bench -m " + kModel + " --kv-type q8", "--kv-type must be f32 or f16"},
  };
  for (const auto& c : cases) {
    const Out o = sh(c.args);
    EXPECT_EQ(o.rc, 1) << c.args << "\n" << o.out;
    EXPECT_NE(o.out.find("strata: error:"), std::string::npos) << o.out;
    EXPECT_NE(o.out.find(c.message), std::string::npos) << c.args << "\n" << o.out;
  }
}

TEST(CliEngine, RunIsReproducibleWithASeed) {
  const std::string args = "run -m " + kModel + " -p \"Once upon a time\" -n 24 --seed 7 --no-timing -t 2";
  const Out a = sh(args), b = sh(args);
  ASSERT_EQ(a.rc, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
  const Out c = sh("run -m " + kModel + " -p \"Once upon a time\" -n 24 --seed 8 --no-timing -t 2");
  EXPECT_NE(a.out, c.out);
}
