// Tensor data is untrusted (it comes straight from a GGUF file): dequantization and every fast kernel
// (scalar, AVX2, AVX-512, 1- and 4-token) must handle arbitrary block bytes without out-of-bounds reads
// or undefined behaviour. First input byte picks the type (and a quantization target); the rest are the
// blocks. The dequantized values (non-finite ones and those beyond fp16's range replaced) then go through
// a quantizer (`strata quantize` re-encodes such values), whose round trip must stay finite.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/cpu_features.h"
#include "quant/dequant.h"
#include "quant/q4k_gemm.h"
#include "quant/quantize.h"
#include "quant/vec_dot.h"

using namespace strata;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const GgmlType kTypes[] = {
      GgmlType::F32,    GgmlType::F16,     GgmlType::BF16,    GgmlType::Q8_0,    GgmlType::Q4_0,   GgmlType::Q4_1,
      GgmlType::Q5_0,   GgmlType::Q5_1,    GgmlType::IQ4_NL,  GgmlType::Q2_K,    GgmlType::Q3_K,   GgmlType::Q4_K,
      GgmlType::Q5_K,   GgmlType::Q6_K,    GgmlType::Q8_K,    GgmlType::IQ4_XS,  GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
      GgmlType::IQ2_S,  GgmlType::IQ3_XXS, GgmlType::IQ3_S,   GgmlType::IQ1_S,   GgmlType::IQ1_M};
  if (size < 2) return 0;
  const GgmlType t = kTypes[data[0] % (sizeof(kTypes) / sizeof(kTypes[0]))];
  ++data, --size;
  const TypeTraits& tt = type_traits(t);
  // Whole blocks only, rounded to a multiple of 256 values (the activation formats' block).
  int64_t n = static_cast<int64_t>(size / tt.type_size) * tt.block_size / 256 * 256;
  n = std::min<int64_t>(n, 8192);
  if (n == 0) return 0;
  const std::vector<uint8_t> w(data, data + row_bytes(t, n));  // exact-size copy: ASan sees any overread
  std::vector<float> values(n);
  dequantize_row(t, w.data(), values.data(), n);
  {
    static const GgmlType kTargets[] = {GgmlType::Q4_0, GgmlType::Q4_1,  GgmlType::Q5_0, GgmlType::Q5_1,
                                        GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::Q2_K, GgmlType::Q3_K,
                                        GgmlType::Q4_K, GgmlType::Q5_K,  GgmlType::Q6_K, GgmlType::IQ4_XS,
                                        GgmlType::F16,  GgmlType::BF16};
    const GgmlType target = kTargets[(data[-1] / 23u) % (sizeof(kTargets) / sizeof(kTargets[0]))];
    std::vector<float> in(values);
    for (float& v : in)
      if (!std::isfinite(v) || std::fabs(v) > 65504.f) v = std::isfinite(v) ? std::fmod(v, 65504.f) : 0.f;
    std::vector<uint8_t> q(row_bytes(target, n));
    quantize_row(target, in.data(), q.data(), n);
    std::vector<float> back(n);
    dequantize_row(target, q.data(), back.data(), n);
    for (float v : back)
      if (!std::isfinite(v)) __builtin_trap();
  }
  if (t == GgmlType::Q8_K) return 0;  // activation format only: no weight kernel
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 37) % 19 - 9) * 0.1f;
  for (int level = 0; level <= static_cast<int>(cpu_max_level()); ++level) {
    const q::DotKernel k = q::dot_kernel(t, static_cast<CpuLevel>(level));
    if (!k.fn) continue;
    const int64_t xb = q::act_row_bytes(k.act, n);
    std::vector<uint8_t> xq(4 * xb);
    for (int r = 0; r < 4; ++r) q::quantize_act_row(k.act, x.data(), xq.data() + r * xb, n);
    volatile float sink = k.fn(n, w.data(), xq.data());
    (void)sink;
    // The 16-row prefill kernel and its reference: the row read 16 times (row stride 0), 4 tokens.
    if (const q::Gemm16Fn g = q::gemm16_kernel(t); g && level == static_cast<int>(CpuLevel::Avx512) && q::q4k_gemm_cpu_ok()) {
      float out[16 * 4];
      g(n, w.data(), 0, xq.data(), xb, 4, out, 16);
      q::gemm16_reference(t)(n, w.data(), 0, xq.data(), xb, 4, out, 16);
    }
    if (k.fn4) {
      float out[4];
      k.fn4(n, w.data(), xq.data(), xb, out, 1);
    }
  }
  return 0;
}
