#pragma once
// The sampler's rule written directly (tests/test_sampling.cpp's reference, bench/bench_sampling.cpp's
// baseline): every logit penalized in a full copy, all of them sorted (partial_sort for top-k), then top-p,
// min-p, temperature and the draw over the sorted candidates, as strata::Sampler did before session 38.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "engine/sampling.h"

namespace strata::test {

// P's pick from logits ([V]) with penalty window hist, drawing from rng (once, unless greedy).
inline int32_t reference_pick(const SamplingParams& P, const std::vector<float>& logits,
                              const std::vector<int32_t>& hist, Rng& rng) {
  struct C {
    int32_t id;
    float logit;
    double p;
  };
  const int32_t V = int32_t(logits.size());
  std::vector<C> c(logits.size());
  for (int32_t i = 0; i < V; ++i) c[size_t(i)] = {i, logits[size_t(i)], 0};
  std::map<int32_t, int> counts;
  for (int32_t t : hist)
    if (t >= 0 && t < V) ++counts[t];
  if (P.repeat_penalty != 1.0f || P.presence_penalty != 0.0f || P.frequency_penalty != 0.0f)
    for (const auto& [t, k] : counts) {
      float& l = c[size_t(t)].logit;
      l = l > 0 ? l / P.repeat_penalty : l * P.repeat_penalty;
      l -= float(k) * P.frequency_penalty + P.presence_penalty;
    }
  auto before = [](const C& a, const C& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };
  if (P.temperature <= 0) return std::min_element(c.begin(), c.end(), before)->id;
  size_t n = c.size();
  if (P.top_k > 0 && size_t(P.top_k) < n) {
    n = size_t(P.top_k);
    std::partial_sort(c.begin(), c.begin() + std::ptrdiff_t(n), c.end(), before);
  } else {
    std::sort(c.begin(), c.end(), before);
  }
  auto softmax_n = [&](size_t m, float temp) {
    double sum = 0;
    for (size_t i = 0; i < m; ++i) sum += (c[i].p = std::exp((c[i].logit - c[0].logit) / temp));
    for (size_t i = 0; i < m; ++i) c[i].p = float(c[i].p / sum);
  };
  if (P.top_p < 1.0f) {
    softmax_n(n, 1.0f);
    double cum = 0;
    for (size_t i = 0; i < n; ++i)
      if ((cum += c[i].p) >= P.top_p) {
        n = i + 1;
        break;
      }
  }
  if (P.min_p > 0.0f) {
    const float th = c[0].logit + std::log(P.min_p);
    size_t keep = 1;
    while (keep < n && c[keep].logit >= th) ++keep;
    n = keep;
  }
  softmax_n(n, P.temperature);
  const double u = rng.uniform();
  double cum = 0;
  for (size_t i = 0; i < n; ++i)
    if (u < (cum += c[i].p)) return c[i].id;
  return c[n - 1].id;
}

}  // namespace strata::test
