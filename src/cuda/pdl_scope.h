#pragma once
// Plain launches (no programmatic dependent launch, cuda/pdl.cuh) for the kernels the calling thread
// launches while a PlainLaunches with on = true is alive. The models use it for passes larger than
// decode: there the early-launched grids of PDL take SM room from the running kernel of a long grid
// sequence. H200, 48-layer 30B-A3B Q4_K, 100% resident, pp512 (bench/results/2026-11-29-gpu-session4-h200.md,
// call 5): 2798 / 3112 tok/s with PDL vs 3397 without, in one run.
namespace strata::cuda::pdl {

// Whether qwen3moe's decode kernel `name` (qkv, wo, gate_up, down) is launched plain, i.e. only when the
// kernel before it has completed, rather than early with PDL (qwen3next keeps PDL: not measured there):
// STRATA_CUDA_PDL_LATE, a comma-separated list of those names ("none": every one early; read once; the
// default is kLateDefault). Why a kernel may go late: a product's blocks launched early wait beside the
// previous kernel's and ran slower after their wait than blocks launched at its exit. H200, 48-layer
// 30B-A3B Q4_K, 100% resident (bench/results/2026-12-02-gpu-session14-h200.md), median steps a layer: down
// late, gate_up + down 8.8 + 8.4 -> 10.1 + 5.3 us (gate_up's step now holds down's launch), all steps
// 46.3 -> 44.7 us; q|k|v and wo late too gave no more. Why none is the default since session 25: with
// gate_up and moe_down capped at 2 blocks an SM (cuda/smem_cap.cuh), down's 256 early blocks fit beside
// gate_up's, and down late left gate_up's step 2.2 us past its latest block (the launch on the chain):
// early won every alternating pair, 602.4 against 594.8 tok/s median (3 of 3) and 613.1 against 598.1
// (2 of 2) (bench/results/2026-12-04-gpu-session25-h200.md; 7% slower in session 23, uncapped).
inline constexpr const char* kLateDefault = "none";
bool launch_late(const char* name);

class PlainLaunches {
 public:
  explicit PlainLaunches(bool on);
  ~PlainLaunches();
  PlainLaunches(const PlainLaunches&) = delete;
  PlainLaunches& operator=(const PlainLaunches&) = delete;

 private:
  bool prev_;
};

}  // namespace strata::cuda::pdl
