#include "quant/q4_0_x8.h"

#include <cstring>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/dequant.h"

namespace strata {

using q::BlockQ4_0;

static_assert(8 * sizeof(BlockQ4_0) == kQ4_0X8Bytes);

void repack_q4_0_x8(const void* src, void* dst, int64_t n) {
  STRATA_REQUIRE(n >= 0 && n % kQ4_0X8Values == 0, "q4_0x8: {} values is not a multiple of {}", n, kQ4_0X8Values);
  const auto* b = static_cast<const BlockQ4_0*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t g = 0; g < n / kQ4_0X8Values; ++g, b += 8, out += kQ4_0X8Bytes)
    for (int k = 0; k < 8; ++k) {
      std::memcpy(out + 2 * k, &b[k].d, 2);
      std::memcpy(out + 16 + 16 * k, b[k].qs, 16);
    }
}

void dequantize_q4_0_x8(const void* src, float* dst, int64_t n) {
  STRATA_REQUIRE(n >= 0 && n % kQ4_0X8Values == 0, "q4_0x8: {} values is not a multiple of {}", n, kQ4_0X8Values);
  const auto* in = static_cast<const uint8_t*>(src);
  BlockQ4_0 blocks[8];  // a group back in Q4_0's layout, dequantized by Q4_0's own code
  for (int64_t g = 0; g < n / kQ4_0X8Values; ++g, in += kQ4_0X8Bytes, dst += kQ4_0X8Values) {
    for (int k = 0; k < 8; ++k) {
      std::memcpy(&blocks[k].d, in + 2 * k, 2);
      std::memcpy(blocks[k].qs, in + 16 + 16 * k, 16);
    }
    dequantize_row(GgmlType::Q4_0, blocks, dst, kQ4_0X8Values);
  }
}

}  // namespace strata
