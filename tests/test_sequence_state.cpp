// Per-sequence state: sizes, addressing, context accounting.
#include <gtest/gtest.h>

#include "common/error.h"
#include "kv/sequence_state.h"

using namespace strata;

TEST(SequenceState, AllocatesAttentionLayersUpFront) {
  SequenceState s(100, KvType::F16, {true, false, true}, 2, 64, 32);
  EXPECT_EQ(s.memory_bytes(), size_t(2) * 100 * (2 * 64 + 2 * 32) * 2);
  EXPECT_TRUE(s.kv(0).present());
  EXPECT_FALSE(s.kv(1).present());
  EXPECT_EQ(static_cast<uint8_t*>(s.k_at(2, 3)) - static_cast<uint8_t*>(s.k_at(2, 0)), 3 * 128 * 2);
  EXPECT_EQ(static_cast<uint8_t*>(s.v_at(0, 5)) - static_cast<uint8_t*>(s.v_at(0, 0)), 5 * 64 * 2);
  SequenceState f(10, KvType::F32, {true}, 4, 16, 16);
  EXPECT_EQ(f.memory_bytes(), size_t(10) * 2 * 64 * 4);
}

TEST(SequenceState, ContextAccounting) {
  SequenceState s(8, KvType::F32, {true}, 1, 4, 4);
  s.advance(5);
  EXPECT_EQ(s.n_past(), 5);
  EXPECT_EQ(s.space_left(), 3);
  EXPECT_THROW(s.advance(4), Error);
  s.truncate(2);
  EXPECT_EQ(s.n_past(), 2);
  EXPECT_THROW(s.truncate(3), Error);
  s.reset();
  EXPECT_EQ(s.n_past(), 0);
  EXPECT_THROW(SequenceState(0, KvType::F32, {true}, 1, 4, 4), Error);
}

TEST(SequenceState, RecurrentStateCannotBeRewoundPartially) {
  SequenceState s(8, KvType::F32, {false, true}, 1, 4, 4);
  s.recurrent()[0].state.assign(16, 1.0f);
  s.advance(4);
  EXPECT_THROW(s.truncate(2), Error);
  s.truncate(0);
  EXPECT_EQ(s.recurrent()[0].state[3], 0.0f);
}
