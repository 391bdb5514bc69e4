// Dequantization vs ggml's own values: every tensor of fixtures/formats/zoo.gguf must dequantize bit for
// bit to zoo.dequant.sdq (SDQ2 format, fixtures README). And every tensor of the fixture models must
// dequantize to finite values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "gguf/gguf.h"
#include "quant/dequant.h"
#include "quant/quantize.h"
#include "sdq_reader.h"

using namespace strata;

namespace {

const std::string kFixtures = STRATA_FIXTURES_DIR;

std::vector<float> dequantize_tensor(const gguf::TensorInfo& t) {
  std::vector<float> v(t.n_elements());
  const uint64_t rb = row_bytes(t.type, t.ne[0]);
  for (uint64_t r = 0; r < t.n_rows(); ++r)
    dequantize_row(t.type, t.data + r * rb, v.data() + r * t.ne[0], static_cast<int64_t>(t.ne[0]));
  return v;
}

}  // namespace

TEST(QuantDequant, ZooBitExactWithGgml) {
  const auto ref = test::read_sdq(kFixtures + "/formats/zoo.dequant.sdq");
  const auto f = gguf::File::open(kFixtures + "/formats/zoo.gguf");
  int compared = 0;
  for (const auto& t : f.tensors()) {
    const auto values = dequantize_tensor(t);
    auto it = ref.find(t.name);
    if (it == ref.end()) {
      // The README: the SDQ holds every non-f32 tensor; f32 dequantizes to itself.
      ASSERT_EQ(t.type, GgmlType::F32) << t.name << " has no reference";
      ASSERT_EQ(std::memcmp(values.data(), t.data, t.nbytes), 0);
      continue;
    }
    const test::SdqTensor& r = it->second;
    ASSERT_EQ(static_cast<uint32_t>(t.type), r.type) << t.name;
    ASSERT_EQ(r.head.size(), values.size()) << t.name << ": the reference holds every value";
    size_t mismatches = 0;
    double sum = 0, sum_sq = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &values[i], 4);
      std::memcpy(&b, &r.head[i], 4);
      if (a != b && mismatches++ < 3)
        ADD_FAILURE() << t.name << "[" << i << "] = " << values[i] << ", ggml " << r.head[i];
      sum += values[i], sum_sq += double(values[i]) * values[i];
    }
    EXPECT_EQ(mismatches, 0u) << t.name;
    EXPECT_NEAR(sum, r.sum, 1e-9 * std::max(1.0, std::fabs(r.sum)) + 1e-6) << t.name;
    EXPECT_NEAR(sum_sq, r.sum_sq, 1e-9 * r.sum_sq + 1e-6) << t.name;
    ++compared;
  }
  // 22 formats: every one but f32 has a reference.
  EXPECT_EQ(compared, 21);
  std::printf("%d zoo tensors bit-exact\n", compared);
}

TEST(QuantDequant, FixtureModelsDequantizeToFiniteValues) {
  const char* models[] = {"IQ1_M", "IQ2_XS", "IQ3_S", "IQ4_XS", "Q2_K", "Q4_K_M", "Q6_K", "Q8_0"};
  int tensors = 0;
  for (const char* m : models) {
    const auto f = gguf::File::open(kFixtures + "/models/tiny-qwen3moe-A-" + std::string(m) + ".gguf");
    for (const auto& t : f.tensors()) {
      const auto v = dequantize_tensor(t);
      double s = 0;
      for (float x : v) s += x;
      EXPECT_TRUE(std::isfinite(s)) << m << " " << t.name;
      ++tensors;
    }
  }
  for (const char* m : {"IQ2_XS", "Q4_K_M"}) {
    const auto f = gguf::File::open(kFixtures + "/models/tiny-qwen3next-N-" + std::string(m) + ".gguf");
    for (const auto& t : f.tensors()) {
      const auto v = dequantize_tensor(t);
      double s = 0;
      for (float x : v) s += x;
      EXPECT_TRUE(std::isfinite(s)) << m << " " << t.name;
      ++tensors;
    }
  }
  EXPECT_GT(tensors, 200);
}

TEST(QuantDequant, UnsupportedTypeIsAnError) {
  uint8_t buf[64] = {};
  float out[256];
  try {
    dequantize_row(GgmlType::TQ2_0, buf, out, 256);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported type tq2_0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_row(GgmlType::Q4_K, buf, out, 100), Error);
  EXPECT_FALSE(can_dequantize(GgmlType::I32));
  EXPECT_TRUE(can_dequantize(GgmlType::IQ1_M));
}

// Our Q4_0 quantizer on ggml's own Q4_0 values gives ggml's bytes back: ggml maps each block's value of
// largest magnitude to code 0 (d = m / -8), so its dequantized block has m = -8 d exactly and every value
// on the code grid; re-encoding must find the same d and codes (a check of the scale rule and nibble order
// against the ground truth, not against our own dequantizer alone).
TEST(QuantDequant, ZooQ4_0ReencodesToGgmlBytes) {
  const auto f = gguf::File::open(kFixtures + "/formats/zoo.gguf");
  int found = 0;
  for (const auto& t : f.tensors()) {
    if (t.type != GgmlType::Q4_0) continue;
    ++found;
    const auto values = dequantize_tensor(t);
    std::vector<uint8_t> bytes(t.nbytes);
    const uint64_t rb = row_bytes(t.type, t.ne[0]);
    for (uint64_t r = 0; r < t.n_rows(); ++r)
      quantize_row(t.type, values.data() + r * t.ne[0], bytes.data() + r * rb, static_cast<int64_t>(t.ne[0]));
    size_t differ = 0;
    for (size_t i = 0; i < bytes.size(); ++i) differ += bytes[i] != t.data[i];
    EXPECT_EQ(differ, 0u) << t.name << ": " << differ << " of " << bytes.size() << " bytes differ";
  }
  EXPECT_EQ(found, 1) << "zoo.gguf holds one Q4_0 tensor (fixtures README)";
}
