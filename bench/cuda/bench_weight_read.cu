// How long a decode step takes to read its weights when they are scattered over a large allocation (the
// expert cache's slots are: 17 GB at 100% for the 30B-A3B geometry), against the same bytes in a small one.
// Why: the per-kernel trace (bench/results/2026-12-02-gpu-session14-h200.md) has gate_up streaming its
// 14 MB at ~1.9 TB/s and down, wo and q|k|v below that, far from the HBM's ~4 TB/s. If the time grows with
// the footprint at the same bytes, the address translation (TLB reach), not the HBM, bounds the step.
//
// Each step is one kernel that reads `chunks` pieces of `chunk` bytes (16-byte loads, every block its
// contiguous share, several loads in flight per thread) and writes one float per block. The pieces of a
// step: "experts": 8 random slots of 3 x 884736 bytes (gate, up, down of a 768 x 2048 Q4_K expert), the
// gate and up pieces of each (gate_up's 14 MB, 192 blocks); "dense": one 4.7 MB piece at a random place
// (wo, 256 blocks). Steps are captured into one CUDA graph (no PDL), every step a fresh random draw, so
// the L2 holds little of a step's bytes once the footprint is well over its 50 MB.
//
// Usage: bench_weight_read [--reps 20] [--steps 96] [--max-gib 64]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "cuda/device.h"
#include "cuda/graph.h"
#include "bench_main.h"
#include "event_timer.cuh"

namespace {

using namespace strata;
using namespace strata::cuda;

constexpr int kThreads = 256;

// Block b reads its share of piece b / per_piece: bytes [s, e) of base + offs[piece] (16-byte words).
//   offs: [pieces] byte offsets   out: [gridDim.x]
__global__ void __launch_bounds__(kThreads)
    read_kernel(const uint8_t* __restrict__ base, const uint64_t* __restrict__ offs, int64_t piece_bytes,
                int per_piece, float* __restrict__ out) {
  const int piece = blockIdx.x / per_piece, part = blockIdx.x % per_piece;
  const int64_t share = (piece_bytes / 16 + per_piece - 1) / per_piece;  // words
  const uint4* p = reinterpret_cast<const uint4*>(base + offs[piece]);
  const int64_t w0 = part * share, w1 = w0 + share < piece_bytes / 16 ? w0 + share : piece_bytes / 16;
  unsigned acc = 0;
#pragma unroll 8
  for (int64_t w = w0 + threadIdx.x; w < w1; w += kThreads) {
    const uint4 v = __ldg(p + w);
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x == 0) out[blockIdx.x] = float(acc);
}

// The same share read by bulk copies (the Hopper TMA: cp.async.bulk) into shared memory instead of
// loads into registers: thread 0 asks for the block's bytes in `chunk`-byte copies that complete on one
// mbarrier, the block waits on it, then xors its copy. Why: a plain load's bytes in flight are bounded per
// SM (registers and the L1's outstanding misses), a bulk copy's only by shared memory; if gate_up's read is
// bound per SM, this reads the same bytes faster.
//   smem: [share bytes] (dynamic)
__global__ void __launch_bounds__(kThreads)
    bulk_read_kernel(const uint8_t* __restrict__ base, const uint64_t* __restrict__ offs, int64_t piece_bytes,
                     int per_piece, int chunk, float* __restrict__ out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint8_t buf[];
  __shared__ __align__(8) uint64_t bar;
  const int piece = blockIdx.x / per_piece, part = blockIdx.x % per_piece;
  const int64_t share = (piece_bytes / 16 + per_piece - 1) / per_piece * 16;
  const int64_t b0 = part * share, b1 = b0 + share < piece_bytes ? b0 + share : piece_bytes;
  const uint32_t bytes = uint32_t(b1 - b0);
  const uint32_t bar_at = uint32_t(__cvta_generic_to_shared(&bar)), buf_at = uint32_t(__cvta_generic_to_shared(buf));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_at) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_at), "r"(bytes) : "memory");
    const uint8_t* src = base + offs[piece] + b0;
    for (uint32_t o = 0; o < bytes; o += uint32_t(chunk)) {
      const uint32_t n = bytes - o < uint32_t(chunk) ? bytes - o : uint32_t(chunk);
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       buf_at + o), "l"(src + o), "r"(n), "r"(bar_at)
                   : "memory");
    }
  }
  uint32_t done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(bar_at)
                 : "memory");
  unsigned acc = 0;
  for (uint32_t w = threadIdx.x; w < bytes / 16; w += kThreads) {
    const uint4 v = reinterpret_cast<const uint4*>(buf)[w];
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x == 0) out[blockIdx.x] = float(acc);
#endif
}

// A step that reads nothing: the graph's floor (a launch and an empty grid of the same size).
__global__ void __launch_bounds__(kThreads) empty_kernel(float* __restrict__ out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = 0.f;
}

constexpr int64_t kPiece = 768 * 1152, kSlot = 3 * kPiece, kDense = 2048 * 2304;

// One step's 16 pieces: the gate and up pieces (o[2j], o[2j + 1]) of 8 distinct random slots of n_slots.
void eight_experts(std::mt19937_64& rng, uint64_t n_slots, uint64_t* o) {
  std::vector<uint64_t> pick;
  while (pick.size() < 8) {
    const uint64_t v = rng() % n_slots;
    if (std::find(pick.begin(), pick.end(), v) == pick.end()) pick.push_back(v);
  }
  for (int j = 0; j < 8; ++j) o[2 * j] = pick[size_t(j)] * kSlot, o[2 * j + 1] = pick[size_t(j)] * kSlot + kPiece;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, steps = 96, max_gib = 64;
  if (const int rc = strata::bench::start("bench_weight_read", argc, argv,
                                          {{"--reps", &reps, 1}, {"--steps", &steps, 1}, {"--max-gib", &max_gib, 1}}))
    return rc;
  Device dev(0);
  Stream& cs = dev.compute();
  const cudaStream_t s = cs.handle();
  const size_t max_bytes = size_t(max_gib) << 30;
  uint8_t* base = nullptr;
  CUDA_CHECK(cudaMalloc(&base, max_bytes));
  CUDA_CHECK(cudaMemsetAsync(base, 1, max_bytes, s));
  float* out = nullptr;
  CUDA_CHECK(cudaMalloc(&out, 4096 * sizeof(float)));
  struct Case {
    int pieces, per_piece;
    int64_t piece_bytes;
  };
  // cases[0]: experts (8 slots: gate + up, 14.2 MB); cases[1]: dense (one 4.7 MB piece)
  const Case cases[] = {{16, 12, kPiece}, {1, 256, kDense}};
  std::printf("%d steps a graph, %d repetitions; us per step (a kernel and its launch) and GB/s\n\n", steps, reps);
  std::printf("| footprint GiB | experts us | experts GB/s | dense us | dense GB/s |\n|---:|---:|---:|---:|---:|\n");
  std::mt19937_64 rng(7);
  std::vector<double> fps = {0.25, 1, 4, 16};
  for (double f = 32; f <= max_gib; f *= 2) fps.push_back(f);
  for (double fp : fps) {
    const size_t footprint = std::min(max_bytes, size_t(fp * double(size_t(1) << 30)));
    double us[2], gbs[2];
    for (int ci = 0; ci < 2; ++ci) {
      const Case& c = cases[ci];
      std::vector<uint64_t> offs(size_t(steps) * size_t(c.pieces));
      for (int st = 0; st < steps; ++st) {
        uint64_t* o = offs.data() + size_t(st) * size_t(c.pieces);
        if (ci == 0) {
          eight_experts(rng, footprint / kSlot, o);
        } else {
          o[0] = (rng() % (footprint / kDense)) * kDense;
        }
      }
      uint64_t* doffs = nullptr;
      CUDA_CHECK(cudaMalloc(&doffs, offs.size() * 8));
      CUDA_CHECK(cudaMemcpyAsync(doffs, offs.data(), offs.size() * 8, cudaMemcpyHostToDevice, s));
      CUDA_CHECK(cudaStreamSynchronize(s));
      Graph g = Graph::capture(cs, [&] {
        for (int st = 0; st < steps; ++st)
          read_kernel<<<unsigned(c.pieces * c.per_piece), kThreads, 0, s>>>(base, doffs + size_t(st) * size_t(c.pieces),
                                                                             c.piece_bytes, c.per_piece, out);
      });
      us[ci] = strata::bench::time_us(s, reps, [&] { g.launch(cs); }) / steps;
      gbs[ci] = double(c.pieces) * double(c.piece_bytes) / us[ci] / 1e3;
      CUDA_CHECK(cudaFree(doffs));
    }
    std::printf("| %.2f | %.2f | %.0f | %.2f | %.0f |\n", double(footprint) / double(size_t(1) << 30), us[0], gbs[0],
                us[1], gbs[1]);
  }
  // The experts' 14.2 MB again at one footprint, cut into more or fewer blocks. Why: gate_up runs 192
  // blocks of 74 KB (32 rows of gate and up of one pair) on 132 SMs, so 60 SMs hold two; if finer blocks
  // read the same bytes faster, the grid's granularity, not the HBM, bounds gate_up's product.
  {
    const size_t footprint = std::min(max_bytes, size_t(16) << 30);
    std::vector<uint64_t> offs(size_t(steps) * 16);
    for (int st = 0; st < steps; ++st) eight_experts(rng, footprint / kSlot, offs.data() + size_t(st) * 16);
    uint64_t* doffs = nullptr;
    CUDA_CHECK(cudaMalloc(&doffs, offs.size() * 8));
    CUDA_CHECK(cudaMemcpyAsync(doffs, offs.data(), offs.size() * 8, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    std::printf("\nexperts (14.2 MB) at %.0f GiB by block count\n\n| blocks | KB a block | us | GB/s |\n|---:|---:|---:|---:|\n",
                double(footprint) / double(size_t(1) << 30));
    for (const int per_piece : {8, 12, 24, 48, 96}) {
      Graph g = Graph::capture(cs, [&] {
        for (int st = 0; st < steps; ++st)
          read_kernel<<<unsigned(16 * per_piece), kThreads, 0, s>>>(base, doffs + size_t(st) * 16, kPiece, per_piece, out);
      });
      const double us = strata::bench::time_us(s, reps, [&] { g.launch(cs); }) / steps;
      std::printf("| %d | %.1f | %.2f | %.0f |\n", 16 * per_piece, double(kPiece) / per_piece / 1e3, us,
                  16.0 * double(kPiece) / us / 1e3);
    }
    // Bulk copies (bulk_read_kernel) at the block counts whose shares fit in shared memory, whole shares
    // and 16 KiB copies; and the empty grid.
    CUDA_CHECK(cudaFuncSetAttribute(bulk_read_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    std::printf("\nthe same by bulk copies into shared memory (TMA)\n\n| blocks | KB a block | copy KiB | us | GB/s |\n"
                "|---:|---:|---:|---:|---:|\n");
    for (const int per_piece : {8, 12, 24, 48}) {
      const int64_t share = (kPiece / 16 + per_piece - 1) / per_piece * 16;
      for (const int chunk : {int(share), 16 * 1024, 4 * 1024}) {
        Graph g = Graph::capture(cs, [&] {
          for (int st = 0; st < steps; ++st)
            bulk_read_kernel<<<unsigned(16 * per_piece), kThreads, size_t(share), s>>>(
                base, doffs + size_t(st) * 16, kPiece, per_piece, chunk, out);
        });
        const double us = strata::bench::time_us(s, reps, [&] { g.launch(cs); }) / steps;
        std::printf("| %d | %.1f | %.0f | %.2f | %.0f |\n", 16 * per_piece, double(share) / 1e3, chunk / 1024.0, us,
                    16.0 * double(kPiece) / us / 1e3);
      }
    }
    {
      Graph g = Graph::capture(cs, [&] {
        for (int st = 0; st < steps; ++st) empty_kernel<<<192, kThreads, 0, s>>>(out);
      });
      std::printf("\nempty grid of 192 blocks: %.2f us a step\n",
                  strata::bench::time_us(s, reps, [&] { g.launch(cs); }) / steps);
    }
    CUDA_CHECK(cudaFree(doffs));
  }
  CUDA_CHECK(cudaFree(out));
  CUDA_CHECK(cudaFree(base));
  return 0;
}
