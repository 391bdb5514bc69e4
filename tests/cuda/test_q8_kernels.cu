// GPU int8-activation kernels (cuda/q8_kernels.cuh) vs their CPU references (cuda/host/q8_reference.h):
//  * quantize and rmsnorm_quantize: q bytes and ds identical to the reference (the rounding rule is exact
//    on both sides), y of rmsnorm_quantize bit-identical to ops::rmsnorm on the GPU, in place too;
//  * matvec: the 5 formats, shapes 768x2048, 2048x768, 4096x2048, 5120x2048 (n = 1, 3, 8, 11) and
//    151936x2048 (n = 1), accumulate off and on, plus 2-byte aligned weights: per output
//    |gpu - ref| <= 1e-5 * sum_c |w_c * x_c| (w dequantized, x the dequantized int8 activations; only the
//    float summation order differs);
//  * moe_gate_up / moe_down (further down).
// The activations given to matvec come from the CPU quantizer, so each product is tested on its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "cpu/thread_pool.h"
#include "cuda/host/q8_reference.h"
#include "cuda/ops.cuh"
#include "cuda/q8_kernels.cuh"
#include "gpu_test_util.h"
#include "quant/dequant.h"

namespace {

using namespace strata;
namespace q8 = strata::cuda::q8;
namespace q8ref = strata::cuda::q8ref;
using q8ref::Q8Ds;
static_assert(sizeof(Q8Ds) == sizeof(float2) && alignof(Q8Ds) <= alignof(float2));

const GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// Decode-like activations: N(0, 1) with outliers every 97 values and one all-zero block per row.
std::vector<float> make_acts(int64_t n, int64_t cols, std::mt19937& rng) {
  auto x = test::random_acts(n * cols, rng);
  for (int64_t i = 0; i < n * cols; i += 97) x[i] *= 8.f;
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < 32; ++i) x[t * cols + 64 + i] = 0.f;
  return x;
}

struct Q8Host {
  std::vector<int8_t> q;
  std::vector<Q8Ds> ds;
};
Q8Host quantize_host(const std::vector<float>& x, int64_t n, int64_t cols) {
  Q8Host h{std::vector<int8_t>(n * cols), std::vector<Q8Ds>(n * cols / 32)};
  q8ref::quantize(x.data(), n, cols, h.q.data(), h.ds.data());
  return h;
}

using CudaQ8 = test::GpuKernelTest;

TEST_F(CudaQ8, SupportedTypes) {
  for (GgmlType t : kTypes) EXPECT_TRUE(q8::supported(t)) << type_name(t);
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q2_K, GgmlType::Q3_K,
                     GgmlType::IQ4_XS, GgmlType::Q8_K})
    EXPECT_FALSE(q8::supported(t)) << type_name(t);
}

TEST_F(CudaQ8, QuantizeIdenticalToReference) {
  std::mt19937 rng(11);
  for (int64_t cols : {int64_t(2048), int64_t(768), int64_t(32)}) {
    const int64_t n = 5;
    const auto x = make_acts(n, std::max<int64_t>(cols, 96), rng);  // >= 96 columns for the zero block
    std::vector<float> xs(x.begin(), x.begin() + n * cols);
    const Q8Host ref = quantize_host(xs, n, cols);
    auto d_x = upload_vec(xs);
    auto d_q = output(n * cols, 0x55);
    auto d_ds = output(n * cols / 32 * sizeof(float2), 0xFF);
    q8::quantize(d_x.ptr<float>(), n, cols, d_q.ptr<int8_t>(), d_ds.ptr<float2>(), stream());
    cuda::note_launch(dev->compute(), {d_x.span()}, {d_q.span(), d_ds.span()});
    const auto q = download<int8_t>(d_q, n * cols);
    const auto ds = download<Q8Ds>(d_ds, n * cols / 32);
    int64_t bad_q = 0, bad_ds = 0;
    for (int64_t i = 0; i < n * cols; ++i)
      if (q[i] != ref.q[i] && bad_q++ < 3)
        ADD_FAILURE() << "cols " << cols << " q[" << i << "] gpu " << int(q[i]) << " ref " << int(ref.q[i]) << " x "
                      << xs[i];
    for (int64_t b = 0; b < n * cols / 32; ++b)
      bad_ds += !test::same_bits(ds[b].d, ref.ds[b].d) || !test::same_bits(ds[b].s, ref.ds[b].s);
    EXPECT_EQ(bad_q, 0) << "cols " << cols;
    EXPECT_EQ(bad_ds, 0) << "cols " << cols;
  }
  EXPECT_THROW(q8::quantize(nullptr, 1, 48, nullptr, nullptr, stream()), Error);
}

TEST_F(CudaQ8, RmsnormQuantizeIdenticalToRmsnormAndReference) {
  std::mt19937 rng(12);
  for (int64_t cols : {int64_t(2048), int64_t(4096), int64_t(96)}) {
    const int64_t n = 3;
    const auto x = make_acts(n, cols, rng);
    const auto w = test::random_acts(cols, rng);
    const float eps = 1e-6f;
    std::vector<float> y_ref(n * cols);
    Q8Host ref{std::vector<int8_t>(n * cols), std::vector<Q8Ds>(n * cols / 32)};
    q8ref::rmsnorm_quantize(x.data(), w.data(), n, cols, eps, y_ref.data(), ref.q.data(), ref.ds.data());

    auto d_x = upload_vec(x);
    auto d_w = upload_vec(w);
    auto d_y = output(n * cols * sizeof(float), 0xFF);
    auto d_y_ops = output(n * cols * sizeof(float), 0xFF);
    auto d_q = output(n * cols, 0x55);
    auto d_ds = output(n * cols / 32 * sizeof(float2), 0xFF);
    q8::rmsnorm_quantize(d_x.ptr<float>(), d_w.ptr<float>(), n, cols, eps, d_y.ptr<float>(), d_q.ptr<int8_t>(),
                         d_ds.ptr<float2>(), stream());
    cuda::note_launch(dev->compute(), {d_x.span(), d_w.span()}, {d_y.span(), d_q.span(), d_ds.span()});
    cuda::ops::rmsnorm(d_x.ptr<float>(), d_w.ptr<float>(), n, cols, eps, d_y_ops.ptr<float>(), stream());
    cuda::note_launch(dev->compute(), {d_x.span(), d_w.span()}, {d_y_ops.span()});
    const auto y = download<float>(d_y, n * cols);
    const auto y_ops = download<float>(d_y_ops, n * cols);
    const auto q = download<int8_t>(d_q, n * cols);
    const auto ds = download<Q8Ds>(d_ds, n * cols / 32);
    int64_t bad_ops = 0, bad_ref = 0, bad_q = 0, bad_ds = 0;
    for (int64_t i = 0; i < n * cols; ++i) {
      if (!test::same_bits(y[i], y_ops[i]) && bad_ops++ < 3)
        ADD_FAILURE() << "cols " << cols << " y[" << i << "] " << y[i] << " ops::rmsnorm " << y_ops[i];
      bad_ref += !test::same_bits(y[i], y_ref[i]);
      bad_q += q[i] != ref.q[i];
    }
    for (int64_t b = 0; b < n * cols / 32; ++b)
      bad_ds += !test::same_bits(ds[b].d, ref.ds[b].d) || !test::same_bits(ds[b].s, ref.ds[b].s);
    EXPECT_EQ(bad_ops, 0) << "cols " << cols << ": y differs from ops::rmsnorm";
    EXPECT_EQ(bad_ref, 0) << "cols " << cols << ": y differs from the reference";
    EXPECT_EQ(bad_q, 0) << "cols " << cols << ": q differs from the reference";
    EXPECT_EQ(bad_ds, 0) << "cols " << cols << ": ds differs from the reference";

    // In place: y = x.
    auto d_xy = upload_vec(x);
    auto d_q2 = output(n * cols, 0x55);
    auto d_ds2 = output(n * cols / 32 * sizeof(float2), 0xFF);
    q8::rmsnorm_quantize(d_xy.ptr<float>(), d_w.ptr<float>(), n, cols, eps, d_xy.ptr<float>(), d_q2.ptr<int8_t>(),
                         d_ds2.ptr<float2>(), stream());
    cuda::note_launch(dev->compute(), {d_xy.span(), d_w.span()}, {d_xy.span(), d_q2.span(), d_ds2.span()});
    EXPECT_EQ(std::memcmp(download<float>(d_xy, n * cols).data(), y.data(), n * cols * 4), 0) << "in place, cols " << cols;
    EXPECT_EQ(download<int8_t>(d_q2, n * cols), q) << "in place, cols " << cols;
  }
}

// One weight matrix on the GPU and the reference's dots with sum|w*x| per output.
struct MatvecCase {
  GgmlType type;
  int64_t rows, cols;
  std::vector<uint8_t> w;
};

class CudaQ8Matvec : public test::GpuKernelTest {
 protected:
  // Checks matvec for each n, accumulate off and on. w_offset: bytes before the weights (2: 2-byte
  // aligned rows, the K-quants' non-vector loads).
  void check(const MatvecCase& mc, std::initializer_list<int64_t> ns, size_t w_offset = 0) {
    const int64_t rows = mc.rows, cols = mc.cols, rb = int64_t(row_bytes(mc.type, cols));
    ThreadPool& pool = test::test_pool();
    std::vector<float> wf(rows * cols);  // dequantized, for sum|w*x|
    pool.parallel_for(rows, 64, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) dequantize_row(mc.type, mc.w.data() + r * rb, wf.data() + r * cols, cols);
    });
    auto d_w = upload(mc.w.data(), mc.w.size(), w_offset);
    std::mt19937 rng(uint32_t(rows * 31 + cols + int(mc.type)));
    for (int64_t n : ns) {
      const auto x = make_acts(n, cols, rng);
      const Q8Host xq = quantize_host(x, n, cols);
      std::vector<float> ref(n * rows), mag(n * rows);
      pool.parallel_for(rows, 64, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t t = 0; t < n; ++t) {
            ref[t * rows + r] = q8ref::row_dot(mc.type, mc.w.data() + r * rb, cols, xq.q.data() + t * cols,
                                               xq.ds.data() + t * (cols / 32));
            double m = 0;
            for (int64_t c = 0; c < cols; ++c)
              m += std::fabs(double(wf[r * cols + c]) * xq.ds[t * (cols / 32) + c / 32].d * xq.q[t * cols + c]);
            mag[t * rows + r] = float(m);
          }
      });
      auto d_q = upload_vec(xq.q);
      auto d_ds = upload_vec(xq.ds);
      std::vector<float> y0(n * rows);
      for (auto& v : y0) v = float(int(rng() % 2001) - 1000) * 1e-3f;
      for (bool acc : {false, true}) {
        auto d_y = acc ? upload_vec(y0) : output(n * rows * sizeof(float), 0xFF);
        q8::matvec(mc.type, d_w.ptr(), rows, cols, rb, d_q.ptr<int8_t>(), d_ds.ptr<float2>(), n, d_y.ptr<float>(), acc,
                   stream());
        cuda::note_launch(dev->compute(), {d_w.span(), d_q.span(), d_ds.span()}, {d_y.span()});
        const auto y = download<float>(d_y, n * rows);
        double worst = 0;
        int64_t worst_i = -1, bad = 0;
        for (int64_t i = 0; i < n * rows; ++i) {
          const double expect = acc ? double(y0[i]) + ref[i] : double(ref[i]);
          // 1e-5 of sum|w*x|; with the residual add also the rounding of y0 + dot (one ulp of the sum).
          const double tol = 1e-5 * mag[i] + (acc ? 2.4e-7 * std::fabs(expect) : 0.0);
          const double err = std::isfinite(y[i]) ? std::fabs(double(y[i]) - expect) : 1e30;
          bad += err > tol;
          const double rel = err / std::max(tol, 1e-30);
          if (rel > worst) worst = rel, worst_i = i;
        }
        const std::string what = std::string(type_name(mc.type)) + " " + std::to_string(rows) + "x" +
                                 std::to_string(cols) + " n " + std::to_string(n) + (acc ? " accumulate" : "") +
                                 (w_offset ? " weights at +" + std::to_string(w_offset) : "");
        EXPECT_EQ(bad, 0) << what << ": " << bad << " outputs over 1e-5 sum|w*x|; worst: row " << worst_i % rows
                          << " token " << worst_i / rows << " gpu " << y[worst_i] << " ref "
                          << (acc ? y0[worst_i] + ref[worst_i] : ref[worst_i]) << " sum|w*x| " << mag[worst_i]
                          << " (error / tolerance " << worst << ")";
        std::printf("q8 matvec %s: worst error / tolerance %.3g\n", what.c_str(), worst);
      }
    }
  }
};

MatvecCase make_case(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  return {t, rows, cols, test::random_weights(t, rows, cols, rng)};
}

TEST_F(CudaQ8Matvec, AllFormatsRealShapes) {
  for (GgmlType t : kTypes) {
    check(make_case(t, 768, 2048, 1), {1, 3, 8, 11});
    check(make_case(t, 2048, 768, 2), {1, 3, 8, 11});
    check(make_case(t, 4096, 2048, 3), {1, 3, 8, 11});
    check(make_case(t, 5120, 2048, 4), {1, 3, 8, 11});
  }
}

TEST_F(CudaQ8Matvec, OutputMatrix151936) {
  for (GgmlType t : kTypes) check(make_case(t, 151936, 2048, 5), {1});
}

TEST_F(CudaQ8Matvec, OddRowsAndTwoByteAlignedWeights) {
  for (GgmlType t : kTypes) {
    check(make_case(t, 37, 2048, 6), {1, 5}, 2);   // rows not a multiple of a block's rows
    check(make_case(t, 13, 768, 7), {2, 9}, 2);    // two rows per warp, an odd last warp
  }
}

TEST_F(CudaQ8Matvec, BadArgumentsAreErrors) {
  std::mt19937 rng(8);
  const auto mc = make_case(GgmlType::Q4_K, 4, 2048, 8);
  auto d_w = upload(mc.w.data(), mc.w.size(), 0);
  auto d_w1 = upload(mc.w.data(), mc.w.size(), 1);
  auto d_q = output(2048 + 16, 0);
  auto d_ds = output(64 * sizeof(float2), 0);
  auto d_y = output(4 * sizeof(float), 0);
  const int64_t rb = 1152;
  auto call = [&](GgmlType t, const void* w, int64_t cols, int64_t row_b, const int8_t* q) {
    q8::matvec(t, w, 4, cols, row_b, q, d_ds.ptr<float2>(), 1, d_y.ptr<float>(), false, stream());
  };
  EXPECT_THROW(call(GgmlType::Q2_K, d_w.ptr(), 2048, rb, d_q.ptr<int8_t>()), Error);   // no q8 kernel
  EXPECT_THROW(call(GgmlType::Q4_K, d_w.ptr(), 2016, rb, d_q.ptr<int8_t>()), Error);   // cols % 256
  EXPECT_THROW(call(GgmlType::Q4_K, d_w.ptr(), 2048, rb - 2, d_q.ptr<int8_t>()), Error);  // row too short
  EXPECT_THROW(call(GgmlType::Q4_K, d_w1.ptr(), 2048, rb, d_q.ptr<int8_t>()), Error);  // odd weight address
  EXPECT_THROW(call(GgmlType::Q4_K, d_w.ptr(), 2048, rb, d_q.ptr<int8_t>() + 1), Error);  // unaligned activations
}

}  // namespace
