#pragma once
// The token loop shared by the 16-row prefill kernels (q4k_gemm_avx512.cpp, q32_gemm_avx512.cpp): tiles of
// 8 tokens, then one of 4, 2 and 1 for the rest. tile(std::integral_constant<int, NT>{}, t) runs tokens
// [t, t + NT). Why tiles of 8: 8 accumulators of 16 rows each plus the weight vector fit the 32 zmm
// registers, and every weight vector loaded serves 8 tokens.
#include <cstdint>
#include <type_traits>

namespace strata::q {

template <typename TileFn>
inline void over_token_tiles(int64_t n_tok, TileFn&& tile) {
  int64_t t = 0;
  for (; t + 8 <= n_tok; t += 8) tile(std::integral_constant<int, 8>{}, t);
  if (t + 4 <= n_tok) tile(std::integral_constant<int, 4>{}, t), t += 4;
  if (t + 2 <= n_tok) tile(std::integral_constant<int, 2>{}, t), t += 2;
  if (t < n_tok) tile(std::integral_constant<int, 1>{}, t);
}

}  // namespace strata::q
