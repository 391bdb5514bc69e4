#pragma once
// Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL x Q8_32 multi-token product for prefill (fast mode): 16 weight
// rows x a tile of tokens, the 32-value formats' counterpart of q4k_gemm.h (same switch: STRATA_Q4K_GEMM /
// q4k_gemm_set_enabled, same minimum of kQ4kGemmMinTok tokens, AVX-512 VNNI).
//
// Arithmetic (the contract the unit tests check; the same in the scalar references and the AVX-512 kernels):
// for row r, token t, 32-value block b (weights: f16 d, codes u as unsigned bytes, and an f16 min m for
// Q4_1 / Q5_1; Q8_32 activations: f32 d, codes x, and their integer sum X):
//   S   = sum_{i<32} u[i] * x[i] - off * X      (int32, exact)
//   acc = fma(d * x.d, float(S), acc)           (float, acc starts at 0, b = 0, 1, ...)
//   acc = fma(m * x.d, float(X), acc)           (Q4_1 / Q5_1 only)
// with u and off per format: Q4_0 the nibble, 8; Q5_0 nibble | fifth bit << 4, 16; Q4_1 / Q5_1 the same
// codes, 0; Q8_0 q + 128, 128; IQ4_NL kvalues_iq4nl[nibble] + 128, 128.
// The decode kernels (vec_dot.h) keep 8 int32 lanes a block and accumulate floats in 4 chains, so this
// rounds differently from them (as the Q4_K/Q6_K prefill kernels do): prefill in fast mode is measured
// against the fixtures' KL bound, not bit for bit against decode.
//
// The AVX-512 kernels: a zmm holds 4 consecutive codes of each of the 16 rows (one int32 lane per row), so
// one vpdpbusd against a broadcast dword of a token's activations does 64 multiply-adds. The 16 rows' blocks
// are transposed on the fly (gathers; Q5's fifth bits spread from qh, IQ4_NL's codes looked up with one
// byte shuffle) into a per-thread buffer (640 bytes a block), once per call for all tokens. Why: the
// decode kernels decode every weight block once per token (at most 4 tokens a call); here once per 16 rows
// x all tokens, and the row dimension sits in the vector lanes (no horizontal sums).
#include <cstdint>
#include <optional>

#include "quant/types.h"

namespace strata::q {

enum class Q32 { Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL };

// Where a format's fields sit in its block (byte offsets, -1: none), the block's size and its code offset
// (q32_gemm.h's off; Q4_1 / Q5_1: 0, they have a min at m).
struct Q32Layout {
  int bytes, m, qh, qs, off;
};
constexpr Q32Layout q32_layout(Q32 f) {
  switch (f) {
    case Q32::Q4_0: return {18, -1, -1, 2, 8};
    case Q32::Q4_1: return {20, 2, -1, 4, 0};
    case Q32::Q5_0: return {22, -1, 2, 6, 16};
    case Q32::Q5_1: return {24, 2, 4, 8, 0};
    case Q32::Q8_0: return {34, -1, -1, 2, 128};
    case Q32::IQ4_NL: return {18, -1, -1, 2, 128};
  }
  return {0, 0, 0, 0, 0};
}

// The 32-value format of t (nullopt for any other type).
std::optional<Q32> q32_format(GgmlType t);

// 16 rows x n_tok tokens: out[t * os + r] = row r of W . token t (r < 16, t < n_tok).
//   w: row 0 of the 16 (cols values a row, row_bytes apart); xq: n_tok Q8_32 rows (BlockQ8A) xs bytes apart.
void q32_gemm16_ref(Q32 f, int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                    int64_t n_tok, float* out, int64_t os);
// The same numbers (bit-identical to the reference), AVX-512 VNNI; only call when q4k_gemm_cpu_ok().
void q32_gemm16_avx512(Q32 f, int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os);

}  // namespace strata::q
