// qwen3next's fused decode kernels (cuda/next_fused.cuh):
//  * bit for bit against the GPU op chains they replace (cuda/gdn.cuh ops, q8::quantize): conv_split_gates
//    = conv1d_silu + split_qkv + gates (outputs and the conv state, over consecutive calls of 1, 2, 1, 16, 3
//    and 1 tokens on one state: the state shift case included; the fused op reads x and ba from rows of a
//    wider buffer, as parts of a stacked projection output), gated_norm_quantize = gated_rms_norm + quantize
//    (z likewise from wider rows), mul_sigmoid_quantize = mul_sigmoid + quantize;
//  * against the CPU references (cuda/host/next_fused_ref.h): f32 outputs within 1e-5 of max |ref| (GPU
//    expf/log1pf vs the host's), Q8 values within one step plus that tolerance; dot_sigmoid within 2e-6 of the double-precision reference;
//  * at Qwen3-Next-80B-A3B sizes (Hk 16, Hv 32, D 128, K 4) and the tiny fixture's (Hk 2, Hv 4, D 64);
//    bad shapes throw strata::Error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "cuda/gdn.cuh"
#include "cuda/host/next_fused_ref.h"
#include "cuda/host/q8_reference.h"
#include "cuda/next_fused.cuh"
#include "cuda/q8_kernels.cuh"
#include "gpu_test_util.h"

namespace {

using namespace strata;
namespace nextf = strata::cuda::nextf;
namespace nref = strata::cuda::nextf_ref;
using strata::cuda::q8ref::Q8Ds;
static_assert(sizeof(Q8Ds) == sizeof(float2));

using NextFused = test::GpuKernelTest;

std::vector<float> randv(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Elements whose bits differ (a NaN on both sides counts as equal bits only if the bits are equal).
int64_t bit_diffs(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  int64_t d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d += !test::same_bits(a[i], b[i]);
  return d;
}
// max |a - b| / max(max |b|, 1e-30)
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0, r = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    m = std::isnan(d) ? INFINITY : std::max(m, d);
    r = std::max(r, std::fabs(double(b[i])));
  }
  return m / std::max(r, 1e-30);
}

struct Shape {
  int64_t Hk, Hv, D;
  int K;
};
const Shape kShapes[] = {{16, 32, 128, 4}, {2, 4, 64, 4}};

TEST_F(NextFused, ConvSplitGatesMatchesOpChainBitForBit) {
  for (const Shape sh : kShapes) {
    std::mt19937 rng(uint32_t(sh.Hv * 7 + sh.D));
    const int64_t Hk = sh.Hk, Hv = sh.Hv, D = sh.D, C = (2 * Hk + Hv) * D;
    const int K = sh.K;
    const int64_t max_n = nextf::kConvSplitMaxTokens;
    const auto w = randv(size_t(C * K), rng);
    const auto a = randv(size_t(Hv), rng, -2.0f, -0.1f);
    const auto dt = randv(size_t(Hv), rng);
    std::vector<float> st_ref(size_t((K - 1) * C), 0.0f);
    auto d_w = upload_vec(w);
    auto d_a = upload_vec(a);
    auto d_dt = upload_vec(dt);
    auto d_st_chain = upload_vec(st_ref);  // both states start at zero (a fresh sequence)
    auto d_st_fused = upload_vec(st_ref);
    auto d_x = output(size_t(max_n * C) * 4);
    auto d_ba = output(size_t(max_n * 2 * Hv) * 4);
    // The fused op's inputs as parts of wider rows: x then ba in rows of C + 2*Hv + 32 values.
    const int64_t ld = C + 2 * Hv + 32;
    auto d_wide = output(size_t(max_n * ld) * 4);
    auto d_conv = output(size_t(max_n * C) * 4);
    // outputs: chain (c) and fused (f)
    auto cq = output(size_t(max_n * Hk * D) * 4), ck = output(size_t(max_n * Hk * D) * 4),
         cv = output(size_t(max_n * Hv * D) * 4), cg = output(size_t(max_n * Hv) * 4),
         cb = output(size_t(max_n * Hv) * 4);
    auto fq = output(size_t(max_n * Hk * D) * 4), fk = output(size_t(max_n * Hk * D) * 4),
         fv = output(size_t(max_n * Hv * D) * 4), fg = output(size_t(max_n * Hv) * 4),
         fb = output(size_t(max_n * Hv) * 4);
    for (int64_t n : {1, 2, 1, 16, 3, 1}) {
      const auto x = randv(size_t(n * C), rng, -2.0f, 2.0f);
      const auto ba = randv(size_t(n * 2 * Hv), rng, -3.0f, 3.0f);
      xfer->upload(d_x.span(), x.data(), x.size() * 4, dev->compute(), {&dev->compute()});
      xfer->upload(d_ba.span(), ba.data(), ba.size() * 4, dev->compute(), {&dev->compute()});
      std::vector<float> wide(size_t(n * ld), 7.0f);
      for (int64_t t = 0; t < n; ++t) {
        std::copy(x.begin() + t * C, x.begin() + (t + 1) * C, wide.begin() + t * ld);
        std::copy(ba.begin() + t * 2 * Hv, ba.begin() + (t + 1) * 2 * Hv, wide.begin() + t * ld + C);
      }
      xfer->upload(d_wide.span(), wide.data(), wide.size() * 4, dev->compute(), {&dev->compute()});
      const float eps = 1e-6f;
      cuda::note_launch(dev->compute(), {d_x.span(), d_w.span(), d_st_chain.span(), d_ba.span(), d_a.span(), d_dt.span()},
                        {d_conv.span(), d_st_chain.span(), cq.span(), ck.span(), cv.span(), cg.span(), cb.span()});
      cuda::gdn::conv1d_silu(d_x.ptr<float>(), n, C, K, d_st_chain.ptr<float>(), d_w.ptr<float>(), d_conv.ptr<float>(),
                             stream());
      cuda::gdn::split_qkv(d_conv.ptr<float>(), n, Hk, Hv, D, eps, cq.ptr<float>(), ck.ptr<float>(), cv.ptr<float>(),
                           stream());
      cuda::gdn::gates(d_ba.ptr<float>(), n, Hk, Hv, d_a.ptr<float>(), d_dt.ptr<float>(), cg.ptr<float>(),
                       cb.ptr<float>(), stream());
      cuda::note_launch(dev->compute(), {d_wide.span(), d_w.span(), d_st_fused.span(), d_a.span(), d_dt.span()},
                        {d_st_fused.span(), fq.span(), fk.span(), fv.span(), fg.span(), fb.span()});
      nextf::conv_split_gates(d_wide.ptr<float>(), ld, n, Hk, Hv, D, K, d_st_fused.ptr<float>(), d_w.ptr<float>(), eps,
                              fq.ptr<float>(), fk.ptr<float>(), fv.ptr<float>(), d_wide.ptr<float>() + C, ld,
                              d_a.ptr<float>(), d_dt.ptr<float>(), fg.ptr<float>(), fb.ptr<float>(), stream());
      // CPU reference
      std::vector<float> rq(size_t(n * Hk * D)), rk(rq.size()), rv(size_t(n * Hv * D)), rg(size_t(n * Hv)),
          rb(rg.size());
      nref::conv_split_gates(wide.data(), ld, n, Hk, Hv, D, K, st_ref.data(), w.data(), eps, rq.data(), rk.data(),
                             rv.data(), wide.data() + C, ld, a.data(), dt.data(), rg.data(), rb.data());
      struct Out {
        const char* name;
        const test::GpuKernelTest::Buf *chain, *fused;
        const std::vector<float>* ref;
      };
      const Out outs[] = {{"q", &cq, &fq, &rq}, {"k", &ck, &fk, &rk}, {"v", &cv, &fv, &rv}, {"g", &cg, &fg, &rg},
                          {"beta", &cb, &fb, &rb}};
      for (const Out& o : outs) {
        const auto c = download<float>(*o.chain, o.ref->size());
        const auto f = download<float>(*o.fused, o.ref->size());
        EXPECT_EQ(bit_diffs(f, c), 0) << o.name << " Hv " << Hv << " D " << D << " n " << n;
        EXPECT_LE(rel_err(f, *o.ref), 1e-5) << o.name << " vs CPU, Hv " << Hv << " D " << D << " n " << n;
      }
      const auto sc = download<float>(d_st_chain, st_ref.size());
      const auto sf = download<float>(d_st_fused, st_ref.size());
      EXPECT_EQ(bit_diffs(sf, sc), 0) << "conv state, Hv " << Hv << " D " << D << " n " << n;
      EXPECT_EQ(bit_diffs(sf, st_ref), 0) << "conv state vs CPU (a copy of inputs), n " << n;
    }
  }
  auto bad = [&](int64_t x_ld, int64_t n, int64_t Hk, int64_t D, int64_t ba_ld) {
    nextf::conv_split_gates(nullptr, x_ld, n, Hk, 4, D, 4, nullptr, nullptr, 1e-6f, nullptr, nullptr, nullptr, nullptr,
                            ba_ld, nullptr, nullptr, nullptr, nullptr, stream());
  };
  EXPECT_THROW(bad(512, nextf::kConvSplitMaxTokens + 1, 2, 64, 8), Error);  // too many tokens
  EXPECT_THROW(bad(512, 1, 2, 48, 8), Error);                               // D not a multiple of 32
  EXPECT_THROW(bad(512, 1, 3, 64, 8), Error);                               // Hv not a multiple of Hk
  EXPECT_THROW(bad(511, 1, 2, 64, 8), Error);                               // x rows narrower than C
  EXPECT_THROW(bad(512, 1, 2, 64, 7), Error);                               // ba rows narrower than 2*Hv
}

// q within one step of the reference and d within 1e-5 relative (y differs from the CPU's by the GPU's
// expf rounding, so a value near a rounding boundary may land on the other side).
void expect_q8_close(const std::vector<int8_t>& q, const std::vector<Q8Ds>& ds, const std::vector<int8_t>& rq,
                     const std::vector<Q8Ds>& rds, const char* what) {
  int64_t bad_q = 0, bad_d = 0;
  for (size_t i = 0; i < q.size(); ++i) bad_q += std::abs(int(q[i]) - int(rq[i])) > 1;
  for (size_t b = 0; b < ds.size(); ++b)
    bad_d += !(std::fabs(ds[b].d - rds[b].d) <= 1e-5f * std::fabs(rds[b].d) + 1e-30f);
  EXPECT_EQ(bad_q, 0) << what << ": q more than one step from the CPU reference";
  EXPECT_EQ(bad_d, 0) << what << ": block scales off the CPU reference";
}

TEST_F(NextFused, GatedNormQuantizeMatchesOpChainBitForBit) {
  for (const Shape sh : kShapes) {
    std::mt19937 rng(uint32_t(sh.D + 1));
    const int64_t D = sh.D;
    for (int64_t n : {1, 3, 16}) {
      const int64_t rows = n * sh.Hv, zw = sh.Hv * D, z_ld = zw + 96;  // z as a part of wider rows
      const auto x = randv(size_t(rows * D), rng, -3.0f, 3.0f);
      const auto z = randv(size_t(rows * D), rng, -4.0f, 4.0f);
      std::vector<float> z_wide(size_t(n * z_ld), 5.0f);
      for (int64_t t = 0; t < n; ++t) std::copy(z.begin() + t * zw, z.begin() + (t + 1) * zw, z_wide.begin() + t * z_ld);
      const auto w = randv(size_t(D), rng, 0.5f, 1.5f);
      const float eps = 1e-6f;
      auto d_x = upload_vec(x), d_z = upload_vec(z), d_w = upload_vec(w), d_zw = upload_vec(z_wide);
      auto d_y = output(size_t(rows * D) * 4);
      auto cq = output(size_t(rows * D)), cds = output(size_t(rows * D / 32) * 8);
      auto fq = output(size_t(rows * D)), fds = output(size_t(rows * D / 32) * 8);
      cuda::note_launch(dev->compute(), {d_x.span(), d_z.span(), d_w.span(), d_y.span()},
                        {d_y.span(), cq.span(), cds.span()});
      cuda::gdn::gated_rms_norm(d_x.ptr<float>(), d_z.ptr<float>(), d_w.ptr<float>(), rows, D, eps, d_y.ptr<float>(),
                                stream());
      cuda::q8::quantize(d_y.ptr<float>(), rows, D, cq.ptr<int8_t>(), cds.ptr<float2>(), stream());
      cuda::note_launch(dev->compute(), {d_x.span(), d_zw.span(), d_w.span()}, {fq.span(), fds.span()});
      nextf::gated_norm_quantize(d_x.ptr<float>(), d_zw.ptr<float>(), z_ld, d_w.ptr<float>(), n, sh.Hv, D, eps,
                                 fq.ptr<int8_t>(), fds.ptr<float2>(), stream());
      const auto q_c = download<int8_t>(cq, size_t(rows * D)), q_f = download<int8_t>(fq, size_t(rows * D));
      const auto ds_c = download<Q8Ds>(cds, size_t(rows * D / 32)), ds_f = download<Q8Ds>(fds, size_t(rows * D / 32));
      EXPECT_EQ(std::memcmp(q_c.data(), q_f.data(), q_c.size()), 0) << "q, D " << D << " n " << n;
      EXPECT_EQ(std::memcmp(ds_c.data(), ds_f.data(), ds_c.size() * sizeof(Q8Ds)), 0) << "ds, D " << D << " n " << n;
      std::vector<int8_t> rq(size_t(rows * D));
      std::vector<Q8Ds> rds(size_t(rows * D / 32));
      nref::gated_norm_quantize(x.data(), z_wide.data(), z_ld, w.data(), n, sh.Hv, D, eps, rq.data(), rds.data());
      expect_q8_close(q_f, ds_f, rq, rds, "gated_norm_quantize");
    }
  }
  EXPECT_THROW(nextf::gated_norm_quantize(nullptr, nullptr, 4 * 48, nullptr, 1, 4, 48, 1e-6f, nullptr, nullptr, stream()),
               Error);  // D not a multiple of 32
  EXPECT_THROW(nextf::gated_norm_quantize(nullptr, nullptr, 4 * 64 - 1, nullptr, 1, 4, 64, 1e-6f, nullptr, nullptr,
                                          stream()),
               Error);  // z rows narrower than the heads
}

TEST_F(NextFused, MulSigmoidQuantizeMatchesOpChainBitForBit) {
  std::mt19937 rng(5);
  for (int64_t cols : {int64_t(4096), int64_t(256)}) {
    for (int64_t n : {1, 5}) {
      const auto x = randv(size_t(n * cols), rng, -3.0f, 3.0f);
      const auto g = randv(size_t(n * cols), rng, -6.0f, 6.0f);
      auto d_x = upload_vec(x), d_g = upload_vec(g);
      auto d_y = upload_vec(x);  // mul_sigmoid works in place
      auto cq = output(size_t(n * cols)), cds = output(size_t(n * cols / 32) * 8);
      auto fq = output(size_t(n * cols)), fds = output(size_t(n * cols / 32) * 8);
      cuda::note_launch(dev->compute(), {d_y.span(), d_g.span()}, {d_y.span(), cq.span(), cds.span()});
      cuda::gdn::mul_sigmoid(d_y.ptr<float>(), d_g.ptr<float>(), n * cols, stream());
      cuda::q8::quantize(d_y.ptr<float>(), n, cols, cq.ptr<int8_t>(), cds.ptr<float2>(), stream());
      cuda::note_launch(dev->compute(), {d_x.span(), d_g.span()}, {fq.span(), fds.span()});
      nextf::mul_sigmoid_quantize(d_x.ptr<float>(), d_g.ptr<float>(), n, cols, fq.ptr<int8_t>(), fds.ptr<float2>(),
                                  stream());
      const auto q_c = download<int8_t>(cq, size_t(n * cols)), q_f = download<int8_t>(fq, size_t(n * cols));
      const auto ds_c = download<Q8Ds>(cds, size_t(n * cols / 32)), ds_f = download<Q8Ds>(fds, size_t(n * cols / 32));
      EXPECT_EQ(std::memcmp(q_c.data(), q_f.data(), q_c.size()), 0) << "q, cols " << cols << " n " << n;
      EXPECT_EQ(std::memcmp(ds_c.data(), ds_f.data(), ds_c.size() * sizeof(Q8Ds)), 0) << "ds, cols " << cols;
      std::vector<int8_t> rq(size_t(n * cols));
      std::vector<Q8Ds> rds(size_t(n * cols / 32));
      nref::mul_sigmoid_quantize(x.data(), g.data(), n, cols, rq.data(), rds.data());
      expect_q8_close(q_f, ds_f, rq, rds, "mul_sigmoid_quantize");
    }
  }
  EXPECT_THROW(nextf::mul_sigmoid_quantize(nullptr, nullptr, 1, 40, nullptr, nullptr, stream()), Error);
}

TEST_F(NextFused, DotSigmoidMatchesReference) {
  std::mt19937 rng(6);
  for (int64_t cols : {int64_t(2048), int64_t(256), int64_t(100)}) {
    const int64_t n = 5;
    const auto w = randv(size_t(cols), rng, -0.2f, 0.2f);
    auto x = randv(size_t(n * cols), rng, -2.0f, 2.0f);
    for (int64_t i = 0; i < cols; ++i) x[size_t(4 * cols + i)] = 40.0f * w[size_t(i)];  // a saturated gate
    std::vector<float> ref(static_cast<size_t>(n), 0.0f);
    nref::dot_sigmoid(w.data(), x.data(), n, cols, ref.data());
    auto d_w = upload_vec(w), d_x = upload_vec(x);
    auto d_y = output(size_t(n) * 4);
    cuda::note_launch(dev->compute(), {d_w.span(), d_x.span()}, {d_y.span()});
    nextf::dot_sigmoid(d_w.ptr<float>(), d_x.ptr<float>(), n, cols, d_y.ptr<float>(), stream());
    const auto y = download<float>(d_y, size_t(n));
    double m = 0;
    for (int64_t t = 0; t < n; ++t) m = std::max(m, std::fabs(double(y[size_t(t)]) - double(ref[size_t(t)])));
    EXPECT_LE(m, 2e-6) << "max |gpu - cpu|, cols " << cols;
  }
  EXPECT_THROW(nextf::dot_sigmoid(nullptr, nullptr, 1, 0, nullptr, stream()), Error);
}

}  // namespace
