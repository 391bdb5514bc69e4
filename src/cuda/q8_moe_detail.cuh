// What the int8-activation MoE kernels share (internal to q8_moe.cu, q8_moe_gate_up*.cu, q8_moe_down.cu;
// the contract is q8_kernels.cuh). Split into translation units so that gate_up, the routed gate_up and down
// compile in parallel (each instantiates every format or format pair: the longest of the device build).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/host/q8_reference.h"
#include "cuda/moe_kernels.cuh"
#include "cuda/q8_formats.cuh"
#include "cuda/q8_kernels.cuh"

namespace strata::cuda::q8::moe_detail {

// Slot of the expert of pair p, or -1 (negative id or not resident), as moe_kernels.cu reads it.
__device__ __forceinline__ int slot_of(const int32_t* table, const int32_t* ids, int64_t p) {
  const int32_t e = ids[p];
  return e < 0 ? -1 : table[e];
}

// The layer's table row in shared memory (n_table entries; 0 or more than kViewTableMax: not staged) before
// the PDL wait: slots are then found one memory round trip after the router's ids instead of two. Every
// thread of the block calls it; the caller syncs the block before reading the copy. Returns the row to
// read slots from (the copy, or `table` itself). Why before the wait is allowed: the table is written by
// uploads only (the expert cache's table, a streaming pass's row, the shared expert's {0}), which are
// ordered by events, never by a kernel of the stream (cuda/pdl.cuh's contract for weights).
__device__ __forceinline__ const int32_t* stage_table(const int32_t* table, int n_table, int32_t* tab, int nthreads) {
  if (n_table <= 0 || n_table > moe::kViewTableMax) return table;
  for (int i = threadIdx.x; i < n_table; i += nthreads) tab[i] = table[i];
  return tab;
}

// moe_kernels.cu's silu, the same expression.
__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// The host-side view of v for q8ref (the supported-types rule), and the alignment of every row of a slot tensor
// at slots + s * slot_bytes + off (rb apart).
q8ref::ExpertView host_view(const moe::ExpertLayerView& v);
q8d::Align rows_align(const moe::ExpertLayerView& v, int64_t off, int64_t rb);
// The launch checks every entry point makes (view, supported types, 16-byte aligned activations).
void check(const moe::ExpertLayerView& v, const char* what, int64_t n, int k, const void* act, const void* h);

// Static shared memory of the kernels, at most: the table copy and 1 KiB for the rest (hs, jslot_all).
constexpr int64_t kStaticSmem = int64_t(sizeof(int32_t)) * moe::kViewTableMax + 1024;

inline unsigned grid_y(int64_t n) { return unsigned(std::min<int64_t>(std::max<int64_t>(n, 1), 65535)); }

}  // namespace strata::cuda::q8::moe_detail
