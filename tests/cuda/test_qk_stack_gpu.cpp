// q and k stacked into one product where v has another type (cuda/model_common.h set_qk_stack: llama.cpp's
// Q4_K_M gives v Q6_K in about half the layers of a model with more than 8 experts). A synthetic Q4_K_M
// qwen3moe of 2 layers and 16 experts: layer 0 has q, k, v Q4_K (one q|k|v product), layer 1 q, k Q4_K and
// v Q6_K (q|k and v with the stack, three products without). Fast mode, a 40-token prefill and 6 greedy
// decode steps (one-token passes: norm_matvec in each of q|k's and v's launches) at 100% and 50% resident,
// with the f32 attention arithmetic (the CLI's for the CUDA backend: q and k prepared inside the attention
// kernel) and ggml's f16 one:
//   * with norm_matvec's early norm off, the logits have the same bits with and without the stack (the
//     same norm, quantization and row dots, each row's dot independent of the matrix it sits in);
//   * with the early norm (the default) they are within its rounding: every row's top token the same and
//     the largest logit difference small against the logits' spread.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/model_common.h"
#include "cuda/q8_kernels.cuh"
#include "decode_test_util.h"
#include "gguf/gguf.h"

using namespace strata;

TEST(QkStackGpu, SameLogitsAsThreeProducts) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const std::string path = test::write_small_synthetic("Q4_K_M", 13, "qk-stack");
  {  // the layout the test is about
    const auto f = gguf::File::open(path);
    for (int il = 0; il < 2; ++il) {
      const std::string p = "blk." + std::to_string(il) + ".";
      ASSERT_EQ(f.find_tensor(p + "attn_q.weight")->type, GgmlType::Q4_K) << il;
      ASSERT_EQ(f.find_tensor(p + "attn_k.weight")->type, GgmlType::Q4_K) << il;
      ASSERT_EQ(f.find_tensor(p + "attn_v.weight")->type, il == 0 ? GgmlType::Q4_K : GgmlType::Q6_K) << il;
    }
  }
  const std::vector<int32_t> prompt = test::random_prompt(40, test::kSmallSyntheticVocab, 5);
  struct Restore {  // the switches as they were, however the test ends
    const bool stack = cuda::qk_stack(), early = cuda::q8::norm_matvec_early();
    ~Restore() {
      cuda::set_qk_stack(stack);
      cuda::q8::set_norm_matvec_early(early);
    }
  } restore;
  const size_t V = test::kSmallSyntheticVocab;
  for (cpu::AttnMath attn : {cpu::AttnMath::F32, cpu::AttnMath::GgmlF16})
  for (bool early : {false, true}) {
    cuda::q8::set_norm_matvec_early(early);
    for (const char* cache : {"100%", "50%"}) {
      cuda::set_qk_stack(false);
      const auto three = test::prefill_then_decode(path, cache, prompt, 6, attn);
      cuda::set_qk_stack(true);
      const auto stacked = test::prefill_then_decode(path, cache, prompt, 6, attn);
      ASSERT_EQ(three.size(), stacked.size());
      const size_t diff = test::bit_differences(three, stacked);
      size_t top_differ = 0;
      double worst = 0, spread = 0;
      for (size_t r = 0; r < three.size() / V; ++r) {
        const float* a = three.data() + r * V;
        const float* b = stacked.data() + r * V;
        top_differ += test::argmax(a, V) != test::argmax(b, V);
        const auto [lo, hi] = std::minmax_element(a, a + V);
        spread = std::max(spread, double(*hi - *lo));
        for (size_t i = 0; i < V; ++i) worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
      }
      const std::string what = std::string(attn == cpu::AttnMath::F32 ? "f32" : "ggml-f16") + " attention, early norm " +
                               (early ? "on, " : "off, ") + cache + " resident";
      std::printf("[ qk stack ] %s: %zu of %zu logits differ from three products (largest %.3g, logits spread "
                  "%.3g), %zu rows' top token\n", what.c_str(), diff, three.size(), worst, spread, top_differ);
      if (!early) {
        EXPECT_EQ(diff, 0u) << what;
      } else {
        EXPECT_EQ(top_differ, 0u) << what;
        EXPECT_LT(worst, 1e-2 * spread) << what;
      }
    }
  }
  std::remove(path.c_str());
}
