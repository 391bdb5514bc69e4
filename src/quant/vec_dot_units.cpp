// Scalar unit-format kernels with the SIMD kernels' float order (contract: vec_dot_units.h).
//
// The SIMD kernel (vec_dot_x86.inc dotn_units) per block of 256 values, for each token:
//   * 8 int32 lanes start at the format's init (Q3_K: -4 * its scales times the activations' 16-value
//     sums, lane l taking groups 2l and 2l + 1) and lane l adds, for every unit u of 32 values, the
//     values 32u + 4l .. 32u + 4l + 3 (weight code times activation) times the scale of their 16-value
//     half (lanes 0-3: the unit's first half, 4-7: its second);
//   * acc[l] = fma(x.d * d, float(lane[l]), acc[l]); formats with a min (Q2_K) also
//     corr[l] = fma(x.d * dmin, float(min lane l), corr[l]), min lane l = min[2l] * bsum[2l] +
//     min[2l + 1] * bsum[2l + 1];
//   * after the last block: hsum(acc) (- hsum(corr)), hsum = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
// Each decoder below gives the weight codes the SIMD unit() feeds to the products (signed values for the
// signed formats: |v| times the sign; Q2_K and Q3_K their unsigned codes), the 16 half scales, the
// block's d (and dmin) computed as the SIMD Fmt computes them, and the init / min lanes.
#include "quant/vec_dot_units.h"

#include <cstring>

#include "quant/blocks.h"
#include "quant/iq_tables.h"

namespace strata::q {
namespace {

struct UnitBlock {
  int8_t w[QK_K];       // weight codes as the products take them
  int16_t sc[16];       // scale of each 16-value half (value p: sc[p / 16])
  int32_t init[8];      // each lane's start
  int32_t mins[8];      // has_min: the min term's lanes (already times the bsums)
  float d = 0, dmin = 0;
};

// Lane l of a pair of 16-value groups: v[2l] * bsums[2l] + v[2l + 1] * bsums[2l + 1].
template <typename T>
inline void pair_lanes(const T v[16], const int16_t* bsums, int32_t out[8]) {
  for (int l = 0; l < 8; ++l) out[l] = int32_t(v[2 * l]) * bsums[2 * l] + int32_t(v[2 * l + 1]) * bsums[2 * l + 1];
}

// 8 values of a grid row with signs (bit j set: value j negated).
inline void grid8(const uint8_t* grid, unsigned signs, int8_t* out) {
  for (int j = 0; j < 8; ++j) out[j] = int8_t((signs >> j & 1) ? -grid[j] : grid[j]);
}

template <bool kHasMin, typename Decode>
float dot_units(int64_t n, const void* w, const void* xq, Decode decode) {
  const auto* x = static_cast<const BlockQ8_K*>(xq);
  float acc[8] = {}, corr[8] = {};
  UnitBlock ub;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    decode(b, w, x[b], ub);
    int32_t lane[8];
    std::memcpy(lane, ub.init, sizeof(lane));
    const int8_t* y = x[b].qs;
    for (int u = 0; u < 8; ++u)
      for (int l = 0; l < 8; ++l) {
        const int p = 32 * u + 4 * l;
        int32_t s = 0;
        for (int j = 0; j < 4; ++j) s += int32_t(ub.w[p + j]) * y[p + j];
        lane[l] += int32_t(ub.sc[2 * u + l / 4]) * s;
      }
    if constexpr (kHasMin) {
      const float dm = x[b].d * ub.dmin;
      fma_lanes_simd_order(corr, dm, ub.mins);
    }
    const float dd = x[b].d * ub.d;
    fma_lanes_simd_order(acc, dd, lane);
  }
  return kHasMin ? hsum8_simd_order(acc) - hsum8_simd_order(corr) : hsum8_simd_order(acc);
}

// ---- decoders: (block index, weights, the block's activations) -> UnitBlock ----

void decode_q2_k(int64_t b, const void* w, const BlockQ8_K& x, UnitBlock& ub) {
  const BlockQ2_K& a = static_cast<const BlockQ2_K*>(w)[b];
  for (int p = 0; p < QK_K; ++p) ub.w[p] = int8_t((a.qs[32 * (p / 128) + p % 32] >> (2 * ((p % 128) / 32))) & 3);
  uint8_t mins[16];
  for (int g = 0; g < 16; ++g) ub.sc[g] = int16_t(a.scales[g] & 0xF), mins[g] = a.scales[g] >> 4;
  std::memset(ub.init, 0, sizeof(ub.init));
  pair_lanes(mins, x.bsums, ub.mins);
  ub.d = fp16_to_fp32(a.d);
  ub.dmin = fp16_to_fp32(a.dmin);
}

void decode_q3_k(int64_t b, const void* w, const BlockQ8_K& x, UnitBlock& ub) {
  const BlockQ3_K& a = static_cast<const BlockQ3_K*>(w)[b];
  for (int p = 0; p < QK_K; ++p) {
    const int lo = (a.qs[32 * (p / 128) + p % 32] >> (2 * ((p % 128) / 32))) & 3;
    const int hi = (a.hmask[p % 32] >> (p / 32)) & 1;
    ub.w[p] = int8_t(lo + 4 * hi);  // code - 4 * (1 - hi) = lo - (hi ? 0 : 4): the 4 comes off via init
  }
  int8_t sc[16];
  q3k_scales(a.scales, sc);
  for (int g = 0; g < 16; ++g) ub.sc[g] = sc[g];
  pair_lanes(sc, x.bsums, ub.init);
  for (int32_t& v : ub.init) v = -4 * v;
  ub.d = fp16_to_fp32(a.d);
}

void decode_iq4_xs(int64_t b, const void* w, const BlockQ8_K&, UnitBlock& ub) {
  const BlockIQ4_XS& a = static_cast<const BlockIQ4_XS*>(w)[b];
  for (int u = 0; u < 8; ++u) {
    const int ls = ((a.scales_l[u / 2] >> 4 * (u % 2)) & 0xf) | (((a.scales_h >> 2 * u) & 3) << 4);
    for (int j = 0; j < 16; ++j) {
      ub.w[32 * u + j] = iq::kIq4nlValues[a.qs[16 * u + j] & 0xF];
      ub.w[32 * u + 16 + j] = iq::kIq4nlValues[a.qs[16 * u + j] >> 4];
    }
    ub.sc[2 * u] = ub.sc[2 * u + 1] = int16_t(ls - 32);
  }
  std::memset(ub.init, 0, sizeof(ub.init));
  ub.d = fp16_to_fp32(a.d);
}

void decode_iq2_xxs(int64_t b, const void* w, const BlockQ8_K&, UnitBlock& ub) {
  const BlockIQ2_XXS& a = static_cast<const BlockIQ2_XXS*>(w)[b];
  for (int u = 0; u < 8; ++u) {
    uint32_t aux[2];
    std::memcpy(aux, a.qs + 4 * u, 8);
    const auto* idx = reinterpret_cast<const uint8_t*>(aux);
    for (int l = 0; l < 4; ++l)
      grid8(reinterpret_cast<const uint8_t*>(&iq::kIq2xxsGrid[idx[l]]), iq::kIq2Signs[(aux[1] >> 7 * l) & 127],
            ub.w + 32 * u + 8 * l);
    ub.sc[2 * u] = ub.sc[2 * u + 1] = int16_t(2 * (aux[1] >> 28) + 1);
  }
  std::memset(ub.init, 0, sizeof(ub.init));
  ub.d = 0.125f * fp16_to_fp32(a.d);
}

void decode_iq2_xs(int64_t b, const void* w, const BlockQ8_K&, UnitBlock& ub) {
  const BlockIQ2_XS& a = static_cast<const BlockIQ2_XS*>(w)[b];
  for (int u = 0; u < 8; ++u) {
    for (int l = 0; l < 4; ++l) {
      const uint16_t q = a.qs[4 * u + l];
      grid8(reinterpret_cast<const uint8_t*>(&iq::kIq2xsGrid[q & 511]), iq::kIq2Signs[q >> 9], ub.w + 32 * u + 8 * l);
    }
    ub.sc[2 * u] = int16_t(2 * (a.scales[u] & 0xf) + 1);
    ub.sc[2 * u + 1] = int16_t(2 * (a.scales[u] >> 4) + 1);
  }
  std::memset(ub.init, 0, sizeof(ub.init));
  ub.d = 0.125f * fp16_to_fp32(a.d);
}

void decode_iq2_s(int64_t b, const void* w, const BlockQ8_K&, UnitBlock& ub) {
  const BlockIQ2_S& a = static_cast<const BlockIQ2_S*>(w)[b];
  const uint8_t* signs = a.qs + QK_K / 8;
  for (int u = 0; u < 8; ++u) {
    for (int l = 0; l < 4; ++l) {
      const int idx = a.qs[4 * u + l] | ((a.qh[u] << (8 - 2 * l)) & 0x300);
      grid8(reinterpret_cast<const uint8_t*>(&iq::kIq2sGrid[idx]), signs[4 * u + l], ub.w + 32 * u + 8 * l);
    }
    ub.sc[2 * u] = int16_t(2 * (a.scales[u] & 0xf) + 1);
    ub.sc[2 * u + 1] = int16_t(2 * (a.scales[u] >> 4) + 1);
  }
  std::memset(ub.init, 0, sizeof(ub.init));
  ub.d = 0.125f * fp16_to_fp32(a.d);
}

void decode_iq3_xxs(int64_t b, const void* w, const BlockQ8_K&, UnitBlock& ub) {
  const BlockIQ3_XXS& a = static_cast<const BlockIQ3_XXS*>(w)[b];
  for (int u = 0; u < 8; ++u) {
    uint32_t aux;
    std::memcpy(&aux, a.qs + QK_K / 4 + 4 * u, 4);
    for (int l = 0; l < 4; ++l) {
      uint8_t g[8];
      std::memcpy(g, &iq::kIq3xxsGrid[a.qs[8 * u + 2 * l]], 4);
      std::memcpy(g + 4, &iq::kIq3xxsGrid[a.qs[8 * u + 2 * l + 1]], 4);
      grid8(g, iq::kIq2Signs[(aux >> 7 * l) & 127], ub.w + 32 * u + 8 * l);
    }
    ub.sc[2 * u] = ub.sc[2 * u + 1] = int16_t(2 * (aux >> 28) + 1);
  }
  std::memset(ub.init, 0, sizeof(ub.init));
  ub.d = 0.25f * fp16_to_fp32(a.d);
}

void decode_iq3_s(int64_t b, const void* w, const BlockQ8_K&, UnitBlock& ub) {
  const BlockIQ3_S& a = static_cast<const BlockIQ3_S*>(w)[b];
  for (int u = 0; u < 8; ++u) {
    const uint8_t* qs = a.qs + 8 * u;
    const uint8_t qh = a.qh[u];
    for (int l = 0; l < 4; ++l) {
      uint8_t g[8];
      std::memcpy(g, &iq::kIq3sGrid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)], 4);
      std::memcpy(g + 4, &iq::kIq3sGrid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)], 4);
      grid8(g, a.signs[4 * u + l], ub.w + 32 * u + 8 * l);
    }
    const int ls = (u & 1) ? (a.scales[u / 2] >> 4) : (a.scales[u / 2] & 0xf);
    ub.sc[2 * u] = ub.sc[2 * u + 1] = int16_t(2 * ls + 1);
  }
  std::memset(ub.init, 0, sizeof(ub.init));
  ub.d = fp16_to_fp32(a.d);
}

// IQ1: each value is 8 * grid (-1/0/+1) + delta (+-1), in units of 1/8 (d carries the 1/8).
void decode_iq1_s(int64_t b, const void* w, const BlockQ8_K&, UnitBlock& ub) {
  const BlockIQ1_S& a = static_cast<const BlockIQ1_S*>(w)[b];
  for (int u = 0; u < 8; ++u) {
    const uint16_t qh = a.qh[u];
    const int delta = (qh & 0x8000) ? -1 : 1;
    for (int l = 0; l < 4; ++l) {
      const auto* g = reinterpret_cast<const int8_t*>(&iq::kIq1sGrid[a.qs[4 * u + l] | (((qh >> 3 * l) & 7) << 8)]);
      for (int j = 0; j < 8; ++j) ub.w[32 * u + 8 * l + j] = int8_t(8 * g[j] + delta);
    }
    ub.sc[2 * u] = ub.sc[2 * u + 1] = int16_t(2 * ((qh >> 12) & 7) + 1);
  }
  std::memset(ub.init, 0, sizeof(ub.init));
  ub.d = 0.125f * fp16_to_fp32(a.d);
}

void decode_iq1_m(int64_t b, const void* w, const BlockQ8_K&, UnitBlock& ub) {
  const BlockIQ1_M& a = static_cast<const BlockIQ1_M*>(w)[b];
  uint16_t sc[4];
  std::memcpy(sc, a.scales, 8);
  for (int u = 0; u < 8; ++u) {
    for (int l = 0; l < 4; ++l) {
      const uint8_t h = a.qh[2 * u + l / 2] >> (4 * (l & 1));
      const auto* g = reinterpret_cast<const int8_t*>(&iq::kIq1sGrid[a.qs[4 * u + l] | ((h & 7) << 8)]);
      const int delta = (h & 8) ? -1 : 1;
      for (int j = 0; j < 8; ++j) ub.w[32 * u + 8 * l + j] = int8_t(8 * g[j] + delta);
    }
    ub.sc[2 * u] = int16_t(2 * ((sc[u / 2] >> (6 * (u % 2))) & 7) + 1);
    ub.sc[2 * u + 1] = int16_t(2 * ((sc[u / 2] >> (6 * (u % 2) + 3)) & 7) + 1);
  }
  std::memset(ub.init, 0, sizeof(ub.init));
  ub.d = 0.125f * iq1m_scale(a);
}

template <bool kHasMin, void (*D)(int64_t, const void*, const BlockQ8_K&, UnitBlock&)>
float kernel(int64_t n, const void* w, const void* xq) {
  return dot_units<kHasMin>(n, w, xq, D);
}

}  // namespace

UnitDotFn unit_dot_scalar(GgmlType type) {
  switch (type) {
    case GgmlType::Q2_K: return kernel<true, decode_q2_k>;
    case GgmlType::Q3_K: return kernel<false, decode_q3_k>;
    case GgmlType::IQ4_XS: return kernel<false, decode_iq4_xs>;
    case GgmlType::IQ2_XXS: return kernel<false, decode_iq2_xxs>;
    case GgmlType::IQ2_XS: return kernel<false, decode_iq2_xs>;
    case GgmlType::IQ2_S: return kernel<false, decode_iq2_s>;
    case GgmlType::IQ3_XXS: return kernel<false, decode_iq3_xxs>;
    case GgmlType::IQ3_S: return kernel<false, decode_iq3_s>;
    case GgmlType::IQ1_S: return kernel<false, decode_iq1_s>;
    case GgmlType::IQ1_M: return kernel<false, decode_iq1_m>;
    default: return nullptr;
  }
}

}  // namespace strata::q
