#pragma once
// f32 -> 16-bit floats (round to nearest even) on the device, for the products that take 16-bit inputs:
// the cuBLAS path (gemm.cu, x and the weight tiles) and the grouped experts (moe_grouped.cu, x once a layer).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

// dst[i] = T(x[i]) for i < count, enqueued on `stream`. dst: 16-byte aligned; x: any alignment (16-byte
// aligned: 8 values a thread with one 16-byte store). T: __half or __nv_bfloat16 (gemm.cu instantiates both).
template <typename T>
void convert16(const float* x, int64_t count, T* dst, cudaStream_t stream);

}  // namespace strata::cuda
