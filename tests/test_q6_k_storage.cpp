// strata's two storage types made from Q6_K, both strata's own (no file may name them), both keeping every
// value (bit for bit against ggml's dequantization of the fixture zoo's Q6_K tensor and against our Q6_K
// dequantization of random blocks):
//   * Q6_K_X8 (quant/q6_k_x8.h), the GPU's storage for Q6_K dense products: 8 blocks regrouped, the same bytes;
//   * Q6_K_P (quant/q6_k_p.h), the GPU's storage for Q6_K expert down matrices: each block padded with zeros
//     to 224 bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bits_test_util.h"
#include "common/error.h"
#include "cpu/thread_pool.h"
#include "gguf/gguf.h"
#include "quant/blocks.h"
#include "quant/dequant.h"
#include "quant/matmul.h"
#include "quant/q6_k_p.h"
#include "quant/q6_k_x8.h"
#include "quant/types.h"
#include "sdq_reader.h"

using namespace strata;
using test::expect_same_bits;

namespace {

const std::string kFixtures = STRATA_FIXTURES_DIR;

std::vector<q::BlockQ6_K> random_blocks(size_t n, std::mt19937& rng, bool small_scales) {
  std::vector<q::BlockQ6_K> v(n);
  for (auto& b : v) {
    for (auto& c : b.ql) c = uint8_t(rng());
    for (auto& c : b.qh) c = uint8_t(rng());
    for (auto& c : b.scales) c = int8_t(rng());
    // Scales over the f16 range without NaN/inf (exponent < 31), both signs; or small positive ones.
    b.d = small_scales ? uint16_t(0x1800 + (rng() & 0x03FF)) : uint16_t(rng() & 0xFBFF);
  }
  return v;
}

// The zoo's Q6_K tensor (32 rows of 256 values, contiguous) stored as type t by `store` and dequantized as
// one row: ggml's values bit for bit.
template <typename Store>
void expect_zoo_keeps_ggml_values(GgmlType t, Store store, const std::string& what) {
  const auto ref = test::read_sdq(kFixtures + "/formats/zoo.dequant.sdq");
  const auto f = gguf::File::open(kFixtures + "/formats/zoo.gguf");
  const gguf::TensorInfo* z = f.find_tensor("zoo.q6_k");
  ASSERT_NE(z, nullptr);
  ASSERT_EQ(z->type, GgmlType::Q6_K);
  const int64_t n = int64_t(z->ne[0]) * int64_t(z->n_rows());
  std::vector<uint8_t> stored(static_cast<size_t>(row_bytes(t, uint64_t(n))));
  std::vector<float> values(static_cast<size_t>(n));
  store(z->data, stored.data(), n);
  dequantize_row(t, stored.data(), values.data(), n);
  expect_same_bits(values, ref.at("zoo.q6_k").head, what);
}

// The CPU's exact product of rows stored as type t (dequantize + f32; the GPU tests' references use it): the
// bits of Q6_K's.
template <typename Store>
void expect_exact_matmul_same_bits(GgmlType t, Store store, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t rows = 3, n_tok = 2;
  const auto w = random_blocks(size_t(rows * cols / 256), rng, true);
  const int64_t rb = int64_t(row_bytes(GgmlType::Q6_K, uint64_t(cols)));
  const int64_t rbt = int64_t(row_bytes(t, uint64_t(cols)));
  std::vector<uint8_t> wt(size_t(rows * rbt));
  for (int64_t r = 0; r < rows; ++r)
    store(reinterpret_cast<const uint8_t*>(w.data()) + r * rb, wt.data() + r * rbt, cols);
  std::vector<float> x(size_t(n_tok * cols));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng);
  ThreadPool pool(1);
  std::vector<float> y0(size_t(n_tok * rows)), yt(y0.size());
  matmul(GgmlType::Q6_K, w.data(), rows, cols, x.data(), n_tok, y0.data(), MatmulMode::Exact, pool);
  matmul(t, wt.data(), rows, cols, x.data(), n_tok, yt.data(), MatmulMode::Exact, pool);
  expect_same_bits(yt, y0, std::string("exact matmul ") + std::string(type_name(t)));
}

}  // namespace

// ---- Q6_K_X8

// (The zoo's 8192 values are 4 whole groups when taken as one row.)
TEST(Q6_KX8, ZooTensorKeepsGgmlValues) {
  expect_zoo_keeps_ggml_values(GgmlType::Q6_K_X8, repack_q6_k_x8, "zoo.q6_k as q6_kx8");
}

TEST(Q6_KX8, RandomBlocksLayoutAndValues) {
  std::mt19937 rng(8);
  constexpr int64_t n = 3 * kQ6_KX8Values;
  const auto src = random_blocks(size_t(n / 256), rng, false);
  std::vector<uint8_t> packed(size_t(n / kQ6_KX8Values * kQ6_KX8Bytes));
  ASSERT_EQ(packed.size(), src.size() * sizeof(q::BlockQ6_K));
  repack_q6_k_x8(src.data(), packed.data(), n);
  for (size_t i = 0; i < src.size(); ++i) {  // the layout of quant/q6_k_x8.h, byte for byte
    const uint8_t* g = packed.data() + (i / 8) * kQ6_KX8Bytes;
    const int k = int(i % 8);
    EXPECT_EQ(std::memcmp(g + 2 * k, &src[i].d, 2), 0) << "block " << i;
    EXPECT_EQ(std::memcmp(g + 16 + 208 * k, src[i].ql, 128), 0) << "block " << i;
    EXPECT_EQ(std::memcmp(g + 16 + 208 * k + 128, src[i].qh, 64), 0) << "block " << i;
    EXPECT_EQ(std::memcmp(g + 16 + 208 * k + 192, src[i].scales, 16), 0) << "block " << i;
  }
  std::vector<float> a(n), b(n);
  dequantize_row(GgmlType::Q6_K, src.data(), a.data(), n);
  dequantize_row(GgmlType::Q6_K_X8, packed.data(), b.data(), n);
  expect_same_bits(b, a, "random q6_kx8");
}

TEST(Q6_KX8, IsStrataOwnType) {
  ASSERT_NO_FATAL_FAILURE(test::expect_strata_own_type(GgmlType::Q6_K_X8, "q6_kx8"));
  for (uint64_t cols : {2048u, 4096u, 12288u})
    EXPECT_EQ(row_bytes(GgmlType::Q6_K_X8, cols), row_bytes(GgmlType::Q6_K, cols)) << cols;
}

TEST(Q6_KX8, PartialGroupIsAnError) {
  std::vector<uint8_t> src(210 * 9), dst(src.size());
  std::vector<float> v(9 * 256);
  EXPECT_THROW(repack_q6_k_x8(src.data(), dst.data(), 9 * 256), Error);
  EXPECT_THROW(dequantize_row(GgmlType::Q6_K_X8, src.data(), v.data(), 9 * 256), Error);
}

TEST(Q6_KX8, ExactMatmulSameBitsAsQ6_K) {
  expect_exact_matmul_same_bits(GgmlType::Q6_K_X8, repack_q6_k_x8, 4096, 10);
}

// ---- Q6_K_P

TEST(Q6_KP, ZooTensorKeepsGgmlValues) {
  expect_zoo_keeps_ggml_values(GgmlType::Q6_K_P, repack_q6_k_p, "zoo.q6_k as q6_kp");
}

TEST(Q6_KP, RandomBlocksLayoutAndValues) {
  std::mt19937 rng(11);
  constexpr int64_t n = 5 * kQ6_KPValues;
  const auto src = random_blocks(size_t(n / 256), rng, true);
  std::vector<uint8_t> padded(size_t(n / kQ6_KPValues * kQ6_KPBytes), 0xAA);
  repack_q6_k_p(src.data(), padded.data(), n);
  for (size_t i = 0; i < src.size(); ++i) {  // the layout of quant/q6_k_p.h, byte for byte
    const uint8_t* b = padded.data() + i * kQ6_KPBytes;
    EXPECT_EQ(std::memcmp(b, &src[i], sizeof(q::BlockQ6_K)), 0) << "block " << i;
    for (size_t k = sizeof(q::BlockQ6_K); k < size_t(kQ6_KPBytes); ++k) EXPECT_EQ(b[k], 0) << "block " << i;
  }
  std::vector<float> a(n), b(n);
  dequantize_row(GgmlType::Q6_K, src.data(), a.data(), n);
  dequantize_row(GgmlType::Q6_K_P, padded.data(), b.data(), n);
  expect_same_bits(b, a, "random q6_kp");
}

TEST(Q6_KP, IsStrataOwnType) {
  ASSERT_NO_FATAL_FAILURE(test::expect_strata_own_type(GgmlType::Q6_K_P, "q6_kp"));
  EXPECT_EQ(row_bytes(GgmlType::Q6_K_P, 768), 3u * 224u);
  EXPECT_EQ(row_bytes(GgmlType::Q6_K_P, 768) % 16, 0u) << "every row and block 16-byte aligned";
}

TEST(Q6_KP, PartialBlockIsAnError) {
  std::vector<uint8_t> src(210 * 2), dst(224 * 2);
  std::vector<float> v(300);
  EXPECT_THROW(repack_q6_k_p(src.data(), dst.data(), 300), Error);
  EXPECT_THROW(dequantize_row(GgmlType::Q6_K_P, dst.data(), v.data(), 300), Error);
}

TEST(Q6_KP, ExactMatmulSameBitsAsQ6_K) { expect_exact_matmul_same_bits(GgmlType::Q6_K_P, repack_q6_k_p, 768, 12); }
