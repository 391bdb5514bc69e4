// The Q4_K 8-row repacked prefill kernel (quant/q4k_repack.h) must give the same bits as the fast
// path without it: matmul on random matrices at real sizes (expert gate/up 768x2048, down 2048x768,
// odd row counts, token counts not a multiple of 4, shared activations in matmul_many) and the
// tiny-qwen3moe Q4_K_M fixture's prefill logits, compared with memcmp. Also: the budget bounds the cache.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_features.h"
#include "engine/engine.h"
#include "quant/matmul.h"
#include "quant/q4k_gemm.h"
#include "quant/q4k_repack.h"
#include "quant_test_util.h"
#include "slg.h"

using namespace strata;
using namespace strata::test;

namespace {

bool repack_cpu() { return cpu_level() == CpuLevel::Avx512 && cpu_features().avx512vbmi; }

std::vector<uint8_t> random_matrix(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<uint8_t> w;
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = random_row(t, cols, rng);
    w.insert(w.end(), row.begin(), row.end());
  }
  return w;
}

struct BudgetGuard {  // restores "off" whatever a test does; the 16-row kernel (q4k_gemm.h) off meanwhile
  bool gemm = q::q4k_gemm_enabled();
  BudgetGuard() { q::q4k_gemm_set_enabled(false); }
  ~BudgetGuard() {
    q::q4k_repack_set_budget(0);
    q::q4k_gemm_set_enabled(gemm);
  }
};

}  // namespace

TEST(Q4KRepack, MatmulBitIdenticalToFastPath) {
  if (!repack_cpu()) GTEST_SKIP() << "no AVX-512 VNNI+VBMI at the level in use";
  BudgetGuard guard;
  ThreadPool pool(2);
  std::mt19937 rng(11);
  struct Shape { int64_t rows, cols, n_tok; };
  for (const Shape s : {Shape{768, 2048, 64}, Shape{2048, 768, 64}, Shape{768, 2048, 37}, Shape{776, 512, 4},
                        Shape{771, 256, 13}, Shape{8, 256, 5}}) {
    SCOPED_TRACE(testing::Message() << s.rows << "x" << s.cols << " n_tok " << s.n_tok);
    const auto w = random_matrix(GgmlType::Q4_K, s.rows, s.cols, rng);
    std::vector<float> x;
    for (int64_t t = 0; t < s.n_tok; ++t) {
      const auto row = random_acts(s.cols, rng, t % 3 == 0 ? 4.f : 1.f);
      x.insert(x.end(), row.begin(), row.end());
    }
    std::vector<float> y0(s.rows * s.n_tok), y1(s.rows * s.n_tok, -1.f);
    q::q4k_repack_set_budget(0);
    matmul(GgmlType::Q4_K, w.data(), s.rows, s.cols, x.data(), s.n_tok, y0.data(), MatmulMode::Fast, pool);
    q::q4k_repack_set_budget(size_t(1) << 30);
    matmul(GgmlType::Q4_K, w.data(), s.rows, s.cols, x.data(), s.n_tok, y1.data(), MatmulMode::Fast, pool);
    const size_t expect_bytes = s.rows % 8 == 0 ? size_t(s.rows / 8) * (s.cols / 256) * sizeof(q::RepQ4K8) : 0;
    EXPECT_EQ(q::q4k_repack_bytes(), expect_bytes);  // the repacked path really ran (or, rows % 8, did not)
    size_t differ = 0;
    for (size_t i = 0; i < y0.size(); ++i) differ += std::memcmp(&y0[i], &y1[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << "first values " << y0[0] << " vs " << y1[0];
    q::q4k_repack_set_budget(0);
  }
}

TEST(Q4KRepack, MatmulManySharedActivationsBitIdentical) {
  // A Q6_K job owns the quantized activations (same Q8_K rows) a Q4_K job then reuses.
  if (!repack_cpu()) GTEST_SKIP() << "no AVX-512 VNNI+VBMI at the level in use";
  BudgetGuard guard;
  ThreadPool pool(2);
  std::mt19937 rng(12);
  const int64_t rows = 128, cols = 1024, n_tok = 20;
  const auto w6 = random_matrix(GgmlType::Q6_K, rows, cols, rng);
  const auto w4 = random_matrix(GgmlType::Q4_K, rows, cols, rng);
  const auto w4b = random_matrix(GgmlType::Q4_K, rows, cols, rng);
  std::vector<float> x;
  for (int64_t t = 0; t < n_tok; ++t) {
    const auto row = random_acts(cols, rng);
    x.insert(x.end(), row.begin(), row.end());
  }
  std::vector<float> y[2][3];
  for (int pass = 0; pass < 2; ++pass) {
    q::q4k_repack_set_budget(pass ? size_t(1) << 30 : 0);
    for (auto& v : y[pass]) v.assign(rows * n_tok, -1.f);
    const MatmulJob jobs[3] = {{GgmlType::Q6_K, w6.data(), rows, cols, x.data(), n_tok, y[pass][0].data()},
                               {GgmlType::Q4_K, w4.data(), rows, cols, x.data(), n_tok, y[pass][1].data()},
                               {GgmlType::Q4_K, w4b.data(), rows, cols, x.data(), n_tok, y[pass][2].data()}};
    matmul_many(jobs, 3, MatmulMode::Fast, pool);
  }
  EXPECT_EQ(q::q4k_repack_bytes(), 2 * size_t(rows / 8) * (cols / 256) * sizeof(q::RepQ4K8));
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(std::memcmp(y[0][k].data(), y[1][k].data(), y[0][k].size() * sizeof(float)), 0) << "job " << k;
}

TEST(Q4KRepack, BudgetBoundsTheCache) {
  if (!repack_cpu()) GTEST_SKIP() << "no AVX-512 VNNI+VBMI at the level in use";
  BudgetGuard guard;
  ThreadPool pool(1);
  std::mt19937 rng(13);
  const int64_t rows = 64, cols = 512, n_tok = 8;
  const auto a = random_matrix(GgmlType::Q4_K, rows, cols, rng);
  const auto b = random_matrix(GgmlType::Q4_K, rows, cols, rng);
  const size_t one = size_t(rows / 8) * (cols / 256) * sizeof(q::RepQ4K8);
  q::q4k_repack_set_budget(one + one / 2);  // room for one copy, not two
  EXPECT_NE(q::q4k_repacked(a.data(), rows, cols), nullptr);
  EXPECT_EQ(q::q4k_repacked(b.data(), rows, cols), nullptr);
  EXPECT_EQ(q::q4k_repack_bytes(), one);
  EXPECT_EQ(q::q4k_repacked(a.data(), rows, cols), q::q4k_repacked(a.data(), rows, cols));  // built once
  EXPECT_EQ(q::q4k_repacked(a.data(), rows - 4, cols), nullptr);  // rows % 8 != 0
  const auto held = q::q4k_repacked(a.data(), rows, cols);
  q::q4k_repack_clear();  // frees the cache's reference; `held` stays valid
  EXPECT_EQ(q::q4k_repack_bytes(), 0u);
  std::vector<float> x(n_tok * cols, 0.5f), y0(rows * n_tok), y1(rows * n_tok);
  matmul(GgmlType::Q4_K, b.data(), rows, cols, x.data(), n_tok, y1.data(), MatmulMode::Fast, pool);
  q::q4k_repack_set_budget(0);
  matmul(GgmlType::Q4_K, b.data(), rows, cols, x.data(), n_tok, y0.data(), MatmulMode::Fast, pool);
  EXPECT_EQ(std::memcmp(y0.data(), y1.data(), y0.size() * sizeof(float)), 0);
  EXPECT_EQ(held[0].d[0], held[0].d[0]);  // still readable (ASan would flag a freed copy)
}

TEST(Q4KRepack, FixtureModelLogitsBitIdentical) {
  if (!repack_cpu()) GTEST_SKIP() << "no AVX-512 VNNI+VBMI at the level in use";
  BudgetGuard guard;
  const std::string dir = std::string(STRATA_FIXTURES_DIR) + "/models/";
  const Slg ref = read_slg(dir + "tiny-qwen3moe-A-Q4_K_M.f32ref.slg");
  std::shared_ptr<const Model> model = load_model(dir + "tiny-qwen3moe-A-Q4_K_M.gguf");
  EngineOptions opt;
  opt.n_ctx = 128;
  opt.n_batch = 512;
  opt.n_threads = 2;
  opt.mode = MatmulMode::Fast;
  Engine eng(model, opt);
  const size_t V = ref.n_vocab;
  std::vector<float> logits[2];
  for (int pass = 0; pass < 2; ++pass) {
    q::q4k_repack_set_budget(pass ? size_t(1) << 30 : 0);
    auto seq = eng.new_sequence();
    logits[pass].assign(ref.n_prompt * V, 0.f);
    eng.prefill(*seq, ref.prompt, logits[pass].data(), true);
  }
  EXPECT_GT(q::q4k_repack_bytes(), 0u) << "no Q4_K matrix took the repacked path";
  EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)), 0);
}
