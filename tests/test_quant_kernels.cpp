// Fast-mode kernels vs references on random rows at real sizes.
//  1. scalar integer kernel vs exact (dequantize + double sum): the difference must be within the bound
//     of the activation quantization, sum over blocks of sum|w| * d_x / 2 (d_x: the block's activation
//     step), plus 1e-5 of sum|w*x| for float rounding. This bound is derived, not tuned.
//  2. each AVX2 / AVX-512 kernel vs the scalar kernel on the same quantized activations: the same
//     integer math, only float summation order differs: |diff| <= 1e-5 * sum|w*x| (docs/quant.md);
//     for the unit formats (Q2_K, Q3_K, IQ*) not even that: the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "cpu/cpu_features.h"
#include "cpu/thread_pool.h"
#include "quant/dequant.h"
#include "quant/matmul.h"
#include "quant/q32_gemm.h"
#include "quant/q4k_gemm.h"
#include "quant/vec_dot.h"
#include "quant/vec_dot_units.h"
#include "quant_test_util.h"

using namespace strata;

namespace {

const GgmlType kFastTypes[] = {
    GgmlType::F32,    GgmlType::F16,     GgmlType::BF16,   GgmlType::Q8_0,    GgmlType::Q4_0,   GgmlType::Q4_1,
    GgmlType::Q5_0,   GgmlType::Q5_1,    GgmlType::IQ4_NL, GgmlType::Q2_K,    GgmlType::Q3_K,   GgmlType::Q4_K,
    GgmlType::Q5_K,   GgmlType::Q6_K,    GgmlType::IQ4_XS, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S,
    GgmlType::IQ3_XXS, GgmlType::IQ3_S,  GgmlType::IQ1_S,  GgmlType::IQ1_M,
};

// sum |w_i x_i| and the exact dot in double.
std::pair<double, double> exact_dot(GgmlType t, const std::vector<uint8_t>& w, const std::vector<float>& x) {
  std::vector<float> wf(x.size());
  dequantize_row(t, w.data(), wf.data(), static_cast<int64_t>(x.size()));
  double s = 0, a = 0;
  for (size_t i = 0; i < x.size(); ++i) s += double(wf[i]) * x[i], a += std::fabs(double(wf[i]) * x[i]);
  return {s, a};
}

// Bound on |dot(w, x) - dot(w, dequant(quant(x)))| for the activation format.
double act_quant_bound(GgmlType t, q::ActType act, const std::vector<uint8_t>& w, const std::vector<float>& x) {
  if (act == q::ActType::F32) return 0;
  const int blk = act == q::ActType::Q8_32 ? 32 : 256;
  std::vector<float> wf(x.size());
  dequantize_row(t, w.data(), wf.data(), static_cast<int64_t>(x.size()));
  double bound = 0;
  for (size_t b = 0; b < x.size(); b += blk) {
    double amax = 0, wsum = 0;
    for (int j = 0; j < blk; ++j) amax = std::max(amax, double(std::fabs(x[b + j]))), wsum += std::fabs(wf[b + j]);
    bound += wsum * (amax / 127.0) / 2;
  }
  return bound;
}

int64_t cols_for(GgmlType t, int64_t want) {
  const int64_t bs = type_traits(t).block_size;
  return want / bs * bs;
}

}  // namespace

TEST(QuantKernels, ScalarIntegerKernelWithinActivationQuantizationBound) {
  std::mt19937 rng(1234);
  for (GgmlType t : kFastTypes) {
    const q::DotKernel k = q::dot_kernel(t, CpuLevel::Scalar);
    ASSERT_NE(k.fn, nullptr) << type_name(t);
    for (int64_t want : {256, 4096}) {
      const int64_t n = cols_for(t, want);
      for (int r = 0; r < 4; ++r) {
        auto w = test::random_row(t, n, rng);
        auto x = test::random_acts(n, rng);
        std::vector<uint8_t> xq(q::act_row_bytes(k.act, n));
        q::quantize_act_row(k.act, x.data(), xq.data(), n);
        const float got = k.fn(n, w.data(), xq.data());
        auto [ref, mag] = exact_dot(t, w, x);
        const double tol = act_quant_bound(t, k.act, w, x) + 1e-5 * mag + 1e-7;
        EXPECT_LE(std::fabs(got - ref), tol) << type_name(t) << " n=" << n << " ref=" << ref << " got=" << got;
      }
    }
  }
}

TEST(QuantKernels, SimdKernelsMatchScalar) {
  std::mt19937 rng(99);
  int compared = 0;
  for (CpuLevel level : {CpuLevel::Avx2, CpuLevel::Avx512}) {
    if (level > cpu_max_level()) {
      std::printf("[ skipped ] %s: not supported by this CPU\n", std::string(cpu_level_name(level)).c_str());
      continue;
    }
    for (GgmlType t : kFastTypes) {
      q::VecDotFn fn = level == CpuLevel::Avx2 ? q::vec_dot_avx2(t) : q::vec_dot_avx512(t);
      if (!fn) continue;
      q::VecDotFn ref_fn = q::vec_dot_scalar(t);
      const q::ActType act = q::act_type_for(t);
      for (int64_t want : {256, 1024, 4096, 8192}) {
        const int64_t n = cols_for(t, want);
        for (int r = 0; r < 3; ++r) {
          auto w = test::random_row(t, n, rng);
          auto x = test::random_acts(n, rng);
          std::vector<uint8_t> xq(q::act_row_bytes(act, n));
          q::quantize_act_row(act, x.data(), xq.data(), n);
          const float got = fn(n, w.data(), xq.data()), ref = ref_fn(n, w.data(), xq.data());
          const double mag = exact_dot(t, w, x).second;
          EXPECT_LE(std::fabs(double(got) - ref), 1e-5 * mag + 1e-7)
              << cpu_level_name(level) << " " << type_name(t) << " n=" << n << " ref=" << ref << " got=" << got;
          ++compared;
        }
      }
    }
  }
  std::printf("compared %d SIMD rows\n", compared);
}

namespace {

// Kernels a and b (named for the messages) on the same rows of type t, bit for bit: `rows` random rows at
// each size, those from `plain` on with outliers (every `step`-th activation times `scale`: wide activation
// blocks, large integer sums whose float conversion rounds). Returns the rows compared.
int expect_same_bits(GgmlType t, q::VecDotFn a, std::string_view a_name, q::VecDotFn b, std::string_view b_name,
                     std::initializer_list<int64_t> sizes, int rows, int plain, int step, float scale,
                     std::mt19937& rng) {
  const q::ActType at = q::act_type_for(t);
  int compared = 0;
  for (int64_t n : sizes) {
    for (int r = 0; r < rows; ++r) {
      auto w = test::random_row(t, n, rng);
      auto x = test::random_acts(n, rng);
      if (r >= plain)
        for (int64_t i = 0; i < n; i += step) x[size_t(i)] *= scale;
      std::vector<uint8_t> xq(q::act_row_bytes(at, n));
      q::quantize_act_row(at, x.data(), xq.data(), n);
      const float va = a(n, w.data(), xq.data()), vb = b(n, w.data(), xq.data());
      EXPECT_EQ(std::memcmp(&va, &vb, sizeof(float)), 0)
          << type_name(t) << " n=" << n << " " << a_name << " " << va << " " << b_name << " " << vb;
      ++compared;
    }
  }
  return compared;
}

}  // namespace

// The formats the SIMD kernels take as units of 32 values (Q2_K, Q3_K, IQ*): the scalar kernels keep the
// SIMD float order (src/quant/vec_dot_units.h), so scalar, AVX2 and AVX-512 give the same bits, also for
// rows with outliers (large integer sums, whose float conversion rounds).
TEST(QuantKernels, UnitFormatsSameBitsOnEveryLevel) {
  std::mt19937 rng(123);
  const GgmlType types[] = {GgmlType::Q2_K,  GgmlType::Q3_K,    GgmlType::IQ4_XS, GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
                            GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S,  GgmlType::IQ1_S,   GgmlType::IQ1_M};
  int compared = 0;
  for (GgmlType t : types) {
    ASSERT_NE(q::unit_dot_scalar(t), nullptr) << type_name(t);
    EXPECT_EQ(q::vec_dot_scalar(t), q::unit_dot_scalar(t)) << type_name(t);
    for (CpuLevel level : {CpuLevel::Avx2, CpuLevel::Avx512}) {
      if (level > cpu_max_level()) continue;
      q::VecDotFn fn = level == CpuLevel::Avx2 ? q::vec_dot_avx2(t) : q::vec_dot_avx512(t);
      ASSERT_NE(fn, nullptr);
      compared += expect_same_bits(t, q::unit_dot_scalar(t), "scalar", fn, cpu_level_name(level),
                                   {256, 2048, 8192}, 4, 2, 7, 50.f, rng);
    }
  }
  std::printf("compared %d rows bit for bit\n", compared);
}

// Q8_0, Q4_K, Q5_K and Q6_K: the scalar kernels follow the SIMD lanes and float order too, so every level
// gives the same bits (the model's logits then do not depend on the CPU). Rows with outliers (large
// integer sums, whose float conversion rounds) and negative weight scales.
TEST(QuantKernels, KQuantsAndQ8_0SameBitsOnEveryLevel) {
  std::mt19937 rng(77);
  int compared = 0;
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    q::VecDotFn scalar = q::vec_dot_scalar(t);
    ASSERT_NE(scalar, nullptr) << type_name(t);
    for (CpuLevel level : {CpuLevel::Avx2, CpuLevel::Avx512}) {
      if (level > cpu_max_level()) continue;
      q::VecDotFn fn = level == CpuLevel::Avx2 ? q::vec_dot_avx2(t) : q::vec_dot_avx512(t);
      ASSERT_NE(fn, nullptr);
      compared += expect_same_bits(t, scalar, "scalar", fn, cpu_level_name(level), {256, 768, 2048, 8192},
                                   6, 3, 5, 80.f, rng);
    }
  }
  std::printf("compared %d rows bit for bit\n", compared);
}

// The AVX-512 level's 512-bit K-quant decode kernels (vec_dot_x86.inc, dot_q4_k_zmm) promise the bits of
// the 256-bit kernels they replace: the same integer sums per lane, then the same float operations. Rows
// with outliers too (large integer sums, whose float conversion rounds).
TEST(QuantKernels, WideKQuantKernelsSameBitsAsAvx2) {
  if (cpu_max_level() < CpuLevel::Avx512) {
    GTEST_SKIP() << "no AVX-512 on this CPU";
  }
  std::mt19937 rng(321);
  int compared = 0;
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    q::VecDotFn wide = q::vec_dot_avx512(t), ref = q::vec_dot_avx2(t);
    ASSERT_NE(wide, nullptr);
    ASSERT_NE(ref, nullptr);
    compared += expect_same_bits(t, ref, "avx2", wide, "avx512", {256, 768, 2048, 8192}, 8, 4, 5, 80.f, rng);
  }
  std::printf("compared %d rows bit for bit\n", compared);
}

// Every weight format has a SIMD kernel at every level the CPU has (none falls back to scalar code).
TEST(QuantKernels, EveryFormatHasSimdKernels) {
  for (GgmlType t : kFastTypes) {
    if (cpu_max_level() >= CpuLevel::Avx2) {
      EXPECT_NE(q::vec_dot_avx2(t), nullptr) << type_name(t);
    }
    if (cpu_max_level() >= CpuLevel::Avx512) {
      EXPECT_NE(q::vec_dot_avx512(t), nullptr) << type_name(t);
    }
  }
}

TEST(QuantMatmul, FastEqualsPerRowKernelAndExactEqualsDequantDot) {
  std::mt19937 rng(7);
  ThreadPool pool2(2), pool1(1);
  const GgmlType types[] = {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ2_XS, GgmlType::F16};
  for (GgmlType t : types) {
    const int64_t rows = 37, cols = cols_for(t, 1024);
    const int64_t rb = static_cast<int64_t>(row_bytes(t, cols));
    std::vector<uint8_t> w;
    for (int64_t r = 0; r < rows; ++r) {
      auto row = test::random_row(t, cols, rng);
      w.insert(w.end(), row.begin(), row.end());
    }
    for (int64_t n_tok : {1, 8, 37}) {
      auto x = test::random_acts(cols * n_tok, rng);
      std::vector<float> y_fast(rows * n_tok), y_fast1(rows * n_tok), y_exact(rows * n_tok);
      matmul(t, w.data(), rows, cols, x.data(), n_tok, y_fast.data(), MatmulMode::Fast, pool2);
      matmul(t, w.data(), rows, cols, x.data(), n_tok, y_fast1.data(), MatmulMode::Fast, pool1);
      matmul(t, w.data(), rows, cols, x.data(), n_tok, y_exact.data(), MatmulMode::Exact, pool2);
      const q::DotKernel k = q::dot_kernel(t, cpu_level());
      std::vector<uint8_t> xq(q::act_row_bytes(k.act, cols));
      std::vector<float> wf(cols);
      // Prefill of a type with a 16-row integer kernel (>= kQ4kGemmMinTok tokens) takes it on whole 16-row
      // groups (q4k_gemm.h, q32_gemm.h): its own rounding, equal to its reference; the other rows keep the
      // per-row kernel.
      const bool gemm16 = q::gemm16_kernel(t) != nullptr && k.level == CpuLevel::Avx512 &&
                          n_tok >= q::gemm16_min_tokens(t) && q::q4k_gemm_enabled() && q::q4k_gemm_cpu_ok();
      std::vector<float> y16(rows * n_tok);
      if (gemm16) {
        std::vector<uint8_t> xall(xq.size() * n_tok);
        for (int64_t tk = 0; tk < n_tok; ++tk)
          q::quantize_act_row(k.act, x.data() + tk * cols, xall.data() + tk * xq.size(), cols);
        for (int64_t g = 0; g + 16 <= rows; g += 16)
          q::gemm16_reference(t)(cols, w.data() + g * rb, rb, xall.data(), xq.size(), n_tok, y16.data() + g, rows);
      }
      for (int64_t tk = 0; tk < n_tok; ++tk) {
        q::quantize_act_row(k.act, x.data() + tk * cols, xq.data(), cols);
        for (int64_t r = 0; r < rows; ++r) {
          const float want = gemm16 && r < rows / 16 * 16 ? y16[tk * rows + r] : k.fn(cols, w.data() + r * rb, xq.data());
          ASSERT_EQ(y_fast[tk * rows + r], want) << type_name(t) << " r=" << r << " t=" << tk;
          ASSERT_EQ(y_fast1[tk * rows + r], want);
          dequantize_row(t, w.data() + r * rb, wf.data(), cols);
          double ref = 0, mag = 0;
          for (int64_t c = 0; c < cols; ++c) ref += double(wf[c]) * x[tk * cols + c], mag += std::fabs(wf[c] * x[tk * cols + c]);
          ASSERT_LE(std::fabs(y_exact[tk * rows + r] - ref), 1e-6 * mag + 1e-9) << type_name(t);
        }
      }
    }
  }
}

// Large jobs are walked as several weight streams (the same rows of up to 3 far-apart parts in turns,
// matmul.cpp): every row must still be computed exactly once, with the same bits as a 1-row product
// (which is a single work item in plain order), for every stream count. 1001 rows: up to 4 parts, the
// last ones a row short; 300 rows: at most 2 (parts of >= 128 rows).
TEST(QuantMatmul, MultiStreamRowOrderSameBitsAsOneRowProducts) {
  std::mt19937 rng(17);
  const int default_streams = matmul_streams();
  EXPECT_THROW(matmul_set_streams(0), Error);
  EXPECT_THROW(matmul_set_streams(5), Error);
  ThreadPool pool2(2), pool1(1);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16}) {
    const int64_t cols = cols_for(t, 512), rb = static_cast<int64_t>(row_bytes(t, cols));
    for (int64_t rows : {int64_t(1001), int64_t(300)}) {
      std::vector<uint8_t> w;
      for (int64_t r = 0; r < rows; ++r) {
        auto row = test::random_row(t, cols, rng);
        w.insert(w.end(), row.begin(), row.end());
      }
      for (int64_t n_tok : {1, 3}) {
        const auto x = test::random_acts(cols * n_tok, rng);
        for (MatmulMode mode : {MatmulMode::Fast, MatmulMode::FastPrecise, MatmulMode::Exact}) {
          std::vector<float> one(n_tok), want(rows * n_tok);
          for (int64_t r = 0; r < rows; ++r) {
            matmul(t, w.data() + r * rb, 1, cols, x.data(), n_tok, one.data(), mode, pool1);
            for (int64_t k = 0; k < n_tok; ++k) want[k * rows + r] = one[k];
          }
          for (int streams : {1, 2, 3, 4})
            for (ThreadPool* pool : {&pool1, &pool2}) {
              matmul_set_streams(streams);
              std::vector<float> y(rows * n_tok, std::nanf(""));
              matmul(t, w.data(), rows, cols, x.data(), n_tok, y.data(), mode, *pool);
              ASSERT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * 4))
                  << type_name(t) << " rows " << rows << " n_tok " << n_tok << " mode " << int(mode) << " threads "
                  << pool->size() << " streams " << streams;
            }
          matmul_set_streams(default_streams);
        }
      }
    }
  }
}

TEST(QuantMatmul, BadInputsAreErrors) {
  ThreadPool pool(1);
  std::vector<uint8_t> w(1024);
  std::vector<float> x(64), y(4);
  EXPECT_THROW(matmul(GgmlType::Q4_K, w.data(), 1, 100, x.data(), 1, y.data(), MatmulMode::Fast, pool), Error);
  EXPECT_THROW(matmul(GgmlType::Q8_0, w.data(), 1, 33, x.data(), 1, y.data(), MatmulMode::Exact, pool), Error);
  try {
    matmul(GgmlType::TQ1_0, w.data(), 1, 256, x.data(), 1, y.data(), MatmulMode::Fast, pool);
    FAIL() << "TQ1_0 has no kernel and must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported type tq1_0"), std::string::npos) << e.what();
  }
}

// The 4-token kernels decode each weight block once for 4 activation rows; per token they run the
// same operations as the single-token kernel, so the results must be bit-identical.
TEST(QuantKernels, FourTokenKernelsBitIdenticalToSingle) {
  std::mt19937 rng(5);
  int checked = 0;
  for (CpuLevel level : {CpuLevel::Avx2, CpuLevel::Avx512}) {
    if (level > cpu_max_level()) continue;
    for (GgmlType t : kFastTypes) {
      q::VecDot4Fn fn4 = level == CpuLevel::Avx2 ? q::vec_dot4_avx2(t) : q::vec_dot4_avx512(t);
      q::VecDotFn fn = level == CpuLevel::Avx2 ? q::vec_dot_avx2(t) : q::vec_dot_avx512(t);
      if (!fn4) continue;
      const q::ActType act = q::act_type_for(t);
      for (int64_t n : {256, 4096}) {
        auto w = test::random_row(t, n, rng);
        const int64_t xb = q::act_row_bytes(act, n);
        std::vector<uint8_t> xq(4 * xb);
        for (int k = 0; k < 4; ++k) {
          auto x = test::random_acts(n, rng);
          q::quantize_act_row(act, x.data(), xq.data() + k * xb, n);
        }
        float out[8];
        fn4(n, w.data(), xq.data(), xb, out, 2);  // strided output
        for (int k = 0; k < 4; ++k) {
          ASSERT_EQ(out[2 * k], fn(n, w.data(), xq.data() + k * xb)) << cpu_level_name(level) << " " << type_name(t);
          ++checked;
        }
      }
    }
  }
  std::printf("checked %d four-token dots\n", checked);
}

// Two-row kernels (a decode's gate and up rows): each output the bits of the single-row kernel.
TEST(QuantKernels, TwoRowKernelsBitIdenticalToSingle) {
  std::mt19937 rng(77);
  int checked = 0;
  for (CpuLevel level : {CpuLevel::Avx2, CpuLevel::Avx512}) {
    if (level > cpu_max_level()) continue;
    for (GgmlType t : kFastTypes) {
      q::VecDot2Fn fn2 = level == CpuLevel::Avx2 ? q::vec_dot2_avx2(t) : q::vec_dot2_avx512(t);
      q::VecDotFn fn = level == CpuLevel::Avx2 ? q::vec_dot_avx2(t) : q::vec_dot_avx512(t);
      if (!fn2) continue;
      const q::ActType act = q::act_type_for(t);
      for (int64_t n : {256, 768, 2048}) {
        for (int r = 0; r < 4; ++r) {
          auto w0 = test::random_row(t, n, rng), w1 = test::random_row(t, n, rng);
          auto x = test::random_acts(n, rng);
          if (r >= 2)
            for (int64_t i = 0; i < n; i += 5) x[size_t(i)] *= 80.f;
          std::vector<uint8_t> xq(q::act_row_bytes(act, n));
          q::quantize_act_row(act, x.data(), xq.data(), n);
          float out[2];
          fn2(n, w0.data(), w1.data(), xq.data(), out);
          const float a = fn(n, w0.data(), xq.data()), b = fn(n, w1.data(), xq.data());
          EXPECT_EQ(std::memcmp(&out[0], &a, 4), 0) << cpu_level_name(level) << " " << type_name(t) << " n=" << n;
          EXPECT_EQ(std::memcmp(&out[1], &b, 4), 0) << cpu_level_name(level) << " " << type_name(t) << " n=" << n;
          ++checked;
        }
      }
    }
  }
  std::printf("checked %d two-row dots\n", checked);
  if (cpu_max_level() >= CpuLevel::Avx512) {
    EXPECT_NE(q::vec_dot2_avx512(GgmlType::Q4_K), nullptr);
    EXPECT_NE(q::vec_dot2_avx512(GgmlType::Q5_K), nullptr);
    EXPECT_GT(checked, 0);
  }
}

// matmul_many runs a batch (e.g. a MoE layer's experts, of mixed types and token counts) in one
// parallel region; each job's result must equal a separate matmul call bit for bit.
TEST(QuantMatmul, ManyEqualsSeparateCalls) {
  std::mt19937 rng(21);
  ThreadPool pool(2);
  const GgmlType types[] = {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::IQ3_S, GgmlType::BF16};
  std::vector<std::vector<uint8_t>> ws;
  std::vector<std::vector<float>> xs, ys, refs;
  std::vector<MatmulJob> jobs;
  for (int i = 0; i < 10; ++i) {
    const GgmlType t = types[i % 5];
    const int64_t rows = 19 + 7 * i, cols = 512, n_tok = i % 4;  // includes n_tok 0
    std::vector<uint8_t> w;
    for (int64_t r = 0; r < rows; ++r) {
      auto row = test::random_row(t, cols, rng);
      w.insert(w.end(), row.begin(), row.end());
    }
    ws.push_back(std::move(w));
    xs.push_back(test::random_acts(cols * n_tok, rng));
    ys.emplace_back(rows * n_tok, -1.f);
    refs.emplace_back(rows * n_tok, -2.f);
  }
  for (int i = 0; i < 10; ++i)
    jobs.push_back({types[i % 5], ws[i].data(), 19 + 7 * i, 512, xs[i].data(), i % 4, ys[i].data()});
  for (MatmulMode mode : {MatmulMode::Fast, MatmulMode::Exact}) {
    matmul_many(jobs.data(), static_cast<int64_t>(jobs.size()), mode, pool);
    for (int i = 0; i < 10; ++i) {
      const auto& j = jobs[i];
      matmul(j.type, j.w, j.rows, j.cols, j.x, j.n_tok, refs[i].data(), mode, pool);
      EXPECT_EQ(ys[i], refs[i]) << "job " << i;
    }
  }
}

// FastPrecise adds a second int8 pass for the activations' rounding residual: its error must be within
// the Fast bound / 254 (the residual is at most d/2 per value and is rounded with its own step <= d/254),
// plus float rounding.
TEST(QuantMatmul, FastPreciseWithinResidualBound) {
  std::mt19937 rng(17);
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ3_S, GgmlType::Q2_K}) {
    const int64_t rows = 9, cols = 2048, n_tok = 3;
    const int64_t rb = static_cast<int64_t>(row_bytes(t, cols));
    std::vector<uint8_t> w;
    for (int64_t r = 0; r < rows; ++r) {
      auto row = test::random_row(t, cols, rng);
      w.insert(w.end(), row.begin(), row.end());
    }
    auto x = test::random_acts(cols * n_tok, rng);
    std::vector<float> y(rows * n_tok);
    matmul(t, w.data(), rows, cols, x.data(), n_tok, y.data(), MatmulMode::FastPrecise, pool);
    const q::ActType act = q::act_type_for(t);
    for (int64_t tk = 0; tk < n_tok; ++tk) {
      const std::vector<float> xt(x.begin() + tk * cols, x.begin() + (tk + 1) * cols);
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<uint8_t> wr(w.begin() + r * rb, w.begin() + (r + 1) * rb);
        auto [ref, mag] = exact_dot(t, wr, xt);
        const double tol = act_quant_bound(t, act, wr, xt) / 254 + 4e-6 * mag + 1e-7;
        EXPECT_LE(std::fabs(y[tk * rows + r] - ref), tol) << type_name(t) << " r=" << r;
      }
    }
  }
}
