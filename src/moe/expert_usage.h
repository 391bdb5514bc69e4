#pragma once
// Per-layer expert-usage counts of a MoE model: how often the router picked each expert. The forward
// pass reports every token's top-k choice (ForwardOptions::usage); `strata profile` prints the
// summary and writes the JSON that the GPU expert cache will load to decide residency.
//
// JSON (reloadable with from_json; the summary numbers are recomputed from the counts on load):
//   {"format": "strata-expert-usage", "version": 1, "n_layer": L, "n_expert": X, "n_expert_used": k,
//    "layers": [{"layer": 0, "tokens": N, "counts": [X ints], "entropy_bits": .., "top25_share": ..}]}
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::moe {

struct LayerUsageStats {
  int64_t tokens = 0;          // tokens routed through the layer
  int64_t selections = 0;      // tokens * k (sum of counts)
  double entropy_bits = 0;     // entropy of the selection distribution over experts
  double entropy_norm = 0;     // entropy_bits / log2(n_expert): 1 = perfectly uniform
  double top25_share = 0;      // share of selections served by the ceil(n_expert/4) most used experts
  int n_unused = 0;            // experts never selected
  std::vector<int> ranking;    // expert ids, most used first (ties: lower id first)
};

class ExpertUsage {
 public:
  ExpertUsage() = default;
  ExpertUsage(int n_layer, int n_expert, int n_expert_used);

  // ids: [n_tok][k] expert ids chosen for each token of `layer` (k = n_expert_used).
  void add(int layer, const int32_t* ids, int64_t n_tok);
  void merge(const ExpertUsage& other);  // same geometry
  void clear();

  int n_layer() const { return n_layer_; }
  int n_expert() const { return n_expert_; }
  int n_expert_used() const { return n_used_; }
  int64_t count(int layer, int expert) const;
  int64_t tokens(int layer) const;
  LayerUsageStats layer_stats(int layer) const;

  std::string to_json(int indent = 1) const;
  static ExpertUsage from_json(std::string_view text);  // validates; throws strata::Error

 private:
  int n_layer_ = 0, n_expert_ = 0, n_used_ = 0;
  std::vector<int64_t> counts_;  // [n_layer][n_expert]
  std::vector<int64_t> tokens_;  // [n_layer]
};

}  // namespace strata::moe
