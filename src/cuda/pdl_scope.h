#pragma once
// Plain launches (no programmatic dependent launch, cuda/pdl.cuh) for the kernels the calling thread
// launches while a PlainLaunches with on = true is alive. The models use it for passes larger than
// decode: there the early-launched grids of PDL take SM room from the running kernel of a long grid
// sequence. H200, 48-layer 30B-A3B Q4_K, 100% resident, pp512 (bench/results/2026-11-29-gpu-session4-h200.md,
// call 5): 2798 / 3112 tok/s with PDL vs 3397 without, in one run.
namespace strata::cuda::pdl {

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
