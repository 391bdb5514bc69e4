// The decode streaming split (src/moe/stream_plan.h): which share of a layer's misses is copied to the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/error.h"
#include "moe/stream_plan.h"

using strata::moe::decode_stream_count;
using strata::moe::DecodeStreamCosts;
using strata::moe::DecodeStreamMode;

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
