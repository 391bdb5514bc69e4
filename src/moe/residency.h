#pragma once
// Which experts sit in the GPU expert cache (issue 7): the host copy of the residency table and the
// policy that fills and adapts it. Pure host code (strata_core), tested without a GPU; the device copy,
// the slots and the copies live in cuda/expert_cache.h.
//
//   table: int32 [n_layer][n_expert] -> slot in [0, n_slots) or -1 (not resident: the CPU pool runs it)
//   owner: [n_slots] -> (layer, expert) or free
// Invariants (checked by check_invariants(), used by tests and debug builds): table and owner are inverse
// maps; no slot holds two experts; a slot in `evicting` state is owned by nobody and not free.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moe/expert_usage.h"

namespace strata::moe {

struct ExpertId {
  int32_t layer = -1, expert = -1;
  bool operator==(const ExpertId&) const = default;
};

// One planned replacement: `in` (hot, not resident) takes the slot of `out` (cold, resident).
struct Swap {
  ExpertId in, out;
  int32_t slot = -1;
};

class Residency {
 public:
  Residency(int n_layer, int n_expert, int n_slots);  // all free; n_slots may be 0 or > n_layer*n_expert
                                                      // (then capped at n_layer*n_expert)
  int n_layer() const { return n_layer_; }
  int n_expert() const { return n_expert_; }
  int n_slots() const { return n_slots_; }
  int used_slots() const;

  int32_t slot(int layer, int expert) const { return table_[size_t(layer) * n_expert_ + expert]; }
  bool resident(int layer, int expert) const { return slot(layer, expert) >= 0; }
  const int32_t* table() const { return table_.data(); }   // [n_layer][n_expert]
  const int32_t* layer_row(int layer) const { return table_.data() + size_t(layer) * n_expert_; }
  ExpertId owner(int32_t slot) const { return owner_[size_t(slot)]; }
  int resident_in_layer(int layer) const;  // how many of the layer's experts are resident

  // First placement, replacing whatever was there. From a usage profile: the n_slots (layer, expert)
  // pairs with the highest share of their layer's selections (ties: lower layer, then lower expert);
  // every layer's share is used so a layer seen by fewer tokens is not starved. Throws strata::Error
  // when the profile's geometry differs from the table's.
  void place_from_profile(const ExpertUsage& profile);
  // Without a profile: spread evenly, each layer gets n_slots / n_layer slots (the first
  // n_slots % n_layer layers one more), filled with experts 0, 1, ... of that layer.
  void place_evenly();

  // Adaptation. scores: [n_layer][n_expert] recent use (e.g. decayed counts). Pairs the hottest
  // non-resident experts with the coldest resident ones, globally, hottest first, and keeps a pair only
  // when score(in) > score(out) * (1 + hysteresis) + min_gain; at most max_swaps. Does not change the
  // table.
  std::vector<Swap> plan(std::span<const double> scores, int max_swaps, double hysteresis = 0.25,
                         double min_gain = 1.0) const;

  // The two halves of a swap (cuda::ExpertCache orders the copy between them):
  // evict: table[out] = -1, the slot is reserved (neither free nor owned) until admit.
  void evict(ExpertId out);
  // admit: table[in] = slot, owner[slot] = in. `in` must not be resident; slot must be reserved or free.
  void admit(ExpertId in, int32_t slot);
  // A free or reserved slot id, or -1 (used by place_* and by tests).
  int32_t free_slot() const;

  void check_invariants() const;  // throws strata::Error naming the first broken invariant
  std::string summary() const;    // "slots 96/96 used, layers 0-3: 24 24 24 24 resident"

 private:
  int n_layer_, n_expert_, n_slots_;
  std::vector<int32_t> table_;   // [n_layer][n_expert]
  std::vector<ExpertId> owner_;  // [n_slots]; {-1,-1} free
  std::vector<uint8_t> reserved_;  // [n_slots]; 1 between evict and admit
};

// Decayed per-expert use for adaptation: add() counts selections, decay() multiplies all by a factor
// (called every adaptation period so old traffic fades).
class UsageScores {
 public:
  UsageScores(int n_layer, int n_expert);
  void add(int layer, const int32_t* ids, int64_t n);  // ids: n expert ids of `layer` (may repeat)
  void decay(double factor);
  std::span<const double> scores() const { return scores_; }  // [n_layer][n_expert]
 private:
  int n_layer_, n_expert_;
  std::vector<double> scores_;
};

// Sizing for `--expert-cache auto`: how many slots of slot_bytes fit in free_bytes (the GPU's free memory
// before the cache is allocated) after reserve_bytes (--vram-reserve-mib) and other_bytes (dense weights,
// KV, workspace still to be allocated) are set aside; 0 when nothing fits; at most max_slots
// (n_layer * n_expert). Throws strata::Error for slot_bytes <= 0 or max_slots < 0.
int auto_expert_slots(size_t free_bytes, size_t reserve_bytes, size_t other_bytes, int64_t slot_bytes,
                      int max_slots);

}  // namespace strata::moe
