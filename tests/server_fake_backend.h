#pragma once
// A deterministic toy language model behind the server's Backend interface, for testing the
// scheduler's bookkeeping (batching, reuse, cancellation, queueing) in isolation and fast. Its next
// token depends on the whole token history held by the sequence, so a reuse bug that keeps wrong
// tokens, or a batch that mixes rows up, changes the output. The real model is tested end to end by
// tests/server/*.sh and test_server_http.cpp.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "server/backend.h"

namespace strata::server::testing {

class FakeSequence : public BackendSequence {
 public:
  explicit FakeSequence(std::atomic<int>& live) : live_(live) { live_++; }
  ~FakeSequence() override { live_--; }
  int32_t n_past() const override { return int32_t(tokens.size()); }
  size_t memory_bytes() const override { return 1000; }
  std::vector<int32_t> tokens;

 private:
  std::atomic<int>& live_;
};

class FakeBackend : public Backend {
 public:
  static constexpr int32_t kVocab = 40;  // 0 = end of generation, 1..39 letters/space
  explicit FakeBackend(int32_t n_ctx = 256) {
    info_.model_id = "fake-model";
    info_.n_ctx = n_ctx;
    info_.n_vocab = kVocab;
    info_.device = "test";
  }
  const BackendInfo& info() const override { return info_; }

  // One token per byte; piece() and tokenize() round-trip for the 39 characters of kChars.
  static constexpr const char* kChars = " abcdefghijklmnopqrstuvwxyz0123456789.,";  // ids 1..39
  std::vector<int32_t> tokenize(const std::string& text, bool = false) const override {
    std::vector<int32_t> out;
    for (unsigned char c : text) {
      const char* p = std::strchr(kChars, c);
      out.push_back(p && c ? int32_t(p - kChars) + 1 : 1 + int32_t(c % (kVocab - 1)));
    }
    return out;
  }
  std::string piece(int32_t t) const override { return std::string(1, kChars[(t - 1) % 39]); }
  bool is_end_of_generation(int32_t t) const override { return t == 0; }
  std::vector<int32_t> end_of_generation_tokens() const override { return {0}; }
  std::string render_chat(const std::vector<ChatMessage>& msgs) const override {
    std::string s;
    for (auto& m : msgs) s += m.role + ":" + m.content + "\n";
    return s + "assistant:";
  }

  std::unique_ptr<BackendSequence> new_sequence() override {
    return std::make_unique<FakeSequence>(live_sequences);
  }
  void truncate(BackendSequence& seq, int32_t n) override {
    auto& s = static_cast<FakeSequence&>(seq);
    if (n > s.n_past()) throw std::runtime_error("truncate beyond n_past");
    s.tokens.resize(size_t(n));
  }
  float* prefill(BackendSequence& seq, const int32_t* tokens, int32_t n) override {
    auto& s = static_cast<FakeSequence&>(seq);
    if (s.n_past() + n > info_.n_ctx) throw std::runtime_error("context overflow in fake prefill");
    s.tokens.insert(s.tokens.end(), tokens, tokens + n);
    evaluated += n;
    last_logits_.resize(kVocab);
    logits_for(s.tokens, last_logits_.data());
    return last_logits_.data();
  }
  void decode(BackendSequence* const* seqs, const int32_t* tokens, int32_t n, float* logits) override {
    if (step_delay.count() > 0) std::this_thread::sleep_for(step_delay);
    max_batch = std::max(max_batch.load(), n);
    decode_calls++;
    for (int32_t i = 0; i < n; ++i) {
      auto& s = static_cast<FakeSequence&>(*seqs[i]);
      if (s.n_past() + 1 > info_.n_ctx) throw std::runtime_error("context overflow in fake decode");
      s.tokens.push_back(tokens[i]);
      evaluated++;
      logits_for(s.tokens, logits + size_t(i) * kVocab);
    }
  }

  // Backend::generate, and with `run_ahead` as a GPU backend that chains its steps (EngineBackend over
  // Engine::generate): step s + 1 is evaluated before on_step(s) runs, and dropped (the sequences
  // truncated, the samplers set back) when on_step stops. A scheduler that acts on a stop too late, or frees
  // what a running generate still uses, shows here.
  int generate(BackendSequence* const* seqs, const int32_t* tokens, int32_t n, TokenSampler* const* samplers,
               const uint8_t* ban_eog, float* logits, int max_steps, const StepFn& on_step) override {
    generate_calls++;
    struct Returned {  // counts the call as returned on every way out (after a dropped step's undoing)
      std::atomic<int64_t>& n;
      ~Returned() { n++; }
    } returned{generate_returned};
    if (run_no_step) return 0;
    if (!run_ahead) return Backend::generate(seqs, tokens, n, samplers, ban_eog, logits, max_steps, on_step);
    std::vector<int32_t> picks(static_cast<size_t>(n)), ahead(static_cast<size_t>(n));
    std::vector<float> la(static_cast<size_t>(n) * kVocab);
    decode_sample(seqs, tokens, n, samplers, ban_eog, logits, picks.data());
    for (int s = 0;; ++s) {
      const bool more = s + 1 < max_steps;
      std::vector<Sampler> before;
      if (more) {
        for (int32_t i = 0; i < n; ++i) before.push_back(*static_cast<Sampler*>(samplers[i]));
        decode_sample(seqs, picks.data(), n, samplers, ban_eog, la.data(), ahead.data());
      }
      const bool go = on_step(s, picks.data());
      if (!go || !more) {
        if (more) {  // the step launched ahead is dropped
          dropped_steps++;
          for (int32_t i = 0; i < n; ++i) {
            static_cast<FakeSequence&>(*seqs[i]).tokens.pop_back();
            *static_cast<Sampler*>(samplers[i]) = before[size_t(i)];
          }
        }
        return s + 1;
      }
      picks.swap(ahead);
    }
  }

  class Sampler : public TokenSampler {
   public:
    Sampler(float temp, uint64_t seed) : temp_(temp), state_(seed * 2654435761u + 1) {}
    int32_t sample(const float* logits) override {
      if (temp_ <= 0) return int32_t(std::max_element(logits, logits + kVocab) - logits);
      // softmax draw with a tiny LCG: enough to make seeds matter
      double w[kVocab], sum = 0;
      float mx = *std::max_element(logits, logits + kVocab);
      for (int i = 0; i < kVocab; ++i) sum += w[i] = std::exp((logits[i] - mx) / temp_);
      state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
      double r = double(state_ >> 11) * 0x1.0p-53 * sum;
      for (int i = 0; i < kVocab; ++i)
        if ((r -= w[i]) <= 0) return i;
      return kVocab - 1;
    }
    void accept(int32_t) override {}

   private:
    float temp_;
    uint64_t state_;
  };
  std::unique_ptr<TokenSampler> new_sampler(const SamplingOptions& o, uint64_t seed) override {
    return std::make_unique<Sampler>(o.temperature, seed);
  }

  // The model: logits from a hash of the whole history. End-of-generation is made unlikely
  // unless `eos_bias` > 0.
  void logits_for(const std::vector<int32_t>& toks, float* out) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : toks) h = (h ^ uint64_t(t)) * 1099511628211ull;
    for (int32_t v = 0; v < kVocab; ++v) {
      uint64_t x = (h ^ uint64_t(v) * 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
      x ^= x >> 29;
      out[v] = float(x % 1000) / 100.0f;
    }
    out[0] += eos_bias - 20.0f;
  }

  // Greedy reference: what the model says after `prompt`, computed without the scheduler.
  std::vector<int32_t> greedy(std::vector<int32_t> ctx, int32_t n) const {
    std::vector<int32_t> out;
    float l[kVocab];
    for (int32_t i = 0; i < n; ++i) {
      logits_for(ctx, l);
      int32_t t = int32_t(std::max_element(l, l + kVocab) - l);
      if (t == 0) break;
      out.push_back(t);
      ctx.push_back(t);
    }
    return out;
  }

  std::atomic<int> live_sequences{0};
  std::atomic<int64_t> evaluated{0};
  std::atomic<int32_t> max_batch{0};
  std::atomic<int64_t> decode_calls{0};
  std::atomic<int64_t> generate_calls{0};
  std::atomic<int64_t> dropped_steps{0};
  // generate calls that have returned. Why: a request's end is seen (Job::done) inside on_step, before its
  // generate call drops the step it ran ahead; a test that counts dropped steps waits for the returns first.
  std::atomic<int64_t> generate_returned{0};
  bool run_ahead = false;
  bool run_no_step = false;  // generate returns at once, 0 steps run (a broken backend)
  std::chrono::milliseconds step_delay{0};
  float eos_bias = 0.0f;

 private:
  BackendInfo info_;
  std::vector<float> last_logits_;
};

}  // namespace strata::server::testing
