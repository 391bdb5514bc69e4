#pragma once
// Sorting networks over 64 keys a warp, in registers (ops_sample.cu's candidate prefilter and its merge of
// the stretches' lists, STRATA_CUDA_SAMPLE_MERGE). A warp's 64 keys sit 2 a lane: element r * 32 + lane in
// register r (a0: r = 0, a1: r = 1). Larger keys first ("descending").
// Why: the prefilter wants the top <= 64 keys of 2048 (and of ~75 lists of them); a block-wide bitonic sort
// of 2048 keys in shared memory is 66 steps, each ending in a barrier (~30 us a row on an H100, session 46's
// ncu run, cold caches), where a warp sorts its 64 with shuffles and no barrier, and a tree of merges that
// keeps only the top 64 of each pair takes 5 barrier-separated levels for 32 lists.
// The networks take a Lanes policy (thread index, shuffles, block barrier): DeviceLanes on the GPU; the host
// test (tests/cuda/test_warp_merge_host.cu) runs the same code on threads that emulate a block.
#include <cuda_runtime.h>

#include <cstdint>

// Loops over compile-time counts are unrolled on the device (the host compiler does not know the pragma).
#ifdef __CUDA_ARCH__
#define STRATA_WARP_MERGE_UNROLL _Pragma("unroll")
#else
#define STRATA_WARP_MERGE_UNROLL
#endif

namespace strata::cuda::warp_merge {

#ifdef __CUDACC__
struct DeviceLanes {
  __device__ __forceinline__ unsigned tid() const { return threadIdx.x; }
  __device__ __forceinline__ uint64_t shfl_xor(uint64_t v, int mask) const {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  }
  __device__ __forceinline__ uint64_t shfl(uint64_t v, int src) const { return __shfl_sync(0xffffffffu, v, src); }
  __device__ __forceinline__ void sync() const { __syncthreads(); }
};
#endif

__host__ __device__ __forceinline__ uint64_t kmax(uint64_t a, uint64_t b) { return a > b ? a : b; }
__host__ __device__ __forceinline__ uint64_t kmin(uint64_t a, uint64_t b) { return a < b ? a : b; }

// Compare-exchange of element idx with idx ^ j (j < 32: the same register of lane ^ j): the lower index keeps
// the larger key where desc, the smaller where not.
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <class Lanes>
__host__ __device__ __forceinline__ uint64_t cx_lanes(const Lanes& L, uint64_t a, int j, bool desc) {
  const uint64_t o = L.shfl_xor(a, j);
  const bool lower = (L.tid() & unsigned(j)) == 0u;
  return lower == desc ? kmax(a, o) : kmin(a, o);
}

// Sorts a bitonic sequence of 64 (a0, a1) descending: the merge half of a bitonic sort.
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <class Lanes>
__host__ __device__ __forceinline__ void bitonic_merge_desc(const Lanes& L, uint64_t& a0, uint64_t& a1) {
  const uint64_t hi = kmax(a0, a1), lo = kmin(a0, a1);  // j = 32: element lane against lane + 32
  a0 = hi;
  a1 = lo;
  STRATA_WARP_MERGE_UNROLL
  for (int j = 16; j > 0; j >>= 1) {
    a0 = cx_lanes(L, a0, j, true);
    a1 = cx_lanes(L, a1, j, true);
  }
}

// Sorts the warp's 64 keys descending. All 32 lanes.
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <class Lanes>
__host__ __device__ __forceinline__ void sort64_desc(const Lanes& L, uint64_t& a0, uint64_t& a1) {
  const unsigned lane = L.tid() & 31u;
  STRATA_WARP_MERGE_UNROLL
  for (int k2 = 2; k2 <= 32; k2 <<= 1) {
    // Blocks of k2 elements alternate descending / ascending; at k2 = 32 a block is one register.
    const bool d0 = k2 < 32 ? (lane & unsigned(k2)) == 0u : true;
    const bool d1 = k2 < 32 ? (lane & unsigned(k2)) == 0u : false;
    STRATA_WARP_MERGE_UNROLL
    for (int j = k2 >> 1; j > 0; j >>= 1) {
      a0 = cx_lanes(L, a0, j, d0);
      a1 = cx_lanes(L, a1, j, d1);
    }
  }
  bitonic_merge_desc(L, a0, a1);  // k2 = 64: register 0 descending, register 1 ascending: bitonic
}

// (a0, a1) := the top 64 of the union of two descending lists a and b, descending. All 32 lanes.
// a followed by b reversed is bitonic; the larger of a[i] and b[63 - i] are its top half, itself bitonic.
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <class Lanes>
__host__ __device__ __forceinline__ void merge64_desc(const Lanes& L, uint64_t& a0, uint64_t& a1, uint64_t b0,
                                                      uint64_t b1) {
  const int mirror = 31 - int(L.tid() & 31u);
  const uint64_t rb1 = L.shfl(b1, mirror);  // b[63 - lane]
  const uint64_t rb0 = L.shfl(b0, mirror);  // b[31 - lane]
  a0 = kmax(a0, rb1);
  a1 = kmax(a1, rb0);
  bitonic_merge_desc(L, a0, a1);
}

// keys: [32][64] in shared memory, each list descending (warp w wrote list w), at least 512 threads. Leaves the
// top 64 of all 2048 keys, descending, in keys[0, 64); the rest of keys is scratch. All threads of the block
// (barriers inside; the caller syncs before, after the lists are written).
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <class Lanes>
__host__ __device__ __forceinline__ void tree_top64(const Lanes& L, uint64_t* keys) {
  const int w = int(L.tid() >> 5), lane = int(L.tid() & 31u);
  for (int lists = 32; lists > 1; lists >>= 1) {
    uint64_t a0 = 0, a1 = 0;
    const bool act = w < lists / 2;  // warp-uniform
    if (act) {
      const uint64_t* A = keys + (2 * w) * 64;
      const uint64_t* B = A + 64;
      a0 = A[lane];
      a1 = A[lane + 32];
      merge64_desc(L, a0, a1, B[lane], B[lane + 32]);
    }
    L.sync();  // every pair read before any list is rewritten
    if (act) {
      keys[w * 64 + lane] = a0;
      keys[w * 64 + lane + 32] = a1;
    }
    L.sync();
  }
}

}  // namespace strata::cuda::warp_merge
