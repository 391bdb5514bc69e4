#pragma once
// The order of routing and sampling (device code; ops_route.cu's top-k, ops_sample.cu's argmax and sampling,
// q8_folded_route.cuh's routing inside gate_up, and expert_predict.cuh's prediction).
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

// A total order for (value desc, id asc) as one unsigned 64-bit key, larger = earlier: the f32 bits
// mapped to a monotonic unsigned (with -0 taken as +0, as the CPU's == does) in the high half, ~id in the
// low half. Keys are unique per id.
__device__ __forceinline__ uint64_t order_key(float f, uint32_t id) {
  if (f == 0.0f) f = 0.0f;
  uint32_t u = __float_as_uint(f);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(u) << 32) | (0xffffffffu - id);
}
__device__ __forceinline__ uint32_t key_id(uint64_t k) { return 0xffffffffu - static_cast<uint32_t>(k); }
// The value an order_key was made from (a -0 comes back as +0, as order_key took it).
__device__ __forceinline__ float key_value(uint64_t k) {
  const uint32_t h = static_cast<uint32_t>(k >> 32);
  return __uint_as_float((h & 0x80000000u) ? (h & 0x7fffffffu) : ~h);
}
// A key below every order_key (high half 0), still unique per id and lower ids first: for a value that
// must never be chosen before a real one (a NaN, padding past the last expert).
__device__ __forceinline__ uint64_t bottom_key(uint32_t id) { return uint64_t(0xffffffffu - id); }

// How many of keys[0, n_keys) order before `mine` (its 0-based rank; keys are unique). keys in shared
// memory: every thread of a block reads the same word at a time (broadcast reads, all in flight).
__device__ __forceinline__ int key_rank(const uint64_t* keys, int n_keys, uint64_t mine) {
  int rank = 0;
#pragma unroll 16
  for (int i = 0; i < n_keys; ++i) rank += keys[i] > mine;
  return rank;
}

}  // namespace strata::cuda
