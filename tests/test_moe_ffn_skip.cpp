// moe_experts with negative ids (the GPU backend's CPU pool): the pairs set to -1 are skipped, so the
// outputs of a split (ids masked one way + ids masked the other way) add up to the unsplit output, and
// a token with every pair masked gets zeros.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/thread_pool.h"
#include "model/moe_ffn.h"

using namespace strata;

namespace {

Weight f32_stack(std::vector<float>& buf, int64_t ne0, int64_t ne1, int64_t ne2, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 0.1f);
  buf.resize(size_t(ne0 * ne1 * ne2));
  for (float& v : buf) v = nd(rng);
  Weight w;
  w.type = GgmlType::F32;
  w.data = reinterpret_cast<const uint8_t*>(buf.data());
  w.ne[0] = ne0;
  w.ne[1] = ne1;
  w.ne[2] = ne2;
  return w;
}

TEST(MoeExpertsSkip, SplitHalvesAddUpAndMaskedTokenIsZero) {
  const int64_t E = 64, F = 48, n = 5;
  const int X = 8, k = 3;
  std::mt19937 rng(7);
  std::vector<float> gb, ub, db;
  ExpertWeights ew{f32_stack(gb, E, F, X, rng), f32_stack(ub, E, F, X, rng), f32_stack(db, F, E, X, rng)};
  std::vector<float> x(size_t(n * E)), w(size_t(n * k));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : x) v = nd(rng);
  for (float& v : w) v = std::abs(nd(rng));
  std::vector<int32_t> ids(size_t(n * k));
  for (int64_t t = 0; t < n; ++t)
    for (int j = 0; j < k; ++j) ids[size_t(t * k + j)] = int32_t((t * 3 + j * 2) % X);

  ThreadPool pool(2);
  MoeScratch s(n, k, X, E, F);
  cpu::MatmulBatch mb(2, n);
  std::vector<float> full(size_t(n * E)), a(size_t(n * E), 99.0f), b(size_t(n * E), 99.0f);
  moe_experts(ew, x.data(), n, ids.data(), w.data(), k, full.data(), s, mb, pool, MatmulMode::Exact);

  // "resident" = even expert ids go to half A, odd to half B; token 4 goes entirely to B.
  std::vector<int32_t> ia = ids, ib = ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool to_a = ids[i] % 2 == 0 && i / size_t(k) != 4;
    (to_a ? ib : ia)[i] = -1;
  }
  moe_experts(ew, x.data(), n, ia.data(), w.data(), k, a.data(), s, mb, pool, MatmulMode::Exact);
  moe_experts(ew, x.data(), n, ib.data(), w.data(), k, b.data(), s, mb, pool, MatmulMode::Exact);
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    max_err = std::max(max_err, double(std::abs(a[i] + b[i] - full[i])));
    max_ref = std::max(max_ref, double(std::abs(full[i])));
  }
  std::printf("[ moe split ] max |a+b-full| %.3e (max |full| %.3e)\n", max_err, max_ref);
  EXPECT_LE(max_err, 1e-5 * std::max(1.0, max_ref));
  EXPECT_GT(max_ref, 1e-3);  // the check is not vacuous
  for (int64_t i = 0; i < E; ++i) ASSERT_EQ(a[size_t(4 * E + i)], 0.0f) << "token 4 masked in A, i=" << i;

  // Everything masked: all zeros (and no read of the weights).
  std::vector<int32_t> none(ids.size(), -1);
  std::vector<float> z(size_t(n * E), 5.0f);
  moe_experts(ew, x.data(), n, none.data(), w.data(), k, z.data(), s, mb, pool, MatmulMode::Exact);
  for (float v : z) ASSERT_EQ(v, 0.0f);

  // Out-of-range ids are still an error.
  std::vector<int32_t> bad = ids;
  bad[0] = X;
  EXPECT_THROW(moe_experts(ew, x.data(), n, bad.data(), w.data(), k, z.data(), s, mb, pool,
                           MatmulMode::Exact),
               Error);
}

}  // namespace
