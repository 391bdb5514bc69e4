#include "moe/residency.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <numeric>

#include "common/error.h"

namespace strata::moe {

namespace {
constexpr ExpertId kNobody{-1, -1};
}

Residency::Residency(int n_layer, int n_expert, int n_slots) : n_layer_(n_layer), n_expert_(n_expert) {
  STRATA_REQUIRE(n_layer > 0 && n_expert > 0, "residency: n_layer ({}) and n_expert ({}) must be positive",
                 n_layer, n_expert);
  STRATA_REQUIRE(n_slots >= 0, "residency: n_slots must be >= 0, got {}", n_slots);
  const int64_t total = int64_t(n_layer) * n_expert;
  STRATA_REQUIRE(total <= int64_t(1) << 30, "residency: {} layers x {} experts is too many", n_layer,
                 n_expert);
  n_slots_ = int(std::min<int64_t>(n_slots, total));
  table_.assign(size_t(total), -1);
  owner_.assign(size_t(n_slots_), kNobody);
  reserved_.assign(size_t(n_slots_), 0);
}

int Residency::used_slots() const {
  int n = 0;
  for (const ExpertId& o : owner_) n += o.layer >= 0;
  return n;
}

int Residency::resident_in_layer(int layer) const {
  STRATA_REQUIRE(layer >= 0 && layer < n_layer_, "residency: layer {} out of range [0, {})", layer, n_layer_);
  const int32_t* row = layer_row(layer);
  return int(std::count_if(row, row + n_expert_, [](int32_t s) { return s >= 0; }));
}

void Residency::place_from_profile(const ExpertUsage& profile) {
  STRATA_REQUIRE(profile.n_layer() == n_layer_ && profile.n_expert() == n_expert_,
                 "expert usage profile is for {} layers x {} experts, the model has {} x {}", profile.n_layer(),
                 profile.n_expert(), n_layer_, n_expert_);
  // share[l][e] = count / selections of layer l (0 for a layer never seen)
  std::vector<double> share(table_.size(), 0.0);
  for (int l = 0; l < n_layer_; ++l) {
    int64_t sel = 0;
    for (int e = 0; e < n_expert_; ++e) sel += profile.count(l, e);
    if (sel <= 0) continue;
    for (int e = 0; e < n_expert_; ++e)
      share[size_t(l) * n_expert_ + e] = double(profile.count(l, e)) / double(sel);
  }
  std::vector<int32_t> order(table_.size());
  std::iota(order.begin(), order.end(), 0);
  // Highest share first; ties: lower flat index = lower layer, then lower expert.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return share[a] > share[b]; });
  std::fill(table_.begin(), table_.end(), -1);
  std::fill(owner_.begin(), owner_.end(), kNobody);
  std::fill(reserved_.begin(), reserved_.end(), 0);
  for (int s = 0; s < n_slots_; ++s) {
    const int32_t flat = order[size_t(s)];
    table_[size_t(flat)] = s;
    owner_[size_t(s)] = {flat / n_expert_, flat % n_expert_};
  }
}

void Residency::place_evenly() {
  std::fill(table_.begin(), table_.end(), -1);
  std::fill(owner_.begin(), owner_.end(), kNobody);
  std::fill(reserved_.begin(), reserved_.end(), 0);
  const int base = n_slots_ / n_layer_, extra = n_slots_ % n_layer_;
  int32_t s = 0;
  for (int l = 0; l < n_layer_; ++l) {
    const int n = base + (l < extra ? 1 : 0);  // <= n_expert since n_slots <= n_layer * n_expert
    for (int e = 0; e < n; ++e, ++s) {
      table_[size_t(l) * n_expert_ + e] = s;
      owner_[size_t(s)] = {l, e};
    }
  }
}

std::vector<Swap> Residency::plan(std::span<const double> scores, int max_swaps, double hysteresis,
                                  double min_gain) const {
  STRATA_REQUIRE(scores.size() == table_.size(), "residency plan: {} scores for {} layers x {} experts",
                 scores.size(), n_layer_, n_expert_);
  STRATA_REQUIRE(std::isfinite(hysteresis) && hysteresis >= 0 && std::isfinite(min_gain) && min_gain >= 0,
                 "residency plan: hysteresis ({}) and min_gain ({}) must be finite and >= 0", hysteresis,
                 min_gain);
  std::vector<Swap> out;
  if (max_swaps <= 0) return out;
  std::vector<int32_t> hot, cold;  // flat indices: non-resident / resident experts
  for (size_t i = 0; i < table_.size(); ++i) (table_[i] >= 0 ? cold : hot).push_back(int32_t(i));
  if (hot.empty() || cold.empty()) return out;
  // NaN scores count as 0 so the ordering stays strict-weak.
  auto sc = [&](int32_t i) { return std::isnan(scores[size_t(i)]) ? 0.0 : scores[size_t(i)]; };
  const size_t k = std::min({hot.size(), cold.size(), size_t(max_swaps)});
  // Hottest non-resident first, coldest resident first; ties: lower layer, then lower expert.
  std::partial_sort(hot.begin(), hot.begin() + k, hot.end(), [&](int32_t a, int32_t b) {
    return sc(a) > sc(b) || (sc(a) == sc(b) && a < b);
  });
  std::partial_sort(cold.begin(), cold.begin() + k, cold.end(), [&](int32_t a, int32_t b) {
    return sc(a) < sc(b) || (sc(a) == sc(b) && a < b);
  });
  for (size_t i = 0; i < k; ++i) {
    const double in = sc(hot[i]), cool = sc(cold[i]);
    // Pairs only get worse down the lists: stop at the first that does not pay.
    if (!(in > cool * (1.0 + hysteresis) + min_gain)) break;
    Swap sw;
    sw.in = {hot[i] / n_expert_, hot[i] % n_expert_};
    sw.out = {cold[i] / n_expert_, cold[i] % n_expert_};
    sw.slot = table_[size_t(cold[i])];
    out.push_back(sw);
  }
  return out;
}

void Residency::evict(ExpertId out) {
  STRATA_REQUIRE(out.layer >= 0 && out.layer < n_layer_ && out.expert >= 0 && out.expert < n_expert_,
                 "residency evict: expert ({}, {}) out of range", out.layer, out.expert);
  int32_t& t = table_[size_t(out.layer) * n_expert_ + out.expert];
  STRATA_REQUIRE(t >= 0, "residency evict: expert ({}, {}) is not resident", out.layer, out.expert);
  owner_[size_t(t)] = kNobody;
  reserved_[size_t(t)] = 1;
  t = -1;
}

void Residency::admit(ExpertId in, int32_t slot) {
  STRATA_REQUIRE(in.layer >= 0 && in.layer < n_layer_ && in.expert >= 0 && in.expert < n_expert_,
                 "residency admit: expert ({}, {}) out of range", in.layer, in.expert);
  STRATA_REQUIRE(slot >= 0 && slot < n_slots_, "residency admit: slot {} out of range [0, {})", slot, n_slots_);
  int32_t& t = table_[size_t(in.layer) * n_expert_ + in.expert];
  STRATA_REQUIRE(t < 0, "residency admit: expert ({}, {}) is already in slot {}", in.layer, in.expert, t);
  STRATA_REQUIRE(owner_[size_t(slot)].layer < 0, "residency admit: slot {} is held by expert ({}, {})", slot,
                 owner_[size_t(slot)].layer, owner_[size_t(slot)].expert);
  t = slot;
  owner_[size_t(slot)] = in;
  reserved_[size_t(slot)] = 0;
}

int32_t Residency::free_slot() const {
  int32_t reserved = -1;
  for (int32_t s = 0; s < n_slots_; ++s) {
    if (owner_[size_t(s)].layer >= 0) continue;
    if (!reserved_[size_t(s)]) return s;
    if (reserved < 0) reserved = s;
  }
  return reserved;
}

void Residency::check_invariants() const {
  int resident = 0;
  for (int l = 0; l < n_layer_; ++l)
    for (int e = 0; e < n_expert_; ++e) {
      const int32_t s = slot(l, e);
      if (s < 0) {
        STRATA_REQUIRE(s == -1, "residency invariant: table[{}][{}] = {} (negative but not -1)", l, e, s);
        continue;
      }
      ++resident;
      STRATA_REQUIRE(s < n_slots_, "residency invariant: table[{}][{}] = {} >= n_slots {}", l, e, s, n_slots_);
      const ExpertId o = owner_[size_t(s)];
      STRATA_REQUIRE(o.layer == l && o.expert == e,
                     "residency invariant: table[{}][{}] = slot {} but the slot's owner is ({}, {})", l, e, s,
                     o.layer, o.expert);
      STRATA_REQUIRE(!reserved_[size_t(s)], "residency invariant: slot {} is owned by ({}, {}) and reserved", s,
                     l, e);
    }
  int owned = 0;
  for (int32_t s = 0; s < n_slots_; ++s) {
    const ExpertId o = owner_[size_t(s)];
    if (o == kNobody) continue;
    STRATA_REQUIRE(o.layer >= 0 && o.layer < n_layer_ && o.expert >= 0 && o.expert < n_expert_,
                   "residency invariant: slot {} owner ({}, {}) out of range", s, o.layer, o.expert);
    STRATA_REQUIRE(slot(o.layer, o.expert) == s,
                   "residency invariant: slot {} is owned by ({}, {}) whose table entry is {}", s, o.layer,
                   o.expert, slot(o.layer, o.expert));
    ++owned;
  }
  STRATA_REQUIRE(owned == resident, "residency invariant: {} owned slots but {} resident experts", owned,
                 resident);
}

std::string Residency::summary() const {
  int reserved = 0;
  for (uint8_t r : reserved_) reserved += r;
  std::string s = fmt::format("slots {}/{} used", used_slots(), n_slots_);
  if (reserved) s += fmt::format(" ({} being refilled)", reserved);
  s += fmt::format(", layers 0-{}:", n_layer_ - 1);
  for (int l = 0; l < n_layer_; ++l) s += fmt::format(" {}", resident_in_layer(l));
  s += " resident";
  return s;
}

// ---- UsageScores ----
UsageScores::UsageScores(int n_layer, int n_expert) : n_layer_(n_layer), n_expert_(n_expert) {
  STRATA_REQUIRE(n_layer > 0 && n_expert > 0, "usage scores: n_layer ({}) and n_expert ({}) must be positive",
                 n_layer, n_expert);
  scores_.assign(size_t(n_layer) * size_t(n_expert), 0.0);
}

void UsageScores::add(int layer, const int32_t* ids, int64_t n) {
  STRATA_REQUIRE(layer >= 0 && layer < n_layer_, "usage scores: layer {} out of range [0, {})", layer, n_layer_);
  STRATA_REQUIRE(n >= 0 && (ids != nullptr || n == 0), "usage scores: bad id list (n = {})", n);
  double* row = scores_.data() + size_t(layer) * n_expert_;
  for (int64_t i = 0; i < n; ++i) {
    STRATA_REQUIRE(ids[i] >= 0 && ids[i] < n_expert_, "usage scores: expert id {} out of range [0, {})", ids[i],
                   n_expert_);
    row[ids[i]] += 1.0;
  }
}

void UsageScores::decay(double factor) {
  STRATA_REQUIRE(std::isfinite(factor) && factor >= 0 && factor <= 1,
                 "usage scores: decay factor {} must be in [0, 1]", factor);
  for (double& s : scores_) s *= factor;
}

// ---- sizing ----
int auto_expert_slots(size_t free_bytes, size_t reserve_bytes, size_t other_bytes, int64_t slot_bytes,
                      int max_slots) {
  STRATA_REQUIRE(slot_bytes > 0, "expert cache sizing: slot size must be positive, got {}", slot_bytes);
  STRATA_REQUIRE(max_slots >= 0, "expert cache sizing: max_slots must be >= 0, got {}", max_slots);
  if (free_bytes <= reserve_bytes || free_bytes - reserve_bytes <= other_bytes) return 0;
  const uint64_t avail = uint64_t(free_bytes - reserve_bytes - other_bytes);
  const uint64_t fit = avail / uint64_t(slot_bytes);
  return int(std::min<uint64_t>(fit, uint64_t(max_slots)));
}

}  // namespace strata::moe
