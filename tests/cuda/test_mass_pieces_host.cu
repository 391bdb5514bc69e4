// The deep search's split of 64-bit masses into 16-bit pieces (cuda/mass_pieces.cuh), on the host: for groups
// of 1 to 32 masses (a warp's lanes of one bin), the pieces' sums joined back equal the masses' 64-bit sum
// modulo 2^64, for masses of every size the sampler makes (0, 1, 2^60 = probability 1, all bits set) and random
// ones; and no piece's sum over 32 lanes leaves 32 bits.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/mass_pieces.cuh"

namespace mp = strata::cuda::mass_pieces;

TEST(MassPiecesHost, JoinedPieceSumsEqualTheSum) {
  std::mt19937_64 rng(7);
  const unsigned long long edge[] = {0ull, 1ull, 0xffffull, 0x10000ull, 1ull << 60, (1ull << 60) - 1, ~0ull,
                                     0x8000800080008000ull};
  int groups = 0;
  for (int n = 1; n <= 32; ++n)
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<unsigned long long> m(static_cast<size_t>(n));
      for (auto& x : m) {
        const unsigned r = unsigned(rng() % 4);
        x = r == 0 ? edge[rng() % 8] : r == 1 ? rng() >> 4 : r == 2 ? rng() : rng() % (1ull << 44);
      }
      unsigned long long want = 0;
      unsigned sums[mp::kPieces] = {0, 0, 0, 0};
      unsigned long long wide[mp::kPieces] = {0, 0, 0, 0};
      for (auto x : m) {
        want += x;  // (mod 2^64, as the atomics)
        for (int j = 0; j < mp::kPieces; ++j) {
          sums[j] += mp::piece(x, j);
          wide[j] += mp::piece(x, j);
        }
      }
      for (int j = 0; j < mp::kPieces; ++j) ASSERT_EQ(wide[j], sums[j]) << "piece " << j << " overflowed";
      ASSERT_EQ(mp::join(sums), want) << n << " masses, trial " << trial;
      ++groups;
    }
  EXPECT_EQ(groups, 32 * 200);
}
