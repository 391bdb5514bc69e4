#pragma once
// The device sampler's deep search adds 64-bit fixed-point masses (ops_sample.cu warp_mass_add) a warp at a
// time with 32-bit warp reductions: each mass goes in as four 16-bit pieces, each piece is summed over the
// warp's lanes of one bin (at most 32 x 0xffff: 21 bits, no overflow), and the four sums are joined back.
// The join equals the 64-bit sum of the masses modulo 2^64, what one atomic a mass would have left in the bin:
// the same integers, so the same picks. __host__ __device__ so a host test checks the arithmetic
// (tests/cuda/test_mass_pieces_host.cu).
#include <cstdint>

namespace strata::cuda::mass_pieces {

constexpr int kPieces = 4;

// Piece j (0: the low 16 bits) of m.
__host__ __device__ __forceinline__ unsigned piece(unsigned long long m, int j) {
  return static_cast<unsigned>(m >> (16 * j)) & 0xffffu;
}

// sum_j sums[j] << 16 j, modulo 2^64 (sums[j]: the sum of piece j over the masses).
__host__ __device__ __forceinline__ unsigned long long join(const unsigned (&sums)[kPieces]) {
  unsigned long long total = 0;
  for (int j = 0; j < kPieces; ++j) total += static_cast<unsigned long long>(sums[j]) << (16 * j);
  return total;
}

}  // namespace strata::cuda::mass_pieces
