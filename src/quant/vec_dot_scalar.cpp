// Portable scalar fast-mode kernels: the same integer math as the AVX2/AVX-512 kernels (per-block
// integer sums, one float multiply per block), so those are tested against these.
#include <cstring>

#include "quant/iq_tables.h"
#include "quant/vec_dot.h"

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
float dot_q2_k(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockQ2_K*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0, msum = 0;
    for (int g = 0; g < 16; ++g) msum += (a[b].scales[g] >> 4) * x[b].bsums[g];
    for (int p = 0; p < QK_K; ++p) {
      const int q = (a[b].qs[32 * (p / 128) + p % 32] >> (2 * ((p % 128) / 32))) & 3;
      isum += (a[b].scales[p / 16] & 0xF) * q * x[b].qs[p];
    }
    s += x[b].d * (fp16_to_fp32(a[b].d) * isum - fp16_to_fp32(a[b].dmin) * msum);
  }
  return s;
}
float dot_q3_k(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockQ3_K*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int8_t sc[16];
    q3k_scales(a[b].scales, sc);
    int isum = 0;
    for (int g = 0; g < 16; ++g) {
      int gs = 0;
      for (int p = 16 * g; p < 16 * g + 16; ++p) {
        const int lo = (a[b].qs[32 * (p / 128) + p % 32] >> (2 * ((p % 128) / 32))) & 3;
        const int hi = (a[b].hmask[p % 32] >> (p / 32)) & 1;
        gs += (lo - (hi ? 0 : 4)) * x[b].qs[p];
      }
      isum += sc[g] * gs;
    }
    s += fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(isum);
  }
  return s;
}
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

// ---- IQ formats x Q8_K ----
float dot_iq4_xs(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockIQ4_XS*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((a[b].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((a[b].scales_h >> 2 * ib) & 3) << 4);
      const uint8_t* q = a[b].qs + 16 * ib;
      const int8_t* y = x[b].qs + 32 * ib;
      int gs = 0;
      for (int j = 0; j < 16; ++j)
        gs += iq::kIq4nlValues[q[j] & 0xF] * y[j] + iq::kIq4nlValues[q[j] >> 4] * y[j + 16];
      isum += (ls - 32) * gs;
    }
    s += fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(isum);
  }
  return s;
}
// Sum over 8 values of grid * (+-1) * y; `grid` holds 8 magnitudes, `signs` one bit per value.
inline int grid8_dot(const uint8_t* grid, uint8_t signs, const int8_t* y) {
  int s = 0;
  for (int j = 0; j < 8; ++j) s += (signs >> j & 1) ? -grid[j] * y[j] : grid[j] * y[j];
  return s;
}
float dot_iq2_xxs(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockIQ2_XXS*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t aux[2];
      std::memcpy(aux, a[b].qs + 4 * ib, 8);
      const auto* idx = reinterpret_cast<const uint8_t*>(aux);
      int gs = 0;
      for (int l = 0; l < 4; ++l)
        gs += grid8_dot(reinterpret_cast<const uint8_t*>(&iq::kIq2xxsGrid[idx[l]]),
                        iq::kIq2Signs[(aux[1] >> 7 * l) & 127], x[b].qs + 32 * ib + 8 * l);
      isum += (2 * (aux[1] >> 28) + 1) * gs;
    }
    s += 0.125f * fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(isum);
  }
  return s;
}
float dot_iq2_xs(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockIQ2_XS*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      int gs[2] = {0, 0};
      for (int l = 0; l < 4; ++l) {
        const uint16_t q = a[b].qs[4 * ib + l];
        gs[l / 2] += grid8_dot(reinterpret_cast<const uint8_t*>(&iq::kIq2xsGrid[q & 511]), iq::kIq2Signs[q >> 9],
                               x[b].qs + 32 * ib + 8 * l);
      }
      isum += (2 * (a[b].scales[ib] & 0xf) + 1) * gs[0] + (2 * (a[b].scales[ib] >> 4) + 1) * gs[1];
    }
    s += 0.125f * fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(isum);
  }
  return s;
}
float dot_iq2_s(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockIQ2_S*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const uint8_t* signs = a[b].qs + QK_K / 8;
    int isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      int gs[2] = {0, 0};
      for (int l = 0; l < 4; ++l) {
        const int idx = a[b].qs[4 * ib + l] | ((a[b].qh[ib] << (8 - 2 * l)) & 0x300);
        gs[l / 2] += grid8_dot(reinterpret_cast<const uint8_t*>(&iq::kIq2sGrid[idx]), signs[4 * ib + l],
                               x[b].qs + 32 * ib + 8 * l);
      }
      isum += (2 * (a[b].scales[ib] & 0xf) + 1) * gs[0] + (2 * (a[b].scales[ib] >> 4) + 1) * gs[1];
    }
    s += 0.125f * fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(isum);
  }
  return s;
}
float dot_iq3_xxs(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockIQ3_XXS*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const uint8_t* qs = a[b].qs;
    int isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t aux;
      std::memcpy(&aux, a[b].qs + QK_K / 4 + 4 * ib, 4);
      int gs = 0;
      for (int l = 0; l < 4; ++l) {
        uint8_t g[8];
        std::memcpy(g, &iq::kIq3xxsGrid[qs[8 * ib + 2 * l]], 4);
        std::memcpy(g + 4, &iq::kIq3xxsGrid[qs[8 * ib + 2 * l + 1]], 4);
        gs += grid8_dot(g, iq::kIq2Signs[(aux >> 7 * l) & 127], x[b].qs + 32 * ib + 8 * l);
      }
      isum += (2 * (aux >> 28) + 1) * gs;
    }
    s += 0.25f * fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(isum);
  }
  return s;
}
float dot_iq3_s(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockIQ3_S*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* qs = a[b].qs + 8 * ib;
      const uint8_t qh = a[b].qh[ib];
      int gs = 0;
      for (int l = 0; l < 4; ++l) {
        uint8_t g[8];
        std::memcpy(g, &iq::kIq3sGrid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)], 4);
        std::memcpy(g + 4, &iq::kIq3sGrid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)], 4);
        gs += grid8_dot(g, a[b].signs[4 * ib + l], x[b].qs + 32 * ib + 8 * l);
      }
      const int ls = (ib & 1) ? (a[b].scales[ib / 2] >> 4) : (a[b].scales[ib / 2] & 0xf);
      isum += (2 * ls + 1) * gs;
    }
    s += fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(isum);
  }
  return s;
}
// IQ1: value = grid (-1/0/1) + delta (+-1/8): the dot is (8 * sum(grid*y) + 8 * delta * sum(y)) / 8.
float dot_iq1_s(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockIQ1_S*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t qh = a[b].qh[ib];
      int gs = 0, ys = 0;
      for (int l = 0; l < 4; ++l) {
        const auto* g = reinterpret_cast<const int8_t*>(&iq::kIq1sGrid[a[b].qs[4 * ib + l] | (((qh >> 3 * l) & 7) << 8)]);
        const int8_t* y = x[b].qs + 32 * ib + 8 * l;
        for (int j = 0; j < 8; ++j) gs += g[j] * y[j], ys += y[j];
      }
      isum += (2 * ((qh >> 12) & 7) + 1) * (8 * gs + ((qh & 0x8000) ? -ys : ys));
    }
    s += 0.125f * fp16_to_fp32(a[b].d) * x[b].d * static_cast<float>(isum);
  }
  return s;
}
float dot_iq1_m(int64_t n, const void* w, const void* xq) {
  const auto* a = static_cast<const BlockIQ1_M*>(w);
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    uint16_t sc[4];
    std::memcpy(sc, a[b].scales, 8);
    int isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* qs = a[b].qs + 4 * ib;
      const uint8_t* qh = a[b].qh + 2 * ib;
      int part[2] = {0, 0};
      for (int l = 0; l < 4; ++l) {
        const uint8_t h = qh[l / 2] >> (4 * (l & 1));
        const auto* g = reinterpret_cast<const int8_t*>(&iq::kIq1sGrid[qs[l] | ((h & 7) << 8)]);
        const int8_t* y = x[b].qs + 32 * ib + 8 * l;
        int gs = 0, ys = 0;
        for (int j = 0; j < 8; ++j) gs += g[j] * y[j], ys += y[j];
        part[l / 2] += 8 * gs + ((h & 8) ? -ys : ys);
      }
      isum += (2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1) * part[0] +
              (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1) * part[1];
    }
    s += 0.125f * iq1m_scale(a[b]) * x[b].d * static_cast<float>(isum);
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
    case GgmlType::Q2_K: return dot_q2_k;
    case GgmlType::Q3_K: return dot_q3_k;
    case GgmlType::Q4_K: return dot_q4_k;
    case GgmlType::Q5_K: return dot_q5_k;
    case GgmlType::Q6_K: return dot_q6_k;
    case GgmlType::IQ4_XS: return dot_iq4_xs;
    case GgmlType::IQ2_XXS: return dot_iq2_xxs;
    case GgmlType::IQ2_XS: return dot_iq2_xs;
    case GgmlType::IQ2_S: return dot_iq2_s;
    case GgmlType::IQ3_XXS: return dot_iq3_xxs;
    case GgmlType::IQ3_S: return dot_iq3_s;
    case GgmlType::IQ1_S: return dot_iq1_s;
    case GgmlType::IQ1_M: return dot_iq1_m;
    default: return nullptr;
  }
}

}  // namespace strata::q
