#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
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

// The wake-up paths: workers that spin (spin_us large), that sleep at once (0), and that spin, time
// out and sleep (a pause longer than spin_us between regions). Each region must cover every index
// once, and the results of back-to-back regions must not leak into each other.
TEST(ThreadPool, SpinAndSleepWakeUpsCoverEveryIndex) {
  for (int spin_us : {0, 50, 100000}) {
    ThreadPool pool(2, spin_us);  // 2: no more spinners than CI's cores
    EXPECT_EQ(pool.spin_us(), spin_us);
    for (int rep = 0; rep < 600; ++rep) {
      const int64_t n = 1 + rep % 37;
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, 1 + rep % 3, [&](int64_t b, int64_t e, int ti) {
        ASSERT_GE(ti, 0);
        ASSERT_LT(ti, 2);
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "spin " << spin_us << " rep " << rep;
      if (rep % 150 == 149) std::this_thread::sleep_for(std::chrono::microseconds(2 * spin_us % 200000 + 200));
    }
  }
}

// Destroying a pool whose workers are spinning (right after a region) or asleep must not hang.
TEST(ThreadPool, DestroysWhileSpinningOrSleeping) {
  for (int spin_us : {0, 1000000}) {
    for (int sleep_first : {0, 1}) {
      ThreadPool pool(3, spin_us);
      std::atomic<int64_t> sum{0};
      pool.parallel_for(100, 1, [&](int64_t b, int64_t e, int) { sum += e - b; });
      EXPECT_EQ(sum.load(), 100);
      if (sleep_first) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

// An exception on a worker while others spin: rethrown once, the pool still usable with spinning.
TEST(ThreadPool, RethrowsWithSpinningWorkers) {
  ThreadPool pool(2, 100000);
  for (int rep = 0; rep < 50; ++rep) {
    EXPECT_THROW(pool.parallel_for(64, 1,
                                   [](int64_t b, int64_t, int) {
                                     if (b == 33) throw std::runtime_error("boom");
                                   }),
                 std::runtime_error);
    std::atomic<int64_t> sum{0};
    pool.parallel_for(64, 1, [&](int64_t b, int64_t e, int) { sum += e - b; });
    ASSERT_EQ(sum.load(), 64);
  }
}

// A caller whose spin runs out before the workers finish (here: one item sleeps on a worker, as a
// worker waiting for a core would look) stops spinning, and spins again after the back-off once a
// region finishes within the spin.
TEST(ThreadPool, StopsSpinningWhenWorkersAreLateAndResumes) {
  ThreadPool pool(2, 200);
  ASSERT_EQ(pool.spin_now_us(), 200);
  std::atomic<int> worker_items{0};
  pool.parallel_for(64, 1, [&](int64_t, int64_t, int ti) {
    if (ti != 0) {  // the worker's item takes 20 ms, far longer than the caller's 200 us spin
      ++worker_items;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return;
    }
    // The caller's items wait (up to 1 s) until the worker holds an item, then take no time.
    for (int i = 0; i < 10000 && worker_items.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::microseconds(100));
  });
  ASSERT_EQ(worker_items.load(), 1);
  ASSERT_EQ(pool.spin_now_us(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // past the first back-off (50 ms)
  std::atomic<int64_t> sum{0};
  pool.parallel_for(2, 1, [&](int64_t b, int64_t e, int) { sum += e - b; });  // sleeps: back-off over -> spin
  EXPECT_EQ(sum.load(), 2);
  ASSERT_EQ(pool.spin_now_us(), 200);
}
