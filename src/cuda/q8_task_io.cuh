#pragma once
// The int8-activation kernels' loads and byte helpers (private to src/cuda: q8_formats.cuh and the q8
// kernels): dp4a and byte-wise subtracts with host twins, weight words by alignment (ldw), the warp copies
// that stage 2-byte aligned rows in shared memory, int8 activation loads, and the IQ4 table lookup.
// Everything is __host__ __device__ with the same integer results on the host, so that a CPU test runs the
// format tasks without a GPU (tests/cuda/test_q8_host.cu).
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cuda/dequant_device.cuh"
#include "cuda/fast_dot.cuh"

namespace strata::cuda::q8d {

// __dp4a / __vsubss4 on the device; the same integer results on the host (so a CPU test can run the
// tasks: tests/cuda/test_q8_host.cu).
__host__ __device__ __forceinline__ int dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(a, b, c);
#else
  for (int k = 0; k < 4; ++k) c += int(int8_t(uint32_t(a) >> (8 * k))) * int(int8_t(uint32_t(b) >> (8 * k)));
  return c;
#endif
}
// Bytes of w (each in [0, 63]) minus 32, as signed bytes.
__host__ __device__ __forceinline__ int sub32(uint32_t w) {
#ifdef __CUDA_ARCH__
  return int(__vsubss4(w, 0x20202020u));
#else
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= (uint32_t(uint8_t(int((w >> (8 * k)) & 0xFF) - 32))) << (8 * k);
  return int(r);
#endif
}

// Bytes of w (each in [0, 7]) minus 4, byte by byte, as signed bytes (Q3_K's 3-bit codes c -> c - 4).
__host__ __device__ __forceinline__ int sub4(uint32_t w) {
#ifdef __CUDA_ARCH__
  return int(__vsubss4(w, 0x04040404u));
#else
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= (uint32_t(uint8_t(int((w >> (8 * k)) & 0xFF) - 4))) << (8 * k);
  return int(r);
#endif
}

// __byte_perm(x, y, s) for selectors whose nibbles are < 8 (the only ones used here): byte k of the result
// is byte (s >> 4k) & 7 of the 8 bytes {y:x} (x = bytes 0..3). The host twin lets a CPU test run iq4nl4.
__host__ __device__ __forceinline__ uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (uint64_t(y) << 32) | x;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= uint32_t((v >> (8 * ((s >> (4 * k)) & 7))) & 0xFF) << (8 * k);
  return r;
#endif
}

// Four IQ4 indices (bytes of n, each in [0, 15]) -> their kvalues_iq4nl entries as four int8 bytes (the
// dp4a operand). Why byte_perm: the table stays in 4 registers; a lookup in memory would serialize a warp's
// different addresses. Bits 0-2 of each index pick the byte in the lower or the upper half of the table,
// bit 3 picks the half. Table words as dq::iq4nl_value's.
__host__ __device__ __forceinline__ int iq4nl4(uint32_t n) {
  const uint32_t m = n & 0x07070707u, y = m | (m >> 4);     // bytes 0 and 2: two 3-bit indices each
  const uint32_t sel = (y & 0xFFu) | ((y >> 8) & 0xFF00u);  // the four indices as selector nibbles
  const uint32_t lo = byte_perm(0xBFAD9881u, 0xF6EADDCFu, sel), hi = byte_perm(0x26190D01u, 0x71594535u, sel);
  const uint32_t upper = ((n >> 3) & 0x01010101u) * 0xFFu;  // bytes whose index is >= 8
  return int((lo & ~upper) | (hi & upper));
}

// A value for weights staged in shared memory (2-byte aligned rows copied by warp_copy): words are read
// with 4-byte loads from the 4-byte aligned address at or below p and joined by funnel shifts (why: one
// load per word instead of two 16-bit loads). Reads up to 2 bytes before and 4 after [p, p + 4N): the
// staging buffers leave room for that (kStagePad).
constexpr int kStaged = 3;
constexpr int kStagePad = 16;  // bytes before each staged row region (after: see stage_stride)

__host__ __device__ __forceinline__ uint32_t funnel16(uint32_t lo, uint32_t hi, unsigned sh) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(lo, hi, sh);
#else
  return uint32_t(((uint64_t(hi) << 32) | lo) >> sh);
#endif
}

// N words (bytes 4i..4i+3 little-endian in w[i]) at p, p aligned to A (16 / 8: 16 / 8-byte vector loads;
// 4: 4-byte loads; 2: two 16-bit loads per word; kStaged: see above).
template <int A, int N>
__host__ __device__ __forceinline__ void ldw(const uint8_t* p, uint32_t w[N]) {
  if constexpr (A == kStaged) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint8_t* b = p - (a & 3);  // (pointer arithmetic keeps the shared-memory address space known)
    const unsigned sh = unsigned(a & 3) * 8;  // 0 or 16
    uint32_t prev = dq::ld32<4>(b);
STRATA_FD_UNROLL
    for (int i = 0; i < N; ++i) {
      const uint32_t next = dq::ld32<4>(b + 4 * (i + 1));
      w[i] = funnel16(prev, next, sh);
      prev = next;
    }
    return;
  }
#ifndef __CUDA_ARCH__
  std::memcpy(w, p, 4 * N);  // host (tests): any alignment
#else
  if constexpr (A >= 16) {
    static_assert(N % 4 == 0);
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else if constexpr (A == 8 && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const uint2 v = reinterpret_cast<const uint2*>(p)[i];
      w[2 * i] = v.x, w[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = dq::ld32<A>(p + 4 * i);
  }
#endif
}

// One warp (lane of 32; on the host a loop over lanes) copies `bytes` (even) from src to dst, both 2-byte
// aligned with dst = src (mod 16): 16-bit copies up to the first 16-byte boundary and after the last one,
// 16-byte copies between, the i-th of them by copy16(dst + h, src + h, i), both 16-byte aligned (why: the
// copy of a row is coalesced, whatever the row's alignment). warp_copy copies them in place; q8_moe.cu's
// down kernel issues them as asynchronous copies. The caller syncs the warp before reading dst.
template <typename Copy16>
__host__ __device__ __forceinline__ void warp_copy_with(uint8_t* dst, const uint8_t* src, int64_t bytes, int lane,
                                                        Copy16 copy16) {
  const int64_t head = (16 - int64_t(reinterpret_cast<uintptr_t>(src) & 15)) & 15;
  const int64_t h = head < bytes ? head : bytes;
  for (int64_t i = 2 * lane; i < h; i += 64)
    *reinterpret_cast<uint16_t*>(dst + i) = *reinterpret_cast<const uint16_t*>(src + i);
  const int64_t n16 = (bytes - h) / 16;
  for (int64_t i = lane; i < n16; i += 32) copy16(dst + h, src + h, i);
  for (int64_t i = h + 16 * n16 + 2 * lane; i < bytes; i += 64)
    *reinterpret_cast<uint16_t*>(dst + i) = *reinterpret_cast<const uint16_t*>(src + i);
}

struct Copy16InPlace {
  __host__ __device__ __forceinline__ void operator()(uint8_t* dst, const uint8_t* src, int64_t i) const {
    reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  }
};

__host__ __device__ __forceinline__ void warp_copy(uint8_t* dst, const uint8_t* src, int64_t bytes, int lane) {
  warp_copy_with(dst, src, bytes, lane, Copy16InPlace{});
}

// warp_copy_with's 16-byte copies as asynchronous copies (cp.async; the caller commits and waits: the
// staged down rows of q8_moe_down.cu, the tensor-core kernels' weight tiles (q8_mma_common.cuh stage_rows),
// matvec's staged rows with async_stage (q8_matvec.cuh)).
struct Copy16Async {
  __device__ __forceinline__ void operator()(uint8_t* dst, const uint8_t* src, int64_t i) const {
    __pipeline_memcpy_async(dst + 16 * i, src + 16 * i, 16);
  }
};

// Bytes of one staged region for `bytes` bytes of rows: the front pad, up to 15 bytes of offset (dst =
// src mod 16), the rows, 4 bytes of funnel over-read, rounded up to 16.
__host__ __device__ constexpr int64_t stage_stride(int64_t bytes) { return (kStagePad + 15 + bytes + 4 + 15) / 16 * 16; }

// Where warp_copy puts src inside a region starting at `region` (16-byte aligned).
__host__ __device__ __forceinline__ uint8_t* stage_dst(uint8_t* region, const uint8_t* src) {
  return region + kStagePad + (reinterpret_cast<uintptr_t>(src) & 15);
}

// 32 int8 activations (one block) as 8 words; p is 16-byte aligned (rows of q are, blocks are 32 bytes).
__host__ __device__ __forceinline__ void ldx32(const int8_t* p, int x[8]) {
#ifdef __CUDA_ARCH__
  const int4 a = reinterpret_cast<const int4*>(p)[0], b = reinterpret_cast<const int4*>(p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
#else
  std::memcpy(x, p, 32);
#endif
}

constexpr uint32_t kLo4 = 0x0F0F0F0Fu;

// dp4a sums of 32 values (8 words of weight bytes v against 8 activation words x): all of them (dot32), or
// per 16-value half (dot_halves: words 0-3 into lo, 4-7 into hi; formats with 16-value scales).
__host__ __device__ __forceinline__ int dot32(const int v[8], const int x[8]) {
  int s = 0;
STRATA_FD_UNROLL
  for (int i = 0; i < 8; ++i) s = dp4a(v[i], x[i], s);
  return s;
}
__host__ __device__ __forceinline__ void dot_halves(const int v[8], const int x[8], int& lo, int& hi) {
  lo = 0, hi = 0;
STRATA_FD_UNROLL
  for (int i = 0; i < 4; ++i) lo = dp4a(v[i], x[i], lo), hi = dp4a(v[4 + i], x[4 + i], hi);
}

// Sum of the int8 activations of N words (dp4a against ones).
template <int N>
__host__ __device__ __forceinline__ int xsum(const int x[N]) {
  int s = 0;
STRATA_FD_UNROLL
  for (int i = 0; i < N; ++i) s = dp4a(0x01010101, x[i], s);
  return s;
}

}  // namespace strata::cuda::q8d
