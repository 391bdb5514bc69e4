#pragma once
// Test kernels for tests/cuda/test_expert_cache.cpp (which is C++20 for moe/residency.h, so its kernels
// live in expert_cache_test_kernels.cu). Launch on `stream`; launch errors are checked at the launch.
#include <cstdint>

#include "cuda/device.h"

namespace strata::cuda::test {

// out[0] = sum of the `bytes` bytes at slot (device), read after spinning `cycles` GPU clocks (keeps the
// reader in flight so that an unordered overwrite would show). One block.
void slow_byte_sum(const uint8_t* slot, int64_t bytes, long long cycles, unsigned long long* out,
                   StreamHandle stream);

// What an MoE kernel does with the residency table: for each expert e < n_expert of one layer, look up
// its slot in the device table row and read it. out[e] = byte sum of the first `bytes` of slot table[e]
// (the layer's expert_bytes), or ~0 when e is not resident. Spins `cycles` first.
//   slots [n_slots][slot_bytes]  table [n_expert] int32  out [n_expert]   (device)
void layer_slot_sums(const uint8_t* slots, int64_t slot_bytes, int64_t bytes, const int32_t* table, int n_expert,
                     long long cycles, unsigned long long* out, StreamHandle stream);

}  // namespace strata::cuda::test
