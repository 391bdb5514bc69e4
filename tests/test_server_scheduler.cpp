// Scheduler bookkeeping over a deterministic toy backend (server_fake_backend.h): continuous
// batching gives each request exactly what it gets alone, prefix reuse evaluates only the tail and
// reports it, cancellation frees the sequence within a step, the queue bound answers 429, drain
// finishes or cancels in-flight work. The real model goes through the same code in
// test_server_http.cpp and tests/server/*.sh.
#include <gtest/gtest.h>

#include <thread>

#include "server/scheduler.h"
#include "server_fake_backend.h"

using namespace strata::server;
using strata::server::testing::FakeBackend;

namespace {

std::shared_ptr<Job> make_job(const FakeBackend& b, const std::string& prompt, int32_t max_tokens,
                              float temperature = 0.0f, uint64_t seed = 1) {
  auto j = std::make_shared<Job>();
  j->prompt = b.tokenize(prompt);
  j->max_tokens = max_tokens;
  j->sampling.temperature = temperature;
  j->seed = seed;
  return j;
}

void wait(Job& j) {
  std::unique_lock<std::mutex> lk(j.mu);
  ASSERT_TRUE(j.cv.wait_for(lk, std::chrono::seconds(20), [&] { return j.done; }));
}

// Until every generate call the backend received has returned (20 s at most).
void wait_generate_returned(const FakeBackend& b) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (b.generate_returned.load() < b.generate_calls.load()) {
    ASSERT_LT(std::chrono::steady_clock::now(), until) << "a generate call did not return";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string text_of(const FakeBackend& b, const std::vector<int32_t>& toks) {
  std::string s;
  for (int32_t t : toks) s += b.piece(t);
  return s;
}

SchedulerConfig cfg(int parallel, int max_queue = 64, uint64_t park = 0) {
  SchedulerConfig c;
  c.parallel = parallel;
  c.max_queue = max_queue;
  c.park_budget_bytes = park;
  c.prefill_chunk = 7;  // odd chunk: prompts cross chunk boundaries
  return c;
}

// Every test twice: over Backend::generate's plain loop, and over a backend that evaluates each step before
// the scheduler has handled the previous one's tokens (FakeBackend::run_ahead, as a GPU's chained steps).
class ServerScheduler : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Steps, ServerScheduler, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "RunAhead" : "Plain"; });

}  // namespace

TEST_P(ServerScheduler, GreedyMatchesDirectEvaluation) {
  FakeBackend b;
  b.run_ahead = GetParam();
  Metrics m;
  Scheduler s(b, cfg(2), m);
  s.start();
  auto j = make_job(b, "hello there", 20);
  s.submit(j);
  wait(*j);
  EXPECT_EQ(j->finish, FinishReason::Length);
  EXPECT_EQ(j->text, text_of(b, b.greedy(j->prompt, 20)));
  EXPECT_EQ(j->usage.prompt_tokens, 11);
  EXPECT_EQ(j->usage.completion_tokens, 20);
  EXPECT_EQ(j->usage.cached_tokens, 0);
  s.drain_and_stop(std::chrono::milliseconds(1000));
}

TEST_P(ServerScheduler, BatchOfEightEqualsAlone) {
  FakeBackend b;
  b.run_ahead = GetParam();
  b.step_delay = std::chrono::milliseconds(2);
  Metrics m;
  Scheduler s(b, cfg(8), m);
  s.start();
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 8; ++i) jobs.push_back(make_job(b, "prompt number " + std::to_string(i), 30 + i));
  for (auto& j : jobs) s.submit(j);
  for (auto& j : jobs) wait(*j);
  for (auto& j : jobs) EXPECT_EQ(j->text, text_of(b, b.greedy(j->prompt, j->max_tokens)));
  EXPECT_GE(b.max_batch.load(), 4) << "requests were not batched together";
  s.drain_and_stop(std::chrono::milliseconds(1000));
}

TEST_P(ServerScheduler, SampledOutputDependsOnlyOnSeed) {
  FakeBackend b;
  b.run_ahead = GetParam();
  Metrics m;
  Scheduler s(b, cfg(4), m);
  s.start();
  auto a = make_job(b, "same prompt", 25, 1.0f, 42);
  auto c = make_job(b, "same prompt", 25, 1.0f, 42);
  auto d = make_job(b, "same prompt", 25, 1.0f, 43);
  s.submit(a);
  s.submit(c);
  s.submit(d);
  wait(*a);
  wait(*c);
  wait(*d);
  EXPECT_EQ(a->text, c->text);
  EXPECT_NE(a->text, d->text);
  s.drain_and_stop(std::chrono::milliseconds(1000));
}

TEST_P(ServerScheduler, ConversationReuseEvaluatesOnlyTheTail) {
  FakeBackend b;
  b.run_ahead = GetParam();
  Metrics m;
  Scheduler s(b, cfg(2, 64, 10000), m);
  s.start();
  auto first = make_job(b, "system: be brief\nuser: hi\nassistant:", 10);
  s.submit(first);
  wait(*first);
  // The follow-up repeats the whole first prompt and reply, then adds a turn.
  std::string follow = "system: be brief\nuser: hi\nassistant:" + first->text + "\nuser: more\nassistant:";
  auto second = make_job(b, follow, 10);
  int64_t before = b.evaluated.load();
  s.submit(second);
  wait(*second);
  int64_t evaluated = b.evaluated.load() - before;
  // KV held prompt + all generated tokens but the last (never evaluated): 37 + 9.
  int64_t expect_cached = int64_t(first->prompt.size()) + 9;
  EXPECT_EQ(second->usage.cached_tokens, expect_cached);
  EXPECT_EQ(evaluated, int64_t(second->prompt.size()) - expect_cached + 9);  // tail + 9 decode steps
  EXPECT_EQ(second->text, text_of(b, b.greedy(second->prompt, 10)));
  EXPECT_EQ(m.prompt_tokens_reused.load(), uint64_t(expect_cached));

  // A prompt that only shares a prefix reuses that prefix and truncates the rest.
  auto third = make_job(b, "system: be brief\nuser: bye\nassistant:", 5);
  s.submit(third);
  wait(*third);
  EXPECT_EQ(third->usage.cached_tokens, int64_t(std::string("system: be brief\nuser: ").size()));
  EXPECT_EQ(third->text, text_of(b, b.greedy(third->prompt, 5)));

  // The identical prompt again: all but the last token reused (its logits are needed).
  auto again = make_job(b, "system: be brief\nuser: bye\nassistant:", 5);
  s.submit(again);
  wait(*again);
  EXPECT_EQ(again->usage.cached_tokens, int64_t(again->prompt.size()) - 1);
  EXPECT_EQ(again->text, third->text);
  s.drain_and_stop(std::chrono::milliseconds(1000));
}

TEST_P(ServerScheduler, ParkBudgetEvictsLeastRecentlyUsed) {
  FakeBackend b;
  b.run_ahead = GetParam();
  Metrics m;
  Scheduler s(b, cfg(1, 64, 2000), m);  // room for two parked sequences of 1000 bytes
  s.start();
  for (const char* p : {"aaaa one", "bbbb two", "cccc three"}) {
    auto j = make_job(b, p, 3);
    s.submit(j);
    wait(*j);
  }
  // Wait for the loop to park the third sequence: its job finishes before it is parked within the
  // step, and until then parked == 2 already holds (the first two), so wait for the eviction too.
  for (int i = 0; i < 400 && (m.parked_evictions.load() != 1 || s.snapshot().parked != 2 ||
                              b.live_sequences.load() != 2);
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(s.snapshot().parked, 2);
  EXPECT_EQ(m.parked_evictions.load(), 1u);
  EXPECT_EQ(b.live_sequences.load(), 2);
  auto old = make_job(b, "aaaa one", 3);  // evicted: nothing reused
  s.submit(old);
  wait(*old);
  EXPECT_EQ(old->usage.cached_tokens, 0);
  auto recent = make_job(b, "cccc three", 3);  // still parked
  s.submit(recent);
  wait(*recent);
  EXPECT_EQ(recent->usage.cached_tokens, int64_t(recent->prompt.size()) - 1);
  s.drain_and_stop(std::chrono::milliseconds(1000));
}

TEST_P(ServerScheduler, CancelStopsAndFreesTheSequenceWithinAStep) {
  FakeBackend b;
  b.run_ahead = GetParam();
  b.step_delay = std::chrono::milliseconds(5);
  Metrics m;
  Scheduler s(b, cfg(2, 64, 0), m);
  s.start();
  auto j = make_job(b, "a long one", 200);
  s.submit(j);
  while (true) {
    std::lock_guard<std::mutex> lk(j->mu);
    if (j->text.size() >= 5) break;
  }
  EXPECT_EQ(b.live_sequences.load(), 1);
  int64_t calls = b.decode_calls.load();
  j->cancel = true;
  wait(*j);
  EXPECT_EQ(j->finish, FinishReason::Cancelled);
  // (run ahead: the step launched before the cancel was seen is evaluated and dropped)
  EXPECT_LE(b.decode_calls.load() - calls, GetParam() ? 2 : 1) << "more steps after the cancel";
  EXPECT_EQ(b.dropped_steps.load(), GetParam() ? 1 : 0);
  EXPECT_EQ(b.live_sequences.load(), 0) << "the KV of a cancelled request must be freed";
  s.drain_and_stop(std::chrono::milliseconds(1000));
}

TEST_P(ServerScheduler, QueueBoundAnswers429) {
  FakeBackend b;
  b.run_ahead = GetParam();
  b.step_delay = std::chrono::milliseconds(5);
  Metrics m;
  Scheduler s(b, cfg(1, 1), m);
  s.start();
  auto a = make_job(b, "first", 100);
  auto c = make_job(b, "second", 100);
  auto d = make_job(b, "third", 100);
  s.submit(a);
  // Wait until a runs, so the one free sequence is taken.
  while (s.snapshot().running < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  s.submit(c);  // waits in the queue (1 allowed)
  try {
    s.submit(d);
    FAIL() << "expected 429";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 429);
    EXPECT_NE(e.message.find("--max-queue 1"), std::string::npos) << e.message;
  }
  a->cancel = true;
  c->cancel = true;
  wait(*a);
  wait(*c);
  s.drain_and_stop(std::chrono::milliseconds(1000));
}

TEST_P(ServerScheduler, StopStringEndsGenerationAndIsNotOutput) {
  FakeBackend b;
  b.run_ahead = GetParam();
  Metrics m;
  Scheduler s(b, cfg(1), m);
  s.start();
  auto probe = make_job(b, "xyz", 30);
  s.submit(probe);
  wait(*probe);
  ASSERT_GE(probe->text.size(), 12u);
  std::string stop = probe->text.substr(8, 3);
  auto j = make_job(b, "xyz", 30);
  j->stop = {"never-there", stop};
  s.submit(j);
  wait(*j);
  EXPECT_EQ(j->finish, FinishReason::StopString);
  EXPECT_EQ(j->matched_stop, stop);
  EXPECT_EQ(j->text, probe->text.substr(0, probe->text.find(stop)));
  s.drain_and_stop(std::chrono::milliseconds(1000));
}

TEST_P(ServerScheduler, EndOfGenerationAndContextLimit) {
  FakeBackend b(64);
  b.run_ahead = GetParam();
  b.eos_bias = 100.0f;  // EOS always wins
  Metrics m;
  Scheduler s(b, cfg(1), m);
  s.start();
  auto j = make_job(b, "abc", 10);
  s.submit(j);
  wait(*j);
  EXPECT_EQ(j->finish, FinishReason::Eos);
  EXPECT_EQ(j->text, "");
  auto forced = make_job(b, "abc", 10);
  forced->ignore_eos = true;  // the end-of-generation token is masked out
  s.submit(forced);
  wait(*forced);
  EXPECT_EQ(forced->finish, FinishReason::Length);
  EXPECT_EQ(forced->usage.completion_tokens, 10);
  b.eos_bias = 0.0f;
  auto k = make_job(b, std::string(60, 'q'), 1000);  // 60 + 4 = n_ctx
  s.submit(k);
  wait(*k);
  EXPECT_EQ(k->finish, FinishReason::Length);
  EXPECT_EQ(k->usage.completion_tokens, 5);  // 4 evaluated positions left + the last sampled token
  s.drain_and_stop(std::chrono::milliseconds(1000));
}

TEST_P(ServerScheduler, DrainFinishesInFlightThenRefuses) {
  FakeBackend b;
  b.run_ahead = GetParam();
  b.step_delay = std::chrono::milliseconds(2);
  Metrics m;
  Scheduler s(b, cfg(2), m);
  s.start();
  auto j = make_job(b, "drain me", 40);
  s.submit(j);
  s.drain_and_stop(std::chrono::milliseconds(10000));
  EXPECT_TRUE(j->done);
  EXPECT_EQ(j->finish, FinishReason::Length);
  EXPECT_EQ(j->text, text_of(b, b.greedy(j->prompt, 40)));
  EXPECT_THROW(s.submit(make_job(b, "late", 3)), ApiError);
}

TEST_P(ServerScheduler, DrainCancelsAfterGrace) {
  FakeBackend b;
  b.run_ahead = GetParam();
  b.step_delay = std::chrono::milliseconds(20);
  Metrics m;
  Scheduler s(b, cfg(1, 4), m);
  s.start();
  auto j = make_job(b, "slow", 10000 < 200 ? 10000 : 200);
  auto q = make_job(b, "queued", 10);
  s.submit(j);
  s.submit(q);
  auto t0 = std::chrono::steady_clock::now();
  s.drain_and_stop(std::chrono::milliseconds(100));
  auto dt = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(dt, std::chrono::seconds(2));
  EXPECT_TRUE(j->done);
  EXPECT_EQ(j->finish, FinishReason::Cancelled);
  EXPECT_TRUE(q->done);
  EXPECT_EQ(b.live_sequences.load(), 0);
}

TEST_P(ServerScheduler, HeartbeatAdvancesWhenIdle) {
  FakeBackend b;
  b.run_ahead = GetParam();
  Metrics m;
  SchedulerConfig c = cfg(1);
  c.idle_tick = std::chrono::milliseconds(10);
  Scheduler s(b, c, m);
  EXPECT_FALSE(s.snapshot().loop_alive);
  s.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto snap = s.snapshot();
  EXPECT_TRUE(snap.loop_alive);
  // Idle for 400 ms with a 10 ms tick: a heartbeat that only moved with work would be >= 0.4 s old.
  EXPECT_LT(snap.heartbeat_age_s, 0.25);
  s.drain_and_stop(std::chrono::milliseconds(100));
  EXPECT_FALSE(s.snapshot().loop_alive);
}

TEST_P(ServerScheduler, ChainsStepsWhileNothingElseWaits) {
  FakeBackend b;
  b.run_ahead = GetParam();
  Metrics m;
  Scheduler s(b, cfg(2), m);
  s.start();
  auto j = make_job(b, "one request alone", 40);
  s.submit(j);
  wait(*j);
  EXPECT_EQ(j->finish, FinishReason::Length);
  EXPECT_EQ(j->text, text_of(b, b.greedy(j->prompt, 40)));
  // The prompt's end samples the first token; the other 39 come from one generate call, which launched
  // no step past max_tokens.
  EXPECT_EQ(b.generate_calls.load(), 1);
  EXPECT_EQ(b.decode_calls.load(), 39);
  EXPECT_EQ(b.dropped_steps.load(), 0);
  EXPECT_EQ(m.decode_steps.load(), 39u);
  EXPECT_EQ(m.generated_tokens.load(), 40u);
  s.drain_and_stop(std::chrono::milliseconds(1000));
}

TEST_P(ServerScheduler, AdmitsARequestThatArrivesMidChain) {
  FakeBackend b;
  b.run_ahead = GetParam();
  b.step_delay = std::chrono::milliseconds(2);
  Metrics m;
  Scheduler s(b, cfg(2), m);
  s.start();
  auto a = make_job(b, "the long one", 150);
  s.submit(a);
  while (true) {
    std::lock_guard<std::mutex> lk(a->mu);
    if (a->text.size() >= 5) break;
  }
  auto c = make_job(b, "a short one", 8);
  s.submit(c);
  wait(*c);
  {
    std::lock_guard<std::mutex> lk(a->mu);
    EXPECT_FALSE(a->done) << "the second request waited for the first to end";
  }
  wait(*a);
  EXPECT_EQ(b.max_batch.load(), 2);
  EXPECT_EQ(a->text, text_of(b, b.greedy(a->prompt, 150)));
  EXPECT_EQ(c->text, text_of(b, b.greedy(c->prompt, 8)));
  // The chain stopped for the admission (and, run ahead, dropped its step ahead once more for c's end).
  EXPECT_GE(b.generate_calls.load(), 3);
  if (GetParam()) {
    EXPECT_GE(b.dropped_steps.load(), 1);
  }
  s.drain_and_stop(std::chrono::milliseconds(1000));
}

TEST_P(ServerScheduler, EndOfGenerationMidChainKeepsTheRightState) {
  // A request that ends on end-of-generation mid-chain: its text is what it is alone, and the KV it parks
  // holds exactly its tokens (a step run ahead is dropped), so a follow-up reuses them all.
  FakeBackend b;
  b.run_ahead = GetParam();
  Metrics m;
  Scheduler s(b, cfg(1, 64, 10000), m);
  s.start();
  // A prompt whose greedy continuation ends on end-of-generation (id 0) within 60 tokens.
  b.eos_bias = 20.0f;  // end-of-generation as likely as any other token
  std::shared_ptr<Job> j;
  std::string prompt;
  for (int i = 0; i < 200 && !j; ++i) {
    prompt = "probe " + std::to_string(i);
    std::vector<int32_t> out = b.greedy(b.tokenize(prompt), 60);
    if (out.size() >= 4 && out.size() < 60) j = make_job(b, prompt, 60);
  }
  ASSERT_TRUE(j) << "no prompt ends early with this bias";
  s.submit(j);
  wait(*j);
  EXPECT_EQ(j->finish, FinishReason::Eos);
  const std::vector<int32_t> ref = b.greedy(j->prompt, 60);
  EXPECT_EQ(j->text, text_of(b, ref));
  if (GetParam()) {
    wait_generate_returned(b);  // (the job ended inside on_step; its run-ahead step is dropped after)
    EXPECT_EQ(b.dropped_steps.load(), 1);
  }
  auto again = make_job(b, prompt + text_of(b, ref) + " more", 3);
  s.submit(again);
  wait(*again);
  // Parked: the prompt and every generated token (the end-of-generation one was sampled, not evaluated).
  EXPECT_EQ(again->usage.cached_tokens, int64_t(j->prompt.size() + ref.size()));
  EXPECT_EQ(again->text, text_of(b, b.greedy(again->prompt, 3)));
  s.drain_and_stop(std::chrono::milliseconds(1000));
}

TEST_P(ServerScheduler, ABackendThatRunsNoStepFailsTheRequest) {
  FakeBackend b;
  b.run_ahead = GetParam();
  b.run_no_step = true;
  Metrics m;
  Scheduler s(b, cfg(1), m);
  s.start();
  auto j = make_job(b, "stuck", 10);
  s.submit(j);
  wait(*j);  // (not forever: the request fails)
  EXPECT_NE(j->error.find("ran no step"), std::string::npos) << j->error;
  b.run_no_step = false;
  auto k = make_job(b, "next one", 6);  // the server goes on serving
  s.submit(k);
  wait(*k);
  EXPECT_EQ(k->text, text_of(b, b.greedy(k->prompt, 6)));
  s.drain_and_stop(std::chrono::milliseconds(1000));
}
