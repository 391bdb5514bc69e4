// Device helpers of the small ops (ops.cu, ops_route.cu, ops_sample.cu): warp and block reductions in a fixed
// order, and exp evaluated in double and rounded once (the CPU reference's glibc expf is within ~0.5 ulp of
// it, so both sides agree bit for bit almost always). Internal to those files.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace strata::cuda::ops::detail {

__device__ __forceinline__ float exp_cr(float x) { return static_cast<float>(exp(static_cast<double>(x))); }
__device__ __forceinline__ float round_f16(float x) { return __half2float(__float2half_rn(x)); }
__device__ __forceinline__ float h2f(uint16_t b) { return __half2float(__ushort_as_half(b)); }

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reduction, result in every thread. sh: [32] shared scratch. Call from all threads.
template <typename T, typename Op>
__device__ T block_reduce(T v, T* sh, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // sh may still be read by a previous call
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  T r = sh[0];
  for (int w = 1; w < n_warps; ++w) r = op(r, sh[w]);
  return r;
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

}  // namespace strata::cuda::ops::detail
