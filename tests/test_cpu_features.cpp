// CPU feature detection and the kernel level switch (STRATA_CPU / set_cpu_level).
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "cpu/cpu_features.h"

using namespace strata;

TEST(CpuFeatures, LevelsFollowFeatures) {
  const CpuFeatures& f = cpu_features();
  const CpuLevel max = cpu_max_level();
  if (max >= CpuLevel::Avx2) EXPECT_TRUE(f.avx2 && f.fma && f.f16c && f.bmi2);
  if (max >= CpuLevel::Avx512) EXPECT_TRUE(f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni);
  if (f.avx2 && f.fma && f.f16c && f.bmi2) EXPECT_GE(max, CpuLevel::Avx2);
  EXPECT_LE(cpu_level(), max);
  EXPECT_EQ(cpu_level_name(CpuLevel::Scalar), "scalar");
  EXPECT_EQ(cpu_level_name(CpuLevel::Avx2), "avx2");
  EXPECT_EQ(cpu_level_name(CpuLevel::Avx512), "avx512");
}

TEST(CpuFeatures, SetLevelWithinWhatTheCpuHas) {
  const CpuLevel before = cpu_level();
  for (int l = 0; l <= static_cast<int>(CpuLevel::Avx512); ++l) {
    const auto level = static_cast<CpuLevel>(l);
    if (level <= cpu_max_level()) {
      set_cpu_level(level);
      EXPECT_EQ(cpu_level(), level);
    } else {
      EXPECT_THROW(set_cpu_level(level), Error);
    }
  }
  set_cpu_level(before);
}

// STRATA_CPU values go through cpu_level_from_name: a known level the CPU has, else a clear error.
TEST(CpuFeatures, LevelNamesParse) {
  EXPECT_EQ(cpu_level_from_name("scalar"), CpuLevel::Scalar);
  if (cpu_max_level() >= CpuLevel::Avx2) EXPECT_EQ(cpu_level_from_name("avx2"), CpuLevel::Avx2);
  if (cpu_max_level() >= CpuLevel::Avx512) EXPECT_EQ(cpu_level_from_name("avx512"), CpuLevel::Avx512);
  try {
    cpu_level_from_name("sse9");
    FAIL() << "unknown level accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected scalar, avx2 or avx512"), std::string::npos) << e.what();
  }
  if (cpu_max_level() < CpuLevel::Avx512) EXPECT_THROW(cpu_level_from_name("avx512"), Error);
}
