// The residency table and its policy (moe/residency.h), host only.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "common/error.h"
#include "moe/expert_usage.h"
#include "moe/residency.h"

namespace {

using strata::moe::ExpertId;
using strata::moe::Residency;
using strata::moe::Swap;
using strata::moe::UsageScores;

std::vector<ExpertId> resident_set(const Residency& r) {
  std::vector<ExpertId> v;
  for (int l = 0; l < r.n_layer(); ++l)
    for (int e = 0; e < r.n_expert(); ++e)
      if (r.resident(l, e)) v.push_back({l, e});
  return v;
}

TEST(Residency, StartsEmptyAndCapsSlots) {
  Residency r(3, 4, 100);
  EXPECT_EQ(r.n_slots(), 12);
  EXPECT_EQ(r.used_slots(), 0);
  r.check_invariants();
  r.place_evenly();
  EXPECT_EQ(r.used_slots(), 12);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(r.resident_in_layer(l), 4);
  r.check_invariants();
  EXPECT_EQ(r.free_slot(), -1);
}

TEST(Residency, ZeroSlotsWork) {
  Residency r(2, 8, 0);
  EXPECT_EQ(r.n_slots(), 0);
  r.place_evenly();
  EXPECT_EQ(r.used_slots(), 0);
  EXPECT_EQ(r.free_slot(), -1);
  strata::moe::ExpertUsage u(2, 8, 2);
  r.place_from_profile(u);
  r.check_invariants();
  std::vector<double> scores(16, 100.0);
  EXPECT_TRUE(r.plan(scores, 4).empty());
  EXPECT_EQ(r.summary(), "slots 0/0 used, layers 0-1: 0 0 resident");
}

TEST(Residency, BadGeometryIsAnError) {
  EXPECT_THROW(Residency(0, 8, 4), strata::Error);
  EXPECT_THROW(Residency(2, 0, 4), strata::Error);
  EXPECT_THROW(Residency(2, 8, -1), strata::Error);
  Residency r(2, 8, 4);
  strata::moe::ExpertUsage wrong_layers(3, 8, 2), wrong_experts(2, 16, 2);
  EXPECT_THROW(r.place_from_profile(wrong_layers), strata::Error);
  EXPECT_THROW(r.place_from_profile(wrong_experts), strata::Error);
  std::vector<double> short_scores(15, 1.0);
  EXPECT_THROW(r.plan(short_scores, 1), strata::Error);
  EXPECT_THROW(r.evict({2, 0}), strata::Error);     // layer out of range
  EXPECT_THROW(r.evict({0, 0}), strata::Error);     // not resident
  EXPECT_THROW(r.admit({0, 8}, 0), strata::Error);  // expert out of range
  EXPECT_THROW(r.admit({0, 0}, 4), strata::Error);  // slot out of range
  r.check_invariants();                             // nothing changed by the failed calls
  EXPECT_EQ(r.used_slots(), 0);
}

TEST(Residency, PlaceEvenlySpreads) {
  Residency r(4, 10, 10);  // 10 slots over 4 layers: 3 3 2 2
  r.place_evenly();
  r.check_invariants();
  EXPECT_EQ(r.resident_in_layer(0), 3);
  EXPECT_EQ(r.resident_in_layer(1), 3);
  EXPECT_EQ(r.resident_in_layer(2), 2);
  EXPECT_EQ(r.resident_in_layer(3), 2);
  EXPECT_TRUE(r.resident(0, 0) && r.resident(0, 2) && !r.resident(0, 3));
  EXPECT_TRUE(r.resident(3, 1) && !r.resident(3, 2));
  EXPECT_EQ(r.summary(), "slots 10/10 used, layers 0-3: 3 3 2 2 resident");
  // Every slot is used exactly once.
  std::set<int32_t> slots;
  for (auto id : resident_set(r)) slots.insert(r.slot(id.layer, id.expert));
  EXPECT_EQ(slots.size(), 10u);
}

TEST(Residency, PlaceFromProfilePicksTheHottestByShare) {
  // Layer 0 saw 100 tokens, layer 1 only 10: shares, not counts, decide.
  strata::moe::ExpertUsage u(2, 4, 1);
  auto add = [&](int layer, int expert, int times) {
    std::vector<int32_t> ids(size_t(times), expert);
    u.add(layer, ids.data(), times);
  };
  add(0, 0, 50);  // share 0.5
  add(0, 1, 30);  // 0.3
  add(0, 2, 20);  // 0.2
  add(1, 3, 6);   // 0.6
  add(1, 2, 4);   // 0.4
  Residency r(2, 4, 3);
  r.place_evenly();  // replaced by the profile
  r.place_from_profile(u);
  r.check_invariants();
  EXPECT_TRUE(r.resident(1, 3));  // 0.6
  EXPECT_TRUE(r.resident(0, 0));  // 0.5
  EXPECT_TRUE(r.resident(1, 2));  // 0.4
  EXPECT_FALSE(r.resident(0, 1)); // 0.3: more selections than (1, 2), lower share
  EXPECT_EQ(r.used_slots(), 3);

  // Ties: lower layer, then lower expert. All zero: the first 3 of layer 0.
  strata::moe::ExpertUsage empty(2, 4, 1);
  r.place_from_profile(empty);
  EXPECT_TRUE(r.resident(0, 0) && r.resident(0, 1) && r.resident(0, 2));
  EXPECT_FALSE(r.resident(0, 3));
  EXPECT_EQ(r.resident_in_layer(1), 0);
}

TEST(Residency, PlanPairsHottestInWithColdestOut) {
  Residency r(1, 6, 3);
  r.place_evenly();  // resident 0 1 2
  //                          0    1    2   3    4    5
  std::vector<double> scores{5.0, 0.0, 1.0, 9.0, 40.0, 2.0};
  auto plan = r.plan(scores, 10, 0.25, 1.0);
  // in: 4 (40), 3 (9), 5 (2); out: 1 (0), 2 (1), 0 (5).
  // 40 > 0*1.25+1 yes; 9 > 1*1.25+1 yes; 2 > 5*1.25+1 no.
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].in, (ExpertId{0, 4}));
  EXPECT_EQ(plan[0].out, (ExpertId{0, 1}));
  EXPECT_EQ(plan[0].slot, r.slot(0, 1));
  EXPECT_EQ(plan[1].in, (ExpertId{0, 3}));
  EXPECT_EQ(plan[1].out, (ExpertId{0, 2}));
  EXPECT_EQ(plan[1].slot, r.slot(0, 2));
  // max_swaps caps it.
  EXPECT_EQ(r.plan(scores, 1).size(), 1u);
  EXPECT_TRUE(r.plan(scores, 0).empty());
  // Does not change the table.
  EXPECT_TRUE(r.resident(0, 1) && !r.resident(0, 4));
}

TEST(Residency, PlanHysteresisKeepsCloseScores) {
  Residency r(1, 2, 1);
  r.place_evenly();  // expert 0 resident
  std::vector<double> scores{10.0, 12.0};
  EXPECT_TRUE(r.plan(scores, 1, 0.25, 1.0).empty());  // 12 <= 10*1.25+1
  scores[1] = 13.6;
  EXPECT_EQ(r.plan(scores, 1, 0.25, 1.0).size(), 1u);  // 13.6 > 13.5
  EXPECT_TRUE(r.plan(scores, 1, 0.5, 1.0).empty());     // 13.6 <= 16
  // min_gain: tiny scores do not cause churn.
  std::vector<double> tiny{0.0, 0.9};
  EXPECT_TRUE(r.plan(tiny, 1, 0.0, 1.0).empty());
  EXPECT_EQ(r.plan(tiny, 1, 0.0, 0.5).size(), 1u);
}

TEST(Residency, PlanIsAcrossLayers) {
  Residency r(2, 4, 2);
  r.place_evenly();  // (0,0) and (1,0)
  std::vector<double> scores{1, 0, 0, 0, /*layer 1*/ 30, 50, 40, 0};
  auto plan = r.plan(scores, 2, 0.25, 1.0);
  // in: (1,1)=50, (1,2)=40; out: (0,0)=1, (1,0)=30. 50 > 2.25 yes; 40 > 38.5 yes.
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].in, (ExpertId{1, 1}));
  EXPECT_EQ(plan[0].out, (ExpertId{0, 0}));
  EXPECT_EQ(plan[1].in, (ExpertId{1, 2}));
  EXPECT_EQ(plan[1].out, (ExpertId{1, 0}));
}

// Property test: random evict/admit sequences driven by random plans keep the invariants, plans never
// propose a resident `in` or a non-resident `out`, and the slot of a swap is out's slot.
TEST(Residency, RandomEvictAdmitKeepsInvariants) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    const int n_layer = 1 + int(rng() % 5), n_expert = 1 + int(rng() % 12);
    const int n_slots = int(rng() % (n_layer * n_expert + 3));
    Residency r(n_layer, n_expert, n_slots);
    if (rng() % 2) r.place_evenly();
    r.check_invariants();
    std::vector<Swap> in_flight;
    std::vector<double> scores(size_t(n_layer) * n_expert);
    for (int step = 0; step < 200; ++step) {
      for (double& s : scores) s = double(rng() % 100);
      const int op = int(rng() % 4);
      if (op == 0) {  // plan and evict
        auto plan = r.plan(scores, 1 + int(rng() % 4), 0.1, 1.0);
        for (const Swap& sw : plan) {
          ASSERT_FALSE(r.resident(sw.in.layer, sw.in.expert)) << "plan proposed a resident `in`";
          ASSERT_TRUE(r.resident(sw.out.layer, sw.out.expert)) << "plan proposed a non-resident `out`";
          ASSERT_EQ(sw.slot, r.slot(sw.out.layer, sw.out.expert));
          ASSERT_GT(scores[size_t(sw.in.layer) * n_expert + sw.in.expert],
                    scores[size_t(sw.out.layer) * n_expert + sw.out.expert] * 1.1 + 1.0);
        }
        for (const Swap& sw : plan) {
          bool dup = std::any_of(in_flight.begin(), in_flight.end(), [&](const Swap& f) { return f.in == sw.in; });
          if (dup) continue;  // as ExpertCache drops it: already on its way in
          r.evict(sw.out);
          in_flight.push_back(sw);
        }
      } else if (op == 1 && !in_flight.empty()) {  // admit one
        size_t i = rng() % in_flight.size();
        r.admit(in_flight[i].in, in_flight[i].slot);
        in_flight.erase(in_flight.begin() + long(i));
      } else if (op == 2) {  // evict a random resident expert and admit a random other one in its place
        auto res = resident_set(r);
        if (res.empty()) continue;
        ExpertId out = res[rng() % res.size()];
        int32_t s = r.slot(out.layer, out.expert);
        r.evict(out);
        EXPECT_FALSE(r.resident(out.layer, out.expert));
        EXPECT_EQ(r.free_slot() >= 0, true);
        ExpertId in{int(rng() % n_layer), int(rng() % n_expert)};
        bool pending = std::any_of(in_flight.begin(), in_flight.end(), [&](const Swap& f) { return f.in == in; });
        if (!r.resident(in.layer, in.expert) && !pending) {
          r.admit(in, s);
        } else {
          in_flight.push_back({out, out, s});  // the same expert comes back into its slot later
        }
      } else if (op == 3) {  // illegal calls throw and change nothing
        auto before = std::vector<int32_t>(r.table(), r.table() + size_t(n_layer) * n_expert);
        auto res = resident_set(r);
        if (!res.empty()) {
          ExpertId a = res[rng() % res.size()];
          EXPECT_THROW(r.admit(a, 0), strata::Error);  // already resident
          if (r.n_slots() > 0 && r.owner(0).layer >= 0) {
            ExpertId b{-1, -1};
            for (int l = 0; l < n_layer && b.layer < 0; ++l)
              for (int e = 0; e < n_expert; ++e)
                if (!r.resident(l, e)) {
                  b = {l, e};
                  break;
                }
            if (b.layer >= 0) {
              EXPECT_THROW(r.admit(b, 0), strata::Error);  // slot 0 is held
            }
          }
        }
        EXPECT_EQ(before, std::vector<int32_t>(r.table(), r.table() + size_t(n_layer) * n_expert));
      }
      ASSERT_NO_THROW(r.check_invariants()) << "trial " << trial << " step " << step << ": " << r.summary();
      EXPECT_EQ(r.used_slots() + int(in_flight.size()) <= r.n_slots(), true);
    }
    for (const Swap& sw : in_flight) r.admit(sw.in, sw.slot);
    r.check_invariants();
    if (r.used_slots() == r.n_slots()) EXPECT_EQ(r.free_slot(), -1);
    else EXPECT_GE(r.free_slot(), 0);
  }
}

TEST(Residency, FreeSlotPrefersFreeOverReserved) {
  Residency r(1, 4, 3);
  EXPECT_EQ(r.free_slot(), 0);
  r.admit({0, 0}, 0);
  r.admit({0, 1}, 1);
  EXPECT_EQ(r.free_slot(), 2);
  r.evict({0, 0});  // slot 0 reserved
  EXPECT_EQ(r.free_slot(), 2);
  r.admit({0, 2}, 2);
  EXPECT_EQ(r.free_slot(), 0);  // only the reserved one is left
  EXPECT_EQ(r.summary(), "slots 2/3 used (1 being refilled), layers 0-0: 2 resident");
  r.admit({0, 3}, 0);
  EXPECT_EQ(r.free_slot(), -1);
  r.check_invariants();
}

TEST(UsageScores, CountsAndDecays) {
  UsageScores u(2, 3);
  std::vector<int32_t> ids{0, 2, 2, 1};
  u.add(1, ids.data(), 4);
  EXPECT_EQ(u.scores()[3], 1.0);
  EXPECT_EQ(u.scores()[4], 1.0);
  EXPECT_EQ(u.scores()[5], 2.0);
  EXPECT_EQ(u.scores()[0], 0.0);
  u.decay(0.5);
  EXPECT_EQ(u.scores()[5], 1.0);
  std::vector<int32_t> bad{3};
  EXPECT_THROW(u.add(0, bad.data(), 1), strata::Error);
  EXPECT_THROW(u.add(2, ids.data(), 1), strata::Error);
  EXPECT_THROW(u.decay(1.5), strata::Error);
  EXPECT_THROW(UsageScores(0, 3), strata::Error);
}

TEST(AutoExpertSlots, FitsWhatIsLeftAndCaps) {
  const size_t GiB = size_t(1) << 30, MiB = size_t(1) << 20;
  // 80 GiB free, 1 GiB reserve, 10 GiB dense/KV: 69 GiB / 9 MiB slots = 7850 slots, capped at 6144.
  EXPECT_EQ(strata::moe::auto_expert_slots(80 * GiB, GiB, 10 * GiB, 9 * MiB, 1 << 20), int(69 * GiB / (9 * MiB)));
  EXPECT_EQ(strata::moe::auto_expert_slots(80 * GiB, GiB, 10 * GiB, 9 * MiB, 6144), 6144);
  EXPECT_EQ(strata::moe::auto_expert_slots(10 * GiB, GiB, 10 * GiB, 9 * MiB, 6144), 0);  // nothing left
  EXPECT_EQ(strata::moe::auto_expert_slots(GiB, 2 * GiB, 0, 9 * MiB, 6144), 0);          // reserve > free
  EXPECT_EQ(strata::moe::auto_expert_slots(100, 0, 0, 10, 6144), 10);                    // exact fit
  EXPECT_EQ(strata::moe::auto_expert_slots(99, 0, 0, 10, 6144), 9);
  EXPECT_THROW(strata::moe::auto_expert_slots(100, 0, 0, 0, 10), strata::Error);
  EXPECT_THROW(strata::moe::auto_expert_slots(100, 0, 0, 10, -1), strata::Error);
}

}  // namespace
