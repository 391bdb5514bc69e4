// EnvSwitch and EnvInt (common/env_switch.h): the environment decides once on first read; set() wins over it.
// env_digit: how a small count setting is read; DigitSetting: such a setting with its range checked on set().
#include <gtest/gtest.h>

#include <cstdlib>
#include <utility>

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

TEST(EnvDigit, OneDigitInRangeElseTheFallback) {
  const char* name = "STRATA_TEST_ENV_DIGIT";
  ::unsetenv(name);
  EXPECT_EQ(env_digit(name, 0, 8, 2), 2);  // unset
  const std::pair<const char*, int> cases[] = {{"0", 0}, {"5", 5}, {"8", 8}, {"9", 2}, {"", 2}, {"12", 2},
                                               {"-1", 2}, {"x", 2}, {"3 ", 2}};
  for (const auto& [text, want] : cases) {
    ::setenv(name, text, 1);
    EXPECT_EQ(env_digit(name, 0, 8, 2), want) << "'" << text << "'";
  }
  ::setenv(name, "0", 1);
  EXPECT_EQ(env_digit(name, 1, 5, 4), 4);  // below lo
  ::unsetenv(name);
}

TEST(DigitSetting, EnvironmentOnceSetInRangeWins) {
  const char* name = "STRATA_TEST_DIGIT_SETTING";
  ::setenv(name, "3", 1);
  DigitSetting d(name, "test blocks per SM", 0, 8, 2);
  EXPECT_EQ(d.get(), 3);
  ::setenv(name, "5", 1);
  EXPECT_EQ(d.get(), 3);  // kept: the environment is not read again
  d.set(0);
  EXPECT_EQ(d.get(), 0);
  d.set(8);
  EXPECT_EQ(d.get(), 8);
  try {
    d.set(9);
    ADD_FAILURE() << "set(9) accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "test blocks per SM: 9 (0 to 8)");
  }
  EXPECT_THROW(d.set(-1), Error);
  EXPECT_EQ(d.get(), 8);  // a rejected value changes nothing
  DigitSetting bad(name, "rows", 1, 4, 4);  // "5" is out of 1..4: the fallback
  EXPECT_EQ(bad.get(), 4);
  ::unsetenv(name);
}

}  // namespace
}  // namespace strata
