#include "moe/expert_usage.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace strata::moe {

ExpertUsage::ExpertUsage(int n_layer, int n_expert, int n_expert_used)
    : n_layer_(n_layer), n_expert_(n_expert), n_used_(n_expert_used) {
  STRATA_REQUIRE(n_layer >= 1 && n_layer <= 4096, "expert usage: {} layers", n_layer);
  STRATA_REQUIRE(n_expert >= 1 && n_expert <= 4096, "expert usage: {} experts", n_expert);
  STRATA_REQUIRE(n_expert_used >= 1 && n_expert_used <= n_expert,
                 "expert usage: {} experts used of {}", n_expert_used, n_expert);
  counts_.assign(static_cast<size_t>(n_layer) * n_expert, 0);
  tokens_.assign(static_cast<size_t>(n_layer), 0);
}

void ExpertUsage::add(int layer, const int32_t* ids, int64_t n_tok) {
  STRATA_REQUIRE(layer >= 0 && layer < n_layer_, "expert usage: layer {} of {}", layer, n_layer_);
  int64_t* c = counts_.data() + static_cast<size_t>(layer) * n_expert_;
  for (int64_t i = 0; i < n_tok * n_used_; ++i) {
    STRATA_REQUIRE(ids[i] >= 0 && ids[i] < n_expert_, "expert usage: expert id {} of {}", ids[i],
                   n_expert_);
    ++c[ids[i]];
  }
  tokens_[static_cast<size_t>(layer)] += n_tok;
}

void ExpertUsage::merge(const ExpertUsage& o) {
  STRATA_REQUIRE(o.n_layer_ == n_layer_ && o.n_expert_ == n_expert_ && o.n_used_ == n_used_,
                 "expert usage: merging {}x{} (k {}) into {}x{} (k {})", o.n_layer_, o.n_expert_,
                 o.n_used_, n_layer_, n_expert_, n_used_);
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += o.counts_[i];
  for (size_t i = 0; i < tokens_.size(); ++i) tokens_[i] += o.tokens_[i];
}

void ExpertUsage::clear() {
  std::fill(counts_.begin(), counts_.end(), 0);
  std::fill(tokens_.begin(), tokens_.end(), 0);
}

int64_t ExpertUsage::count(int layer, int expert) const {
  STRATA_REQUIRE(layer >= 0 && layer < n_layer_ && expert >= 0 && expert < n_expert_,
                 "expert usage: ({}, {}) out of range", layer, expert);
  return counts_[static_cast<size_t>(layer) * n_expert_ + expert];
}

int64_t ExpertUsage::tokens(int layer) const {
  STRATA_REQUIRE(layer >= 0 && layer < n_layer_, "expert usage: layer {} of {}", layer, n_layer_);
  return tokens_[static_cast<size_t>(layer)];
}

LayerUsageStats ExpertUsage::layer_stats(int layer) const {
  LayerUsageStats s;
  s.tokens = tokens(layer);
  const int64_t* c = counts_.data() + static_cast<size_t>(layer) * n_expert_;
  s.selections = std::accumulate(c, c + n_expert_, int64_t{0});
  s.ranking.resize(static_cast<size_t>(n_expert_));
  std::iota(s.ranking.begin(), s.ranking.end(), 0);
  std::stable_sort(s.ranking.begin(), s.ranking.end(), [&](int a, int b) { return c[a] > c[b]; });
  for (int e = 0; e < n_expert_; ++e) s.n_unused += c[e] == 0;
  if (s.selections == 0) return s;
  for (int e = 0; e < n_expert_; ++e) {
    if (c[e] == 0) continue;
    const double p = static_cast<double>(c[e]) / static_cast<double>(s.selections);
    s.entropy_bits -= p * std::log2(p);
  }
  s.entropy_norm = n_expert_ > 1 ? s.entropy_bits / std::log2(static_cast<double>(n_expert_)) : 1.0;
  const int top = (n_expert_ + 3) / 4;
  int64_t served = 0;
  for (int i = 0; i < top; ++i) served += c[s.ranking[static_cast<size_t>(i)]];
  s.top25_share = static_cast<double>(served) / static_cast<double>(s.selections);
  return s;
}

std::string ExpertUsage::to_json(int indent) const {
  nlohmann::json j;
  j["format"] = "strata-expert-usage";
  j["version"] = 1;
  j["n_layer"] = n_layer_;
  j["n_expert"] = n_expert_;
  j["n_expert_used"] = n_used_;
  j["layers"] = nlohmann::json::array();
  for (int l = 0; l < n_layer_; ++l) {
    const LayerUsageStats s = layer_stats(l);
    const int64_t* c = counts_.data() + static_cast<size_t>(l) * n_expert_;
    j["layers"].push_back({{"layer", l},
                           {"tokens", s.tokens},
                           {"counts", std::vector<int64_t>(c, c + n_expert_)},
                           {"entropy_bits", s.entropy_bits},
                           {"entropy_norm", s.entropy_norm},
                           {"top25_share", s.top25_share},
                           {"unused", s.n_unused},
                           {"ranking", s.ranking}});
  }
  return j.dump(indent);
}

ExpertUsage ExpertUsage::from_json(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  STRATA_REQUIRE(!j.is_discarded() && j.is_object(), "expert usage: not a JSON object");
  STRATA_REQUIRE(j.contains("format") && j["format"].is_string() &&
                     j["format"].get<std::string>() == "strata-expert-usage" && j.contains("version") &&
                     j["version"].is_number_integer() && j["version"].get<int64_t>() == 1,
                 "expert usage: not a strata-expert-usage version 1 document");
  auto geti = [&](const nlohmann::json& o, const char* k, int64_t lo, int64_t hi) {
    STRATA_REQUIRE(o.is_object() && o.contains(k) && o[k].is_number_integer(),
                   "expert usage: missing integer '{}'", k);
    const int64_t v = o[k].get<int64_t>();
    STRATA_REQUIRE(v >= lo && v <= hi, "expert usage: '{}' = {} out of range [{}, {}]", k, v, lo, hi);
    return v;
  };
  const int L = static_cast<int>(geti(j, "n_layer", 1, 4096));
  const int X = static_cast<int>(geti(j, "n_expert", 1, 4096));
  const int k = static_cast<int>(geti(j, "n_expert_used", 1, X));
  ExpertUsage u(L, X, k);
  STRATA_REQUIRE(j.contains("layers") && j["layers"].is_array() &&
                     j["layers"].size() == static_cast<size_t>(L),
                 "expert usage: 'layers' should be an array of {} entries", L);
  constexpr int64_t kMaxCount = int64_t{1} << 40;  // x 4096 experts stays far inside int64
  for (int l = 0; l < L; ++l) {
    const auto& o = j["layers"][static_cast<size_t>(l)];
    STRATA_REQUIRE(geti(o, "layer", 0, L - 1) == l, "expert usage: layers out of order at {}", l);
    const int64_t n_tok = geti(o, "tokens", 0, kMaxCount);
    STRATA_REQUIRE(o.contains("counts") && o["counts"].is_array() &&
                       o["counts"].size() == static_cast<size_t>(X),
                   "expert usage: layer {} needs {} counts", l, X);
    int64_t sum = 0;
    for (int e = 0; e < X; ++e) {
      const auto& c = o["counts"][static_cast<size_t>(e)];
      STRATA_REQUIRE(c.is_number_integer() && c.get<int64_t>() >= 0 && c.get<int64_t>() <= kMaxCount,
                     "expert usage: layer {} expert {}: bad count", l, e);
      u.counts_[static_cast<size_t>(l) * X + e] = c.get<int64_t>();
      sum += c.get<int64_t>();
    }
    STRATA_REQUIRE(sum == n_tok * k, "expert usage: layer {}: counts sum to {}, expected tokens*k = {}",
                   l, sum, n_tok * k);
    u.tokens_[static_cast<size_t>(l)] = n_tok;
  }
  return u;
}

}  // namespace strata::moe
