#pragma once
// Token sampling: penalties -> top-k -> top-p -> min-p -> temperature -> draw (llama.cpp's order).
// temperature <= 0 means greedy (argmax after penalties). A seed makes a run reproducible: the
// generator is our own (xoshiro256**), so the draws do not depend on the standard library.
// All buffers are sized for the vocabulary at construction: sampling allocates nothing per token.
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

struct SamplingParams {
  float temperature = 0.8f;       // <= 0: greedy
  int top_k = 40;                 // <= 0: off
  float top_p = 0.95f;            // >= 1: off
  float min_p = 0.05f;            // <= 0: off
  float repeat_penalty = 1.0f;    // 1: off. logit > 0 ? logit / p : logit * p
  int repeat_last_n = 64;         // window of the three penalties (-1: whole history, 0: off)
  float presence_penalty = 0.0f;  // minus this once for any token in the window
  float frequency_penalty = 0.0f; // minus this per occurrence in the window
  uint64_t seed = 0;
  void validate() const;          // throws strata::Error naming the bad parameter
};

class Rng {  // xoshiro256** seeded through splitmix64
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed);
  uint64_t next();
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  uint64_t s_[4];
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t n_vocab);
  const SamplingParams& params() const { return params_; }

  // Picks a token from logits [n_vocab] (not modified). Does not record it: call accept().
  int32_t sample(const float* logits);
  // For a pick made elsewhere with this sampler's rule (Engine::decode_sample on a GPU): true when the
  // penalties are off (the device rule has none), and the draw sample() would make now (none when greedy:
  // returns 0 and leaves the generator as sample() would).
  bool penalties_off() const;
  double next_draw();
  // The draw generator's state, and setting it back (Engine::generate takes back the draw of a step it
  // started ahead and then dropped, so the sampler ends where a step-by-step loop leaves it).
  Rng generator() const { return rng_; }
  void set_generator(const Rng& r) { rng_ = r; }
  // Adds a token (prompt or generated) to the penalty history.
  void accept(int32_t token);
  void reset();  // forget the history, reseed

 private:
  struct Cand {
    int32_t id;
    float logit;
    float w;  // exp((logit - max) / temperature) of the step being taken
  };
  SamplingParams params_;
  int32_t n_vocab_;
  Rng rng_;
  std::deque<int32_t> history_;   // bounded by repeat_last_n (or the whole run for -1)
  std::vector<int32_t> counts_;   // [n_vocab] scratch for the penalties
  std::vector<Cand> cand_;        // [n_vocab]: the candidates, best first (a heap while selecting)
  std::vector<Cand> pen_;         // the history's distinct tokens with their penalized logits
};

// Stop strings over streamed text: feed() returns the part of the text that can be shown now (held
// back while it could still become a stop string); once a stop string appears, the text before it is
// returned and stopped() turns true. finish() returns what was held back at the end of generation.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  std::string feed(std::string_view piece);
  std::string finish();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace strata
