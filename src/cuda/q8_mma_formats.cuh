#pragma once
// Per-format weight fragments for the tensor-core matvec of a few tokens (q8_mma_matvec.cu; private to it
// and to its host test tests/cuda/test_q8_mma_host.cu).
//
// One "step" is 32 consecutive values of one weight row (one activation block). mma.sync m16n8k32 (s8 x s8
// -> s32) takes, from lane l of a warp (q = l & 3), two words of each of its two rows (l >> 2 and 8 + (l >> 2)):
// the codes of the step's values 4q..4q+3 (lo) and 16+4q..16+4q+3 (hi), four signed bytes each. A format
// gives those words and the step's scales, such that
//     value = d * code - m          (Split16 false)
//     value = d * s * code          (Split16 true, Q6_K: s = sa for values 0..15, sb for 16..31, integers;
//                                    the kernel runs two m16n8k16 products and combines them with sa, sb)
// The K-quants' mins go through the activation block sums (ds.y), as the dp4a kernels do; Q4_0's -8 and
// Q6_K's -32 are byte-wise subtracts (codes then fit int8).
// Each step function reads one row's block `blk` (aligned as the row; A: q8d::ldw's alignment argument:
// q8d::kStaged on the device, which reads rows staged in shared memory; 2 on the host) and the step j of it
// (0 <= j < kVals / 32).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/dequant_device.cuh"
#include "cuda/fast_dot.cuh"
#include "cuda/q8_task_io.cuh"
#include "quant/types.h"

namespace strata::cuda::q8mma {

struct Step {
  uint32_t lo = 0, hi = 0;  // codes of values 4q..4q+3, 16+4q..16+4q+3 (signed bytes)
  float d = 0.f, m = 0.f;   // value = d * code - m (Split16: d * s * code, m = 0)
  int sa = 1, sb = 1;       // Split16 only: the integer scales of values 0..15 and 16..31
};

constexpr uint32_t kLo4 = 0x0F0F0F0Fu;

// Byte-wise a - b for bytes of a in [0, 255] as signed results that fit (the codes' offsets).
__host__ __device__ __forceinline__ uint32_t sub_bytes(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  return __vsub4(a, b);
#else
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= uint32_t(uint8_t(int((a >> (8 * k)) & 0xFF) - int((b >> (8 * k)) & 0xFF))) << (8 * k);
  return r;
#endif
}

template <int A>
__host__ __device__ __forceinline__ uint32_t word(const uint8_t* p) {
  uint32_t w[1];
  q8d::ldw<A, 1>(p, w);
  return w[0];
}

// Q4_0: d f16 | qs[16]; value l = d * ((qs[l] & 15) - 8), value l + 16 = d * ((qs[l] >> 4) - 8).
struct MQ40 {
  static constexpr int kVals = 32, kBytes = 18;
  static constexpr bool kSplit16 = false, kMin = false;
  template <int A>
  __host__ __device__ __forceinline__ static Step step(const uint8_t* blk, int, int q) {
    const uint32_t w = word<A>(blk + 2 + 4 * q);
    Step s;
    s.lo = sub_bytes(w & kLo4, 0x08080808u), s.hi = sub_bytes((w >> 4) & kLo4, 0x08080808u);
    s.d = dq::h2f(dq::ld16<2>(blk));
    return s;
  }
};

// Q4_0 regrouped (quant/q4_0_x8.h): d[8] f16 | qs[8][16]; step j = Q4_0 block j of the group.
struct MQ40X8 {
  static constexpr int kVals = 256, kBytes = 144;
  static constexpr bool kSplit16 = false, kMin = false;
  template <int A>
  __host__ __device__ __forceinline__ static Step step(const uint8_t* blk, int j, int q) {
    const uint32_t w = word<A>(blk + 16 + 16 * j + 4 * q);
    Step s;
    s.lo = sub_bytes(w & kLo4, 0x08080808u), s.hi = sub_bytes((w >> 4) & kLo4, 0x08080808u);
    s.d = dq::h2f(dq::ld16<2>(blk + 2 * j));
    return s;
  }
};

// Q8_0: d f16 | qs[32] int8.
struct MQ80 {
  static constexpr int kVals = 32, kBytes = 34;
  static constexpr bool kSplit16 = false, kMin = false;
  template <int A>
  __host__ __device__ __forceinline__ static Step step(const uint8_t* blk, int, int q) {
    Step s;
    s.lo = word<A>(blk + 2 + 4 * q), s.hi = word<A>(blk + 18 + 4 * q);
    s.d = dq::h2f(dq::ld16<2>(blk));
    return s;
  }
};

// Q4_K: d, dmin f16 | scales[12] | qs[128]; Q5_K: d, dmin | scales[12] | qh[32] | qs[128]. Sub-block j
// (step j): codes in the low (j even) or high (j odd) nibbles of qs[32 (j/2) + l], Q5_K bit 4 = bit j of
// qh[l]; value = d * sc_j * code - dmin * m_j.
template <bool kQ5>
struct MK45 {
  static constexpr int kVals = 256, kBytes = kQ5 ? 176 : 144;
  static constexpr bool kSplit16 = false, kMin = true;
  template <int A>
  __host__ __device__ __forceinline__ static Step step(const uint8_t* blk, int j, int q) {
    const uint8_t* qs = blk + (kQ5 ? 48 : 16) + 32 * (j >> 1);
    const unsigned sh = 4u * unsigned(j & 1);
    Step s;
    s.lo = (word<A>(qs + 4 * q) >> sh) & kLo4, s.hi = (word<A>(qs + 16 + 4 * q) >> sh) & kLo4;
    if constexpr (kQ5) {
      s.lo |= ((word<A>(blk + 16 + 4 * q) >> j) & 0x01010101u) << 4;
      s.hi |= ((word<A>(blk + 32 + 4 * q) >> j) & 0x01010101u) << 4;
    }
    uint32_t head[4];
    q8d::ldw<A, 4>(blk, head);
    const uint32_t sw[3] = {head[1], head[2], head[3]};
    int sc, m;
    fd::k4_scale_min_w(j, sw, sc, m);
    s.d = dq::h2f(head[0] & 0xFFFF) * float(sc);
    s.m = dq::h2f(head[0] >> 16) * float(m);
    return s;
  }
};
using MQ4K = MK45<false>;
using MQ5K = MK45<true>;

// Q6_K: ql[128] | qh[64] | scales[16] int8 | d f16. Step j: half h = j / 4, group g = j % 4 of it: low
// (g < 2) or high nibbles of ql[64h + 32 (g & 1) + l], bits 2g, 2g+1 of qh[32h + l] on top, minus 32;
// scales[8h + 2g] for l < 16, scales[8h + 2g + 1] after.
struct MQ6K {
  static constexpr int kVals = 256, kBytes = 210;
  static constexpr bool kSplit16 = true, kMin = false;
  template <int A>
  __host__ __device__ __forceinline__ static Step step(const uint8_t* blk, int j, int q) {
    return body<A>(blk, dq::h2f(dq::ld16<2>(blk + 208)), j, q);
  }
  // Step j of the block whose ql | qh | scales start at blk (aligned as A) and whose scale is d.
  template <int A>
  __host__ __device__ __forceinline__ static Step body(const uint8_t* blk, float d, int j, int q) {
    const int h = j >> 2, g = j & 3;
    const uint8_t* ql = blk + 64 * h + 32 * (g & 1);
    const uint8_t* qh = blk + 128 + 32 * h;
    const unsigned sl = 4u * unsigned(g >> 1), shh = 2u * unsigned(g);
    Step s;
    s.lo = sub_bytes(((word<A>(ql + 4 * q) >> sl) & kLo4) | (((word<A>(qh + 4 * q) >> shh) & 0x03030303u) << 4),
                     0x20202020u);
    s.hi = sub_bytes(((word<A>(ql + 16 + 4 * q) >> sl) & kLo4) |
                         (((word<A>(qh + 16 + 4 * q) >> shh) & 0x03030303u) << 4),
                     0x20202020u);
    const uint32_t sc = dq::ld16<2>(blk + 192 + 8 * h + 2 * g);
    s.sa = int(int8_t(sc & 0xFF)), s.sb = int(int8_t(sc >> 8));
    s.d = d;
    return s;
  }
};

// Q6_K regrouped (quant/q6_k_x8.h): d[8] f16 | body[8][208]; step j = step j % 8 of super-block j / 8.
struct MQ6KX8 {
  static constexpr int kVals = 2048, kBytes = 1680;
  static constexpr bool kSplit16 = true, kMin = false;
  template <int A>
  __host__ __device__ __forceinline__ static Step step(const uint8_t* blk, int j, int q) {
    const int sb = j >> 3;
    return MQ6K::body<A>(blk + 16 + 208 * sb, dq::h2f(dq::ld16<2>(blk + 2 * sb)), j & 7, q);
  }
};

// The one list of the tensor-core matvec's formats: calls f(M{}) with the format struct of `t` and returns
// true, or returns false for any other type (host code: the kernels' launchers and mma_matvec_takes).
template <typename F>
bool with_format(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::Q4_0: f(MQ40{}); return true;
    case GgmlType::Q4_0_X8: f(MQ40X8{}); return true;
    case GgmlType::Q8_0: f(MQ80{}); return true;
    case GgmlType::Q4_K: f(MQ4K{}); return true;
    case GgmlType::Q5_K: f(MQ5K{}); return true;
    case GgmlType::Q6_K: f(MQ6K{}); return true;
    case GgmlType::Q6_K_X8: f(MQ6KX8{}); return true;
    default: return false;
  }
}

}  // namespace strata::cuda::q8mma
