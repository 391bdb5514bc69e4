// `strata tokenize` / `strata detokenize` end to end on the real Qwen2 vocabulary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "cli_run.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string kVocab = std::string(STRATA_FIXTURES_DIR) + "/vocab/ggml-vocab-qwen2.gguf";

// stdout and stderr of `strata ARGS` with stdin_text on its stdin.
using Run = strata::test::CliOut;
Run run_cli(const std::string& args, const std::string& stdin_text = "") {
  // One file per process and call: ctest runs the tests of this binary in parallel processes.
  static int calls = 0;
  const std::string in_path = std::string(STRATA_BINARY_DIR) + "/tokenizer_cli_stdin." +
                              std::to_string(getpid()) + "." + std::to_string(calls++) + ".txt";
  {
    std::ofstream f(in_path, std::ios::binary);
    f << stdin_text;
  }
  strata::test::CliOut r = strata::test::run_strata(args, true, in_path);
  std::remove(in_path.c_str());
  return r;
}

}  // namespace

TEST(TokenizerCli, TokenizeAndDetokenize) {
  auto r = run_cli("tokenize -m " + kVocab + " 'Hello, world!'");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "9707 11 1879 0\n");  // llama.cpp's ids (fixture .out, "Hello, world!")

  r = run_cli("tokenize -m " + kVocab + " --special '<|im_start|>user'");
  EXPECT_EQ(r.out.substr(0, 7), "151644 ");
  r = run_cli("tokenize -m " + kVocab + " '<|im_start|>user'");
  EXPECT_THAT(r.out, testing::Not(testing::HasSubstr("151644")));

  r = run_cli("tokenize -m " + kVocab, " Hello World!");  // from stdin
  EXPECT_EQ(r.out, "21927 4337 0\n");

  r = run_cli("detokenize -m " + kVocab + " 9707 11 1879 0");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "Hello, world!\n");
  r = run_cli("detokenize -m " + kVocab + " -n --no-special", "[151644, 9707, 151645]");
  EXPECT_EQ(r.out, "Hello");
}

TEST(TokenizerCli, BadInputIsAClearError) {
  auto r = run_cli("detokenize -m " + kVocab + " 9707 x12");
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.out, testing::HasSubstr("strata: error: not a token id: 'x12'"));
  r = run_cli("detokenize -m " + kVocab + " 151936");
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.out, testing::HasSubstr("token id 151936 is out of range"));
  r = run_cli("tokenize -m " + std::string(STRATA_FIXTURES_DIR) + "/formats/zoo.gguf hi");
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.out, testing::HasSubstr("no tokenizer in this file"));
}

// One Tokenizer shared by threads gives every thread the same ids as a single thread.
TEST(TokenizerConcurrency, SharedTokenizerIsThreadSafe) {
  using namespace strata::tokenizer;
  const auto tok = Tokenizer::from_gguf(strata::gguf::File::open(kVocab));
  const std::string text = "Hello, y'all! How are you \xF0\x9F\x98\x81 ?\xE6\x88\x91\xE6\x83\xB3 3333 <|im_start|>";
  const auto expected = tok.tokenize(text, {.parse_special = true});
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i)
        if (tok.tokenize(text, {.parse_special = true}) != expected) ++mismatches;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}
