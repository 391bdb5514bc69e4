// moe_gate_up (q8_kernels.cuh): the kernel is q8_moe_gate_up.cuh's, plain (ids and int8 x from the router and
// norm launches); the routed one is q8_moe_gate_up_routed.cu's. Also gate_up's launch-shape settings.
#include "common/env_switch.h"
#include "cuda/q8_moe_gate_up.cuh"

namespace strata::cuda::q8 {
namespace {

DigitSetting g_gate_up_per_sm("STRATA_CUDA_GATE_UP_PER_SM", "gate_up blocks per SM", 0, 8, 2);
DigitSetting g_gate_up_topk("STRATA_CUDA_GATE_UP_TOPK", "gate_up's warp top-k", 0, 1, 1);

}  // namespace

void set_gate_up_per_sm(int cap) { g_gate_up_per_sm.set(cap); }

// Why a cap (2 by default): gate_up's blocks are launched while wo_router's still run, and each SM that
// wo_router frees takes as many of them as fit (3 of the 30B-A3B geometry's 200). Session 22 traced 87% of
// them on SMs holding 3 and about half of the 132 SMs in use: blocks alone on an SM ended 9.2 us after their
// wait, 2 to an SM 10.0, 3 to an SM 10.7, and every launch's latest block was on an SM of 3. Shared memory
// the kernel does not otherwise need caps how many fit (smem_for_cap).
int gate_up_per_sm() { return g_gate_up_per_sm.get(); }

void set_gate_up_warp_topk(int on) { g_gate_up_topk.set(on); }

// Why on (session 26, 30B-A3B geometry, alternating, three machines): 617.9 against 605.4 tok/s median (2 of 2
// pairs won), 596.2 against 586.3 (3 of 3), 616.5 against 615.6 (2 of 3); traced, the experts are chosen
// 0.29 us sooner and gate_up's step is 11.72 -> 11.44 us.
int gate_up_warp_topk() { return g_gate_up_topk.get(); }

void moe_gate_up(const moe::ExpertLayerView& v, const int32_t* table, const int8_t* xq, const float2* xds,
                 const int32_t* ids, int64_t n, int k, int8_t* hq, float2* hds, cudaStream_t stream) {
  moe_detail::check(v, "q8 moe_gate_up", n, k, xq, hq);
  moe_detail::launch_gate_up<false>(v, table, xq, xds, ids, n, k, hq, hds, nullptr, stream);
}

}  // namespace strata::cuda::q8
