#pragma once
// A gtest check that two float vectors hold the same bits (the regrouped storage types' tests).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace strata::test {

// Every value of a has b's bits (the first 3 that differ are reported); what: the check's name.
inline void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && bad++ < 3) ADD_FAILURE() << what << "[" << i << "] " << a[i] << " vs " << b[i];
  EXPECT_EQ(bad, 0u) << what;
}

}  // namespace strata::test
