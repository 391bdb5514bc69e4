// The AVX2 Q8_K activation quantizer must give the very bytes of the scalar one (every fast-mode dot
// product reads them; the fixtures' KL bounds were measured with the scalar rule).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/cpu_features.h"
#include "quant/vec_dot.h"

using namespace strata;

namespace {

void expect_same(const std::vector<float>& x, const char* what) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<q::BlockQ8_K> a(n / q::QK_K), b(n / q::QK_K);
  std::memset(a.data(), 0x5a, a.size() * sizeof(q::BlockQ8_K));
  std::memset(b.data(), 0xa5, b.size() * sizeof(q::BlockQ8_K));
  q::quantize_act_q8_k(x.data(), a.data(), n);
  q::quantize_act_q8_k_avx2(x.data(), b.data(), n);
  ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(q::BlockQ8_K))) << what;
}

TEST(ActQuantAvx2, SameBytesAsScalar) {
  if (cpu_max_level() < CpuLevel::Avx2) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(41);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(-3.f, 3.f);
  for (int64_t n : {256, 768, 2048}) {
    for (int rep = 0; rep < 200; ++rep) {
      std::vector<float> x(n);
      const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
      for (auto& v : x) v = (rep % 2 ? nd(rng) : ud(rng)) * scale;
      if (rep % 5 == 0) x[rng() % n] *= 50.f;  // an outlier sets the scale
      expect_same(x, "random");
    }
  }
  // Exact ties: max = -127 gives iscale 1, so k + 0.5 values must round half to even.
  std::vector<float> t(256);
  for (int i = 0; i < 256; ++i) t[i] = (i % 2 ? -1.f : 1.f) * (static_cast<float>(i % 127) + 0.5f);
  t[7] = -127.f;
  expect_same(t, "ties");
  // Largest magnitude twice with both signs (the first one found sets the sign of the scale), both orders.
  std::vector<float> s(512, 0.25f);
  s[3] = 2.f, s[9] = -2.f, s[256 + 5] = -2.f, s[256 + 200] = 2.f;
  expect_same(s, "sign ties");
  // Zero, negative-zero and denormal blocks, and a block with a NaN (scalar rule: NaN skipped in amax).
  std::vector<float> z(1024, 0.f);
  for (int i = 256; i < 512; ++i) z[i] = -0.f;
  for (int i = 512; i < 768; ++i) z[i] = std::numeric_limits<float>::denorm_min() * static_cast<float>(i - 511);
  for (int i = 768; i < 1024; ++i) z[i] = static_cast<float>(i - 900) * 0.01f;
  z[800] = std::numeric_limits<float>::quiet_NaN();
  expect_same(z, "zero/denormal/NaN");
}

}  // namespace
