// Portable scalar fast-mode kernels: the same integer math as the AVX2/AVX-512 kernels (per-block
// integer sums, one float multiply per block), so those are tested against these. Q8_0, Q4_K, Q5_K and
// Q6_K (below) and the formats the SIMD code takes as units of 32 values (Q2_K, Q3_K, IQ*, in
// vec_dot_units.cpp) also follow the SIMD kernels' float order: the same bits on every CPU level (why:
// a model's logits then do not depend on the CPU; at the scalar level the IQ4_XS fixture, whose q8_0,
// q5_K and q6_K tensors took another order, was past its KL bound).
#include <cmath>
#include <cstring>
#include <type_traits>

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
// Q8_0 in the SIMD kernels' float order (vec_dot_x86.inc): 8 int32 lanes, lane l summing the products of
// values 4l .. 4l + 3 of the block; one FMA chain per lane (fma_lanes_simd_order), as ggml's
// vec_dot_q8_0_q8_0 (tools/ggml_parity.cpp); hsum8_simd_order once per row.
float dot_q8_0(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockQ8_0*>(w);
  const auto* x = static_cast<const BlockQ8A*>(xq);
  float acc[8] = {};
  for (int64_t b = 0; b < n / QK; ++b) {
    int32_t lane[8] = {};
    for (int j = 0; j < QK; ++j) lane[j / 4] += a[b].qs[j] * x[b].qs[j];
    fma_lanes_simd_order(acc, fp16_to_fp32(a[b].d) * x[b].d, lane);
  }
  return hsum8_simd_order(acc);
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
// Q4_K / Q5_K as vec_dot_x86.inc's dotn_k4: lane l takes values 4l .. 4l + 3 of each 32-value sub-block
// j times its scale; acc[l] = fma(dx * d, float(lane[l]), acc[l]). The mins: Q4_K as 4 float lanes,
// lane q = mins[2q] * (bsum pair 2q) + mins[2q + 1] * (bsum pair 2q + 1), m[q] = fma(dx * dmin, float, m[q]),
// summed (m0 + m2) + (m1 + m3) and subtracted at the end; Q5_K (as ggml) one integer per block and a
// scalar chain s = fma(-(dx * dmin), float(sum), s), added at the end.
template <bool Q5>
float dot_k4(int64_t n, const void* w, const void* xq) {
  using Block = std::conditional_t<Q5, BlockQ5_K, BlockQ4_K>;
  const auto* a = static_cast<const Block*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float acc[8] = {}, acc_m[4] = {}, sum_m = 0.f;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) k4_scale_min(j, a[b].scales, sc[j], m[j]);
    const float d = fp16_to_fp32(a[b].d), dmin = fp16_to_fp32(a[b].dmin);
    int32_t mins[4];
    for (int q = 0; q < 4; ++q)
      mins[q] = m[2 * q] * (x[b].bsums[4 * q] + x[b].bsums[4 * q + 1]) +
                m[2 * q + 1] * (x[b].bsums[4 * q + 2] + x[b].bsums[4 * q + 3]);
    if constexpr (Q5) {
      sum_m = std::fma(-(x[b].d * dmin), static_cast<float>((mins[0] + mins[1]) + (mins[2] + mins[3])), sum_m);
    } else {
      for (int q = 0; q < 4; ++q) acc_m[q] = std::fma(x[b].d * dmin, static_cast<float>(mins[q]), acc_m[q]);
    }
    int32_t lane[8] = {};
    for (int j = 0; j < 8; ++j) {
      const uint8_t* q = a[b].qs + 32 * (j / 2);
      const int shift = 4 * (j & 1);
      for (int l = 0; l < 32; ++l) {
        int v = (q[l] >> shift) & 0xF;
        if constexpr (Q5) v |= ((a[b].qh[l] >> j) & 1) << 4;
        lane[l / 4] += sc[j] * (v * x[b].qs[32 * j + l]);
      }
    }
    fma_lanes_simd_order(acc, x[b].d * d, lane);
  }
  if constexpr (Q5) return hsum8_simd_order(acc) + sum_m;
  return hsum8_simd_order(acc) - ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]));
}
float dot_q4_k(int64_t n, const void* w, const void* xq) { return dot_k4<false>(n, w, xq); }
float dot_q5_k(int64_t n, const void* w, const void* xq) { return dot_k4<true>(n, w, xq); }

// Q6_K as vec_dot_x86.inc's dotn_q6_k: lane l starts at -32 * (sc[2l] * bsums[2l] + sc[2l + 1] * bsums[2l + 1])
// (the codes' offset) and takes values 4l .. 4l + 3 of each 32-value quarter u times the scale of their
// 16-value half (sc[2u] for lanes 0-3, sc[2u + 1] for 4-7); acc[l] = fma(dx * d, float(lane[l]), acc[l]).
float dot_q6_k(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockQ6_K*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float acc[8] = {};
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int32_t lane[8];
    for (int l = 0; l < 8; ++l)
      lane[l] = -32 * (a[b].scales[2 * l] * x[b].bsums[2 * l] + a[b].scales[2 * l + 1] * x[b].bsums[2 * l + 1]);
    for (int p = 0; p < QK_K; ++p) {
      const int h = p / 128, l = p % 32, k = (p % 128) / 32;  // k: which of the 4 quarter rows
      const uint8_t lo = a[b].ql[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1));
      const int q = (lo & 0xF) | (((a[b].qh[32 * h + l] >> (2 * k)) & 3) << 4);  // the code, 0..63
      lane[l / 4] += a[b].scales[p / 16] * (q * x[b].qs[p]);
    }
    fma_lanes_simd_order(acc, x[b].d * fp16_to_fp32(a[b].d), lane);
  }
  return hsum8_simd_order(acc);
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
