// The attention span of a forward pass (cuda/host/attn_span.h), CPU only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "cuda/host/attn_span.h"

using strata::cuda::attention_span;

TEST(AttentionSpan, PowersOfTwoFromOneTileUpToTheContext) {
  EXPECT_EQ(attention_span(1, 4096), 64);
  EXPECT_EQ(attention_span(64, 4096), 64);
  EXPECT_EQ(attention_span(65, 4096), 128);
  EXPECT_EQ(attention_span(128, 4096), 128);
  EXPECT_EQ(attention_span(129, 4096), 256);
  EXPECT_EQ(attention_span(3000, 4096), 4096);
  EXPECT_EQ(attention_span(4096, 4096), 4096);
  EXPECT_EQ(attention_span(3000, 3500), 3500);  // capped at a context that is not a power of two
  EXPECT_EQ(attention_span(1, 40), 40);         // a context shorter than one tile
  EXPECT_EQ(attention_span(40, 40), 40);
  EXPECT_EQ(attention_span(int64_t(1) << 40, int64_t(1) << 41), int64_t(1) << 40);
  // Every span holds its positions and is at most twice them (or one tile).
  for (int64_t n = 1; n <= 5000; ++n) {
    const int64_t s = attention_span(n, 5000);
    ASSERT_GE(s, n);
    ASSERT_LE(s, std::max<int64_t>(64, 2 * n));
  }
}

TEST(AttentionSpan, PositionsOutsideTheContextAreErrors) {
  EXPECT_THROW(attention_span(0, 4096), strata::Error);
  EXPECT_THROW(attention_span(-3, 4096), strata::Error);
  EXPECT_THROW(attention_span(4097, 4096), strata::Error);
}

TEST(AttentionSpan, TheModelsSpanIsTheSpanUnlessTheEnvironmentAsksForTheContext) {
  const char* e = std::getenv("STRATA_CUDA_ATTN_SPAN");
  const bool ctx = e != nullptr && std::string(e) == "ctx";
  EXPECT_EQ(strata::cuda::pass_attention_span(65, 4096), ctx ? 4096 : 128);
  EXPECT_THROW(strata::cuda::pass_attention_span(0, 4096), strata::Error);
}
