// moe/direct_rule.h: which of a token's non-resident experts the GPU reads directly (the rule the CUDA
// kernels and the host split share).
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "moe/direct_rule.h"

namespace {

using namespace strata;
using namespace strata::moe;

TEST(DirectRule, CountRoundsHalfUp) {
  EXPECT_EQ(direct_count(6, 0), 0);
  EXPECT_EQ(direct_count(6, kDirectShareOne), 6);
  EXPECT_EQ(direct_count(6, 96), 2);   // 0.375 * 6 = 2.25
  EXPECT_EQ(direct_count(4, 96), 2);   // 1.5 -> 2
  EXPECT_EQ(direct_count(1, 96), 0);   // 0.375
  EXPECT_EQ(direct_count(8, 96), 3);
  EXPECT_EQ(direct_count(0, 200), 0);
  for (int m = 0; m <= 64; ++m)
    for (int s = 0; s <= kDirectShareOne; ++s) {
      const int c = direct_count(m, s);
      ASSERT_GE(c, 0);
      ASSERT_LE(c, m);
    }
}

TEST(DirectRule, FirstMissesInOrderAreDirect) {
  // table: experts 0, 2, 5 resident; others not.
  const std::vector<int32_t> table = {3, -1, 0, -1, -1, 1, -1, -1};
  // k = 6: misses at j = 1 (e1), 3 (e4), 4 (e6), 5 (e1 again): 4 misses; j = 0, 2 resident.
  const std::vector<int32_t> ids = {0, 1, 2, 4, 6, 1};
  const int k = 6;
  auto direct = [&](int share) {
    std::vector<int> d;
    for (int j = 0; j < k; ++j) d.push_back(pair_is_direct(ids.data(), table.data(), k, j, share));
    return d;
  };
  EXPECT_EQ(direct(0), (std::vector<int>{0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(direct(64), (std::vector<int>{0, 1, 0, 0, 0, 0}));   // 4 * 0.25 = 1
  EXPECT_EQ(direct(128), (std::vector<int>{0, 1, 0, 1, 0, 0}));  // 2
  EXPECT_EQ(direct(256), (std::vector<int>{0, 1, 0, 1, 1, 1}));  // all misses, never a resident pair
  // Ranks count the direct pairs before, in j order.
  EXPECT_EQ(direct_rank(ids.data(), table.data(), k, 1, 256), 0);
  EXPECT_EQ(direct_rank(ids.data(), table.data(), k, 3, 256), 1);
  EXPECT_EQ(direct_rank(ids.data(), table.data(), k, 5, 256), 3);
  EXPECT_EQ(direct_rank(ids.data(), table.data(), k, 2, 256), -1);  // resident
  EXPECT_EQ(direct_rank(ids.data(), table.data(), k, 4, 128), -1);  // a miss past the share
  // A negative id is neither a miss nor direct.
  const std::vector<int32_t> neg = {-1, 1, 4};
  EXPECT_FALSE(pair_is_direct(neg.data(), table.data(), 3, 0, 256));
  EXPECT_TRUE(pair_is_direct(neg.data(), table.data(), 3, 1, 128));   // 2 misses * 0.5 = 1: the first
  EXPECT_FALSE(pair_is_direct(neg.data(), table.data(), 3, 2, 128));
}

TEST(DirectRule, ParseShare) {
  EXPECT_EQ(parse_direct_share("off", "--decode-direct"), 0);
  EXPECT_EQ(parse_direct_share("0", "--decode-direct"), 0);
  EXPECT_EQ(parse_direct_share("1", "--decode-direct"), kDirectShareOne);
  EXPECT_EQ(parse_direct_share("0.375", "--decode-direct"), 96);
  EXPECT_EQ(parse_direct_share(".5", "--decode-direct"), 128);
  for (const char* bad : {"", "auto", "-0.1", "1.5", "nan", " 0.3", "0.3x", "inf"})
    EXPECT_THROW(parse_direct_share(bad, "--decode-direct"), Error) << bad;
  EXPECT_EQ(direct_share_str(0), "off");
  EXPECT_EQ(direct_share_str(96), "0.375");
  EXPECT_EQ(direct_share_str(256), "1");
}

}  // namespace
