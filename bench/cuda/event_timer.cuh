#pragma once
// Timing of GPU work for the benchmarks in bench/cuda (header only: the .cu files there are one
// executable each).
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/cuda_check.cuh"

namespace strata::bench {

// Microseconds per call of `fn` (enqueued on `s`): `reps` calls timed by events after 2 warm-up calls.
// fn() or fn(i): i = 0..reps-1 for the timed calls, reps and reps + 1 for the warm-ups (so a benchmark
// that varies its input per call does not warm the timed calls' data).
template <typename Fn>
double time_us(cudaStream_t s, int reps, Fn fn) {
  auto call = [&](int i) {
    if constexpr (std::is_invocable_v<Fn&, int>)
      fn(i);
    else
      fn();
  };
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int w = 0; w < 2; ++w) call(reps + w);
  CUDA_CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < reps; ++i) call(i);
  CUDA_CHECK(cudaEventRecord(b, s));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return 1000.0 * ms / reps;
}

}  // namespace strata::bench
