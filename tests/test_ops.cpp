// CPU ops vs naive references (written independently, in double) on random data at real sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/error.h"
#include "cpu/cpu_features.h"
#include "cpu/half.h"
#include "cpu/ops.h"

using namespace strata;
using namespace strata::cpu;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

}  // namespace

TEST(Ops, RmsNormMatchesNaive) {
  const int rows = 7, n = 2048;
  auto x = randn(size_t(rows) * n, 1), w = randn(n, 2);
  std::vector<float> y(x.size());
  rmsnorm(x.data(), w.data(), rows, n, 1e-6f, y.data());
  std::vector<double> ref(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
    const double s = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; ++i) ref[r * n + i] = x[r * n + i] * s * w[i];
  }
  EXPECT_LT(max_abs_diff(y, ref), 1e-5);
  rmsnorm(x.data(), w.data(), rows, n, 1e-6f, x.data());  // in place
  EXPECT_EQ(x, y);
}

TEST(Ops, SoftmaxMatchesNaiveAndSumsToOne) {
  auto x = randn(1000, 3, 10.0f);
  std::vector<double> ref(x.size());
  double mx = *std::max_element(x.begin(), x.end()), sum = 0;
  for (size_t i = 0; i < x.size(); ++i) sum += std::exp(x[i] - mx);
  for (size_t i = 0; i < x.size(); ++i) ref[i] = std::exp(x[i] - mx) / sum;
  softmax(x.data(), int64_t(x.size()));
  EXPECT_LT(max_abs_diff(x, ref), 1e-6);
  EXPECT_NEAR(std::accumulate(x.begin(), x.end(), 0.0), 1.0, 1e-5);
}

TEST(Ops, RopeNeoxMatchesNaive) {
  const int n_tok = 5, n_head = 4, hd = 128;
  for (int n_rot : {128, 64}) {
    auto x = randn(size_t(n_tok) * n_head * hd, 4);
    std::vector<int32_t> pos = {0, 1, 7, 100, 4000};
    std::vector<double> ref(x.begin(), x.end());
    const double base = 1e6;
    for (int t = 0; t < n_tok; ++t)
      for (int h = 0; h < n_head; ++h)
        for (int i = 0; i < n_rot / 2; ++i) {
          const double th = pos[t] * std::pow(base, -2.0 * i / n_rot);
          const size_t o = (size_t(t) * n_head + h) * hd;
          const double a = x[o + i], b = x[o + i + n_rot / 2];
          ref[o + i] = a * std::cos(th) - b * std::sin(th);
          ref[o + i + n_rot / 2] = a * std::sin(th) + b * std::cos(th);
        }
    rope_neox(x.data(), pos.data(), n_tok, n_head, hd, n_rot, float(base));
    // f32 angles at position 4000 carry ~1e-3 rad error, as in ggml.
    EXPECT_LT(max_abs_diff(x, ref), 1e-2) << "n_rot " << n_rot;
    // Position 0 is the identity and dims past n_rot are untouched.
    auto y = randn(size_t(n_tok) * n_head * hd, 4);
    for (int i = 0; i < n_head * hd; ++i) EXPECT_EQ(x[i], y[i]);
    if (n_rot < hd) {
      EXPECT_EQ(x[size_t(3) * n_head * hd + hd - 1], y[size_t(3) * n_head * hd + hd - 1]);
    }
  }
}

TEST(Ops, RopeRejectsBadDims) {
  std::vector<float> x(64);
  int32_t pos = 0;
  EXPECT_THROW(rope_neox(x.data(), &pos, 1, 1, 64, 63, 1e4f), Error);
  EXPECT_THROW(rope_neox(x.data(), &pos, 1, 1, 64, 128, 1e4f), Error);
}

TEST(Ops, SwigluMatchesNaive) {
  auto g = randn(999, 5, 4.0f), u = randn(999, 6);
  std::vector<float> o(g.size());
  swiglu(g.data(), u.data(), int64_t(g.size()), o.data());
  std::vector<double> ref(g.size());
  for (size_t i = 0; i < g.size(); ++i) ref[i] = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
  EXPECT_LT(max_abs_diff(o, ref), 1e-5);
}

TEST(Ops, HalfRoundTrip) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(1e6f), 0x7c00);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite positive half survives the round trip
    ASSERT_EQ(float_to_half(half_to_float(uint16_t(h))), h) << h;
  auto x = randn(10000, 7, 3.0f);
  for (float v : x) EXPECT_NEAR(half_to_float(float_to_half(v)), v, std::abs(v) * 1e-3 + 1e-7);
}

// Attention over a multi-sequence batch with GQA, both cache types, against a naive double version.
TEST(Ops, AttentionGqaMatchesNaive) {
  const int n_head = 8, n_kv = 2, hd = 64, hdv = 48, n_ctx = 40;
  const int group = n_head / n_kv;
  for (KvType type : {KvType::F32, KvType::F16}) {
    // Two sequences with their own caches; tokens attend to different lengths.
    auto k0 = randn(size_t(n_ctx) * n_kv * hd, 10), v0 = randn(size_t(n_ctx) * n_kv * hdv, 11);
    auto k1 = randn(size_t(n_ctx) * n_kv * hd, 12), v1 = randn(size_t(n_ctx) * n_kv * hdv, 13);
    auto store = [&](const std::vector<float>& src) {
      std::vector<uint8_t> d(src.size() * kv_type_size(type));
      kv_store(type, src.data(), int64_t(src.size()), d.data());
      return d;
    };
    auto K0 = store(k0), V0 = store(v0), K1 = store(k1), V1 = store(v1);
    auto rd = [&](const std::vector<float>& src) {  // what the cache holds, as double
      std::vector<double> d(src.size());
      for (size_t i = 0; i < src.size(); ++i)
        d[i] = type == KvType::F32 ? src[i] : half_to_float(float_to_half(src[i]));
      return d;
    };
    auto dk0 = rd(k0), dv0 = rd(v0), dk1 = rd(k1), dv1 = rd(v1);
    const std::vector<AttnKv> kv = {{K0.data(), V0.data(), 1},  {K0.data(), V0.data(), 17},
                                    {K1.data(), V1.data(), 40}, {K1.data(), V1.data(), 3}};
    const int n_tok = int(kv.size());
    auto q = randn(size_t(n_tok) * n_head * hd, 14);
    const float scale = 1.0f / std::sqrt(float(hd));
    std::vector<float> out(size_t(n_tok) * n_head * hdv);
    ThreadPool pool(2);
    std::vector<float> scratch(size_t(pool.size()) * n_ctx);
    attention(q.data(), kv.data(), n_tok, n_head, n_kv, hd, hdv, type, scale, out.data(),
              scratch.data(), n_ctx, pool);
    std::vector<double> ref(out.size());
    for (int t = 0; t < n_tok; ++t) {
      const auto& K = t < 2 ? dk0 : dk1;
      const auto& V = t < 2 ? dv0 : dv1;
      for (int h = 0; h < n_head; ++h) {
        const int hk = h / group;
        std::vector<double> s(size_t(kv[t].n_kv));
        double mx = -1e300, sum = 0;
        for (int p = 0; p < kv[t].n_kv; ++p) {
          double d = 0;
          for (int i = 0; i < hd; ++i)
            d += double(q[(size_t(t) * n_head + h) * hd + i]) * K[(size_t(p) * n_kv + hk) * hd + i];
          s[p] = d * scale;
          mx = std::max(mx, s[p]);
        }
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (int i = 0; i < hdv; ++i) {
          double o = 0;
          for (int p = 0; p < kv[t].n_kv; ++p) o += s[p] / sum * V[(size_t(p) * n_kv + hk) * hdv + i];
          ref[(size_t(t) * n_head + h) * hdv + i] = o;
        }
      }
    }
    EXPECT_LT(max_abs_diff(out, ref), 1e-5) << kv_type_name(type);
    // Token 0 attends to one position: its output is exactly that position's V head.
    for (int h = 0; h < n_head; ++h)
      EXPECT_NEAR(out[size_t(h) * hdv + 5], dv0[size_t(h / group) * hdv + 5], 1e-6);
  }
}

TEST(Ops, MoeRouteTopKRenormalised) {
  const int n_tok = 50, n_exp = 128, k = 8;
  auto logits = randn(size_t(n_tok) * n_exp, 20, 2.0f);
  std::vector<int32_t> ids(size_t(n_tok) * k);
  std::vector<float> w(ids.size());
  moe_route(logits.data(), n_tok, n_exp, k, true, ids.data(), w.data());
  for (int t = 0; t < n_tok; ++t) {
    std::vector<int> order(n_exp);
    std::iota(order.begin(), order.end(), 0);
    const float* l = logits.data() + size_t(t) * n_exp;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
    double mx = l[order[0]], z = 0, zk = 0;
    for (int e = 0; e < n_exp; ++e) z += std::exp(l[e] - mx);
    for (int j = 0; j < k; ++j) zk += std::exp(l[order[j]] - mx) / z;
    double wsum = 0;
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(ids[size_t(t) * k + j], order[j]);
      EXPECT_NEAR(w[size_t(t) * k + j], std::exp(l[order[j]] - mx) / z / zk, 1e-6);
      wsum += w[size_t(t) * k + j];
    }
    EXPECT_NEAR(wsum, 1.0, 1e-5);
  }
  // Without renormalisation the weights are the softmax probabilities.
  moe_route(logits.data(), 1, n_exp, k, false, ids.data(), w.data());
  double z = 0, mx = *std::max_element(logits.begin(), logits.begin() + n_exp);
  for (int e = 0; e < n_exp; ++e) z += std::exp(logits[e] - mx);
  EXPECT_NEAR(w[0], std::exp(logits[ids[0]] - mx) / z, 1e-6);
}

TEST(Ops, MoeRouteTiesPickLowerExpertFirst) {
  // Experts 1, 3, 4, 6 tie for the top; the lower ids win and come first.
  std::vector<float> logits = {0.f, 2.f, 1.f, 2.f, 2.f, -1.f, 2.f, 0.f};
  std::vector<int32_t> ids(3);
  std::vector<float> w(3);
  moe_route(logits.data(), 1, 8, 3, true, ids.data(), w.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 4}));
  for (float x : w) EXPECT_FLOAT_EQ(x, 1.0f / 3.0f);
  // All equal: experts 0..k-1.
  std::vector<float> flat(8, 0.5f);
  moe_route(flat.data(), 1, 8, 3, true, ids.data(), w.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_THROW(moe_route(flat.data(), 1, 8, 9, true, ids.data(), w.data()), Error);
}

TEST(Ops, GetRowsF32AndKvStore) {
  auto tbl = randn(10 * 16, 30);
  std::vector<int32_t> ids = {3, 0, 9, 3};
  std::vector<float> out(ids.size() * 16);
  get_rows(GgmlType::F32, tbl.data(), 16, ids.data(), int64_t(ids.size()), out.data());
  for (size_t t = 0; t < ids.size(); ++t)
    for (int i = 0; i < 16; ++i) EXPECT_EQ(out[t * 16 + i], tbl[size_t(ids[t]) * 16 + i]);
  std::vector<uint16_t> h(16);
  kv_store(KvType::F16, tbl.data(), 16, h.data());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(h[i], float_to_half(tbl[i]));
}

// F32 attention through the AVX-512 group kernel (attend_f32_group_avx512: the query heads of a KV head
// together, 16-position blocks, online softmax) against the scalar F32 path at real sizes: head sizes 64,
// 128, 256 (and 256 keys with 128 values), groups of 1, 2, 8, 16 and 20 (more than a tile: chunks),
// F32 and F16 caches, 1 to 1000 positions (partial blocks), prefill batches and single tokens (whose
// groups are split across the threads). Within 2e-6 of the largest |V| value (f32 rounding; sums in
// another order).
TEST(Ops, AttentionF32GroupKernelMatchesScalar) {
  if (cpu_max_level() < CpuLevel::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  struct Shape { int n_head, n_kv, hd, hdv; };
  const int n_ctx = 1000;
  ThreadPool pool(2);
  std::vector<float> scratch(size_t(pool.size()) * n_ctx);
  int checked = 0;
  for (const Shape s : {Shape{32, 4, 128, 128}, Shape{16, 2, 256, 256}, Shape{8, 8, 64, 64}, Shape{4, 2, 64, 64},
                        Shape{16, 1, 128, 128}, Shape{20, 1, 64, 64}, Shape{8, 2, 256, 128}})
    for (KvType type : {KvType::F32, KvType::F16}) {
      auto k = randn(size_t(n_ctx) * s.n_kv * s.hd, 60 + s.hd), v = randn(size_t(n_ctx) * s.n_kv * s.hdv, 61 + s.hdv);
      std::vector<uint8_t> K(k.size() * kv_type_size(type)), V(v.size() * kv_type_size(type));
      kv_store(type, k.data(), int64_t(k.size()), K.data());
      kv_store(type, v.data(), int64_t(v.size()), V.data());
      for (const std::vector<int32_t>& lens : {std::vector<int32_t>{1, 15, 16, 17, 33, 300, 1000}, std::vector<int32_t>{999}}) {
        std::vector<AttnKv> kv;
        for (int32_t n : lens) kv.push_back({K.data(), V.data(), n});
        auto q = randn(kv.size() * s.n_head * s.hd, 62);
        for (auto& x : q) x *= 2.0f;  // a sharper softmax: more max changes across blocks
        const float scale = 1.0f / std::sqrt(float(s.hd));
        auto run = [&](CpuLevel lvl) {
          const CpuLevel saved = cpu_level();
          set_cpu_level(lvl);
          std::vector<float> out(kv.size() * s.n_head * s.hdv, -7.f);
          attention(q.data(), kv.data(), int64_t(kv.size()), s.n_head, s.n_kv, s.hd, s.hdv, type, scale, out.data(),
                    scratch.data(), n_ctx, pool, AttnMath::F32);
          set_cpu_level(saved);
          return out;
        };
        const auto ref = run(CpuLevel::Scalar), fast = run(CpuLevel::Avx512);
        double worst = 0;
        for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, double(std::fabs(ref[i] - fast[i])));
        float vmax = 0;
        for (float x : v) vmax = std::max(vmax, std::fabs(x));
        if (checked % 9 == 0) std::printf("f32 group attention %d/%d heads %d/%d: worst %.3g of max V %.3g\n", s.n_head, s.n_kv, s.hd, s.hdv, worst, vmax);
        EXPECT_LE(worst, 2e-6 * vmax) << s.n_head << "/" << s.n_kv << " heads, " << s.hd << "/" << s.hdv << " "
                                      << kv_type_name(type) << ", " << kv.size() << " tokens";
        ++checked;
      }
    }
  EXPECT_EQ(checked, 28);
}

// The AVX-512 ggml-f16 attention kernel gives the AVX2 kernel's bits (same arithmetic on 16 lanes):
// head sizes 64, 128 (both kernels) and 96 (AVX-512 declines: head % 64; both run the AVX2 kernel),
// F32 and F16 caches, 1 to 300 positions.
TEST(Ops, AttentionGgmlF16Avx512SameBitsAsAvx2) {
  if (cpu_max_level() < CpuLevel::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  const int n_head = 8, n_kv = 2, n_ctx = 300;
  ThreadPool pool(2);
  std::vector<float> scratch(size_t(pool.size()) * n_ctx);
  for (int hd : {64, 128, 96})
    for (KvType type : {KvType::F32, KvType::F16}) {
      auto k = randn(size_t(n_ctx) * n_kv * hd, 50 + hd), v = randn(size_t(n_ctx) * n_kv * hd, 51 + hd);
      std::vector<uint8_t> K(k.size() * kv_type_size(type)), V(v.size() * kv_type_size(type));
      kv_store(type, k.data(), int64_t(k.size()), K.data());
      kv_store(type, v.data(), int64_t(v.size()), V.data());
      const std::vector<AttnKv> kv = {{K.data(), V.data(), 1}, {K.data(), V.data(), 9}, {K.data(), V.data(), 77},
                                      {K.data(), V.data(), 300}};
      auto q = randn(kv.size() * n_head * hd, 52);
      for (auto& x : q) x *= 3.0f;  // sharper softmax: more max changes and underflowing weights
      const float scale = 1.0f / std::sqrt(float(hd));
      std::vector<float> out[2];
      const CpuLevel saved = cpu_level();  // the level STRATA_CPU chose, for the tests that follow
      for (int i = 0; i < 2; ++i) {
        set_cpu_level(i ? CpuLevel::Avx512 : CpuLevel::Avx2);
        out[i].assign(kv.size() * n_head * hd, -1.f);
        attention(q.data(), kv.data(), int64_t(kv.size()), n_head, n_kv, hd, hd, type, scale, out[i].data(),
                  scratch.data(), n_ctx, pool, AttnMath::GgmlF16);
      }
      set_cpu_level(saved);
      EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4), 0) << "head " << hd << " " << kv_type_name(type);
    }
}

// ggml's flash-attention arithmetic: the AVX2 kernel matches the scalar reference (up to f32 sum
// order, which can move an f16 rounding by one step) and both stay close to plain f32 attention.
TEST(Ops, AttentionGgmlF16KernelsAgree) {
  const int n_head = 8, n_kv = 2, hd = 128, n_ctx = 300;
  ThreadPool pool(2);
  std::vector<float> scratch(size_t(pool.size()) * n_ctx);
  for (KvType type : {KvType::F32, KvType::F16}) {
    auto k = randn(size_t(n_ctx) * n_kv * hd, 40), v = randn(size_t(n_ctx) * n_kv * hd, 41);
    std::vector<uint8_t> K(k.size() * kv_type_size(type)), V(v.size() * kv_type_size(type));
    kv_store(type, k.data(), int64_t(k.size()), K.data());
    kv_store(type, v.data(), int64_t(v.size()), V.data());
    const std::vector<AttnKv> kv = {{K.data(), V.data(), 1}, {K.data(), V.data(), 77},
                                    {K.data(), V.data(), 300}};
    auto q = randn(kv.size() * n_head * hd, 42);
    const float scale = 1.0f / std::sqrt(float(hd));
    auto run = [&](AttnMath m, CpuLevel lvl) {
      const CpuLevel saved = cpu_level();  // the level STRATA_CPU chose, for the tests that follow
      set_cpu_level(lvl);
      std::vector<float> out(kv.size() * n_head * hd);
      attention(q.data(), kv.data(), int64_t(kv.size()), n_head, n_kv, hd, hd, type, scale,
                out.data(), scratch.data(), n_ctx, pool, m);
      set_cpu_level(saved);
      return out;
    };
    const auto ref = run(AttnMath::F32, CpuLevel::Scalar);
    const auto scalar = run(AttnMath::GgmlF16, CpuLevel::Scalar);
    double d_ref = 0;
    for (size_t i = 0; i < ref.size(); ++i) d_ref = std::max(d_ref, double(std::abs(ref[i] - scalar[i])));
    EXPECT_LT(d_ref, 5e-3) << kv_type_name(type);
    if (cpu_max_level() >= CpuLevel::Avx2) {
      const auto fast = run(AttnMath::GgmlF16, CpuLevel::Avx2);
      double d = 0;
      for (size_t i = 0; i < ref.size(); ++i) d = std::max(d, double(std::abs(fast[i] - scalar[i])));
      EXPECT_LT(d, 2e-3) << kv_type_name(type);
    } else {
      GTEST_SKIP() << "no AVX2 on this CPU";
    }
  }
}
