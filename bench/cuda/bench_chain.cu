// The cost of one dependent step of a decode layer, apart from its work: a chain of kernels where each
// reads what the previous one wrote (a 2048-float activation vector, as a product reads x), launched in
// one CUDA graph with and without PDL, against the same steps inside one persistent kernel separated by
// a grid barrier (an atomic arrival counter and a generation flag). A decode layer is ~9 such steps
// (docs/gpu.md): this says how much of its ~51 us the steps' boundaries can take, and whether a
// persistent per-layer kernel would pay.
//
// Each step: every block reads the 2048 floats the previous step wrote (L2 hits), sums them, and writes
// its own 256 floats of the next vector. The weight-like work is left out on purpose.
//
// A fourth column joins the steps by counters instead of PDL's wait (docs/gpu.md, session 24-26 lead 1): each
// kernel lets the next launch at once, its blocks poll the previous step's arrival counter (an acquire load)
// until every block of that step has added to it (after its stores and a fence), and call PDL's wait only
// before they exit (so a later wait still implies every earlier grid). It says what the wait's grid
// completion and flush cost against a counter's fence, add and poll.
//
// Usage: bench_chain [--reps 50] [--steps 96]
#include <cuda/atomic>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "cuda/device.h"
#include "cuda/graph.h"
#include "cuda/pdl.cuh"
#include "bench_main.h"
#include "event_timer.cuh"

namespace {

using namespace strata;
using namespace strata::cuda;

constexpr int kThreads = 256, kWidth = 2048;

// The block's sum of in[0, kWidth) (every thread gets it).
__device__ float block_sum(const float* __restrict__ in) {
  __shared__ float part[kThreads / 32];
  float v = 0.f;
  for (int i = threadIdx.x; i < kWidth; i += kThreads) v += in[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) s += part[w];
  __syncthreads();
  return s;
}

// One step: out[b * 256 + t] = sum(in) * 1e-4 + t  (in: [>= kWidth], out: [gridDim.x * 256]).
__global__ void __launch_bounds__(kThreads) step_kernel(const float* __restrict__ in, float* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  const float s = block_sum(in);
  out[blockIdx.x * kThreads + threadIdx.x] = s * 1e-4f + float(threadIdx.x);
}

// step_kernel's work joined by counters: poll *prev until it reaches prev_target (null: the first step, which
// waits for the kernel that zeroed the counters), read `in` through L2 (written by the previous step while
// this kernel runs: no non-coherent loads), write, then the fence and this block's arrival on *mine.
__global__ void __launch_bounds__(kThreads)
    counter_step_kernel(const float* in, float* out, const unsigned* prev, unsigned prev_target, unsigned* mine) {
  pdl_launch_dependents();  // the next step launches now and polls *mine
  if (prev == nullptr) {
    pdl_wait();
  } else {
    if (threadIdx.x == 0) {
      ::cuda::atomic_ref<const unsigned, ::cuda::thread_scope_device> c(*prev);
      while (c.load(::cuda::memory_order_acquire) < prev_target) {
      }
    }
    __syncthreads();
  }
  __shared__ float part[kThreads / 32];
  float v = 0.f;
  for (int i = threadIdx.x; i < kWidth; i += kThreads) v += __ldcg(in + i);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float sum = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) sum += part[w];
  out[blockIdx.x * kThreads + threadIdx.x] = sum * 1e-4f + float(threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device> c(*mine);
    c.fetch_add(1, ::cuda::memory_order_release);
  }
  pdl_wait();  // (the previous grid complete before this one is: what a later kernel's wait relies on)
}

__global__ void zero_kernel(unsigned* p, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = 0;
}

// Every block of the grid arrives; the last one bumps the generation, the others wait for it.
// count: arrivals of the current generation; gen: the generation.
__device__ void grid_barrier(unsigned* count, unsigned* gen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device> c(*count), g(*gen);
    const unsigned my = g.load(::cuda::memory_order_relaxed);
    __threadfence();  // the block's writes (ordered before by __syncthreads) before the arrival
    if (c.fetch_add(1, ::cuda::memory_order_acq_rel) == gridDim.x - 1) {
      c.store(0, ::cuda::memory_order_relaxed);
      g.store(my + 1, ::cuda::memory_order_release);
    } else {
      while (g.load(::cuda::memory_order_acquire) == my) {
      }
    }
  }
  __syncthreads();
}

// `steps` steps of step_kernel's work in one grid, a grid barrier between two.
// a, b: [max(kWidth, gridDim.x * 256)] the two vectors, alternating.
__global__ void __launch_bounds__(kThreads)
    persistent_kernel(float* a, float* b, int steps, unsigned* count, unsigned* gen) {
  for (int i = 0; i < steps; ++i) {
    const float* in = (i & 1) ? b : a;
    float* out = (i & 1) ? a : b;
    const float s = block_sum(in);
    out[blockIdx.x * kThreads + threadIdx.x] = s * 1e-4f + float(threadIdx.x);
    grid_barrier(count, gen);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 50, steps = 96;
  if (const int rc = strata::bench::start("bench_chain", argc, argv, {{"--reps", &reps, 1}, {"--steps", &steps, 2}}))
    return rc;
  Device dev(0);
  Stream& cs = dev.compute();
  const cudaStream_t s = cs.handle();
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int max_grid = 8 * sms;
  float *a = nullptr, *b = nullptr;
  unsigned* sync = nullptr;  // [2]: count, gen
  unsigned* arrivals = nullptr;  // [steps]: the counter-joined steps' arrival counters
  const size_t floats = size_t(std::max(kWidth, max_grid * kThreads));
  CUDA_CHECK(cudaMalloc(&a, floats * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&b, floats * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&sync, 2 * sizeof(unsigned)));
  CUDA_CHECK(cudaMalloc(&arrivals, size_t(steps) * sizeof(unsigned)));
  CUDA_CHECK(cudaMemsetAsync(a, 0, floats * sizeof(float), s));
  CUDA_CHECK(cudaMemsetAsync(b, 0, floats * sizeof(float), s));
  CUDA_CHECK(cudaMemsetAsync(sync, 0, 2 * sizeof(unsigned), s));
  CUDA_CHECK(cudaStreamSynchronize(s));

  std::printf("%d SMs, %d steps a graph or persistent launch, %d repetitions\n\n", sms, steps, reps);
  std::printf("| blocks | graph, plain us/step | graph, PDL us/step | persistent, grid barrier us/step | graph, "
              "counter join us/step |\n");
  std::printf("|---:|---:|---:|---:|---:|\n");
  for (int grid : {1, 32, sms, 2 * sms, 4 * sms, 8 * sms}) {
    double graph_us[2];
    for (int pdl_on = 0; pdl_on < 2; ++pdl_on) {
      pdl::set_enabled(pdl_on == 1);
      Graph g = Graph::capture(cs, [&] {
        for (int i = 0; i < steps; ++i)
          pdl::launch(step_kernel, dim3(unsigned(grid)), dim3(kThreads), 0, s, (i & 1) ? b : a, (i & 1) ? a : b);
      });
      graph_us[pdl_on] = strata::bench::time_us(s, reps, [&] { g.launch(cs); }) / steps;
    }
    pdl::set_enabled(true);
    // Counter-joined steps, the counters zeroed by a plain kernel at the graph's start.
    Graph gc = Graph::capture(cs, [&] {
      zero_kernel<<<1, 256, 0, s>>>(arrivals, steps);
      CUDA_CHECK_LAUNCH();
      for (int i = 0; i < steps; ++i)
        pdl::launch(counter_step_kernel, dim3(unsigned(grid)), dim3(kThreads), 0, s, (i & 1) ? b : a, (i & 1) ? a : b,
                    i == 0 ? static_cast<const unsigned*>(nullptr) : arrivals + i - 1, unsigned(grid), arrivals + i);
    });
    const double counter_us = strata::bench::time_us(s, reps, [&] { gc.launch(cs); }) / steps;
    // The persistent grid must be resident at once: cooperative launch refuses a grid that is not.
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, kThreads, 0));
    double persistent = -1;
    if (grid <= per_sm * sms) {
      int st = steps;
      unsigned* gen = sync + 1;
      void* args[] = {&a, &b, &st, &sync, &gen};
      persistent = strata::bench::time_us(s, reps, [&] {
        CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(persistent_kernel), dim3(unsigned(grid)),
                                               dim3(kThreads), args, 0, s));
      }) / steps;
    }
    if (persistent < 0)
      std::printf("| %d | %.2f | %.2f | (not resident at once) | %.2f |\n", grid, graph_us[0], graph_us[1],
                  counter_us);
    else
      std::printf("| %d | %.2f | %.2f | %.2f | %.2f |\n", grid, graph_us[0], graph_us[1], persistent, counter_us);
  }
  CUDA_CHECK(cudaFree(a));
  CUDA_CHECK(cudaFree(b));
  CUDA_CHECK(cudaFree(sync));
  CUDA_CHECK(cudaFree(arrivals));
  return 0;
}
