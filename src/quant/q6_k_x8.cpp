#include "quant/q6_k_x8.h"

#include <cstddef>
#include <cstring>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/dequant.h"

namespace strata {

using q::BlockQ6_K;

static_assert(sizeof(BlockQ6_K) == 210 && offsetof(BlockQ6_K, d) == kQ6_KX8Body);
static_assert(8 * sizeof(BlockQ6_K) == kQ6_KX8Bytes && 16 + 8 * kQ6_KX8Body == kQ6_KX8Bytes);

void repack_q6_k_x8(const void* src, void* dst, int64_t n) {
  STRATA_REQUIRE(n >= 0 && n % kQ6_KX8Values == 0, "q6_kx8: {} values is not a multiple of {}", n, kQ6_KX8Values);
  const auto* b = static_cast<const BlockQ6_K*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t g = 0; g < n / kQ6_KX8Values; ++g, b += 8, out += kQ6_KX8Bytes)
    for (int k = 0; k < 8; ++k) {
      std::memcpy(out + 2 * k, &b[k].d, 2);
      std::memcpy(out + 16 + kQ6_KX8Body * k, &b[k], kQ6_KX8Body);  // ql | qh | scales
    }
}

void dequantize_q6_k_x8(const void* src, float* dst, int64_t n) {
  STRATA_REQUIRE(n >= 0 && n % kQ6_KX8Values == 0, "q6_kx8: {} values is not a multiple of {}", n, kQ6_KX8Values);
  const auto* in = static_cast<const uint8_t*>(src);
  BlockQ6_K blocks[8];  // a group back in Q6_K's layout, dequantized by Q6_K's own code
  for (int64_t g = 0; g < n / kQ6_KX8Values; ++g, in += kQ6_KX8Bytes, dst += kQ6_KX8Values) {
    for (int k = 0; k < 8; ++k) {
      std::memcpy(&blocks[k], in + 16 + kQ6_KX8Body * k, kQ6_KX8Body);
      std::memcpy(&blocks[k].d, in + 2 * k, 2);
    }
    dequantize_row(GgmlType::Q6_K, blocks, dst, kQ6_KX8Values);
  }
}

}  // namespace strata
