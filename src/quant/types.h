#pragma once
// The one table of ggml tensor types: id (as stored in GGUF), name, block size (values per block) and
// bytes per block. Everything that needs a type's size asks here; dequantization and dot products for
// each type live beside this file (quant/dequant.h, quant/matmul.h).
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3,
  Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
  // strata's own storage types (never in a GGUF file: the reader and the writer know only ggml's ids).
  // Q4_0_X8: 8 Q4_0 blocks as one 256-value group, the 8 f16 scales first, then the 8 blocks' 16 code
  // bytes (each block's codes in Q4_0's own nibble order): 144 bytes, every block's codes 16-byte
  // aligned. The same values and bytes per row as Q4_0; the GPU keeps Q4_0 experts in it (why:
  // docs/gpu.md, "Q4_0 experts").
  Q4_0_X8 = 4096,
  // Q6_K_X8: 8 Q6_K super-blocks as one 2048-value group, the 8 f16 scales d first, then the 8 blocks'
  // 208-byte bodies (ql | qh | scales, unchanged): 1680 bytes, every body 16-byte aligned. The same values
  // and bytes per row as Q6_K; the GPU keeps Q6_K dense products in it (quant/q6_k_x8.h says why).
  Q6_K_X8 = 4097,
  // Q6_K_P: a Q6_K block padded with 14 zero bytes to 224, every block 16-byte aligned; the GPU keeps Q6_K
  // expert down matrices in it (quant/q6_k_p.h says why).
  Q6_K_P = 4098,
};

struct TypeTraits {
  GgmlType type;
  std::string_view name;   // ggml's name, lower case ("q4_K", "iq2_xxs", "f32")
  uint32_t block_size;     // values per block
  uint32_t type_size;      // bytes per block
  bool quantized;
};

// The type a GGUF file names by id: nullptr when `id` is not a ggml type id we know (ids 4, 5, 31-33, 36-38
// were removed from ggml). Only ggml's ids: a file that names one of strata's own storage types (Q4_0_X8) is
// refused. A GgmlType in hand is looked up with find_type_traits (session 32: the GPU's checks cast types
// to ids and refused Q4_0_X8; without an id overload of type_traits that no longer compiles).
const TypeTraits* file_type_traits(uint32_t id);
// Any type, ggml's or strata's own storage types; nullptr when unknown.
const TypeTraits* find_type_traits(GgmlType t);
const TypeTraits& type_traits(GgmlType t);  // t must be known (it is, if it came through the reader)
std::optional<GgmlType> type_from_name(std::string_view name);  // case-insensitive: "Q4_K", "q4_k"
inline std::string_view type_name(GgmlType t) { return type_traits(t).name; }

// Bytes of a row of `n` values; n must be a multiple of the block size (callers validate first).
inline uint64_t row_bytes(GgmlType t, uint64_t n) {
  const auto& tt = type_traits(t);
  return n / tt.block_size * tt.type_size;
}

}  // namespace strata
