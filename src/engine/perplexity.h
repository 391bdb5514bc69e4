#pragma once
// Perplexity of a token sequence, the way tools/train_demo/train.py measures it: the tokens are cut
// into non-overlapping chunks of n_ctx tokens (a shorter tail is dropped), each chunk is evaluated
// from an empty context (no BOS added), and every position after the first of a chunk is scored:
// NLL of token i+1 given tokens 0..i of the chunk. PPL = exp(sum NLL / scored tokens).
#include <cstdint>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace strata {

struct PerplexityResult {
  int32_t n_ctx = 0;
  int64_t n_chunks = 0;
  int64_t n_scored = 0;
  double nll_sum = 0;              // nats
  std::vector<double> chunk_nll;   // [n_chunks] summed NLL of each chunk (n_ctx - 1 positions)
  double ppl() const;
  double stderr_nll() const;       // standard error of the mean per-token NLL (over chunks' means)
};

// max_chunks: 0 = all. The engine's n_ctx must be >= n_ctx. Throws strata::Error when the tokens do
// not fill one chunk.
PerplexityResult perplexity(Engine& eng, std::span<const int32_t> tokens, int32_t n_ctx,
                            int64_t max_chunks = 0);

}  // namespace strata
