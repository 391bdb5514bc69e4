#pragma once
// Shared by the GPU kernel tests: a fixture owning a Device and a Transfer (skipped without a GPU, run
// with the stream-order checker on), device buffers filled and read back only through the transfer
// module, and random weights of any ggml type (quantized from random floats where quant/ has a
// quantizer, else random bits with sane f16 scales).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "../quant_test_util.h"
#include "cpu/thread_pool.h"
#include "cuda/cuda_check.cuh"
#include "cuda/device.h"
#include "cuda/transfer.h"
#include "quant/q4_0_x8.h"
#include "quant/q6_k_p.h"
#include "quant/q6_k_x8.h"
#include "quant/quantize.h"
#include "quant/types.h"

namespace strata::test {

// The low-bit formats with int8-activation kernels (cuda::q8ref::low_bit; session 33), for the GPU tests that
// run each of them.
inline constexpr GgmlType kLowBitTypes[] = {GgmlType::Q2_K,    GgmlType::Q3_K,   GgmlType::IQ4_XS, GgmlType::IQ4_NL,
                                            GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S,  GgmlType::IQ3_XXS,
                                            GgmlType::IQ3_S,   GgmlType::IQ1_S,  GgmlType::IQ1_M};

class GpuKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    stream_check::set_enabled(true);
    stream_check::global().take_reports();
    dev = std::make_unique<cuda::Device>(0);
    xfer = std::make_unique<cuda::Transfer>(*dev);
  }
  void TearDown() override {
    if (dev) dev->synchronize();
    for (const auto& r : stream_check::global().take_reports()) ADD_FAILURE() << "stream-order checker: " << r.message;
    xfer.reset();
    dev.reset();
  }

  cudaStream_t stream() { return dev->compute().handle(); }

  // A device buffer of `bytes` (at least 16) holding `src` at byte offset `offset` (to test unaligned
  // pointers); span() of the whole buffer, ptr() of the data.
  struct Buf {
    cuda::DeviceBuffer mem;
    size_t offset = 0;
    template <typename T = void>
    T* ptr() const { return reinterpret_cast<T*>(static_cast<uint8_t*>(mem.data()) + offset); }
    cuda::DevSpan span() const { return mem.span(); }
  };
  Buf upload(const void* src, size_t bytes, size_t offset = 0) {
    Buf b;
    b.offset = offset;
    b.mem = dev->alloc(bytes + offset + 16, "test buffer");
    std::vector<uint8_t> staged(bytes + offset, 0);
    if (bytes) std::memcpy(staged.data() + offset, src, bytes);
    xfer->upload(b.mem.span(), staged.data(), staged.size(), dev->compute(), {&dev->compute()});
    return b;
  }
  template <typename T>
  Buf upload_vec(const std::vector<T>& v, size_t offset = 0) { return upload(v.data(), v.size() * sizeof(T), offset); }
  // An output buffer of `bytes`, every byte set to `fill`.
  Buf output(size_t bytes, unsigned char fill = 0xFF) {
    Buf b;
    b.mem = dev->alloc(bytes + 16, "test output");
    xfer->fill(b.mem.span(), fill, dev->compute(), {&dev->compute()});
    return b;
  }
  template <typename T>
  std::vector<T> download(const Buf& b, size_t count) {
    std::vector<uint8_t> raw(b.offset + count * sizeof(T));
    xfer->download_sync(raw.data(), b.span(), raw.size(), dev->compute());
    std::vector<T> out(count);
    std::memcpy(out.data(), raw.data() + b.offset, count * sizeof(T));
    return out;
  }

  std::unique_ptr<cuda::Device> dev;
  std::unique_ptr<cuda::Transfer> xfer;
};

// rows x cols weights of type t, rows contiguous. Quantizing is slow (~10 M values/s per thread for the
// K-quants): rows are quantized in parallel on the shared test pool.
inline ThreadPool& test_pool() {
  static ThreadPool pool(0);
  return pool;
}
inline std::vector<uint8_t> random_weights(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t rb = static_cast<int64_t>(row_bytes(t, cols));
  std::vector<uint8_t> w(rb * rows);
  if (t == GgmlType::Q4_0_X8) {  // strata's storage type: random Q4_0 rows, regrouped
    const auto q = random_weights(GgmlType::Q4_0, rows, cols, rng);
    for (int64_t r = 0; r < rows; ++r) repack_q4_0_x8(q.data() + r * rb, w.data() + r * rb, cols);
    return w;
  }
  if (t == GgmlType::Q6_K_X8) {  // strata's storage type: random Q6_K rows, regrouped
    const auto q = random_weights(GgmlType::Q6_K, rows, cols, rng);
    for (int64_t r = 0; r < rows; ++r) repack_q6_k_x8(q.data() + r * rb, w.data() + r * rb, cols);
    return w;
  }
  if (t == GgmlType::Q6_K_P) {  // strata's storage type: random Q6_K rows, padded (224 bytes a block)
    const auto q = random_weights(GgmlType::Q6_K, rows, cols, rng);
    const int64_t qrb = static_cast<int64_t>(row_bytes(GgmlType::Q6_K, cols));
    for (int64_t r = 0; r < rows; ++r) repack_q6_k_p(q.data() + r * qrb, w.data() + r * rb, cols);
    return w;
  }
  if (can_quantize(t)) {
    std::normal_distribution<float> nd(0.f, 0.05f);
    std::vector<float> f(rows * cols);
    for (auto& v : f) v = nd(rng);
    test_pool().parallel_for(rows, 8, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) quantize_row(t, f.data() + r * cols, w.data() + r * rb, cols);
    });
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      const auto row = random_row(t, cols, rng);
      std::memcpy(w.data() + r * rb, row.data(), rb);
    }
  }
  return w;
}

inline bool same_bits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

}  // namespace strata::test
