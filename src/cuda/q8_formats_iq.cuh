#pragma once
// The IQ formats' tasks for the int8-activation kernels: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
// (the contract of a format struct: q8_formats.cuh). A task is one 32-value sub-block ib (kTasks 8 per
// 256-value block), whose four 8-value groups l are lattice points: grid bytes (IQ2 / IQ3 magnitudes, IQ1
// -1 / 0 / +1) with separate signs, dotted with dp4a against the int8 activations; the sub-block scales are
// small odd integers (2s + 1), so the integer sums carry them and one float expression per task applies d,
// the activation scale and the format's constant factor. CPU twin, same integer sums and float expression:
// host/q8_reference_low.cpp. Grids and sign table: dq::iq*_grid / dq::iq2_signs (the device copies on the
// GPU). Blocks are 2-byte aligned (IQ1_M: 8), so rows are staged like Q4_0's where they fit.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/dequant_device.cuh"
#include "cuda/q8_task_io.cuh"

namespace strata::cuda::q8d {

// Four magnitude bytes g (each <= 127) with byte j negated where bit j of s4 is set, as signed bytes.
__host__ __device__ __forceinline__ int signed4(uint32_t g, uint32_t s4) {
  const uint32_t m = (((s4 & 15u) * 0x00204081u) & 0x01010101u) * 0xFFu;  // bit j -> byte j all ones
#ifdef __CUDA_ARCH__
  return int(__vsub4(g ^ m, m));
#else
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k)
    r |= uint32_t(uint8_t(((g ^ m) >> (8 * k)) - ((m >> (8 * k)) & 0xFF))) << (8 * k);
  return int(r);
#endif
}

// Byte i of the words w (w[i / 4] >> 8 (i % 4)).
template <int N>
__host__ __device__ __forceinline__ uint32_t wbyte(const uint32_t (&w)[N], int i) {
  return (w[i >> 2] >> (8 * (i & 3))) & 0xFF;
}

// IQ2_XXS: d f16 | per sub-block ib 8 bytes at 2 + 8ib: 4 grid indices (iq2xxs_grid), then a word of four
// 7-bit sign indices (iq2_signs) and the 4-bit scale s at bits 28-31. Value = d (0.5 + s) / 4 * grid * sign:
// d / 8 * dx * (2s + 1) * isum.
struct DIQ2XXS {
  static constexpr int kVals = 256, kBytes = 66, kTasks = 8;
  static constexpr bool kLowBit = true;  // (q8d::kLowBit)
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int tt, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    uint32_t w[2];
    ldw<A, 2>(blk + 2 + 8 * tt, w);
    int v[8];
STRATA_FD_UNROLL
    for (int l = 0; l < 4; ++l) {
      const uint64_t g = dq::iq2xxs_grid(wbyte(w, l));
      const uint32_t s = dq::iq2_signs((w[1] >> (7 * l)) & 127);
      v[2 * l] = signed4(uint32_t(g), s), v[2 * l + 1] = signed4(uint32_t(g >> 32), s >> 4);
    }
    const int sc = 2 * int(w[1] >> 28) + 1;
    const float d = dq::h2f(dq::ld16<2>(blk));
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int x[8];
      ldx32(xq + t * xs + 32 * tt, x);
      acc[t] += d * 0.125f * (xds[t * dss + tt].x * float(sc * dot32(v, x)));
    }
  }
};

// IQ2_XS: d f16 | qs u16[32] at 2 (per group: a 9-bit index into iq2xs_grid, a 7-bit sign index) | scales[8]
// at 66 (sub-block ib: groups 0-1 the low nibble, 2-3 the high one). d / 8 * dx * sum (2s + 1) * isum.
// IQ2_S: d f16 | qs[32] at 2 (index low bits) | signs[32] at 34 (8 sign bits a group) | qh[8] at 66 (2 index
// high bits a group) | scales[8] at 74, iq2s_grid; the same expression.
template <bool kS>
struct DIQ2XSS {
  static constexpr int kVals = 256, kBytes = kS ? 82 : 74, kTasks = 8;
  static constexpr bool kLowBit = true;  // (q8d::kLowBit)
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int tt, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    uint32_t sw[2];
    ldw<A, 2>(blk + (kS ? 74 : 66), sw);
    const uint32_t scb = wbyte(sw, tt);
    int v[8];
    if constexpr (kS) {
      uint32_t q[1], sg[1], hw[2];
      ldw<A, 1>(blk + 2 + 4 * tt, q);
      ldw<A, 1>(blk + 34 + 4 * tt, sg);
      ldw<A, 2>(blk + 66, hw);
      const uint32_t qh = wbyte(hw, tt);
STRATA_FD_UNROLL
      for (int l = 0; l < 4; ++l) {
        const uint64_t g = dq::iq2s_grid(((q[0] >> (8 * l)) & 0xFF) | ((qh << (8 - 2 * l)) & 0x300));
        const uint32_t s = (sg[0] >> (8 * l)) & 0xFF;
        v[2 * l] = signed4(uint32_t(g), s), v[2 * l + 1] = signed4(uint32_t(g >> 32), s >> 4);
      }
    } else {
      uint32_t q[2];
      ldw<A, 2>(blk + 2 + 8 * tt, q);
STRATA_FD_UNROLL
      for (int l = 0; l < 4; ++l) {
        const uint32_t e = (q[l >> 1] >> (16 * (l & 1))) & 0xFFFF;
        const uint64_t g = dq::iq2xs_grid(e & 511);
        const uint32_t s = dq::iq2_signs(e >> 9);
        v[2 * l] = signed4(uint32_t(g), s), v[2 * l + 1] = signed4(uint32_t(g >> 32), s >> 4);
      }
    }
    const int slo = 2 * int(scb & 15) + 1, shi = 2 * int(scb >> 4) + 1;
    const float d = dq::h2f(dq::ld16<2>(blk));
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int x[8];
      ldx32(xq + t * xs + 32 * tt, x);
      int lo, hi;
      dot_halves(v, x, lo, hi);
      acc[t] += d * 0.125f * (xds[t * dss + tt].x * float(slo * lo + shi * hi));
    }
  }
};
using DIQ2XS = DIQ2XSS<false>;
using DIQ2S = DIQ2XSS<true>;

// IQ3_XXS: d f16 | qs[64] at 2 (sub-block ib: 8 indices into iq3xxs_grid, two 4-value points a group) | a
// word a sub-block at 66 + 4ib (four 7-bit sign indices, the scale at bits 28-31). d / 4 * dx * (2s + 1) *
// isum. IQ3_S: d f16 | qs[64] at 2 | qh[8] at 66 (bit 2l / 2l + 1: the points' ninth index bit) | signs[32]
// at 74 | scales[4] at 106 (a nibble a sub-block), iq3s_grid; d * dx * (2s + 1) * isum.
template <bool kS>
struct DIQ3 {
  static constexpr int kVals = 256, kBytes = kS ? 110 : 98, kTasks = 8;
  static constexpr bool kLowBit = true;  // (q8d::kLowBit)
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int tt, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    uint32_t q[2];
    ldw<A, 2>(blk + 2 + 8 * tt, q);
    int v[8], sc;
    if constexpr (kS) {
      uint32_t hw[2], sg[1], scw[1];
      ldw<A, 2>(blk + 66, hw);
      ldw<A, 1>(blk + 74 + 4 * tt, sg);
      ldw<A, 1>(blk + 106, scw);
      const uint32_t qh = wbyte(hw, tt);
STRATA_FD_UNROLL
      for (int l = 0; l < 4; ++l) {
        const uint32_t g1 = dq::iq3s_grid(wbyte(q, 2 * l) | ((qh << (8 - 2 * l)) & 256));
        const uint32_t g2 = dq::iq3s_grid(wbyte(q, 2 * l + 1) | ((qh << (7 - 2 * l)) & 256));
        const uint32_t s = (sg[0] >> (8 * l)) & 0xFF;
        v[2 * l] = signed4(g1, s), v[2 * l + 1] = signed4(g2, s >> 4);
      }
      sc = 2 * int((scw[0] >> (4 * tt)) & 15) + 1;
    } else {
      uint32_t aux[1];
      ldw<A, 1>(blk + 66 + 4 * tt, aux);
STRATA_FD_UNROLL
      for (int l = 0; l < 4; ++l) {
        const uint32_t s = dq::iq2_signs((aux[0] >> (7 * l)) & 127);
        v[2 * l] = signed4(dq::iq3xxs_grid(wbyte(q, 2 * l)), s);
        v[2 * l + 1] = signed4(dq::iq3xxs_grid(wbyte(q, 2 * l + 1)), s >> 4);
      }
      sc = 2 * int(aux[0] >> 28) + 1;
    }
    const float d = dq::h2f(dq::ld16<2>(blk)) * (kS ? 1.f : 0.25f);
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int x[8];
      ldx32(xq + t * xs + 32 * tt, x);
      acc[t] += d * (xds[t * dss + tt].x * float(sc * dot32(v, x)));
    }
  }
};
using DIQ3XXS = DIQ3<false>;
using DIQ3S = DIQ3<true>;

// IQ1_S: d f16 | qs[32] at 2 (index low bytes) | qh u16[8] at 34 (sub-block: 3 index high bits a group, the
// 3-bit scale s at bits 12-14, the delta's sign at bit 15). IQ1_M: qs[32] at 0 | qh[16] at 32 (a byte per
// two groups: 3 index high bits and the delta's sign each) | scales u16[4] at 48 (3-bit scales per 16
// values; d's f16 bits in the top nibbles). Value = d (2s + 1) (grid + delta), delta = +-1/8, grid bytes -1 /
// 0 / +1: d * dx * (sum (2s + 1) isum + 1/8 sum (2s + 1) (+-xsum)), the sums per 8-value group.
template <bool kM>
struct DIQ1 {
  static constexpr int kVals = 256, kBytes = kM ? 56 : 50, kTasks = 8;
  static constexpr bool kLowBit = true;  // (q8d::kLowBit)
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int tt, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    uint32_t q[1];
    ldw<A, 1>(blk + (kM ? 0 : 2) + 4 * tt, q);
    int v[8], sc[4], neg[4];
    float d;
    if constexpr (kM) {
      uint32_t hw[1], sw[2];
      ldw<A, 1>(blk + 32 + 4 * (tt >> 1), hw);
      ldw<A, 2>(blk + 48, sw);
      const uint32_t h2 = (hw[0] >> (16 * (tt & 1))) & 0xFFFF;  // qh bytes 2tt, 2tt + 1
      const uint32_t s16 = (sw[tt >> 2] >> (16 * ((tt >> 1) & 1))) & 0xFFFF;
STRATA_FD_UNROLL
      for (int l = 0; l < 4; ++l) {
        const uint32_t qh = (h2 >> (8 * (l >> 1))) & 0xFF;
        const uint32_t idx = ((q[0] >> (8 * l)) & 0xFF) | (((l & 1) ? (qh << 4) : (qh << 8)) & 0x700);
        const uint64_t g = dq::iq1s_grid(idx);
        v[2 * l] = int(uint32_t(g)), v[2 * l + 1] = int(uint32_t(g >> 32));
        sc[l] = 2 * int((s16 >> (6 * (tt & 1) + 3 * (l >> 1))) & 7) + 1;
        neg[l] = (qh & ((l & 1) ? 0x80u : 0x08u)) != 0;
      }
      const uint32_t s0 = sw[0] & 0xFFFF, s1 = sw[0] >> 16, s2 = sw[1] & 0xFFFF, s3 = sw[1] >> 16;
      d = dq::h2f((s0 >> 12) | ((s1 >> 8) & 0x00f0) | ((s2 >> 4) & 0x0f00) | (s3 & 0xf000));
    } else {
      uint32_t hw[1];
      ldw<A, 1>(blk + 34 + 4 * (tt >> 1), hw);
      const uint32_t qh = (hw[0] >> (16 * (tt & 1))) & 0xFFFF;
STRATA_FD_UNROLL
      for (int l = 0; l < 4; ++l) {
        const uint64_t g = dq::iq1s_grid(((q[0] >> (8 * l)) & 0xFF) | (((qh >> (3 * l)) & 7) << 8));
        v[2 * l] = int(uint32_t(g)), v[2 * l + 1] = int(uint32_t(g >> 32));
        sc[l] = 2 * int((qh >> 12) & 7) + 1;
        neg[l] = (qh & 0x8000u) != 0;
      }
      d = dq::h2f(dq::ld16<2>(blk));
    }
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int x[8];
      ldx32(xq + t * xs + 32 * tt, x);
      int a = 0, b = 0;
STRATA_FD_UNROLL
      for (int l = 0; l < 4; ++l) {
        const int is = dp4a(v[2 * l], x[2 * l], dp4a(v[2 * l + 1], x[2 * l + 1], 0));
        const int xs8 = xsum<2>(x + 2 * l);
        a += sc[l] * is;
        b += sc[l] * (neg[l] ? -xs8 : xs8);
      }
      acc[t] += d * (xds[t * dss + tt].x * (float(a) + 0.125f * float(b)));
    }
  }
};
using DIQ1S = DIQ1<false>;
using DIQ1M = DIQ1<true>;

}  // namespace strata::cuda::q8d
