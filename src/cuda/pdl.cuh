#pragma once
// Programmatic dependent launch (PDL, sm_90) for the decode kernels (private to src/cuda).
//
// Why: a decode layer is ~10 short kernels in a row; between two of them the GPU drains the first grid,
// then launches the next and its blocks start loading. With PDL the next kernel is launched while the
// previous one runs (as soon as every block of the previous one has passed pdl_wait()), runs whatever
// does not depend on it (e.g. prefetching its own weights, which no kernel writes), and waits in
// pdl_wait() for the previous grid to complete and its memory to be visible. In CUDA graphs the stream
// capture turns the attribute into programmatic edges.
//
// Contract for a kernel launched with pdl::launch:
//   * pdl_wait() is called by every thread before it reads anything an earlier kernel of the stream
//     writes, writes anything an earlier kernel reads or writes, and before any return (so the grid
//     completes only after its predecessor did: completion stays transitive along the stream);
//   * pdl_launch_dependents() right after pdl_wait() (the next kernel may then be launched).
// Work before pdl_wait() may only read memory no kernel writes (weights) or the kernel's own shared memory.
// Without the attribute (pdl::enabled() false, or a launch through <<<>>>) both calls are no-ops, so
// the kernels stay correct when launched either way.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "common/env_switch.h"
#include "cuda/cuda_check.cuh"
#include "cuda/pdl_trace.h"

namespace strata::cuda::pdl {

// The process-wide switch.
inline EnvSwitch& state() {
  static EnvSwitch s;
  return s;
}

// On unless the environment sets STRATA_CUDA_PDL=0 (read on first use) or set_enabled(false) ran. Launches
// made after a change use the new setting (graphs keep what they captured).
inline bool enabled() {
  return state().get([] {
    const char* e = std::getenv("STRATA_CUDA_PDL");
    return e == nullptr || std::strcmp(e, "0") != 0;
  });
}
inline void set_enabled(bool on) { state().set(on); }
// Set by pdl::PlainLaunches (pdl_scope.h) on the calling thread: launches stay plain (defined in pdl.cu).
bool plain_launches();

// The shared-memory carveout every kernel launched here asks for (cudaFuncAttributePreferredSharedMemoryCarveout,
// percent of the SM's unified L1/shared memory; -1, the default: left to the driver). STRATA_CUDA_CARVEOUT=N
// asks for N for every kernel (read once). Why the knob: an SM runs blocks of two kernels at once only
// under one carveout, and the driver picks one per kernel (ncu: 32 KB for gate_up, 102 KB for down,
// 233 KB for the router and attention), which can keep the next kernel's blocks off an SM until the
// previous kernel's blocks there end. Measured on the H200 (bench/results/2026-12-02-gpu-session12-h200.md)
// at 100: the router's blocks reached their wait 2.1 us early instead of 0.5, router -0.6 us and down
// -1.7 us a layer, but gate_up +1.2 us; tok/s within noise (404.8 / 426.0 against 421.3 / 416.0). So not
// on by default.
int carveout();
// A carveout setting from the environment variable `name`: N for "0".."100", else -1 (the driver's choice).
int carveout_from_env(const char* name);
// Sets the carveout on `kernel` once per (kernel, device) (defined in pdl.cu).
void prefer_carveout(const void* kernel);

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when enabled().
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  const bool on = enabled() && !plain_launches();
  prefer_carveout(reinterpret_cast<const void*>(kernel));
  cfg.attrs = on ? attr : nullptr;
  cfg.numAttrs = on ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace strata::cuda::pdl

namespace strata::cuda {

// Waits until the grids this one depends on have completed and their memory is visible (no-op when the
// kernel was not launched with the PDL attribute).
#if defined(STRATA_PDL_TRACE) && defined(__CUDACC__)
// The traced wait (cuda/pdl_trace.h): each translation unit has its own ring (static), registered with
// pdl.cu's dump_all() at load.
namespace pdl_trace {
struct Rec {
  unsigned long long reached, returned;  // %globaltimer, ns
  // kind: 0 block 0's wait; 3 the grid's last block's wait; 1 / 2 a mark (pdl_mark) of block 0 / the last
  // block (reached == returned). line 0: a reserved record no mark used (skipped).
  unsigned line, kind;
};
constexpr unsigned kCap = 1u << 18;
constexpr unsigned kMarks = 6;  // marks a traced block may record after its wait
static __device__ Rec g_rec[kCap];
static __device__ unsigned g_n;
// Every block's end (pdl_end): how many blocks ended b * kEndBucketNs .. ns after their own wait returned,
// per end site (slot = line % kEndSites; g_end_line names the site; two sites of one file whose lines are
// equal mod kEndSites would share a slot). Fire-and-forget atomics: a block does not wait for them.
constexpr unsigned kEndSites = 64, kEndBuckets = 128, kEndBucketNs = 250;
static __device__ unsigned g_end_hist[kEndSites][kEndBuckets];
static __device__ unsigned g_end_line[kEndSites];
// Every block's own record at its end (pdl_end), in a ring that keeps the translation unit's latest kBlkCap
// ends (the last passes of a bench): when its wait returned and when it ended, which block and which SM.
// Why: the histogram shows that a kernel has a tail, not which blocks make it (late to start, sharing an SM,
// or one grid position); scripts/pdl-trace-report groups these by launch and says.
struct BlkRec {
  unsigned long long returned, end;  // %globaltimer, ns
  unsigned line, bx, by, smid;
};
constexpr unsigned kBlkCap = 1u << 16;
static __device__ BlkRec g_blk[kBlkCap];
static __device__ unsigned g_blk_n;
void register_dumper(const char* tu, void (*fn)(std::FILE*, const char*, const ReadDevice&));
// Lines "tu,line,reached,returned,kind" (kind 0-3: Rec above), then "tu,line,bucket,blocks,5" for every
// non-empty bucket of the block-end histograms, then "tu,line,returned,end,6,bx,by,smid" per block record.
static void dump(std::FILE* f, const char* tu, const ReadDevice& read) {
  void* n_at = nullptr;
  void* rec_at = nullptr;
  void* hist_at = nullptr;
  void* line_at = nullptr;
  CUDA_CHECK(cudaGetSymbolAddress(&n_at, g_n));
  CUDA_CHECK(cudaGetSymbolAddress(&rec_at, g_rec));
  CUDA_CHECK(cudaGetSymbolAddress(&hist_at, g_end_hist));
  CUDA_CHECK(cudaGetSymbolAddress(&line_at, g_end_line));
  unsigned n = 0;
  read(&n, n_at, sizeof n);
  if (n > kCap) n = kCap;
  std::vector<Rec> v(n);
  if (n > 0) read(v.data(), rec_at, n * sizeof(Rec));
  for (const Rec& r : v)
    if (r.line != 0) std::fprintf(f, "%s,%u,%llu,%llu,%u\n", tu, r.line, r.reached, r.returned, r.kind);
  std::vector<unsigned> hist(size_t(kEndSites) * kEndBuckets), lines(kEndSites);
  read(hist.data(), hist_at, hist.size() * sizeof(unsigned));
  read(lines.data(), line_at, lines.size() * sizeof(unsigned));
  for (unsigned s = 0; s < kEndSites; ++s)
    for (unsigned b = 0; b < kEndBuckets; ++b)
      if (lines[s] != 0 && hist[size_t(s) * kEndBuckets + b] != 0)
        std::fprintf(f, "%s,%u,%u,%u,5\n", tu, lines[s], b, hist[size_t(s) * kEndBuckets + b]);
  void* bn_at = nullptr;
  void* blk_at = nullptr;
  CUDA_CHECK(cudaGetSymbolAddress(&bn_at, g_blk_n));
  CUDA_CHECK(cudaGetSymbolAddress(&blk_at, g_blk));
  unsigned bn = 0;
  read(&bn, bn_at, sizeof bn);
  std::vector<BlkRec> blk(bn < kBlkCap ? bn : kBlkCap);
  if (!blk.empty()) read(blk.data(), blk_at, blk.size() * sizeof(BlkRec));
  for (const BlkRec& r : blk)
    if (r.line != 0)
      std::fprintf(f, "%s,%u,%llu,%llu,6,%u,%u,%u\n", tu, r.line, r.returned, r.end, r.bx, r.by, r.smid);
}
static const bool g_registered = (register_dumper(__BASE_FILE__, dump), true);
// The traced block's next free record and its end (thread 0's, per block; set by the traced wait).
static __device__ __forceinline__ unsigned* block_records() {
  __shared__ unsigned r[2];
  return r;
}
// When the block's wait returned (%globaltimer, thread 0's; set by the traced wait in every block).
static __device__ __forceinline__ unsigned long long* block_wait_returned() {
  __shared__ unsigned long long t;
  return &t;
}
// 1: block 0, 2: the grid's last block (x), 0: not traced. Thread 0 only.
static __device__ __forceinline__ unsigned traced_block() {
  if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0 || blockIdx.y != 0 || blockIdx.z != 0) return 0;
  return blockIdx.x == 0 ? 1u : blockIdx.x == gridDim.x - 1 ? 2u : 0u;
}
}  // namespace pdl_trace
// Block 0 and the grid's last block each reserve 1 + kMarks records with one atomic issued before the wait
// (its latency is hidden when the block is early), so the marks after the wait cost a timer read and a
// store, not an atomic round trip on the chain.
static __device__ __forceinline__ void pdl_wait_at(unsigned line) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned tb = pdl_trace::traced_block();
  unsigned i = 0;
  unsigned long long t0 = 0, t1 = 0;
  if (tb != 0) {
    i = atomicAdd(&pdl_trace::g_n, 1u + pdl_trace::kMarks);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {  // every block: for pdl_end's histogram
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    *pdl_trace::block_wait_returned() = t1;
  }
  if (tb != 0) {
    unsigned* br = pdl_trace::block_records();
    const bool fits = i + 1 + pdl_trace::kMarks <= pdl_trace::kCap;
    if (fits) pdl_trace::g_rec[i] = {t0, t1, line, tb == 1 ? 0u : 3u};
    br[0] = fits ? i + 1 : 0;
    br[1] = fits ? i + 1 + pdl_trace::kMarks : 0;
  }
#endif
}
#define pdl_wait() pdl_wait_at(__LINE__)
// A point inside a kernel (after its pdl_wait), for the timeline: thread 0 of block 0 and of the grid's
// last block (x) record when they passed it (scripts/pdl-trace-report: the time since the kernel's wait
// returned). Up to kMarks per block and launch; more are dropped.
static __device__ __forceinline__ void pdl_mark_at(unsigned line) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned tb = pdl_trace::traced_block();
  if (tb == 0) return;
  unsigned* br = pdl_trace::block_records();
  if (br[0] >= br[1]) return;
  unsigned long long t = 0;
  // ("memory": not moved above the memory accesses before it; a load still in flight is waited for only
  // where its value is used, so a mark that should follow a load goes after a use, e.g. a store of it)
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  pdl_trace::g_rec[br[0]++] = {t, t, line, tb};
#endif
}
#define pdl_mark() pdl_mark_at(__LINE__)
// A block's end (after its pdl_wait): pdl_mark() for block 0 and the grid's last block, and for every
// block, thread 0 adds the time since its own wait returned to the site's histogram (pdl_trace::g_end_hist;
// scripts/pdl-trace-report prints its percentiles) and writes the block's record (pdl_trace::g_blk). Why:
// the step of a kernel ends with its slowest block, and the marks show only two. Thread 0's end stands for
// the block's (warps that end later are not seen).
static __device__ __forceinline__ void pdl_end_at(unsigned line) {
  pdl_mark_at(line);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0) return;
  unsigned long long t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  const unsigned long long dt = t - *pdl_trace::block_wait_returned();
  const unsigned b = dt / pdl_trace::kEndBucketNs < pdl_trace::kEndBuckets ? unsigned(dt / pdl_trace::kEndBucketNs)
                                                                            : pdl_trace::kEndBuckets - 1;
  const unsigned slot = line % pdl_trace::kEndSites;
  pdl_trace::g_end_line[slot] = line;
  atomicAdd(&pdl_trace::g_end_hist[slot][b], 1u);
  unsigned smid = 0;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  const unsigned j = atomicAdd(&pdl_trace::g_blk_n, 1u) % pdl_trace::kBlkCap;
  pdl_trace::g_blk[j] = {*pdl_trace::block_wait_returned(), t, line, blockIdx.x, blockIdx.y, smid};
#endif
}
#define pdl_end() pdl_end_at(__LINE__)
#else
#define pdl_mark() ((void)0)
#define pdl_end() ((void)0)
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
#endif

// Lets the next kernel of the stream (if launched with the attribute) be launched.
// A build configured with -DSTRATA_PDL_TRIGGER_AT_EXIT=ON (for measuring) leaves it out: the next kernel
// is then launched as this grid's blocks exit. Why the option: the next kernel's blocks, launched early,
// wait on the SMs beside this kernel's (e.g. wo's 256 blocks for 12 us beside attention's, session 13);
// whether waiting blocks slow their neighbours is what it measures (against losing the early prefetch).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(STRATA_PDL_TRIGGER_AT_EXIT)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// An L2 prefetch of the 128-byte line holding p (weights read before pdl_wait()).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// An L2 prefetch of every 128-byte line holding a byte of [p, p + bytes), by the calling thread alone (a
// row a thread owns, e.g. one K/V row of attention or one expert's down row).
__device__ __forceinline__ void prefetch_l2_range(const void* p, int64_t bytes) {
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + uintptr_t(bytes);
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(127); a < end; a += 128)
    prefetch_l2(reinterpret_cast<const void*>(a));
}

// An L2 prefetch of [p, p + bytes) by the calling thread: one bulk prefetch (Hopper's TMA; nothing waits
// on it) when p and bytes are 16-byte multiples, else line by line (prefetch_l2_range).
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if ((reinterpret_cast<uintptr_t>(p) | bytes) % 16 == 0) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
    return;
  }
#endif
  prefetch_l2_range(p, bytes);
}

// One warp's L2 prefetch of `bytes` bytes from p (a product's weight rows before pdl_wait()): lane i takes
// the lines i, i + 32, ...
__device__ __forceinline__ void warp_prefetch_l2(const uint8_t* p, int64_t bytes, int lane) {
  for (int64_t off = int64_t(lane) * 128; off < bytes; off += 32 * 128) prefetch_l2(p + off);
}

}  // namespace strata::cuda
