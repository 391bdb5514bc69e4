// The 16-row Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL x Q8_32 prefill kernels (quant/q32_gemm.h): the AVX-512 kernels give the references'
// bits; the references' integer part is exact (at the extreme codes) and their float result stays within a
// rounding bound of the f64 dot of the dequantized weights and activations, on random matrices and on the
// fixture zoo's tensors of these formats; matmul dispatches to them (fast mode, >= kQ4kGemmMinTok tokens, whole
// 16-row groups) and only there.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/thread_pool.h"
#include "gguf/gguf.h"
#include "quant/dequant.h"
#include "quant/matmul.h"
#include "quant/q32_gemm.h"
#include "quant/q4k_gemm.h"
#include "quant/vec_dot.h"
#include "quant_test_util.h"

using namespace strata;
using namespace strata::test;

namespace {

struct GemmGuard {  // restores the switch whatever a test does
  bool was = q::q4k_gemm_enabled();
  ~GemmGuard() { q::q4k_gemm_set_enabled(was); }
};

using Gemm = q::Gemm16Fn;
Gemm ref_of(GgmlType t) { return q::gemm16_reference(t); }
Gemm kernel_of(GgmlType t) { return q::gemm16_kernel(t); }
const GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL};

std::vector<uint8_t> quantize_acts(const std::vector<float>& x, int64_t cols) {
  return quantize_act_rows(q::ActType::Q8_32, x, cols);
}

// Kernel == reference (bits), and reference ~ the f64 dot of the dequantized weights and activations, for 16
// rows of w (row_bytes apart).
void check_rows16(GgmlType type, const uint8_t* w, int64_t row_bytes, int64_t cols, const std::vector<uint8_t>& xq,
                  int64_t n_tok) {
  const int64_t xb = q::act_row_bytes(q::ActType::Q8_32, cols);
  std::vector<float> ref(size_t(16 * n_tok), -1.f), ker(size_t(16 * n_tok), -2.f);
  ref_of(type)(cols, w, row_bytes, xq.data(), xb, n_tok, ref.data(), 16);
  if (q::q4k_gemm_cpu_ok()) {
    kernel_of(type)(cols, w, row_bytes, xq.data(), xb, n_tok, ker.data(), 16);
    size_t differ = 0;
    for (size_t i = 0; i < ref.size(); ++i) differ += std::memcmp(&ref[i], &ker[i], 4) != 0;
    EXPECT_EQ(differ, 0u) << "first: ref " << ref[0] << " kernel " << ker[0];
  }
  // Each block rounds d * x.d, float(S) (exact below 2^24) and the FMA: a few ulps of its term.
  const double bound_ulps = 4.0 * double(cols / 32) * std::ldexp(1.0, -24);
  std::vector<float> wf(static_cast<size_t>(cols));
  double worst = 0;
  for (int r = 0; r < 16; ++r) {
    dequantize_row(type, w + r * row_bytes, wf.data(), cols);
    for (int64_t t = 0; t < n_tok; ++t) {
      const auto* x = reinterpret_cast<const q::BlockQ8A*>(xq.data() + t * xb);
      double dot = 0, mag = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double v = double(wf[size_t(c)]) * double(x[c / 32].d) * x[c / 32].qs[c % 32];
        dot += v, mag += std::fabs(v);
      }
      const double err = std::fabs(ref[size_t(t * 16 + r)] - dot);
      worst = std::max(worst, err / (mag + 1e-30));
      EXPECT_LE(err, bound_ulps * mag + 1e-30) << "row " << r << " token " << t;
    }
  }
  std::printf("%s cols %lld n_tok %lld: worst |ref - f64| / sum|wx| = %.3g (bound %.3g)\n",
              std::string(type_name(type)).c_str(), (long long)cols, (long long)n_tok, worst, bound_ulps);
}

std::vector<uint8_t> random_matrix(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<uint8_t> w;
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = random_row(type, cols, rng);
    w.insert(w.end(), row.begin(), row.end());
  }
  return w;
}

}  // namespace

TEST(Q32Gemm, KernelBitIdenticalToReferenceAndCloseToF64) {
  std::mt19937 rng(31);
  for (const GgmlType type : kTypes)
    for (const int64_t cols : {32, 256, 768, 2048})
      for (const int64_t n_tok : {1, 2, 3, 5, 8, 13, 19}) {
        SCOPED_TRACE(testing::Message() << type_name(type) << " cols " << cols << " n_tok " << n_tok);
        const auto w = random_matrix(type, 16, cols, rng);
        check_rows16(type, w.data(), int64_t(row_bytes(type, cols)), cols,
                     quantize_acts(random_tokens(n_tok, cols, rng), cols), n_tok);
      }
}

TEST(Q32Gemm, ExtremeCodesIntegerPartExact) {
  // Q4_0 codes 0 and 15 (values -8 and 7), Q8_0 codes -128 and 127, activations +-127: the largest sums.
  const int64_t cols = 2048;
  for (const GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0}) {
    SCOPED_TRACE(type_name(type));
    const int64_t rb = int64_t(row_bytes(type, cols)), bb = type == GgmlType::Q4_0 ? 18 : 34;
    std::vector<uint8_t> w(size_t(16 * rb));
    for (int r = 0; r < 16; ++r)
      for (int64_t b = 0; b < cols / 32; ++b) {
        uint8_t* blk = w.data() + r * rb + b * bb;
        const uint16_t d = q::fp32_to_fp16(r % 2 ? 0.5f : 1.f);
        std::memcpy(blk, &d, 2);
        const bool q4 = type == GgmlType::Q4_0;
        std::memset(blk + 2, r < 8 ? (q4 ? 0xFF : 0x7F) : (q4 ? 0x00 : 0x80), size_t(bb - 2));
      }
    std::vector<float> x(size_t(2 * cols));
    for (int64_t c = 0; c < cols; ++c) x[size_t(c)] = 1.f, x[size_t(cols + c)] = c % 2 ? -1.f : 1.f;
    check_rows16(type, w.data(), rb, cols, quantize_acts(x, cols), 2);
  }
}

TEST(Q32Gemm, FixtureZoo) {
  const auto f = gguf::File::open(std::string(STRATA_FIXTURES_DIR) + "/formats/zoo.gguf");
  std::mt19937 rng(32);
  int checked = 0;
  for (const auto& t : f.tensors()) {
    if (!q::q32_format(t.type) || t.n_rows() < 16) continue;
    SCOPED_TRACE(t.name);
    const int64_t cols = static_cast<int64_t>(t.ne[0]), rb = int64_t(row_bytes(t.type, uint64_t(cols)));
    const auto xq = quantize_acts(random_tokens(11, cols, rng), cols);
    for (uint64_t r0 = 0; r0 + 16 <= t.n_rows(); r0 += 16) check_rows16(t.type, t.data + r0 * rb, rb, cols, xq, 11);
    ++checked;
  }
  EXPECT_EQ(checked, 6) << "zoo.gguf's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL tensors";
}

TEST(Q32Gemm, MatmulDispatch) {
  if (!q::q4k_gemm_cpu_ok()) GTEST_SKIP() << "no AVX-512 VNNI at the level in use";
  GemmGuard guard;
  ThreadPool pool(2);
  std::mt19937 rng(33);
  struct Shape {
    int64_t rows, cols, n_tok;
  };
  for (const GgmlType type : kTypes)
    for (const Shape s : {Shape{768, 2048, 37}, Shape{2048, 768, 64}, Shape{40, 512, 21}, Shape{40, 512, 9},
                          Shape{40, 512, 8}, Shape{8, 256, 17}}) {
      SCOPED_TRACE(testing::Message() << type_name(type) << " " << s.rows << "x" << s.cols << " n_tok " << s.n_tok);
      const auto w = random_matrix(type, s.rows, s.cols, rng);
      const auto x = random_tokens(s.n_tok, s.cols, rng);
      std::vector<float> off(size_t(s.rows * s.n_tok)), on(off.size(), -1.f);
      q::q4k_gemm_set_enabled(false);
      matmul(type, w.data(), s.rows, s.cols, x.data(), s.n_tok, off.data(), MatmulMode::Fast, pool);
      q::q4k_gemm_set_enabled(true);
      matmul(type, w.data(), s.rows, s.cols, x.data(), s.n_tok, on.data(), MatmulMode::Fast, pool);
      const bool used = s.n_tok >= q::gemm16_min_tokens(type) && s.rows >= 16;
      const auto xq = quantize_acts(x, s.cols);
      const int64_t xb = q::act_row_bytes(q::ActType::Q8_32, s.cols), rb = int64_t(row_bytes(type, uint64_t(s.cols)));
      size_t differ_ref = 0, differ_off = 0, same_off = 0;
      std::vector<float> ref(size_t(16 * s.n_tok));
      for (int64_t g = 0; g + 16 <= s.rows; g += 16) {
        ref_of(type)(s.cols, w.data() + g * rb, rb, xq.data(), xb, s.n_tok, ref.data(), 16);
        for (int64_t t = 0; t < s.n_tok; ++t)
          for (int r = 0; r < 16; ++r) {
            differ_ref += std::memcmp(&ref[size_t(t * 16 + r)], &on[size_t(t * s.rows + g + r)], 4) != 0;
            same_off += std::memcmp(&off[size_t(t * s.rows + g + r)], &on[size_t(t * s.rows + g + r)], 4) == 0;
          }
      }
      for (int64_t r = s.rows / 16 * 16; r < s.rows; ++r)  // rows outside whole groups: the decode kernels
        for (int64_t t = 0; t < s.n_tok; ++t)
          differ_off += std::memcmp(&off[size_t(t * s.rows + r)], &on[size_t(t * s.rows + r)], 4) != 0;
      EXPECT_EQ(differ_off, 0u);
      if (used) {
        EXPECT_EQ(differ_ref, 0u);
        // the two paths round differently: most values differ in the last bits (proves the kernel ran)
        EXPECT_LT(same_off, size_t((s.rows / 16 * 16) * s.n_tok / 2));
      } else {
        EXPECT_EQ(std::memcmp(off.data(), on.data(), off.size() * 4), 0);
      }
      double worst = 0;
      for (size_t i = 0; i < on.size(); ++i) worst = std::max(worst, double(std::fabs(on[i] - off[i])));
      std::printf("%s %lldx%lld n_tok %lld: max |gemm16 - decode kernels| = %.3g\n",
                  std::string(type_name(type)).c_str(), (long long)s.cols, (long long)s.rows, (long long)s.n_tok, worst);
    }
}
