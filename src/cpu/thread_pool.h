#pragma once
// A persistent pool of CPU threads for data-parallel loops (matmul rows, attention heads, experts).
// parallel_for hands out chunks of [0, n) through one atomic counter: threads that finish early take
// more work, so uneven rows (mixed formats, experts of different load) balance themselves.
//
// Wake-up: after a parallel region, workers spin (pause loop) for spin_us microseconds before they
// sleep on a condition variable, and the caller spins as long for the workers to finish. Why: a decode
// step is hundreds of small regions (a MoE layer's experts take ~0.2 ms on 16 cores); a futex wake-up
// of every thread per region costs tens of microseconds, a spinning worker sees the next region within
// ~0.1 us. Between requests the workers sleep. Default 1000 us, STRATA_POOL_SPIN_US overrides it; 0 when
// the pool has more threads than the hardware (a spinner would take the core a worker needs). When the
// caller's wait outlasts its spin (the machine is busier than the pool: other processes hold the
// cores), the pool sleeps instead of spinning for the next 50 ms, then tries spinning again (the wait
// doubling, up to 3.2 s, while the retries keep failing).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
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
  // spin_us: how long idle workers (and the waiting caller) spin before sleeping; < 0 = the default.
  ThreadPool(int n_threads, int spin_us);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  int spin_us() const { return spin_us_; }
  // The spin in use now: spin_us(), or 0 while backing off after the workers were starved.
  int spin_now_us() const { return spin_now_us_.load(std::memory_order_relaxed); }

  // Calls fn(begin, end, thread_index) over disjoint ranges covering [0, n), `grain` items at a
  // time (the last range may be shorter). Returns when all are done. Not re-entrant: fn must not
  // call parallel_for on the same pool. The first exception thrown by fn is rethrown here.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void worker(int index);
  void run_chunks(int thread_index);

  int n_threads_;
  int spin_us_ = 0;                             // configured spin
  std::atomic<int> spin_now_us_{0};             // in use: 0 for a while after the workers were starved
  std::chrono::steady_clock::time_point spin_retry_at_{};  // caller only: when to spin again
  int starved_streak_ = 0;                      // caller only: starved retries in a row
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  int sleepers_ = 0;                 // workers waiting on cv_start_ (guarded by mu_)
  std::atomic<bool> stop_{false};
  // current job (written by the caller before generation_ is bumped, read-only while it runs)
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  std::exception_ptr error_;
  std::mutex error_mu_;
  // Each hot atomic on its own cache line: every fetch_add of next_ would otherwise invalidate the
  // line the other threads read the job fields and the generation from.
  alignas(64) std::atomic<uint64_t> generation_{0};  // bumped (under mu_) to start a job
  alignas(64) std::atomic<int64_t> next_{0};          // next item to hand out
  alignas(64) std::atomic<int> pending_{0};           // workers not yet done with the current job
  char pad_[64 - sizeof(std::atomic<int>)];
};

// The process-wide pool used when a caller passes none (size from STRATA_THREADS or the hardware).
ThreadPool& default_thread_pool();

}  // namespace strata
