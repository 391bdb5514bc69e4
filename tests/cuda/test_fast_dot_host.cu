// The fast decode path's chunk decoders (src/cuda/fast_dot.cuh: Q4_K, Q5_K, Q6_K, Q4_0, Q8_0) run on the
// host, without a GPU:
//  * layout: every chunk and group of every row of the zoo tensors (llama.cpp's data) and of random
//    weights gives back, through K::deq, exactly strata::dequantize_row's values at K::col's columns
//    (each column covered once);
//  * arithmetic: fd::row_dot_serial (the factored sums of the kernels, chunks in sequence) against
//    strata::matmul Exact: max |fast - cpu| / sum|w x| below 1e-5, the GPU tests' bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/fast_dot.cuh"
#include "gguf/gguf.h"
#include "gpu_test_util.h"
#include "quant/dequant.h"
#include "quant/matmul.h"

namespace {

using namespace strata;
namespace fd = strata::cuda::fd;

const GgmlType kFastTypes[] = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q4_0, GgmlType::Q8_0};

// Mismatches of the chunk decoders against dequantize_row on rows x cols weights (16-byte aligned copy
// of each row, as the fast path requires for Q4_K/Q5_K).
int64_t layout_mismatches(GgmlType t, const uint8_t* w, int64_t rows, int64_t cols, const std::string& what) {
  const int64_t rb = static_cast<int64_t>(row_bytes(t, cols));
  int64_t bad = 0;
  const bool has = fd::dispatch(t, [&](auto kf) {
    using K = decltype(kf);
    std::vector<uint64_t> aligned((rb + 7) / 8 + 2);
    auto* row = reinterpret_cast<uint8_t*>(aligned.data());
    std::vector<float> ref(cols);
    std::vector<int> seen(cols);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(row, w + r * rb, rb);
      dequantize_row(t, row, ref.data(), cols);
      std::fill(seen.begin(), seen.end(), 0);
      for (int64_t b = 0; b < cols / K::kVals; ++b)
        for (int ch = 0; ch < K::kChunks; ++ch) {
          typename K::Chunk c;
          K::load(row + b * K::kBytes, ch, c);
          for (int g = 0; g < 4; ++g) {
            float q[8];
            K::q8(c, g, q);
            const int64_t col = b * K::kVals + K::col(ch, g);
            for (int k = 0; k < 8; ++k) {
              ++seen[col + k];
              const float v = K::deq(c, g / (4 / K::kParts), q[k]);
              if (!test::same_bits(v, ref[col + k]) && bad++ < 3)
                ADD_FAILURE() << what << " row " << r << " col " << col + k << ": chunk " << ch << " group " << g
                              << " gives " << v << ", dequantize " << ref[col + k];
            }
          }
        }
      for (int64_t i = 0; i < cols; ++i)
        if (seen[i] != 1 && bad++ < 3) ADD_FAILURE() << what << ": column " << i << " covered " << seen[i] << " times";
    }
  });
  EXPECT_TRUE(has) << what;
  return bad;
}

TEST(CudaFastDotOnHost, ZooLayoutBitExact) {
  const auto f = gguf::File::open(std::string(STRATA_FIXTURES_DIR) + "/formats/zoo.gguf");
  int checked = 0;
  for (const auto& t : f.tensors()) {
    if (std::find(std::begin(kFastTypes), std::end(kFastTypes), t.type) == std::end(kFastTypes)) continue;
    const int64_t cols = static_cast<int64_t>(t.ne[0]), rows = static_cast<int64_t>(t.n_elements()) / cols;
    EXPECT_EQ(layout_mismatches(t.type, t.data, rows, cols, t.name), 0) << t.name;
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

TEST(CudaFastDotOnHost, RandomLayoutAndDotMatchCpuExact) {
  std::mt19937 rng(77);
  ThreadPool& pool = test::test_pool();
  for (GgmlType t : kFastTypes)
    for (int64_t cols : {768, 2048}) {
      const int64_t rows = 64;
      const auto w = test::random_weights(t, rows, cols, rng);
      const std::string what = std::string(type_name(t)) + " " + std::to_string(cols);
      EXPECT_EQ(layout_mismatches(t, w.data(), rows, cols, what), 0) << what;
      const auto x = test::random_acts(cols, rng);
      std::vector<float> ref(rows), wf(cols);
      matmul(t, w.data(), rows, cols, x.data(), 1, ref.data(), MatmulMode::Exact, pool);
      const int64_t rb = static_cast<int64_t>(row_bytes(t, cols));
      double worst = 0;
      fd::dispatch(t, [&](auto kf) {
        using K = decltype(kf);
        for (int64_t r = 0; r < rows; ++r) {
          dequantize_row(t, w.data() + r * rb, wf.data(), cols);
          double mag = 0;
          for (int64_t c = 0; c < cols; ++c) mag += std::fabs(double(wf[c]) * x[c]);
          const float got = fd::row_dot_serial<K>(w.data() + r * rb, cols, x.data());
          worst = std::max(worst, std::fabs(double(got) - ref[r]) / std::max(mag, 1e-30));
        }
      });
      EXPECT_LT(worst, 1e-5) << what << ": max |fast - cpu exact| / sum|wx|";
      std::printf("fast dot %-12s worst |fast-cpu|/sum|wx| = %.3g\n", what.c_str(), worst);
    }
}

// A regrouped format KX (type tx; rows of the file's type t0 regrouped or padded by `repack`): its chunks
// decode to t0's values, and the chunk sums in the kernels' chunk order have the same bits as K0's.
template <typename K0, typename KX, typename Repack>
void expect_regrouped_chunks_same_bits(GgmlType t0, GgmlType tx, Repack repack, std::initializer_list<int64_t> widths,
                                       uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t cols : widths) {
    const int64_t rows = 16;
    const int64_t rb = static_cast<int64_t>(row_bytes(t0, cols)), rbx = static_cast<int64_t>(row_bytes(tx, cols));
    const auto w0 = test::random_weights(t0, rows, cols, rng);
    std::vector<uint8_t> w8(static_cast<size_t>(rbx * rows));
    for (int64_t r = 0; r < rows; ++r) repack(w0.data() + r * rb, w8.data() + r * rbx, cols);
    const std::string what = std::string(type_name(tx)) + " " + std::to_string(cols);
    EXPECT_EQ(layout_mismatches(tx, w8.data(), rows, cols, what), 0) << what;
    const auto x = test::random_acts(cols, rng);
    int64_t differ = 0;
    for (int64_t r = 0; r < rows; ++r)
      differ += !test::same_bits(fd::row_dot_serial<KX>(w8.data() + r * rbx, cols, x.data()),
                                 fd::row_dot_serial<K0>(w0.data() + r * rb, cols, x.data()));
    EXPECT_EQ(differ, 0) << what;
  }
}

// Q4_0_X8 (Q4_0 regrouped, the GPU's storage for Q4_0 experts): chunk c is Q4_0 block c in both.
TEST(CudaFastDotOnHost, Q4_0X8SameBitsAsQ4_0) {
  expect_regrouped_chunks_same_bits<fd::FQ40, fd::FQ40X8>(GgmlType::Q4_0, GgmlType::Q4_0_X8, repack_q4_0_x8,
                                                          {768, 2048}, 78);
}

// Q6_K_X8 (Q6_K regrouped, the GPU's storage for Q6_K dense products): chunk c is Q6_K's chunk c.
TEST(CudaFastDotOnHost, Q6_KX8SameBitsAsQ6_K) {
  expect_regrouped_chunks_same_bits<fd::FQ6K, fd::FQ6KX8>(GgmlType::Q6_K, GgmlType::Q6_K_X8, repack_q6_k_x8,
                                                          {2048, 4096}, 79);
}

}  // namespace

// Q6_K_P (Q6_K padded, the GPU's storage for Q6_K expert down matrices): FQ6K's chunks on the same blocks.
TEST(CudaFastDotOnHost, Q6_KPSameBitsAsQ6_K) {
  expect_regrouped_chunks_same_bits<fd::FQ6K, fd::FQ6KP>(GgmlType::Q6_K, GgmlType::Q6_K_P, repack_q6_k_p,
                                                         {256, 768, 2048}, 80);
}
