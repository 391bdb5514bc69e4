// quantize_row: the one type dispatch of the quantizers (quantize_32.cpp, quantize_k.cpp), the input
// checks, and the float conversions.
#include "quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/quantize_impl.h"
#include "quant/vec_dot.h"

namespace strata {
namespace {
using namespace q;

void to_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}
void to_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &x[i], 4);
    y[i] = static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);  // round to nearest even (x finite)
  }
}

using QuantizeFn = void (*)(const float* x, void* dst, int64_t n);

void copy_f32(const float* x, void* dst, int64_t n) { std::memcpy(dst, x, n * 4); }
void to_f16_row(const float* x, void* dst, int64_t n) { to_f16(x, static_cast<uint16_t*>(dst), n); }
void to_bf16_row(const float* x, void* dst, int64_t n) { to_bf16(x, static_cast<uint16_t*>(dst), n); }
void act_q8_k_row(const float* x, void* dst, int64_t n) { q::quantize_act_q8_k(x, static_cast<BlockQ8_K*>(dst), n); }

// The one place that maps a type to its quantizer (nullptr: none).
QuantizeFn quantize_fn(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return copy_f32;
    case GgmlType::F16: return to_f16_row;
    case GgmlType::BF16: return to_bf16_row;
    case GgmlType::Q4_0: return qimpl::quantize_q4_0;
    case GgmlType::Q4_1: return qimpl::quantize_q4_1;
    case GgmlType::Q5_0: return qimpl::quantize_q5_0;
    case GgmlType::Q5_1: return qimpl::quantize_q5_1;
    case GgmlType::Q8_0: return qimpl::quantize_q8_0;
    case GgmlType::IQ4_NL: return qimpl::quantize_iq4_nl;
    case GgmlType::Q2_K: return qimpl::quantize_q2_k;
    case GgmlType::Q3_K: return qimpl::quantize_q3_k;
    case GgmlType::Q4_K: return qimpl::quantize_q4_k;
    case GgmlType::Q5_K: return qimpl::quantize_q5_k;
    case GgmlType::Q6_K: return qimpl::quantize_q6_k;
    case GgmlType::IQ4_XS: return qimpl::quantize_iq4_xs;
    case GgmlType::Q8_K: return act_q8_k_row;
    default: return nullptr;
  }
}

}  // namespace

bool can_quantize(GgmlType type) { return quantize_fn(type) != nullptr; }

void quantize_row(GgmlType type, const float* x, void* dst, int64_t n) {
  const TypeTraits* tt = find_type_traits(type);
  STRATA_REQUIRE(tt && can_quantize(type), "unsupported type {} for quantization",
                 tt ? std::string(tt->name) : "id " + std::to_string(static_cast<uint32_t>(type)));
  STRATA_REQUIRE(n >= 0 && n % tt->block_size == 0, "quantize {}: {} values is not a multiple of the block size {}",
                 tt->name, n, tt->block_size);
  for (int64_t i = 0; i < n; ++i)
    STRATA_REQUIRE(std::isfinite(x[i]), "quantize {}: value {} at index {} is not finite", tt->name, x[i], i);
  quantize_fn(type)(x, dst, n);
}

}  // namespace strata
