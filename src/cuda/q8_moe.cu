// MoE decode with int8 activations, experts read from expert-cache slots through the residency table
// (contract: q8_kernels.cuh; per-format dots: q8_formats.cuh; CPU reference: host/q8_reference.cpp
// moe_gate_up / moe_down). No atomics: every output element is written by one warp (gate_up: one block
// per 32 rows of a pair), sums in a fixed order, so results are deterministic.
// This file: what the kernels' translation units share on the host (q8_moe_detail.cuh). The kernels:
// q8_moe_gate_up.cu (moe_gate_up), q8_moe_gate_up_routed.cu (moe_gate_up_routed), q8_moe_down.cu (moe_down).
#include "common/error.h"
#include "cuda/q8_moe_detail.cuh"

namespace strata::cuda::q8 {
namespace moe_detail {

q8ref::ExpertView host_view(const moe::ExpertLayerView& v) {
  q8ref::ExpertView h;
  h.slots = v.slots, h.slot_bytes = v.slot_bytes;
  h.gate_type = v.gate_type, h.up_type = v.up_type, h.down_type = v.down_type;
  h.gate_off = v.gate_off, h.up_off = v.up_off, h.down_off = v.down_off;
  h.n_embd = v.n_embd, h.n_ff = v.n_ff;
  return h;
}

q8d::Align rows_align(const moe::ExpertLayerView& v, int64_t off, int64_t rb) {
  return q8d::min_align(q8d::align_of(reinterpret_cast<uintptr_t>(v.slots) + uintptr_t(off), v.slot_bytes),
                        q8d::align_of(0, rb));
}

void check(const moe::ExpertLayerView& v, const char* what, int64_t n, int k, const void* act, const void* h) {
  moe::check_expert_view(v, what, n, k);
  STRATA_REQUIRE(v.direct == nullptr || v.direct_share == 0, "{}: direct reads run on the f32 kernels only", what);
  STRATA_REQUIRE(moe_supported(v), "{}: expert types {}/{}/{} or shape n_embd {} n_ff {} have no int8-activation "
                 "kernel (or rows are not 2-byte aligned)", what, type_name(v.gate_type), type_name(v.up_type),
                 type_name(v.down_type), v.n_embd, v.n_ff);
  STRATA_REQUIRE(reinterpret_cast<uintptr_t>(act) % 16 == 0 && reinterpret_cast<uintptr_t>(h) % 16 == 0,
                 "{}: int8 activations must be 16-byte aligned", what);
}

}  // namespace moe_detail

bool moe_supported(const moe::ExpertLayerView& v) { return q8ref::moe_supported(moe_detail::host_view(v)); }

}  // namespace strata::cuda::q8
