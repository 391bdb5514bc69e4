// CPU references of the int8-activation decode kernels (cuda/host/q8_reference.h): activation
// quantization properties, rmsnorm_quantize against cpu::rmsnorm, and the reference products against the
// exact f32 product of the dequantized weights with the unquantized activations, for the 5 formats at
// the real decode sizes, with a negative control that shows the bound catches a dropped min term.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "cpu/ops.h"
#include "cuda/host/q8_reference.h"
#include "quant/dequant.h"
#include "quant/quantize.h"
#include "quant_test_util.h"

namespace strata {
namespace {

using cuda::q8ref::Q8Ds;
namespace q8ref = cuda::q8ref;

constexpr GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                               GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_XS, GgmlType::IQ4_NL,
                               GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS,
                               GgmlType::IQ3_S, GgmlType::IQ1_S, GgmlType::IQ1_M};

// rows x cols weights: strata's quantizer on N(0, 0.05) values where it has one, else (Q4_0) random
// codes with sane f16 scales.
std::vector<uint8_t> make_weights(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t rb = int64_t(row_bytes(t, uint64_t(cols)));
  std::vector<uint8_t> w(size_t(rb * rows));
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<float> f(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    if (can_quantize(t)) {
      for (auto& v : f) v = nd(rng);
      quantize_row(t, f.data(), w.data() + r * rb, cols);
    } else {
      const auto row = test::random_row(t, cols, rng);
      std::memcpy(w.data() + r * rb, row.data(), size_t(rb));
    }
  }
  return w;
}

// Activations like a decode step's: N(0, 1) with a few large outliers (which make the int8 blocks coarse).
std::vector<float> make_acts(int64_t n, std::mt19937& rng) {
  auto x = test::random_acts(n, rng);
  for (int64_t i = 0; i < n; i += 97) x[size_t(i)] *= 8.f;
  return x;
}

TEST(Q8Reference, QuantizeProperties) {
  std::mt19937 rng(1);
  const int64_t n = 3, cols = 2048;
  auto x = make_acts(n * cols, rng);
  for (int i = 0; i < 32; ++i) x[size_t(64 + i)] = 0.f;                 // an all-zero block
  for (int i = 0; i < 32; ++i) x[size_t(128 + i)] = 1e-3f * float(i - 16);  // a small one, exact halves
  std::vector<int8_t> q(size_t(n * cols));
  std::vector<Q8Ds> ds(size_t(n * cols / 32));
  q8ref::quantize(x.data(), n, cols, q.data(), ds.data());
  for (int64_t b = 0; b < n * cols / 32; ++b) {
    const float d = ds[size_t(b)].d;
    float amax = 0.f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const float v = x[size_t(32 * b + i)];
      const int qi = q[size_t(32 * b + i)];
      amax = std::max(amax, std::fabs(v));
      ASSERT_LE(std::abs(qi), 127);
      ASSERT_LE(std::fabs(d * float(qi) - v), d * 0.5f * (1.f + 1e-5f)) << "block " << b << " value " << i;
      sum += qi;
    }
    EXPECT_EQ(d, amax / 127.f);
    EXPECT_EQ(ds[size_t(b)].s, d * float(sum));
    if (amax > 0.f) {
      int qmax = 0;
      for (int i = 0; i < 32; ++i) qmax = std::max(qmax, std::abs(int(q[size_t(32 * b + i)])));
      EXPECT_EQ(qmax, 127) << "the largest value of a block maps to +-127";
    }
  }
  EXPECT_EQ(ds[2].d, 0.f);
  EXPECT_EQ(ds[2].s, 0.f);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q[size_t(64 + i)], 0);
  EXPECT_THROW(q8ref::quantize(x.data(), 1, 48, q.data(), ds.data()), Error);
}

TEST(Q8Reference, RmsnormQuantizeMatchesRmsnorm) {
  std::mt19937 rng(2);
  const int64_t n = 3, cols = 2048;
  const auto x = make_acts(n * cols, rng);
  auto w = test::random_acts(cols, rng);
  std::vector<float> y(size_t(n * cols)), yc(size_t(n * cols));
  std::vector<int8_t> q(size_t(n * cols)), q2(size_t(n * cols));
  std::vector<Q8Ds> ds(size_t(n * cols / 32)), ds2(size_t(n * cols / 32));
  q8ref::rmsnorm_quantize(x.data(), w.data(), n, cols, 1e-6f, y.data(), q.data(), ds.data());
  cpu::rmsnorm(x.data(), w.data(), n, cols, 1e-6f, yc.data());
  // The CPU op sums f32 squares, the GPU (and this reference) exact double squares: the mean may differ
  // in its last bit, so y within a few ulps.
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], yc[i], 4e-7f * std::fabs(yc[i])) << i;
  q8ref::quantize(y.data(), n, cols, q2.data(), ds2.data());
  EXPECT_EQ(q, q2);
  for (size_t b = 0; b < ds.size(); ++b) EXPECT_TRUE(ds[b].d == ds2[b].d && ds[b].s == ds2[b].s) << b;
  // In place (y = x).
  auto xi = x;
  q8ref::rmsnorm_quantize(xi.data(), w.data(), n, cols, 1e-6f, xi.data(), q2.data(), ds2.data());
  EXPECT_EQ(xi, y);
  EXPECT_EQ(q, q2);
}

// Per output: the reference, the exact product (double) of dequantized W and unquantized x, sum|w*x|,
// and the bound of the activation rounding: sum over blocks of (d_b / 2) * sum over the block of |w|.
struct Check {
  double worst = 0;  // max over outputs of |ref - exact| / bound
  int over = 0;      // outputs over the bound
  int total = 0;
};

Check check_matvec(GgmlType t, const std::vector<uint8_t>& w, int64_t rows, int64_t cols,
                   const std::vector<uint8_t>& w_ref, const std::vector<float>& x, int64_t n) {
  const int64_t rb = int64_t(row_bytes(t, uint64_t(cols)));
  std::vector<int8_t> xq(size_t(n * cols));
  std::vector<Q8Ds> xds(size_t(n * cols / 32));
  q8ref::quantize(x.data(), n, cols, xq.data(), xds.data());
  std::vector<float> y(size_t(n * rows), 0.5f);
  q8ref::matvec(t, w_ref.data(), rows, cols, rb, xq.data(), xds.data(), n, y.data(), /*accumulate=*/true);
  std::vector<float> wf(static_cast<size_t>(cols));
  Check c;
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t, w.data() + r * rb, wf.data(), cols);
    for (int64_t tk = 0; tk < n; ++tk) {
      const float* xr = x.data() + tk * cols;
      double exact = 0, mag = 0, quant = 0;
      for (int64_t b = 0; b < cols / 32; ++b) {
        double wabs = 0;
        for (int i = 0; i < 32; ++i) {
          const int64_t col = 32 * b + i;
          exact += double(wf[size_t(col)]) * xr[col];
          mag += std::fabs(double(wf[size_t(col)]) * xr[col]);
          wabs += std::fabs(wf[size_t(col)]);
        }
        quant += 0.5 * xds[size_t(tk * cols / 32 + b)].d * wabs;
      }
      // Bound: the activation rounding (|d*q - x| <= d/2 per value) plus f32 rounding of the factored
      // per-block sums, the accumulation and the residual add (1e-5 of sum|w*x| is ~100 ulps of it).
      const double bound = quant * (1 + 1e-5) + 1e-5 * (mag + 0.5);
      const double err = std::fabs(double(y[size_t(tk * rows + r)]) - (0.5 + exact));
      c.worst = std::max(c.worst, err / bound);
      c.over += err > bound;
      ++c.total;
    }
  }
  return c;
}

TEST(Q8Reference, MatvecWithinActivationRoundingOfExact) {
  std::mt19937 rng(3);
  for (GgmlType t : kTypes)
    for (int64_t cols : {int64_t(2048), int64_t(768)}) {
      const int64_t rows = 96, n = 2;
      const auto w = make_weights(t, rows, cols, rng);
      const auto x = make_acts(n * cols, rng);
      const Check c = check_matvec(t, w, rows, cols, w, x, n);
      EXPECT_EQ(c.over, 0) << type_name(t) << " cols " << cols << ": worst error / bound " << c.worst;
      // The bound is not loose: the typical error is a random walk well inside it, but not vanishing.
      EXPECT_GT(c.worst, 0.01) << type_name(t) << " cols " << cols;
      std::printf("%s cols %lld: worst error / bound %.3f\n", std::string(type_name(t)).c_str(), (long long)cols,
                  c.worst);
    }
}

// The early norm's reference (q8ref::norm_matvec_early, the GPU's STRATA_CUDA_NORM_EARLY): xn the bits of
// rmsnorm_quantize's; y within the activation rounding of the exact product of the dequantized weights
// with xn, where the codes are those of x * nw and each block's rounding (d / 2) is scaled by the norm's
// scale; and close to rmsnorm_quantize + matvec (two roundings of the same values).
TEST(Q8Reference, NormMatvecEarlyWithinActivationRoundingOfExact) {
  std::mt19937 rng(5);
  for (GgmlType t : kTypes) {
    const int64_t rows = 64, cols = 2048, rb = int64_t(row_bytes(t, uint64_t(cols)));
    const auto w = make_weights(t, rows, cols, rng);
    const auto x = make_acts(cols, rng);
    const auto nw = test::random_acts(cols, rng);
    std::vector<float> xn(static_cast<size_t>(cols)), xn_ref(static_cast<size_t>(cols)), y(static_cast<size_t>(rows), 0.5f),
        y_ref(static_cast<size_t>(rows), 0.5f);
    q8ref::norm_matvec_early(t, w.data(), rows, cols, rb, x.data(), nw.data(), 1e-6f, xn.data(), y.data(), true);
    std::vector<int8_t> q(static_cast<size_t>(cols));
    std::vector<Q8Ds> ds(static_cast<size_t>(cols / 32));
    q8ref::rmsnorm_quantize(x.data(), nw.data(), 1, cols, 1e-6f, xn_ref.data(), q.data(), ds.data());
    EXPECT_EQ(xn, xn_ref) << type_name(t);
    q8ref::matvec(t, w.data(), rows, cols, rb, q.data(), ds.data(), 1, y_ref.data(), true);
    const float scale = q8ref::rmsnorm_scale(x.data(), cols, 1e-6f);
    std::vector<float> v(static_cast<size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) v[size_t(c)] = x[size_t(c)] * nw[size_t(c)];
    q8ref::quantize(v.data(), 1, cols, q.data(), ds.data());
    std::vector<float> wf(static_cast<size_t>(cols));
    int over = 0;
    double worst = 0;
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(t, w.data() + r * rb, wf.data(), cols);
      double exact = 0, mag = 0, quant = 0;
      for (int64_t b = 0; b < cols / 32; ++b) {
        double wabs = 0;
        for (int i = 0; i < 32; ++i) {
          const size_t col = size_t(32 * b + i);
          exact += double(wf[col]) * xn[col];
          mag += std::fabs(double(wf[col]) * xn[col]);
          wabs += std::fabs(wf[col]);
        }
        quant += 0.5 * ds[size_t(b)].d * scale * wabs;
      }
      const double bound = quant * (1 + 1e-5) + 1e-5 * (mag + 0.5);  // as check_matvec's
      const double err = std::fabs(double(y[size_t(r)]) - (0.5 + exact));
      worst = std::max(worst, err / bound);
      over += err > bound;
      // Against the plain path: both within their rounding of the same exact value.
      EXPECT_LE(std::fabs(double(y[size_t(r)]) - y_ref[size_t(r)]), 2 * bound) << type_name(t) << " row " << r;
    }
    EXPECT_EQ(over, 0) << type_name(t) << ": worst error / bound " << worst;
    EXPECT_GT(worst, 0.01) << type_name(t);  // the bound is not loose
  }
  std::vector<float> xn(2048), y(4);
  const std::vector<uint8_t> w(size_t(4 * 1152));
  const std::vector<float> x(2048, 1.f);
  EXPECT_THROW(q8ref::norm_matvec_early(GgmlType::Q4_K, w.data(), 4, 2048, 1000, x.data(), x.data(), 1e-6f,
                                        xn.data(), y.data(), false),
               Error);  // row stride shorter than a row
}

// Negative control: the same check on Q4_K / Q5_K / Q2_K weights whose dmin field is zeroed for the
// reference (the min term dropped, what a kernel that forgot the block sums would compute) fails on many
// outputs (the matvec test above asserts none fails); and Q4_0 codes with the offset applied the wrong way,
// Q3_K's high bits read with the wrong sense (value - 4 where the bit is set), IQ1_S's deltas with the wrong
// sign and IQ2_XS's two 16-value scales swapped fail too. With zero-mean activations a dropped min term is a random walk like the rounding error, only
// larger: ~40-90% of the outputs exceed the bound (measured: q4_K ~90%, q5_K ~40%, q4_0 ~65%), so the
// control asserts at least a fifth.
TEST(Q8Reference, BoundCatchesDroppedMinTerm) {
  std::mt19937 rng(4);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q4_0, GgmlType::Q2_K, GgmlType::Q3_K,
                     GgmlType::IQ1_S, GgmlType::IQ2_XS}) {
    const int64_t rows = 64, cols = 2048, n = 1;
    const auto w = make_weights(t, rows, cols, rng);
    auto broken = w;
    const int64_t bb = int64_t(type_traits(t).type_size), nb = rows * cols / int64_t(type_traits(t).block_size);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = broken.data() + b * bb;
      if (t == GgmlType::Q4_0) {
        // Codes c -> c ^ 8 flips every code's top bit: (c ^ 8) - 8 = c - 8 + (c < 8 ? 8 : -8), i.e. the
        // values as if the offset of 8 had been applied the wrong way.
        for (int i = 2; i < 18; ++i) blk[i] ^= 0x88;
      } else if (t == GgmlType::Q3_K) {
        for (int i = 0; i < 32; ++i) blk[i] ^= 0xFF;  // hmask inverted
      } else if (t == GgmlType::Q2_K) {
        blk[82] = blk[83] = 0;  // dmin = +0
      } else if (t == GgmlType::IQ1_S) {
        for (int ib = 0; ib < 8; ++ib) blk[35 + 2 * ib] ^= 0x80;  // every delta's sign flipped
      } else if (t == GgmlType::IQ2_XS) {
        for (int ib = 0; ib < 8; ++ib) blk[66 + ib] = uint8_t((blk[66 + ib] << 4) | (blk[66 + ib] >> 4));  // scale nibbles swapped
      } else {
        blk[2] = blk[3] = 0;  // dmin = +0
      }
    }
    const auto x = make_acts(n * cols, rng);
    const Check ok = check_matvec(t, w, rows, cols, w, x, n);
    const Check bad = check_matvec(t, w, rows, cols, broken, x, n);
    EXPECT_EQ(ok.over, 0) << type_name(t);
    std::printf("%s: correct worst error/bound %.3f; broken: %d of %d outputs over the bound, worst %.2f\n",
                std::string(type_name(t)).c_str(), ok.worst, bad.over, bad.total, bad.worst);
    EXPECT_GE(bad.over, bad.total / 5) << type_name(t) << ": the broken reference passed " << bad.total - bad.over
                                            << " of " << bad.total << " outputs (worst " << bad.worst << ")";
  }
}

TEST(Q8Reference, MatvecRejectsBadShapes) {
  std::vector<uint8_t> w(144 * 8);
  std::vector<int8_t> xq(2048);
  std::vector<Q8Ds> xds(64);
  std::vector<float> y(4);
  EXPECT_THROW(q8ref::matvec(GgmlType::Q4_K, w.data(), 1, 2048 - 32, 144 * 8, xq.data(), xds.data(), 1, y.data(), false),
               Error);
  EXPECT_THROW(q8ref::matvec(GgmlType::Q4_K, w.data(), 1, 2048, 144 * 7, xq.data(), xds.data(), 1, y.data(), false),
               Error);
  EXPECT_THROW(q8ref::matvec(GgmlType::Q5_0, w.data(), 1, 2048, 22 * 64, xq.data(), xds.data(), 1, y.data(), false),
               Error);
  for (GgmlType t : kTypes) EXPECT_TRUE(q8ref::supported(t));
  EXPECT_FALSE(q8ref::supported(GgmlType::Q4_1));
  EXPECT_FALSE(q8ref::supported(GgmlType::F16));
  EXPECT_FALSE(q8ref::supported(GgmlType::Q5_1));
  int low = 0;
  for (GgmlType t : kTypes) low += q8ref::low_bit(t);
  EXPECT_EQ(low, 11);
  EXPECT_TRUE(q8ref::low_bit(GgmlType::Q3_K) && !q8ref::low_bit(GgmlType::Q4_K));
}

// gate_up pairs a low-bit gate or up type only with itself; the first six pair freely.
TEST(Q8Reference, MoeSupportedPairs) {
  std::vector<uint8_t> slots(16);
  q8ref::ExpertView v;
  v.slots = slots.data();
  v.slot_bytes = 1 << 20;
  v.n_embd = 2048, v.n_ff = 768;
  auto with = [&](GgmlType g, GgmlType u, GgmlType d) {
    v.gate_type = g, v.up_type = u, v.down_type = d;
    return q8ref::moe_supported(v);
  };
  EXPECT_TRUE(with(GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q6_K));
  EXPECT_TRUE(with(GgmlType::Q2_K, GgmlType::Q2_K, GgmlType::Q3_K));
  EXPECT_TRUE(with(GgmlType::IQ4_XS, GgmlType::IQ4_XS, GgmlType::IQ4_XS));
  EXPECT_TRUE(with(GgmlType::Q3_K, GgmlType::Q3_K, GgmlType::Q4_K));
  EXPECT_FALSE(with(GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q4_K));
  EXPECT_FALSE(with(GgmlType::Q4_K, GgmlType::IQ4_XS, GgmlType::Q4_K));
  EXPECT_FALSE(with(GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q3_K));
  // Rows below min_row_align: Q2_K at +2 (4 needed), IQ4_XS at +4 (8 needed); Q3_K at +2 is fine.
  EXPECT_EQ(q8ref::min_row_align(GgmlType::Q2_K), 4);
  EXPECT_EQ(q8ref::min_row_align(GgmlType::IQ1_M), 8);
  v.down_off = 2;
  EXPECT_TRUE(with(GgmlType::Q2_K, GgmlType::Q2_K, GgmlType::Q3_K));
  EXPECT_FALSE(with(GgmlType::Q3_K, GgmlType::Q3_K, GgmlType::Q2_K));
  v.down_off = 4;
  EXPECT_TRUE(with(GgmlType::Q3_K, GgmlType::Q3_K, GgmlType::Q2_K));
  EXPECT_FALSE(with(GgmlType::Q3_K, GgmlType::Q3_K, GgmlType::IQ4_XS));
}

}  // namespace
}  // namespace strata
