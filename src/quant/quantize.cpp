// Row quantizers. The K-quants pick each sub-block's scale (and min) by a small grid search over
// candidate step sizes, refitting the scale/min by weighted least squares for each candidate's rounding
// and keeping the best weighted error (values of larger magnitude weigh more, as they matter more in a
// dot product). Then the sub-block scales are themselves quantized (6 bits for Q4_K/Q5_K, 8 bits for
// Q6_K) and the values re-rounded against the scales actually stored, so the stored blocks are
// self-consistent.
#include "quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/vec_dot.h"

namespace strata {
namespace {
using namespace q;

inline int nearest(float v) { return nearest_int(v); }

// Fits x[i] ~= scale * L[i] - min with L in [0, nmax], min >= 0 (the K-quant "scale and min" form).
// Returns scale; *min_out receives min. Weighted by w.
float fit_scale_min(const float* x, const float* w, int n, int nmax, uint8_t* L, float* min_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  lo = std::min(lo, 0.f);  // the min is never positive: zero stays representable
  if (hi <= lo) {
    std::fill(L, L + n, 0);
    *min_out = -lo;
    return 0.f;
  }
  float sw = 0, sx = 0;
  for (int i = 0; i < n; ++i) sw += w[i], sx += w[i] * x[i];
  float best_scale = (hi - lo) / nmax, best_min = lo, best_err = INFINITY;
  uint8_t Lt[QK_K];
  // Candidate inverse steps around nmax / range; each rounding is refit by least squares.
  for (int step = -1; step <= 20; ++step) {
    const float iscale = step < 0 ? nmax / (hi - lo) : (nmax - 1.0f + 0.1f * step) / (hi - lo);
    float sl = 0, sl2 = 0, slx = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax);
      Lt[i] = static_cast<uint8_t>(l);
      sl += w[i] * l, sl2 += w[i] * l * l, slx += w[i] * l * x[i];
    }
    const float det = sw * sl2 - sl * sl;
    if (det <= 0) continue;
    float scale = (sw * slx - sx * sl) / det, mn = (sl2 * sx - sl * slx) / det;
    if (mn > 0) {  // clamp the offset to <= 0 and refit the scale alone
      mn = 0;
      scale = sl2 > 0 ? slx / sl2 : 0;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float e = scale * Lt[i] + mn - x[i];
      err += w[i] * e * e;
    }
    if (err < best_err) {
      best_err = err, best_scale = scale, best_min = mn;
      std::memcpy(L, Lt, n);
    }
  }
  if (best_err == INFINITY) {  // degenerate weights: plain min/max rounding
    for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(std::clamp(nearest((x[i] - lo) / best_scale), 0, nmax));
  }
  *min_out = -best_min;
  return best_scale;
}

// Fits x[i] ~= scale * L[i], L in [-nmax, nmax-1], maximizing the weighted fit (sum wxL)^2 / sum wL^2.
float fit_symmetric(const float* x, const float* w, int n, int nmax, int8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  if (amax < 1e-30f) {
    std::fill(L, L + n, 0);
    return 0.f;
  }
  float best_scale = 0, best_obj = -1;
  int8_t Lt[32];
  for (int step = -9; step <= 9; ++step) {
    const float iscale = -(nmax + 0.1f * step) / max;
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1);
      Lt[i] = static_cast<int8_t>(l);
      slx += w[i] * x[i] * l, sl2 += w[i] * l * l;
    }
    if (sl2 > 0 && (best_obj < 0 || slx * slx > best_obj * sl2)) {
      best_scale = slx / sl2;
      best_obj = best_scale * slx;
      std::memcpy(L, Lt, n);
    }
  }
  return best_scale;
}

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / QK; ++b, x += QK) {
    float amax = 0;
    for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f, id = d > 0 ? 1.f / d : 0.f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < QK; ++j) y[b].qs[j] = static_cast<int8_t>(std::clamp(nearest(x[j] * id), -127, 127));
  }
}

// Q4_0: blocks of 32, x ~ d * (q - 8) with q in [0, 15]; d = -m / 8 where m is the value of largest
// magnitude (so m itself maps to code 0 exactly, and the other side keeps 7 steps, ggml's choice).
// Value j of a block is in qs[j] low nibble, value j + 16 in qs[j] high nibble.
void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t n) {
  for (int64_t b = 0; b < n / QK; ++b, x += QK) {
    float m = 0;
    for (int j = 0; j < QK; ++j)
      if (std::fabs(x[j]) > std::fabs(m)) m = x[j];
    const float d = m / -8.f, id = d != 0 ? 1.f / d : 0.f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < QK / 2; ++j) {
      const int lo = std::clamp(nearest(x[j] * id) + 8, 0, 15);
      const int hi = std::clamp(nearest(x[j + QK / 2] * id) + 8, 0, 15);
      y[b].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// Q4_K (nbits 4) and Q5_K (nbits 5): 8 sub-blocks of 32 with 6-bit scale and min.
template <int NBITS>
void quantize_k4(const float* x, uint8_t* d_out, uint8_t* dmin_out, uint8_t* scales_out, uint8_t* L) {
  constexpr int nmax = (1 << NBITS) - 1;
  float scale[8], mn[8], w[32];
  for (int j = 0; j < 8; ++j) {
    const float* s = x + 32 * j;
    float s2 = 0;
    for (int l = 0; l < 32; ++l) s2 += s[l] * s[l];
    const float av = std::sqrt(s2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = av + std::fabs(s[l]);
    scale[j] = fit_scale_min(s, w, 32, nmax, L + 32 * j, &mn[j]);
  }
  const float max_scale = *std::max_element(scale, scale + 8), max_min = *std::max_element(mn, mn + 8);
  const float is = max_scale > 0 ? 63.f / max_scale : 0.f, im = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = static_cast<uint8_t>(std::clamp(nearest(is * scale[j]), 0, 63));
    lm[j] = static_cast<uint8_t>(std::clamp(nearest(im * mn[j]), 0, 63));
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
  const uint16_t dh = fp32_to_fp16(max_scale / 63.f), mh = fp32_to_fp16(max_min / 63.f);
  std::memcpy(d_out, &dh, 2);
  std::memcpy(dmin_out, &mh, 2);
  const float d = fp16_to_fp32(dh), dmin = fp16_to_fp32(mh);
  for (int j = 0; j < 8; ++j) {  // re-round against the stored scales
    const float dj = d * ls[j], mj = dmin * lm[j];
    for (int l = 0; l < 32; ++l)
      L[32 * j + l] = dj > 0 ? static_cast<uint8_t>(std::clamp(nearest((x[32 * j + l] + mj) / dj), 0, nmax)) : 0;
  }
}

void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t n) {
  uint8_t L[QK_K];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    quantize_k4<4>(x, reinterpret_cast<uint8_t*>(&y[b].d), reinterpret_cast<uint8_t*>(&y[b].dmin), y[b].scales, L);
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 32; ++l) y[b].qs[32 * p + l] = static_cast<uint8_t>(L[64 * p + l] | (L[64 * p + 32 + l] << 4));
  }
}

void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t n) {
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

void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t n) {
  int8_t L[QK_K];
  float scale[16], w[16];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    float max_scale = 0, amax_scale = 0;
    for (int g = 0; g < 16; ++g) {
      for (int l = 0; l < 16; ++l) w[l] = x[16 * g + l] * x[16 * g + l];
      scale[g] = fit_symmetric(x + 16 * g, w, 16, 32, L + 16 * g);
      if (std::fabs(scale[g]) > amax_scale) amax_scale = std::fabs(scale[g]), max_scale = scale[g];
    }
    if (amax_scale == 0) {
      std::memset(&y[b], 0, sizeof(BlockQ6_K));
      std::fill(L, L + QK_K, 0);
    } else {
      const float iscale = -128.f / max_scale;
      const uint16_t dh = fp32_to_fp16(1.f / iscale);
      y[b].d = dh;
      const float d = fp16_to_fp32(dh);
      for (int g = 0; g < 16; ++g) {
        y[b].scales[g] = static_cast<int8_t>(std::min(127, nearest(iscale * scale[g])));
        const float dg = d * y[b].scales[g];
        for (int l = 0; l < 16; ++l)
          L[16 * g + l] = dg != 0 ? static_cast<int8_t>(std::clamp(nearest(x[16 * g + l] / dg), -32, 31)) : 0;
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

void to_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}
void to_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &x[i], 4);
    y[i] = static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);  // round to nearest even (x finite)
  }
}

}  // namespace

bool can_quantize(GgmlType type) {
  switch (type) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q4_0: case GgmlType::Q8_0:
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: case GgmlType::Q8_K:
      return true;
    default:
      return false;
  }
}

void quantize_row(GgmlType type, const float* x, void* dst, int64_t n) {
  const TypeTraits* tt = type_traits(static_cast<uint32_t>(type));
  STRATA_REQUIRE(tt && can_quantize(type), "unsupported type {} for quantization",
                 tt ? std::string(tt->name) : "id " + std::to_string(static_cast<uint32_t>(type)));
  STRATA_REQUIRE(n >= 0 && n % tt->block_size == 0, "quantize {}: {} values is not a multiple of the block size {}",
                 tt->name, n, tt->block_size);
  for (int64_t i = 0; i < n; ++i)
    STRATA_REQUIRE(std::isfinite(x[i]), "quantize {}: value {} at index {} is not finite", tt->name, x[i], i);
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, x, n * 4); return;
    case GgmlType::F16: to_f16(x, static_cast<uint16_t*>(dst), n); return;
    case GgmlType::BF16: to_bf16(x, static_cast<uint16_t*>(dst), n); return;
    case GgmlType::Q4_0: quantize_q4_0(x, static_cast<BlockQ4_0*>(dst), n); return;
    case GgmlType::Q8_0: quantize_q8_0(x, static_cast<BlockQ8_0*>(dst), n); return;
    case GgmlType::Q4_K: quantize_q4_k(x, static_cast<BlockQ4_K*>(dst), n); return;
    case GgmlType::Q5_K: quantize_q5_k(x, static_cast<BlockQ5_K*>(dst), n); return;
    case GgmlType::Q6_K: quantize_q6_k(x, static_cast<BlockQ6_K*>(dst), n); return;
    case GgmlType::Q8_K: q::quantize_act_q8_k(x, static_cast<BlockQ8_K*>(dst), n); return;
    default: fail("unsupported type {} for quantization", tt->name);
  }
}

}  // namespace strata
