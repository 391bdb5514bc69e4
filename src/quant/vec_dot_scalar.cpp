// Portable scalar fast-mode kernels: the same integer math as the AVX2/AVX-512 kernels (per-block
// integer sums, one float multiply per block), so those are tested against these. The formats the SIMD
// code takes as units of 32 values (Q2_K, Q3_K, IQ*) are in vec_dot_units.cpp, with the SIMD kernels'
// float order too: the same bits on every CPU level.
#include <cstring>

#include "quant/iq_tables.h"
#include "quant/vec_dot.h"
#include "quant/vec_dot_units.h"

namespace strata::q {
namespace {

// ---- float weights x f32 activations ----
float dot_f32(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const float*>(w);
  const auto* x = static_cast<const float*>(xq);
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * x[i + j];
  float s = 0;
  for (; i < n; ++i) s += a[i] * x[i];
  for (float v : acc) s += v;
  return s;
}
float dot_f16(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const uint16_t*>(w);
  const auto* x = static_cast<const float*>(xq);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += fp16_to_fp32(a[i]) * x[i];
  return s;
}
float dot_bf16(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const uint16_t*>(w);
  const auto* x = static_cast<const float*>(xq);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += bf16_to_fp32(a[i]) * x[i];
  return s;
}

// ---- 32-value formats x Q8_32 ----
float dot_q8_0(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockQ8_0*>(w);
  const auto* x = static_cast<const BlockQ8A*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK; ++b) {
    int sum = 0;
    for (int j = 0; j < QK; ++j) sum += a[b].qs[j] * x[b].qs[j];
    s += fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(sum);
  }
  return s;
}
float dot_q4_0(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockQ4_0*>(w);
  const auto* x = static_cast<const BlockQ8A*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK; ++b) {
    int sum = 0;
    for (int j = 0; j < 16; ++j)
      sum += ((a[b].qs[j] & 0xF) - 8) * x[b].qs[j] + ((a[b].qs[j] >> 4) - 8) * x[b].qs[j + 16];
    s += fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(sum);
  }
  return s;
}
float dot_q4_1(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockQ4_1*>(w);
  const auto* x = static_cast<const BlockQ8A*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK; ++b) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += (a[b].qs[j] & 0xF) * x[b].qs[j] + (a[b].qs[j] >> 4) * x[b].qs[j + 16];
    s += fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(sum) + fp16_to_fp32(a[b].m) * (x[b].d * static_cast<float>(x[b].sum));
  }
  return s;
}
inline void q5_values(const uint8_t* qs, const uint8_t* qhb, int v[32]) {
  uint32_t qh;
  std::memcpy(&qh, qhb, 4);
  for (int j = 0; j < 16; ++j) {
    v[j] = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
    v[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
  }
}
float dot_q5_0(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockQ5_0*>(w);
  const auto* x = static_cast<const BlockQ8A*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK; ++b) {
    int v[32], sum = 0;
    q5_values(a[b].qs, a[b].qh, v);
    for (int j = 0; j < 32; ++j) sum += (v[j] - 16) * x[b].qs[j];
    s += fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(sum);
  }
  return s;
}
float dot_q5_1(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockQ5_1*>(w);
  const auto* x = static_cast<const BlockQ8A*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK; ++b) {
    int v[32], sum = 0;
    q5_values(a[b].qs, a[b].qh, v);
    for (int j = 0; j < 32; ++j) sum += v[j] * x[b].qs[j];
    s += fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(sum) + fp16_to_fp32(a[b].m) * (x[b].d * static_cast<float>(x[b].sum));
  }
  return s;
}
float dot_iq4_nl(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockIQ4_NL*>(w);
  const auto* x = static_cast<const BlockQ8A*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK; ++b) {
    int sum = 0;
    for (int j = 0; j < 16; ++j)
      sum += iq::kIq4nlValues[a[b].qs[j] & 0xF] * x[b].qs[j] + iq::kIq4nlValues[a[b].qs[j] >> 4] * x[b].qs[j + 16];
    s += fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(sum);
  }
  return s;
}

// ---- K-quants x Q8_K ----
float dot_q4_k(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockQ4_K*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k4_scale_min(j, a[b].scales, sc, m);
      const uint8_t* q = a[b].qs + 32 * (j / 2);
      const int shift = 4 * (j & 1);
      int gs = 0;
      for (int l = 0; l < 32; ++l) gs += ((q[l] >> shift) & 0xF) * x[b].qs[32 * j + l];
      isum += sc * gs;
      msum += m * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
    }
    s += x[b].d * (fp16_to_fp32(a[b].d) * isum - fp16_to_fp32(a[b].dmin) * msum);
  }
  return s;
}
float dot_q5_k(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockQ5_K*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k4_scale_min(j, a[b].scales, sc, m);
      const uint8_t* q = a[b].qs + 32 * (j / 2);
      const int shift = 4 * (j & 1);
      int gs = 0;
      for (int l = 0; l < 32; ++l)
        gs += (((q[l] >> shift) & 0xF) | (((a[b].qh[l] >> j) & 1) << 4)) * x[b].qs[32 * j + l];
      isum += sc * gs;
      msum += m * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
    }
    s += x[b].d * (fp16_to_fp32(a[b].d) * isum - fp16_to_fp32(a[b].dmin) * msum);
  }
  return s;
}
float dot_q6_k(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockQ6_K*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0;
    for (int g = 0; g < 16; ++g) {
      int gs = 0;
      for (int p = 16 * g; p < 16 * g + 16; ++p) {
        const int h = p / 128, l = p % 32, k = (p % 128) / 32;  // k: which of the 4 quarter rows
        const uint8_t lo = a[b].ql[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1));
        const int q = ((lo & 0xF) | (((a[b].qh[32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
        gs += q * x[b].qs[p];
      }
      isum += a[b].scales[g] * gs;
    }
    s += fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(isum);
  }
  return s;
}

}  // namespace

VecDotFn vec_dot_scalar(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return dot_f32;
    case GgmlType::F16: return dot_f16;
    case GgmlType::BF16: return dot_bf16;
    case GgmlType::Q8_0: return dot_q8_0;
    case GgmlType::Q4_0: return dot_q4_0;
    case GgmlType::Q4_1: return dot_q4_1;
    case GgmlType::Q5_0: return dot_q5_0;
    case GgmlType::Q5_1: return dot_q5_1;
    case GgmlType::IQ4_NL: return dot_iq4_nl;
    case GgmlType::Q4_K: return dot_q4_k;
    case GgmlType::Q5_K: return dot_q5_k;
    case GgmlType::Q6_K: return dot_q6_k;
    default: return unit_dot_scalar(type);  // Q2_K, Q3_K and the IQ formats (vec_dot_units.h), or null
  }
}

}  // namespace strata::q
