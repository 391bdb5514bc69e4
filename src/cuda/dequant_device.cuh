#pragma once
// Per-block dequantization on the device (private to src/cuda: quant_kernels.cu and moe_kernels.cu).
// Bit-identical to quant/dequant.cpp: the same float operations in the same order, each written with
// fmul / fadd / fsub (on the device __fmul_rn etc.) so that nvcc never contracts a*b+c into an FMA (the
// CPU code is compiled with contraction off). The decoders are __host__ __device__ so that a CPU test
// checks them without a GPU.
//
// Unit of work: 8 consecutive values of a block ("unit" i8 = values [8*i8, 8*i8+8) of the block).
// Every format below is a struct Fmt<T> with
//   kVals  values per block (the float types use a virtual block of 8 values),
//   kBytes bytes per block,
//   kAlign the largest of 16/8/4/2/1 that divides kBytes: the alignment of every block when the row
//          start has it (the kernels pick A = kAlign when the pointer allows, else A = 1),
//   deq8<A>(blk, i8, v[8]) where blk is aligned to A bytes,
//   and for the float types one(row, c): value c of a row (byte loads: only the tail past the last 8).
// Loads are as wide as the alignment A (and the field's offset in the block) allow; A = 1 reads bytes.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cuda/iq_grids_device.cuh"
#include "quant/iq_tables.h"
#include "quant/types.h"

namespace strata::cuda::dq {

__host__ __device__ constexpr int cmin(int a, int b) { return a < b ? a : b; }

// Rounded float operations that are never contracted into an FMA (device: the _rn intrinsics; host:
// plain operations, which g++ does not contract on x86-64 without -mfma). The host side lets a CPU test
// check these decoders against quant/dequant.cpp without a GPU (tests/cuda/test_dequant_device_host.cu).
__host__ __device__ __forceinline__ float fmul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
__host__ __device__ __forceinline__ float fadd(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
__host__ __device__ __forceinline__ float fsub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
__host__ __device__ __forceinline__ float bits_to_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- loads of little-endian fields; A = guaranteed alignment of p ----
template <int A>
__host__ __device__ __forceinline__ uint32_t ld16(const uint8_t* p) {
  if constexpr (A >= 2) return *reinterpret_cast<const uint16_t*>(p);
  else return uint32_t(p[0]) | (uint32_t(p[1]) << 8);
}
template <int A>
__host__ __device__ __forceinline__ uint32_t ld32(const uint8_t* p) {
  if constexpr (A >= 4) return *reinterpret_cast<const uint32_t*>(p);
  else if constexpr (A == 2)
    return uint32_t(reinterpret_cast<const uint16_t*>(p)[0]) | (uint32_t(reinterpret_cast<const uint16_t*>(p)[1]) << 16);
  else return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
// 8 bytes into q[0..1] (q[0] = bytes 0..3).
template <int A>
__host__ __device__ __forceinline__ void ld64(const uint8_t* p, uint32_t q[2]) {
  if constexpr (A >= 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    q[0] = v.x, q[1] = v.y;
  } else {
    q[0] = ld32<A>(p), q[1] = ld32<A>(p + 4);
  }
}
__host__ __device__ __forceinline__ uint32_t byte_of(const uint32_t q[2], int k) { return (q[k >> 2] >> (8 * (k & 3))) & 0xFF; }

// IEEE half -> float: exact (the hardware conversion, subnormals included), as q::fp16_to_fp32.
__host__ __device__ __forceinline__ float h2f(uint32_t h) { return __half2float(__ushort_as_half(static_cast<unsigned short>(h))); }
__host__ __device__ __forceinline__ float bf2f(uint32_t h) { return bits_to_float(h << 16); }

// kvalues_iq4nl (ggml; strata::iq::kIq4nlValues) looked up in registers: the 16 int8 values packed in
// four words, one byte picked by __byte_perm (a table in memory would serialize a warp's 16 addresses).
__host__ __device__ __forceinline__ int iq4nl_value(uint32_t i) {
  // -127 -104 -83 -65 | -49 -35 -22 -10 | 1 13 25 38 | 53 69 89 113
  const uint32_t lo = i < 8 ? 0xBFAD9881u : 0x26190D01u, hi = i < 8 ? 0xF6EADDCFu : 0x71594535u;
#ifdef __CUDA_ARCH__
  return int(int8_t(__byte_perm(lo, hi, i & 7) & 0xFF));
#else
  const uint32_t j = i & 7;
  return int(int8_t(((j < 4 ? lo : hi) >> (8 * (j & 3))) & 0xFF));
#endif
}

template <GgmlType T>
struct Fmt;  // only the types below have device kernels

// ---- plain floats: virtual blocks of 8 values ----
template <>
struct Fmt<GgmlType::F32> {
  static constexpr int kVals = 8, kBytes = 32, kAlign = 16;
  static constexpr bool kFloat = true;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int, float v[8]) {
    if constexpr (A >= 16) {
      const float4 a = reinterpret_cast<const float4*>(b)[0], c = reinterpret_cast<const float4*>(b)[1];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = c.x, v[5] = c.y, v[6] = c.z, v[7] = c.w;
    } else {
      for (int k = 0; k < 8; ++k) v[k] = bits_to_float(ld32<cmin(A, 4)>(b + 4 * k));
    }
  }
  __host__ __device__ static float one(const uint8_t* row, int64_t c) { return bits_to_float(ld32<1>(row + 4 * c)); }
};
template <>
struct Fmt<GgmlType::F16> {
  static constexpr int kVals = 8, kBytes = 16, kAlign = 16;
  static constexpr bool kFloat = true;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int, float v[8]) {
    if constexpr (A >= 16) {
      const uint4 a = *reinterpret_cast<const uint4*>(b);
      const uint32_t w[4] = {a.x, a.y, a.z, a.w};
      for (int k = 0; k < 4; ++k) v[2 * k] = h2f(w[k] & 0xFFFF), v[2 * k + 1] = h2f(w[k] >> 16);
    } else {
      for (int k = 0; k < 8; ++k) v[k] = h2f(ld16<cmin(A, 2)>(b + 2 * k));
    }
  }
  __host__ __device__ static float one(const uint8_t* row, int64_t c) { return h2f(ld16<1>(row + 2 * c)); }
};
template <>
struct Fmt<GgmlType::BF16> {
  static constexpr int kVals = 8, kBytes = 16, kAlign = 16;
  static constexpr bool kFloat = true;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int, float v[8]) {
    if constexpr (A >= 16) {
      const uint4 a = *reinterpret_cast<const uint4*>(b);
      const uint32_t w[4] = {a.x, a.y, a.z, a.w};
      for (int k = 0; k < 4; ++k) v[2 * k] = bf2f(w[k] & 0xFFFF), v[2 * k + 1] = bf2f(w[k] >> 16);
    } else {
      for (int k = 0; k < 8; ++k) v[k] = bf2f(ld16<cmin(A, 2)>(b + 2 * k));
    }
  }
  __host__ __device__ static float one(const uint8_t* row, int64_t c) { return bf2f(ld16<1>(row + 2 * c)); }
};

// ---- 32-value blocks: 4 units; unit i8 covers values 8*i8.. : bytes j0 = 8*(i8&1).., nibble i8>>1 ----
template <>
struct Fmt<GgmlType::Q4_0> {  // d f16 | qs[16]
  static constexpr int kVals = 32, kBytes = 18, kAlign = 2;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    uint32_t q[2];
    ld64<cmin(A, 2)>(b + 2 + 8 * (i8 & 1), q);
    unit(h2f(ld16<A>(b)), q, i8, v);
  }
  // Unit i8 of a block from its scale d and the 8 code bytes q of the unit's half (i8 & 1).
  __host__ __device__ static void unit(float d, const uint32_t q[2], int i8, float v[8]) {
    const int sh = 4 * (i8 >> 1);
    for (int k = 0; k < 8; ++k) v[k] = fmul(float(int((byte_of(q, k) >> sh) & 0xF) - 8), d);
  }
};
// Q4_0 regrouped (quant/q4_0_x8.h): d[8] f16 | qs[8][16]. Unit i8 is unit i8 % 4 of Q4_0 block i8 / 4, with
// Q4_0's arithmetic, so the values and (the units in the same order) every sum are Q4_0's.
template <>
struct Fmt<GgmlType::Q4_0_X8> {
  static constexpr int kVals = 256, kBytes = 144, kAlign = 16;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int blk = i8 >> 2, u = i8 & 3;
    uint32_t q[2];
    ld64<cmin(A, 8)>(b + 16 + 16 * blk + 8 * (u & 1), q);
    Fmt<GgmlType::Q4_0>::unit(h2f(ld16<cmin(A, 2)>(b + 2 * blk)), q, u, v);
  }
};
template <>
struct Fmt<GgmlType::Q4_1> {  // d, m f16 | qs[16]
  static constexpr int kVals = 32, kBytes = 20, kAlign = 4;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const uint32_t dm = ld32<A>(b);
    const float d = h2f(dm & 0xFFFF), m = h2f(dm >> 16);
    uint32_t q[2];
    ld64<cmin(A, 4)>(b + 4 + 8 * (i8 & 1), q);
    const int sh = 4 * (i8 >> 1);
    for (int k = 0; k < 8; ++k) v[k] = fadd(fmul(float((byte_of(q, k) >> sh) & 0xF), d), m);
  }
};
template <>
struct Fmt<GgmlType::Q5_0> {  // d f16 | qh[4] | qs[16]
  static constexpr int kVals = 32, kBytes = 22, kAlign = 2;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const float d = h2f(ld16<A>(b));
    const uint32_t qh = ld32<cmin(A, 2)>(b + 2);
    const int j0 = 8 * (i8 & 1), hi = i8 >> 1;
    uint32_t q[2];
    ld64<cmin(A, 2)>(b + 6 + j0, q);
    for (int k = 0; k < 8; ++k) {
      const int j = j0 + k;
      const int h = hi ? int((qh >> (j + 12)) & 0x10) : int(((qh >> j) << 4) & 0x10);
      const int nib = int((byte_of(q, k) >> (4 * hi)) & 0xF);
      v[k] = fmul(float((nib | h) - 16), d);
    }
  }
};
template <>
struct Fmt<GgmlType::Q5_1> {  // d, m f16 | qh[4] | qs[16]
  static constexpr int kVals = 32, kBytes = 24, kAlign = 8;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const uint32_t dm = ld32<cmin(A, 4)>(b);
    const float d = h2f(dm & 0xFFFF), m = h2f(dm >> 16);
    const uint32_t qh = ld32<cmin(A, 4)>(b + 4);
    const int j0 = 8 * (i8 & 1), hi = i8 >> 1;
    uint32_t q[2];
    ld64<A>(b + 8 + j0, q);
    for (int k = 0; k < 8; ++k) {
      const int j = j0 + k;
      const int h = hi ? int((qh >> (j + 12)) & 0x10) : int(((qh >> j) << 4) & 0x10);
      const int nib = int((byte_of(q, k) >> (4 * hi)) & 0xF);
      v[k] = fadd(fmul(float(nib | h), d), m);
    }
  }
};
template <>
struct Fmt<GgmlType::Q8_0> {  // d f16 | qs[32] int8
  static constexpr int kVals = 32, kBytes = 34, kAlign = 2;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const float d = h2f(ld16<A>(b));
    uint32_t q[2];
    ld64<cmin(A, 2)>(b + 2 + 8 * i8, q);
    for (int k = 0; k < 8; ++k) v[k] = fmul(float(int(int8_t(byte_of(q, k)))), d);
  }
};
template <>
struct Fmt<GgmlType::IQ4_NL> {  // d f16 | qs[16] (indices into kvalues_iq4nl)
  static constexpr int kVals = 32, kBytes = 18, kAlign = 2;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const float d = h2f(ld16<A>(b));
    uint32_t q[2];
    ld64<cmin(A, 2)>(b + 2 + 8 * (i8 & 1), q);
    const int sh = 4 * (i8 >> 1);
    for (int k = 0; k < 8; ++k) v[k] = fmul(d, float(iq4nl_value((byte_of(q, k) >> sh) & 0xF)));
  }
};

// ---- K-quants: 256-value super-blocks, 32 units ----
template <>
struct Fmt<GgmlType::Q2_K> {  // scales[16] | qs[64] | d, dmin f16
  static constexpr int kVals = 256, kBytes = 84, kAlign = 4;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int p = 8 * i8, half = p >> 7, shift = ((p & 127) >> 5) * 2, part = (p & 31) >> 4, l0 = p & 15;
    const uint32_t dd = ld32<cmin(A, 4)>(b + 80);
    const float d = h2f(dd & 0xFFFF), dmin = h2f(dd >> 16);
    const uint32_t sc = b[p >> 4];
    const float dl = fmul(d, float(sc & 0xF)), ml = fmul(dmin, float(sc >> 4));
    uint32_t q[2];
    ld64<cmin(A, 8)>(b + 16 + half * 32 + 16 * part + l0, q);
    for (int k = 0; k < 8; ++k) v[k] = fsub(fmul(dl, float((byte_of(q, k) >> shift) & 3)), ml);
  }
};
template <>
struct Fmt<GgmlType::Q3_K> {  // hmask[32] | qs[64] | scales[12] | d f16
  static constexpr int kVals = 256, kBytes = 110, kAlign = 2;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int p = 8 * i8, half = p >> 7, s = (p & 127) >> 5, part = (p & 31) >> 4, l = 16 * part + (p & 15);
    const int is = p >> 4;
    const float d = h2f(ld16<A>(b + 108));
    // q3k_scales, one entry: low 4 bits from scales[is % 8] (nibble is / 8), high 2 from scales[8 + is % 4].
    const int low4 = (b[96 + (is & 7)] >> (4 * (is >> 3))) & 0xF;
    const int hi2 = (b[96 + 8 + (is & 3)] >> (2 * (is >> 2))) & 3;
    const int sc = (low4 | (hi2 << 4)) - 32;
    const float dl = fmul(d, float(sc));
    const uint32_t m = 1u << (half * 4 + s);
    uint32_t q[2], hm[2];
    ld64<cmin(A, 8)>(b + 32 + half * 32 + l, q);
    ld64<cmin(A, 8)>(b + l, hm);
    for (int k = 0; k < 8; ++k) {
      const int qv = int((byte_of(q, k) >> (2 * s)) & 3) - ((byte_of(hm, k) & m) ? 0 : 4);
      v[k] = fmul(dl, float(qv));
    }
  }
};
// K-quant 6-bit scale/min pair j (0..7) from the 12 packed bytes of Q4_K / Q5_K (q::k4_scale_min).
__host__ __device__ __forceinline__ void k4_scale_min(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}
template <>
struct Fmt<GgmlType::Q4_K> {  // d, dmin f16 | scales[12] | qs[128]
  static constexpr int kVals = 256, kBytes = 144, kAlign = 16;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int p = 8 * i8, j = p >> 5, l0 = p & 31;
    const uint32_t dd = ld32<cmin(A, 4)>(b);
    const float d = h2f(dd & 0xFFFF), dmin = h2f(dd >> 16);
    int sc, m;
    k4_scale_min(j, b + 4, sc, m);
    const float d1 = fmul(d, float(sc)), m1 = fmul(dmin, float(m));
    uint32_t q[2];
    ld64<cmin(A, 8)>(b + 16 + 32 * (j >> 1) + l0, q);
    const int sh = 4 * (j & 1);
    for (int k = 0; k < 8; ++k) v[k] = fsub(fmul(d1, float((byte_of(q, k) >> sh) & 0xF)), m1);
  }
};
template <>
struct Fmt<GgmlType::Q5_K> {  // d, dmin f16 | scales[12] | qh[32] | qs[128]
  static constexpr int kVals = 256, kBytes = 176, kAlign = 16;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int p = 8 * i8, j = p >> 5, l0 = p & 31;
    const uint32_t dd = ld32<cmin(A, 4)>(b);
    const float d = h2f(dd & 0xFFFF), dmin = h2f(dd >> 16);
    int sc, m;
    k4_scale_min(j, b + 4, sc, m);
    const float d1 = fmul(d, float(sc)), m1 = fmul(dmin, float(m));
    uint32_t q[2], h[2];
    ld64<cmin(A, 8)>(b + 48 + 32 * (j >> 1) + l0, q);
    ld64<cmin(A, 8)>(b + 16 + l0, h);
    const int sh = 4 * (j & 1);
    const uint32_t u = 1u << j;
    for (int k = 0; k < 8; ++k) {
      const int qv = int((byte_of(q, k) >> sh) & 0xF) + ((byte_of(h, k) & u) ? 16 : 0);
      v[k] = fsub(fmul(d1, float(qv)), m1);
    }
  }
};
template <>
struct Fmt<GgmlType::Q6_K> {  // ql[128] | qh[64] | scales[16] int8 | d f16
  static constexpr int kVals = 256, kBytes = 210, kAlign = 2;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    body<A>(b, h2f(ld16<A>(b + 208)), i8, v);
  }
  // Unit i8 of the block whose ql | qh | scales start at b (aligned as A) and whose scale is d.
  template <int A>
  __host__ __device__ static void body(const uint8_t* b, float d, int i8, float v[8]) {
    const int p = 8 * i8, half = p >> 7, r = p & 127, quarter = r >> 5, l0 = r & 31;
    const int is = (l0 >> 4) + 2 * quarter;
    const float ds = fmul(d, float(int(int8_t(b[192 + half * 8 + is]))));
    uint32_t ql[2], qh[2];
    ld64<cmin(A, 8)>(b + half * 64 + 32 * (quarter & 1) + l0, ql);
    ld64<cmin(A, 8)>(b + 128 + half * 32 + l0, qh);
    const int lsh = 4 * (quarter >> 1), hsh = 2 * quarter;
    for (int k = 0; k < 8; ++k) {
      const int qv = int(((byte_of(ql, k) >> lsh) & 0xF) | (((byte_of(qh, k) >> hsh) & 3) << 4)) - 32;
      v[k] = fmul(ds, float(qv));
    }
  }
};
template <>
struct Fmt<GgmlType::Q6_K_X8> {  // Q6_K regrouped (quant/q6_k_x8.h): d[8] f16 | body[8][208]
  static constexpr int kVals = 2048, kBytes = 1680, kAlign = 16;
  static constexpr bool kFloat = false;
  // Unit i8 is unit i8 % 32 of super-block i8 / 32, with Q6_K's arithmetic: Q6_K's values, and (the units in
  // the same order) every sum.
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int sb = i8 >> 5;
    Fmt<GgmlType::Q6_K>::body<cmin(A, 16)>(b + 16 + 208 * sb, h2f(ld16<cmin(A, 2)>(b + 2 * sb)), i8 & 31, v);
  }
};
template <>
struct Fmt<GgmlType::Q6_K_P> : Fmt<GgmlType::Q6_K> {  // Q6_K padded (quant/q6_k_p.h): the block | zero[14]
  static constexpr int kBytes = 224, kAlign = 16;  // (Q6_K's deq8 and arithmetic on the block)
};
template <>
struct Fmt<GgmlType::IQ4_XS> {  // d f16 | scales_h u16 | scales_l[4] | qs[128]
  static constexpr int kVals = 256, kBytes = 136, kAlign = 8;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int p = 8 * i8, ib = p >> 5, j0 = p & 31;
    const uint32_t hh = ld32<cmin(A, 4)>(b);
    const float d = h2f(hh & 0xFFFF);
    const uint32_t scales_h = hh >> 16;
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
    const float dl = fmul(d, float(ls - 32));
    uint32_t q[2];
    ld64<cmin(A, 8)>(b + 8 + 16 * ib + (j0 & 15), q);
    const int sh = 4 * (j0 >> 4);
    for (int k = 0; k < 8; ++k) v[k] = fmul(dl, float(iq4nl_value((byte_of(q, k) >> sh) & 0xF)));
  }
};

// ---- IQ formats: lattice-grid indices + sign patterns; unit i8 = group l = i8 % 4 of sub-block ib = i8 / 4
// (one 8-value grid point, or two 4-value ones for IQ3) ----
// Table reads: the device copies (iq_grids_device.cuh) on the GPU, quant/iq_tables on the host.
#ifdef __CUDA_ARCH__
#define STRATA_IQ_TABLE(dev, host) dev
#else
#define STRATA_IQ_TABLE(dev, host) ::strata::iq::host
#endif
__host__ __device__ __forceinline__ uint32_t iq2_signs(uint32_t i) { return STRATA_IQ_TABLE(kDevIq2Signs, kIq2Signs)[i]; }
__host__ __device__ __forceinline__ uint64_t iq2xxs_grid(uint32_t i) { return STRATA_IQ_TABLE(kDevIq2xxsGrid, kIq2xxsGrid)[i]; }
__host__ __device__ __forceinline__ uint64_t iq2xs_grid(uint32_t i) { return STRATA_IQ_TABLE(kDevIq2xsGrid, kIq2xsGrid)[i]; }
__host__ __device__ __forceinline__ uint64_t iq2s_grid(uint32_t i) { return STRATA_IQ_TABLE(kDevIq2sGrid, kIq2sGrid)[i]; }
__host__ __device__ __forceinline__ uint32_t iq3xxs_grid(uint32_t i) { return STRATA_IQ_TABLE(kDevIq3xxsGrid, kIq3xxsGrid)[i]; }
__host__ __device__ __forceinline__ uint32_t iq3s_grid(uint32_t i) { return STRATA_IQ_TABLE(kDevIq3sGrid, kIq3sGrid)[i]; }
__host__ __device__ __forceinline__ uint64_t iq1s_grid(uint32_t i) { return STRATA_IQ_TABLE(kDevIq1sGrid, kIq1sGrid)[i]; }
#undef STRATA_IQ_TABLE

// Byte j of a packed grid entry, and ggml's sign: (signs & kmask_iq2xs[j]) ? -1 : 1.
__host__ __device__ __forceinline__ float gbyte(uint64_t g, int j) { return float(uint32_t(g >> (8 * j)) & 0xFF); }
__host__ __device__ __forceinline__ float gsbyte(uint64_t g, int j) { return float(int(int8_t(uint32_t(g >> (8 * j)) & 0xFF))); }
__host__ __device__ __forceinline__ float sgn(uint32_t signs, int j) { return (signs >> j) & 1 ? -1.f : 1.f; }

template <>
struct Fmt<GgmlType::IQ2_XXS> {  // d f16 | qs u16[32]: per sub-block 4 grid indices (bytes) + 4x7 sign bits + 4-bit scale
  static constexpr int kVals = 256, kBytes = 66, kAlign = 2;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int ib = i8 >> 2, l = i8 & 3;
    const float d = h2f(ld16<A>(b));
    const uint32_t idx = ld32<cmin(A, 2)>(b + 2 + 8 * ib), aux1 = ld32<cmin(A, 2)>(b + 6 + 8 * ib);
    const float db = fmul(fmul(d, fadd(0.5f, float(aux1 >> 28))), 0.25f);
    const uint64_t g = iq2xxs_grid((idx >> (8 * l)) & 0xFF);
    const uint32_t signs = iq2_signs((aux1 >> (7 * l)) & 127);
    for (int j = 0; j < 8; ++j) v[j] = fmul(fmul(db, gbyte(g, j)), sgn(signs, j));
  }
};
template <>
struct Fmt<GgmlType::IQ2_XS> {  // d f16 | qs u16[32] (9-bit grid index + 7-bit signs) | scales[8]
  static constexpr int kVals = 256, kBytes = 74, kAlign = 2;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int ib = i8 >> 2, l = i8 & 3;
    const float d = h2f(ld16<A>(b));
    const uint32_t sc = b[66 + ib];
    const float db = fmul(fmul(d, fadd(0.5f, float(l < 2 ? (sc & 0xf) : (sc >> 4)))), 0.25f);
    const uint32_t qs = ld16<cmin(A, 2)>(b + 2 + 8 * ib + 2 * l);
    const uint64_t g = iq2xs_grid(qs & 511);
    const uint32_t signs = iq2_signs(qs >> 9);
    for (int j = 0; j < 8; ++j) v[j] = fmul(fmul(db, gbyte(g, j)), sgn(signs, j));
  }
};
template <>
struct Fmt<GgmlType::IQ2_S> {  // d f16 | qs[32] grid low bits | signs[32] | qh[8] | scales[8]
  static constexpr int kVals = 256, kBytes = 82, kAlign = 2;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int ib = i8 >> 2, l = i8 & 3;
    const float d = h2f(ld16<A>(b));
    const uint32_t sc = b[74 + ib];
    const float db = fmul(fmul(d, fadd(0.5f, float(l < 2 ? (sc & 0xf) : (sc >> 4)))), 0.25f);
    const uint32_t qh = b[66 + ib];
    const uint64_t g = iq2s_grid(b[2 + 4 * ib + l] | ((qh << (8 - 2 * l)) & 0x300));
    const uint32_t signs = b[2 + 32 + 4 * ib + l];
    for (int j = 0; j < 8; ++j) v[j] = fmul(fmul(db, gbyte(g, j)), sgn(signs, j));
  }
};
template <>
struct Fmt<GgmlType::IQ3_XXS> {  // d f16 | qs[64] grid indices | 8 x u32 (4x7 sign bits + 4-bit scale)
  static constexpr int kVals = 256, kBytes = 98, kAlign = 2;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int ib = i8 >> 2, l = i8 & 3;
    const float d = h2f(ld16<A>(b));
    const uint32_t aux = ld32<cmin(A, 2)>(b + 66 + 4 * ib);
    const float db = fmul(fmul(d, fadd(0.5f, float(aux >> 28))), 0.5f);
    const uint32_t signs = iq2_signs((aux >> (7 * l)) & 127);
    const uint32_t g1 = iq3xxs_grid(b[2 + 8 * ib + 2 * l]), g2 = iq3xxs_grid(b[2 + 8 * ib + 2 * l + 1]);
    for (int j = 0; j < 4; ++j) {
      v[j] = fmul(fmul(db, gbyte(g1, j)), sgn(signs, j));
      v[j + 4] = fmul(fmul(db, gbyte(g2, j)), sgn(signs, j + 4));
    }
  }
};
template <>
struct Fmt<GgmlType::IQ3_S> {  // d f16 | qs[64] | qh[8] | signs[32] | scales[4]
  static constexpr int kVals = 256, kBytes = 110, kAlign = 2;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int ib = i8 >> 2, l = i8 & 3;
    const float d = h2f(ld16<A>(b));
    const uint32_t sc = b[106 + ib / 2];
    const float db = fmul(d, float(1 + 2 * int((ib & 1) ? (sc >> 4) : (sc & 0xf))));
    const uint32_t qh = b[66 + ib];
    const uint32_t g1 = iq3s_grid(b[2 + 8 * ib + 2 * l] | ((qh << (8 - 2 * l)) & 256));
    const uint32_t g2 = iq3s_grid(b[2 + 8 * ib + 2 * l + 1] | ((qh << (7 - 2 * l)) & 256));
    const uint32_t signs = b[74 + 4 * ib + l];
    for (int j = 0; j < 4; ++j) {
      v[j] = fmul(fmul(db, gbyte(g1, j)), sgn(signs, j));
      v[j + 4] = fmul(fmul(db, gbyte(g2, j)), sgn(signs, j + 4));
    }
  }
};
template <>
struct Fmt<GgmlType::IQ1_S> {  // d f16 | qs[32] | qh u16[8] (3 high index bits x4, 3-bit scale, delta sign)
  static constexpr int kVals = 256, kBytes = 50, kAlign = 2;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int ib = i8 >> 2, l = i8 & 3;
    const float d = h2f(ld16<A>(b));
    const uint32_t qh = ld16<cmin(A, 2)>(b + 34 + 2 * ib);
    const float dl = fmul(d, float(int(2 * ((qh >> 12) & 7) + 1)));
    const float delta = (qh & 0x8000) ? -::strata::iq::kIq1Delta : ::strata::iq::kIq1Delta;
    const uint64_t g = iq1s_grid(b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8));
    for (int j = 0; j < 8; ++j) v[j] = fmul(dl, fadd(gsbyte(g, j), delta));
  }
};
template <>
struct Fmt<GgmlType::IQ1_M> {  // qs[32] | qh[16] | scales u16[4] (3-bit scales + the f16 d in the top nibbles)
  static constexpr int kVals = 256, kBytes = 56, kAlign = 8;
  static constexpr bool kFloat = false;
  template <int A>
  __host__ __device__ static void deq8(const uint8_t* b, int i8, float v[8]) {
    const int ib = i8 >> 2, l = i8 & 3;
    uint32_t w[2];
    ld64<cmin(A, 8)>(b + 48, w);
    const uint32_t sc[4] = {w[0] & 0xFFFF, w[0] >> 16, w[1] & 0xFFFF, w[1] >> 16};
    const float d = h2f((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    const float dl = fmul(d, float(int(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3 * (l / 2))) & 0x7) + 1)));
    const uint32_t qh = b[32 + 2 * ib + l / 2];
    const uint32_t idx = b[4 * ib + l] | ((l & 1 ? (qh << 4) : (qh << 8)) & 0x700);
    const float delta = (qh & (l & 1 ? 0x80 : 0x08)) ? -::strata::iq::kIq1Delta : ::strata::iq::kIq1Delta;
    const uint64_t g = iq1s_grid(idx);
    for (int j = 0; j < 8; ++j) v[j] = fmul(dl, fadd(gsbyte(g, j), delta));
  }
};

// Calls f(Fmt<T>{}) for the types with device kernels; returns false for any other type.
template <typename F>
bool dispatch(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::F32: f(Fmt<GgmlType::F32>{}); return true;
    case GgmlType::F16: f(Fmt<GgmlType::F16>{}); return true;
    case GgmlType::BF16: f(Fmt<GgmlType::BF16>{}); return true;
    case GgmlType::Q4_0: f(Fmt<GgmlType::Q4_0>{}); return true;
    case GgmlType::Q4_0_X8: f(Fmt<GgmlType::Q4_0_X8>{}); return true;
    case GgmlType::Q4_1: f(Fmt<GgmlType::Q4_1>{}); return true;
    case GgmlType::Q5_0: f(Fmt<GgmlType::Q5_0>{}); return true;
    case GgmlType::Q5_1: f(Fmt<GgmlType::Q5_1>{}); return true;
    case GgmlType::Q8_0: f(Fmt<GgmlType::Q8_0>{}); return true;
    case GgmlType::Q2_K: f(Fmt<GgmlType::Q2_K>{}); return true;
    case GgmlType::Q3_K: f(Fmt<GgmlType::Q3_K>{}); return true;
    case GgmlType::Q4_K: f(Fmt<GgmlType::Q4_K>{}); return true;
    case GgmlType::Q5_K: f(Fmt<GgmlType::Q5_K>{}); return true;
    case GgmlType::Q6_K: f(Fmt<GgmlType::Q6_K>{}); return true;
    case GgmlType::Q6_K_X8: f(Fmt<GgmlType::Q6_K_X8>{}); return true;
    case GgmlType::Q6_K_P: f(Fmt<GgmlType::Q6_K_P>{}); return true;
    case GgmlType::IQ4_NL: f(Fmt<GgmlType::IQ4_NL>{}); return true;
    case GgmlType::IQ4_XS: f(Fmt<GgmlType::IQ4_XS>{}); return true;
    case GgmlType::IQ2_XXS: f(Fmt<GgmlType::IQ2_XXS>{}); return true;
    case GgmlType::IQ2_XS: f(Fmt<GgmlType::IQ2_XS>{}); return true;
    case GgmlType::IQ2_S: f(Fmt<GgmlType::IQ2_S>{}); return true;
    case GgmlType::IQ3_XXS: f(Fmt<GgmlType::IQ3_XXS>{}); return true;
    case GgmlType::IQ3_S: f(Fmt<GgmlType::IQ3_S>{}); return true;
    case GgmlType::IQ1_S: f(Fmt<GgmlType::IQ1_S>{}); return true;
    case GgmlType::IQ1_M: f(Fmt<GgmlType::IQ1_M>{}); return true;
    default: return false;
  }
}

// The alignment A to instantiate for a block-aligned access pattern starting at `p` with rows of
// `row_bytes` (0 = a single row): the format's own alignment when both allow it, else 1 (byte loads).
template <typename F>
inline bool aligned_for(const void* p, int64_t row_bytes) {
  const uint64_t a = F::kAlign;
  return reinterpret_cast<uintptr_t>(p) % a == 0 && uint64_t(row_bytes) % a == 0;
}

// x values [c, c+8) of the f32 row xr. xvec: xr + c is 16-byte aligned (vector loads).
__device__ __forceinline__ void load_x8(const float* xr, int64_t c, bool xvec, float o[8]) {
  if (xvec) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(xr + c));
    const float4 b = __ldg(reinterpret_cast<const float4*>(xr + c) + 1);
    o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
  } else {
    for (int k = 0; k < 8; ++k) o[k] = __ldg(xr + c + k);
  }
}

// Warp sum (every lane gets the total).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp: sum_c W[c] * xr[c] over a row wr of `cols` values in format F (blk alignment A). Lane i takes
// units i, i+32, ... (coalesced); every lane returns the total.
template <typename F, int A>
__device__ __forceinline__ float warp_row_dot(const uint8_t* wr, int64_t cols, const float* xr, bool xvec) {
  const int lane = threadIdx.x & 31;
  constexpr int kUnits = F::kVals / 8;
  const int units = int(cols / F::kVals) * kUnits;
  float acc = 0.f;
#pragma unroll 2
  for (int u = lane; u < units; u += 32) {
    const int b = u / kUnits, i8 = u % kUnits;
    float v[8], xv[8];
    F::template deq8<A>(wr + int64_t(b) * F::kBytes, i8, v);
    load_x8(xr, int64_t(b) * F::kVals + 8 * i8, xvec, xv);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc = fmaf(v[k], xv[k], acc);
  }
  if constexpr (F::kFloat)
    for (int64_t c = int64_t(units) * 8 + lane; c < cols; c += 32) acc = fmaf(F::one(wr, c), __ldg(xr + c), acc);
  return warp_sum(acc);
}

}  // namespace strata::cuda::dq
