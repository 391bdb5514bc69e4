#pragma once
// What the server's scheduler needs from a model: text <-> tokens, the chat template, sequences
// (per-conversation KV state), prefill of one sequence, one batched decode step over several, and a
// sampler per request. engine_backend.cpp implements it over the engine (any device); the tests use
// the same interface. The scheduler calls the sequence/compute methods from its one thread only;
// tokenize/render_chat/piece may be called from HTTP threads concurrently (they are const).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "server/api_request.h"

namespace strata::server {

struct BackendInfo {
  std::string model_id;        // what /v1/models lists
  int32_t n_ctx = 0;           // tokens per sequence
  int32_t n_vocab = 0;
  bool can_truncate = true;    // false for recurrent models: KV reuse needs the whole history as prefix
  std::string device;          // "cpu", "cuda:0", ...
};

// Expert-cache and memory figures for /metrics; zero where the backend has none (CPU).
struct BackendStats {
  uint64_t expert_cache_bytes = 0;     // capacity
  uint64_t expert_cache_used = 0;      // bytes holding experts
  uint64_t expert_cache_hits = 0;      // expert lookups served from the cache
  uint64_t expert_cache_lookups = 0;
  uint64_t expert_cache_direct = 0;    // misses the GPU read from host memory (--decode-direct)
  uint64_t weights_bytes = 0;          // model weights resident in memory
};

// One sequence's state (KV cache and, for hybrid models, recurrent state).
class BackendSequence {
 public:
  virtual ~BackendSequence() = default;
  virtual int32_t n_past() const = 0;       // tokens held
  virtual size_t memory_bytes() const = 0;  // what this sequence keeps allocated
};

class TokenSampler {
 public:
  virtual ~TokenSampler() = default;
  virtual int32_t sample(const float* logits) = 0;  // logits: [n_vocab]
  virtual void accept(int32_t token) = 0;           // record a prompt or generated token
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const BackendInfo& info() const = 0;
  virtual BackendStats stats() const { return {}; }

  // Text to ids: special tokens written in the text (<|im_start|>) become their ids. `templated`:
  // the text is a rendered chat template (it carries its own BOS); otherwise BOS is added when the
  // model wants it.
  virtual std::vector<int32_t> tokenize(const std::string& text, bool templated) const = 0;
  // The bytes of one token (may be part of a UTF-8 character).
  virtual std::string piece(int32_t token) const = 0;
  virtual bool is_end_of_generation(int32_t token) const = 0;
  virtual std::vector<int32_t> end_of_generation_tokens() const = 0;
  // The model's chat template applied to the messages, with the assistant prompt opened.
  // Throws ApiError (400) when the messages do not fit the template (e.g. it rejects a role order).
  virtual std::string render_chat(const std::vector<ChatMessage>& messages) const = 0;

  virtual std::unique_ptr<BackendSequence> new_sequence() = 0;
  // Keep the first n tokens of `seq` (n <= n_past). Only called when info().can_truncate or n == 0.
  virtual void truncate(BackendSequence& seq, int32_t n) = 0;
  // Evaluates tokens[0..n) at positions n_past.. of seq; returns the logits after the last one
  // ([n_vocab], valid until the next call; the caller may modify them).
  virtual float* prefill(BackendSequence& seq, const int32_t* tokens, int32_t n) = 0;
  // One token for each of n sequences (distinct), in one batched step; logits: [n][n_vocab].
  virtual void decode(BackendSequence* const* seqs, const int32_t* tokens, int32_t n,
                      float* logits) = 0;

  // decode, then a pick for each sequence by samplers[i] into out[i] (the caller accept()s it); where
  // ban_eog[i] is nonzero (a request's ignore_eos; ban_eog may be null) never an end-of-generation token.
  // A backend may pick where its logits are (EngineBackend on a GPU: Engine::decode_sample); by default the
  // logits go to `logits` ([n][n_vocab]) and each sampler picks from its row.
  virtual void decode_sample(BackendSequence* const* seqs, const int32_t* tokens, int32_t n,
                             TokenSampler* const* samplers, const uint8_t* ban_eog, float* logits, int32_t* out) {
    decode(seqs, tokens, n, logits);
    const size_t nv = size_t(info().n_vocab);
    if (ban_eog) {
      const std::vector<int32_t> eog = end_of_generation_tokens();
      cpu::ban_tokens(logits, n, int64_t(nv), eog.data(), int32_t(eog.size()), ban_eog);
    }
    for (int32_t i = 0; i < n; ++i) out[i] = samplers[i]->sample(logits + size_t(i) * nv);
  }

  // Generation over a batch that stays the same: step 0 feeds tokens[i] to seqs[i], step s > 0 the picks of
  // step s - 1, each step a decode_sample (with ban_eog); after each, on_step(s, picks) ([n] picks, the caller
  // accept()s them) says whether to go on. Runs at most max_steps steps; returns the steps run (= on_step
  // calls). A backend may launch step s + 1 before on_step(s) runs (EngineBackend: Engine::generate chains
  // them on a GPU) and drops it when on_step stops: the sequences and samplers end as this loop leaves them.
  using StepFn = std::function<bool(int step, const int32_t* picks)>;
  virtual int generate(BackendSequence* const* seqs, const int32_t* tokens, int32_t n, TokenSampler* const* samplers,
                       const uint8_t* ban_eog, float* logits, int max_steps, const StepFn& on_step) {
    std::vector<int32_t> cur(tokens, tokens + n), picks(static_cast<size_t>(n));
    for (int s = 0; s < max_steps; ++s) {
      decode_sample(seqs, cur.data(), n, samplers, ban_eog, logits, picks.data());
      if (!on_step(s, picks.data())) return s + 1;
      cur = picks;
    }
    return max_steps;
  }

  virtual std::unique_ptr<TokenSampler> new_sampler(const SamplingOptions& opts, uint64_t seed) = 0;
};

}  // namespace strata::server
