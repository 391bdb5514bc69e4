#include "quant/q6_k_p.h"

#include <cstring>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/dequant.h"

namespace strata {

using q::BlockQ6_K;

static_assert(sizeof(BlockQ6_K) == 210 && kQ6_KPBytes % 16 == 0 && kQ6_KPBytes > 210);

void repack_q6_k_p(const void* src, void* dst, int64_t n) {
  STRATA_REQUIRE(n >= 0 && n % kQ6_KPValues == 0, "q6_kp: {} values is not a multiple of {}", n, kQ6_KPValues);
  const auto* b = static_cast<const BlockQ6_K*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQ6_KPValues; ++i, ++b, out += kQ6_KPBytes) {
    std::memcpy(out, b, sizeof(BlockQ6_K));
    std::memset(out + sizeof(BlockQ6_K), 0, size_t(kQ6_KPBytes) - sizeof(BlockQ6_K));
  }
}

void dequantize_q6_k_p(const void* src, float* dst, int64_t n) {
  STRATA_REQUIRE(n >= 0 && n % kQ6_KPValues == 0, "q6_kp: {} values is not a multiple of {}", n, kQ6_KPValues);
  const auto* in = static_cast<const uint8_t*>(src);
  BlockQ6_K block;  // one block back in Q6_K's layout (and alignment), dequantized by Q6_K's own code
  for (int64_t i = 0; i < n / kQ6_KPValues; ++i, in += kQ6_KPBytes, dst += kQ6_KPValues) {
    std::memcpy(&block, in, sizeof(block));
    dequantize_row(GgmlType::Q6_K, &block, dst, kQ6_KPValues);
  }
}

}  // namespace strata
