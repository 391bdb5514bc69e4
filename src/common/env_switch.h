#pragma once
// A process-wide on/off switch: set() (tests, benchmarks) wins; otherwise the first get() takes the value
// from the environment (from_env) and keeps it. Safe to call from several threads: the first value stored
// sticks. The fast path is one relaxed load (some switches are read at every kernel launch).
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace strata {

class EnvSwitch {
 public:
  template <typename FromEnv>
  bool get(FromEnv&& from_env) {
    int v = state_.load(std::memory_order_relaxed);
    if (v < 0) {
      int expected = -1;
      state_.compare_exchange_strong(expected, from_env() ? 1 : 0);
      v = state_.load();
    }
    return v == 1;
  }
  void set(bool on) { state_.store(on ? 1 : 0); }

 private:
  std::atomic<int> state_{-1};  // -1: not decided yet
};

// True unless the environment sets `name` to "0": how a switch that is on by default reads it.
inline bool env_on_unless_zero(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr || std::strcmp(e, "0") != 0;
}

}  // namespace strata
