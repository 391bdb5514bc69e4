#include "server/scheduler.h"

#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/error.h"
#include "cpu/ops.h"

namespace strata::server {

using Clock = std::chrono::steady_clock;

bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  int r = ::poll(&p, 1, 0);
  return r > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

Scheduler::Scheduler(Backend& backend, SchedulerConfig cfg, Metrics& metrics)
    : backend_(backend), info_(backend.info()), cfg_(cfg), metrics_(metrics) {
  STRATA_REQUIRE(cfg_.parallel >= 1, "--parallel must be at least 1 (got {})", cfg_.parallel);
  STRATA_REQUIRE(cfg_.max_queue >= 0, "--max-queue must be >= 0 (got {})", cfg_.max_queue);
  STRATA_REQUIRE(cfg_.prefill_chunk >= 1, "prefill chunk must be >= 1 (got {})", cfg_.prefill_chunk);
  logits_.resize(size_t(cfg_.parallel) * size_t(info_.n_vocab));
  eog_tokens_ = backend_.end_of_generation_tokens();
}

int32_t Scheduler::sample(Slot& s, float* logits) {
  if (s.job->ignore_eos)
    cpu::ban_tokens(logits, 1, info_.n_vocab, eog_tokens_.data(), int32_t(eog_tokens_.size()), nullptr);
  return s.sampler->sample(logits);
}

Scheduler::~Scheduler() { drain_and_stop(std::chrono::milliseconds(0)); }

void Scheduler::start() {
  heartbeat_ns_ = now_ns();
  loop_alive_ = true;
  thread_ = std::thread([this] { loop(); });
}

void Scheduler::submit(const std::shared_ptr<Job>& job) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stop_ || draining_) {
    ApiError e;
    e.status = 503;
    e.type = "server_error";
    e.message = "The server is shutting down and accepts no new requests.";
    throw e;
  }
  // Free sequences take requests at the next step, so only what is beyond them waits.
  int64_t waiting = int64_t(queue_.size());
  int64_t free_seqs = std::max<int64_t>(0, cfg_.parallel - pub_.running);
  if (waiting - free_seqs >= cfg_.max_queue) {
    ApiError e;
    e.status = 429;
    e.type = "rate_limit_error";
    e.code = "queue_full";
    e.message = fmt::format(
        "The server is busy: {} requests are generating (--parallel {}) and the queue is full "
        "({} waiting, --max-queue {}). Retry later.",
        pub_.running, cfg_.parallel, waiting, cfg_.max_queue);
    throw e;
  }
  queue_.push_back(job);
  cv_.notify_all();
}

void Scheduler::drain_and_stop(std::chrono::milliseconds grace) {
  draining_ = true;
  auto deadline = Clock::now() + grace;
  {
    std::unique_lock<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_all();
    // Wait for in-flight work to finish on its own within the grace period.
    cv_.wait_until(lk, deadline, [&] { return queue_.empty() && pub_.running == 0; });
    cancel_all_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

SchedulerSnapshot Scheduler::snapshot() const {
  SchedulerSnapshot s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s.queue_depth = int64_t(queue_.size());
    s.running = pub_.running;
    s.parked = pub_.parked;
    s.kv_bytes_running = pub_.kv_running;
    s.kv_bytes_parked = pub_.kv_parked;
    s.tokens_in_kv = pub_.tokens_in_kv;
    // tok/s over the buckets of the last 10 seconds (the current one partial).
    int64_t now_s = now_ns() / 1000000000;
    uint64_t gen = 0, pre = 0;
    for (auto& b : rate_)
      if (b.sec >= 0 && b.sec > now_s - 10) {
        gen += b.gen;
        pre += b.prefill;
      }
    double span = 10.0;
    s.decode_tok_s = double(gen) / span;
    s.prefill_tok_s = double(pre) / span;
  }
  s.parallel = cfg_.parallel;
  s.max_queue = cfg_.max_queue;
  s.kv_budget_parked = cfg_.park_budget_bytes;
  s.heartbeat_age_s = double(now_ns() - heartbeat_ns_.load()) * 1e-9;
  s.loop_alive = loop_alive_.load();
  s.draining = draining_.load();
  return s;
}

void Scheduler::record_rate(uint64_t gen, uint64_t prefill) {
  int64_t sec = now_ns() / 1000000000;
  std::lock_guard<std::mutex> lk(mu_);
  Bucket& b = rate_[size_t(sec % int64_t(rate_.size()))];
  if (b.sec != sec) b = Bucket{sec, 0, 0};
  b.gen += gen;
  b.prefill += prefill;
}

void Scheduler::loop() {
  while (true) {
    heartbeat_ns_ = now_ns();
    bool cancel_all = false, stop = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      cancel_all = cancel_all_;
      stop = stop_;
    }
    if (cancel_all) cancel_all_remaining();
    try {
      step();
    } catch (const std::exception& e) {
      // A backend failure outside one request's scope: fail what is running, keep serving.
      spdlog::error("scheduler step failed: {}", e.what());
      for (auto& s : running_) fail(*s, e.what());
      running_.clear();
    }
    publish();
    std::unique_lock<std::mutex> lk(mu_);
    if (stop && cancel_all && queue_.empty() && running_.empty()) break;
    if (running_.empty() && (queue_.empty() || (stop_ && cancel_all_)))
      cv_.wait_for(lk, cfg_.idle_tick, [&] { return !queue_.empty() || cancel_all_ != cancel_all; });
  }
  parked_.clear();
  loop_alive_ = false;
}

void Scheduler::publish() {
  // Figures for snapshot() and the admission check.
  Published p;
  p.running = int64_t(running_.size());
  p.parked = int64_t(parked_.size());
  for (auto& s : running_) {
    if (s->seq) p.kv_running += s->seq->memory_bytes();
    p.tokens_in_kv += int64_t(s->tokens.size());
  }
  for (auto& s : parked_) {
    p.kv_parked += s->seq->memory_bytes();
    p.tokens_in_kv += int64_t(s->tokens.size());
  }
  std::lock_guard<std::mutex> lk(mu_);
  pub_ = p;
  cv_.notify_all();  // drain_and_stop waits for running == 0
}

void Scheduler::step() {
  // 1. cancellations: the sequence stops and its KV is freed before any compute of this step.
  for (size_t i = 0; i < running_.size();) {
    if (check_cancelled(*running_[i])) {
      running_.erase(running_.begin() + long(i));
    } else {
      ++i;
    }
  }
  // 2. admissions (not while draining after the grace period: cancel_all_remaining emptied the queue)
  admit();
  // 3. prefill: one chunk for each sequence still reading its prompt.
  uint64_t prefilled = 0;
  const uint64_t gen_before = metrics_.generated_tokens.load();  // (a prompt's end samples its first token)
  for (auto& s : running_)
    if (s->job && s->pending < 0) {
      size_t before = s->prefill_pos;
      try {
        prefill_some(*s);
      } catch (const std::exception& e) {
        fail(*s, e.what());
      }
      prefilled += s->prefill_pos - before;
    }
  record_rate(metrics_.generated_tokens.load() - gen_before, prefilled);
  // 4. batched decode steps for every generating sequence (several while nothing else needs the loop).
  decode_all();
  // 5. finished sequences: park (keep KV for reuse) or drop (cancelled / failed).
  for (size_t i = 0; i < running_.size();) {
    auto& s = running_[i];
    if (s->job) {
      ++i;
      continue;
    }
    std::unique_ptr<Slot> slot = std::move(s);
    running_.erase(running_.begin() + long(i));
    if (slot->seq) park(std::move(slot));
  }
}

// The request's client is gone: a write to it failed, or it closed its socket.
static bool client_left(const Job& job) { return job.client_gone.load() || peer_closed(job.watch_fd); }

bool Scheduler::check_cancelled(Slot& s) {
  Job& job = *s.job;
  bool disconnected = client_left(job);
  if (!job.cancel.load() && !disconnected) return false;
  if (disconnected) metrics_.disconnects++;
  s.seq.reset();  // frees the KV now, before the waiter hears the request is done
  finish(s, FinishReason::Cancelled);
  return true;
}

void Scheduler::admit() {
  while (int(running_.size()) < cfg_.parallel) {
    std::shared_ptr<Job> job;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (queue_.empty()) break;
      job = std::move(queue_.front());
      queue_.pop_front();
      pub_.running++;  // counted as running from now on (drain_and_stop must not see a gap)
    }
    if (job->cancel.load() || peer_closed(job->watch_fd)) {
      std::lock_guard<std::mutex> lk(job->mu);
      job->done = true;
      job->finish = FinishReason::Cancelled;
      job->cv.notify_all();
      continue;
    }
    int32_t reuse = 0;
    std::unique_ptr<Slot> slot;
    try {
      slot = take_slot_for(job->prompt, reuse);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lk(job->mu);
      job->error = e.what();
      job->done = true;
      job->cv.notify_all();
      continue;
    }
    slot->job = job;
    slot->sampler = backend_.new_sampler(job->sampling, job->seed);
    for (int32_t t : job->prompt) slot->sampler->accept(t);
    slot->text = TextStream(job->stop);
    slot->prefill_pos = size_t(reuse);
    slot->pending = -1;
    slot->n_generated = 0;
    slot->last_used = ++stamp_;
    job->usage.prompt_tokens = int64_t(job->prompt.size());
    job->usage.cached_tokens = reuse;
    metrics_.prompt_tokens += job->prompt.size();
    metrics_.prompt_tokens_reused += uint64_t(reuse);
    running_.push_back(std::move(slot));
  }
}

std::unique_ptr<Scheduler::Slot> Scheduler::take_slot_for(const std::vector<int32_t>& prompt,
                                                          int32_t& reuse) {
  reuse = 0;
  auto best = parked_.end();
  size_t best_len = 0;
  for (auto it = parked_.begin(); it != parked_.end(); ++it) {
    const auto& t = (*it)->tokens;
    size_t n = std::min(t.size(), prompt.size());
    size_t l = size_t(std::mismatch(t.begin(), t.begin() + long(n), prompt.begin()).first - t.begin());
    // At least one prompt token must be evaluated to get the logits of the next one.
    l = std::min(l, prompt.size() - 1);
    if (!info_.can_truncate && l < t.size()) l = 0;  // recurrent state cannot be rewound
    if (l > best_len) {
      best_len = l;
      best = it;
    }
  }
  if (best != parked_.end()) {
    std::unique_ptr<Slot> s = std::move(*best);
    parked_.erase(best);
    backend_.truncate(*s->seq, int32_t(best_len));
    s->tokens.resize(best_len);
    reuse = int32_t(best_len);
    return s;
  }
  auto s = std::make_unique<Slot>();
  s->seq = backend_.new_sequence();
  return s;
}

void Scheduler::prefill_some(Slot& s) {
  const auto& prompt = s.job->prompt;
  size_t n = std::min(prompt.size() - s.prefill_pos, size_t(cfg_.prefill_chunk));
  float* logits = backend_.prefill(*s.seq, prompt.data() + s.prefill_pos, int32_t(n));
  s.tokens.insert(s.tokens.end(), prompt.begin() + long(s.prefill_pos),
                  prompt.begin() + long(s.prefill_pos + n));
  s.prefill_pos += n;
  metrics_.prompt_tokens_evaluated += n;
  if (s.prefill_pos < prompt.size()) return;
  {
    std::lock_guard<std::mutex> lk(s.job->mu);
    s.job->started = true;
  }
  on_token(s, sample(s, logits));
}

void Scheduler::decode_all() {
  std::vector<Slot*> batch;
  for (auto& s : running_)
    if (s->job && s->pending >= 0) batch.push_back(s.get());
  if (batch.empty()) return;
  std::vector<BackendSequence*> seqs;
  std::vector<int32_t> toks;
  for (Slot* s : batch) {
    seqs.push_back(s->seq.get());
    toks.push_back(s->pending);
  }
  // The backend picks (on its GPU where it can: no logits come back), never an end-of-generation token
  // for a request with ignore_eos.
  std::vector<TokenSampler*> samplers;
  std::vector<uint8_t> ban_eog;
  for (Slot* s : batch) samplers.push_back(s->sampler.get()), ban_eog.push_back(s->job->ignore_eos ? 1 : 0);
  // Steps go on in one generate call while nothing else needs the loop: every running sequence is in the
  // batch (none reading its prompt), none has finished, been cancelled or lost its client, and no request
  // waits for a free sequence. Why: a backend may then launch each step before this thread has handled the
  // previous one's tokens (Engine::generate chains them on a GPU), so the device does not wait for the host
  // between steps. At most the steps that the nearest max_tokens or context end leaves, so that no step is
  // launched past them (one launched ahead of a stop is dropped: it costs the device a step).
  int max_steps = running_.size() == batch.size() ? INT32_MAX : 1;
  for (Slot* s : batch)
    max_steps = std::min({max_steps, s->job->max_tokens - s->n_generated, info_.n_ctx - int32_t(s->tokens.size())});
  max_steps = std::max(max_steps, 1);
  const auto on_step = [&](int step, const int32_t* picks) {
    heartbeat_ns_ = now_ns();
    metrics_.decode_steps++;
    metrics_.decode_batch_tokens += batch.size();
    const uint64_t gen_before = metrics_.generated_tokens.load();
    bool go = true;
    for (size_t i = 0; i < batch.size(); ++i) {
      Slot& s = *batch[i];
      s.tokens.push_back(s.pending);
      s.pending = -1;
      go = !on_token(s, picks[i]) && go;
    }
    record_rate(metrics_.generated_tokens.load() - gen_before, 0);
    if (!go || step + 1 >= max_steps) return false;
    for (Slot* s : batch)
      if (s->job->cancel.load() || client_left(*s->job)) return false;  // (check_cancelled acts on it)
    publish();
    std::lock_guard<std::mutex> lk(mu_);
    return !cancel_all_ && (queue_.empty() || int(running_.size()) >= cfg_.parallel);
  };
  int steps = 0;
  try {
    steps = backend_.generate(seqs.data(), toks.data(), int32_t(batch.size()), samplers.data(), ban_eog.data(),
                              logits_.data(), max_steps, on_step);
  } catch (const std::exception& e) {
    for (Slot* s : batch) fail(*s, e.what());  // (finished ones too: their state may be half-written)
    return;
  }
  // A backend that ran no step (its sequences had no room: the bookkeeping above should prevent it) would
  // leave the batch as it was, and the loop would call it again forever.
  if (steps == 0)
    for (Slot* s : batch) fail(*s, "decode: the backend ran no step (no room left in a sequence's context)");
}

bool Scheduler::on_token(Slot& s, int32_t token) {
  s.sampler->accept(token);
  if (backend_.is_end_of_generation(token)) {
    finish(s, FinishReason::Eos);
    return true;
  }
  s.n_generated++;
  metrics_.generated_tokens++;
  emit(*s.job, s.text.push(backend_.piece(token)));
  if (s.text.stopped()) {
    finish(s, FinishReason::StopString);
  } else if (s.n_generated >= s.job->max_tokens || int32_t(s.tokens.size()) >= info_.n_ctx) {
    finish(s, FinishReason::Length);  // the next token would have no KV position left
  } else {
    s.pending = token;
    return false;
  }
  return true;
}

void Scheduler::emit(Job& job, const std::string& text) {
  if (text.empty()) return;
  std::lock_guard<std::mutex> lk(job.mu);
  job.text += text;
  job.text_cuts.push_back(job.text.size());
  job.cv.notify_all();
}

void Scheduler::finish(Slot& s, FinishReason why) {
  std::shared_ptr<Job> job = std::move(s.job);
  std::string tail = why == FinishReason::Cancelled ? std::string() : s.text.flush();
  {
    std::lock_guard<std::mutex> lk(job->mu);
    job->text += tail;
    if (!tail.empty()) job->text_cuts.push_back(job->text.size());
    job->done = true;
    job->finish = why;
    job->matched_stop = s.text.matched_stop();
    job->usage.completion_tokens = s.n_generated;
    job->cv.notify_all();
  }
  s.pending = -1;  // (the sampler stays until the slot is parked or dropped: generate may still use it)
  s.last_used = ++stamp_;
}

void Scheduler::fail(Slot& s, const std::string& msg) {
  spdlog::error("request failed: {}", msg);
  if (s.job) {
    std::lock_guard<std::mutex> lk(s.job->mu);
    s.job->error = msg;
    s.job->done = true;
    s.job->cv.notify_all();
  }
  s.job.reset();
  s.seq.reset();  // the state may be half-written: never reuse it
}

void Scheduler::park(std::unique_ptr<Slot> s) {
  s->sampler.reset();
  parked_.push_front(std::move(s));
  enforce_park_budget();
}

void Scheduler::enforce_park_budget() {
  uint64_t total = 0;
  for (auto& s : parked_) total += s->seq->memory_bytes();
  while (!parked_.empty() && total > cfg_.park_budget_bytes) {
    total -= parked_.back()->seq->memory_bytes();
    parked_.pop_back();  // LRU: least recently used at the back
    metrics_.parked_evictions++;
  }
}

void Scheduler::cancel_all_remaining() {
  std::deque<std::shared_ptr<Job>> q;
  {
    std::lock_guard<std::mutex> lk(mu_);
    q.swap(queue_);
  }
  for (auto& job : q) {
    std::lock_guard<std::mutex> lk(job->mu);
    job->done = true;
    job->finish = FinishReason::Cancelled;
    job->cv.notify_all();
  }
  for (auto& s : running_)
    if (s->job) {
      finish(*s, FinishReason::Cancelled);
      s->seq.reset();
    }
  running_.clear();
}

}  // namespace strata::server
