#pragma once
// Fast dot products for decode (private to src/cuda: quant_kernels.cu, moe_kernels.cu) for the formats
// that carry MoE decode: Q4_K, Q5_K, Q6_K (and its regrouped Q6_K_X8, padded Q6_K_P), Q4_0 (and its regrouped
// Q4_0_X8), Q8_0. Every other format keeps the generic unit-of-8 path of dequant_device.cuh. __host__ __device__ so a
// CPU test checks the layouts without a GPU (tests/cuda/test_fast_dot_host.cu).
//
// Why a second path: the generic one decodes 8 values per lane step with the block's scales re-read and
// re-converted per 8 values and one int->float conversion (I2F, quarter rate on sm_90) per weight; at HBM
// speed a Q4_K matvec must consume ~30 weights per clock per SM, so conversions alone capped it near 50% of
// the roofline, before the scale work. Here:
//   * a lane owns a "chunk" of 32 values of one block, read with wide loads (16 bytes for Q4_K/Q5_K, the
//     whole block for Q4_0/Q8_0), and decodes the chunk's scales once;
//   * quants become exact floats without I2F: a byte permute builds 2^23 + q (float bits 0x4B0000qq) and
//     one exact subtraction removes 2^23 (+ the format's offset);
//   * the scale is factored out of each scale group: acc += d * sum(q*x) (- m * sum(x) for the formats
//     with a min). Only the rounding of the sums changes (the CPU exact mode dequantizes each value):
//     the GPU tests bound it by 1e-5 of sum|w*x| per output.
//   * R weight rows share each x load (x is read R times less from L1), NT tokens share each weight load.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cuda/dequant_device.cuh"
#include "quant/types.h"

// Loops over compile-time counts are unrolled on the device (the host compiler does not know the pragma).
#ifdef __CUDA_ARCH__
#define STRATA_FD_UNROLL _Pragma("unroll")
#else
#define STRATA_FD_UNROLL
#endif

namespace strata::cuda::fd {

constexpr float kMagic = 8388608.f;  // 2^23: float bits 0x4B000000 | b is exactly 2^23 + b for b < 2^23

// Byte k (compile-time after unrolling) of w as the exact float 2^23 + byte: one PRMT on the device.
__host__ __device__ __forceinline__ float magic_byte(uint32_t w, int k) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | unsigned(k)));
#else
  return dq::bits_to_float(0x4B000000u | ((w >> (8 * k)) & 0xFF));
#endif
}

// 16 bytes at a 16-byte aligned p.
__host__ __device__ __forceinline__ void ld128(const uint8_t* p, uint32_t q[4]) {
#ifdef __CUDA_ARCH__
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
#else
  std::memcpy(q, p, 16);
#endif
}

// Byte i (0..11) of three little-endian words.
__host__ __device__ __forceinline__ uint32_t byte12(const uint32_t s[3], int i) {
  const uint32_t w = i < 4 ? s[0] : (i < 8 ? s[1] : s[2]);
  return (w >> (8 * (i & 3))) & 0xFF;
}
// q::k4_scale_min on the 12 scale bytes held as words.
__host__ __device__ __forceinline__ void k4_scale_min_w(int j, const uint32_t s[3], int& sc, int& m) {
  if (j < 4) {
    sc = int(byte12(s, j) & 63);
    m = int(byte12(s, j + 4) & 63);
  } else {
    sc = int((byte12(s, j + 4) & 0xF) | ((byte12(s, j & 3) >> 6) << 4));
    m = int((byte12(s, j + 4) >> 4) | ((byte12(s, j) >> 6) << 4));
  }
}

// 8 values of one group from two words of 4 codes each, minus `off` (all exact).
__host__ __device__ __forceinline__ void codes8(uint32_t w0, uint32_t w1, float off, float v[8]) {
STRATA_FD_UNROLL
  for (int k = 0; k < 4; ++k) v[k] = magic_byte(w0, k) - off, v[4 + k] = magic_byte(w1, k) - off;
}

// Each format: kVals/kBytes as the block; kAlign: the alignment its loads need (block starts must have
// it); kChunks chunks of 32 values per block; a chunk has 4 groups of 8 consecutive columns (col(ch, g):
// first column of group g inside the block) and kParts scale groups (group g is in part g / (4 / kParts));
// load() reads a chunk, q8() gives a group's integer codes as floats, finish() adds a part's sum.
struct FQ4K {  // d, dmin f16 | scales[12] | qs[128]; chunk (g2, h): 16 qs bytes = sub-blocks 2*g2, 2*g2+1
  static constexpr int kVals = 256, kBytes = 144, kAlign = 16, kChunks = 8, kParts = 2;
  static constexpr bool kNeedSum = true;
  struct Chunk {
    uint32_t q[4];
    float d[2], m[2];
  };
  __host__ __device__ static void load(const uint8_t* b, int ch, Chunk& c) {
    const int g2 = ch >> 1, h = ch & 1;
    ld128(b + 16 + 32 * g2 + 16 * h, c.q);
    const uint32_t dd = dq::ld32<4>(b);
    const float d = dq::h2f(dd & 0xFFFF), dmin = dq::h2f(dd >> 16);
    const uint32_t s[3] = {dq::ld32<4>(b + 4), dq::ld32<4>(b + 8), dq::ld32<4>(b + 12)};
STRATA_FD_UNROLL
    for (int jj = 0; jj < 2; ++jj) {
      int sc, m;
      k4_scale_min_w(2 * g2 + jj, s, sc, m);
      c.d[jj] = dq::fmul(d, float(sc)), c.m[jj] = dq::fmul(dmin, float(m));
    }
  }
  __host__ __device__ static int col(int ch, int g) { return 64 * (ch >> 1) + 32 * (g >> 1) + 16 * (ch & 1) + 8 * (g & 1); }
  __host__ __device__ static void q8(const Chunk& c, int g, float v[8]) {
    const int sh = 4 * (g >> 1), w = 2 * (g & 1);
    codes8((c.q[w] >> sh) & 0x0F0F0F0Fu, (c.q[w + 1] >> sh) & 0x0F0F0F0Fu, kMagic, v);
  }
  __host__ __device__ static float finish(const Chunk& c, int p, float s, float sx, float acc) {
    return fmaf(-c.m[p], sx, fmaf(c.d[p], s, acc));
  }
  // Value with code q in part p, as quant/dequant computes it (tests: the chunk layout, bit for bit).
  __host__ __device__ static float deq(const Chunk& c, int p, float q) { return dq::fsub(dq::fmul(c.d[p], q), c.m[p]); }
};

struct FQ5K {  // d, dmin f16 | scales[12] | qh[32] | qs[128]; chunks as Q4_K plus the 5th bits
  static constexpr int kVals = 256, kBytes = 176, kAlign = 16, kChunks = 8, kParts = 2;
  static constexpr bool kNeedSum = true;
  struct Chunk {
    uint32_t q[4], h[4];
    int j0;  // first sub-block of the chunk
    float d[2], m[2];
  };
  __host__ __device__ static void load(const uint8_t* b, int ch, Chunk& c) {
    const int g2 = ch >> 1, h = ch & 1;
    ld128(b + 48 + 32 * g2 + 16 * h, c.q);
    ld128(b + 16 + 16 * h, c.h);
    c.j0 = 2 * g2;
    const uint32_t dd = dq::ld32<4>(b);
    const float d = dq::h2f(dd & 0xFFFF), dmin = dq::h2f(dd >> 16);
    const uint32_t s[3] = {dq::ld32<4>(b + 4), dq::ld32<4>(b + 8), dq::ld32<4>(b + 12)};
STRATA_FD_UNROLL
    for (int jj = 0; jj < 2; ++jj) {
      int sc, m;
      k4_scale_min_w(2 * g2 + jj, s, sc, m);
      c.d[jj] = dq::fmul(d, float(sc)), c.m[jj] = dq::fmul(dmin, float(m));
    }
  }
  __host__ __device__ static int col(int ch, int g) { return FQ4K::col(ch, g); }
  __host__ __device__ static void q8(const Chunk& c, int g, float v[8]) {
    const int sh = 4 * (g >> 1), w = 2 * (g & 1), j = c.j0 + (g >> 1);
    const uint32_t lo = ((c.q[w] >> sh) & 0x0F0F0F0Fu) | (((c.h[w] >> j) & 0x01010101u) << 4);
    const uint32_t hi = ((c.q[w + 1] >> sh) & 0x0F0F0F0Fu) | (((c.h[w + 1] >> j) & 0x01010101u) << 4);
    codes8(lo, hi, kMagic, v);
  }
  __host__ __device__ static float finish(const Chunk& c, int p, float s, float sx, float acc) {
    return fmaf(-c.m[p], sx, fmaf(c.d[p], s, acc));
  }
  // Value with code q in part p, as quant/dequant computes it (tests: the chunk layout, bit for bit).
  __host__ __device__ static float deq(const Chunk& c, int p, float q) { return dq::fsub(dq::fmul(c.d[p], q), c.m[p]); }
};

struct FQ6K {  // ql[128] | qh[64] | scales[16] int8 | d f16; chunk (half, l0 = 8i): columns l0.. of 4 quarters
  static constexpr int kVals = 256, kBytes = 210, kAlign = 2, kChunks = 8, kParts = 4;
  static constexpr bool kNeedSum = false;
  struct Chunk {
    uint32_t a[2], b[2], h[2];
    float s[4];
  };
  __host__ __device__ static void load(const uint8_t* blk, int ch, Chunk& c) {
    body<2>(blk, dq::ld16<2>(blk + 208), ch, c);
  }
  // Chunk ch of the block whose ql | qh | scales start at blk (aligned to A) and whose f16 scale is d_bits.
  template <int A>
  __host__ __device__ static void body(const uint8_t* blk, uint32_t d_bits, int ch, Chunk& c) {
    const int half = ch >> 2, l0 = 8 * (ch & 3);
    dq::ld64<A>(blk + 64 * half + l0, c.a);
    dq::ld64<A>(blk + 64 * half + 32 + l0, c.b);
    dq::ld64<A>(blk + 128 + 32 * half + l0, c.h);
    const float d = dq::h2f(d_bits);
    const uint8_t* sc = blk + 192 + 8 * half + (l0 >> 4);
STRATA_FD_UNROLL
    for (int q = 0; q < 4; ++q) c.s[q] = dq::fmul(d, float(int(int8_t(sc[2 * q]))));
  }
  __host__ __device__ static int col(int ch, int g) { return 128 * (ch >> 2) + 32 * g + 8 * (ch & 3); }
  __host__ __device__ static void q8(const Chunk& c, int g, float v[8]) {
    const uint32_t* ql = (g & 1) ? c.b : c.a;
    const int lsh = 4 * (g >> 1), hsh = 2 * g;
    const uint32_t w0 = ((ql[0] >> lsh) & 0x0F0F0F0Fu) | (((c.h[0] >> hsh) & 0x03030303u) << 4);
    const uint32_t w1 = ((ql[1] >> lsh) & 0x0F0F0F0Fu) | (((c.h[1] >> hsh) & 0x03030303u) << 4);
    codes8(w0, w1, kMagic + 32.f, v);
  }
  __host__ __device__ static float finish(const Chunk& c, int p, float s, float, float acc) { return fmaf(c.s[p], s, acc); }
  __host__ __device__ static float deq(const Chunk& c, int p, float q) { return dq::fmul(c.s[p], q); }
};

// Q6_K regrouped (quant/q6_k_x8.h): chunk ch = chunk ch % 8 of super-block ch / 8, its codes 8-byte loads.
// FQ6K's arithmetic on the same values in the same chunk order: the same sums bit for bit.
struct FQ6KX8 : FQ6K {
  static constexpr int kVals = 2048, kBytes = 1680, kAlign = 16, kChunks = 64;
  __host__ __device__ static void load(const uint8_t* b, int ch, Chunk& c) {
    const int sb = ch >> 3;
    FQ6K::body<8>(b + 16 + 208 * sb, dq::ld16<2>(b + 2 * sb), ch & 7, c);
  }
  __host__ __device__ static int col(int ch, int g) { return 256 * (ch >> 3) + FQ6K::col(ch & 7, g); }
};

// Q6_K padded (quant/q6_k_p.h): FQ6K's chunks of the Q6_K block at the start of each 224 bytes, 8-byte loads.
struct FQ6KP : FQ6K {
  static constexpr int kBytes = 224, kAlign = 16;
  __host__ __device__ static void load(const uint8_t* b, int ch, Chunk& c) {
    FQ6K::body<8>(b, dq::ld16<2>(b + 208), ch, c);
  }
};

struct FQ40 {  // d f16 | qs[16]; one chunk = the block (low nibbles: columns 0..15, high: 16..31)
  static constexpr int kVals = 32, kBytes = 18, kAlign = 2, kChunks = 1, kParts = 1;
  static constexpr bool kNeedSum = false;
  struct Chunk {
    uint32_t q[4];
    float d;
  };
  __host__ __device__ static void load(const uint8_t* b, int, Chunk& c) {
    c.d = dq::h2f(dq::ld16<2>(b));
STRATA_FD_UNROLL
    for (int i = 0; i < 4; ++i) c.q[i] = dq::ld32<2>(b + 2 + 4 * i);
  }
  __host__ __device__ static int col(int, int g) { return 8 * g; }
  __host__ __device__ static void q8(const Chunk& c, int g, float v[8]) {
    const int sh = 4 * (g >> 1), w = 2 * (g & 1);
    codes8((c.q[w] >> sh) & 0x0F0F0F0Fu, (c.q[w + 1] >> sh) & 0x0F0F0F0Fu, kMagic + 8.f, v);
  }
  __host__ __device__ static float finish(const Chunk& c, int, float s, float, float acc) { return fmaf(c.d, s, acc); }
  __host__ __device__ static float deq(const Chunk& c, int, float q) { return dq::fmul(q, c.d); }
};

// Q4_0 regrouped (quant/q4_0_x8.h): chunk ch = Q4_0 block ch of the group, its codes one aligned 16-byte
// load. FQ40's arithmetic on the same values in the same chunk order: the same sums bit for bit.
// (FQ40's Chunk, q8, finish and deq, inherited.)
struct FQ40X8 : FQ40 {
  static constexpr int kVals = 256, kBytes = 144, kAlign = 16, kChunks = 8;
  __host__ __device__ static void load(const uint8_t* b, int ch, Chunk& c) {
    c.d = dq::h2f(dq::ld16<2>(b + 2 * ch));
    ld128(b + 16 + 16 * ch, c.q);
  }
  __host__ __device__ static int col(int ch, int g) { return 32 * ch + 8 * g; }
};

struct FQ80 {  // d f16 | qs[32] int8; one chunk = the block
  static constexpr int kVals = 32, kBytes = 34, kAlign = 2, kChunks = 1, kParts = 1;
  static constexpr bool kNeedSum = false;
  struct Chunk {
    uint32_t q[8];  // bytes ^ 0x80: q + 128 as unsigned
    float d;
  };
  __host__ __device__ static void load(const uint8_t* b, int, Chunk& c) {
    c.d = dq::h2f(dq::ld16<2>(b));
STRATA_FD_UNROLL
    for (int i = 0; i < 8; ++i) c.q[i] = dq::ld32<2>(b + 2 + 4 * i) ^ 0x80808080u;
  }
  __host__ __device__ static int col(int, int g) { return 8 * g; }
  __host__ __device__ static void q8(const Chunk& c, int g, float v[8]) { codes8(c.q[2 * g], c.q[2 * g + 1], kMagic + 128.f, v); }
  __host__ __device__ static float finish(const Chunk& c, int, float s, float, float acc) { return fmaf(c.d, s, acc); }
  __host__ __device__ static float deq(const Chunk& c, int, float q) { return dq::fmul(q, c.d); }
};

// Calls f(K{}) for the types with a fast path; false for any other.
template <typename Fn>
bool dispatch(GgmlType t, Fn&& f) {
  switch (t) {
    case GgmlType::Q4_K: f(FQ4K{}); return true;
    case GgmlType::Q5_K: f(FQ5K{}); return true;
    case GgmlType::Q6_K: f(FQ6K{}); return true;
    case GgmlType::Q6_K_X8: f(FQ6KX8{}); return true;
    case GgmlType::Q6_K_P: f(FQ6KP{}); return true;
    case GgmlType::Q4_0: f(FQ40{}); return true;
    case GgmlType::Q4_0_X8: f(FQ40X8{}); return true;
    case GgmlType::Q8_0: f(FQ80{}); return true;
    default: return false;
  }
}

// Every row start (p + i * row_bytes) has K's alignment: the fast path may run.
template <typename K>
inline bool rows_aligned(const void* p, int64_t row_bytes) {
  return reinterpret_cast<uintptr_t>(p) % K::kAlign == 0 && uint64_t(row_bytes) % K::kAlign == 0;
}

// x values [0, 8) at p; xvec: p is 16-byte aligned.
__host__ __device__ __forceinline__ void ldx8(const float* p, bool xvec, float o[8]) {
#ifdef __CUDA_ARCH__
  dq::load_x8(p, 0, xvec, o);
#else
  (void)xvec;
  std::memcpy(o, p, 32);
#endif
}

// One chunk `ch` of R weight blocks blk[r] (same columns) against NT token rows of x: acc[r][t] +=
// sum over the chunk's 32 columns of W_r * x_t. xb: the block's first column of token 0; xstride: floats
// between tokens; nt <= NT live tokens.
template <typename K, int R, int NT>
__host__ __device__ __forceinline__ void chunk_dot(const uint8_t* const blk[R], int ch, const float* xb,
                                                   int64_t xstride, int nt, bool xvec, float acc[R][NT]) {
  typename K::Chunk c[R];
STRATA_FD_UNROLL
  for (int r = 0; r < R; ++r) K::load(blk[r], ch, c[r]);
  constexpr int kGpp = 4 / K::kParts;
STRATA_FD_UNROLL
  for (int p = 0; p < K::kParts; ++p) {
    float s[R][NT], sx[NT];
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      sx[t] = 0.f;
STRATA_FD_UNROLL
      for (int r = 0; r < R; ++r) s[r][t] = 0.f;
    }
STRATA_FD_UNROLL
    for (int gi = 0; gi < kGpp; ++gi) {
      const int g = p * kGpp + gi;
      float qv[R][8];
STRATA_FD_UNROLL
      for (int r = 0; r < R; ++r) K::q8(c[r], g, qv[r]);
      const int col = K::col(ch, g);
STRATA_FD_UNROLL
      for (int t = 0; t < NT; ++t) {
        if (t < nt) {
          float xv[8];
          ldx8(xb + t * xstride + col, xvec, xv);
STRATA_FD_UNROLL
          for (int k = 0; k < 8; ++k) {
            if constexpr (K::kNeedSum) sx[t] += xv[k];
STRATA_FD_UNROLL
            for (int r = 0; r < R; ++r) s[r][t] = fmaf(qv[r][k], xv[k], s[r][t]);
          }
        }
      }
    }
STRATA_FD_UNROLL
    for (int r = 0; r < R; ++r)
STRATA_FD_UNROLL
      for (int t = 0; t < NT; ++t) acc[r][t] = K::finish(c[r], p, s[r][t], sx[t], acc[r][t]);
  }
}

// Host/one-thread reference of the fast path's arithmetic for one row (tests): the chunks in lane order
// summed sequentially (the device sums them over 32 lanes, then a tree).
template <typename K>
inline float row_dot_serial(const uint8_t* row, int64_t cols, const float* x) {
  float acc[1][1] = {{0.f}};
  const int64_t chunks = cols / K::kVals * K::kChunks;
  for (int64_t c = 0; c < chunks; ++c) {
    const uint8_t* blk[1] = {row + (c / K::kChunks) * K::kBytes};
    chunk_dot<K, 1, 1>(blk, int(c % K::kChunks), x + (c / K::kChunks) * K::kVals, 0, 1, false, acc);
  }
  return acc[0][0];
}

}  // namespace strata::cuda::fd
