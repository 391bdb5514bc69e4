// The tensor-core matvec's weight fragments (src/cuda/q8_mma_formats.cuh) run on the host, without a GPU:
// for every format, row and 32-value step, each of the 4 lanes of a quad gives the codes of values 4q..4q+3
// (lo) and 16+4q..16+4q+3 (hi) and the step's scales; d * code - m (Q6_K: d * s * code) must be ggml's
// dequantized value of that column (quant/dequant.h), and the 4 lanes must cover the 32 columns once.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda/q8_mma_formats.cuh"
#include "gpu_test_util.h"
#include "quant/dequant.h"

namespace {

using namespace strata;
namespace q8mma = strata::cuda::q8mma;

template <typename M>
void check_format(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<uint8_t> w = test::random_weights(t, rows, cols, rng);
  const int64_t rb = int64_t(row_bytes(t, cols));
  std::vector<float> want(static_cast<size_t>(cols));
  int64_t bad = 0, checked = 0;
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t, w.data() + r * rb, want.data(), cols);
    for (int64_t step = 0; step < cols / 32; ++step) {
      const int64_t blk = step / (M::kVals / 32);
      const int j = int(step % (M::kVals / 32));
      std::vector<int> seen(32, 0);
      for (int q = 0; q < 4; ++q) {
        const q8mma::Step s = M::template step<2>(w.data() + r * rb + blk * M::kBytes, j, q);
        for (int half = 0; half < 2; ++half)
          for (int i = 0; i < 4; ++i) {
            const int k = 16 * half + 4 * q + i;
            ++seen[size_t(k)];
            const int code = int(int8_t(((half ? s.hi : s.lo) >> (8 * i)) & 0xFF));
            const float got = M::kSplit16 ? s.d * float(k < 16 ? s.sa : s.sb) * float(code) : s.d * float(code) - s.m;
            const float expect = want[size_t(step * 32 + k)];
            ++checked;
            if (std::fabs(got - expect) > 1e-6f * std::fabs(expect) + 1e-30f) {
              if (bad++ < 5)
                ADD_FAILURE() << type_name(t) << " row " << r << " column " << step * 32 + k << ": " << got
                              << " (code " << code << ") vs ggml " << expect;
            }
          }
      }
      for (int k = 0; k < 32; ++k) ASSERT_EQ(seen[size_t(k)], 1) << type_name(t) << " column " << k;
    }
  }
  EXPECT_EQ(bad, 0) << type_name(t) << ": " << bad << " of " << checked << " values differ";
  EXPECT_EQ(checked, rows * cols);
}

// Every format of the one list (q8mma::with_format, which the kernels' launchers dispatch through).
TEST(Q8MmaHost, FragmentsGiveGgmlValues) {
  for (const int64_t cols : {int64_t(256), int64_t(2048)})
    for (const GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_0_X8, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K,
                             GgmlType::Q6_K})
      EXPECT_TRUE(q8mma::with_format(t, [&](auto m) { check_format<decltype(m)>(t, 5, cols, uint32_t(t) + 1); }))
          << type_name(t);
  // Q6_K_X8 (Q6_K regrouped for dense products): rows of whole 2048-value groups only.
  for (const int64_t cols : {int64_t(2048), int64_t(4096)})
    EXPECT_TRUE(q8mma::with_format(GgmlType::Q6_K_X8, [&](auto m) {
      check_format<decltype(m)>(GgmlType::Q6_K_X8, 5, cols, 77);
    }));
  EXPECT_FALSE(q8mma::with_format(GgmlType::Q2_K, [](auto) {}));  // (the dp4a kernel's only)
}

}  // namespace
