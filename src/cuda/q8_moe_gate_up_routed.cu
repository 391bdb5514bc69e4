// moe_gate_up_routed (q8_kernels.cuh): q8_moe_gate_up.cuh's kernel with the routing of one token in every block
// (q8_folded_route.cuh), its own translation unit so that it compiles beside the plain one.
#include "cuda/q8_moe_gate_up.cuh"

namespace strata::cuda::q8 {

void moe_gate_up_routed(const moe::ExpertLayerView& v, const int32_t* table, const FoldedRoute& r, int k,
                        int8_t* hq, float2* hds, cudaStream_t stream) {
  moe_detail::check(v, "q8 moe_gate_up_routed", 1, k, hq, hq);
  STRATA_REQUIRE(v.n_embd % 256 == 0 && v.n_embd <= q8fr::kMaxEmbd && r.n_expert >= 1 &&
                 r.n_expert <= q8fr::kMaxExperts && k <= q8fr::kMaxK && k <= r.n_expert && r.n_ss >= 0,
                 "q8 moe_gate_up_routed: n_embd {} (a multiple of 256 up to {}), {} experts (up to {}), k {} (up to "
                 "{}): unsupported", v.n_embd, q8fr::kMaxEmbd, r.n_expert, q8fr::kMaxExperts, k, q8fr::kMaxK);
  STRATA_REQUIRE(r.mid != nullptr && r.norm_w != nullptr && r.raw != nullptr && r.ids != nullptr && r.wts != nullptr &&
                 (r.n_ss == 0 || r.ss != nullptr), "q8 moe_gate_up_routed: a null input or output");
  STRATA_REQUIRE(reinterpret_cast<uintptr_t>(r.mid) % 16 == 0 && reinterpret_cast<uintptr_t>(r.norm_w) % 16 == 0,
                 "q8 moe_gate_up_routed: mid and norm_w must be 16-byte aligned");
  moe_detail::launch_gate_up<true>(v, table, nullptr, nullptr, nullptr, 1, k, hq, hds, &r, stream);
}

}  // namespace strata::cuda::q8
