#pragma once
// gtest checks the storage types strata makes from ggml's (Q4_0_X8, Q6_K_X8, Q6_K_P) share: two float
// vectors hold the same bits; a type is strata's own.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "quant/dequant.h"
#include "quant/types.h"

namespace strata::test {

// Every value of a has b's bits (the first 3 that differ are reported); what: the check's name.
inline void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && bad++ < 3) ADD_FAILURE() << what << "[" << i << "] " << a[i] << " vs " << b[i];
  EXPECT_EQ(bad, 0u) << what;
}

// t is strata's own type called `name`: no file may name it, it is no --format choice, it has traits and
// it dequantizes. (Call it in ASSERT_NO_FATAL_FAILURE: without traits the caller must stop too.)
inline void expect_strata_own_type(GgmlType t, const std::string& name) {
  EXPECT_EQ(file_type_traits(uint32_t(t)), nullptr) << name << ": a GGUF file must not name it";
  EXPECT_FALSE(type_from_name(name).has_value()) << name << ": not a --format choice";
  ASSERT_NE(find_type_traits(t), nullptr) << name;
  EXPECT_EQ(type_name(t), name);
  EXPECT_TRUE(can_dequantize(t)) << name;
}

}  // namespace strata::test
