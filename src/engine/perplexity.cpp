#include "engine/perplexity.h"

#include <cmath>

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
  std::vector<float> logits(static_cast<size_t>(n_ctx) * V);  // [n_ctx][n_vocab]
  auto seq = eng.new_sequence();
  for (int64_t c = 0; c < r.n_chunks; ++c) {
    seq->reset();
    const auto chunk = tokens.subspan(static_cast<size_t>(c * n_ctx), static_cast<size_t>(n_ctx));
    eng.prefill(*seq, chunk, logits.data(), /*all_logits=*/true);
    double nll = 0;
    for (int32_t i = 0; i + 1 < n_ctx; ++i) {
      const float* row = logits.data() + static_cast<size_t>(i) * V;  // [n_vocab]
      double mx = row[0];
      for (size_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
      double sum = 0;
      for (size_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
      nll += mx + std::log(sum) - double(row[chunk[size_t(i) + 1]]);
    }
    r.chunk_nll.push_back(nll);
    r.nll_sum += nll;
    r.n_scored += n_ctx - 1;
  }
  return r;
}

}  // namespace strata
