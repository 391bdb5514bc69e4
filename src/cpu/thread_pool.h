#pragma once
// A persistent pool of CPU threads for data-parallel loops (matmul rows, attention heads, experts).
// parallel_for hands out chunks of [0, n) through one atomic counter: threads that finish early take
// more work, so uneven rows (mixed formats, experts of different load) balance themselves.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
 public:
  // n_threads counts the calling thread too: ThreadPool(1) runs everything on the caller.
  // 0 = one per hardware thread.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) over disjoint ranges covering [0, n), `grain` items at a
  // time (the last range may be shorter). Returns when all are done. Not re-entrant: fn must not
  // call parallel_for on the same pool. The first exception thrown by fn is rethrown here.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void worker(int index);
  void run_chunks(int thread_index);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  uint64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
  // current job
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
  std::mutex error_mu_;
};

// The process-wide pool used when a caller passes none (size from STRATA_THREADS or the hardware).
ThreadPool& default_thread_pool();

}  // namespace strata
