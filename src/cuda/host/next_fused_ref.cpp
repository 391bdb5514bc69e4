#include "cuda/host/next_fused_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "cpu/gdn.h"

namespace strata::cuda::nextf_ref {

// A [n][cols] contiguous copy of rows at src + t * ld.
std::vector<float> rows_copy(const float* src, int64_t ld, int64_t n, int64_t cols) {
  std::vector<float> out(size_t(n * cols));
  for (int64_t t = 0; t < n; ++t) std::copy(src + t * ld, src + t * ld + cols, out.begin() + t * cols);
  return out;
}

void gated_norm_quantize(const float* x, const float* z, int64_t z_ld, const float* w, int64_t n_tok,
                         int64_t n_heads, int64_t D, float eps, int8_t* q, q8ref::Q8Ds* ds) {
  STRATA_REQUIRE(n_tok >= 0 && n_heads > 0 && D > 0 && D % 32 == 0 && z_ld >= n_heads * D,
                 "gated_norm_quantize: bad shape (tokens {}, heads {}, D {}, z_ld {})", n_tok, n_heads, D, z_ld);
  const int64_t n_rows = n_tok * n_heads;
  const std::vector<float> zc = rows_copy(z, z_ld, n_tok, n_heads * D);
  std::vector<float> y(size_t(n_rows * D));
  gated_rms_norm_ref(x, zc.data(), w, n_rows, D, eps, y.data());
  q8ref::quantize(y.data(), n_rows, D, q, ds);
}

void mul_sigmoid_quantize(const float* x, const float* gate, int64_t n, int64_t cols, int8_t* q, q8ref::Q8Ds* ds) {
  STRATA_REQUIRE(n >= 0 && cols > 0 && cols % 32 == 0, "mul_sigmoid_quantize: bad shape (n {}, cols {})", n, cols);
  std::vector<float> y(x, x + n * cols);
  mul_sigmoid(y.data(), gate, n * cols);
  q8ref::quantize(y.data(), n, cols, q, ds);
}

void dot_sigmoid(const float* w, const float* x, int64_t n, int64_t cols, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    double s = 0;
    for (int64_t i = 0; i < cols; ++i) s += double(w[i]) * double(x[t * cols + i]);
    y[t] = float(1.0 / (1.0 + std::exp(-s)));
  }
}

void conv_split_gates(const float* x, int64_t x_ld, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, int64_t D,
                      int K, float* state, const float* w, float eps, float* q, float* k, float* v, const float* ba,
                      int64_t ba_ld, const float* a, const float* dt_bias, float* g, float* beta) {
  const int64_t C = (2 * n_k_heads + n_v_heads) * D;
  STRATA_REQUIRE(x_ld >= C && ba_ld >= 2 * n_v_heads, "conv_split_gates: row strides {} / {} too small", x_ld, ba_ld);
  const std::vector<float> xc = rows_copy(x, x_ld, n_tok, C), bac = rows_copy(ba, ba_ld, n_tok, 2 * n_v_heads);
  std::vector<float> conv(size_t(n_tok * C));
  gdn_conv1d_silu_ref(xc.data(), n_tok, C, K, state, w, conv.data());
  gdn_split_qkv(conv.data(), n_tok, n_k_heads, n_v_heads, D, eps, q, k, v);
  gdn_gates_ref(bac.data(), n_tok, n_k_heads, n_v_heads, a, dt_bias, g, beta);
}

}  // namespace strata::cuda::nextf_ref
