#include "quant/iq_gemm_decode.h"

#include <array>
#include <cstring>

#include "quant/blocks.h"
#include "quant/iq_tables.h"

namespace strata::q {
namespace {

// Byte j of kNeg[s] is 0xFF where bit j of s is set (that value is negative).
constexpr std::array<uint64_t, 256> make_neg() {
  std::array<uint64_t, 256> t{};
  for (int s = 0; s < 256; ++s)
    for (int j = 0; j < 8; ++j)
      if (s >> j & 1) t[s] |= uint64_t(0xFF) << (8 * j);
  return t;
}
constexpr std::array<uint64_t, 256> kNeg = make_neg();

// 8 magnitudes g (bytes) with signs s (bit j for byte j) -> 8 bytes value + 64. The grids' magnitudes are
// 1..62, so every byte of 64 - g and 64 + g is in 2..126: no borrow or carry crosses into the next byte.
inline uint64_t signed_plus64(uint64_t g, uint8_t s) {
  constexpr uint64_t k64 = 0x4040404040404040ull;
  const uint64_t m = kNeg[s];
  return (m & (k64 - g)) | (~m & (k64 + g));
}

inline void put8(uint8_t* u, uint64_t v) { std::memcpy(u, &v, 8); }

void iq2_xxs(const BlockIQ2_XXS& b, IqBlockInts& o) {
  o.d = fp16_to_fp32(b.d) * 0.125f;
  for (int ib = 0; ib < 8; ++ib) {
    uint32_t aux[2];
    std::memcpy(aux, b.qs + 4 * ib, 8);
    const auto* idx = reinterpret_cast<const uint8_t*>(aux);
    o.sc[2 * ib] = o.sc[2 * ib + 1] = 2 * int32_t(aux[1] >> 28) + 1;
    for (int l = 0; l < 4; ++l)
      put8(o.u + 32 * ib + 8 * l, signed_plus64(iq::kIq2xxsGrid[idx[l]], iq::kIq2Signs[(aux[1] >> 7 * l) & 127]));
  }
}

void iq2_xs(const BlockIQ2_XS& b, IqBlockInts& o) {
  o.d = fp16_to_fp32(b.d) * 0.125f;
  for (int ib = 0; ib < 8; ++ib) {
    o.sc[2 * ib] = 2 * (b.scales[ib] & 0xF) + 1;
    o.sc[2 * ib + 1] = 2 * (b.scales[ib] >> 4) + 1;
    for (int l = 0; l < 4; ++l) {
      const uint16_t q = b.qs[4 * ib + l];
      put8(o.u + 32 * ib + 8 * l, signed_plus64(iq::kIq2xsGrid[q & 511], iq::kIq2Signs[q >> 9]));
    }
  }
}

void iq2_s(const BlockIQ2_S& b, IqBlockInts& o) {
  o.d = fp16_to_fp32(b.d) * 0.125f;
  const uint8_t* qs = b.qs;
  const uint8_t* signs = b.qs + QK_K / 8;
  for (int ib = 0; ib < 8; ++ib, qs += 4, signs += 4) {
    o.sc[2 * ib] = 2 * (b.scales[ib] & 0xF) + 1;
    o.sc[2 * ib + 1] = 2 * (b.scales[ib] >> 4) + 1;
    for (int l = 0; l < 4; ++l)
      put8(o.u + 32 * ib + 8 * l, signed_plus64(iq::kIq2sGrid[qs[l] | ((b.qh[ib] << (8 - 2 * l)) & 0x300)], signs[l]));
  }
}

void iq3_xxs(const BlockIQ3_XXS& b, IqBlockInts& o) {
  o.d = fp16_to_fp32(b.d) * 0.25f;
  const uint8_t* qs = b.qs;
  const uint8_t* scales_and_signs = b.qs + QK_K / 4;
  for (int ib = 0; ib < 8; ++ib, qs += 8) {
    uint32_t aux;
    std::memcpy(&aux, scales_and_signs + 4 * ib, 4);
    o.sc[2 * ib] = o.sc[2 * ib + 1] = 2 * int32_t(aux >> 28) + 1;
    for (int l = 0; l < 4; ++l) {
      const uint64_t g = iq::kIq3xxsGrid[qs[2 * l]] | (uint64_t(iq::kIq3xxsGrid[qs[2 * l + 1]]) << 32);
      put8(o.u + 32 * ib + 8 * l, signed_plus64(g, iq::kIq2Signs[(aux >> 7 * l) & 127]));
    }
  }
}

void iq3_s(const BlockIQ3_S& b, IqBlockInts& o) {
  o.d = fp16_to_fp32(b.d);
  const uint8_t* qs = b.qs;
  const uint8_t* signs = b.signs;
  for (int ib = 0; ib < 8; ++ib, qs += 8, signs += 4) {
    const uint8_t sc = b.scales[ib / 2];
    o.sc[2 * ib] = o.sc[2 * ib + 1] = 1 + 2 * ((ib & 1) ? (sc >> 4) : (sc & 0xF));
    const uint8_t qh = b.qh[ib];
    for (int l = 0; l < 4; ++l) {
      const uint64_t g = iq::kIq3sGrid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)] |
                         (uint64_t(iq::kIq3sGrid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)]) << 32);
      put8(o.u + 32 * ib + 8 * l, signed_plus64(g, signs[l]));
    }
  }
}

// IQ1: 8 grid values g (int8 -1, 0, 1) plus a shared delta of +-1/8: (g + delta) * 8 = 8 g +- 1, so the
// bytes are 64 + 8 g + s (55..73) and the block's d carries the 1/8. Byte-wise without carries: g ^ 0x80
// is 0x7F..0x81, minus 0x7F gives h = g + 1 (0..2), and 8 h + 56 + s is at most 73.
inline void iq1_8(uint8_t* u, uint64_t grid, int s) {
  const uint64_t h = (grid ^ 0x8080808080808080ull) - 0x7F7F7F7F7F7F7F7Full;
  put8(u, (h << 3) + (s > 0 ? 0x3939393939393939ull : 0x3737373737373737ull));
}

void iq1_s(const BlockIQ1_S& b, IqBlockInts& o) {
  o.d = fp16_to_fp32(b.d) * 0.125f;
  for (int ib = 0; ib < 8; ++ib) {
    const uint16_t qh = b.qh[ib];
    o.sc[2 * ib] = o.sc[2 * ib + 1] = 2 * ((qh >> 12) & 7) + 1;
    const int s = (qh & 0x8000) ? -1 : 1;
    for (int l = 0; l < 4; ++l) iq1_8(o.u + 32 * ib + 8 * l, iq::kIq1sGrid[b.qs[4 * ib + l] | (((qh >> 3 * l) & 7) << 8)], s);
  }
}

void iq1_m(const BlockIQ1_M& b, IqBlockInts& o) {
  uint16_t sc[4];
  std::memcpy(sc, b.scales, 8);
  o.d = iq1m_scale(b) * 0.125f;
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* qs = b.qs + 4 * ib;
    const uint8_t* qh = b.qh + 2 * ib;
    o.sc[2 * ib] = 2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1;
    o.sc[2 * ib + 1] = 2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1;
    const int idx[4] = {qs[0] | ((qh[0] << 8) & 0x700), qs[1] | ((qh[0] << 4) & 0x700), qs[2] | ((qh[1] << 8) & 0x700),
                        qs[3] | ((qh[1] << 4) & 0x700)};
    const int s[4] = {qh[0] & 0x08 ? -1 : 1, qh[0] & 0x80 ? -1 : 1, qh[1] & 0x08 ? -1 : 1, qh[1] & 0x80 ? -1 : 1};
    for (int l = 0; l < 4; ++l) iq1_8(o.u + 32 * ib + 8 * l, iq::kIq1sGrid[idx[l]], s[l]);
  }
}

}  // namespace

bool iq_gemm_type(GgmlType t) {
  return t == GgmlType::IQ2_XXS || t == GgmlType::IQ2_XS || t == GgmlType::IQ2_S || t == GgmlType::IQ3_XXS ||
         t == GgmlType::IQ3_S || t == GgmlType::IQ1_S || t == GgmlType::IQ1_M;
}

void iq_decode_ints(GgmlType t, const uint8_t* blk, IqBlockInts& out) {
  switch (t) {
    case GgmlType::IQ2_XXS: return iq2_xxs(*reinterpret_cast<const BlockIQ2_XXS*>(blk), out);
    case GgmlType::IQ2_XS: return iq2_xs(*reinterpret_cast<const BlockIQ2_XS*>(blk), out);
    case GgmlType::IQ2_S: return iq2_s(*reinterpret_cast<const BlockIQ2_S*>(blk), out);
    case GgmlType::IQ3_XXS: return iq3_xxs(*reinterpret_cast<const BlockIQ3_XXS*>(blk), out);
    case GgmlType::IQ3_S: return iq3_s(*reinterpret_cast<const BlockIQ3_S*>(blk), out);
    case GgmlType::IQ1_S: return iq1_s(*reinterpret_cast<const BlockIQ1_S*>(blk), out);
    case GgmlType::IQ1_M: return iq1_m(*reinterpret_cast<const BlockIQ1_M*>(blk), out);
    default: break;
  }
}

}  // namespace strata::q
