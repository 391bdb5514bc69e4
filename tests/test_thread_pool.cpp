#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "cpu/thread_pool.h"

using strata::ThreadPool;

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 7, 1000, 4097}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, 13, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPool, RethrowsWorkerException) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [](int64_t b, int64_t, int) {
                                   if (b == 57) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  // The pool stays usable after an exception.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(10, 1, [&](int64_t b, int64_t e, int) { sum += e - b; });
  EXPECT_EQ(sum.load(), 10);
}
