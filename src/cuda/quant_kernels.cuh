#pragma once
// Quantized matrix products and dequantization on the GPU (issue 7), declarations only.
// The plain CPU reference of each is the function of the same role in quant/ (matmul Exact mode,
// dequantize, cpu::get_rows); tests/cuda/test_quant_kernels.cu compares them on random data at real
// sizes and on the fixture zoo.
//
//   W: [rows][cols] in `type`, row-major as GGUF stores it (ne[0] = cols), rows contiguous, in device
//   memory.  x: [n][cols] f32,  y: [n][rows] f32, both device.
// Arithmetic: each weight is dequantized to f32 in registers (exactly as quant/dequant does) and
// multiplied with the unquantized f32 activation, accumulated in f32. So an F32 weight gives the exact
// mode, and a quantized one differs from the CPU exact mode only by summation order.
//
// Formats: has_kernel() says which types have a direct kernel. A weight of any other type is repacked at
// load into storage_type(t) (dequantized on the CPU, stored as F16: 16 bits per weight instead of the
// type's own; the loader prints which tensors and how many bytes that costs).
#include <cuda_runtime.h>

#include <cstdint>

#include "quant/types.h"

namespace strata::cuda {
class GemmContext;  // cuda/gemm_context.h
}

namespace strata::cuda::quant {

// True when `t` has direct GPU kernels (matmul, get_rows, dequantize). At least: F32, F16, BF16, Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS.
bool has_kernel(GgmlType t);
// The type a weight stored as `t` in the file is kept in on the GPU: t itself when it has a kernel,
// else F16.
GgmlType storage_type(GgmlType t);

// y[i][r] = sum_c W[r][c] * x[i][c] for i < n. Any n >= 1 (decode: n = 1..few; prefill: n up to the
// batch): tokens are processed in tiles so each weight row is read once per tile. Throws strata::Error
// for a type without a kernel or cols not a multiple of the block size.
// gemm: when given and n >= kGemmMinTokens (gemm_context.h), the product goes through the 16-bit +
// cuBLAS path instead (cuda::matmul_gemm: inputs rounded to bf16/f16, so not the arithmetic above);
// nullptr = always the kernels above.
// accumulate: y[i][r] += the sum instead (the same float addition as y + the product written apart; on
// the cuBLAS path, its beta = 1). Why: a layer's wo product adds into the residual stream without a
// separate add kernel (on decode's chain of dependent launches; in prefill a 4 MB read and write less).
void matmul(GgmlType type, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
            cudaStream_t stream, const GemmContext* gemm = nullptr, bool accumulate = false);
// Whether matmul with this gemm context takes the cuBLAS path for n tokens.
bool takes_gemm(const GemmContext* gemm, int64_t n);

// dst[i][:] = row ids[i] of W dequantized to f32 (embedding lookup). ids: [n] device int32, each in
// [0, rows) (checked by the caller). dst: [n][cols] device.
void get_rows(GgmlType type, const void* w, int64_t cols, const int32_t* ids, int64_t n, float* dst,
              cudaStream_t stream);

// dst[0..n_values) = W dequantized (n_values a multiple of the block size). Bit-identical to
// strata::dequantize on the CPU.
void dequantize(GgmlType type, const void* w, int64_t n_values, float* dst, cudaStream_t stream);

// Benchmarks only: when on, matmul and the MoE kernels skip the fast decode path (fast_dot.cuh) and use
// the generic per-8-values kernels, so a benchmark can report the fast path against the previous one in
// the same process. Default off. Not for concurrent use with running launches from other threads.
void set_generic_only(bool on);
bool generic_only();

}  // namespace strata::cuda::quant
