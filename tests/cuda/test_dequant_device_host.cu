// The device block decoders of src/cuda/dequant_device.cuh, run on the host (they are __host__
// __device__): every unit of every zoo tensor (fixtures/formats/zoo.gguf) with a GPU kernel, through both
// load paths (A = 1 byte loads and the format's aligned loads), bit for bit against strata::dequantize_row.
// Runs without a GPU: it checks the layouts and the order of float operations; the GPU tests check the
// device arithmetic on top.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/dequant_device.cuh"
#include "gguf/gguf.h"
#include "quant/dequant.h"
#include "quant/iq_tables.h"
#include "quant/q4_0_x8.h"
#include "quant/q6_k_p.h"
#include "quant/q6_k_x8.h"

namespace {

using namespace strata;
namespace dq = strata::cuda::dq;

template <typename F, int A>
int64_t count_mismatches(const uint8_t* row, int64_t cols, const float* ref, const std::string& what) {
  int64_t bad = 0;
  const int64_t units = cols / F::kVals * (F::kVals / 8);
  for (int64_t u = 0; u < units; ++u) {
    float v[8];
    F::template deq8<A>(row + (u / (F::kVals / 8)) * F::kBytes, int(u % (F::kVals / 8)), v);
    for (int k = 0; k < 8; ++k)
      if (std::memcmp(&v[k], &ref[u * 8 + k], 4) != 0 && bad++ < 3)
        ADD_FAILURE() << what << " A=" << A << " value " << u * 8 + k << ": device decoder " << v[k] << ", cpu "
                      << ref[u * 8 + k];
  }
  if constexpr (F::kFloat)
    for (int64_t c = units * 8; c < cols; ++c) {
      const float x = F::one(row, c);
      bad += std::memcmp(&x, &ref[c], 4) != 0;
    }
  return bad;
}

TEST(CudaDequantDecodersOnHost, ZooBitExact) {
  const auto f = gguf::File::open(std::string(STRATA_FIXTURES_DIR) + "/formats/zoo.gguf");
  int checked = 0;
  for (const auto& t : f.tensors()) {
    const int64_t cols = static_cast<int64_t>(t.ne[0]), rows = static_cast<int64_t>(t.n_elements()) / cols;
    const int64_t rb = static_cast<int64_t>(row_bytes(t.type, cols));
    const bool has = dq::dispatch(t.type, [&](auto fmt) {
      using F = decltype(fmt);
      std::vector<uint64_t> aligned((rb + 7) / 8 + 2);  // 16-byte aligned copy of a row
      auto* row = reinterpret_cast<uint8_t*>(aligned.data());
      ASSERT_EQ(reinterpret_cast<uintptr_t>(row) % 16, 0u);
      std::vector<float> ref(cols);
      int64_t bad = 0;
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(row, t.data + r * rb, rb);
        dequantize_row(t.type, row, ref.data(), cols);
        bad += count_mismatches<F, 1>(row, cols, ref.data(), t.name);
        bad += count_mismatches<F, F::kAlign>(row, cols, ref.data(), t.name);
      }
      EXPECT_EQ(bad, 0) << t.name << ": values differ";
    });
    checked += has;
  }
  EXPECT_EQ(checked, 22);  // every format of the zoo
  std::printf("%d zoo tensors decoded bit-exactly by the device decoders (host run)\n", checked);
}

// Q4_0_X8 (strata's regrouped Q4_0, quant/q4_0_x8.h) is in no file: the zoo's Q4_0 tensor regrouped must
// decode, through both load paths, to ggml's Q4_0 values.
TEST(CudaDequantDecodersOnHost, ZooQ4_0RegroupedBitExact) {
  const auto f = gguf::File::open(std::string(STRATA_FIXTURES_DIR) + "/formats/zoo.gguf");
  const gguf::TensorInfo* t = f.find_tensor("zoo.q4_0");
  ASSERT_NE(t, nullptr);
  const int64_t cols = static_cast<int64_t>(t->ne[0]), rows = static_cast<int64_t>(t->n_rows());
  const int64_t rb = static_cast<int64_t>(row_bytes(GgmlType::Q4_0, cols));
  using F = dq::Fmt<GgmlType::Q4_0_X8>;
  std::vector<uint64_t> aligned((rb + 7) / 8 + 2);
  auto* row = reinterpret_cast<uint8_t*>(aligned.data());
  ASSERT_EQ(reinterpret_cast<uintptr_t>(row) % 16, 0u);
  std::vector<float> ref(cols);
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(GgmlType::Q4_0, t->data + r * rb, ref.data(), cols);
    repack_q4_0_x8(t->data + r * rb, row, cols);
    bad += count_mismatches<F, 1>(row, cols, ref.data(), "zoo.q4_0 as q4_0x8");
    bad += count_mismatches<F, F::kAlign>(row, cols, ref.data(), "zoo.q4_0 as q4_0x8");
  }
  EXPECT_EQ(bad, 0);
  bool has = false;
  dq::dispatch(GgmlType::Q4_0_X8, [&](auto fmt) { has = std::is_same_v<decltype(fmt), F>; });
  EXPECT_TRUE(has) << "the one dispatch knows q4_0x8";
}

// The zoo's Q6_K tensor (32 rows of 256, contiguous) stored as strata's type F (T), taken as one 8192-value
// row and converted by `store`: it must decode, through both load paths, to ggml's Q6_K values; and the one
// dispatch must know F.
template <GgmlType T, typename Store>
void expect_zoo_q6_k_as(Store store, const std::string& what) {
  const auto f = gguf::File::open(std::string(STRATA_FIXTURES_DIR) + "/formats/zoo.gguf");
  const gguf::TensorInfo* t = f.find_tensor("zoo.q6_k");
  ASSERT_NE(t, nullptr);
  const int64_t n = static_cast<int64_t>(t->ne[0]) * static_cast<int64_t>(t->n_rows());
  const int64_t bytes = static_cast<int64_t>(row_bytes(T, n));
  using F = dq::Fmt<T>;
  std::vector<uint64_t> aligned((bytes + 7) / 8 + 2);
  auto* row = reinterpret_cast<uint8_t*>(aligned.data());
  ASSERT_EQ(reinterpret_cast<uintptr_t>(row) % 16, 0u);
  std::vector<float> ref(n);
  dequantize_row(GgmlType::Q6_K, t->data, ref.data(), n);
  store(t->data, row, n);
  int64_t bad = count_mismatches<F, 1>(row, n, ref.data(), what);
  bad += count_mismatches<F, F::kAlign>(row, n, ref.data(), what);
  EXPECT_EQ(bad, 0);
  bool has = false;
  dq::dispatch(T, [&](auto fmt) { has = std::is_same_v<decltype(fmt), F>; });
  EXPECT_TRUE(has) << "the one dispatch knows " << type_name(T);
}

// Q6_K_X8 (strata's regrouped Q6_K, quant/q6_k_x8.h; the 8192 values are 4 whole groups) and Q6_K_P (padded,
// quant/q6_k_p.h) are in no file.
TEST(CudaDequantDecodersOnHost, ZooQ6_KRegroupedBitExact) {
  expect_zoo_q6_k_as<GgmlType::Q6_K_X8>(repack_q6_k_x8, "zoo.q6_k as q6_kx8");
}
TEST(CudaDequantDecodersOnHost, ZooQ6_KPaddedBitExact) {
  expect_zoo_q6_k_as<GgmlType::Q6_K_P>(repack_q6_k_p, "zoo.q6_k as q6_kp");
}

// The device grid tables (generated copies) hold exactly quant/iq_tables.cpp's values.
TEST(CudaDequantDecodersOnHost, DeviceGridTablesMatchQuantTables) {
#define STRATA_CHECK_TABLE(T, macro, host)                                                     \
  {                                                                                           \
    static const T copy[] = macro;                                                            \
    ASSERT_EQ(sizeof(copy), sizeof(strata::iq::host)) << #host;                               \
    EXPECT_EQ(std::memcmp(copy, strata::iq::host, sizeof(copy)), 0) << #host << " differs"; \
  }
  STRATA_CHECK_TABLE(uint8_t, STRATA_IQ_INIT_IQ2_SIGNS, kIq2Signs)
  STRATA_CHECK_TABLE(uint64_t, STRATA_IQ_INIT_IQ2XXS_GRID, kIq2xxsGrid)
  STRATA_CHECK_TABLE(uint64_t, STRATA_IQ_INIT_IQ2XS_GRID, kIq2xsGrid)
  STRATA_CHECK_TABLE(uint64_t, STRATA_IQ_INIT_IQ2S_GRID, kIq2sGrid)
  STRATA_CHECK_TABLE(uint32_t, STRATA_IQ_INIT_IQ3XXS_GRID, kIq3xxsGrid)
  STRATA_CHECK_TABLE(uint32_t, STRATA_IQ_INIT_IQ3S_GRID, kIq3sGrid)
  STRATA_CHECK_TABLE(uint64_t, STRATA_IQ_INIT_IQ1S_GRID, kIq1sGrid)
#undef STRATA_CHECK_TABLE
}

// A float tail (cols not a multiple of 8) through one().
TEST(CudaDequantDecodersOnHost, FloatTail) {
  std::vector<uint16_t> h(13);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(0x3c00 + 37 * i);
  std::vector<float> ref(h.size());
  dequantize_row(GgmlType::F16, h.data(), ref.data(), 13);
  EXPECT_EQ((count_mismatches<dq::Fmt<GgmlType::F16>, 1>(reinterpret_cast<const uint8_t*>(h.data()), 13, ref.data(),
                                                         "f16 tail")),
            0);
}

}  // namespace
