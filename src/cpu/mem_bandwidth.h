#pragma once
// Host memory read bandwidth, measured (the denominator of a CPU decode roofline).
#include <cstddef>

#include "cpu/thread_pool.h"

namespace strata::cpu {

// GB/s (1e9 bytes) of reading a `bytes` buffer with all of `pool`'s threads, each summing its own
// contiguous part; the best of `reps` passes after one that fills the buffer. bytes = 0: 1 GiB, at
// most an eighth of the machine's memory (several times any last-level cache, so DRAM is what is read).
// 0 when the buffer cannot be allocated.
double measure_host_read_gbs(ThreadPool& pool, size_t bytes = 0, int reps = 3);

}  // namespace strata::cpu
