// Q6_K_X8 (quant/q6_k_x8.h), the GPU's storage for Q6_K dense products: the repack keeps every value (bit for
// bit against ggml's dequantization of the fixture zoo's Q6_K tensor and against our Q6_K dequantization of
// random blocks), keeps the bytes per row, and is strata's own type: no file may name it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "cpu/thread_pool.h"
#include "gguf/gguf.h"
#include "quant/blocks.h"
#include "quant/dequant.h"
#include "quant/matmul.h"
#include "quant/q6_k_x8.h"
#include "quant/types.h"
#include "bits_test_util.h"
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

}  // namespace

// The zoo's tensor is 32 rows of 256 values, contiguous: 4 whole groups when taken as one 8192-value row.
TEST(Q6_KX8, ZooTensorKeepsGgmlValues) {
  const auto ref = test::read_sdq(kFixtures + "/formats/zoo.dequant.sdq");
  const auto f = gguf::File::open(kFixtures + "/formats/zoo.gguf");
  const gguf::TensorInfo* t = f.find_tensor("zoo.q6_k");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->type, GgmlType::Q6_K);
  const int64_t n = int64_t(t->ne[0]) * int64_t(t->n_rows());
  ASSERT_EQ(n % kQ6_KX8Values, 0) << "the zoo's tensor is whole groups";
  const uint64_t bytes = row_bytes(GgmlType::Q6_K, uint64_t(n));
  ASSERT_EQ(row_bytes(GgmlType::Q6_K_X8, uint64_t(n)), bytes);
  std::vector<uint8_t> packed(static_cast<size_t>(bytes));
  std::vector<float> values(static_cast<size_t>(n));
  repack_q6_k_x8(t->data, packed.data(), n);
  dequantize_row(GgmlType::Q6_K_X8, packed.data(), values.data(), n);
  expect_same_bits(values, ref.at("zoo.q6_k").head, "zoo.q6_k as q6_kx8");
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
  EXPECT_EQ(file_type_traits(uint32_t(GgmlType::Q6_K_X8)), nullptr) << "a GGUF file must not name it";
  EXPECT_FALSE(type_from_name("q6_kx8").has_value()) << "not a --format choice";
  ASSERT_NE(find_type_traits(GgmlType::Q6_K_X8), nullptr);
  EXPECT_EQ(type_name(GgmlType::Q6_K_X8), "q6_kx8");
  EXPECT_TRUE(can_dequantize(GgmlType::Q6_K_X8));
  for (uint64_t cols : {2048u, 4096u, 12288u})
    EXPECT_EQ(row_bytes(GgmlType::Q6_K_X8, cols), row_bytes(GgmlType::Q6_K, cols)) << cols;
}

TEST(Q6_KX8, PartialGroupIsAnError) {
  std::vector<uint8_t> src(210 * 9), dst(src.size());
  std::vector<float> v(9 * 256);
  EXPECT_THROW(repack_q6_k_x8(src.data(), dst.data(), 9 * 256), Error);
  EXPECT_THROW(dequantize_row(GgmlType::Q6_K_X8, src.data(), v.data(), 9 * 256), Error);
}

// The CPU's exact product takes it too (dequantize + f32): the GPU tests' references use it.
TEST(Q6_KX8, ExactMatmulSameBitsAsQ6_K) {
  std::mt19937 rng(10);
  const int64_t rows = 3, cols = 4096, n_tok = 2;
  const auto w = random_blocks(size_t(rows * cols / 256), rng, true);
  std::vector<uint8_t> w8(w.size() * sizeof(q::BlockQ6_K));
  const int64_t rb = int64_t(row_bytes(GgmlType::Q6_K, uint64_t(cols)));
  for (int64_t r = 0; r < rows; ++r)
    repack_q6_k_x8(reinterpret_cast<const uint8_t*>(w.data()) + r * rb, w8.data() + r * rb, cols);
  std::vector<float> x(size_t(n_tok * cols));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng);
  ThreadPool pool(1);
  std::vector<float> y0(size_t(n_tok * rows)), y8(y0.size());
  matmul(GgmlType::Q6_K, w.data(), rows, cols, x.data(), n_tok, y0.data(), MatmulMode::Exact, pool);
  matmul(GgmlType::Q6_K_X8, w8.data(), rows, cols, x.data(), n_tok, y8.data(), MatmulMode::Exact, pool);
  expect_same_bits(y8, y0, "exact matmul");
}
