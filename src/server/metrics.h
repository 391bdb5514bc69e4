#pragma once
// Server counters and gauges. Counters are atomics bumped by the HTTP threads and the scheduler;
// render_prometheus() writes the Prometheus text exposition format (version 0.0.4) and
// stats_json() the same figures for the web page's monitor.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "server/backend.h"

namespace strata::server {

// What the scheduler reports about itself at one instant.
struct SchedulerSnapshot {
  int64_t queue_depth = 0;        // admitted to the queue, waiting for a sequence
  int64_t running = 0;            // sequences generating
  int64_t parked = 0;             // idle conversations kept for reuse
  int64_t parallel = 0;           // --parallel
  int64_t max_queue = 0;
  uint64_t kv_bytes_running = 0;  // memory of running sequences
  uint64_t kv_bytes_parked = 0;
  uint64_t kv_budget_parked = 0;  // --park-mb
  int64_t tokens_in_kv = 0;       // tokens held by all sequences (running + parked)
  double heartbeat_age_s = 0;     // time since the loop last went round
  bool loop_alive = false;
  bool draining = false;
  double decode_tok_s = 0;        // generated tokens per second over the last window
  double prefill_tok_s = 0;       // evaluated prompt tokens per second over the last window
};

class Metrics {
 public:
  // Requests by endpoint (index = ApiKind) and outcome.
  enum Outcome { kOk = 0, kClientError, kRejected /*429/503*/, kServerError, kCancelled, kOutcomes };
  void count_request(ApiKind kind, Outcome o) { requests_[size_t(kind)][o]++; }
  std::atomic<uint64_t> prompt_tokens{0};       // prompt tokens of finished requests
  std::atomic<uint64_t> prompt_tokens_evaluated{0};
  std::atomic<uint64_t> prompt_tokens_reused{0};
  std::atomic<uint64_t> generated_tokens{0};
  std::atomic<uint64_t> decode_steps{0};
  std::atomic<uint64_t> decode_batch_tokens{0};  // sum of batch sizes (mean batch = this / steps)
  std::atomic<uint64_t> parked_evictions{0};
  std::atomic<uint64_t> disconnects{0};
  std::atomic<uint64_t> http_unauthorized{0};

  std::string render_prometheus(const BackendInfo& info, const BackendStats& bs,
                                const SchedulerSnapshot& s) const;
  nlohmann::json stats_json(const BackendInfo& info, const BackendStats& bs,
                            const SchedulerSnapshot& s) const;

 private:
  std::array<std::array<std::atomic<uint64_t>, kOutcomes>, 3> requests_{};
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Resident set size of this process in bytes (from /proc/self/statm), 0 when unknown.
uint64_t process_rss_bytes();

}  // namespace strata::server
