// Scalar dequantization of every ggml type, bit-exact with ggml: the same float operations in the same
// order (a*b - c is never contracted into an FMA: ISO C++ mode keeps -ffp-contract=off).
#include "quant/dequant.h"

#include <cstring>
#include <string>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/iq_tables.h"
#include "quant/q4_0_x8.h"
#include "quant/q6_k_p.h"
#include "quant/q6_k_x8.h"

namespace strata {
namespace {
using namespace q;

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIQ2_XXS) == 66 && sizeof(BlockIQ2_XS) == 74 && sizeof(BlockIQ2_S) == 82 &&
              sizeof(BlockIQ3_XXS) == 98 && sizeof(BlockIQ3_S) == 110 && sizeof(BlockIQ1_S) == 50 &&
              sizeof(BlockIQ1_M) == 56 && sizeof(BlockIQ4_XS) == 136);

inline const uint8_t* grid_bytes(const void* entry) { return static_cast<const uint8_t*>(entry); }
inline float sgn(uint8_t signs, int j) { return (signs & iq::kIq2SignMask[j]) ? -1.f : 1.f; }

// ---- plain floats ----
void deq_f32(const void* src, float* y, int64_t n) { std::memcpy(y, src, n * sizeof(float)); }
void deq_f16(const void* src, float* y, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(h[i]);
}
void deq_bf16(const void* src, float* y, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(h[i]);
}

// ---- 32-value blocks ----
void deq_q4_0(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / QK; ++i, y += QK) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = ((x[i].qs[j] & 0xF) - 8) * d;
      y[j + 16] = ((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}
void deq_q4_1(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / QK; ++i, y += QK) {
    const float d = fp16_to_fp32(x[i].d), m = fp16_to_fp32(x[i].m);
    for (int j = 0; j < 16; ++j) {
      y[j] = (x[i].qs[j] & 0xF) * d + m;
      y[j + 16] = (x[i].qs[j] >> 4) * d + m;
    }
  }
}
void deq_q5_0(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < n / QK; ++i, y += QK) {
    const float d = fp16_to_fp32(x[i].d);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, 4);
    for (int j = 0; j < 16; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
      y[j] = (((x[i].qs[j] & 0xF) | h0) - 16) * d;
      y[j + 16] = (((x[i].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}
void deq_q5_1(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / QK; ++i, y += QK) {
    const float d = fp16_to_fp32(x[i].d), m = fp16_to_fp32(x[i].m);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, 4);
    for (int j = 0; j < 16; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
      y[j] = ((x[i].qs[j] & 0xF) | h0) * d + m;
      y[j + 16] = ((x[i].qs[j] >> 4) | h1) * d + m;
    }
  }
}
void deq_q8_0(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / QK; ++i, y += QK) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < 32; ++j) y[j] = x[i].qs[j] * d;
  }
}
void deq_iq4_nl(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockIQ4_NL*>(src);
  for (int64_t i = 0; i < n / QK; ++i, y += QK) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * iq::kIq4nlValues[x[i].qs[j] & 0xF];
      y[j + 16] = d * iq::kIq4nlValues[x[i].qs[j] >> 4];
    }
  }
}

// ---- K-quants (256-value super-blocks) ----
void deq_q2_k(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ2_K*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d), dmin = fp16_to_fp32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {
          const uint8_t sc = x[i].scales[is++];
          const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((q[l + 16 * part] >> shift) & 3) - ml;
        }
      }
    }
  }
}
void deq_q3_k(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ3_K*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    int8_t sc[16];
    q3k_scales(x[i].scales, sc);
    const uint8_t* q = x[i].qs;
    uint8_t m = 1;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
        for (int part = 0; part < 2; ++part) {
          const float dl = d * sc[is++];
          for (int l = 16 * part; l < 16 * part + 16; ++l)
            *y++ = dl * (((q[l] >> shift) & 3) - ((x[i].hmask[l] & m) ? 0 : 4));
        }
      }
    }
  }
}
void deq_q4_k(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ4_K*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d), dmin = fp16_to_fp32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    for (int j = 0; j < 8; j += 2, q += 32) {
      uint8_t sc, m;
      k4_scale_min(j, x[i].scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      k4_scale_min(j + 1, x[i].scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}
void deq_q5_k(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ5_K*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d), dmin = fp16_to_fp32(x[i].dmin);
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 8; j += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      k4_scale_min(j, x[i].scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      k4_scale_min(j + 1, x[i].scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}
void deq_q6_k(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}
void deq_q8_k(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ8_K*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i)
    for (int j = 0; j < QK_K; ++j) *y++ = x[i].d * x[i].qs[j];
}

// ---- IQ formats: indices into lattice grids + sign patterns ----
void deq_iq2_xxs(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockIQ2_XXS*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t aux[2];
      std::memcpy(aux, x[i].qs + 4 * ib, 8);
      const auto* idx = reinterpret_cast<const uint8_t*>(aux);
      const float db = d * (0.5f + (aux[1] >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t* g = grid_bytes(&iq::kIq2xxsGrid[idx[l]]);
        const uint8_t signs = iq::kIq2Signs[(aux[1] >> 7 * l) & 127];
        for (int j = 0; j < 8; ++j) y[j] = db * g[j] * sgn(signs, j);
      }
    }
  }
}
void deq_iq2_xs(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockIQ2_XS*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float db[2] = {d * (0.5f + (x[i].scales[ib] & 0xf)) * 0.25f,
                           d * (0.5f + (x[i].scales[ib] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint16_t qs = x[i].qs[4 * ib + l];
        const uint8_t* g = grid_bytes(&iq::kIq2xsGrid[qs & 511]);
        const uint8_t signs = iq::kIq2Signs[qs >> 9];
        for (int j = 0; j < 8; ++j) y[j] = db[l / 2] * g[j] * sgn(signs, j);
      }
    }
  }
}
void deq_iq2_s(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockIQ2_S*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* qs = x[i].qs;
    const uint8_t* signs = x[i].qs + QK_K / 8;
    for (int ib = 0; ib < 8; ++ib, qs += 4, signs += 4) {
      const float db[2] = {d * (0.5f + (x[i].scales[ib] & 0xf)) * 0.25f,
                           d * (0.5f + (x[i].scales[ib] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t* g = grid_bytes(&iq::kIq2sGrid[qs[l] | ((x[i].qh[ib] << (8 - 2 * l)) & 0x300)]);
        for (int j = 0; j < 8; ++j) y[j] = db[l / 2] * g[j] * sgn(signs[l], j);
      }
    }
  }
}
void deq_iq3_xxs(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockIQ3_XXS*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* qs = x[i].qs;
    const uint8_t* scales_and_signs = x[i].qs + QK_K / 4;
    for (int ib = 0; ib < 8; ++ib, qs += 8) {
      uint32_t aux;
      std::memcpy(&aux, scales_and_signs + 4 * ib, 4);
      const float db = d * (0.5f + (aux >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t signs = iq::kIq2Signs[(aux >> 7 * l) & 127];
        const uint8_t* g1 = grid_bytes(&iq::kIq3xxsGrid[qs[2 * l]]);
        const uint8_t* g2 = grid_bytes(&iq::kIq3xxsGrid[qs[2 * l + 1]]);
        for (int j = 0; j < 4; ++j) {
          y[j] = db * g1[j] * sgn(signs, j);
          y[j + 4] = db * g2[j] * sgn(signs, j + 4);
        }
      }
    }
  }
}
void deq_iq3_s(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockIQ3_S*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* qs = x[i].qs;
    const uint8_t* signs = x[i].signs;
    for (int ib = 0; ib < 8; ++ib, qs += 8, signs += 4) {
      const uint8_t sc = x[i].scales[ib / 2];
      const float db = d * (1 + 2 * ((ib & 1) ? (sc >> 4) : (sc & 0xf)));
      const uint8_t qh = x[i].qh[ib];
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t* g1 = grid_bytes(&iq::kIq3sGrid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)]);
        const uint8_t* g2 = grid_bytes(&iq::kIq3sGrid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)]);
        for (int j = 0; j < 4; ++j) {
          y[j] = db * g1[j] * sgn(signs[l], j);
          y[j + 4] = db * g2[j] * sgn(signs[l], j + 4);
        }
      }
    }
  }
}
void deq_iq1_s(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockIQ1_S*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* qs = x[i].qs;
    for (int ib = 0; ib < 8; ++ib, qs += 4) {
      const uint16_t qh = x[i].qh[ib];
      const float dl = d * (2 * ((qh >> 12) & 7) + 1);
      const float delta = (qh & 0x8000) ? -iq::kIq1Delta : iq::kIq1Delta;
      for (int l = 0; l < 4; ++l, y += 8) {
        const auto* g = reinterpret_cast<const int8_t*>(&iq::kIq1sGrid[qs[l] | (((qh >> 3 * l) & 7) << 8)]);
        for (int j = 0; j < 8; ++j) y[j] = dl * (g[j] + delta);
      }
    }
  }
}
void deq_iq1_m(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockIQ1_M*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    uint16_t sc[4];
    std::memcpy(sc, x[i].scales, 8);
    const float d = iq1m_scale(x[i]);
    const uint8_t* qs = x[i].qs;
    const uint8_t* qh = x[i].qh;
    for (int ib = 0; ib < 8; ++ib, qs += 4, qh += 2) {
      const float dl[2] = {d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 0x7) + 1),
                           d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 0x7) + 1)};
      const uint16_t idx[4] = {(uint16_t)(qs[0] | ((qh[0] << 8) & 0x700)),
                               (uint16_t)(qs[1] | ((qh[0] << 4) & 0x700)),
                               (uint16_t)(qs[2] | ((qh[1] << 8) & 0x700)),
                               (uint16_t)(qs[3] | ((qh[1] << 4) & 0x700))};
      const float delta[4] = {qh[0] & 0x08 ? -iq::kIq1Delta : iq::kIq1Delta,
                              qh[0] & 0x80 ? -iq::kIq1Delta : iq::kIq1Delta,
                              qh[1] & 0x08 ? -iq::kIq1Delta : iq::kIq1Delta,
                              qh[1] & 0x80 ? -iq::kIq1Delta : iq::kIq1Delta};
      for (int l = 0; l < 4; ++l, y += 8) {
        const auto* g = reinterpret_cast<const int8_t*>(&iq::kIq1sGrid[idx[l]]);
        for (int j = 0; j < 8; ++j) y[j] = dl[l / 2] * (g[j] + delta[l]);
      }
    }
  }
}
void deq_iq4_xs(const void* src, float* y, int64_t n) {
  const auto* x = static_cast<const BlockIQ4_XS*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* qs = x[i].qs;
    for (int ib = 0; ib < 8; ++ib, qs += 16, y += 32) {
      const int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
      const float dl = d * (ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * iq::kIq4nlValues[qs[j] & 0xf];
        y[j + 16] = dl * iq::kIq4nlValues[qs[j] >> 4];
      }
    }
  }
}

using DequantFn = void (*)(const void*, float*, int64_t);

// The one place that maps a type to its dequantization (nullptr: none).
DequantFn dequant_fn(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return deq_f32;
    case GgmlType::F16: return deq_f16;
    case GgmlType::BF16: return deq_bf16;
    case GgmlType::Q4_0: return deq_q4_0;
    case GgmlType::Q4_1: return deq_q4_1;
    case GgmlType::Q5_0: return deq_q5_0;
    case GgmlType::Q5_1: return deq_q5_1;
    case GgmlType::Q8_0: return deq_q8_0;
    case GgmlType::Q2_K: return deq_q2_k;
    case GgmlType::Q3_K: return deq_q3_k;
    case GgmlType::Q4_K: return deq_q4_k;
    case GgmlType::Q5_K: return deq_q5_k;
    case GgmlType::Q6_K: return deq_q6_k;
    case GgmlType::Q8_K: return deq_q8_k;
    case GgmlType::IQ4_NL: return deq_iq4_nl;
    case GgmlType::IQ4_XS: return deq_iq4_xs;
    case GgmlType::IQ2_XXS: return deq_iq2_xxs;
    case GgmlType::IQ2_XS: return deq_iq2_xs;
    case GgmlType::IQ2_S: return deq_iq2_s;
    case GgmlType::IQ3_XXS: return deq_iq3_xxs;
    case GgmlType::IQ3_S: return deq_iq3_s;
    case GgmlType::IQ1_S: return deq_iq1_s;
    case GgmlType::IQ1_M: return deq_iq1_m;
    case GgmlType::Q4_0_X8: return dequantize_q4_0_x8;
    case GgmlType::Q6_K_X8: return dequantize_q6_k_x8;
    case GgmlType::Q6_K_P: return dequantize_q6_k_p;
    default: return nullptr;
  }
}

}  // namespace

bool can_dequantize(GgmlType type) { return dequant_fn(type) != nullptr; }

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const TypeTraits* known = find_type_traits(type);
  DequantFn fn = dequant_fn(type);
  if (!fn)
    fail("unsupported type {} for dequantization",
         known ? std::string(known->name) : "id " + std::to_string(static_cast<uint32_t>(type)));
  const auto& tt = *known;
  STRATA_REQUIRE(n >= 0 && n % tt.block_size == 0, "dequantize {}: {} values is not a multiple of the block size {}",
                 tt.name, n, tt.block_size);
  fn(src, dst, n);
}

}  // namespace strata
