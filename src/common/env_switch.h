#pragma once
// A process-wide setting: set() (tests, benchmarks) wins; otherwise the first get() takes the value from the
// environment (from_env) and keeps it. Safe to call from several threads: the first value stored sticks.
// The fast path is one relaxed load (some settings are read at every kernel launch). EnvInt holds a
// non-negative int (e.g. a count), EnvSwitch an on/off switch, DigitSetting (below) a count of one digit.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common/error.h"

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

// A small count setting (a launch shape's blocks an SM, rows a lane group, ...): set() (tests, benchmarks)
// takes lo..hi only (strata::Error "what: v (lo to hi)" otherwise) and wins; otherwise the first get() reads
// the environment's `name` with env_digit (else `fallback`) and keeps it.
class DigitSetting {
 public:
  DigitSetting(const char* name, const char* what, int lo, int hi, int fallback)
      : name_(name), what_(what), lo_(lo), hi_(hi), fallback_(fallback) {}
  int get() {
    return value_.get([this] { return env_digit(name_, lo_, hi_, fallback_); });
  }
  void set(int v) {
    STRATA_REQUIRE(v >= lo_ && v <= hi_, "{}: {} ({} to {})", what_, v, lo_, hi_);
    value_.set(v);
  }

 private:
  const char* name_;
  const char* what_;
  int lo_, hi_, fallback_;
  EnvInt value_;
};

}  // namespace strata
