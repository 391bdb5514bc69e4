// Q6_K expert down matrices kept padded as Q6_K_P (cuda/expert_cache.h set_q6_k_down_padded, quant/q6_k_p.h)
// give the same logits, bit for bit, as Q6_K: every kernel that reads a down matrix does Q6_K's arithmetic on
// the same values in the same order. The small synthetic Q4_K_M qwen3moe (llama.cpp's rules give layer 1's
// ffn_down_exps Q6_K), fast mode: a 40-token prefill (the grouped tensor-core experts, every logit kept) and 6
// greedy decode steps (the int8 moe_down at 100% resident; the f32 kernels beside the CPU pool, with direct
// reads of the pinned host copy, at 50%). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/backend.h"
#include "cuda/device.h"
#include "cuda/expert_cache.h"
#include "decode_test_util.h"

using namespace strata;

TEST(Q6_KPGpu, SameLogitsAsQ6_KDown) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  struct Restore {  // the switch as it was, however the test ends
    const bool padded = cuda::q6_k_down_padded();
    ~Restore() { cuda::set_q6_k_down_padded(padded); }
  } restore;
  const std::string path = test::write_small_synthetic("Q4_K_M", 17, "q6kp");
  const std::vector<int32_t> prompt = test::random_prompt(40, test::kSmallSyntheticVocab, 6);
  auto slot_bytes = [&](bool padded) {  // the switch took: a slot holds the larger down matrix
    cuda::set_q6_k_down_padded(padded);
    return cuda::load_model_cuda(path, test::small_cuda_options("100%", false))->cache_report().slot_bytes;
  };
  EXPECT_GT(slot_bytes(true), slot_bytes(false));
  for (const char* cache : {"100%", "50%"}) {
    cuda::set_q6_k_down_padded(false);
    const auto q6k = test::prefill_then_decode(path, cache, prompt, 6);
    cuda::set_q6_k_down_padded(true);
    const auto padded = test::prefill_then_decode(path, cache, prompt, 6);
    const size_t diff = test::bit_differences(q6k, padded);
    std::printf("[ q6_kp ] Q4_K_M, %s resident: %zu of %zu logits differ from Q6_K down\n", cache, diff, q6k.size());
    EXPECT_EQ(diff, 0u) << cache << " resident";
  }
  std::remove(path.c_str());
}
