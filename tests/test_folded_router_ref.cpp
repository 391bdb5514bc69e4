// CPU references of the folded router (cuda/host/folded_router_ref.h), which the GPU kernels are tested
// against (tests/cuda/test_folded_router.cu). Here the references themselves, against the plain router:
//  * fold . [x; att] == (router * g) . (x + wo . att) in double (the fold's meaning);
//  * moe_gate_up_routed picks the top k of the router's logits on rmsnorm(mid) * g, gives the softmax
//    weights of those logits (renormalized, or not), quantizes mid * s * g as q8ref::quantize does, and
//    runs moe_gate_up on them;
//  * ties go to the lower id and NaN logits last.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/host/folded_router_ref.h"
#include "cuda/host/q8_reference.h"
#include "quant/quantize.h"

namespace strata {
namespace {

namespace q8ref = cuda::q8ref;
using q8ref::Q8Ds;

constexpr int64_t kEmbd = 256, kAtt = 96, kFf = 64;
constexpr int kExperts = 12, kSlots = 2;

struct Experts {
  std::vector<uint8_t> slots;
  std::vector<int32_t> table;
  q8ref::ExpertView view;
};

// kExperts experts over kSlots slots of Q8_0 gate, up and down (expert e in slot e % kSlots).
Experts make_experts(std::mt19937& rng) {
  Experts x;
  const GgmlType t = GgmlType::Q8_0;
  const int64_t grb = int64_t(row_bytes(t, kEmbd)), drb = int64_t(row_bytes(t, kFf));
  q8ref::ExpertView& v = x.view;
  v.gate_type = v.up_type = v.down_type = t;
  v.gate_off = 0, v.up_off = grb * kFf, v.down_off = 2 * grb * kFf;
  v.slot_bytes = v.down_off + drb * kEmbd;
  v.n_embd = kEmbd, v.n_ff = kFf;
  x.slots.resize(size_t(v.slot_bytes * kSlots));
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<float> row(kEmbd);
  for (int s = 0; s < kSlots; ++s) {
    uint8_t* base = x.slots.data() + s * v.slot_bytes;
    for (int64_t r = 0; r < 2 * kFf; ++r) {
      for (auto& f : row) f = nd(rng);
      quantize_row(t, row.data(), base + r * grb, kEmbd);
    }
    for (int64_t r = 0; r < kEmbd; ++r) {
      for (int64_t c = 0; c < kFf; ++c) row[size_t(c)] = nd(rng);
      quantize_row(t, row.data(), base + v.down_off + r * drb, kFf);
    }
  }
  v.slots = x.slots.data();
  x.table.resize(kExperts);
  for (int e = 0; e < kExperts; ++e) x.table[size_t(e)] = e % kSlots;
  return x;
}

TEST(FoldedRouterRef, FoldIsTheRouterThroughTheNormWeightAndWo) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> router(kExperts * kEmbd), g(kEmbd), wo(kEmbd * kAtt), x(kEmbd), att(kAtt);
  for (auto* v : {&router, &g, &wo, &x, &att})
    for (auto& f : *v) f = nd(rng);
  std::vector<float> fold(kExperts * (kEmbd + kAtt));
  q8ref::fold_router(router.data(), g.data(), wo.data(), kExperts, kEmbd, kAtt, fold.data());
  for (int e = 0; e < kExperts; ++e) {
    double lhs = 0, rhs = 0, mag = 0;
    for (int64_t c = 0; c < kEmbd + kAtt; ++c)
      lhs += double(fold[size_t(e * (kEmbd + kAtt) + c)]) * (c < kEmbd ? x[size_t(c)] : att[size_t(c - kEmbd)]);
    for (int64_t r = 0; r < kEmbd; ++r) {
      double h = x[size_t(r)];
      for (int64_t i = 0; i < kAtt; ++i) h += double(wo[size_t(r * kAtt + i)]) * att[size_t(i)];
      const double term = double(router[size_t(e * kEmbd + r)]) * g[size_t(r)] * h;
      rhs += term;
      mag += std::fabs(term);
    }
    EXPECT_LE(std::fabs(lhs - rhs), 1e-6 * mag) << "expert " << e;
  }
}

// The routed reference against the plain router on rmsnorm(mid) * g.
void check_routed(bool norm, int k) {
  std::mt19937 rng(9 + k);
  std::normal_distribution<float> nd(0.f, 1.f);
  const Experts ex = make_experts(rng);
  std::vector<float> router(kExperts * kEmbd), g(kEmbd), mid(kEmbd);
  for (auto& f : router) f = 0.1f * nd(rng);
  for (auto& f : g) f = 1.f + 0.2f * nd(rng);
  for (auto& f : mid) f = nd(rng);
  const float eps = 1e-6f;
  // What wo_router would write: partial sums of mid^2 (4 of them) and raw = (router * g) . mid.
  std::vector<float> ss(4, 0.f), raw(kExperts);
  for (int64_t c = 0; c < kEmbd; ++c) ss[size_t(c % 4)] += mid[size_t(c)] * mid[size_t(c)];
  for (int e = 0; e < kExperts; ++e) {
    double a = 0;
    for (int64_t c = 0; c < kEmbd; ++c) a += double(router[size_t(e * kEmbd + c)]) * g[size_t(c)] * mid[size_t(c)];
    raw[size_t(e)] = float(a);
  }
  std::vector<int32_t> ids(k);
  std::vector<float> wts(k);
  std::vector<int8_t> hq(size_t(k * kFf)), xq(kEmbd);
  std::vector<Q8Ds> hds(size_t(k * kFf / 32)), xds(kEmbd / 32);
  const q8ref::FoldedRoute r{mid.data(), g.data(), eps, ss.data(), 4, raw.data(), kExperts, norm, ids.data(),
                             wts.data()};
  q8ref::moe_gate_up_routed(ex.view, ex.table.data(), r, k, hq.data(), hds.data(), xq.data(), xds.data());

  // The plain router: s from the exact sum, logits on the normed mid, softmax, top k.
  double sum2 = 0;
  for (float v : mid) sum2 += double(v) * v;
  const double s = 1.0 / std::sqrt(sum2 / kEmbd + eps);
  std::vector<double> logits(kExperts), p(kExperts);
  for (int e = 0; e < kExperts; ++e) {
    double a = 0;
    for (int64_t c = 0; c < kEmbd; ++c) a += double(router[size_t(e * kEmbd + c)]) * (mid[size_t(c)] * s * g[size_t(c)]);
    logits[size_t(e)] = a;
  }
  const double mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (int e = 0; e < kExperts; ++e) z += p[size_t(e)] = std::exp(logits[size_t(e)] - mx);
  std::vector<int32_t> order(kExperts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  double chosen = 0;
  for (int j = 0; j < k; ++j) chosen += p[size_t(order[size_t(j)])] / z;
  for (int j = 0; j < k; ++j) {
    EXPECT_EQ(ids[size_t(j)], order[size_t(j)]) << "rank " << j;
    const double w = p[size_t(order[size_t(j)])] / z / (norm ? chosen : 1.0);
    EXPECT_NEAR(wts[size_t(j)], w, 1e-5 * w + 1e-7) << "rank " << j << (norm ? " (renormalized)" : "");
  }
  // The activations: q8ref::quantize of mid * s * g (s in f32 as the kernel computes it), and the product
  // is moe_gate_up's on them.
  const float sf = 1.0f / std::sqrt(float((double(ss[0]) + ss[1] + ss[2] + ss[3]) / double(kEmbd)) + eps);
  std::vector<float> y(kEmbd);
  for (int64_t c = 0; c < kEmbd; ++c) y[size_t(c)] = mid[size_t(c)] * sf * g[size_t(c)];
  std::vector<int8_t> xq2(kEmbd);
  std::vector<Q8Ds> xds2(kEmbd / 32);
  q8ref::quantize(y.data(), 1, kEmbd, xq2.data(), xds2.data());
  EXPECT_EQ(xq, xq2);
  std::vector<int8_t> hq2(size_t(k * kFf));
  std::vector<Q8Ds> hds2(size_t(k * kFf / 32));
  q8ref::moe_gate_up(ex.view, ex.table.data(), xq2.data(), xds2.data(), ids.data(), 1, k, hq2.data(), hds2.data());
  EXPECT_EQ(hq, hq2);
}

TEST(FoldedRouterRef, RoutedGateUpIsTheRouterOnTheNormedMid) {
  check_routed(true, 4);
  check_routed(false, 3);
}

TEST(FoldedRouterRef, TiesGoToTheLowerIdAndNanLast) {
  std::mt19937 rng(5);
  const Experts ex = make_experts(rng);
  std::vector<float> g(kEmbd, 1.f), mid(kEmbd, 0.5f), ss{float(kEmbd) * 0.25f};
  std::vector<float> raw(kExperts, 0.f);
  raw[7] = NAN, raw[3] = 2.f, raw[9] = 2.f, raw[1] = 1.f, raw[0] = NAN;
  const int k = 4;
  std::vector<int32_t> ids(k);
  std::vector<float> wts(k);
  std::vector<int8_t> hq(size_t(k * kFf)), xq(kEmbd);
  std::vector<Q8Ds> hds(size_t(k * kFf / 32)), xds(kEmbd / 32);
  const q8ref::FoldedRoute r{mid.data(), g.data(), 1e-6f, ss.data(), 1, raw.data(), kExperts, true, ids.data(),
                             wts.data()};
  q8ref::moe_gate_up_routed(ex.view, ex.table.data(), r, k, hq.data(), hds.data(), xq.data(), xds.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 9, 1, 2}));  // 2.0 (ids 3, 9), 1.0 (1), then the zeros from id 2
}

}  // namespace
}  // namespace strata
