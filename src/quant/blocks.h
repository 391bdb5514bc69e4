#pragma once
// Byte layouts of the ggml quantized blocks (GGUF tensor data) and the half-precision helpers they use.
// The layouts are the GGUF file format (public facts); every struct is checked against the type
// table (quant/types.h) at compile time in dequant.cpp. All multi-byte fields are little-endian,
// which is what x86-64 reads natively. The helpers are `static` (internal linkage) on purpose: this header
// is also compiled into the AVX2/AVX-512 files, and an ISA-flagged copy of an inline function must never
// be the one the linker keeps for the baseline code.
#include <cstdint>
#include <cstring>

namespace strata::q {

inline constexpr int QK = 32;    // values per block of the "32" formats (Q4_0 .. Q8_0, IQ4_NL)
inline constexpr int QK_K = 256; // values per super-block of the K-quants and most IQ formats

// IEEE half -> float, exact (subnormals, inf, nan included).
static inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do { man <<= 1; ++e; } while (!(man & 0x400));
    bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// float -> IEEE half, round to nearest even (as F16C / ggml do).
static inline uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t ax = x & 0x7fffffff;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {                                     // result is subnormal or zero
    if (ax < 0x33000000u) return (uint16_t)sign;              // < 2^-25: rounds to 0
    const uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // >= 14 since e <= 112
    // value = m * 2^(e-150); half subnormal unit = 2^-24 -> q = m * 2^(e-126)
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    uint32_t r = q + (rem > half || (rem == half && (q & 1)));
    return (uint16_t)(sign | r);
  }
  uint32_t r = ax - 0x38000000u;  // rebias exponent 127 -> 15 (in the top bits after >> 13)
  const uint32_t rem = r & 0x1fff;
  r >>= 13;
  r += (rem > 0x1000 || (rem == 0x1000 && (r & 1)));
  return (uint16_t)(sign | r);
}

// Round to nearest, ties to even, for |v| < 2^22 (all quantizer inputs are far smaller): adding 1.5 * 2^23
// makes the FPU round to an integer in the mantissa. A plain add, where nearbyintf is a libm call on
// baseline x86-64 (no SSE4.1 roundss).
static inline int nearest_int(float v) {
  float f = v + 12582912.f;
  int32_t i;
  std::memcpy(&i, &f, 4);
  return (i & 0x007fffff) - 0x00400000;
}

static inline float bf16_to_fp32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

#pragma pack(push, 1)
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
struct BlockIQ4_NL { uint16_t d; uint8_t qs[16]; };

struct BlockQ2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
struct BlockQ8_K { float d; int8_t qs[256]; int16_t bsums[16]; };

struct BlockIQ2_XXS { uint16_t d; uint16_t qs[32]; };
struct BlockIQ2_XS { uint16_t d; uint16_t qs[32]; uint8_t scales[8]; };
struct BlockIQ2_S { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t scales[8]; };
struct BlockIQ3_XXS { uint16_t d; uint8_t qs[96]; };
struct BlockIQ3_S { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4]; };
struct BlockIQ1_S { uint16_t d; uint8_t qs[32]; uint16_t qh[8]; };
struct BlockIQ1_M { uint8_t qs[32]; uint8_t qh[16]; uint8_t scales[8]; };
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };
#pragma pack(pop)

// K-quant 6-bit scale/min pair j (0..7) from the 12 packed bytes of Q4_K / Q5_K.
static inline void k4_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q3_K's 16 6-bit scales (biased by 32) unpacked from 12 bytes.
static inline void q3k_scales(const uint8_t* packed, int8_t out[16]) {
  uint32_t a[4];
  std::memcpy(a, packed, 12);
  const uint32_t m1 = 0x03030303, m2 = 0x0f0f0f0f, t = a[2];
  a[2] = ((a[0] >> 4) & m2) | (((t >> 4) & m1) << 4);
  a[3] = ((a[1] >> 4) & m2) | (((t >> 6) & m1) << 4);
  a[0] = (a[0] & m2) | (((t >> 0) & m1) << 4);
  a[1] = (a[1] & m2) | (((t >> 2) & m1) << 4);
  std::memcpy(out, a, 16);
  for (int i = 0; i < 16; ++i) out[i] = (int8_t)(out[i] - 32);
}

// IQ1_M's fp16 super-block scale, spread over the top nibbles of its 4 scale words.
static inline float iq1m_scale(const BlockIQ1_M& b) {
  uint16_t sc[4];
  std::memcpy(sc, b.scales, 8);
  return fp16_to_fp32((uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                 (sc[3] & 0xf000)));
}

}  // namespace strata::q
