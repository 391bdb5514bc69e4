// What moe_down folded into gate_up would cost at its end (docs/gpu.md, session 36's lead): if each of
// gate_up's blocks (32 rows of h of one expert) multiplied its 32 h values by the matching 32 columns of
// the expert's down matrix, it would have a partial of the whole n_embd output, and the 192 partials of a
// layer (8 experts x 24 blocks) would have to be summed into x without a step of their own. A dependent
// chain of steps in one CUDA graph with PDL (as bench_chain), where each step's blocks read the previous
// step's 2048-vector and then write a 2048-vector each:
//   plain:   to their own slot (plain stores: what the step costs without a sum; the previous step's
//            vector is block 0's slot);
//   red u64: added into one 2048-vector of int64 fixed-point values (value * 2^32, rounded) by red.add: an
//            integer sum, so the result does not depend on the order the blocks arrive in (the engine's
//            logits are reproducible bit for bit); the next step reads it back as float;
//   red f32: added into one float vector by red.add (order-dependent: for comparison only).
// The difference between a red column and the plain one is what the sum adds to a step; a layer's
// moe_down step is ~6-7.4 us (bench/results/2026-12-05-gpu-session36-h100.md).
//
// Usage: bench_split_down [--reps 50] [--steps 48]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
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
constexpr float kFix = 4294967296.f;  // 2^32: the fixed-point scale of the u64 sums

enum Mode { kPlain = 0, kRedU64 = 1, kRedF32 = 2 };

// The block's sum of the previous step's vector (every thread gets it): floats, or u64 fixed point.
template <int M>
__device__ float block_sum(const void* in) {
  __shared__ float part[kThreads / 32];
  float v = 0.f;
  for (int i = threadIdx.x; i < kWidth; i += kThreads) {
    if constexpr (M == kRedU64)
      v += float(static_cast<const long long*>(in)[i]) * (1.f / kFix);
    else
      v += static_cast<const float*>(in)[i];
  }
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) s += part[w];
  return s;
}

// One step. in: the previous step's vector (kPlain: [grid][kWidth] floats, block 0's read; kRedU64: [kWidth]
// int64; kRedF32: [kWidth] floats). out: the same shapes, this step's.
template <int M>
__global__ void __launch_bounds__(kThreads) split_step(const void* __restrict__ in, void* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  const float s = block_sum<M>(in) * 1e-6f;
  for (int j = threadIdx.x; j < kWidth; j += kThreads) {
    const float v = s + float(j & 63) * 1e-3f - float(blockIdx.x & 7) * 1e-2f;
    if constexpr (M == kPlain) {
      static_cast<float*>(out)[int64_t(blockIdx.x) * kWidth + j] = v;
    } else if constexpr (M == kRedU64) {
      const long long q = __float2ll_rn(v * kFix);
      atomicAdd(static_cast<unsigned long long*>(out) + j, static_cast<unsigned long long>(q));  // (red: unused result)
    } else {
      atomicAdd(static_cast<float*>(out) + j, v);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 50, steps = 48;
  if (const int rc =
          strata::bench::start("bench_split_down", argc, argv, {{"--reps", &reps, 1}, {"--steps", &steps, 2}}))
    return rc;
  Device dev(0);
  Stream& cs = dev.compute();
  const cudaStream_t s = cs.handle();
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int grids[] = {sms, 192, 384};
  const int max_grid = std::max(sms, 384);
  // kPlain: two [max_grid][kWidth] float vectors, alternating. The red modes: one [kWidth] vector a step
  // (8 bytes a value), zeroed at the graph's start.
  void *pa = nullptr, *pb = nullptr, *acc = nullptr;
  const size_t plain_bytes = size_t(max_grid) * kWidth * sizeof(float);
  const size_t acc_bytes = size_t(steps + 1) * kWidth * sizeof(long long);
  CUDA_CHECK(cudaMalloc(&pa, plain_bytes));
  CUDA_CHECK(cudaMalloc(&pb, plain_bytes));
  CUDA_CHECK(cudaMalloc(&acc, acc_bytes));
  CUDA_CHECK(cudaMemsetAsync(pa, 0, plain_bytes, s));
  CUDA_CHECK(cudaMemsetAsync(pb, 0, plain_bytes, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  pdl::set_enabled(true);

  std::printf("%d SMs, %d dependent steps a graph (PDL), %d repetitions, vectors of %d\n\n", sms, steps, reps, kWidth);
  std::printf("| blocks | plain us/step | red u64 us/step | red f32 us/step | u64 - plain |\n|---:|---:|---:|---:|---:|\n");
  for (int grid : grids) {
    double us[3];
    for (int m = 0; m < 3; ++m) {
      Graph g = Graph::capture(cs, [&] {
        if (m != kPlain) CUDA_CHECK(cudaMemsetAsync(acc, 0, acc_bytes, s));
        for (int i = 0; i < steps; ++i) {
          const dim3 gd{unsigned(grid)}, bd{unsigned(kThreads)};
          void (*const plain)(const void*, void*) = split_step<kPlain>;
          void (*const red_u64)(const void*, void*) = split_step<kRedU64>;
          void (*const red_f32)(const void*, void*) = split_step<kRedF32>;
          if (m == kPlain) {
            pdl::launch(plain, gd, bd, 0, s, static_cast<const void*>((i & 1) ? pb : pa), (i & 1) ? pa : pb);
          } else {
            const size_t vb = size_t(kWidth) * sizeof(long long);
            const void* in = static_cast<const char*>(acc) + size_t(i) * vb;  // step 0 reads the zeroed vector
            void* out = static_cast<char*>(acc) + size_t(i + 1) * vb;
            pdl::launch(m == kRedU64 ? red_u64 : red_f32, gd, bd, 0, s, in, out);
          }
        }
      });
      us[m] = strata::bench::time_us(s, reps, [&] { g.launch(cs); }) / steps;
    }
    std::printf("| %d | %.2f | %.2f | %.2f | %+.2f |\n", grid, us[0], us[1], us[2], us[1] - us[0]);
  }
  // A check that red u64 added every block's values (the second step's vector).
  {
    const int grid = 192;
    std::vector<long long> last(kWidth);
    Graph g = Graph::capture(cs, [&] {
      CUDA_CHECK(cudaMemsetAsync(acc, 0, acc_bytes, s));
      for (int i = 0; i < 2; ++i) {
        const size_t vb = size_t(kWidth) * sizeof(long long);
        void (*const red_u64)(const void*, void*) = split_step<kRedU64>;
        pdl::launch(red_u64, dim3(unsigned(grid)), dim3(kThreads), 0, s,
                    static_cast<const void*>(static_cast<const char*>(acc) + size_t(i) * vb),
                    static_cast<void*>(static_cast<char*>(acc) + size_t(i + 1) * vb));
      }
    });
    g.launch(cs);
    CUDA_CHECK(cudaStreamSynchronize(s));
    // (on the stream that wrote it: ordered after the graph; a benchmark's own buffers, one stream)
    CUDA_CHECK(cudaMemcpyAsync(last.data(), static_cast<char*>(acc) + size_t(2) * kWidth * 8, size_t(kWidth) * 8,
                               cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    // Every block's v(j) - v(0) is float(j & 63) * 1e-3 up to the float rounding of v (~1e-8): the sum of
    // the grid's terms must be grid times it (a block whose adds were lost moves it by >= 1e-3).
    long long bad = 0;
    for (int j = 1; j < kWidth; ++j) {
      const double d = double(last[j] - last[0]) / kFix, want = grid * double(float(j & 63) * 1e-3f);
      bad += std::fabs(d - want) > grid * (1e-7 + 2.0 / kFix);
    }
    std::printf("\nred u64 check (192 blocks, 2 steps): %lld of %d values off\n", bad, kWidth - 1);
  }
  CUDA_CHECK(cudaFree(pa));
  CUDA_CHECK(cudaFree(pb));
  CUDA_CHECK(cudaFree(acc));
  return 0;
}
