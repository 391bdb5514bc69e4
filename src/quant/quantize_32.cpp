// Quantizers of the 32-value block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL. Every block's scale
// (and offset) is rounded to fp16 first and the values are then rounded against the stored numbers, so
// the blocks are self-consistent.
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

// Value j of a block is in qs[j]'s low nibble, value j + 16 in its high nibble; Q5's fifth bits in qh
// (bit j for value j, a little-endian u32).
void pack_nibbles(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < QK / 2; ++j) qs[j] = static_cast<uint8_t>((L[j] & 0xF) | ((L[j + QK / 2] & 0xF) << 4));
}
void pack_fifth_bits(const uint8_t* L, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < QK; ++j) h |= static_cast<uint32_t>((L[j] >> 4) & 1) << j;
  std::memcpy(qh, &h, 4);
}

// Q4_1 / Q5_1: x ~ d * q + m, q in [0, 2^NBITS - 1], any sign of m.
template <int NBITS, class Block>
void quantize_offset_block(const float* x, Block& y) {
  constexpr int nmax = (1 << NBITS) - 1;
  float w[QK], neg_min;
  uint8_t L[QK];
  qfit::rms_plus_abs_weights(x, QK, w);
  const float scale = qfit::fit_scale_min(x, w, QK, nmax, /*min_le_zero=*/false, L, &neg_min);
  y.d = qfit::fp16_sat(scale);
  y.m = qfit::fp16_sat(-neg_min);
  const float d = fp16_to_fp32(y.d), m = fp16_to_fp32(y.m);
  for (int j = 0; j < QK; ++j) L[j] = d > 0 ? static_cast<uint8_t>(std::clamp(nearest_int((x[j] - m) / d), 0, nmax)) : 0;
  pack_nibbles(L, y.qs);
  if constexpr (NBITS == 5) pack_fifth_bits(L, y.qh);
}

}  // namespace

void quantize_q8_0(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / QK; ++b, x += QK) {
    float amax = 0;
    for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f, id = d > 0 ? 1.f / d : 0.f;
    y[b].d = qfit::fp16_sat(d);
    for (int j = 0; j < QK; ++j) y[b].qs[j] = static_cast<int8_t>(std::clamp(nearest_int(x[j] * id), -127, 127));
  }
}

// Q4_0: blocks of 32, x ~ d * (q - 8) with q in [0, 15]; d = -m / 8 where m is the value of largest
// magnitude (so m itself maps to code 0 exactly, and the other side keeps 7 steps, ggml's choice).
void quantize_q4_0(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ4_0*>(dst);
  for (int64_t b = 0; b < n / QK; ++b, x += QK) {
    const float m = qfit::signed_absmax(x, QK);
    const float d = m / -8.f, id = d != 0 ? 1.f / d : 0.f;
    y[b].d = qfit::fp16_sat(d);
    uint8_t L[QK];
    for (int j = 0; j < QK; ++j) L[j] = static_cast<uint8_t>(std::clamp(nearest_int(x[j] * id) + 8, 0, 15));
    pack_nibbles(L, y[b].qs);
  }
}

void quantize_q4_1(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ4_1*>(dst);
  for (int64_t b = 0; b < n / QK; ++b, x += QK) quantize_offset_block<4>(x, y[b]);
}

void quantize_q5_1(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ5_1*>(dst);
  for (int64_t b = 0; b < n / QK; ++b, x += QK) quantize_offset_block<5>(x, y[b]);
}

// Q5_0: x ~ d * (q - 16), q in [0, 31]: the symmetric fit's step, the values re-rounded against fp16(d).
void quantize_q5_0(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ5_0*>(dst);
  for (int64_t b = 0; b < n / QK; ++b, x += QK) {
    float w[QK];
    int8_t Ls[QK];
    uint8_t L[QK];
    qfit::rms_plus_abs_weights(x, QK, w);
    y[b].d = qfit::fp16_sat(qfit::fit_symmetric(x, w, QK, 16, Ls));
    const float d = fp16_to_fp32(y[b].d);
    for (int j = 0; j < QK; ++j) L[j] = static_cast<uint8_t>(d != 0 ? std::clamp(nearest_int(x[j] / d), -16, 15) + 16 : 16);
    pack_nibbles(L, y[b].qs);
    pack_fifth_bits(L, y[b].qh);
  }
}

// IQ4_NL: x ~ d * kvalues_iq4nl[q] (a non-uniform 16-value grid).
void quantize_iq4_nl(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t b = 0; b < n / QK; ++b, x += QK) {
    float w[QK];
    uint8_t L[QK];
    qfit::rms_plus_abs_weights(x, QK, w);
    y[b].d = qfit::fp16_sat(qfit::fit_grid16(x, w, QK, iq::kIq4nlValues, L));
    const float d = fp16_to_fp32(y[b].d);
    if (d != 0)
      for (int j = 0; j < QK; ++j) L[j] = static_cast<uint8_t>(qfit::nearest_grid16(iq::kIq4nlValues, x[j] / d));
    pack_nibbles(L, y[b].qs);
  }
}

}  // namespace strata::qimpl
