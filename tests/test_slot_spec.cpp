// --expert-cache N|N%|auto parsing and sizing (cuda/host/slot_spec.h), CPU only.
#include <gtest/gtest.h>

#include "common/error.h"
#include "cuda/host/slot_spec.h"

using strata::Error;
using strata::cuda::expert_slots_from_spec;

TEST(ExpertSlotSpec, CountsPercentagesAndAuto) {
  EXPECT_EQ(expert_slots_from_spec("0", 96, 100, 0), 0);
  EXPECT_EQ(expert_slots_from_spec("17", 96, 100, 0), 17);
  EXPECT_EQ(expert_slots_from_spec("500", 96, 100, 0), 96);  // capped
  EXPECT_EQ(expert_slots_from_spec("0%", 96, 100, 0), 0);
  EXPECT_EQ(expert_slots_from_spec("25%", 96, 100, 0), 24);
  EXPECT_EQ(expert_slots_from_spec("50%", 6144, 100, 0), 3072);
  EXPECT_EQ(expert_slots_from_spec("33%", 16, 100, 0), 5);  // rounded down
  EXPECT_EQ(expert_slots_from_spec("100%", 6144, 100, 0), 6144);
  EXPECT_EQ(expert_slots_from_spec("auto", 96, 100, 1050), 10);
  EXPECT_EQ(expert_slots_from_spec("auto", 96, 100, 1 << 30), 96);
  EXPECT_EQ(expert_slots_from_spec("auto", 96, 100, -5), 0);
}

TEST(ExpertSlotSpec, BadSpecsAreErrors) {
  for (const char* s : {"", "-1", "101%", "x", "12x", "%", "1.5", "auto%", "9999999999"})
    EXPECT_THROW(expert_slots_from_spec(s, 96, 100, 0), Error) << s;
}
