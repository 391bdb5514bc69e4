#pragma once
// One thread's walk over a row of values, shared by the device sampler's passes (ops_sample.cu) and their
// host test (tests/cuda/test_row_scan_host.cu). __host__ __device__ so the host can check the order.
#include <cstdint>

// Loops over compile-time counts are unrolled on the device (the host compiler does not know the pragma).
#ifdef __CUDA_ARCH__
#define STRATA_ROW_SCAN_UNROLL _Pragma("unroll")
#else
#define STRATA_ROW_SCAN_UNROLL
#endif

namespace strata::cuda::row_scan {

constexpr int kBatch = 8;  // loads a thread issues together when batched

// f(i, row[i]) for i = tid, tid + nthreads, ... < n, in that order: the order of a plain strided loop, so a
// thread's running sums keep their bits whichever way it walks. batched: the loads of kBatch of those
// values are issued before f runs on them (why: one block reads the whole row in every pass of the
// sampler, and a load at a time left ~4 KB in flight on the SM: ~50 us a pass over a 152k row on an H100,
// session 45).
// (f is a host lambda in the host test, a device one in the sampler: no execution-space check for it.)
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <typename F>
__host__ __device__ __forceinline__ void for_row(const float* row, int64_t n, int64_t tid, int64_t nthreads,
                                                 bool batched, F&& f) {
  int64_t i = tid;
  if (batched) {
    for (; i + (kBatch - 1) * nthreads < n; i += kBatch * nthreads) {
      float v[kBatch];
      STRATA_ROW_SCAN_UNROLL
      for (int j = 0; j < kBatch; ++j) v[j] = row[i + j * nthreads];
      STRATA_ROW_SCAN_UNROLL
      for (int j = 0; j < kBatch; ++j) f(i + j * nthreads, v[j]);
    }
  }
  for (; i < n; i += nthreads) f(i, row[i]);
}

}  // namespace strata::cuda::row_scan
