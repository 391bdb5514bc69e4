#include "cpu/thread_pool.h"

#include <chrono>
#include <cstdlib>
#include <string>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define STRATA_CPU_RELAX() _mm_pause()
#else
#define STRATA_CPU_RELAX() std::this_thread::yield()
#endif

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kStarvedBackoff(50);

// Spins until pred() or `spin` has passed; true if pred() held. The clock is read every 64 polls.
template <class Pred>
bool spin_until(Pred pred, std::chrono::microseconds spin) {
  if (spin.count() <= 0) return pred();
  const auto deadline = Clock::now() + spin;
  for (uint32_t i = 1;; ++i) {
    if (pred()) return true;
    STRATA_CPU_RELAX();
    if (i % 64 == 0 && Clock::now() >= deadline) return pred();
  }
}

int default_spin_us(int n_threads) {
  if (const char* s = std::getenv("STRATA_POOL_SPIN_US")) return std::max(0, std::atoi(s));
  // More threads than hardware threads: a spinning thread takes the core a worker needs.
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return n_threads > hw ? 0 : 1000;
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : ThreadPool(n_threads, -1) {}

ThreadPool::ThreadPool(int n_threads, int spin_us) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  spin_us_ = spin_us < 0 ? default_spin_us(n_threads_) : spin_us;
  spin_now_us_.store(spin_us_, std::memory_order_relaxed);
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true, std::memory_order_release);
  }
  cv_start_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run_chunks(int thread_index) {
  for (;;) {
    int64_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (begin >= n_) return;
    int64_t end = std::min(n_, begin + grain_);
    try {
      (*fn_)(begin, end, thread_index);
    } catch (...) {
      std::lock_guard<std::mutex> lk(error_mu_);
      if (!error_) error_ = std::current_exception();
      next_.store(n_, std::memory_order_relaxed);  // stop handing out work
    }
  }
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::chrono::microseconds spin(spin_now_us_.load(std::memory_order_relaxed));
    // Spin a while first (the next parallel region of a forward pass comes within microseconds), then
    // sleep on the condition variable. The generation is bumped under mu_, so a sleeper cannot miss it.
    auto ready = [&] {
      return generation_.load(std::memory_order_acquire) != seen || stop_.load(std::memory_order_acquire);
    };
    if (!spin_until(ready, spin)) {
      std::unique_lock<std::mutex> lk(mu_);
      ++sleepers_;
      cv_start_.wait(lk, ready);
      --sleepers_;
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    run_chunks(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lk(mu_);  // the caller may be about to sleep on cv_done_
      cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  fn_ = &fn;
  n_ = n;
  grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  bool wake;
  {
    std::lock_guard<std::mutex> lk(mu_);
    generation_.fetch_add(1, std::memory_order_release);  // publishes the job to spinning workers
    wake = sleepers_ > 0;
  }
  if (wake) cv_start_.notify_all();
  run_chunks(0);
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  const int spin_now = spin_now_us_.load(std::memory_order_relaxed);
  if (!spin_until(done, std::chrono::microseconds(spin_now))) {
    // The workers did not finish while we spun: if we spun at all, they were most likely waiting for
    // a core (more runnable threads than cores: other processes). Spinning then only delays them by
    // the spin each region, so sleep-only for kStarvedBackoff, then try spinning again.
    if (spin_now > 0) {  // each failed retry doubles the wait before the next (50 ms .. 3.2 s)
      spin_now_us_.store(0, std::memory_order_relaxed);
      spin_retry_at_ = Clock::now() + kStarvedBackoff * (1 << starved_streak_);
      starved_streak_ = std::min(starved_streak_ + 1, 6);
    }
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, done);
  } else if (spin_now > 0) {
    starved_streak_ = 0;
  }
  if (spin_now == 0 && spin_us_ > 0 && Clock::now() >= spin_retry_at_)  // back-off over: spin again
    spin_now_us_.store(spin_us_, std::memory_order_relaxed);
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

ThreadPool& default_thread_pool() {
  static ThreadPool pool([] {
    const char* s = std::getenv("STRATA_THREADS");
    return s ? std::atoi(s) : 0;
  }());
  return pool;
}

}  // namespace strata
