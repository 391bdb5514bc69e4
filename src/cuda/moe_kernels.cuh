#pragma once
// The routed experts of one MoE layer on the GPU, reading expert weights from expert-cache slots through
// the device residency table (issue 7). Declarations only. CPU reference: model/moe_ffn.h moe_experts
// restricted to the resident experts; tests/cuda/test_moe_kernels.cu compares them.
//
// A slot holds one expert of one layer: gate [n_ff][n_embd], up [n_ff][n_embd], down [n_embd][n_ff], each
// in its type, at fixed byte offsets inside the slot (ExpertLayerView). Slots are one device allocation:
// slot s starts at slots + s * slot_bytes.
#include <cuda_runtime.h>

#include <cstdint>

#include "quant/types.h"

namespace strata::cuda::moe {

struct ExpertLayerView {
  const uint8_t* slots = nullptr;  // device: [n_slots][slot_bytes]
  int64_t slot_bytes = 0;
  GgmlType gate_type{}, up_type{}, down_type{};  // GPU storage types (cuda::quant::has_kernel)
  int64_t gate_off = 0, up_off = 0, down_off = 0;  // byte offsets inside a slot
  int64_t n_embd = 0, n_ff = 0;
};

// For every (t, j), t < n, j < k, whose expert e = ids[t*k + j] is resident (slot = table[e] >= 0):
//   h[t*k + j][:] = silu(gate_e . x[t]) * (up_e . x[t])
// Rows of non-resident experts are left untouched (moe_down does not read them).
//   table: [n_expert] device int32 (this layer's row of the residency table)
//   x: [n][n_embd] f32   ids: [n][k] int32   h: [n*k][n_ff] f32   (all device)
void moe_gate_up(const ExpertLayerView& v, const int32_t* table, const float* x, const int32_t* ids,
                 int64_t n, int k, float* h, cudaStream_t stream);

// out[t][:] = sum over j < k with expert ids[t*k+j] resident of  wts[t*k+j] * (down_e . h[t*k+j]),
// summed in a fixed order (deterministic, not necessarily j order); a token with no resident expert gets
// zeros. out is overwritten.
//   wts: [n][k] f32   out: [n][n_embd] f32   (device)
void moe_down(const ExpertLayerView& v, const int32_t* table, const float* h, const int32_t* ids,
              const float* wts, int64_t n, int k, float* out, cudaStream_t stream);

}  // namespace strata::cuda::moe
