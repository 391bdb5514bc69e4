// The 16-row Q4_K (and Q2_K, Q3_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) x Q8_K prefill kernels (quant/q4k_gemm.h): the AVX-512 kernel gives the reference's
// bits (same integer sums, same float steps); the reference's integer part is exact (checked against
// int64 sums at the extreme values) and its float result stays within a rounding bound of the
// dequantized f64 dot product, on random matrices and on the fixture zoo's Q4_K and Q6_K tensors; matmul
// dispatches to it (fast mode, Q4_K, >= 8 tokens, whole 16-row groups) and only there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_features.h"
#include "gguf/gguf.h"
#include "quant/dequant.h"
#include "quant/matmul.h"
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

q::Gemm16Fn ref_of(GgmlType t) { return q::gemm16_reference(t); }
q::Gemm16Fn kernel_of(GgmlType t) { return q::gemm16_kernel(t); }
const GgmlType kTypes[] = {GgmlType::Q2_K,    GgmlType::Q3_K,   GgmlType::Q4_K,  GgmlType::Q5_K,
                           GgmlType::Q6_K,    GgmlType::IQ4_XS, GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
                           GgmlType::IQ2_S,   GgmlType::IQ3_XXS, GgmlType::IQ3_S,  GgmlType::IQ1_S,
                           GgmlType::IQ1_M};
bool has_kernel(GgmlType t) { return std::find(std::begin(kTypes), std::end(kTypes), t) != std::end(kTypes); }

std::vector<uint8_t> quantize_acts(const std::vector<float>& x, int64_t cols) {
  return quantize_act_rows(q::ActType::Q8_K, x, cols);
}

// f64 dot of the dequantized weights and the dequantized Q8_K activations (the real-number value the
// integer formula computes exactly), and sum |w x| for the rounding bound.
void f64_dot(GgmlType type, const uint8_t* w, int64_t cols, const uint8_t* xq, double* dot, double* mag) {
  std::vector<float> wf(cols);
  dequantize_row(type, w, wf.data(), cols);
  const auto* x = reinterpret_cast<const q::BlockQ8_K*>(xq);
  double s = 0, m = 0;
  for (int64_t c = 0; c < cols; ++c) {
    const double v = double(wf[c]) * (double(x[c / 256].d) * x[c / 256].qs[c % 256]);
    s += v;
    m += std::fabs(v);
  }
  *dot = s;
  *mag = m;
}

// Checks kernel == reference (bits) and reference ~ f64 for 16 rows of w (row_bytes apart).
void check_rows16(GgmlType type, const uint8_t* w, int64_t row_bytes, int64_t cols, const std::vector<uint8_t>& xq,
                  int64_t n_tok) {
  const int64_t xb = q::act_row_bytes(q::ActType::Q8_K, cols);
  std::vector<float> ref(16 * n_tok, -1.f), ker(16 * n_tok, -2.f);
  ref_of(type)(cols, w, row_bytes, xq.data(), xb, n_tok, ref.data(), 16);
  if (q::q4k_gemm_cpu_ok()) {
    kernel_of(type)(cols, w, row_bytes, xq.data(), xb, n_tok, ker.data(), 16);
    size_t differ = 0;
    for (size_t i = 0; i < ref.size(); ++i) differ += std::memcmp(&ref[i], &ker[i], 4) != 0;
    EXPECT_EQ(differ, 0u) << "first: ref " << ref[0] << " kernel " << ker[0];
  }
  // float part: each super-block adds 2 FMAs (and rounds d * x.d, dmin * x.d, float(S), float(M)):
  // a few ulps of the terms per block.
  const double bound_ulps = 8.0 * (cols / 256) * std::ldexp(1.0, -24);
  double worst = 0;
  for (int r = 0; r < 16; ++r)
    for (int64_t t = 0; t < n_tok; ++t) {
      double dot, mag;
      f64_dot(type, w + r * row_bytes, cols, xq.data() + t * xb, &dot, &mag);
      const double err = std::fabs(ref[t * 16 + r] - dot);
      worst = std::max(worst, err / (mag + 1e-30));
      EXPECT_LE(err, bound_ulps * mag + 1e-30) << "row " << r << " token " << t << ": " << ref[t * 16 + r] << " vs " << dot;
    }
  std::printf("%s cols %lld n_tok %lld: worst |ref - f64| / sum|wx| = %.3g (bound %.3g)\n", std::string(type_name(type)).c_str(), (long long)cols,
              (long long)n_tok, worst, bound_ulps);
}

}  // namespace

TEST(Q4kGemm, KernelBitIdenticalToReferenceAndCloseToF64) {
  std::mt19937 rng(21);
  for (const GgmlType type : kTypes)
    for (const int64_t cols : {256, 768, 2048})
      for (const int64_t n_tok : {1, 2, 3, 5, 8, 13, 19}) {
        SCOPED_TRACE(testing::Message() << type_name(type) << " cols " << cols << " n_tok " << n_tok);
        std::vector<uint8_t> w;
        for (int r = 0; r < 16; ++r) {
          const auto row = random_row(type, cols, rng);
          w.insert(w.end(), row.begin(), row.end());
        }
        check_rows16(type, w.data(), row_bytes(type, cols), cols, quantize_acts(random_tokens(n_tok, cols, rng), cols),
                     n_tok);
      }
}

TEST(Q4kGemm, ExtremeValuesIntegerPartExact) {
  // Every quant 15, every scale and min 63, activations all +-127: the largest integer sums.
  const int64_t cols = 2048, nb = cols / 256, rb = row_bytes(GgmlType::Q4_K, cols);
  std::vector<uint8_t> w(16 * rb, 0xFF);
  for (int r = 0; r < 16; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      auto* blk = reinterpret_cast<q::BlockQ4_K*>(w.data() + r * rb) + b;
      blk->d = q::fp32_to_fp16(1.f);
      blk->dmin = q::fp32_to_fp16(0.5f);
    }
  std::vector<float> x(2 * cols);
  for (int64_t c = 0; c < cols; ++c) x[c] = 1.f, x[cols + c] = c % 2 ? -1.f : 1.f;
  const auto xq = quantize_acts(x, cols);
  const int64_t xb = q::act_row_bytes(q::ActType::Q8_K, cols);
  std::vector<float> ref(16 * 2);
  q::q4k_gemm16_ref(cols, w.data(), rb, xq.data(), xb, 2, ref.data(), 16);
  // int64 sums of the same formula, then the float steps in f64: the float result may differ from them
  // only by the float rounding (S per block is ~3.1e7 > 2^24 here, so float(S) itself rounds)
  for (int t = 0; t < 2; ++t) {
    const auto* xb8 = reinterpret_cast<const q::BlockQ8_K*>(xq.data() + t * xb);
    double want = 0;
    for (int64_t b = 0; b < nb; ++b) {
      int64_t S = 0, M = 0;
      for (int i = 0; i < 256; ++i) S += int64_t(63) * 15 * xb8[b].qs[i];
      for (int i = 0; i < 256; ++i) M += int64_t(63) * xb8[b].qs[i];
      want += double(xb8[b].d) * S - 0.5 * double(xb8[b].d) * M;
    }
    EXPECT_NEAR(ref[t * 16], want, 8.0 * nb * std::ldexp(1.0, -24) * std::fabs(want) + 1e-3) << "token " << t;
    for (int r = 1; r < 16; ++r) EXPECT_EQ(ref[t * 16 + r], ref[t * 16]);
  }
  check_rows16(GgmlType::Q4_K, w.data(), rb, cols, xq, 2);
}

TEST(Q4kGemm, FixtureZooQ4K) {
  const auto f = gguf::File::open(std::string(STRATA_FIXTURES_DIR) + "/formats/zoo.gguf");
  std::mt19937 rng(22);
  int checked = 0;
  for (const auto& t : f.tensors()) {
    if (!has_kernel(t.type) || t.n_rows() < 16)
      continue;
    SCOPED_TRACE(t.name);
    const int64_t cols = static_cast<int64_t>(t.ne[0]), rb = row_bytes(t.type, cols);
    const int64_t n_tok = 11;
    const auto xq = quantize_acts(random_tokens(n_tok, cols, rng), cols);
    for (uint64_t r0 = 0; r0 + 16 <= t.n_rows(); r0 += 16) check_rows16(t.type, t.data + r0 * rb, rb, cols, xq, n_tok);
    ++checked;
  }
  EXPECT_GE(checked, 13) << "zoo.gguf lacks a tensor of >= 16 rows of one of the 13 types";
}

TEST(Q4kGemm, MatmulDispatch) {
  if (!q::q4k_gemm_cpu_ok()) GTEST_SKIP() << "no AVX-512 VNNI at the level in use";
  GemmGuard guard;
  ThreadPool pool(2);
  std::mt19937 rng(23);
  struct Shape { int64_t rows, cols, n_tok; };
  for (const GgmlType type : kTypes)
  for (const Shape s : {Shape{768, 2048, 37}, Shape{2048, 768, 64}, Shape{40, 512, 21}, Shape{40, 512, 9}, Shape{40, 512, 8},
                        Shape{8, 256, 17}}) {
    SCOPED_TRACE(testing::Message() << type_name(type) << " " << s.rows << "x" << s.cols << " n_tok " << s.n_tok);
    std::vector<uint8_t> w;
    for (int64_t r = 0; r < s.rows; ++r) {
      const auto row = random_row(type, s.cols, rng);
      w.insert(w.end(), row.begin(), row.end());
    }
    const auto x = random_tokens(s.n_tok, s.cols, rng);
    std::vector<float> off(s.rows * s.n_tok), on(s.rows * s.n_tok, -1.f);
    q::q4k_gemm_set_enabled(false);
    matmul(type, w.data(), s.rows, s.cols, x.data(), s.n_tok, off.data(), MatmulMode::Fast, pool);
    q::q4k_gemm_set_enabled(true);
    matmul(type, w.data(), s.rows, s.cols, x.data(), s.n_tok, on.data(), MatmulMode::Fast, pool);
    const bool used = s.n_tok >= q::gemm16_min_tokens(type) && s.rows >= 16;
    const auto xq = quantize_acts(x, s.cols);
    const int64_t xb = q::act_row_bytes(q::ActType::Q8_K, s.cols), rb = row_bytes(type, s.cols);
    size_t differ_ref = 0, differ_off = 0, same_off = 0;
    std::vector<float> ref(16 * s.n_tok);
    for (int64_t g = 0; g + 16 <= s.rows; g += 16) {
      ref_of(type)(s.cols, w.data() + g * rb, rb, xq.data(), xb, s.n_tok, ref.data(), 16);
      for (int64_t t = 0; t < s.n_tok; ++t)
        for (int r = 0; r < 16; ++r) {
          differ_ref += std::memcmp(&ref[t * 16 + r], &on[t * s.rows + g + r], 4) != 0;
          same_off += std::memcmp(&off[t * s.rows + g + r], &on[t * s.rows + g + r], 4) == 0;
        }
    }
    for (int64_t r = s.rows / 16 * 16; r < s.rows; ++r)  // rows outside whole groups: the decode kernels
      for (int64_t t = 0; t < s.n_tok; ++t) differ_off += std::memcmp(&off[t * s.rows + r], &on[t * s.rows + r], 4) != 0;
    EXPECT_EQ(differ_off, 0u);
    if (used) {
      EXPECT_EQ(differ_ref, 0u);
      // the two paths round differently: most values differ in the last bits (proves the kernel ran)
      EXPECT_LT(same_off, (s.rows / 16 * 16) * s.n_tok / 2);
    } else {
      EXPECT_EQ(std::memcmp(off.data(), on.data(), off.size() * 4), 0);
    }
    double worst = 0;
    for (size_t i = 0; i < on.size(); ++i) worst = std::max(worst, double(std::fabs(on[i] - off[i])));
    std::printf("%s %lldx%lld n_tok %lld: max |gemm16 - decode kernels| = %.3g\n", std::string(type_name(type)).c_str(), (long long)s.cols, (long long)s.rows,
                (long long)s.n_tok, worst);
  }
}
