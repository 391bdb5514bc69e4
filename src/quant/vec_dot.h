#pragma once
// Fast-mode row kernels: the dot product of one quantized weight row with one activation row that was
// quantized once per matmul call (like ggml). Three implementations of the same integer math: scalar
// (portable reference), AVX2 and AVX-512 (VNNI); matmul.cpp picks one per type at run time.
//
// Activation formats (why: an integer weight format is multiplied in 8-bit integers, and the per-block
// float scales are applied once per block instead of once per value):
//   Q8_32 - blocks of 32 int8 with a float scale d and the integer sum of the 32 values, for the
//           32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL); the sum serves the formats with a
//           min (Q4_1, Q5_1) and the kernels that take unsigned weights and subtract the offset later.
//   Q8_K  - blocks of 256 int8 with a float scale and 16 sums of 16 values (ggml's block_q8_K), for the
//           K-quants and the 256-value IQ formats.
//   F32   - unquantized activations, for F32/F16/BF16 weights.
#include <cstdint>

#include "cpu/cpu_features.h"
#include "quant/blocks.h"
#include "quant/types.h"

namespace strata::q {

enum class ActType { F32, Q8_32, Q8_K };

struct BlockQ8A {
  float d;        // scale
  int32_t sum;    // sum(qs)
  int8_t qs[32];  // [32]
};
static_assert(sizeof(BlockQ8A) == 40);

// x: [n] f32 -> y: [n / 32] (n a multiple of 32). Round to nearest, |q| <= 127.
void quantize_act_q8_32(const float* x, BlockQ8A* y, int64_t n);
// x: [n] f32 -> y: [n / 256] (n a multiple of 256), ggml's Q8_K rule (d = max / -127).
void quantize_act_q8_k(const float* x, BlockQ8_K* y, int64_t n);
// The same bytes with AVX2 (needs an AVX2 CPU; quantize_act_row picks it at that level).
void quantize_act_q8_k_avx2(const float* x, BlockQ8_K* y, int64_t n);

// Bytes of one activation row of n values in `act` format.
int64_t act_row_bytes(ActType act, int64_t n);
// Quantizes one activation row into `dst` (act_row_bytes(act, n) bytes; F32 copies).
void quantize_act_row(ActType act, const float* x, void* dst, int64_t n);
// As quantize_act_row for passes == 1; passes == 2 (FastPrecise) also writes, right after the first
// row (at dst + act_row_bytes(act, n)), the first rounding's residual x - q * d quantized with its own
// scales: 2 * act_row_bytes(act, n) bytes. matmul_many and the fused MoE decode path both use this,
// so their quantized activations are the same bytes.
void quantize_act_row_passes(ActType act, const float* x, void* dst, int64_t n, int passes);

// w: one row of n values in the weight type; xq: one activation row in the kernel's ActType.
using VecDotFn = float (*)(int64_t n, const void* w, const void* xq);

// One weight row against 4 activation rows at xq + t * xq_stride bytes: out[t * out_stride], t < 4.
// Bit-identical to 4 calls of the same level's VecDotFn (the weights are just decoded once).
using VecDot4Fn = void (*)(int64_t n, const void* w, const void* xq, int64_t xq_stride, float* out,
                           int64_t out_stride);

// Two weight rows of the same type (w0, w1) against one activation row: out[0], out[1]. Bit-identical to
// 2 calls of the same level's VecDotFn (the activations are just loaded once): a decode's gate and up rows.
using VecDot2Fn = void (*)(int64_t n, const void* w0, const void* w1, const void* xq, float* out);

struct DotKernel {
  VecDotFn fn = nullptr;  // nullptr: the type has no integer kernel (matmul dequantizes instead)
  VecDot4Fn fn4 = nullptr;  // nullptr: no 4-token kernel at this level (matmul calls fn per token)
  VecDot2Fn fn2 = nullptr;  // nullptr: no two-row kernel at this level (call fn per row)
  ActType act = ActType::F32;
  CpuLevel level = CpuLevel::Scalar;  // the level this kernel was written for (may be below the asked one)
};

// The best kernel for `type` at most at `level` (a type without an AVX-512 kernel gets the AVX2 one, ...).
DotKernel dot_kernel(GgmlType type, CpuLevel level);

// Per-level tables (nullptr where that level has no kernel for the type); act type is per weight type.
VecDotFn vec_dot_scalar(GgmlType type);
VecDotFn vec_dot_avx2(GgmlType type);
VecDotFn vec_dot_avx512(GgmlType type);
VecDot4Fn vec_dot4_avx2(GgmlType type);
VecDot4Fn vec_dot4_avx512(GgmlType type);
VecDot2Fn vec_dot2_avx2(GgmlType type);
VecDot2Fn vec_dot2_avx512(GgmlType type);
ActType act_type_for(GgmlType type);

}  // namespace strata::q
