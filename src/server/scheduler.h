#pragma once
// Continuous batching over --parallel sequences, on one thread that owns the backend's compute:
//   each step: drop cancelled requests (flag or closed connection), admit queued requests into free
//   sequences (reusing the longest cached prefix among parked conversations), prefill new ones in
//   chunks, then one batched decode step with one token for every generating sequence.
// Finished conversations are parked (their KV kept, LRU, up to a memory budget) so a follow-up whose
// prompt starts with the same tokens evaluates only the new tail. Requests wait in a bounded queue.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/api_request.h"
#include "server/api_response.h"
#include "server/backend.h"
#include "server/metrics.h"
#include "server/text_stream.h"

namespace strata::server {

// One generation request in flight. The HTTP thread fills the inputs and submits it; the scheduler
// appends released text and finally sets `done`; the HTTP thread consumes under `mu`.
struct Job {
  // ---- inputs (set before submit, read-only after) ----
  ApiKind kind = ApiKind::ChatCompletions;
  std::vector<int32_t> prompt;          // token ids
  SamplingOptions sampling;
  uint64_t seed = 0;
  int32_t max_tokens = 1;               // >= 1, prompt + max_tokens <= n_ctx
  std::vector<std::string> stop;
  bool ignore_eos = false;              // end-of-generation tokens are never sampled
  int watch_fd = -1;                    // the client's socket: closed -> cancel (-1: none)

  // ---- cancel (any thread) ----
  std::atomic<bool> cancel{false};
  std::atomic<bool> client_gone{false};  // set with cancel when a write to the client failed

  // ---- outputs (guarded by mu) ----
  std::mutex mu;
  std::condition_variable cv;
  std::string text;                     // released, not yet taken by the HTTP thread
  std::vector<size_t> text_cuts;        // end offset in `text` of each piece released (a token's text):
                                        // a stream sends one event per piece, however late it reads them
  bool started = false;                 // prompt evaluated, first token sampled
  bool done = false;
  FinishReason finish = FinishReason::None;
  std::string matched_stop;
  Usage usage;
  std::string error;                    // non-empty: failed (500)
};

struct SchedulerConfig {
  int parallel = 4;                    // sequences generating at once
  int max_queue = 64;                  // requests waiting beyond those
  uint64_t park_budget_bytes = 0;      // memory for parked conversations (0: none kept)
  int32_t prefill_chunk = 256;         // prompt tokens per sequence per step
  std::chrono::milliseconds idle_tick{100};  // heartbeat period when idle
};

class Scheduler {
 public:
  Scheduler(Backend& backend, SchedulerConfig cfg, Metrics& metrics);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void start();
  // Queues a job. Throws ApiError 429 when the queue is full, 503 when draining or stopped.
  void submit(const std::shared_ptr<Job>& job);
  // Stops admitting; lets running and queued requests finish for up to `grace`, then cancels the
  // rest, and joins the loop. Idempotent.
  void drain_and_stop(std::chrono::milliseconds grace);
  bool draining() const { return draining_.load(); }

  SchedulerSnapshot snapshot() const;
  const SchedulerConfig& config() const { return cfg_; }

 private:
  struct Slot {
    std::unique_ptr<BackendSequence> seq;
    std::vector<int32_t> tokens;        // ids whose KV is in seq (tokens.size() == seq->n_past())
    std::shared_ptr<Job> job;           // null when parked
    std::unique_ptr<TokenSampler> sampler;
    TextStream text;
    size_t prefill_pos = 0;             // next prompt index to evaluate
    int32_t pending = -1;               // sampled, not yet evaluated (-1: still prefilling)
    int32_t n_generated = 0;
    uint64_t last_used = 0;             // LRU stamp
  };

  void loop();
  void step();
  bool check_cancelled(Slot& s);
  void admit();
  std::unique_ptr<Slot> take_slot_for(const std::vector<int32_t>& prompt, int32_t& reuse);
  void prefill_some(Slot& s);
  void decode_all();
  void publish();  // the figures snapshot() and submit() read (pub_)
  // Handles a sampled token; returns true when the request finished.
  bool on_token(Slot& s, int32_t token);
  int32_t sample(Slot& s, float* logits);  // applies ignore_eos, then the request's sampler
  void finish(Slot& s, FinishReason why);
  void fail(Slot& s, const std::string& msg);
  void emit(Job& job, const std::string& text);
  void park(std::unique_ptr<Slot> s);
  void enforce_park_budget();
  void cancel_all_remaining();
  void record_rate(uint64_t gen, uint64_t prefill);

  Backend& backend_;
  const BackendInfo info_;
  SchedulerConfig cfg_;
  Metrics& metrics_;

  mutable std::mutex mu_;                       // guards queue_, the snapshot figures, stop flags
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::atomic<bool> draining_{false};
  bool stop_ = false;
  bool cancel_all_ = false;
  std::thread thread_;

  // Loop-thread state (snapshot copies under mu_).
  std::vector<std::unique_ptr<Slot>> running_;
  std::list<std::unique_ptr<Slot>> parked_;     // front = most recently used
  uint64_t stamp_ = 0;
  std::vector<float> logits_;                   // [parallel][n_vocab]
  std::vector<int32_t> eog_tokens_;

  std::atomic<int64_t> heartbeat_ns_{0};
  std::atomic<bool> loop_alive_{false};
  struct Published {
    int64_t running = 0, parked = 0, tokens_in_kv = 0;
    uint64_t kv_running = 0, kv_parked = 0;
  } pub_;
  // Token counts per 1 s bucket, last 10 s, for tok/s.
  struct Bucket {
    int64_t sec = -1;
    uint64_t gen = 0, prefill = 0;
  };
  std::array<Bucket, 11> rate_{};
};

// True when the peer closed the connection on `fd` (non-blocking check).
bool peer_closed(int fd);

}  // namespace strata::server
