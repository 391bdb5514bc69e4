#include "expert_cache_test_kernels.cuh"

#include <cuda_runtime.h>

#include "cuda/cuda_check.cuh"

namespace strata::cuda::test {

namespace {

__device__ unsigned long long block_sum(unsigned long long v) {
  __shared__ unsigned long long part[256];
  part[threadIdx.x] = v;
  __syncthreads();
  unsigned long long t = 0;
  if (threadIdx.x == 0)
    for (int i = 0; i < blockDim.x; ++i) t += part[i];
  return t;  // valid in thread 0
}

__global__ void slow_byte_sum_kernel(const uint8_t* slot, int64_t bytes, long long cycles, unsigned long long* out) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  unsigned long long s = 0;
  for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) s += slot[i];
  const unsigned long long t = block_sum(s);
  if (threadIdx.x == 0) *out = t;
}

__global__ void layer_slot_sums_kernel(const uint8_t* slots, int64_t slot_bytes, int64_t bytes, const int32_t* table,
                                       long long cycles, unsigned long long* out) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  const int e = blockIdx.x;
  const int s = table[e];
  unsigned long long acc = 0;
  if (s >= 0)
    for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) acc += slots[int64_t(s) * slot_bytes + i];
  const unsigned long long t = block_sum(acc);
  if (threadIdx.x == 0) out[e] = s >= 0 ? t : ~0ull;
}

}  // namespace

void slow_byte_sum(const uint8_t* slot, int64_t bytes, long long cycles, unsigned long long* out,
                   StreamHandle stream) {
  slow_byte_sum_kernel<<<1, 256, 0, stream>>>(slot, bytes, cycles, out);
  CUDA_CHECK_LAUNCH();
}

void layer_slot_sums(const uint8_t* slots, int64_t slot_bytes, int64_t bytes, const int32_t* table, int n_expert,
                     long long cycles, unsigned long long* out, StreamHandle stream) {
  layer_slot_sums_kernel<<<n_expert, 256, 0, stream>>>(slots, slot_bytes, bytes, table, cycles, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace strata::cuda::test
