#include "cpu/mem_bandwidth.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "common/error.h"

namespace strata::cpu {

double measure_host_read_gbs(ThreadPool& pool, size_t bytes, int reps) {
  STRATA_REQUIRE(reps >= 1, "memory bandwidth: reps must be >= 1, got {}", reps);
  if (bytes == 0) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const size_t ram = pages > 0 && page > 0 ? size_t(pages) * size_t(page) : size_t(8) << 30;
    bytes = std::min<size_t>(size_t(1) << 30, ram / 8);
  }
  // Whole 64-byte lines per thread part; 16-byte vectors, four accumulators: loads, not adds, limit.
  using V = uint64_t __attribute__((vector_size(16)));
  constexpr size_t kLine = 64;
  const int64_t n_lines = int64_t(bytes / kLine);
  STRATA_REQUIRE(n_lines >= 1, "memory bandwidth: {} bytes is less than one cache line", bytes);
  // No memory for the probe (a small machine, a limit): not measured, rather than a failed command.
  std::unique_ptr<V[]> buf(new (std::nothrow) V[size_t(n_lines) * (kLine / sizeof(V))]);
  if (!buf) return 0;
  V* base = buf.get();
  const int64_t grain = std::max<int64_t>(1, n_lines / pool.size());
  // Filled by the threads that later read it (first touch: each part's pages near its reader).
  pool.parallel_for(n_lines, grain, [&](int64_t b, int64_t e, int) {
    std::memset(static_cast<void*>(base + b * 4), int(b & 0xff), size_t(e - b) * kLine);
  });
  std::atomic<uint64_t> sink{0};
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n_lines, grain, [&](int64_t b, int64_t e, int) {
      V a0{}, a1{}, a2{}, a3{};
      for (const V* p = base + b * 4; p < base + e * 4; p += 4) {
        a0 ^= p[0];
        a1 ^= p[1];
        a2 ^= p[2];
        a3 ^= p[3];
      }
      const V a = a0 ^ a1 ^ a2 ^ a3;
      sink.fetch_xor(a[0] ^ a[1], std::memory_order_relaxed);  // the loads cannot be dropped
    });
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sec > 0) best = std::max(best, double(n_lines) * kLine / sec / 1e9);
  }
  return best;
}

}  // namespace strata::cpu
