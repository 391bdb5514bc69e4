// The prefill GEMM path (cuda/gemm_context.h: weights and x rounded to bf16 or f16, cuBLAS, f32
// accumulate) vs strata::matmul Exact on random weights, n = 32, 100, 512, for Q4_K, Q6_K, Q8_0, F32.
// Error measure: max |gpu - cpu| / sum_c |w x| per output. Rounding w and x to a format with unit
// roundoff u changes each product by at most ~2u relative, so the error is below 2u * sum|w x| plus the
// f32 summation error: bf16 u = 2^-9 (bound 3.9e-3, tolerance 1e-2), f16 u = 2^-12 (bound 4.9e-4,
// tolerance 2e-3; the test values, |w| < 1 and |x| < 6, are far inside f16's range, and f16 subnormals
// below 6e-5 add at most 3e-8 absolute per product).
// That bound is loose for a test: an output that is plain wrong errs by only ~1/sqrt(cols) of sum|w x|
// (~3e-2). So the mean error is checked too: rounding errors of random sign add up like a random walk,
// mean |err| / sum|w x| ~ 1.3u / (0.64 sqrt(cols)) (~1e-4 for bf16, ~1.3e-5 for f16 at cols 768):
// tolerance 5e-4 (bf16) and 1e-4 (f16).
// Also: a small context (row tiles of 300, token chunks of 64) gives the same result as a large one, n
// below kGemmMinTokens still takes the exact kernels, and bad shapes are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "cpu/thread_pool.h"
#include "cuda/gemm_context.h"
#include "cuda/quant_kernels.cuh"
#include "gpu_test_util.h"
#include "quant/dequant.h"
#include "quant/matmul.h"

namespace {

using namespace strata;
namespace cq = strata::cuda::quant;

struct GemmCase {
  GgmlType type;
  cuda::GemmPrecision precision;
};

class CudaGemm : public test::GpuKernelTest, public ::testing::WithParamInterface<GemmCase> {
 protected:
  // Worst error / sum|w x| of quant::matmul with `ctx` vs matmul Exact for each n (one weight).
  double run(GgmlType t, int64_t rows, int64_t cols, std::initializer_list<int64_t> ns,
             const cuda::GemmContext* ctx, double tol, double mean_tol, std::mt19937& rng) {
    ThreadPool& pool = test::test_pool();
    const auto w = test::random_weights(t, rows, cols, rng);
    std::vector<float> wf(rows * cols);
    const int64_t rb = int64_t(row_bytes(t, cols));
    for (int64_t r = 0; r < rows; ++r) dequantize_row(t, w.data() + r * rb, wf.data() + r * cols, cols);
    auto dw = upload_vec(w);
    double worst_all = 0;
    for (int64_t n : ns) {
      const auto x = test::random_acts(n * cols, rng);
      std::vector<float> ref(n * rows);
      matmul(t, w.data(), rows, cols, x.data(), n, ref.data(), MatmulMode::Exact, pool);
      std::vector<double> mag(n * rows);
      pool.parallel_for(rows, 8, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t i = 0; i < n; ++i) {
            double s = 0;
            for (int64_t c = 0; c < cols; ++c) s += std::fabs(double(wf[r * cols + c]) * x[i * cols + c]);
            mag[i * rows + r] = s;
          }
      });
      auto dx = upload_vec(x);
      auto dy = output(n * rows * sizeof(float));
      cq::matmul(t, dw.ptr(), rows, cols, dx.ptr<float>(), n, dy.ptr<float>(), stream(), ctx);
      cuda::note_launch(dev->compute(), {dw.span(), dx.span()}, {dy.span()});
      const auto y = download<float>(dy, n * rows);
      double worst = 0, sum = 0;
      int64_t wi = 0, non_finite = 0;
      for (int64_t i = 0; i < n * rows; ++i) {
        if (!std::isfinite(y[i])) {
          ++non_finite;
          continue;
        }
        const double e = std::fabs(double(y[i]) - ref[i]) / std::max(mag[i], 1e-30);
        sum += e;
        if (e > worst) worst = e, wi = i;
      }
      const double mean = sum / double(n * rows);
      const std::string what = std::string(type_name(t)) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                               " n " + std::to_string(n);
      EXPECT_EQ(non_finite, 0) << what;
      EXPECT_LT(worst, tol) << what << ": token " << wi / rows << " row " << wi % rows << " gpu " << y[wi] << " cpu "
                            << ref[wi] << " sum|wx| " << mag[wi];
      EXPECT_LT(mean, mean_tol) << what << ": mean |gpu-cpu|/sum|wx|";
      std::printf("gemm %s: |gpu-cpu|/sum|wx| worst %.3g (tol %.1g), mean %.3g (tol %.1g)\n", what.c_str(), worst,
                  tol, mean, mean_tol);
      worst_all = std::max(worst_all, worst);
    }
    return worst_all;
  }
};

TEST_P(CudaGemm, MatchesCpuExact) {
  const auto [t, prec] = GetParam();
  const bool bf16 = prec == cuda::GemmPrecision::BF16;
  const double tol = bf16 ? 1e-2 : 2e-3, mean_tol = bf16 ? 5e-4 : 1e-4;
  std::mt19937 rng(500 + static_cast<int>(t));
  // Large context: one tile, one chunk. Small context: row tiles of 300 and token chunks of 64.
  auto big = cuda::make_gemm_context(*dev, 4096, 2048, 512, prec);
  auto small = cuda::make_gemm_context(*dev, 300, 2048, 64, prec);
  const double a = run(t, 1024, 2048, {32, 100, 512}, big.get(), tol, mean_tol, rng);
  const double b = run(t, 2048, 768, {32, 100}, small.get(), tol, mean_tol, rng);
  std::printf("%-5s %s: worst %.3g\n", std::string(type_name(t)).c_str(),
              prec == cuda::GemmPrecision::BF16 ? "bf16" : "f16", std::max(a, b));
}

INSTANTIATE_TEST_SUITE_P(
    Types, CudaGemm,
    ::testing::Values(GemmCase{GgmlType::Q4_K, cuda::GemmPrecision::BF16}, GemmCase{GgmlType::Q6_K, cuda::GemmPrecision::BF16},
                      GemmCase{GgmlType::Q8_0, cuda::GemmPrecision::BF16}, GemmCase{GgmlType::F32, cuda::GemmPrecision::BF16},
                      GemmCase{GgmlType::Q4_K, cuda::GemmPrecision::F16}, GemmCase{GgmlType::Q6_K, cuda::GemmPrecision::F16},
                      GemmCase{GgmlType::Q8_0, cuda::GemmPrecision::F16}, GemmCase{GgmlType::F32, cuda::GemmPrecision::F16}),
    [](const ::testing::TestParamInfo<GemmCase>& i) {
      return std::string(type_name(i.param.type)) + (i.param.precision == cuda::GemmPrecision::BF16 ? "_bf16" : "_f16");
    });

using CudaGemmMisc = test::GpuKernelTest;

// Below kGemmMinTokens a context changes nothing: the exact kernels (1e-5, as in test_quant_kernels).
TEST_F(CudaGemmMisc, SmallNKeepsExactKernels) {
  auto ctx = cuda::make_gemm_context(*dev, 768, 2048, 64);
  std::mt19937 rng(9);
  ThreadPool& pool = test::test_pool();
  const int64_t rows = 768, cols = 2048, n = cuda::kGemmMinTokens - 1;
  const auto wq = test::random_weights(GgmlType::Q4_K, rows, cols, rng);
  const auto x = test::random_acts(n * cols, rng);
  std::vector<float> ref(n * rows);
  matmul(GgmlType::Q4_K, wq.data(), rows, cols, x.data(), n, ref.data(), MatmulMode::Exact, pool);
  auto dw = upload_vec(wq);
  auto dx = upload_vec(x);
  auto dy = output(n * rows * 4);
  cq::matmul(GgmlType::Q4_K, dw.ptr(), rows, cols, dx.ptr<float>(), n, dy.ptr<float>(), stream(), ctx.get());
  cuda::note_launch(dev->compute(), {dw.span(), dx.span()}, {dy.span()});
  const auto y = download<float>(dy, n * rows);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    worst = std::max(worst, std::fabs(double(y[i]) - ref[i]));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  EXPECT_LT(worst, 1e-5 * scale) << "n " << n << " max err " << worst << " max |y| " << scale;
}

// accumulate (cuBLAS's beta = 1): y0 + the product, as the product written apart and added on the host
// (the same f32 addition; cuBLAS may pick another algorithm for beta = 1, so up to a few ulps of the sum).
// F32 weights with an odd column count: the 16-bit conversions' tails and the unaligned x chunks (a small
// context: token chunks of 33, so the second chunk of x starts 4 bytes past a 16-byte boundary).
TEST_F(CudaGemmMisc, AccumulateAddsIntoY) {
  std::mt19937 rng(17);
  for (auto [t, cols] : {std::pair{GgmlType::Q4_K, int64_t(2048)}, std::pair{GgmlType::F32, int64_t(1001)}}) {
    SCOPED_TRACE(std::string(type_name(t)));
    auto ctx = cuda::make_gemm_context(*dev, 512, cols, 33);
    const int64_t rows = 512, n = 70;
    const auto wq = test::random_weights(t, rows, cols, rng);
    const auto x = test::random_acts(n * cols, rng);
    const auto y0 = test::random_acts(n * rows, rng);
    auto dw = upload_vec(wq);
    auto dx = upload_vec(x);
    auto dp = output(n * rows * 4);
    auto dy = upload_vec(y0);
    cuda::matmul_gemm(*ctx, t, dw.ptr(), rows, cols, dx.ptr<float>(), n, dp.ptr<float>(), stream());
    cq::matmul(t, dw.ptr(), rows, cols, dx.ptr<float>(), n, dy.ptr<float>(), stream(), ctx.get(), /*accumulate=*/true);
    cuda::note_launch(dev->compute(), {dw.span(), dx.span(), dy.span()}, {dp.span(), dy.span()});
    const auto prod = download<float>(dp, n * rows), y = download<float>(dy, n * rows);
    int64_t bad = 0, same = 0;
    for (int64_t i = 0; i < n * rows; ++i) {
      const size_t k = size_t(i);
      const float want = y0[k] + prod[k];
      same += y[k] == want;
      const double tol = 1e-5 * (std::fabs(double(y0[k])) + std::fabs(double(prod[k])) + 1e-6);
      bad += !(std::fabs(double(y[k]) - want) <= tol);
    }
    EXPECT_EQ(bad, 0) << "of " << n * rows;
    std::printf("gemm accumulate %s: %lld of %lld the same bits as y0 + product\n", std::string(type_name(t)).c_str(),
                (long long)same, (long long)(n * rows));
  }
}

TEST_F(CudaGemmMisc, BadShapesAreErrors) {
  EXPECT_THROW(cuda::make_gemm_context(*dev, 0, 2048, 64), Error);
  EXPECT_THROW(cuda::make_gemm_context(*dev, 16, 2048, -1), Error);
  auto ctx = cuda::make_gemm_context(*dev, 64, 512, 64);
  auto buf = output(1 << 20);
  float* fp = buf.ptr<float>();
  // cols beyond the context
  EXPECT_THROW(cuda::matmul_gemm(*ctx, GgmlType::Q4_K, fp, 4, 1024, fp, 40, fp, stream()), Error);
  // no kernel for the type; cols not a multiple of the block
  EXPECT_THROW(cuda::matmul_gemm(*ctx, GgmlType::TQ1_0, fp, 4, 256, fp, 40, fp, stream()), Error);
  EXPECT_THROW(cuda::matmul_gemm(*ctx, GgmlType::Q4_K, fp, 4, 100, fp, 40, fp, stream()), Error);
}

}  // namespace
