// Q4_0 / Q8_0 x Q8_32 prefill product: the scalar references (arithmetic in q32_gemm.h).
#include "quant/q32_gemm.h"

#include <cmath>

#include "quant/blocks.h"
#include "quant/vec_dot.h"

namespace strata::q {
namespace {

// Block b of row `row` against token activations x: the integer sum S of q32_gemm.h.
template <typename Block>
int32_t block_sum(const Block& a, const BlockQ8A& x);

template <>
int32_t block_sum(const BlockQ4_0& a, const BlockQ8A& x) {
  int32_t s = 0;
  for (int i = 0; i < 16; ++i) s += (a.qs[i] & 0xF) * x.qs[i] + (a.qs[i] >> 4) * x.qs[i + 16];
  return s - 8 * x.sum;
}

template <>
int32_t block_sum(const BlockQ8_0& a, const BlockQ8A& x) {
  int32_t s = 0;
  for (int i = 0; i < 32; ++i) s += a.qs[i] * x.qs[i];
  return s;
}

template <typename Block>
void gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                float* out, int64_t os) {
  const int64_t nb = cols / QK;
  for (int r = 0; r < 16; ++r) {
    const auto* a = reinterpret_cast<const Block*>(w + r * row_bytes);
    for (int64_t t = 0; t < n_tok; ++t) {
      const auto* x = reinterpret_cast<const BlockQ8A*>(xq + t * xs);
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b)
        acc = std::fma(fp16_to_fp32(a[b].d) * x[b].d, static_cast<float>(block_sum(a[b], x[b])), acc);
      out[t * os + r] = acc;
    }
  }
}

}  // namespace

void q40_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os) {
  gemm16_ref<BlockQ4_0>(cols, w, row_bytes, xq, xs, n_tok, out, os);
}

void q80_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os) {
  gemm16_ref<BlockQ8_0>(cols, w, row_bytes, xq, xs, n_tok, out, os);
}

}  // namespace strata::q
