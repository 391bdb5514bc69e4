#pragma once
// A process-wide setting: set() (tests, benchmarks) wins; otherwise the first get() takes the value from the
// environment (from_env) and keeps it. Safe to call from several threads: the first value stored sticks.
// The fast path is one relaxed load (some settings are read at every kernel launch). EnvInt holds a
// non-negative int (e.g. a count), EnvSwitch an on/off switch.
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace strata {

class EnvInt {
 public:
  template <typename FromEnv>
  int get(FromEnv&& from_env) {
    int v = state_.load(std::memory_order_relaxed);
    if (v < 0) {
      int expected = -1;
      state_.compare_exchange_strong(expected, from_env());
      v = state_.load();
    }
    return v;
  }
  void set(int v) { state_.store(v); }  // v >= 0

 private:
  std::atomic<int> state_{-1};  // -1: not decided yet
};

class EnvSwitch {
 public:
  template <typename FromEnv>
  bool get(FromEnv&& from_env) {
    return value_.get([&] { return from_env() ? 1 : 0; }) == 1;
  }
  void set(bool on) { value_.set(on ? 1 : 0); }

 private:
  EnvInt value_;
};

// True unless the environment sets `name` to "0": how a switch that is on by default reads it.
inline bool env_on_unless_zero(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr || std::strcmp(e, "0") != 0;
}

// The environment's `name` as one digit from lo to hi (0 <= lo <= hi <= 9), else `fallback` (unset, or
// anything else): how a small count setting reads it.
inline int env_digit(const char* name, int lo, int hi, int fallback) {
  const char* e = std::getenv(name);
  return e == nullptr || e[0] < '0' + lo || e[0] > '0' + hi || e[1] != 0 ? fallback : e[0] - '0';
}

}  // namespace strata
