// --backend and the GPU flags through the real binary: a bad backend or cache spec is a clear error
// (exit 1), never a crash; --backend cpu is the default path.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

struct Out {
  int rc;
  std::string text;  // stdout + stderr
};

Out sh(const std::string& args) {
  const std::string cmd = std::string(STRATA_CLI_PATH) + " " + args + " 2>&1";
  Out o{-1, {}};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return o;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) o.text.append(buf.data(), n);
  const int st = pclose(p);
  o.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

const std::string kModel = std::string(STRATA_FIXTURES_DIR) + "/models/tiny-qwen3moe-A-Q4_K_M.gguf";

TEST(CliBackend, UnknownBackendIsAnError) {
  const Out o = sh("bench -m " + kModel + " -p 4 -n 2 -t 1 --backend tpu");
  EXPECT_EQ(o.rc, 1) << o.text;
  EXPECT_NE(o.text.find("--backend must be cpu or cuda, got 'tpu'"), std::string::npos) << o.text;
}

TEST(CliBackend, CpuBackendBenchPrintsNoCacheReport) {
  const Out o = sh("bench -m " + kModel + " -p 4 -n 2 -t 1 --backend cpu");
  ASSERT_EQ(o.rc, 0) << o.text;
  EXPECT_NE(o.text.find("backend    cpu"), std::string::npos) << o.text;
  EXPECT_EQ(o.text.find("expert cache"), std::string::npos) << o.text;
}

// The decode roofline after the runs: bytes a token reads, the measured host bandwidth, tg's share; off
// with --no-roofline; in the JSON line too.
TEST(CliBackend, BenchPrintsTheDecodeRoofline) {
  const Out o = sh("bench -m " + kModel + " -p 4 -n 4 -t 1 --backend cpu");
  ASSERT_EQ(o.rc, 0) << o.text;
  EXPECT_NE(o.text.find("roofline   a decoded token reads"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("roofline   host memory"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("roofline   tg4 at"), std::string::npos) << o.text;
  const Out off = sh("bench -m " + kModel + " -p 4 -n 4 -t 1 --backend cpu --no-roofline");
  ASSERT_EQ(off.rc, 0) << off.text;
  EXPECT_EQ(off.text.find("roofline"), std::string::npos) << off.text;
  const Out j = sh("bench -m " + kModel + " -p 0 -n 2 -t 1 --backend cpu --json");
  ASSERT_EQ(j.rc, 0) << j.text;
  EXPECT_NE(j.text.find("\"decode_bytes\": "), std::string::npos) << j.text;
  EXPECT_NE(j.text.find("\"tg_roofline_tok_s\": "), std::string::npos) << j.text;
  EXPECT_EQ(j.text.find("\"tg_roofline_tok_s\": 0.000"), std::string::npos) << j.text;
}

TEST(CliBackend, CudaBackendWithoutGpuOrCudaIsAClearError) {
  // Where a GPU is present this runs the model on it instead (and must succeed); a malformed
  // --expert-cache is an error either way.
  const Out o = sh("bench -m " + kModel + " -p 4 -n 2 -t 1 --backend cuda --expert-cache 12x");
  EXPECT_EQ(o.rc, 1) << o.text;
  const bool why = o.text.find("built without CUDA") != std::string::npos ||
                   o.text.find("no CUDA GPU found") != std::string::npos ||
                   o.text.find("--expert-cache must be") != std::string::npos;
  EXPECT_TRUE(why) << o.text;
  const Out g = sh("bench -m " + kModel + " -p 4 -n 2 -t 1 --backend cuda --expert-cache 50%");
  if (g.rc == 0) {
    EXPECT_NE(g.text.find("backend    cuda:0"), std::string::npos) << g.text;
    EXPECT_NE(g.text.find("tg expert cache (cuda:0): hit rate"), std::string::npos) << g.text;
  } else {
    EXPECT_EQ(g.rc, 1) << g.text;
    EXPECT_TRUE(g.text.find("built without CUDA") != std::string::npos ||
                g.text.find("no CUDA GPU found") != std::string::npos)
        << g.text;
  }
}

}  // namespace
