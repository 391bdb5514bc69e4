// Q4_0_X8 (quant/q4_0_x8.h), the GPU's storage for Q4_0 experts: the repack keeps every value (bit for bit
// against ggml's dequantization of the fixture zoo's Q4_0 tensor and against our Q4_0 dequantization of
// random blocks), keeps the bytes per row, and is strata's own type: no file may name it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "gguf/gguf.h"
#include "quant/blocks.h"
#include "cpu/thread_pool.h"
#include "quant/dequant.h"
#include "quant/matmul.h"
#include "quant/q4_0_x8.h"
#include "quant/types.h"
#include "bits_test_util.h"
#include "sdq_reader.h"

using namespace strata;
using test::expect_same_bits;

namespace {

const std::string kFixtures = STRATA_FIXTURES_DIR;

}  // namespace

TEST(Q4_0X8, ZooTensorKeepsGgmlValues) {
  const auto ref = test::read_sdq(kFixtures + "/formats/zoo.dequant.sdq");
  const auto f = gguf::File::open(kFixtures + "/formats/zoo.gguf");
  const gguf::TensorInfo* t = f.find_tensor("zoo.q4_0");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->type, GgmlType::Q4_0);
  ASSERT_EQ(t->ne[0] % kQ4_0X8Values, 0u) << "the zoo's rows are whole groups";
  const int64_t cols = int64_t(t->ne[0]), rows = int64_t(t->n_rows());
  const uint64_t rb = row_bytes(GgmlType::Q4_0, uint64_t(cols));
  ASSERT_EQ(row_bytes(GgmlType::Q4_0_X8, uint64_t(cols)), rb);
  std::vector<uint8_t> packed(size_t(rb * rows));
  std::vector<float> values(size_t(cols * rows));
  for (int64_t r = 0; r < rows; ++r) {
    repack_q4_0_x8(t->data + r * rb, packed.data() + r * rb, cols);
    dequantize_row(GgmlType::Q4_0_X8, packed.data() + r * rb, values.data() + r * cols, cols);
  }
  expect_same_bits(values, ref.at("zoo.q4_0").head, "zoo.q4_0 as q4_0x8");
}

TEST(Q4_0X8, RandomBlocksLayoutAndValues) {
  std::mt19937 rng(7);
  constexpr int64_t n = 3 * kQ4_0X8Values;
  std::vector<q::BlockQ4_0> src(n / 32);
  for (auto& b : src) {
    // Scales over the f16 range without NaN/inf (exponent < 31), both signs; codes: any byte.
    b.d = uint16_t(rng() & 0xFBFF);
    for (auto& c : b.qs) c = uint8_t(rng());
  }
  std::vector<uint8_t> packed(size_t(n / kQ4_0X8Values * kQ4_0X8Bytes));
  ASSERT_EQ(packed.size(), src.size() * sizeof(q::BlockQ4_0));
  repack_q4_0_x8(src.data(), packed.data(), n);
  for (size_t i = 0; i < src.size(); ++i) {  // the layout of quant/q4_0_x8.h, byte for byte
    const uint8_t* g = packed.data() + (i / 8) * kQ4_0X8Bytes;
    const int k = int(i % 8);
    EXPECT_EQ(std::memcmp(g + 2 * k, &src[i].d, 2), 0) << "block " << i;
    EXPECT_EQ(std::memcmp(g + 16 + 16 * k, src[i].qs, 16), 0) << "block " << i;
  }
  std::vector<float> a(n), b(n);
  dequantize_row(GgmlType::Q4_0, src.data(), a.data(), n);
  dequantize_row(GgmlType::Q4_0_X8, packed.data(), b.data(), n);
  expect_same_bits(b, a, "random q4_0x8");
}

TEST(Q4_0X8, IsStrataOwnType) {
  ASSERT_NO_FATAL_FAILURE(test::expect_strata_own_type(GgmlType::Q4_0_X8, "q4_0x8"));
  for (uint64_t cols : {256u, 768u, 2048u, 4096u})
    EXPECT_EQ(row_bytes(GgmlType::Q4_0_X8, cols), row_bytes(GgmlType::Q4_0, cols)) << cols;
}

TEST(Q4_0X8, PartialGroupIsAnError) {
  std::vector<uint8_t> src(18 * 9), dst(src.size());
  std::vector<float> v(288);
  EXPECT_THROW(repack_q4_0_x8(src.data(), dst.data(), 288), Error);
  EXPECT_THROW(dequantize_row(GgmlType::Q4_0_X8, src.data(), v.data(), 288), Error);
}

// The CPU's exact product takes it too (dequantize + f32): the GPU tests' references use it.
TEST(Q4_0X8, ExactMatmulSameBitsAsQ4_0) {
  std::mt19937 rng(9);
  const int64_t rows = 5, cols = 512, n_tok = 3;
  std::vector<q::BlockQ4_0> w(size_t(rows * cols / 32));
  for (auto& b : w) {
    b.d = uint16_t(0x2000 + (rng() & 0x0FFF));  // small positive scales
    for (auto& c : b.qs) c = uint8_t(rng());
  }
  std::vector<uint8_t> w8(w.size() * sizeof(q::BlockQ4_0));
  const int64_t rb = int64_t(row_bytes(GgmlType::Q4_0, uint64_t(cols)));
  for (int64_t r = 0; r < rows; ++r)
    repack_q4_0_x8(reinterpret_cast<const uint8_t*>(w.data()) + r * rb, w8.data() + r * rb, cols);
  std::vector<float> x(size_t(n_tok * cols));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng);
  ThreadPool pool(1);
  std::vector<float> y0(size_t(n_tok * rows)), y8(y0.size());
  matmul(GgmlType::Q4_0, w.data(), rows, cols, x.data(), n_tok, y0.data(), MatmulMode::Exact, pool);
  matmul(GgmlType::Q4_0_X8, w8.data(), rows, cols, x.data(), n_tok, y8.data(), MatmulMode::Exact, pool);
  expect_same_bits(y8, y0, "exact matmul");
}
