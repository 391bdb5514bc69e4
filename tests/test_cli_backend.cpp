// --backend and the GPU flags through the real binary: a bad backend or cache spec is a clear error
// (exit 1), never a crash; --backend cpu is the default path.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

#include "cli_run.h"

namespace {

using Out = strata::test::CliOut;
Out sh(const std::string& args) { return strata::test::run_strata(args); }  // stdout + stderr

const std::string kModel = std::string(STRATA_FIXTURES_DIR) + "/models/tiny-qwen3moe-A-Q4_K_M.gguf";

TEST(CliBackend, UnknownBackendIsAnError) {
  const Out o = sh("bench -m " + kModel + " -p 4 -n 2 -t 1 --backend tpu");
  EXPECT_EQ(o.rc, 1) << o.out;
  EXPECT_NE(o.out.find("--backend must be cpu or cuda, got 'tpu'"), std::string::npos) << o.out;
}

TEST(CliBackend, CpuBackendBenchPrintsNoCacheReport) {
  const Out o = sh("bench -m " + kModel + " -p 4 -n 2 -t 1 --backend cpu");
  ASSERT_EQ(o.rc, 0) << o.out;
  EXPECT_NE(o.out.find("backend    cpu"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("expert cache"), std::string::npos) << o.out;
}

// The decode roofline after the runs: bytes a token reads, the measured host bandwidth, tg's share; off
// with --no-roofline; in the JSON line too.
TEST(CliBackend, BenchPrintsTheDecodeRoofline) {
  const Out o = sh("bench -m " + kModel + " -p 4 -n 4 -t 1 --backend cpu");
  ASSERT_EQ(o.rc, 0) << o.out;
  EXPECT_NE(o.out.find("roofline   a decoded token reads"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("roofline   host memory"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("roofline   tg4 at"), std::string::npos) << o.out;
  const Out off = sh("bench -m " + kModel + " -p 4 -n 4 -t 1 --backend cpu --no-roofline");
  ASSERT_EQ(off.rc, 0) << off.out;
  EXPECT_EQ(off.out.find("roofline"), std::string::npos) << off.out;
  const Out j = sh("bench -m " + kModel + " -p 0 -n 2 -t 1 --backend cpu --json");
  ASSERT_EQ(j.rc, 0) << j.out;
  EXPECT_NE(j.out.find("\"decode_bytes\": "), std::string::npos) << j.out;
  EXPECT_NE(j.out.find("\"tg_roofline_tok_s\": "), std::string::npos) << j.out;
  EXPECT_EQ(j.out.find("\"tg_roofline_tok_s\": 0.000"), std::string::npos) << j.out;
}

// --parallel P: every tg step decodes one token for each of P sequences in one pass; the line counts all
// their tokens and says how many sequences; a bad P is a clear error.
TEST(CliBackend, BenchParallelDecodesSeveralSequences) {
  const Out o = sh("bench -m " + kModel + " -p 0 -n 3 -t 1 --backend cpu --parallel 4 --no-roofline");
  ASSERT_EQ(o.rc, 0) << o.out;
  EXPECT_NE(o.out.find("tok/s in all, 4 sequences"), std::string::npos) << o.out;
  const Out j = sh("bench -m " + kModel + " -p 0 -n 3 -t 1 --backend cpu --parallel 4 --json");
  ASSERT_EQ(j.rc, 0) << j.out;
  EXPECT_NE(j.out.find("\"parallel\": 4,"), std::string::npos) << j.out;
  EXPECT_NE(j.out.find("\"tg_roofline_tok_s\": 0.000"), std::string::npos) << j.out;  // a single sequence's only
  const Out bad = sh("bench -m " + kModel + " -p 0 -n 3 -t 1 --backend cpu --parallel 0");
  EXPECT_EQ(bad.rc, 1) << bad.out;
  EXPECT_NE(bad.out.find("--parallel must be in [1, 256], got 0"), std::string::npos) << bad.out;
}

TEST(CliBackend, CudaBackendWithoutGpuOrCudaIsAClearError) {
  // Where a GPU is present this runs the model on it instead (and must succeed); a malformed
  // --expert-cache is an error either way.
  const Out o = sh("bench -m " + kModel + " -p 4 -n 2 -t 1 --backend cuda --expert-cache 12x");
  EXPECT_EQ(o.rc, 1) << o.out;
  const bool why = o.out.find("built without CUDA") != std::string::npos ||
                   o.out.find("no CUDA GPU found") != std::string::npos ||
                   o.out.find("--expert-cache must be") != std::string::npos;
  EXPECT_TRUE(why) << o.out;
  const Out g = sh("bench -m " + kModel + " -p 4 -n 2 -t 1 --backend cuda --expert-cache 50%");
  if (g.rc == 0) {
    EXPECT_NE(g.out.find("backend    cuda:0"), std::string::npos) << g.out;
    EXPECT_NE(g.out.find("tg expert cache (cuda:0): hit rate"), std::string::npos) << g.out;
  } else {
    EXPECT_EQ(g.rc, 1) << g.out;
    EXPECT_TRUE(g.out.find("built without CUDA") != std::string::npos ||
                g.out.find("no CUDA GPU found") != std::string::npos)
        << g.out;
  }
}

}  // namespace
