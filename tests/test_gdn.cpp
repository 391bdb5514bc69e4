// Gated DeltaNet ops (src/cpu/gdn.h): each op against its plain reference at real sizes, and the
// chunked delta rule against the recurrent one (Qwen3-Next-80B-A3B: Hk 16, Hv 32, D 128).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/error.h"
#include "cpu/cpu_features.h"
#include "cpu/gdn.h"
#include "cpu/ops.h"

namespace strata {
namespace {

std::vector<float> randv(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// max |a-b| / max(1, max|b|)
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0, ref = 1.0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, double(std::fabs(a[i] - b[i])));
    ref = std::max(ref, double(std::fabs(b[i])));
  }
  return m / ref;
}

TEST(GdnConv, MatchesReferenceAndCarriesState) {
  std::mt19937 rng(1);
  const int64_t C = 8192, T = 37;
  const int K = 4;
  auto x = randv(T * C, rng), w = randv(C * K, rng), st0 = randv((K - 1) * C, rng);
  std::vector<float> y(T * C), yr(T * C);
  auto st = st0, str = st0;
  gdn_conv1d_silu(x.data(), T, C, K, st.data(), w.data(), y.data());
  gdn_conv1d_silu_ref(x.data(), T, C, K, str.data(), w.data(), yr.data());
  EXPECT_LT(rel_err(y, yr), 1e-6);
  EXPECT_EQ(st, str);
  // the final state is the last K-1 inputs
  for (int64_t i = 0; i < (K - 1) * C; ++i) ASSERT_EQ(st[i], x[(T - K + 1) * C + i]);

  // Same tokens in pieces of 1, 2 and the rest give the same outputs as one call.
  auto sp = st0;
  std::vector<float> yp(T * C);
  int64_t t = 0;
  for (int64_t n : {int64_t(1), int64_t(2), int64_t(1), T - 4}) {
    gdn_conv1d_silu(x.data() + t * C, n, C, K, sp.data(), w.data(), yp.data() + t * C);
    t += n;
  }
  EXPECT_LT(rel_err(yp, y), 1e-6);
  EXPECT_EQ(sp, st);
}

TEST(GdnConv, HandComputedValue) {
  // one channel, K 3: state [1, 2], x [3, 4], w [0.5, -1, 2]
  const float w[3] = {0.5f, -1.0f, 2.0f};
  float st[2] = {1.0f, 2.0f};
  const float x[2] = {3.0f, 4.0f};
  float y[2];
  gdn_conv1d_silu(x, 2, 1, 3, st, w, y);
  auto silu = [](double a) { return a / (1 + std::exp(-a)); };
  EXPECT_NEAR(y[0], silu(0.5 * 1 - 1 * 2 + 2 * 3), 1e-6);
  EXPECT_NEAR(y[1], silu(0.5 * 2 - 1 * 3 + 2 * 4), 1e-6);
  EXPECT_EQ(st[0], 3.0f);
  EXPECT_EQ(st[1], 4.0f);
}

TEST(GdnL2Norm, UnitRowsAndEps) {
  std::mt19937 rng(2);
  auto x = randv(64 * 128, rng);
  auto xr = x;
  l2_norm_rows(x.data(), 64, 128, 1e-6f);
  l2_norm_rows_ref(xr.data(), 64, 128, 1e-6f);
  EXPECT_LT(rel_err(x, xr), 1e-6);
  double ss = 0;
  for (int i = 0; i < 128; ++i) ss += double(x[i]) * x[i];
  EXPECT_NEAR(ss, 1.0, 1e-5);
  std::vector<float> z(8, 0.0f);
  l2_norm_rows(z.data(), 1, 8, 1e-6f);  // zero row stays finite (divides by eps)
  for (float v : z) EXPECT_EQ(v, 0.0f);
}

struct DeltaInputs {
  DeltaRuleShape s;
  std::vector<float> q, k, v, g, beta, state;
};

DeltaInputs make_delta(int64_t T, int64_t Hk, int64_t Hv, int64_t D, uint32_t seed, float g_lo,
                       float g_hi) {
  std::mt19937 rng(seed);
  DeltaInputs in;
  in.s = {T, Hk, Hv, D};
  in.q = randv(T * Hk * D, rng);
  in.k = randv(T * Hk * D, rng);
  in.v = randv(T * Hv * D, rng);
  in.g = randv(T * Hv, rng, g_lo, g_hi);
  in.beta = randv(T * Hv, rng, 0.0f, 1.0f);
  in.state = randv(Hv * D * D, rng, -0.5f, 0.5f);
  l2_norm_rows(in.q.data(), T * Hk, D, 1e-6f);
  l2_norm_rows(in.k.data(), T * Hk, D, 1e-6f);
  return in;
}

TEST(GdnDeltaRule, RecurrentMatchesReference) {
  ThreadPool pool(2);
  auto in = make_delta(9, 16, 32, 128, 3, -2.0f, 0.0f);
  const float scale = 1.0f / std::sqrt(128.0f);
  std::vector<float> o(in.v.size()), orf(in.v.size());
  auto st = in.state, str = in.state;
  gdn_delta_rule_recurrent(in.s, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                           in.beta.data(), scale, st.data(), o.data(), pool);
  gdn_delta_rule_recurrent_ref(in.s, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                               in.beta.data(), scale, str.data(), orf.data(), pool);
  EXPECT_LT(rel_err(o, orf), 1e-5);
  EXPECT_LT(rel_err(st, str), 1e-5);
}

TEST(GdnDeltaRule, HandComputedSingleStep) {
  // D 2, one head: S0 = [[1,2],[3,4]], g = ln(0.5), beta 0.5, k = (1,0), v = (1,1), q = (0,1), scale 1
  ThreadPool pool(1);
  DeltaRuleShape s{1, 1, 1, 2};
  float S[4] = {1, 2, 3, 4};
  const float q[2] = {0, 1}, k[2] = {1, 0}, v[2] = {1, 1}, g[1] = {std::log(0.5f)}, b[1] = {0.5f};
  float o[2];
  gdn_delta_rule_recurrent(s, q, k, v, g, b, 1.0f, S, o, pool);
  // decayed S = [[.5,1],[1.5,2]]; S k = (.5, 1.5); u = .5*((1,1)-(.5,1.5)) = (.25,-.25)
  // S += u k^T -> [[.75,1],[1.25,2]];  o = S q = (1, 2)
  EXPECT_NEAR(S[0], 0.75f, 1e-6);
  EXPECT_NEAR(S[2], 1.25f, 1e-6);
  EXPECT_NEAR(o[0], 1.0f, 1e-6);
  EXPECT_NEAR(o[1], 2.0f, 1e-6);
}

// The chunked (prefill) form equals the recurrent (decode) form: outputs at every position and the
// final state, at real sizes, across chunk boundaries (T not a multiple of 64) and decay regimes.
void expect_chunked_equals_recurrent(int64_t T, int64_t Hk, int64_t Hv, int64_t D, float g_lo,
                                     float g_hi, int chunk, uint32_t seed) {
  ThreadPool pool(2);
  auto in = make_delta(T, Hk, Hv, D, seed, g_lo, g_hi);
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> oc(in.v.size()), orr(in.v.size());
  auto sc = in.state, sr = in.state;
  gdn_delta_rule_chunked(in.s, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                         scale, sc.data(), oc.data(), pool, chunk);
  gdn_delta_rule_recurrent_ref(in.s, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                               in.beta.data(), scale, sr.data(), orr.data(), pool);
  EXPECT_LT(rel_err(oc, orr), 2e-5) << "T " << T << " chunk " << chunk;
  EXPECT_LT(rel_err(sc, sr), 2e-5) << "T " << T << " chunk " << chunk;
}

TEST(GdnDeltaRule, ChunkedMatchesRecurrentRealSize) {
  expect_chunked_equals_recurrent(150, 16, 32, 128, -1.0f, 0.0f, 64, 4);
}
TEST(GdnDeltaRule, ChunkedMatchesRecurrentStrongDecay) {
  expect_chunked_equals_recurrent(100, 2, 4, 64, -12.0f, -3.0f, 64, 5);
}
TEST(GdnDeltaRule, ChunkedMatchesRecurrentNoDecay) {
  expect_chunked_equals_recurrent(70, 2, 4, 64, 0.0f, 0.0f, 64, 6);
}
TEST(GdnDeltaRule, ChunkedOddChunkSizes) {
  for (int c : {1, 7, 33}) expect_chunked_equals_recurrent(50, 4, 8, 32, -1.0f, 0.0f, c, 7 + c);
}

TEST(GdnDeltaRule, ChunkedInPiecesEqualsOneCall) {
  // A prompt processed in ubatches (state carried between calls) equals one call.
  ThreadPool pool(2);
  const int64_t T = 130, Hk = 2, Hv = 4, D = 64;
  auto in = make_delta(T, Hk, Hv, D, 8, -1.0f, 0.0f);
  const float scale = 0.125f;
  std::vector<float> o1(in.v.size()), o2(in.v.size());
  auto s1 = in.state, s2 = in.state;
  gdn_delta_rule_chunked(in.s, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                         scale, s1.data(), o1.data(), pool);
  int64_t t = 0;
  for (int64_t n : {int64_t(7), int64_t(1), int64_t(70), T - 78}) {
    DeltaRuleShape sp{n, Hk, Hv, D};
    if (n == 1)  // a decode step in the middle
      gdn_delta_rule_recurrent(sp, in.q.data() + t * Hk * D, in.k.data() + t * Hk * D, in.v.data() + t * Hv * D,
         in.g.data() + t * Hv, in.beta.data() + t * Hv, scale, s2.data(), o2.data() + t * Hv * D,
         pool);
    else
      gdn_delta_rule_chunked(sp, in.q.data() + t * Hk * D, in.k.data() + t * Hk * D,
                             in.v.data() + t * Hv * D, in.g.data() + t * Hv,
                             in.beta.data() + t * Hv, scale, s2.data(), o2.data() + t * Hv * D,
                             pool);
    t += n;
  }
  EXPECT_LT(rel_err(o2, o1), 2e-5);
  EXPECT_LT(rel_err(s2, s1), 2e-5);
}

// The scalar and the AVX2 primitives give the same results (both forms), up to summation order.
TEST(GdnDeltaRule, CpuLevelsAgree) {
  if (cpu_max_level() < CpuLevel::Avx2) GTEST_SKIP() << "no AVX2 on this CPU";
  ThreadPool pool(2);
  auto in = make_delta(77, 16, 32, 128, 12, -1.0f, 0.0f);
  const float scale = 1.0f / std::sqrt(128.0f);
  const CpuLevel saved = cpu_level();
  std::vector<std::vector<float>> outs, states;
  for (CpuLevel lv : {CpuLevel::Scalar, CpuLevel::Avx2}) {
    set_cpu_level(lv);
    for (bool chunked : {false, true}) {
      std::vector<float> o(in.v.size());
      auto st = in.state;
      if (chunked)
        gdn_delta_rule_chunked(in.s, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                               in.beta.data(), scale, st.data(), o.data(), pool);
      else
        gdn_delta_rule_recurrent(in.s, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                 in.beta.data(), scale, st.data(), o.data(), pool);
      outs.push_back(o);
      states.push_back(st);
    }
  }
  set_cpu_level(saved);
  for (size_t i = 1; i < outs.size(); ++i) {
    EXPECT_LT(rel_err(outs[i], outs[0]), 2e-5) << i;
    EXPECT_LT(rel_err(states[i], states[0]), 2e-5) << i;
  }
}

TEST(GdnDeltaRule, BadShapeIsAnError) {
  ThreadPool pool(1);
  DeltaRuleShape s{1, 3, 4, 8};  // 4 value heads, 3 key heads
  std::vector<float> buf(4 * 8 * 8, 0.0f);
  EXPECT_THROW(gdn_delta_rule_recurrent(s, buf.data(), buf.data(), buf.data(), buf.data(),
                                        buf.data(), 1.0f, buf.data(), buf.data(), pool),
               Error);
}

TEST(GatedRmsNorm, MatchesReference) {
  std::mt19937 rng(9);
  const int64_t rows = 3 * 32, D = 128;
  auto x = randv(rows * D, rng), z = randv(rows * D, rng, -4, 4), w = randv(D, rng);
  std::vector<float> y(rows * D), yr(rows * D);
  gated_rms_norm(x.data(), z.data(), w.data(), rows, D, 1e-6f, y.data());
  gated_rms_norm_ref(x.data(), z.data(), w.data(), rows, D, 1e-6f, yr.data());
  EXPECT_LT(rel_err(y, yr), 1e-6);
  // in place
  gated_rms_norm(x.data(), z.data(), w.data(), rows, D, 1e-6f, x.data());
  EXPECT_EQ(x, y);
  // hand value: x = (1, -1), w = (2, 3), z = (0, big): rms 1 -> (2*silu(0), -3*z)
  const float hx[2] = {1, -1}, hz[2] = {0, 30}, hw[2] = {2, 3};
  float hy[2];
  gated_rms_norm(hx, hz, hw, 1, 2, 0.0f, hy);
  EXPECT_NEAR(hy[0], 0.0f, 1e-6);
  EXPECT_NEAR(hy[1], -90.0f, 1e-3);
}

// qwen3next's attention rotates 16 of 64 dims (rope.dimension_count 16, base 1e7) with cpu::rope_neox:
// against a double-precision reference at that geometry; dims past n_rot pass through untouched.
TEST(RopeNeoxPartial, Qwen3NextGeometry) {
  std::mt19937 rng(10);
  const int64_t T = 20, H = 4, D = 64;
  const int n_rot = 16, half = n_rot / 2;
  const double base = 1e7;
  auto x = randv(T * H * D, rng);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = int32_t(t * 37);  // pos[0] = 0
  auto a = x;
  cpu::rope_neox(a.data(), pos.data(), T, int(H), int(D), n_rot, float(base));
  double max_err = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* xr = x.data() + (t * H + h) * D;
      const float* ar = a.data() + (t * H + h) * D;
      for (int i = 0; i < half; ++i) {
        const double th = pos[t] * std::pow(base, -2.0 * i / n_rot);
        const double r0 = xr[i] * std::cos(th) - xr[i + half] * std::sin(th);
        const double r1 = xr[i] * std::sin(th) + xr[i + half] * std::cos(th);
        max_err = std::max({max_err, std::fabs(ar[i] - r0), std::fabs(ar[i + half] - r1)});
      }
      for (int64_t i = n_rot; i < D; ++i) ASSERT_EQ(ar[i], xr[i]);
    }
  EXPECT_LT(max_err, 1e-4);
  for (int64_t i = 0; i < H * D; ++i) ASSERT_EQ(a[i], x[i]);  // position 0 is the identity
}

TEST(GdnGates, MatchesReferenceAndGroupedLayout) {
  std::mt19937 rng(11);
  const int64_t T = 5, Hk = 16, Hv = 32;
  auto ba = randv(T * 2 * Hv, rng, -30, 30), a = randv(Hv, rng, -3, 0), dt = randv(Hv, rng);
  std::vector<float> g(T * Hv), b(T * Hv), gr(T * Hv), br(T * Hv);
  gdn_gates(ba.data(), T, Hk, Hv, a.data(), dt.data(), g.data(), b.data());
  gdn_gates_ref(ba.data(), T, Hk, Hv, a.data(), dt.data(), gr.data(), br.data());
  EXPECT_LT(rel_err(g, gr), 1e-6);
  EXPECT_LT(rel_err(b, br), 1e-6);
  // Hk 1, Hv 2: ba = [b0, b1, a0, a1]
  const float ba1[4] = {0.0f, 100.0f, 0.0f, -100.0f}, a1[2] = {-2.0f, -1.0f}, dt1[2] = {0.0f, 0.0f};
  float g1[2], b1[2];
  gdn_gates(ba1, 1, 1, 2, a1, dt1, g1, b1);
  EXPECT_NEAR(b1[0], 0.5f, 1e-6);
  EXPECT_NEAR(b1[1], 1.0f, 1e-6);
  EXPECT_NEAR(g1[0], -2.0f * std::log(2.0f), 1e-6);  // softplus(0) = ln 2
  EXPECT_NEAR(g1[1], 0.0f, 1e-6);                    // softplus(-100) ~ 0
}

TEST(GdnUnpack, LegacyQkvzLayout) {
  // Hk 2, Hv 4 (r 2), D 1: per key head j: q, k, v(2), z(2)
  const float mixed[12] = {1, 2, 3, 4, 5, 6, 11, 12, 13, 14, 15, 16};
  float qkv[8], z[4];
  gdn_unpack_qkvz(mixed, 1, 2, 4, 1, qkv, z);
  const float eq[8] = {1, 11, 2, 12, 3, 4, 13, 14}, ez[4] = {5, 6, 15, 16};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(qkv[i], eq[i]) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(z[i], ez[i]) << i;
}

TEST(GdnSplit, SplitsAndNormalises) {
  // Hk 1, Hv 2, D 2: conv row = q(2) k(2) v(4)
  const float conv[8] = {3, 4, 0, 2, 1, 2, 3, 4};
  float q[2], k[2], v[4];
  gdn_split_qkv(conv, 1, 1, 2, 2, 1e-6f, q, k, v);
  EXPECT_NEAR(q[0], 0.6f, 1e-6);
  EXPECT_NEAR(q[1], 0.8f, 1e-6);
  EXPECT_NEAR(k[1], 1.0f, 1e-6);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(v[i], float(i + 1));
}

TEST(GatedAttention, SplitQGateAndSigmoid) {
  const float qg[8] = {1, 2, 3, 4, 5, 6, 7, 8};  // 2 heads of D 2: (q, gate) per head
  float q[4], gate[4];
  split_q_gate(qg, 1, 2, 2, q, gate);
  const float eq[4] = {1, 2, 5, 6}, eg[4] = {3, 4, 7, 8};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q[i], eq[i]);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(gate[i], eg[i]);
  float x[2] = {2.0f, 2.0f};
  const float gl[2] = {0.0f, -100.0f};
  mul_sigmoid(x, gl, 2);
  EXPECT_NEAR(x[0], 1.0f, 1e-6);
  EXPECT_NEAR(x[1], 0.0f, 1e-6);
  float y[4] = {1, 1, 1, 1};
  const float xs[4] = {2, 4, 6, 8}, lg[2] = {0.0f, 100.0f};
  add_sigmoid_scaled(y, xs, lg, 2, 2);
  EXPECT_NEAR(y[0], 2.0f, 1e-6);
  EXPECT_NEAR(y[3], 9.0f, 1e-5);
}

}  // namespace
}  // namespace strata
