// Activation quantization and the per-type kernel choice (the one dispatch place for fast mode).
#include "quant/vec_dot.h"

#include <cmath>
#include <cstring>

namespace strata::q {

void quantize_act_q8_32(const float* x, BlockQ8A* y, int64_t n) {
  for (int64_t b = 0; b < n / QK; ++b, x += QK) {
    float amax = 0.f;
    for (int j = 0; j < QK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    // As ggml's x86 quantize_row_q8_0: q = round-half-even(x * 127 / amax), and the block scale is
    // stored in f16, so the dot uses the f16-rounded scale. Why: the fast path is measured against
    // llama.cpp's own error (fixture KL bound); matching its activation rounding keeps routing
    // decisions of chaotic MoE routers the same as llama.cpp's.
    const float d = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int j = 0; j < QK; ++j) {
      const int v = nearest_int(x[j] * id);
      y[b].qs[j] = static_cast<int8_t>(v);
      sum += v;
    }
    y[b].d = fp16_to_fp32(fp32_to_fp16(d));
    y[b].sum = sum;
  }
}

void quantize_act_q8_k(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < QK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.f) {
      std::memset(&y[b], 0, sizeof(BlockQ8_K));
      continue;
    }
    // The largest value maps to -127 exactly (as in ggml): every |q| <= 127, so the IQ kernels may
    // flip signs in int8 without overflow.
    const float iscale = -127.f / max;
    for (int j = 0; j < QK_K; ++j) {
      const int v = nearest_int(iscale * x[j]);
      y[b].qs[j] = static_cast<int8_t>(v > 127 ? 127 : v);
    }
    for (int g = 0; g < QK_K / 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += y[b].qs[16 * g + j];
      y[b].bsums[g] = static_cast<int16_t>(s);
    }
    y[b].d = 1.f / iscale;
  }
}

int64_t act_row_bytes(ActType act, int64_t n) {
  switch (act) {
    case ActType::F32: return n * 4;
    case ActType::Q8_32: return n / QK * static_cast<int64_t>(sizeof(BlockQ8A));
    case ActType::Q8_K: return n / QK_K * static_cast<int64_t>(sizeof(BlockQ8_K));
  }
  return 0;
}

void quantize_act_row(ActType act, const float* x, void* dst, int64_t n) {
  switch (act) {
    case ActType::F32: std::memcpy(dst, x, n * 4); return;
    case ActType::Q8_32: quantize_act_q8_32(x, static_cast<BlockQ8A*>(dst), n); return;
    case ActType::Q8_K:
      if (cpu_level() >= CpuLevel::Avx2)
        quantize_act_q8_k_avx2(x, static_cast<BlockQ8_K*>(dst), n);
      else
        quantize_act_q8_k(x, static_cast<BlockQ8_K*>(dst), n);
      return;
  }
}

ActType act_type_for(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q8_0: case GgmlType::IQ4_NL:
      return ActType::Q8_32;
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K:
    case GgmlType::Q6_K: case GgmlType::IQ4_XS: case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S: case GgmlType::IQ3_XXS: case GgmlType::IQ3_S: case GgmlType::IQ1_S:
    case GgmlType::IQ1_M:
      return ActType::Q8_K;
    default:
      return ActType::F32;
  }
}

DotKernel dot_kernel(GgmlType type, CpuLevel level) {
  DotKernel k;
  k.act = act_type_for(type);
  if (level >= CpuLevel::Avx512 && (k.fn = vec_dot_avx512(type))) {
    k.level = CpuLevel::Avx512;
    k.fn4 = vec_dot4_avx512(type);
    k.fn2 = vec_dot2_avx512(type);
  } else if (level >= CpuLevel::Avx2 && (k.fn = vec_dot_avx2(type))) {
    k.level = CpuLevel::Avx2;
    k.fn4 = vec_dot4_avx2(type);
    k.fn2 = vec_dot2_avx2(type);
  } else {
    k.fn = vec_dot_scalar(type);
    k.level = CpuLevel::Scalar;
  }
  return k;
}

}  // namespace strata::q
