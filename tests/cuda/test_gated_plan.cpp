// The host-side plan of a gated CPU-pool pass (src/cuda/pool_io.h, docs/gpu.md "Gated passes"): which
// layers are CPU-pool layers, and how the pass splits into the pieces the host releases. No GPU needed:
// these run wherever the CUDA tests are built (CI too).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cuda/pool_io.h"
#include "moe/residency.h"

using namespace strata;

namespace {

// Layer 0 full, 1 partly resident, 2 empty, 3 full, 4 partly: kinds 0 1 2 0 1, pool layers 1 2 4.
TEST(GatedPlan, LayerKindsFollowTheResidency) {
  const int L = 5, X = 4;
  moe::Residency res(L, X, L * X);
  res.place_evenly();  // every expert resident
  std::vector<int> pl;
  EXPECT_EQ(cuda::gated_layer_kinds(res, L, X, &pl), std::vector<uint8_t>(L, 0));
  EXPECT_TRUE(pl.empty());
  moe::Residency part(L, X, 2 * X + 2);
  int32_t slot = 0;
  for (int il : {0, 3})
    for (int e = 0; e < X; ++e) part.admit(moe::ExpertId{il, e}, slot++);
  part.admit(moe::ExpertId{1, 2}, slot++);
  part.admit(moe::ExpertId{4, 0}, slot++);
  part.check_invariants();
  ASSERT_EQ(part.resident_in_layer(2), 0);
  const std::vector<uint8_t> kinds = cuda::gated_layer_kinds(part, L, X, &pl);
  EXPECT_EQ(kinds, (std::vector<uint8_t>{0, 1, 2, 0, 1}));
  EXPECT_EQ(pl, (std::vector<int>{1, 2, 4}));
}

// For any set of CPU-pool layers, the pieces cover every layer exactly once, in order: piece k starts
// after pool layer pl[k-1] (the embedding for k = 0), runs [first, end) on the GPU alone, then pool layer
// pl[k]; the last piece runs the rest and the output. A piece past the last is an error.
TEST(GatedPlan, PiecesCoverEveryLayerOnceInOrder) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int L = 1 + int(rng() % 40);
    std::vector<int> pl;
    for (int il = 0; il < L; ++il)
      if (rng() % 3 == 0) pl.push_back(il);
    std::vector<int> seen;
    for (size_t k = 0; k <= pl.size(); ++k) {
      const cuda::GatedPiece g = cuda::gated_piece_layers(pl, k, L);
      EXPECT_EQ(g.after, k == 0 ? -1 : pl[k - 1]);
      EXPECT_EQ(g.first, g.after + 1);
      EXPECT_EQ(g.pool, k < pl.size() ? pl[k] : -1);
      EXPECT_EQ(g.end, k < pl.size() ? pl[k] : L);
      for (int il = g.first; il < g.end; ++il) seen.push_back(il);
      if (g.pool >= 0) seen.push_back(g.pool);
    }
    std::vector<int> all(static_cast<size_t>(L));
    for (int il = 0; il < L; ++il) all[size_t(il)] = il;
    EXPECT_EQ(seen, all) << "trial " << trial;
    EXPECT_THROW(cuda::gated_piece_layers(pl, pl.size() + 1, L), Error);
  }
}

}  // namespace
