#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"

namespace strata {

double PerplexityResult::ppl() const {
  return n_scored > 0 ? std::exp(nll_sum / static_cast<double>(n_scored)) : 0.0;
}

double PerplexityResult::stderr_nll() const {
  if (chunk_nll.size() < 2) return 0.0;
  const double per = static_cast<double>(n_ctx - 1);
  double mean = 0, sq = 0;
  for (double c : chunk_nll) mean += c / per;
  mean /= static_cast<double>(chunk_nll.size());
  for (double c : chunk_nll) sq += (c / per - mean) * (c / per - mean);
  const double n = static_cast<double>(chunk_nll.size());
  return std::sqrt(sq / (n - 1) / n);
}

PerplexityResult perplexity(Engine& eng, std::span<const int32_t> tokens, int32_t n_ctx,
                            int64_t max_chunks) {
  STRATA_REQUIRE(n_ctx >= 2, "perplexity: context must be >= 2 tokens, got {}", n_ctx);
  STRATA_REQUIRE(n_ctx <= eng.options().n_ctx, "perplexity: context {} above the engine's {}", n_ctx,
                 eng.options().n_ctx);
  STRATA_REQUIRE(max_chunks >= 0, "perplexity: chunk limit must be >= 0, got {}", max_chunks);
  PerplexityResult r;
  r.n_ctx = n_ctx;
  r.n_chunks = static_cast<int64_t>(tokens.size()) / n_ctx;
  if (max_chunks > 0) r.n_chunks = std::min(r.n_chunks, max_chunks);
  STRATA_REQUIRE(r.n_chunks >= 1, "perplexity: {} tokens do not fill one chunk of {}", tokens.size(),
                 n_ctx);
  const size_t V = static_cast<size_t>(eng.n_vocab());
  std::vector<double> row_nll(static_cast<size_t>(n_ctx) - 1);  // [n_ctx - 1]
  auto seq = eng.new_sequence();
  for (int64_t c = 0; c < r.n_chunks; ++c) {
    seq->reset();
    const auto chunk = tokens.subspan(static_cast<size_t>(c * n_ctx), static_cast<size_t>(n_ctx));
    // [n_ctx][n_vocab], where the engine left them (on a GPU: its pinned download buffer, no copy)
    const float* logits = eng.prefill_logits(*seq, chunk, /*all_logits=*/true).data();
    // Each row's -log p(next token) on the engine's threads (why: a 152k vocabulary is ~150k exp() a row,
    // ~0.9 ms on one core of the dev box, ~0.46 s a 512-token chunk: more than a GPU's pass), then summed
    // in row order: the same sum for any number of threads.
    eng.pool().parallel_for(n_ctx - 1, 4, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) {
        const float* row = logits + static_cast<size_t>(i) * V;  // [n_vocab]
        double mx = row[0];
        for (size_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
        double sum = 0;
        for (size_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
        row_nll[size_t(i)] = mx + std::log(sum) - double(row[chunk[size_t(i) + 1]]);
      }
    });
    double nll = 0;
    for (double x : row_nll) nll += x;
    r.chunk_nll.push_back(nll);
    r.nll_sum += nll;
    r.n_scored += n_ctx - 1;
  }
  return r;
}

}  // namespace strata
