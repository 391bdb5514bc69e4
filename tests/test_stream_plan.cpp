// The streaming splits (src/moe/stream_plan.h): which share of a layer's decode misses is copied to the GPU,
// and which of a prefill pass's candidates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>
#include <limits>

#include "common/error.h"
#include "moe/stream_plan.h"

using strata::moe::decode_stream_count;
using strata::moe::DecodeStreamCosts;
using strata::moe::DecodeStreamMode;
using strata::moe::prefill_stream_count;
using strata::moe::PrefillStreamCosts;
using strata::moe::PrefillStreamMode;

TEST(DecodeStreamMode, ParsesAutoOffAndShares) {
  EXPECT_EQ(DecodeStreamMode::parse("auto", "x").kind, DecodeStreamMode::Auto);
  EXPECT_EQ(DecodeStreamMode::parse("off", "x").kind, DecodeStreamMode::Off);
  EXPECT_EQ(DecodeStreamMode::parse("0", "x").kind, DecodeStreamMode::Off);
  const DecodeStreamMode half = DecodeStreamMode::parse("0.5", "x");
  EXPECT_EQ(half.kind, DecodeStreamMode::Share);
  EXPECT_DOUBLE_EQ(half.share, 0.5);
  EXPECT_EQ(half.str(), "0.5");
  EXPECT_EQ(DecodeStreamMode::parse("1", "x").str(), "1");
  for (const char* bad : {"", "1.5", "-0.1", "nan", "inf", "0.5x", "half", " 0.5"}) {
    try {
      DecodeStreamMode::parse(bad, "--decode-stream");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const strata::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--decode-stream"), std::string::npos) << e.what();
    }
  }
}

// Auto: the k minimising max(k * copy, (m - k) * cpu), the smaller k on ties; checked against a brute
// force over many cost ratios, and at points worked by hand.
TEST(DecodeStreamCount, AutoBalancesCopiesAgainstTheCpuPool) {
  const DecodeStreamMode autom;
  DecodeStreamCosts equal(50);  // the CPU estimate starts at the copy cost: a half split
  EXPECT_EQ(decode_stream_count(6, autom, equal, 128), 3);
  EXPECT_EQ(decode_stream_count(7, autom, equal, 128), 3);  // max(150, 200) = 200 = max(200, 150): smaller k
  EXPECT_EQ(decode_stream_count(1, autom, equal, 128), 0);  // max(50, 0) = max(0, 50): no copy
  EXPECT_EQ(decode_stream_count(0, autom, equal, 128), 0);
  EXPECT_EQ(decode_stream_count(6, autom, equal, 2), 2);    // at most the staging slots
  for (int m = 1; m <= 64; ++m) {
    for (double ratio : {0.1, 0.3, 0.5, 1.0, 1.7, 3.0, 10.0}) {
      DecodeStreamCosts c(40);
      for (int i = 0; i < 200; ++i) c.note_cpu(40 * ratio * 3, 3);  // converges to 40 * ratio per expert
      ASSERT_NEAR(c.cpu_us(), 40 * ratio, 1e-6 * 40 * ratio);
      const int k = decode_stream_count(m, autom, c, 1000);
      double best = std::numeric_limits<double>::infinity();
      int best_k = -1;
      for (int j = 0; j <= m; ++j) {
        const double t = std::max(j * c.copy_us(), (m - j) * c.cpu_us());
        if (t < best) best = t, best_k = j;
      }
      EXPECT_EQ(k, best_k) << "misses " << m << " cpu/copy " << ratio;
    }
  }
}

TEST(DecodeStreamCount, ShareAndOffAreFixed) {
  DecodeStreamCosts c(50);
  c.note_cpu(1e6, 1);  // whatever the costs say
  EXPECT_EQ(decode_stream_count(6, DecodeStreamMode::parse("off", "x"), c, 128), 0);
  EXPECT_EQ(decode_stream_count(6, DecodeStreamMode::parse("1", "x"), c, 128), 6);
  EXPECT_EQ(decode_stream_count(6, DecodeStreamMode::parse("0.5", "x"), c, 128), 3);
  EXPECT_EQ(decode_stream_count(5, DecodeStreamMode::parse("0.25", "x"), c, 128), 1);
  EXPECT_EQ(decode_stream_count(8, DecodeStreamMode::parse("1", "x"), c, 5), 5);
  EXPECT_EQ(decode_stream_count(8, DecodeStreamMode::parse("1", "x"), c, 0), 0);
}

TEST(DecodeStreamCosts, AveragesCpuTimingsAndIgnoresBadOnes) {
  DecodeStreamCosts c(40);
  EXPECT_DOUBLE_EQ(c.cpu_us(), 40);
  c.note_cpu(120, 1);  // 40 + (120 - 40) / 8
  EXPECT_DOUBLE_EQ(c.cpu_us(), 50);
  c.note_cpu(100, 0);
  c.note_cpu(std::nan(""), 2);
  c.note_cpu(-5, 1);
  EXPECT_DOUBLE_EQ(c.cpu_us(), 50);
  DecodeStreamCosts none(0);  // no copy measured: auto copies nothing
  none.note_cpu(1000, 1);
  EXPECT_EQ(decode_stream_count(8, DecodeStreamMode{}, none, 128), 0);
  EXPECT_EQ(DecodeStreamCosts(std::nan("")).copy_us(), 0);
}

TEST(PrefillStreamMode, ParsesFixedAndAuto) {
  EXPECT_EQ(PrefillStreamMode::parse("fixed", "x").kind, PrefillStreamMode::Fixed);
  EXPECT_EQ(PrefillStreamMode::parse("auto", "x").kind, PrefillStreamMode::Auto);
  EXPECT_EQ(PrefillStreamMode::parse("auto", "x").str(), "auto");
  EXPECT_EQ(PrefillStreamMode().str(), "fixed");
  for (const char* bad : {"", "Auto", "0.5", "off", " auto"}) {
    try {
      PrefillStreamMode::parse(bad, "--prefill-stream");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const strata::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--prefill-stream"), std::string::npos) << e.what();
    }
  }
}

// The k minimising max(k * copy, pair * (other + the pairs of candidates k..)), the larger k on ties;
// against a brute force over made-up layers (busiest first) and cost ratios, and points worked by hand.
TEST(PrefillStreamCount, BalancesCopiesAgainstTheCpuPairs) {
  PrefillStreamCosts c(30);
  EXPECT_EQ(prefill_stream_count({10, 8, 6}, 0, c), 3);  // no CPU timing yet: every candidate
  EXPECT_EQ(prefill_stream_count({10, 8, 6}, 0, PrefillStreamCosts(0)), 3);  // no copy timing either
  c.note_cpu(100.0, 10);  // 10 us a pair
  EXPECT_DOUBLE_EQ(c.pair_us(), 10);
  // k=0: 240; k=1: max(30, 140) = 140; k=2: max(60, 60) = 60; k=3: max(90, 0) = 90 -> 2
  EXPECT_EQ(prefill_stream_count({10, 8, 6}, 0, c), 2);
  // other pairs on the CPU anyway: k=3: max(90, 100) = 100 is the least
  EXPECT_EQ(prefill_stream_count({10, 8, 6}, 10, c), 3);
  EXPECT_EQ(prefill_stream_count({}, 50, c), 0);
  // ties go to the larger k: {3, 3} at 10 us a pair, copy 30: k=1 max(30, 30), k=2 max(60, 0) -> 1; copy 15:
  // k=1 max(15, 30), k=2 max(30, 0) = 30 = k=1's 30 -> 2
  EXPECT_EQ(prefill_stream_count({3, 3}, 0, c), 1);
  PrefillStreamCosts cheap(15);
  cheap.note_cpu(10.0, 1);
  EXPECT_EQ(prefill_stream_count({3, 3}, 0, cheap), 2);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = int(rng() % 40);
    std::vector<int32_t> pairs(static_cast<size_t>(n));
    for (auto& p : pairs) p = 1 + int32_t(rng() % 64);
    std::sort(pairs.begin(), pairs.end(), std::greater<>());
    const int64_t other = int64_t(rng() % 100);
    PrefillStreamCosts k(5 + double(rng() % 100));
    k.note_cpu(double(1 + rng() % 50), 1);
    double best = std::numeric_limits<double>::infinity();
    int best_k = -1;
    for (int j = 0; j <= n; ++j) {
      int64_t rest = other;
      for (int i = j; i < n; ++i) rest += pairs[size_t(i)];
      const double t = std::max(j * k.copy_us(), k.pair_us() * double(rest));
      if (t <= best) best = t, best_k = j;
    }
    EXPECT_EQ(prefill_stream_count(pairs, other, k), best_k) << "trial " << trial;
  }
}

TEST(PrefillStreamCosts, AveragesPairTimingsAndIgnoresBadOnes) {
  PrefillStreamCosts c(40);
  EXPECT_DOUBLE_EQ(c.pair_us(), 0);
  c.note_cpu(80, 4);  // the first timing is taken as it is
  EXPECT_DOUBLE_EQ(c.pair_us(), 20);
  c.note_cpu(100, 2);  // 20 + (50 - 20) / 8
  EXPECT_DOUBLE_EQ(c.pair_us(), 23.75);
  c.note_cpu(100, 0);
  c.note_cpu(std::nan(""), 2);
  c.note_cpu(-1, 2);
  EXPECT_DOUBLE_EQ(c.pair_us(), 23.75);
  EXPECT_DOUBLE_EQ(PrefillStreamCosts(-3).copy_us(), 0);
}
