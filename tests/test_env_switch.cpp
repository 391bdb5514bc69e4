// EnvSwitch and EnvInt (common/env_switch.h): the environment decides once on first read; set() wins over it.
#include <gtest/gtest.h>

#include "common/env_switch.h"

namespace strata {
namespace {

TEST(EnvSwitch, FirstReadDecidesOnce) {
  EnvSwitch s;
  int calls = 0;
  EXPECT_FALSE(s.get([&] { ++calls; return false; }));
  EXPECT_FALSE(s.get([&] { ++calls; return true; }));  // kept: the environment is not read again
  EXPECT_EQ(calls, 1);
}

TEST(EnvSwitch, SetWinsOverTheEnvironment) {
  EnvSwitch s;
  int calls = 0;
  s.set(true);
  EXPECT_TRUE(s.get([&] { ++calls; return false; }));
  EXPECT_EQ(calls, 0);
  s.set(false);
  EXPECT_FALSE(s.get([&] { ++calls; return true; }));
  EXPECT_EQ(calls, 0);
}

TEST(EnvInt, FirstReadDecidesOnceAndSetWins) {
  EnvInt v;
  int calls = 0;
  EXPECT_EQ(v.get([&] { ++calls; return 3; }), 3);
  EXPECT_EQ(v.get([&] { ++calls; return 5; }), 3);  // kept: the environment is not read again
  EXPECT_EQ(calls, 1);
  v.set(0);
  EXPECT_EQ(v.get([&] { ++calls; return 5; }), 0);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace strata
