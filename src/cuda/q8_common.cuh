#pragma once
// Device helpers shared by q8_kernels.cu and q8_moe.cu (private to src/cuda).
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda::q8c {

// One warp quantizes 32 * DPL consecutive values, lane l holding values DPL*l .. DPL*l + DPL - 1 (32-value
// block b is lanes b*32/DPL .. of the warp), each block as q8ref::quantize_block: d = amax / 127,
// q = roundf(v / d) clamped to [-127, 127] (ties away from zero; 0 when d == 0), ds = {d, d * sum q}.
// Bit-identical to it for any DPL (max, IEEE division, roundf and an integer sum do not depend on the
// order; amax starts from a value, so an all-NaN block gives NaN as there). q: [32 * DPL], ds: [DPL].
// Why DPL > 1: a kernel whose lanes hold a row's values in runs of DPL (the attention tile kernel's
// output) quantizes without regrouping through shared memory.
template <int DPL>
__device__ __forceinline__ void quantize_lanes(const float (&v)[DPL], int8_t* q, float2* ds) {
  static_assert(DPL == 1 || DPL == 2 || DPL == 4 || DPL == 8, "quantize_lanes: 1, 2, 4 or 8 values a lane");
  constexpr int LG = 32 / DPL;  // lanes per 32-value block
  const int lane = threadIdx.x & 31;
  float amax = fabsf(v[0]);
#pragma unroll
  for (int j = 1; j < DPL; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
  for (int o = LG / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.f;
  int qi[DPL], s = 0;
#pragma unroll
  for (int j = 0; j < DPL; ++j) {
    qi[j] = d > 0.f ? max(-127, min(127, int(roundf(v[j] / d)))) : 0;
    s += qi[j];
  }
#pragma unroll
  for (int o = LG / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
#pragma unroll
  for (int j = 0; j < DPL; ++j) q[DPL * lane + j] = int8_t(qi[j]);
  if (lane % LG == 0) ds[lane / LG] = make_float2(d, d * float(s));
}

// One warp quantizes one 32-value block, lane i holding value v of column i (quantize_lanes<1>).
// q: [32], ds: one.
__device__ __forceinline__ void quantize_warp(float v, int8_t* q, float2* ds) {
  const float one[1] = {v};
  quantize_lanes<1>(one, q, ds);
}

// Sum over a block of 256 threads in the order of ops_common.cuh's block_reduce (warp butterfly, then warps 0..7
// in order): the same double as ops::rmsnorm. sh: [32] shared. Every thread gets the total.
__device__ __forceinline__ double block_sum_256(double v, double* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
  for (int o = 16; o > 0; o >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double r = sh[0];
  for (int w = 1; w < n_warps; ++w) r = r + sh[w];
  return r;
}

}  // namespace strata::cuda::q8c
