// Q4_0 experts kept as Q4_0_X8 (cuda/expert_cache.h set_q4_0_experts_x8, quant/q4_0_x8.h) and Q4_0 dense
// product matrices kept so (cuda/model_common.h set_q4_0_dense_x8: q|k|v, wo) give the same logits, bit for
// bit, as Q4_0: the kernels do Q4_0's arithmetic on the same values in the same order.
// A synthetic all-Q4_0 qwen3moe (256-wide, so every expert row is whole 256-value groups), fast mode: a
// 40-token prefill (the grouped tensor-core experts, every logit kept) and 6 greedy decode steps (the int8
// decode kernels and graphs at 100% resident; the f32 kernels beside the CPU pool, with direct reads, at
// 50%). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/backend.h"
#include "cuda/device.h"
#include "cuda/expert_cache.h"
#include "cuda/model_common.h"
#include "decode_test_util.h"
#include "engine/engine.h"

using namespace strata;

TEST(Q4_0X8Gpu, SameLogitsAsQ4_0Slots) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  // (16 experts: llama.cpp's Q4_0 rules give 8-expert models Q8_0 attn_k / attn_v, and the test wants q|k|v
  // as one Q4_0 product, norm_matvec)
  const std::string path = test::write_small_synthetic("Q4_0", 11, "q4_0x8");
  const std::vector<int32_t> prompt = test::random_prompt(40, test::kSmallSyntheticVocab, 3);
  struct Restore {  // the switches as they were, however the test ends
    const bool experts = cuda::q4_0_experts_x8(), dense = cuda::q4_0_dense_x8();
    ~Restore() {
      cuda::set_q4_0_experts_x8(experts);
      cuda::set_q4_0_dense_x8(dense);
    }
  } restore;
  for (const char* cache : {"100%", "50%"}) {
    cuda::set_q4_0_experts_x8(false);
    cuda::set_q4_0_dense_x8(false);
    const auto q40 = test::prefill_then_decode(path, cache, prompt, 6);
    for (auto [experts, dense] : {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
      cuda::set_q4_0_experts_x8(experts);
      cuda::set_q4_0_dense_x8(dense);
      const auto x8 = test::prefill_then_decode(path, cache, prompt, 6);
      const size_t diff = test::bit_differences(q40, x8);
      std::printf("[ q4_0x8 ] %s resident, experts %s, dense %s: %zu of %zu logits differ from Q4_0\n", cache,
                  experts ? "q4_0x8" : "Q4_0", dense ? "q4_0x8" : "Q4_0", diff, q40.size());
      EXPECT_EQ(diff, 0u) << cache << " resident, experts x8 " << experts << ", dense x8 " << dense;
    }
  }
  std::remove(path.c_str());
}
