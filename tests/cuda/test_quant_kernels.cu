// GPU quantized kernels (cuda/quant_kernels.cuh) vs their CPU references:
//  * dequantize: every has_kernel tensor of fixtures/formats/zoo.gguf, bit for bit with
//    strata::dequantize_row, from an aligned and from an odd (byte-load path) address;
//  * matmul vs strata::matmul Exact on random weights at real sizes, n = 1, 2, 5, 8, 33, and on the fast
//    path's edges (odd row counts, odd x offsets, 2-byte aligned weights):
//    max |gpu - cpu| / sum_c |w x| per output below 1e-5 (only the summation order differs);
//  * get_rows vs cpu::get_rows (bit for bit); errors for types without a kernel and bad shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/error.h"
#include "cpu/ops.h"
#include "cpu/thread_pool.h"
#include "cuda/quant_kernels.cuh"
#include "gguf/gguf.h"
#include "gpu_test_util.h"
#include "quant/dequant.h"
#include "quant/matmul.h"

namespace {

using namespace strata;
using strata::test::GpuKernelTest;
namespace cq = strata::cuda::quant;

const GgmlType kKernelTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,   GgmlType::Q4_0,
                                 GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K,   GgmlType::Q3_K,
                                 GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                                 GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S,
                                 GgmlType::IQ1_S, GgmlType::IQ1_M};

std::vector<float> cpu_dequant(GgmlType t, const uint8_t* w, int64_t rows, int64_t cols) {
  std::vector<float> v(rows * cols);
  const int64_t rb = static_cast<int64_t>(row_bytes(t, cols));
  for (int64_t r = 0; r < rows; ++r) dequantize_row(t, w + r * rb, v.data() + r * cols, cols);
  return v;
}

TEST(CudaQuantTypes, KernelSetAndStorageTypes) {
  for (GgmlType t : kKernelTypes) {
    EXPECT_TRUE(cq::has_kernel(t)) << type_name(t);
    EXPECT_EQ(cq::storage_type(t), t) << type_name(t);
  }
  for (GgmlType t : {GgmlType::Q8_K, GgmlType::TQ1_0, GgmlType::MXFP4, GgmlType::I32}) {
    EXPECT_FALSE(cq::has_kernel(t)) << type_name(t);
    EXPECT_EQ(cq::storage_type(t), GgmlType::F16) << type_name(t);
  }
}

using CudaQuant = GpuKernelTest;

TEST_F(CudaQuant, DequantizeZooBitExact) {
  const auto f = gguf::File::open(std::string(STRATA_FIXTURES_DIR) + "/formats/zoo.gguf");
  int compared = 0;
  for (const auto& t : f.tensors()) {
    if (!cq::has_kernel(t.type)) continue;
    const int64_t n = static_cast<int64_t>(t.n_elements()), cols = static_cast<int64_t>(t.ne[0]);
    const auto ref = cpu_dequant(t.type, t.data, n / cols, cols);
    for (size_t offset : {size_t(0), size_t(1)}) {  // 1: every load of the byte path
      auto w = upload(t.data, t.nbytes, offset);
      auto out = output(n * sizeof(float));
      cq::dequantize(t.type, w.ptr(), n, out.ptr<float>(), stream());
      cuda::note_launch(dev->compute(), {w.span()}, {out.span()});
      const auto got = download<float>(out, n);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i)
        if (!test::same_bits(got[i], ref[i]) && bad++ < 3)
          ADD_FAILURE() << t.name << " offset " << offset << " [" << i << "] gpu " << got[i] << " cpu " << ref[i];
      EXPECT_EQ(bad, 0) << t.name << " (" << type_name(t.type) << ") offset " << offset << ": " << bad << " of "
                        << n << " values differ";
    }
    ++compared;
  }
  EXPECT_EQ(compared, 22) << "zoo tensors with a GPU kernel (every format of the zoo)";
  std::printf("%d zoo tensors dequantized bit-exactly on the GPU\n", compared);
}

// The float types' tail (cols not a multiple of 8) and n_values not a multiple of 8.
TEST_F(CudaQuant, DequantizeFloatTail) {
  std::mt19937 rng(3);
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
    const int64_t n = 1003;
    const auto w = test::random_weights(t, 1, n, rng);
    const auto ref = cpu_dequant(t, w.data(), 1, n);
    auto d = upload_vec(w);
    auto out = output(n * 4);
    cq::dequantize(t, d.ptr(), n, out.ptr<float>(), stream());
    cuda::note_launch(dev->compute(), {d.span()}, {out.span()});
    const auto got = download<float>(out, n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += !test::same_bits(got[i], ref[i]);
    EXPECT_EQ(bad, 0) << type_name(t);
  }
}

struct MatmulCase {
  int64_t rows, cols;
  size_t w_offset = 0, x_offset_floats = 0;
};

// Random weights of one shape (uploaded once), then GPU matmul vs strata::matmul Exact for each n;
// returns the worst error relative to sum_c |w x| (the scale of an output's rounding error).
class CudaMatmul : public GpuKernelTest, public ::testing::WithParamInterface<GgmlType> {
 protected:
  double run_case(GgmlType t, const MatmulCase& c, std::initializer_list<int64_t> ns, std::mt19937& rng,
                  ThreadPool& pool) {
    const auto w = test::random_weights(t, c.rows, c.cols, rng);
    const auto wf = cpu_dequant(t, w.data(), c.rows, c.cols);
    auto dw = upload_vec(w, c.w_offset);
    double worst_all = 0;
    for (int64_t n : ns) {
      const auto x = test::random_acts(n * c.cols, rng);
      std::vector<float> ref(n * c.rows);
      matmul(t, w.data(), c.rows, c.cols, x.data(), n, ref.data(), MatmulMode::Exact, pool);
      std::vector<double> mag(n * c.rows);
      pool.parallel_for(c.rows, 16, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t i = 0; i < n; ++i) {
            double s = 0;
            for (int64_t k = 0; k < c.cols; ++k) s += std::fabs(double(wf[r * c.cols + k]) * x[i * c.cols + k]);
            mag[i * c.rows + r] = s;
          }
      });
      auto dx = upload_vec(x, c.x_offset_floats * sizeof(float));
      auto dy = output(n * c.rows * sizeof(float));
      cuda::quant::matmul(t, dw.ptr(), c.rows, c.cols, dx.ptr<float>(), n, dy.ptr<float>(), stream());
      cuda::note_launch(dev->compute(), {dw.span(), dx.span()}, {dy.span()});
      const auto y = download<float>(dy, n * c.rows);
      double worst = 0;
      int64_t worst_i = 0, non_finite = 0;
      for (int64_t i = 0; i < n * c.rows; ++i) {
        if (!std::isfinite(y[i])) {
          ++non_finite;
          continue;
        }
        const double e = std::fabs(double(y[i]) - ref[i]) / std::max(mag[i], 1e-30);
        if (e > worst) worst = e, worst_i = i;
      }
      EXPECT_EQ(non_finite, 0) << type_name(t) << " " << c.rows << "x" << c.cols << " n " << n;
      // accumulate: y0 + the product, the same float addition as adding the product written apart.
      std::vector<float> y0(size_t(n * c.rows));
      for (size_t i = 0; i < y0.size(); ++i) y0[i] = float(int(i % 13) - 6) * 0.37f;
      auto dacc = upload_vec(y0);
      cuda::quant::matmul(t, dw.ptr(), c.rows, c.cols, dx.ptr<float>(), n, dacc.ptr<float>(), stream(), nullptr,
                          /*accumulate=*/true);
      cuda::note_launch(dev->compute(), {dw.span(), dx.span(), dacc.span()}, {dacc.span()});
      const auto acc = download<float>(dacc, n * c.rows);
      int64_t acc_bad = 0;
      for (int64_t i = 0; i < n * c.rows; ++i) acc_bad += !test::same_bits(acc[size_t(i)], y0[size_t(i)] + y[size_t(i)]);
      EXPECT_EQ(acc_bad, 0) << type_name(t) << " " << c.rows << "x" << c.cols << " n " << n
                            << ": accumulate differs from y0 + the product";
      EXPECT_LT(worst, 1e-5) << type_name(t) << " " << c.rows << "x" << c.cols << " n " << n << " w_offset "
                             << c.w_offset << " x_offset " << c.x_offset_floats << ": token " << worst_i / c.rows
                             << " row " << worst_i % c.rows << " gpu " << y[worst_i] << " cpu " << ref[worst_i]
                             << " sum|wx| " << mag[worst_i];
      worst_all = std::max(worst_all, worst);
    }
    return worst_all;
  }
};

TEST_P(CudaMatmul, MatchesCpuExactAtRealSizes) {
  const GgmlType t = GetParam();
  std::mt19937 rng(100 + static_cast<int>(t));
  ThreadPool& pool = test::test_pool();
  double worst = 0;
  for (MatmulCase c : {MatmulCase{2048, 768}, MatmulCase{768, 2048}, MatmulCase{4096, 2048}})
    worst = std::max(worst, run_case(t, c, {1, 2, 5, 8, 33}, rng, pool));
  std::printf("%-7s matmul worst |gpu-cpu|/sum|wx| = %.3g\n", std::string(type_name(t)).c_str(), worst);
}

// Odd addresses: weights at +1 byte (byte loads), x at +1 float (scalar x loads).
TEST_P(CudaMatmul, UnalignedWeightsAndActivations) {
  const GgmlType t = GetParam();
  std::mt19937 rng(200 + static_cast<int>(t));
  ThreadPool& pool = test::test_pool();
  run_case(t, MatmulCase{130, 1024, 1, 1}, {1, 3, 9}, rng, pool);
}

// The fast path's edges (src/cuda/fast_dot.cuh; other types take the generic path on the same shapes):
// row counts not a multiple of the rows per block (4 warps x 1 row below 4096 rows, x 2 rows from 4096),
// x at an odd float offset (scalar x loads), weights at +2 bytes (Q6_K/Q4_0/Q8_0 keep the fast path with
// 2-byte loads; Q4_K/Q5_K fall back to the generic kernel), a column count that leaves lanes idle.
TEST_P(CudaMatmul, FastPathEdgeShapes) {
  const GgmlType t = GetParam();
  std::mt19937 rng(300 + static_cast<int>(t));
  ThreadPool& pool = test::test_pool();
  double worst = 0;
  worst = std::max(worst, run_case(t, MatmulCase{130, 512, 0, 0}, {1, 3, 8, 9}, rng, pool));
  worst = std::max(worst, run_case(t, MatmulCase{4099, 256, 0, 1}, {1, 2, 8}, rng, pool));
  worst = std::max(worst, run_case(t, MatmulCase{4103, 768, 2, 0}, {1, 5}, rng, pool));
  worst = std::max(worst, run_case(t, MatmulCase{37, 1280, 2, 3}, {1, 8}, rng, pool));
  std::printf("%-7s matmul edge shapes worst |gpu-cpu|/sum|wx| = %.3g\n", std::string(type_name(t)).c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(AllKernelTypes, CudaMatmul, ::testing::ValuesIn(kKernelTypes),
                         [](const ::testing::TestParamInfo<GgmlType>& i) { return std::string(type_name(i.param)); });

TEST_F(CudaQuant, MatmulFloatTypesOddColumns) {  // cols % 8 != 0: the float types' tail
  std::mt19937 rng(11);
  ThreadPool& pool = test::test_pool();
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
    for (int64_t cols : {7, 771})
      for (int64_t n : {1, 9}) {
        const auto w = test::random_weights(t, 37, cols, rng);
        const auto x = test::random_acts(n * cols, rng);
        std::vector<float> ref(n * 37);
        matmul(t, w.data(), 37, cols, x.data(), n, ref.data(), MatmulMode::Exact, pool);
        auto dw = upload_vec(w);
        auto dx = upload_vec(x);
        auto dy = output(n * 37 * 4);
        cq::matmul(t, dw.ptr(), 37, cols, dx.ptr<float>(), n, dy.ptr<float>(), stream());
        cuda::note_launch(dev->compute(), {dw.span(), dx.span()}, {dy.span()});
        const auto y = download<float>(dy, n * 37);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          worst = std::max(worst, std::fabs(double(y[i]) - ref[i]));
          scale = std::max(scale, std::fabs(double(ref[i])));
        }
        EXPECT_LT(worst, 1e-5 * std::max(scale, 1.0)) << type_name(t) << " cols " << cols << " n " << n << " max err "
                                                      << worst << " max |y| " << scale;
      }
}

TEST_F(CudaQuant, GetRowsMatchesCpu) {
  std::mt19937 rng(21);
  for (GgmlType t : kKernelTypes) {
    const int64_t rows = 100, cols = 2048;
    const auto w = test::random_weights(t, rows, cols, rng);
    std::vector<int32_t> ids(37);
    for (auto& i : ids) i = static_cast<int32_t>(rng() % rows);
    ids[0] = 0, ids[1] = rows - 1;
    std::vector<float> ref(ids.size() * cols);
    cpu::get_rows(t, w.data(), cols, ids.data(), static_cast<int64_t>(ids.size()), ref.data());
    for (size_t offset : {size_t(0), size_t(1)}) {
      auto dw = upload_vec(w, offset);
      auto di = upload_vec(ids);
      auto out = output(ref.size() * 4);
      cq::get_rows(t, dw.ptr(), cols, di.ptr<int32_t>(), static_cast<int64_t>(ids.size()), out.ptr<float>(), stream());
      cuda::note_launch(dev->compute(), {dw.span(), di.span()}, {out.span()});
      const auto got = download<float>(out, ref.size());
      int64_t bad = 0;
      for (size_t i = 0; i < ref.size(); ++i) bad += !test::same_bits(got[i], ref[i]);
      EXPECT_EQ(bad, 0) << type_name(t) << " offset " << offset << ": " << bad << " of " << ref.size()
                        << " values differ";
    }
  }
}

TEST_F(CudaQuant, ErrorsForUnsupportedTypesAndShapes) {
  auto buf = output(1 << 16);
  float* p = buf.ptr<float>();
  EXPECT_THROW(cq::matmul(GgmlType::Q8_K, p, 4, 256, p, 1, p, stream()), Error);
  EXPECT_THROW(cq::matmul(GgmlType::Q4_K, p, 4, 100, p, 1, p, stream()), Error);  // not a multiple of 256
  EXPECT_THROW(cq::matmul(GgmlType::Q4_0, p, -1, 32, p, 1, p, stream()), Error);
  EXPECT_THROW(cq::dequantize(GgmlType::Q8_0, p, 33, p, stream()), Error);
  EXPECT_THROW(cq::dequantize(GgmlType::TQ1_0, p, 256, p, stream()), Error);
  EXPECT_THROW(cq::get_rows(GgmlType::Q6_K, p, 300, nullptr, 1, p, stream()), Error);
  try {
    cq::matmul(GgmlType::MXFP4, p, 4, 256, p, 1, p, stream());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mxfp4"), std::string::npos) << e.what();
  }
  // Nothing was launched: the context still works.
  cq::dequantize(GgmlType::F32, p, 16, p + 1024, stream());
  dev->synchronize();
}

}  // namespace
