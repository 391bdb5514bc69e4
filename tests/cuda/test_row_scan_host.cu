// The device sampler's row walk (cuda/row_scan.cuh), run on the host without a GPU: batched, every thread
// visits the same indices in the same order as the plain strided loop, and each index of the row is
// visited by exactly one thread once, for row lengths around the batch's span and block sizes of 32 to 1024.
// Why it matters: the sampler's running sums in double (top-p, the draw's cumulative sums) keep their bits
// only if each thread adds its values in the same order.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/row_scan.cuh"

namespace rs = strata::cuda::row_scan;

TEST(RowScanHost, BatchedVisitsThePlainLoopsIndicesInOrder) {
  for (int64_t nthreads : {int64_t(32), int64_t(256), int64_t(1024)})
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(31), nthreads - 1, nthreads, nthreads * rs::kBatch - 1,
                      nthreads * rs::kBatch, nthreads * rs::kBatch + 1, 3 * nthreads * rs::kBatch + 5,
                      int64_t(151936)}) {
      if (n < 0) continue;
      std::vector<float> row(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) row[size_t(i)] = float(i) * 0.5f - 3.0f;
      std::vector<int> seen(static_cast<size_t>(n), 0);
      for (int64_t tid = 0; tid < nthreads; ++tid) {
        std::vector<int64_t> plain, batched;
        bool values_ok = true;
        rs::for_row(row.data(), n, tid, nthreads, false, [&](int64_t i, float) { plain.push_back(i); });
        rs::for_row(row.data(), n, tid, nthreads, true, [&](int64_t i, float v) {
          batched.push_back(i);
          values_ok = values_ok && v == row[size_t(i)];
        });
        ASSERT_EQ(batched, plain) << "n " << n << " threads " << nthreads << " tid " << tid;
        ASSERT_TRUE(values_ok) << "n " << n << " threads " << nthreads << " tid " << tid;
        for (int64_t i : batched) ++seen[size_t(i)];
      }
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(seen[size_t(i)], 1) << "index " << i << " of " << n << ", threads " << nthreads;
    }
}
