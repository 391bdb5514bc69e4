// Q6_K_P (quant/q6_k_p.h), the GPU's storage for Q6_K expert down matrices: the padding keeps every value (bit
// for bit against ggml's dequantization of the fixture zoo's Q6_K tensor and against our Q6_K dequantization
// of random blocks), pads each block with zeros to 224 bytes, and is strata's own type: no file may name it.
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
#include "quant/types.h"
#include "sdq_reader.h"

using namespace strata;
using test::expect_same_bits;

namespace {

const std::string kFixtures = STRATA_FIXTURES_DIR;

std::vector<q::BlockQ6_K> random_blocks(size_t n, std::mt19937& rng) {
  std::vector<q::BlockQ6_K> v(n);
  for (auto& b : v) {
    for (auto& c : b.ql) c = uint8_t(rng());
    for (auto& c : b.qh) c = uint8_t(rng());
    for (auto& c : b.scales) c = int8_t(rng());
    b.d = uint16_t(0x1800 + (rng() & 0x03FF));  // small positive scales
  }
  return v;
}

}  // namespace

TEST(Q6_KP, ZooTensorKeepsGgmlValues) {
  const auto ref = test::read_sdq(kFixtures + "/formats/zoo.dequant.sdq");
  const auto f = gguf::File::open(kFixtures + "/formats/zoo.gguf");
  const gguf::TensorInfo* t = f.find_tensor("zoo.q6_k");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->type, GgmlType::Q6_K);
  const int64_t n = int64_t(t->ne[0]) * int64_t(t->n_rows());
  std::vector<uint8_t> padded(static_cast<size_t>(row_bytes(GgmlType::Q6_K_P, uint64_t(n))));
  std::vector<float> values(static_cast<size_t>(n));
  repack_q6_k_p(t->data, padded.data(), n);
  dequantize_row(GgmlType::Q6_K_P, padded.data(), values.data(), n);
  expect_same_bits(values, ref.at("zoo.q6_k").head, "zoo.q6_k as q6_kp");
}

TEST(Q6_KP, RandomBlocksLayoutAndValues) {
  std::mt19937 rng(11);
  constexpr int64_t n = 5 * kQ6_KPValues;
  const auto src = random_blocks(size_t(n / 256), rng);
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
  EXPECT_EQ(file_type_traits(uint32_t(GgmlType::Q6_K_P)), nullptr) << "a GGUF file must not name it";
  EXPECT_FALSE(type_from_name("q6_kp").has_value()) << "not a --format choice";
  ASSERT_NE(find_type_traits(GgmlType::Q6_K_P), nullptr);
  EXPECT_EQ(type_name(GgmlType::Q6_K_P), "q6_kp");
  EXPECT_TRUE(can_dequantize(GgmlType::Q6_K_P));
  EXPECT_EQ(row_bytes(GgmlType::Q6_K_P, 768), 3u * 224u);
  EXPECT_EQ(row_bytes(GgmlType::Q6_K_P, 768) % 16, 0u) << "every row and block 16-byte aligned";
}

TEST(Q6_KP, PartialBlockIsAnError) {
  std::vector<uint8_t> src(210 * 2), dst(224 * 2);
  std::vector<float> v(300);
  EXPECT_THROW(repack_q6_k_p(src.data(), dst.data(), 300), Error);
  EXPECT_THROW(dequantize_row(GgmlType::Q6_K_P, dst.data(), v.data(), 300), Error);
}

// The CPU's exact product takes it too (dequantize + f32): the GPU tests' references use it.
TEST(Q6_KP, ExactMatmulSameBitsAsQ6_K) {
  std::mt19937 rng(12);
  const int64_t rows = 4, cols = 768, n_tok = 2;
  const auto w = random_blocks(size_t(rows * cols / 256), rng);
  const int64_t rb = int64_t(row_bytes(GgmlType::Q6_K, uint64_t(cols)));
  const int64_t rbp = int64_t(row_bytes(GgmlType::Q6_K_P, uint64_t(cols)));
  std::vector<uint8_t> wp(size_t(rows * rbp));
  for (int64_t r = 0; r < rows; ++r)
    repack_q6_k_p(reinterpret_cast<const uint8_t*>(w.data()) + r * rb, wp.data() + r * rbp, cols);
  std::vector<float> x(size_t(n_tok * cols));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng);
  ThreadPool pool(1);
  std::vector<float> y0(size_t(n_tok * rows)), yp(y0.size());
  matmul(GgmlType::Q6_K, w.data(), rows, cols, x.data(), n_tok, y0.data(), MatmulMode::Exact, pool);
  matmul(GgmlType::Q6_K_P, wp.data(), rows, cols, x.data(), n_tok, yp.data(), MatmulMode::Exact, pool);
  expect_same_bits(yp, y0, "exact matmul");
}
