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
// default is kLateDefault). Why: a product's blocks
// launched early wait beside the previous kernel's and ran slower after their wait than blocks launched
// at its exit. H200, 48-layer 30B-A3B Q4_K, 100% resident (bench/results/2026-12-02-gpu-session14-h200.md),
// median steps a layer: down late, gate_up + down 8.8 + 8.4 -> 10.1 + 5.3 us (gate_up's step now holds
// down's launch), all steps 46.3 -> 44.7 us; q|k|v and wo late too gave no more (45.0: their own steps
// shrink, the previous step grows by the launch).
inline constexpr const char* kLateDefault = "down";
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
