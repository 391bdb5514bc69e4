#pragma once
// The low-bit formats' tasks for the int8-activation kernels: Q2_K, Q3_K, IQ4_XS, IQ4_NL (the contract of a
// format struct: q8_formats.cuh). CPU twin, same integer sums and the same float expression per task:
// host/q8_reference_low.cpp (task_q2_k, task_q3_k, task_iq4_xs, task_iq4_nl).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/q8_task_io.cuh"

namespace strata::cuda::q8d {

// Q2_K: scales[16] (per 16 values: scale | min << 4) | qs[64] | d, dmin f16 (84 bytes: 4-byte aligned at
// best). Task tt (half h = tt/2, jp = 2 (tt%2)): 32-value blocks j = jp, jp + 1 of the half, whose codes are
// bits 2j of qs[32h + l], l < 32; scales 8h + 2j + l/16 (4 bytes at 4tt). Value = d*sc*q - dmin*m with the
// min per 16 values, so the activations' sums are taken per 16 values here (the block sum is per 32).
struct DQ2K {
  static constexpr int kVals = 256, kBytes = 84, kTasks = 4;
  static constexpr bool kLowBit = true;  // (q8d::kLowBit)
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int tt, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    const int h = tt >> 1, jp = 2 * (tt & 1);
    uint32_t q[8], sw[1], dd[1];
    ldw<A, 8>(blk + 16 + 32 * h, q);
    ldw<A, 1>(blk + 4 * tt, sw);
    ldw<A, 1>(blk + 80, dd);
    int c0[8], c1[8];
STRATA_FD_UNROLL
    for (int i = 0; i < 8; ++i) {
      c0[i] = int((q[i] >> (2 * jp)) & 0x03030303u);
      c1[i] = int((q[i] >> (2 * jp + 2)) & 0x03030303u);
    }
    const int sc0 = int(sw[0] & 0xF), m0 = int((sw[0] >> 4) & 0xF), sc1 = int((sw[0] >> 8) & 0xF),
              m1 = int((sw[0] >> 12) & 0xF), sc2 = int((sw[0] >> 16) & 0xF), m2 = int((sw[0] >> 20) & 0xF),
              sc3 = int((sw[0] >> 24) & 0xF), m3 = int(sw[0] >> 28);
    const float d = dq::h2f(dd[0] & 0xFFFF), dmin = dq::h2f(dd[0] >> 16);
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int x0[8], x1[8];
      ldx32(xq + t * xs + 64 * tt, x0);
      ldx32(xq + t * xs + 64 * tt + 32, x1);
      int a0, a1, b0, b1;
      dot_halves(c0, x0, a0, a1);
      dot_halves(c1, x1, b0, b1);
      const int ma = m0 * xsum<4>(x0) + m1 * xsum<4>(x0 + 4), mb = m2 * xsum<4>(x1) + m3 * xsum<4>(x1 + 4);
      const float da = xds[t * dss + 2 * tt].x, db = xds[t * dss + 2 * tt + 1].x;
      acc[t] += d * (da * float(sc0 * a0 + sc1 * a1) + db * float(sc2 * b0 + sc3 * b1)) -
                dmin * (da * float(ma) + db * float(mb));
    }
  }
};

// Q3_K: hmask[32] | qs[64] | scales[12] (16 6-bit scales) | d f16 (110 bytes: 2-byte aligned loads only).
// Task tt (h = tt/2, jp = 2 (tt%2)): blocks j = jp, jp + 1 of the half; code = bits 2j of qs[32h + l] | bit
// 4h + j of hmask[l] << 2, value code - 4 (as Q6_K, made signed byte-wise: 16-value scales, no block sum).
// Scales 4tt .. 4tt + 3: low nibbles from scales word tt%2 (nibble h), high 2 bits from word 2 (bits 2tt).
struct DQ3K {
  static constexpr int kVals = 256, kBytes = 110, kTasks = 4;
  static constexpr bool kLowBit = true;  // (q8d::kLowBit)
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int tt, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    const int h = tt >> 1, jp = 2 * (tt & 1), hb = 4 * h + jp;
    uint32_t q[8], hm[8], sw[3];
    ldw<A, 8>(blk + 32 + 32 * h, q);
    ldw<A, 8>(blk, hm);
    ldw<A, 3>(blk + 96, sw);
    int v0[8], v1[8];
STRATA_FD_UNROLL
    for (int i = 0; i < 8; ++i) {
      v0[i] = sub4(((q[i] >> (2 * jp)) & 0x03030303u) | (((hm[i] >> hb) & 0x01010101u) << 2));
      v1[i] = sub4(((q[i] >> (2 * jp + 2)) & 0x03030303u) | (((hm[i] >> (hb + 1)) & 0x01010101u) << 2));
    }
    const uint32_t sc = ((sw[tt & 1] >> (4 * h)) & 0x0F0F0F0Fu) | (((sw[2] >> (2 * tt)) & 0x03030303u) << 4);
    const int s0 = int(sc & 0xFF) - 32, s1 = int((sc >> 8) & 0xFF) - 32, s2 = int((sc >> 16) & 0xFF) - 32,
              s3 = int(sc >> 24) - 32;
    const float d = dq::h2f(dq::ld16<2>(blk + 108));
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int x0[8], x1[8];
      ldx32(xq + t * xs + 64 * tt, x0);
      ldx32(xq + t * xs + 64 * tt + 32, x1);
      int a0, a1, b0, b1;
      dot_halves(v0, x0, a0, a1);
      dot_halves(v1, x1, b0, b1);
      acc[t] += d * (xds[t * dss + 2 * tt].x * float(s0 * a0 + s1 * a1) +
                     xds[t * dss + 2 * tt + 1].x * float(s2 * b0 + s3 * b1));
    }
  }
};

// IQ4_XS: d f16 | scales_h u16 | scales_l[4] | qs[128] (136 bytes: 8-byte aligned at best). Task tt: 32-value
// blocks ib = 2tt, 2tt + 1, codes qs[16 ib + l] (value l: low nibble, l + 16: high nibble) looked up in
// kvalues_iq4nl; scale of ib: nibble ib%2 of scales_l[ib/2] | bits 2ib of scales_h << 4, minus 32.
struct DIQ4XS {
  static constexpr int kVals = 256, kBytes = 136, kTasks = 4;
  static constexpr bool kLowBit = true;  // (q8d::kLowBit)
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int tt, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    uint32_t q[8], head[2];
    ldw<A, 8>(blk + 8 + 32 * tt, q);
    ldw<A, 2>(blk, head);
    int v0[8], v1[8];  // per 32-value block: its 16 low-nibble values, then its 16 high-nibble ones
STRATA_FD_UNROLL
    for (int i = 0; i < 4; ++i) {
      v0[i] = iq4nl4(q[i] & kLo4), v0[4 + i] = iq4nl4((q[i] >> 4) & kLo4);
      v1[i] = iq4nl4(q[4 + i] & kLo4), v1[4 + i] = iq4nl4((q[4 + i] >> 4) & kLo4);
    }
    const uint32_t sh = head[0] >> 16, sl = (head[1] >> (8 * tt)) & 0xFF;
    const int ls0 = int((sl & 0xF) | (((sh >> (4 * tt)) & 3) << 4)) - 32;
    const int ls1 = int((sl >> 4) | (((sh >> (4 * tt + 2)) & 3) << 4)) - 32;
    const float d = dq::h2f(head[0] & 0xFFFF);
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int x0[8], x1[8];
      ldx32(xq + t * xs + 64 * tt, x0);
      ldx32(xq + t * xs + 64 * tt + 32, x1);
      const int a = dot32(v0, x0), b = dot32(v1, x1);
      acc[t] += d * (xds[t * dss + 2 * tt].x * float(ls0 * a) + xds[t * dss + 2 * tt + 1].x * float(ls1 * b));
    }
  }
};

// IQ4_NL: d f16 | qs[16] (18 bytes), Q4_0's layout with the codes looked up in kvalues_iq4nl.
struct DIQ4NL {
  static constexpr int kVals = 32, kBytes = 18, kTasks = 1;
  static constexpr bool kLowBit = true;  // (q8d::kLowBit)
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    uint32_t q[4];
    ldw<A, 4>(blk + 2, q);
    int v[8];  // the 16 low-nibble values, then the 16 high-nibble ones (the activations' order)
STRATA_FD_UNROLL
    for (int i = 0; i < 4; ++i) v[i] = iq4nl4(q[i] & kLo4), v[4 + i] = iq4nl4((q[i] >> 4) & kLo4);
    const float d = dq::h2f(dq::ld16<2>(blk));
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int x[8];
      ldx32(xq + t * xs, x);
      acc[t] += d * (xds[t * dss].x * float(dot32(v, x)));
    }
  }
};

}  // namespace strata::cuda::q8d
