// Quantizers of the 256-value super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS. Each sub-block's
// scale (and min) is fitted first (quant_fit.h); then the sub-block scales are themselves quantized
// against the super-block's fp16 scale(s), and the values re-rounded against the scales actually stored,
// so the stored blocks are self-consistent. For the formats with few bits per sub-block scale (Q2_K's 4,
// Q3_K's and IQ4_XS's 6) the stored scale nearest the fit need not be the best once the values are
// re-rounded against it: its neighbours are tried too and the smallest weighted error is kept.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/iq_tables.h"
#include "quant/quant_fit.h"
#include "quant/quantize_impl.h"

namespace strata::qimpl {
namespace {
using namespace q;

// Rounds x against a stored step and min (x ~ dl * L - ml, L in [0, nmax]); returns the weighted error.
float round_scale_min(const float* x, const float* w, int n, float dl, float ml, int nmax, uint8_t* L) {
  float err = 0;
  for (int i = 0; i < n; ++i) {
    const int l = dl > 0 ? std::clamp(nearest_int((x[i] + ml) / dl), 0, nmax) : 0;
    L[i] = static_cast<uint8_t>(l);
    const float e = dl * l - ml - x[i];
    err += w[i] * e * e;
  }
  return err;
}

// Rounds x against a stored step (x ~ dl * L, L in [-nmax, nmax - 1]); returns the weighted error.
float round_symmetric(const float* x, const float* w, int n, float dl, int nmax, int8_t* L) {
  float err = 0;
  for (int i = 0; i < n; ++i) {
    const int l = dl != 0 ? std::clamp(nearest_int(x[i] / dl), -nmax, nmax - 1) : 0;
    L[i] = static_cast<int8_t>(l);
    const float e = dl * l - x[i];
    err += w[i] * e * e;
  }
  return err;
}

// Rounds x against a stored step on IQ4_NL's grid (x ~ dl * grid[L]); returns the weighted error.
float round_grid(const float* x, const float* w, int n, float dl, uint8_t* L) {
  float err = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(qfit::nearest_grid16(iq::kIq4nlValues, dl != 0 ? x[i] / dl : 0.f));
    const float e = dl * iq::kIq4nlValues[L[i]] - x[i];
    err += w[i] * e * e;
  }
  return err;
}

// 2-bit codes of 256 values: byte l of half h holds values 128h + l + 32k in bits 2k (Q2_K's and Q3_K's qs).
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* v = L + 128 * h + l;
      qs[32 * h + l] = static_cast<uint8_t>((v[0] & 3) | ((v[32] & 3) << 2) | ((v[64] & 3) << 4) | ((v[96] & 3) << 6));
    }
}

// The signed 6-bit sub-block scale l (step d * l, l in [-32, 31]) nearest the fitted one and its two
// neighbours: round(dl, Lt) re-rounds the sub-block's n <= 32 values against each and returns the weighted
// error; the best l is returned and its codes left in L.
template <typename Code, typename Round>
int best_signed_scale(float fitted, float d, int n, Code* L, Round round) {
  Code Lt[32];
  const int l0 = std::clamp(nearest_int(fitted / d), -32, 31);
  float best = INFINITY;
  int l_best = l0;
  for (int l = std::max(l0 - 1, -32); l <= std::min(l0 + 1, 31); ++l) {
    const float err = round(d * l, Lt);
    if (err < best) best = err, l_best = l, std::memcpy(L, Lt, sizeof(Code) * n);
  }
  return l_best;
}

// Q4_K (nbits 4) and Q5_K (nbits 5): 8 sub-blocks of 32 with 6-bit scale and min.
template <int NBITS>
void quantize_k4(const float* x, uint8_t* d_out, uint8_t* dmin_out, uint8_t* scales_out, uint8_t* L) {
  constexpr int nmax = (1 << NBITS) - 1;
  float scale[8], mn[8], w[QK_K];
  for (int j = 0; j < 8; ++j) {
    qfit::rms_plus_abs_weights(x + 32 * j, 32, w + 32 * j);
    scale[j] = qfit::fit_scale_min(x + 32 * j, w + 32 * j, 32, nmax, /*min_le_zero=*/true, L + 32 * j, &mn[j]);
  }
  const float max_scale = *std::max_element(scale, scale + 8), max_min = *std::max_element(mn, mn + 8);
  const float is = max_scale > 0 ? 63.f / max_scale : 0.f, im = max_min > 0 ? 63.f / max_min : 0.f;
  const uint16_t dh = qfit::fp16_sat(max_scale / 63.f), mh = qfit::fp16_sat(max_min / 63.f);
  std::memcpy(d_out, &dh, 2);
  std::memcpy(dmin_out, &mh, 2);
  const float d = fp16_to_fp32(dh), dmin = fp16_to_fp32(mh);
  uint8_t ls[8], lm[8], Lt[32];
  for (int j = 0; j < 8; ++j) {  // the stored pair nearest the fit and its neighbours, re-rounded against each
    const int ls0 = std::clamp(nearest_int(is * scale[j]), 0, 63), lm0 = std::clamp(nearest_int(im * mn[j]), 0, 63);
    float best = INFINITY;
    for (int a = std::max(ls0 - 1, 0); a <= std::min(ls0 + 1, 63); ++a)
      for (int m = std::max(lm0 - 1, 0); m <= std::min(lm0 + 1, 63); ++m) {
        const float err = round_scale_min(x + 32 * j, w + 32 * j, 32, d * a, dmin * m, nmax, Lt);
        if (err < best) {
          best = err, ls[j] = static_cast<uint8_t>(a), lm[j] = static_cast<uint8_t>(m);
          std::memcpy(L + 32 * j, Lt, 32);
        }
      }
  }
  std::memset(scales_out, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      scales_out[j] = ls[j];
      scales_out[j + 4] = lm[j];
    } else {
      scales_out[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      scales_out[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      scales_out[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
}

}  // namespace

void quantize_q4_k(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ4_K*>(dst);
  uint8_t L[QK_K];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    quantize_k4<4>(x, reinterpret_cast<uint8_t*>(&y[b].d), reinterpret_cast<uint8_t*>(&y[b].dmin), y[b].scales, L);
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 32; ++l) y[b].qs[32 * p + l] = static_cast<uint8_t>(L[64 * p + l] | (L[64 * p + 32 + l] << 4));
  }
}

void quantize_q5_k(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ5_K*>(dst);
  uint8_t L[QK_K];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    quantize_k4<5>(x, reinterpret_cast<uint8_t*>(&y[b].d), reinterpret_cast<uint8_t*>(&y[b].dmin), y[b].scales, L);
    std::memset(y[b].qh, 0, 32);
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 32; ++l)
        y[b].qs[32 * p + l] = static_cast<uint8_t>((L[64 * p + l] & 0xF) | ((L[64 * p + 32 + l] & 0xF) << 4));
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) y[b].qh[l] |= static_cast<uint8_t>(((L[32 * j + l] >> 4) & 1) << j);
  }
}

void quantize_q6_k(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ6_K*>(dst);
  int8_t L[QK_K];
  float scale[16], w[16];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    for (int g = 0; g < 16; ++g) {
      for (int l = 0; l < 16; ++l) w[l] = x[16 * g + l] * x[16 * g + l];
      scale[g] = qfit::fit_symmetric(x + 16 * g, w, 16, 32, L + 16 * g);
    }
    const float max_scale = qfit::signed_absmax(scale, 16);
    if (max_scale == 0) {
      std::memset(&y[b], 0, sizeof(BlockQ6_K));
      std::fill(L, L + QK_K, 0);
    } else {
      const float iscale = -128.f / max_scale;
      const uint16_t dh = qfit::fp16_sat(1.f / iscale);
      y[b].d = dh;
      const float d = fp16_to_fp32(dh);
      for (int g = 0; g < 16; ++g) {
        y[b].scales[g] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scale[g])));
        const float dg = d * y[b].scales[g];
        for (int l = 0; l < 16; ++l)
          L[16 * g + l] = dg != 0 ? static_cast<int8_t>(std::clamp(nearest_int(x[16 * g + l] / dg), -32, 31)) : 0;
      }
    }
    for (int h = 0; h < 2; ++h) {
      const int8_t* Lh = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int q1 = Lh[l] + 32, q2 = Lh[l + 32] + 32, q3 = Lh[l + 64] + 32, q4 = Lh[l + 96] + 32;
        y[b].ql[64 * h + l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
        y[b].ql[64 * h + l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
        y[b].qh[32 * h + l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

// Q2_K: 16 sub-blocks of 16, x ~ d * sc * q - dmin * m with q in [0, 3] and 4-bit sc, m.
void quantize_q2_k(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ2_K*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    float sc[16], mn[16], w[QK_K];
    uint8_t L[QK_K], Lt[16];
    for (int j = 0; j < 16; ++j) {
      qfit::rms_plus_abs_weights(x + 16 * j, 16, w + 16 * j);
      sc[j] = qfit::fit_scale_min(x + 16 * j, w + 16 * j, 16, 3, /*min_le_zero=*/true, L + 16 * j, &mn[j]);
    }
    y[b].d = qfit::fp16_sat(*std::max_element(sc, sc + 16) / 15.f);
    y[b].dmin = qfit::fp16_sat(*std::max_element(mn, mn + 16) / 15.f);
    const float d = fp16_to_fp32(y[b].d), dmin = fp16_to_fp32(y[b].dmin);
    for (int j = 0; j < 16; ++j) {
      const int ls0 = d > 0 ? std::clamp(nearest_int(sc[j] / d), 0, 15) : 0;
      const int lm0 = dmin > 0 ? std::clamp(nearest_int(mn[j] / dmin), 0, 15) : 0;
      float best = INFINITY;
      for (int ls = std::max(ls0 - 1, 0); ls <= std::min(ls0 + 1, 15); ++ls)
        for (int lm = std::max(lm0 - 1, 0); lm <= std::min(lm0 + 1, 15); ++lm) {
          const float err = round_scale_min(x + 16 * j, w + 16 * j, 16, d * ls, dmin * lm, 3, Lt);
          if (err < best) {
            best = err;
            y[b].scales[j] = static_cast<uint8_t>(ls | (lm << 4));
            std::memcpy(L + 16 * j, Lt, 16);
          }
        }
    }
    pack_2bit(L, y[b].qs);
  }
}

// Q3_K: 16 sub-blocks of 16, x ~ d * sc * q with q in [-4, 3] and a 6-bit signed sc in [-32, 31].
// Stored: q + 4, its low 2 bits in qs, its bit 2 in hmask (bit k of hmask[l] for value 32k + l).
void quantize_q3_k(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ3_K*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    float sc[16], w[QK_K];
    int8_t Ls[QK_K];
    for (int j = 0; j < 16; ++j) {
      qfit::rms_plus_abs_weights(x + 16 * j, 16, w + 16 * j);
      sc[j] = qfit::fit_symmetric(x + 16 * j, w + 16 * j, 16, 4, Ls + 16 * j);
    }
    std::memset(&y[b], 0, sizeof(BlockQ3_K));
    y[b].d = qfit::fp16_sat(qfit::signed_absmax(sc, 16) / -32.f);
    const float d = fp16_to_fp32(y[b].d);
    int ls_best[16] = {};
    if (d == 0) {
      std::fill(Ls, Ls + QK_K, 0);
    } else {
      for (int j = 0; j < 16; ++j)
        ls_best[j] = best_signed_scale(sc[j], d, 16, Ls + 16 * j, [&](float dl, int8_t* Lt) {
          return round_symmetric(x + 16 * j, w + 16 * j, 16, dl, 4, Lt);
        });
    }
    for (int j = 0; j < 16; ++j) {  // 6-bit scales: low nibbles in bytes 0-7, top 2 bits in bytes 8-11
      const int l = ls_best[j] + 32;
      y[b].scales[j % 8] |= static_cast<uint8_t>((l & 0xF) << (j < 8 ? 0 : 4));
      y[b].scales[8 + j % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
    }
    uint8_t L[QK_K];
    for (int i = 0; i < QK_K; ++i) {
      L[i] = static_cast<uint8_t>(Ls[i] + 4);
      y[b].hmask[i % 32] |= static_cast<uint8_t>((L[i] >> 2) << (i / 32));
    }
    pack_2bit(L, y[b].qs);
  }
}

// IQ4_XS: 8 sub-blocks of 32, x ~ d * (ls - 32) * kvalues_iq4nl[q], ls a 6-bit number.
void quantize_iq4_xs(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    float sc[8], w[QK_K];
    uint8_t L[QK_K];
    for (int ib = 0; ib < 8; ++ib) {
      qfit::rms_plus_abs_weights(x + 32 * ib, 32, w + 32 * ib);
      sc[ib] = qfit::fit_grid16(x + 32 * ib, w + 32 * ib, 32, iq::kIq4nlValues, L + 32 * ib);
    }
    std::memset(&y[b], 0, sizeof(BlockIQ4_XS));
    y[b].d = qfit::fp16_sat(qfit::signed_absmax(sc, 8) / -32.f);
    const float d = fp16_to_fp32(y[b].d);
    for (int ib = 0; ib < 8; ++ib) {
      int l_best = 0;
      if (d != 0)
        l_best = best_signed_scale(sc[ib], d, 32, L + 32 * ib, [&](float dl, uint8_t* Lt) {
          return round_grid(x + 32 * ib, w + 32 * ib, 32, dl, Lt);
        });
      else
        round_grid(x + 32 * ib, w + 32 * ib, 32, 0.f, L + 32 * ib);
      const int ls = l_best + 32;
      y[b].scales_l[ib / 2] |= static_cast<uint8_t>((ls & 0xF) << (4 * (ib % 2)));
      y[b].scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * ib));
      for (int j = 0; j < 16; ++j)
        y[b].qs[16 * ib + j] = static_cast<uint8_t>(L[32 * ib + j] | (L[32 * ib + 16 + j] << 4));
    }
  }
}

}  // namespace strata::qimpl
