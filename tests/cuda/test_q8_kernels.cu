// GPU int8-activation kernels (cuda/q8_kernels.cuh) vs their CPU references (cuda/host/q8_reference.h):
//  * quantize and rmsnorm_quantize: q bytes and ds identical to the reference (the rounding rule is exact
//    on both sides), y of rmsnorm_quantize bit-identical to ops::rmsnorm on the GPU, in place too;
//  * matvec: the 5 formats, shapes 768x2048, 2048x768, 4096x2048, 5120x2048 (n = 1, 3, 8, 11) and
//    151936x2048 (n = 1), accumulate off and on, plus 2-byte aligned weights: per output
//    |gpu - ref| <= 1e-5 * sum_c |w_c * x_c| (w dequantized, x the dequantized int8 activations; only the
//    float summation order differs); the 2-byte aligned formats through shared memory (staged rows) and,
//    for rows too long to stage (12288 columns), straight from global memory;
//  * moe_gate_up / moe_down: 128 experts, 10 resident in scattered slots, k = 8, n = 1 and 3, a repeated
//    expert (inside a token and across tokens), negative ids, a token without a resident expert; hq within
//    half a step of the reference's unquantized h (plus the g, u summation-order tolerance), pairs of
//    non-resident experts untouched (sentinel bytes); moe_down on the GPU's h vs the reference's moe_down on
//    the same h within 1e-5 of sum |wts * w * h|; x of a token with no resident expert bit-unchanged;
//    deterministic;
//  * norm_matvec: the same bits as rmsnorm_quantize + matvec (xn, xq, xds, y).
// The activations given to matvec come from the CPU quantizer, so each product is tested on its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "cpu/thread_pool.h"
#include "cuda/host/q8_reference.h"
#include "cuda/moe_kernels.cuh"
#include "cuda/ops.cuh"
#include "cuda/q8_kernels.cuh"
#include "cuda/quant_kernels.cuh"
#include "gpu_test_util.h"
#include "quant/dequant.h"
#include "quant/q4_0_x8.h"

namespace {

using namespace strata;
namespace q8 = strata::cuda::q8;
namespace q8ref = strata::cuda::q8ref;
using q8ref::Q8Ds;
static_assert(sizeof(Q8Ds) == sizeof(float2) && alignof(Q8Ds) <= alignof(float2));

const GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
// The low-bit formats (session 33; q8ref::low_bit), tested by their own cases below.
constexpr const auto& kLowBit = test::kLowBitTypes;

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
  for (GgmlType t : kLowBit) EXPECT_TRUE(q8::supported(t)) << type_name(t);
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_K})
    EXPECT_FALSE(q8::supported(t)) << type_name(t);
  // The models take the low-bit kernels only with the switch on (use_type); the others always.
  const bool was = q8::low_bit_enabled();
  q8::set_low_bit(false);
  for (GgmlType t : kLowBit) EXPECT_FALSE(q8::use_type(t)) << type_name(t);
  for (GgmlType t : kTypes) EXPECT_TRUE(q8::use_type(t)) << type_name(t);
  q8::set_low_bit(true);
  for (GgmlType t : kLowBit) EXPECT_TRUE(q8::use_type(t)) << type_name(t);
  q8::set_low_bit(was);
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
  for (int64_t cols : {int64_t(2048), int64_t(4096), int64_t(1024), int64_t(96)}) {
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

// A dense product's shape and the token counts it is run at.
struct DenseShape {
  int64_t rows, cols;
  std::initializer_list<int64_t> ns;
};

class CudaQ8Matvec : public test::GpuKernelTest {
 protected:
  // A regrouped type tx (rows of the file's type t0 regrouped by `repack`) against t0 in every product that
  // reads dense matrices, at each shape: the same bits (defined below, beside its tests).
  template <typename Repack>
  void expect_regrouped_same_bits(GgmlType t0, GgmlType tx, Repack repack, std::initializer_list<DenseShape> shapes);
  // One norm_matvec case on the device: W (t, rows x cols, at byte offset w_offset, from seed), a norm
  // weight nw and one token x (from rng); the host copies of nw and x.
  struct NormCase {
    GgmlType t;
    int64_t rows, cols, rb;
    Buf w, nw, x;
    std::vector<float> nw_host, x_host;
  };
  NormCase norm_case(GgmlType t, int64_t rows, int64_t cols, size_t w_offset, uint32_t seed, std::mt19937& rng);

  // norm_matvec on c (eps 1e-6, one token): returns xn and y (y starts as y0 where acc).
  std::pair<std::vector<float>, std::vector<float>> run_norm_matvec(const NormCase& c, bool acc,
                                                                    const std::vector<float>& y0) {
    auto f_xn = output(c.cols * 4, 0x11), f_q = output(c.cols, 0x22), f_ds = output(c.cols / 32 * 8, 0x33);
    auto f_y = acc ? upload_vec(y0) : output(c.rows * 4, 0x44);
    q8::norm_matvec(c.t, c.w.ptr(), c.rows, c.cols, c.rb, c.x.ptr<float>(), c.nw.ptr<float>(), 1e-6f, 1,
                    f_xn.ptr<float>(), f_q.ptr<int8_t>(), f_ds.ptr<float2>(), f_y.ptr<float>(), acc, stream());
    cuda::note_launch(dev->compute(), {c.w.span(), c.x.span(), c.nw.span(), f_y.span()},
                      {f_xn.span(), f_q.span(), f_ds.span(), f_y.span()});
    return {download<float>(f_xn, size_t(c.cols)), download<float>(f_y, size_t(c.rows))};
  }

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

CudaQ8Matvec::NormCase CudaQ8Matvec::norm_case(GgmlType t, int64_t rows, int64_t cols, size_t w_offset,
                                               uint32_t seed, std::mt19937& rng) {
  const auto mc = make_case(t, rows, cols, seed);
  NormCase c{t, rows, cols, int64_t(row_bytes(t, cols)), upload(mc.w.data(), mc.w.size(), w_offset), {}, {}, {}, {}};
  c.nw_host = test::random_acts(cols, rng);
  c.x_host = make_acts(1, cols, rng);
  c.nw = upload_vec(c.nw_host), c.x = upload_vec(c.x_host);
  return c;
}

TEST_F(CudaQ8Matvec, AllFormatsRealShapes) {
  for (GgmlType t : kTypes) {
    check(make_case(t, 768, 2048, 1), {1, 3, 8, 11});
    check(make_case(t, 2048, 768, 2), {1, 3, 8, 11});
    check(make_case(t, 4096, 2048, 3), {1, 2, 3, 8, 11});  // n <= 2: two rows per warp
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
    check(make_case(t, 40, 12288, 9), {1, 3});     // rows too long for shared memory: the direct loads
    check(make_case(t, 4097, 2048, 10), {1, 2}, 2);  // two rows per warp, the last warp's second row past the end
  }
}

// The staged formats' rows copied by cp.async (q8::set_matvec_async_stage(1)): the same bits as the plain copy,
// at the output product's shape, 2-byte aligned rows, a partial last warp, and several tokens.
TEST_F(CudaQ8Matvec, AsyncStageSameBits) {
  const int was = q8::matvec_async_stage();
  const int mma_was = q8::mma_mode();
  q8::set_mma_mode(0);  // (the dp4a kernels at every n: the tensor-core ones stage their own way)
  struct Shape { int64_t rows, cols; size_t offset; std::vector<int64_t> ns; };
  for (GgmlType t : {GgmlType::Q6_K, GgmlType::Q4_0, GgmlType::Q8_0})
    for (const Shape& sh : {Shape{t == GgmlType::Q6_K ? 151936 : 8192, 2048, 0, {1}}, Shape{4097, 2048, 2, {1, 2}},
                            Shape{768, 2048, 2, {3, 8}}, Shape{37, 768, 0, {1, 5}}}) {
      // (the output product's 151936 rows for Q6_K only, the output type of llama.cpp's Q4_0 / Q4_K_M files:
      // making random rows of that size costs ~8 s a format on the host)
      const MatvecCase mc = make_case(t, sh.rows, sh.cols, 11);
      const int64_t rb = int64_t(row_bytes(t, sh.cols));
      auto d_w = upload(mc.w.data(), mc.w.size(), sh.offset);
      std::mt19937 rng(5);
      for (int64_t n : sh.ns) {
        const Q8Host xq = quantize_host(make_acts(n, sh.cols, rng), n, sh.cols);
        auto d_q = upload_vec(xq.q);
        auto d_ds = upload_vec(xq.ds);
        auto run = [&](int async) {
          q8::set_matvec_async_stage(async);
          auto d_y = output(n * sh.rows * sizeof(float), 0xFF);
          q8::matvec(t, d_w.ptr(), sh.rows, sh.cols, rb, d_q.ptr<int8_t>(), d_ds.ptr<float2>(), n, d_y.ptr<float>(),
                     false, stream());
          cuda::note_launch(dev->compute(), {d_w.span(), d_q.span(), d_ds.span()}, {d_y.span()});
          return download<float>(d_y, n * sh.rows);
        };
        const auto plain = run(0), async = run(1);
        EXPECT_EQ(std::memcmp(plain.data(), async.data(), plain.size() * 4), 0)
            << type_name(t) << " " << sh.rows << "x" << sh.cols << " +" << sh.offset << " n " << n;
      }
    }
  q8::set_matvec_async_stage(was);
  q8::set_mma_mode(mma_was);
}

// The tensor-core paths on their own (q8::mma_mode; the tests above run the default, mode 3: the persistent
// kernel for 4..7 tokens, the tile kernel from 8): mode 1 (the tile kernel from 8; its partial tiles at 11),
// mode 2 (the persistent kernel at every n from 2) and mode 3 at 3 (dp4a), 4, 7 and 8, at the real shapes,
// odd row counts, 2-byte aligned rows and rows longer than a stage (12288 columns: several chunks a tile).
TEST_F(CudaQ8Matvec, TensorCoreModes) {
  const int was = q8::mma_mode();
  for (const int mode : {1, 2, 3}) {
    q8::set_mma_mode(mode);
    SCOPED_TRACE("mma mode " + std::to_string(mode));
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_0_X8, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K,
                       GgmlType::Q6_K, GgmlType::Q6_K_X8}) {
      check(make_case(t, 4096, 2048, 21), mode == 1   ? std::initializer_list<int64_t>{8, 11, 16}
                                          : mode == 2 ? std::initializer_list<int64_t>{2, 3, 5, 8, 9, 16}
                                                      : std::initializer_list<int64_t>{3, 4, 7, 8});
      check(make_case(t, 2048, 4096, 22), {2, 8});
      check(make_case(t, 37, 2048, 23), {3, 8}, 2);
      check(make_case(t, 13, 12288, 24), {2, 8});
      if (t == GgmlType::Q6_K || t == GgmlType::Q6_K_X8 || t == GgmlType::Q4_0)
        check(make_case(t, 151936, 2048, 25), {8});  // outputs
    }
  }
  q8::set_mma_mode(was);
}

// Dense matrices regrouped (model_common.h product_type: Q4_0 as Q4_0_X8, STRATA_CUDA_Q4_0_X8_DENSE; Q6_K as
// Q6_K_X8, STRATA_CUDA_Q6_K_X8_DENSE) give the bits of the file's type in the products that read them:
// q8::matvec (n = 1 and 3: dp4a; 5: the persistent tensor-core kernel; 8: the tile kernel; accumulate off
// and on), q8::norm_matvec (one token; the q|k|v product) and the f32 decode kernels of CPU-pool passes
// (quant::matmul; wo_router and the prefill GEMM: the model tests Q4_0X8Gpu / Q6_KX8Gpu), at the 30B-A3B
// geometry's dense shapes (q|k|v 5120 x 2048, wo 2048 x 4096, the output 151936 x 2048) and odd row counts.
template <typename Repack>
void CudaQ8Matvec::expect_regrouped_same_bits(GgmlType t0, GgmlType tx, Repack repack,
                                              std::initializer_list<DenseShape> shapes) {
  std::mt19937 rng(77);
  for (const DenseShape& sh : shapes) {
    const int64_t rows = sh.rows, cols = sh.cols, rb = int64_t(row_bytes(t0, cols));
    const auto mc = make_case(t0, rows, cols, uint32_t(rows + cols));
    std::vector<uint8_t> x8(mc.w.size());
    for (int64_t r = 0; r < rows; ++r) repack(mc.w.data() + r * rb, x8.data() + r * rb, cols);
    auto d_w0 = upload(mc.w.data(), mc.w.size()), d_w8 = upload(x8.data(), x8.size());
    const std::string shape = std::string(type_name(tx)) + " " + std::to_string(rows) + "x" + std::to_string(cols);
    auto differ = [&](const Buf& a, const Buf& b, int64_t count) {
      const auto ya = download<float>(a, size_t(count)), yb = download<float>(b, size_t(count));
      int64_t bad = 0;
      for (int64_t i = 0; i < count; ++i) bad += !test::same_bits(ya[size_t(i)], yb[size_t(i)]);
      return bad;
    };
    for (int64_t n : sh.ns) {
      const auto x = make_acts(n, cols, rng);
      const Q8Host xq = quantize_host(x, n, cols);
      auto d_q = upload_vec(xq.q), d_ds = upload_vec(xq.ds), d_x = upload_vec(x);
      std::vector<float> y0(size_t(n * rows));
      for (auto& v : y0) v = float(int(rng() % 2001) - 1000) * 1e-3f;
      for (bool acc : {false, true}) {
        const std::string what = shape + " n " + std::to_string(n) + (acc ? " accumulate" : "");
        auto y_0 = acc ? upload_vec(y0) : output(size_t(n * rows) * 4), y_8 = acc ? upload_vec(y0) : output(size_t(n * rows) * 4);
        q8::matvec(t0, d_w0.ptr(), rows, cols, rb, d_q.ptr<int8_t>(), d_ds.ptr<float2>(), n, y_0.ptr<float>(), acc,
                   stream());
        q8::matvec(tx, d_w8.ptr(), rows, cols, rb, d_q.ptr<int8_t>(), d_ds.ptr<float2>(), n, y_8.ptr<float>(), acc,
                   stream());
        cuda::note_launch(dev->compute(), {d_w0.span(), d_w8.span(), d_q.span(), d_ds.span()}, {y_0.span(), y_8.span()});
        EXPECT_EQ(differ(y_0, y_8, n * rows), 0) << "q8 matvec " << what;
        auto f_0 = acc ? upload_vec(y0) : output(size_t(n * rows) * 4), f_8 = acc ? upload_vec(y0) : output(size_t(n * rows) * 4);
        cuda::quant::matmul(t0, d_w0.ptr(), rows, cols, d_x.ptr<float>(), n, f_0.ptr<float>(), stream(), nullptr, acc);
        cuda::quant::matmul(tx, d_w8.ptr(), rows, cols, d_x.ptr<float>(), n, f_8.ptr<float>(), stream(), nullptr, acc);
        cuda::note_launch(dev->compute(), {d_w0.span(), d_w8.span(), d_x.span()}, {f_0.span(), f_8.span()});
        EXPECT_EQ(differ(f_0, f_8, n * rows), 0) << "f32 matmul " << what;
      }
      if (n == 1 && q8::norm_matvec_supported(cols, 1)) {
        const auto nw = test::random_acts(cols, rng);
        auto d_nw = upload_vec(nw);
        auto run = [&](GgmlType t, const Buf& w, Buf& xn, Buf& q, Buf& ds, Buf& y) {
          q8::norm_matvec(t, w.ptr(), rows, cols, rb, d_x.ptr<float>(), d_nw.ptr<float>(), 1e-6f, 1, xn.ptr<float>(),
                          q.ptr<int8_t>(), ds.ptr<float2>(), y.ptr<float>(), false, stream());
          cuda::note_launch(dev->compute(), {w.span(), d_x.span(), d_nw.span()}, {xn.span(), q.span(), ds.span(), y.span()});
        };
        auto xn0 = output(size_t(cols) * 4), q0 = output(size_t(cols)), ds0 = output(size_t(cols / 32) * 8),
             yn0 = output(size_t(rows) * 4);
        auto xn8 = output(size_t(cols) * 4), q8b = output(size_t(cols)), ds8 = output(size_t(cols / 32) * 8),
             yn8 = output(size_t(rows) * 4);
        run(t0, d_w0, xn0, q0, ds0, yn0);
        run(tx, d_w8, xn8, q8b, ds8, yn8);
        EXPECT_EQ(differ(yn0, yn8, rows), 0) << "norm_matvec " << shape;
      }
    }
  }
}

TEST_F(CudaQ8Matvec, DenseQ40X8SameBitsAsQ4_0) {
  expect_regrouped_same_bits(GgmlType::Q4_0, GgmlType::Q4_0_X8, repack_q4_0_x8,
                             {{5120, 2048, {1, 3, 8}}, {2048, 4096, {1, 3}}, {151936, 2048, {1}}, {37, 256, {1, 5}}});
}

TEST_F(CudaQ8Matvec, DenseQ6KX8SameBitsAsQ6_K) {
  expect_regrouped_same_bits(GgmlType::Q6_K, GgmlType::Q6_K_X8, repack_q6_k_x8,
                             {{5120, 2048, {1, 3, 5, 8}}, {2048, 4096, {1, 3, 5}}, {151936, 2048, {1, 4, 8}},
                              {37, 2048, {1, 5}}, {13, 12288, {1, 8}}});
}

// The low-bit formats at the decode shapes, with weights at +0 and at the smallest offset each allows
// (q8ref::min_row_align: +2, staged; Q2_K +4; IQ4_XS / IQ1_M +8, not 16-byte aligned), odd row counts, and rows
// too long to stage.
TEST_F(CudaQ8Matvec, LowBitFormats) {
  for (GgmlType t : kLowBit) {
    const size_t off = size_t(q8ref::min_row_align(t));
    check(make_case(t, 768, 2048, 11), {1, 3, 8, 11});
    check(make_case(t, 2048, 768, 12), {1, 3}, off);
    check(make_case(t, 5120, 2048, 13), {1, 2, 8}, off);
    check(make_case(t, 37, 2048, 14), {1, 5}, off);
    check(make_case(t, 40, 12288, 15), {1, 3});
    check(make_case(t, 4097, 2048, 16), {1, 2}, off);
  }
  check(make_case(GgmlType::Q3_K, 151936, 2048, 17), {1});
  // The fixtures' tiny models: 256 columns (one 256-value block a row).
  for (GgmlType t : kLowBit) check(make_case(t, 256, 256, 18), {1, 3});
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
  EXPECT_THROW(call(GgmlType::Q5_0, d_w.ptr(), 2048, rb, d_q.ptr<int8_t>()), Error);   // no q8 kernel
  EXPECT_THROW(call(GgmlType::Q2_K, d_w.ptr(), 2048, 674, d_q.ptr<int8_t>()), Error);  // Q2_K rows 4-byte aligned
  EXPECT_THROW(call(GgmlType::Q4_K, d_w.ptr(), 2016, rb, d_q.ptr<int8_t>()), Error);   // cols % 256
  EXPECT_THROW(call(GgmlType::Q4_K, d_w.ptr(), 2048, rb - 2, d_q.ptr<int8_t>()), Error);  // row too short
  EXPECT_THROW(call(GgmlType::Q4_K, d_w1.ptr(), 2048, rb, d_q.ptr<int8_t>()), Error);  // odd weight address
  EXPECT_THROW(call(GgmlType::Q4_K, d_w.ptr(), 2048, rb, d_q.ptr<int8_t>() + 1), Error);  // unaligned activations
}


// norm_matvec against rmsnorm_quantize + matvec on the GPU: xn, xq, xds and y the same bits (the same
// norm, quantization and dot order in one launch), accumulate off and on, every format, 16-byte and
// 2-byte aligned weights (the staged path), the decode shapes (cols 256, 1024, 2048, 4096; one token),
// rows not a multiple of a block's. With the early norm off (it is on by default; its own test follows).
TEST_F(CudaQ8Matvec, NormMatvecSameBitsAsRmsnormQuantizeThenMatvec) {
  struct EarlyOff {  // restores the switch however the test ends
    const bool was = q8::norm_matvec_early();
    EarlyOff() { q8::set_norm_matvec_early(false); }
    ~EarlyOff() { q8::set_norm_matvec_early(was); }
  } early_off;
  struct Shape { int64_t rows, cols; size_t w_offset; };
  const Shape shapes[] = {{5120, 2048, 0}, {4097, 2048, 2}, {768, 4096, 0}, {37, 1024, 2}, {300, 256, 0}};
  std::mt19937 rng(31);
  int64_t cases = 0;
  for (GgmlType t : kTypes)
    for (const Shape& sh : shapes) {
      if (sh.cols % int64_t(type_traits(t).block_size) != 0) continue;
      const auto mc = make_case(t, sh.rows, sh.cols, uint32_t(sh.rows + sh.cols + int(t)));
      const int64_t rows = sh.rows, cols = sh.cols, rb = int64_t(row_bytes(t, cols));
      auto d_w = upload(mc.w.data(), mc.w.size(), sh.w_offset);
      const auto nw = test::random_acts(cols, rng);
      auto d_nw = upload_vec(nw);
      {
        const int64_t n = 1;  // (decode of one sequence: what the kernel takes)
        ASSERT_TRUE(q8::norm_matvec_supported(cols, n));
        const auto x = make_acts(n, cols, rng);
        auto d_x = upload_vec(x);
        std::vector<float> y0(n * rows);
        for (auto& v : y0) v = float(int(rng() % 2001) - 1000) * 1e-3f;
        for (bool acc : {false, true}) {
          // Two launches: the reference path.
          auto r_xn = output(n * cols * 4), r_q = output(n * cols), r_ds = output(n * cols / 32 * 8);
          auto r_y = acc ? upload_vec(y0) : output(n * rows * 4);
          q8::rmsnorm_quantize(d_x.ptr<float>(), d_nw.ptr<float>(), n, cols, 1e-6f, r_xn.ptr<float>(),
                               r_q.ptr<int8_t>(), r_ds.ptr<float2>(), stream());
          cuda::note_launch(dev->compute(), {d_x.span(), d_nw.span()}, {r_xn.span(), r_q.span(), r_ds.span()});
          q8::matvec(t, d_w.ptr(), rows, cols, rb, r_q.ptr<int8_t>(), r_ds.ptr<float2>(), n, r_y.ptr<float>(), acc,
                     stream());
          cuda::note_launch(dev->compute(), {d_w.span(), r_q.span(), r_ds.span(), r_y.span()}, {r_y.span()});
          // One launch.
          auto f_xn = output(n * cols * 4, 0x11), f_q = output(n * cols, 0x22), f_ds = output(n * cols / 32 * 8, 0x33);
          auto f_y = acc ? upload_vec(y0) : output(n * rows * 4, 0x44);
          q8::norm_matvec(t, d_w.ptr(), rows, cols, rb, d_x.ptr<float>(), d_nw.ptr<float>(), 1e-6f, n,
                          f_xn.ptr<float>(), f_q.ptr<int8_t>(), f_ds.ptr<float2>(), f_y.ptr<float>(), acc, stream());
          cuda::note_launch(dev->compute(), {d_w.span(), d_x.span(), d_nw.span(), f_y.span()},
                            {f_xn.span(), f_q.span(), f_ds.span(), f_y.span()});
          const std::string what = std::string(type_name(t)) + " " + std::to_string(rows) + "x" +
                                   std::to_string(cols) + " n " + std::to_string(n) + (acc ? " accumulate" : "") +
                                   (sh.w_offset ? " weights at +2" : "");
          EXPECT_EQ(download<float>(f_xn, n * cols), download<float>(r_xn, n * cols)) << what << ": xn";
          EXPECT_EQ(download<int8_t>(f_q, n * cols), download<int8_t>(r_q, n * cols)) << what << ": xq";
          const auto fd = download<Q8Ds>(f_ds, n * cols / 32), rd = download<Q8Ds>(r_ds, n * cols / 32);
          EXPECT_EQ(std::memcmp(fd.data(), rd.data(), fd.size() * sizeof(Q8Ds)), 0) << what << ": xds";
          const auto fy = download<float>(f_y, n * rows), ry = download<float>(r_y, n * rows);
          int64_t bad = 0;
          for (int64_t i = 0; i < n * rows; ++i) bad += !test::same_bits(fy[i], ry[i]);
          EXPECT_EQ(bad, 0) << what << ": y differs from rmsnorm_quantize + matvec in " << bad << " outputs";
          ++cases;
        }
      }
    }
  EXPECT_EQ(cases, 50);  // 5 formats x 5 shapes x accumulate off / on
}

// norm_matvec's early norm (set_norm_matvec_early) against its definition on the GPU: xn the bits of
// rmsnorm_quantize's, y the bits of matvec on the Q8 activations of x * nw (quantized by q8::quantize),
// each dot times the norm's scale (q8ref::rmsnorm_scale: the kernel's order), then the accumulate's add;
// the same formats, shapes and alignments as above; with the codes quantized in runs (set_norm_matvec_lanes)
// and one value a lane.
TEST_F(CudaQ8Matvec, NormMatvecEarlyIsTheScaledProductOfUnscaledCodes) {
  struct Shape { int64_t rows, cols; size_t w_offset; };
  const Shape shapes[] = {{5120, 2048, 0}, {4097, 2048, 2}, {768, 4096, 0}, {37, 1024, 2}, {300, 256, 0}};
  const bool was = q8::norm_matvec_early(), lanes_was = q8::norm_matvec_lanes();
  q8::set_norm_matvec_early(true);
  std::mt19937 rng(37);
  int64_t cases = 0;
  for (bool lanes : {true, false})
  for (GgmlType t : kTypes)
    for (const Shape& sh : shapes) {
      if (sh.cols % int64_t(type_traits(t).block_size) != 0) continue;
      q8::set_norm_matvec_lanes(lanes);
      const NormCase c = norm_case(t, sh.rows, sh.cols, sh.w_offset, uint32_t(sh.rows + sh.cols + int(t)), rng);
      const int64_t rows = c.rows, cols = c.cols, rb = c.rb;
      const auto &nw = c.nw_host, &x = c.x_host;
      const Buf &d_w = c.w, &d_nw = c.nw, &d_x = c.x;
      std::vector<float> v(static_cast<size_t>(cols));
      for (int64_t c = 0; c < cols; ++c) v[size_t(c)] = x[size_t(c)] * nw[size_t(c)];
      const float scale = q8ref::rmsnorm_scale(x.data(), cols, 1e-6f);
      // The definition's pieces: codes of x * nw and the plain product on them.
      auto d_v = upload_vec(v), r_q = output(cols), r_ds = output(cols / 32 * 8), r_y = output(rows * 4);
      q8::quantize(d_v.ptr<float>(), 1, cols, r_q.ptr<int8_t>(), r_ds.ptr<float2>(), stream());
      cuda::note_launch(dev->compute(), {d_v.span()}, {r_q.span(), r_ds.span()});
      q8::matvec(t, d_w.ptr(), rows, cols, rb, r_q.ptr<int8_t>(), r_ds.ptr<float2>(), 1, r_y.ptr<float>(), false,
                 stream());
      cuda::note_launch(dev->compute(), {d_w.span(), r_q.span(), r_ds.span()}, {r_y.span()});
      const auto dots = download<float>(r_y, rows);
      auto r_xn = output(cols * 4), r_xq = output(cols), r_xds = output(cols / 32 * 8);
      q8::rmsnorm_quantize(d_x.ptr<float>(), d_nw.ptr<float>(), 1, cols, 1e-6f, r_xn.ptr<float>(),
                           r_xq.ptr<int8_t>(), r_xds.ptr<float2>(), stream());
      cuda::note_launch(dev->compute(), {d_x.span(), d_nw.span()}, {r_xn.span(), r_xq.span(), r_xds.span()});
      std::vector<float> y0(static_cast<size_t>(rows));
      for (auto& e : y0) e = float(int(rng() % 2001) - 1000) * 1e-3f;
      for (bool acc : {false, true}) {
        const auto [fxn, fy] = run_norm_matvec(c, acc, y0);
        const std::string what = std::string(type_name(t)) + " " + std::to_string(rows) + "x" +
                                 std::to_string(cols) + (acc ? " accumulate" : "") +
                                 (sh.w_offset ? " weights at +2" : "") + (lanes ? " runs" : " one a lane");
        EXPECT_EQ(fxn, download<float>(r_xn, cols)) << what << ": xn";
        int64_t bad = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const float p = dots[size_t(r)] * scale;
          bad += !test::same_bits(fy[size_t(r)], acc ? y0[size_t(r)] + p : p);
        }
        EXPECT_EQ(bad, 0) << what << ": y differs from scale * (matvec on the codes of x * nw) in " << bad
                          << " outputs";
        ++cases;
      }
    }
  q8::set_norm_matvec_early(was);
  q8::set_norm_matvec_lanes(lanes_was);
  EXPECT_EQ(cases, 100);
}

// norm_matvec's launch shapes (set_norm_matvec_rows, set_norm_matvec_per_sm) give the bits of the simplest
// one (a row a lane group, uncapped): the default (0 rows: 3 for 4096 rows or more; 2 an SM), rows a lane
// group 2 to 5 (3 to 5 run only with the early norm in runs, the default), blocks per SM capped or not;
// the formats, shapes and alignments as above (5120 x 2048 is the 30B-A3B geometry's q|k|v: 320 blocks
// at 2 rows, 214 at 3, 128 at 5, so caps 1, 2 and 3 each apply).
TEST_F(CudaQ8Matvec, NormMatvecLaunchShapesGiveTheSameBits) {
  struct Shape { int64_t rows, cols; size_t w_offset; };
  const Shape shapes[] = {{5120, 2048, 0}, {4097, 2048, 2}, {768, 4096, 0}, {37, 2048, 2}, {300, 1024, 0}};
  struct Launch { int rows, per_sm; };
  const Launch launches[] = {{0, 2}, {0, 0}, {2, 0}, {2, 3}, {3, 2}, {4, 2}, {5, 1}, {5, 0}};  // {0, 2}: the default
  const int rows_was = q8::norm_matvec_rows(), cap_was = q8::norm_matvec_per_sm();
  std::mt19937 rng(41);
  int64_t cases = 0;
  for (GgmlType t : kTypes)
    for (const Shape& sh : shapes) {
      if (sh.cols % int64_t(type_traits(t).block_size) != 0) continue;
      const NormCase c = norm_case(t, sh.rows, sh.cols, sh.w_offset, uint32_t(sh.rows * 3 + sh.cols + int(t)), rng);
      const int64_t rows = c.rows, cols = c.cols;
      std::vector<float> y0(static_cast<size_t>(rows));
      for (auto& e : y0) e = float(int(rng() % 2001) - 1000) * 1e-3f;
      for (bool acc : {false, true}) {
        auto run = [&](const Launch& l) {
          q8::set_norm_matvec_rows(l.rows);
          q8::set_norm_matvec_per_sm(l.per_sm);
          return run_norm_matvec(c, acc, y0);
        };
        const auto want = run({1, 0});  // one row a lane group, uncapped
        for (const Launch& l : launches) {
          const auto got = run(l);
          const std::string what = std::string(type_name(t)) + " " + std::to_string(rows) + "x" +
                                   std::to_string(cols) + (acc ? " accumulate" : "") +
                                   (sh.w_offset ? " weights at +2" : "") + ", " + std::to_string(l.rows) +
                                   " rows a group, " + std::to_string(l.per_sm) + " blocks an SM";
          EXPECT_EQ(got.first, want.first) << what << ": xn";
          int64_t bad = 0;
          for (int64_t r = 0; r < rows; ++r) bad += !test::same_bits(got.second[size_t(r)], want.second[size_t(r)]);
          EXPECT_EQ(bad, 0) << what << ": y differs from the default launch's in " << bad << " outputs";
          ++cases;
        }
      }
    }
  q8::set_norm_matvec_rows(rows_was);
  q8::set_norm_matvec_per_sm(cap_was);
  EXPECT_THROW(q8::set_norm_matvec_rows(6), Error);
  EXPECT_THROW(q8::set_norm_matvec_per_sm(9), Error);
  EXPECT_EQ(cases, 5 * 5 * 2 * 8);
}

TEST_F(CudaQ8Matvec, NormMatvecUnsupportedShapesAreErrors) {
  EXPECT_FALSE(q8::norm_matvec_supported(2048, 2));  // two rows: two launches
  EXPECT_FALSE(q8::norm_matvec_supported(2048, 0));
  EXPECT_FALSE(q8::norm_matvec_supported(8192, 1));  // more than 16 values a thread
  EXPECT_FALSE(q8::norm_matvec_supported(768, 1));   // not a width with a kernel
  auto d_w = output(4 * 1152), d_x = output(3 * 2048 * 4), d_nw = output(2048 * 4), d_xn = output(3 * 2048 * 4),
       d_q = output(3 * 2048), d_ds = output(3 * 64 * 8), d_y = output(3 * 4 * 4);
  EXPECT_THROW(q8::norm_matvec(GgmlType::Q4_K, d_w.ptr(), 4, 2048, 1152, d_x.ptr<float>(), d_nw.ptr<float>(), 1e-6f,
                               2, d_xn.ptr<float>(), d_q.ptr<int8_t>(), d_ds.ptr<float2>(), d_y.ptr<float>(), false,
                               stream()),
               Error);
  EXPECT_THROW(q8::norm_matvec(GgmlType::Q2_K, d_w.ptr(), 4, 2048, 672, d_x.ptr<float>(), d_nw.ptr<float>(), 1e-6f,
                               1, d_xn.ptr<float>(), d_q.ptr<int8_t>(), d_ds.ptr<float2>(), d_y.ptr<float>(), false,
                               stream()),
               Error);
}


// ---- MoE ----

struct Q8MoeCase {
  GgmlType gate, up, down;
  int64_t extra_offset;  // added to the tensors' offsets and the slot size (2: 2-byte aligned rows)
};

class CudaQ8Moe : public test::GpuKernelTest {
 protected:
  int64_t n_embd = 2048, n_ff = 768;  // the 30B-A3B geometry; the fixtures' tiny models: 256, 256
  static constexpr int n_expert = 128, n_slots = 12, k = 8;

  void run(const Q8MoeCase& mc) {
    std::mt19937 rng(77 + int(mc.down) + int(mc.extra_offset));
    // Layer: experts resident[i] in slot slot_of[i]; slots 4 and 8 hold random bytes; the rest of the
    // 128 experts are not resident (-1).
    cuda::moe::ExpertLayerView v;
    const int64_t grb = int64_t(row_bytes(mc.gate, n_embd)), urb = int64_t(row_bytes(mc.up, n_embd)),
                  drb = int64_t(row_bytes(mc.down, n_ff));
    v.gate_type = mc.gate, v.up_type = mc.up, v.down_type = mc.down;
    v.gate_off = mc.extra_offset, v.up_off = v.gate_off + grb * n_ff + mc.extra_offset;
    v.down_off = v.up_off + urb * n_ff;
    v.slot_bytes = v.down_off + drb * n_embd + mc.extra_offset;
    v.n_embd = n_embd, v.n_ff = n_ff;
    std::vector<int32_t> table(n_expert, -1);
    std::vector<uint8_t> slots(v.slot_bytes * n_slots);
    for (auto& b : slots) b = uint8_t(rng());
    const int resident[] = {0, 3, 17, 31, 42, 64, 77, 100, 126, 127};
    const int slot_ix[] = {7, 0, 11, 3, 9, 1, 5, 10, 2, 6};
    for (int i = 0; i < 10; ++i) {
      table[resident[i]] = slot_ix[i];
      uint8_t* base = slots.data() + slot_ix[i] * v.slot_bytes;
      const auto g = test::random_weights(mc.gate, n_ff, n_embd, rng);
      const auto u = test::random_weights(mc.up, n_ff, n_embd, rng);
      const auto d = test::random_weights(mc.down, n_embd, n_ff, rng);
      std::copy(g.begin(), g.end(), base + v.gate_off);
      std::copy(u.begin(), u.end(), base + v.up_off);
      std::copy(d.begin(), d.end(), base + v.down_off);
    }
    q8ref::ExpertView hv;
    hv.slots = slots.data(), hv.slot_bytes = v.slot_bytes, hv.gate_type = v.gate_type, hv.up_type = v.up_type;
    hv.down_type = v.down_type, hv.gate_off = v.gate_off, hv.up_off = v.up_off, hv.down_off = v.down_off;
    hv.n_embd = n_embd, hv.n_ff = n_ff;
    ASSERT_TRUE(q8ref::moe_supported(hv));
    auto d_slots = upload_vec(slots);
    auto d_table = upload_vec(table);
    v.slots = d_slots.ptr<uint8_t>();
    ASSERT_TRUE(q8::moe_supported(v));

    for (int64_t n : {int64_t(1), int64_t(3)}) {
      // Token 0: resident 17 twice (j 0 and 5), non-resident 5 and 90, a negative id, residents 42, 127, 0.
      // Token 1: only non-resident experts (x must stay as it was). Token 2: resident 17 again (across
      // tokens), 3, 64, 77, 100, 126, 31 and non-resident 1.
      const int32_t routing[3][k] = {{17, 5, 42, -1, 127, 17, 90, 0},
                                     {1, 2, 4, 5, 6, 7, 8, 9},
                                     {17, 3, 64, 1, 77, 100, 126, 31}};
      std::vector<int32_t> ids(n * k);
      std::vector<float> wts(n * k);
      for (int64_t t = 0; t < n; ++t)
        for (int j = 0; j < k; ++j) ids[t * k + j] = routing[t][j], wts[t * k + j] = 0.05f + 0.2f * float(rng() % 100) / 100.f;
      const auto x = make_acts(n, n_embd, rng);
      const Q8Host xq = quantize_host(x, n, n_embd);
      const std::string what = std::string(type_name(mc.gate)) + "/" + std::string(type_name(mc.up)) + "/" +
                               std::string(type_name(mc.down)) + " offset+" + std::to_string(mc.extra_offset) +
                               " n " + std::to_string(n);
      auto resident_pair = [&](int64_t p) { return ids[p] >= 0 && table[ids[p]] >= 0; };

      // gate_up on the GPU; hq / hds filled with sentinels.
      auto d_ids = upload_vec(ids);
      auto d_wts = upload_vec(wts);
      auto d_xq = upload_vec(xq.q);
      auto d_xds = upload_vec(xq.ds);
      auto d_hq = output(n * k * n_ff, 0x5A);
      auto d_hds = output(n * k * (n_ff / 32) * sizeof(float2), 0x5A);
      q8::moe_gate_up(v, d_table.ptr<int32_t>(), d_xq.ptr<int8_t>(), d_xds.ptr<float2>(), d_ids.ptr<int32_t>(), n, k,
                      d_hq.ptr<int8_t>(), d_hds.ptr<float2>(), stream());
      cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_xq.span(), d_xds.span(), d_ids.span()},
                        {d_hq.span(), d_hds.span()});
      const auto hq = download<int8_t>(d_hq, n * k * n_ff);
      const auto hds = download<Q8Ds>(d_hds, n * k * (n_ff / 32));

      // Reference pieces: g, u per row (q8ref::row_dot), h = silu(g) * u unquantized, and the reference's
      // own quantized h.
      std::vector<int8_t> hq_ref(n * k * n_ff, 0);
      std::vector<Q8Ds> hds_ref(n * k * (n_ff / 32));
      q8ref::moe_gate_up(hv, table.data(), xq.q.data(), xq.ds.data(), ids.data(), n, k, hq_ref.data(), hds_ref.data());
      int64_t untouched_bad = 0, out_of_bound = 0, q_diff = 0, q_diff_big = 0, ds_bad = 0;
      double worst_h = 0;
      std::vector<float> wg(n_embd), wu(n_embd);
      for (int64_t p = 0; p < n * k; ++p) {
        const int8_t* qp = hq.data() + p * n_ff;
        const Q8Ds* dp = hds.data() + p * (n_ff / 32);
        if (!resident_pair(p)) {
          for (int64_t r = 0; r < n_ff; ++r) untouched_bad += uint8_t(qp[r]) != 0x5A;
          for (int64_t b = 0; b < n_ff / 32; ++b) {
            uint8_t raw[8];
            std::memcpy(raw, &dp[b], 8);
            for (uint8_t c : raw) untouched_bad += c != 0x5A;
          }
          continue;
        }
        const int64_t t = p / k;
        const uint8_t* base = slots.data() + table[ids[p]] * v.slot_bytes;
        for (int64_t b = 0; b < n_ff / 32; ++b) {
          int sum = 0;
          for (int i = 0; i < 32; ++i) sum += qp[32 * b + i];
          ds_bad += !(dp[b].s == dp[b].d * float(sum));
        }
        for (int64_t r = 0; r < n_ff; ++r) {
          const uint8_t* gr = base + v.gate_off + r * grb;
          const uint8_t* ur = base + v.up_off + r * urb;
          const float g = q8ref::row_dot(mc.gate, gr, n_embd, xq.q.data() + t * n_embd, xq.ds.data() + t * (n_embd / 32));
          const float u = q8ref::row_dot(mc.up, ur, n_embd, xq.q.data() + t * n_embd, xq.ds.data() + t * (n_embd / 32));
          dequantize_row(mc.gate, gr, wg.data(), n_embd);
          dequantize_row(mc.up, ur, wu.data(), n_embd);
          double mg = 0, mu = 0;
          for (int64_t c = 0; c < n_embd; ++c) {
            const double xc = std::fabs(double(xq.ds[t * (n_embd / 32) + c / 32].d) * xq.q[t * n_embd + c]);
            mg += std::fabs(wg[c]) * xc, mu += std::fabs(wu[c]) * xc;
          }
          const double h = q8ref::silu_mul(g, u);
          const double sg = g / (1.0 + std::exp(-double(g)));
          // g and u may differ from the reference by 1e-5 of their sum|w*x| (summation order); silu' <= 1.1;
          // expf on the GPU is within 2 ulp; the GPU's quantization step is d (rounding: d/2).
          const double tol_h = 1.1 * std::fabs(u) * 1e-5 * mg + std::fabs(sg) * 1e-5 * mu + 4.8e-7 * std::fabs(h);
          const double d = dp[r / 32].d;
          const double err = std::fabs(d * qp[r] - h);
          const double bound = 0.5 * d * (1 + 1e-5) + tol_h;
          out_of_bound += err > bound;
          worst_h = std::max(worst_h, err / bound);
          const int dq_ = std::abs(int(qp[r]) - int(hq_ref[p * n_ff + r]));
          q_diff += dq_ != 0, q_diff_big += dq_ > 1;
        }
      }
      const int64_t resident_values = [&] {
        int64_t c = 0;
        for (int64_t p = 0; p < n * k; ++p) c += resident_pair(p) ? n_ff : 0;
        return c;
      }();
      EXPECT_EQ(untouched_bad, 0) << what << ": hq/hds of non-resident pairs were written";
      EXPECT_EQ(ds_bad, 0) << what << ": hds.s != d * sum(q)";
      EXPECT_EQ(out_of_bound, 0) << what << ": dequantized h off the unquantized reference h by more than half a "
                                 << "step (+ tolerance); worst error / bound " << worst_h;
      EXPECT_EQ(q_diff_big, 0) << what << ": codes differing from the reference's by more than 1";
      EXPECT_LE(q_diff, resident_values / 100) << what << ": codes differing from the reference's (rounding ties "
                                               << "moved by the summation order) in more than 1%";
      std::printf("q8 moe gate_up %s: worst |h - ref| / bound %.3g, %lld of %lld codes differ by 1 from the reference\n",
                  what.c_str(), worst_h, (long long)q_diff, (long long)resident_values);

      // down on the GPU (x += ...) vs the reference's moe_down on the GPU's own h.
      std::vector<float> x0(n * n_embd);
      for (auto& e : x0) e = float(int(rng() % 2001) - 1000) * 1e-3f;
      std::vector<float> x_ref = x0;
      q8ref::moe_down(hv, table.data(), hq.data(), hds.data(), ids.data(), wts.data(), n, k, x_ref.data());
      // moe_down into d_x (after_gate_up: as the models call it right after moe_gate_up), x read back; and on
      // a fresh copy of x0.
      auto down_into = [&](const Buf& d_x, bool after_gate_up) {
        q8::moe_down(v, d_table.ptr<int32_t>(), d_hq.ptr<int8_t>(), d_hds.ptr<float2>(), d_ids.ptr<int32_t>(),
                     d_wts.ptr<float>(), n, k, d_x.ptr<float>(), stream(), after_gate_up);
        cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_hq.span(), d_hds.span(), d_ids.span(),
                                           d_wts.span()}, {d_x.span()});
        return download<float>(d_x, n * n_embd);
      };
      auto down_on_x0 = [&] { return down_into(upload_vec(x0), false); };
      const auto xo = down_on_x0();
      auto same_bits_as_xo = [&](const std::vector<float>& x) {
        return x.size() == xo.size() && std::memcmp(x.data(), xo.data(), xo.size() * 4) == 0;
      };
      std::vector<float> wd(n_ff);
      double worst_x = 0;
      int64_t bad_x = 0, changed_t1 = 0;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < n_embd; ++r) {
          const int64_t i = t * n_embd + r;
          if (t == 1) {  // no resident expert
            changed_t1 += !test::same_bits(xo[i], x0[i]);
            continue;
          }
          double mag = 0;
          for (int j = 0; j < k; ++j) {
            const int64_t p = t * k + j;
            if (!resident_pair(p)) continue;
            dequantize_row(mc.down, slots.data() + table[ids[p]] * v.slot_bytes + v.down_off + r * drb, wd.data(), n_ff);
            for (int64_t c = 0; c < n_ff; ++c)
              mag += std::fabs(wts[p] * wd[c] * double(hds[p * (n_ff / 32) + c / 32].d) * hq[p * n_ff + c]);
          }
          const double tol = 1e-5 * mag + 2.4e-7 * std::fabs(double(x_ref[i]));
          const double err = std::isfinite(xo[i]) ? std::fabs(double(xo[i]) - x_ref[i]) : 1e30;
          bad_x += err > tol;
          worst_x = std::max(worst_x, err / std::max(tol, 1e-30));
        }
      EXPECT_EQ(changed_t1, 0) << what << ": x of a token without a resident expert changed";
      EXPECT_EQ(bad_x, 0) << what << ": moe_down off the reference by more than 1e-5 sum|wts w h|; worst error / "
                          << "tolerance " << worst_x;
      std::printf("q8 moe down %s: worst error / tolerance %.3g\n", what.c_str(), worst_x);

      // Deterministic: the same call again gives the same bits.
      EXPECT_TRUE(same_bits_as_xo(down_on_x0())) << what << ": moe_down not deterministic";
      // Enqueued right after moe_gate_up with after_gate_up (the models' call: the down rows are prefetched
      // into L2 before the PDL wait, from ids and the table read early): the same bits.
      {
        auto d_x4 = upload_vec(x0);  // (first: down then directly follows gate_up on the stream)
        q8::moe_gate_up(v, d_table.ptr<int32_t>(), d_xq.ptr<int8_t>(), d_xds.ptr<float2>(), d_ids.ptr<int32_t>(), n,
                        k, d_hq.ptr<int8_t>(), d_hds.ptr<float2>(), stream());
        cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_xq.span(), d_xds.span(), d_ids.span()},
                          {d_hq.span(), d_hds.span()});
        EXPECT_TRUE(same_bits_as_xo(down_into(d_x4, /*after_gate_up=*/true)))
            << what << ": moe_down after gate_up (rows prefetched) differs";
      }
      // The other moe_down kernel (slots looked up per term / once per warp) gives the same bits.
      const int kernel_was = q8::moe_down_kernel();
      const bool slots_on = q8::moe_down_slots(n, mc.down);
      q8::set_moe_down_kernel(slots_on ? 0 : 1);
      const auto x_other = down_on_x0();
      q8::set_moe_down_kernel(kernel_was);
      EXPECT_TRUE(same_bits_as_xo(x_other))
          << what << ": moe_down with slots looked up " << (slots_on ? "per term" : "once per warp")
          << " differs from the other kernel";
      EXPECT_THROW(q8::set_moe_down_kernel(4), Error);
      // The other launch shapes (4 or 8 warps a block; blocks an SM capped or not) give the same bits.
      const int warps_was = q8::moe_down_warps(), cap_was = q8::moe_down_per_sm();
      for (const auto& [warps, cap] : {std::pair{8, 0}, std::pair{8, 2}, std::pair{4, 0}, std::pair{4, 4}}) {
        q8::set_moe_down_warps(warps);
        q8::set_moe_down_per_sm(cap);
        EXPECT_TRUE(same_bits_as_xo(down_on_x0())) << what << ": moe_down with " << warps << " warps a block, " << cap
                                                   << " blocks an SM differs";
      }
      q8::set_moe_down_warps(warps_was);
      q8::set_moe_down_per_sm(cap_was);
      // Staged rows copied one after another instead of all at once: the same bytes, the same bits.
      const int async_was = q8::moe_down_async_stage();
      q8::set_moe_down_async_stage(1 - async_was);
      const auto x_stage = down_on_x0();
      q8::set_moe_down_async_stage(async_was);
      EXPECT_TRUE(same_bits_as_xo(x_stage)) << what << ": moe_down with staging " << (async_was ? "sync" : "async")
                                            << " differs";
      EXPECT_THROW(q8::set_moe_down_async_stage(2), Error);
    }

  }
};

TEST_F(CudaQ8Moe, Q4KGateUpQ6KDown) { run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, 0}); }
// Q6_K down padded as the cache keeps it with STRATA_CUDA_Q6_K_P_DOWN (quant/q6_k_p.h): 16-byte loads in
// place; and its rows 2 bytes off (staged).
TEST_F(CudaQ8Moe, Q4KGateUpQ6KPDown) { run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K_P, 0}); }
TEST_F(CudaQ8Moe, Q4KGateUpQ6KPDownTwoByteAligned) { run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K_P, 2}); }
TEST_F(CudaQ8Moe, AllQ4K) { run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K, 0}); }
// Different gate and up formats (two task loops), 2-byte aligned rows (the K-quants' non-vector loads).
// (All rows 2-byte aligned: gate, up and down all take the shared-memory staged path.)
TEST_F(CudaQ8Moe, MixedFormatsTwoByteAligned) { run({GgmlType::Q5_K, GgmlType::Q8_0, GgmlType::Q4_0, 2}); }
// Q4_0 experts (llama.cpp's benchmark format): staged gate/up of one format; Q8_0 down.
TEST_F(CudaQ8Moe, Q40GateUpQ80Down) { run({GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q8_0, 0}); }
// All Q4_0 (strata mkmodel --format Q4_0's experts): every row staged, down's k rows among them.
TEST_F(CudaQ8Moe, AllQ40) { run({GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0, 0}); }
// Q4_0 experts as the cache keeps them with STRATA_CUDA_Q4_0_X8 (quant/q4_0_x8.h): 16-byte loads in place;
// then at +2 bytes (2-byte loads: every row staged, as Q4_0's).
TEST_F(CudaQ8Moe, AllQ40X8) { run({GgmlType::Q4_0_X8, GgmlType::Q4_0_X8, GgmlType::Q4_0_X8, 0}); }
TEST_F(CudaQ8Moe, AllQ40X8TwoByteAligned) { run({GgmlType::Q4_0_X8, GgmlType::Q4_0_X8, GgmlType::Q4_0_X8, 2}); }
// A 16-byte-load gate with a 2-byte aligned up: two task loops, nothing staged; Q5_K down.
TEST_F(CudaQ8Moe, Q4KGateQ6KUpQ5KDown) { run({GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_K, 0}); }

// The low-bit formats as llama.cpp's file types lay them out: Q2_K (gate/up Q2_K, down Q3_K), Q3_K_M (Q3_K
// gate/up, Q4_K or Q5_K down), IQ4_XS, IQ4_NL; rows at +0, and at +4 (Q2_K), +8 (IQ4_XS, IQ1_M), +2 (the rest).
TEST_F(CudaQ8Moe, LowBitQ2K) { run({GgmlType::Q2_K, GgmlType::Q2_K, GgmlType::Q3_K, 0}); }
TEST_F(CudaQ8Moe, LowBitQ2KFourByteAligned) { run({GgmlType::Q2_K, GgmlType::Q2_K, GgmlType::Q3_K, 4}); }
TEST_F(CudaQ8Moe, LowBitQ3KGateUpQ4KDown) { run({GgmlType::Q3_K, GgmlType::Q3_K, GgmlType::Q4_K, 0}); }
TEST_F(CudaQ8Moe, LowBitQ3KGateUpQ5KDown) { run({GgmlType::Q3_K, GgmlType::Q3_K, GgmlType::Q5_K, 2}); }
TEST_F(CudaQ8Moe, LowBitIQ4XS) { run({GgmlType::IQ4_XS, GgmlType::IQ4_XS, GgmlType::IQ4_XS, 0}); }
TEST_F(CudaQ8Moe, LowBitIQ4XSEightByteAligned) { run({GgmlType::IQ4_XS, GgmlType::IQ4_XS, GgmlType::IQ4_XS, 8}); }
TEST_F(CudaQ8Moe, LowBitIQ4NL) { run({GgmlType::IQ4_NL, GgmlType::IQ4_NL, GgmlType::IQ4_NL, 0}); }
// The IQ formats as llama.cpp's IQ2/IQ3/IQ1 file types mix them (a larger down type).
TEST_F(CudaQ8Moe, LowBitIQ2XXS) { run({GgmlType::IQ2_XXS, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, 0}); }
TEST_F(CudaQ8Moe, LowBitIQ2XS) { run({GgmlType::IQ2_XS, GgmlType::IQ2_XS, GgmlType::IQ3_XXS, 2}); }
TEST_F(CudaQ8Moe, LowBitIQ2S) { run({GgmlType::IQ2_S, GgmlType::IQ2_S, GgmlType::IQ3_S, 0}); }
TEST_F(CudaQ8Moe, LowBitIQ3XXS) { run({GgmlType::IQ3_XXS, GgmlType::IQ3_XXS, GgmlType::IQ4_XS, 0}); }
TEST_F(CudaQ8Moe, LowBitIQ3S) { run({GgmlType::IQ3_S, GgmlType::IQ3_S, GgmlType::Q4_K, 2}); }
TEST_F(CudaQ8Moe, LowBitIQ1S) { run({GgmlType::IQ1_S, GgmlType::IQ1_S, GgmlType::IQ2_XXS, 0}); }
TEST_F(CudaQ8Moe, LowBitIQ1M) { run({GgmlType::IQ1_M, GgmlType::IQ1_M, GgmlType::IQ1_M, 0}); }
TEST_F(CudaQ8Moe, LowBitIQ1MEightByteAligned) { run({GgmlType::IQ1_M, GgmlType::IQ1_M, GgmlType::IQ1_M, 8}); }

// The fixtures' tiny geometry (n_embd 256, n_ff 256: rows of one 256-value block), where session 34's
// fixture KL with the low-bit kernels rose for IQ4_XS, IQ3_S and Q2_K (the layers above are 2048 x 768).
TEST_F(CudaQ8Moe, LowBitTinyGeometry) {
  n_embd = 256, n_ff = 256;
  run({GgmlType::Q2_K, GgmlType::Q2_K, GgmlType::Q3_K, 0});
  run({GgmlType::IQ4_XS, GgmlType::IQ4_XS, GgmlType::IQ4_XS, 0});
  run({GgmlType::IQ3_S, GgmlType::IQ3_S, GgmlType::IQ3_S, 0});
  run({GgmlType::IQ2_XS, GgmlType::IQ2_XS, GgmlType::IQ2_XS, 0});
  run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K, 0});
}

TEST_F(CudaQ8Moe, UnsupportedViewsAreErrors) {
  auto d_slots = output(1 << 20, 0);
  cuda::moe::ExpertLayerView v;
  v.slots = d_slots.ptr<uint8_t>();
  v.n_embd = 256, v.n_ff = 256;
  v.gate_type = v.up_type = v.down_type = GgmlType::Q4_1;  // a GPU kernel, but none with int8 activations
  v.gate_off = 0, v.up_off = 160 * 256, v.down_off = 2 * 160 * 256, v.slot_bytes = 3 * 160 * 256;  // fits Q4_1 and Q4_K
  EXPECT_FALSE(q8::moe_supported(v));
  auto d_buf = output(4096, 0);
  EXPECT_THROW(q8::moe_gate_up(v, d_buf.ptr<int32_t>(), d_buf.ptr<int8_t>(), d_buf.ptr<float2>(), d_buf.ptr<int32_t>(),
                               1, 1, d_buf.ptr<int8_t>(), d_buf.ptr<float2>(), stream()),
               Error);
  v.gate_type = v.up_type = v.down_type = GgmlType::Q4_K;
  EXPECT_TRUE(q8::moe_supported(v));
  v.gate_type = v.up_type = GgmlType::Q2_K;  // a low-bit gate pairs only with the same up type
  EXPECT_TRUE(q8::moe_supported(v));
  v.up_type = GgmlType::Q3_K;
  EXPECT_FALSE(q8::moe_supported(v));
  v.up_type = GgmlType::Q2_K;
  v.gate_off = 2;  // Q2_K rows must be 4-byte aligned
  EXPECT_FALSE(q8::moe_supported(v));
  EXPECT_THROW(q8::moe_gate_up(v, d_buf.ptr<int32_t>(), d_buf.ptr<int8_t>(), d_buf.ptr<float2>(), d_buf.ptr<int32_t>(),
                               1, 1, d_buf.ptr<int8_t>(), d_buf.ptr<float2>(), stream()),
               Error);
  v.gate_type = v.up_type = GgmlType::Q4_K;
  v.gate_off = 1;  // odd rows
  EXPECT_FALSE(q8::moe_supported(v));
  EXPECT_THROW(q8::moe_down(v, d_buf.ptr<int32_t>(), d_buf.ptr<int8_t>(), d_buf.ptr<float2>(), d_buf.ptr<int32_t>(),
                            d_buf.ptr<float>(), 1, 1, d_buf.ptr<float>(), stream()),
               Error);
}

// moe_down's warps a block (host only: runs without a GPU too): 8 by default, 4 where 8 would push a format
// staged through shared memory out of its 48 KiB while 4 keep it there. stage_stride(row) * k * warps + 5 KiB:
// Q6_K at n_ff 768 (630-byte rows, stride 672) fits at 8; at 1536 (1260, 1296) only at 4; at 4096 at neither;
// Q8_0 at 768 (816, 864) only at 4; Q4_K with 16-byte aligned rows is not staged.
TEST(CudaQ8MoeShape, DownWarpsKeepTheStagedPath) {
  alignas(16) static uint8_t slots[16];
  cuda::moe::ExpertLayerView v;
  v.slots = slots;
  v.n_embd = 2048, v.n_expert = 128;
  v.gate_type = v.up_type = GgmlType::Q4_K;
  v.gate_off = 0, v.up_off = 1 << 20, v.down_off = 2 << 20, v.slot_bytes = 4 << 20;
  const int warps_was = q8::moe_down_warps();
  q8::set_moe_down_warps(8);
  auto warps = [&](GgmlType down, int64_t n_ff, int k) {
    v.down_type = down, v.n_ff = n_ff;
    return q8::moe_down_launch_warps(v, k);
  };
  EXPECT_EQ(warps(GgmlType::Q6_K, 768, 8), 8);
  EXPECT_EQ(warps(GgmlType::Q6_K, 1536, 8), 4);
  EXPECT_EQ(warps(GgmlType::Q6_K, 4096, 8), 8);
  EXPECT_EQ(warps(GgmlType::Q6_K, 768, 16), 4);
  EXPECT_EQ(warps(GgmlType::Q8_0, 768, 8), 4);
  EXPECT_EQ(warps(GgmlType::Q4_0, 768, 8), 8);
  EXPECT_EQ(warps(GgmlType::Q4_K, 1536, 8), 8);
  q8::set_moe_down_warps(4);
  EXPECT_EQ(warps(GgmlType::Q6_K, 768, 8), 4);
  EXPECT_EQ(warps(GgmlType::Q4_K, 1536, 8), 4);
  q8::set_moe_down_warps(warps_was);
  EXPECT_THROW(q8::set_moe_down_warps(6), Error);
}

}  // namespace
