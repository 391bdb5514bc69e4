// Q6_K dense product matrices kept as Q6_K_X8 (cuda/model_common.h set_q6_k_dense_x8, quant/q6_k_x8.h) give
// the same logits, bit for bit, as Q6_K: the kernels do Q6_K's arithmetic on the same values in the same
// order. Synthetic qwen3moe models 2048 wide (so the dense rows are whole 2048-value groups), fast mode:
//   * Q4_K_M: the output and layer 1's attn_v are Q6_K (llama.cpp's rules), so q|k is stacked apart from v
//     and v runs through norm_matvec;
//   * Q6_K: q|k|v (norm_matvec), wo (wo_router, the folded router) and the output are Q6_K.
// A 40-token prefill (the prefill GEMM, every logit kept) and 6 greedy decode steps (the int8 decode kernels
// and graphs at 100% resident; the f32 kernels beside the CPU pool at 50%). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/backend.h"
#include "cuda/device.h"
#include "cuda/model_common.h"
#include "decode_test_util.h"
#include "model/synthetic.h"

using namespace strata;

namespace {

// The small synthetic model of decode_test_util.h, 2048 wide with 16 heads of 128.
std::string write_wide_synthetic(const char* format, uint64_t seed) {
  SyntheticSpec spec = test::small_synthetic_spec(format, seed);
  spec.n_embd = 2048;
  spec.n_head = 16;
  spec.n_head_kv = 2;
  spec.head_dim = 128;
  return test::write_synthetic(spec, (std::string("q6kx8-") + format).c_str());
}

}  // namespace

TEST(Q6_KX8Gpu, SameLogitsAsQ6_K) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  struct Restore {  // the switch as it was, however the test ends
    const bool dense = cuda::q6_k_dense_x8();
    ~Restore() { cuda::set_q6_k_dense_x8(dense); }
  } restore;
  cuda::set_q6_k_dense_x8(true);
  ASSERT_EQ(cuda::product_type(GgmlType::Q6_K, 2048, false), GgmlType::Q6_K_X8);
  ASSERT_EQ(cuda::product_type(GgmlType::Q6_K, 768, false), GgmlType::Q6_K) << "rows of whole groups only";
  ASSERT_EQ(cuda::product_type(GgmlType::Q6_K, 2048, true), GgmlType::F32) << "exact mode";
  const std::vector<int32_t> prompt = test::random_prompt(40, test::kSmallSyntheticVocab, 5);
  for (const char* format : {"Q4_K_M", "Q6_K"}) {
    const std::string path = write_wide_synthetic(format, 13);
    for (const char* cache : {"100%", "50%"}) {
      cuda::set_q6_k_dense_x8(false);
      const auto q6k = test::prefill_then_decode(path, cache, prompt, 6);
      cuda::set_q6_k_dense_x8(true);
      const auto x8 = test::prefill_then_decode(path, cache, prompt, 6);
      const size_t diff = test::bit_differences(q6k, x8);
      std::printf("[ q6_kx8 ] %s, %s resident: %zu of %zu logits differ from Q6_K\n", format, cache, diff, q6k.size());
      EXPECT_EQ(diff, 0u) << format << ", " << cache << " resident";
    }
    std::remove(path.c_str());
  }
}
