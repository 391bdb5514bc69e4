#pragma once
// The order of routing and sampling (device code; ops.cu's top-k, argmax and sampling, and
// q8_folded_router.cu's routing inside gate_up).
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

}  // namespace strata::cuda
