#pragma once
// Q4_K x Q8_K multi-token product for prefill (fast mode): 16 weight rows x a tile of tokens, with the
// integer work merged across a whole 256-value super-block before one float step.
//
// Arithmetic (the contract the unit tests check; the same in the scalar reference and the AVX-512 kernel):
// for row r, token t, super-block b (Q4_K block: d, dmin, 6-bit scales sc[8] and mins m[8], quants q;
// Q8_K block: d, quants x, bsums):
//   S   = sum_{s<8} sc[s] * sum_{i<32} q[32 s + i] * x[32 s + i]          (int32, exact)
//   M   = sum_{s<8} m[s] * (bsums[2 s] + bsums[2 s + 1])                  (int32, exact)
//   acc = fma(-(dmin * x.d), float(M), fma(d * x.d, float(S), acc))       (float, acc starts at 0, b = 0, 1, ...)
// The decode kernels (vec_dot.h) keep 8 int32 lanes per sub-block group and convert each to float with
// its own FMA, so this rounds differently from them: prefill in fast mode is measured against the
// fixtures' KL bound (tests/test_qwen3moe_fixtures.cpp), not bit-for-bit against decode.
//
// The AVX-512 kernel (VNNI): a zmm holds 4 consecutive quants of each of the 16 rows (one int32 lane per
// row), so one vpdpbusd against a broadcast dword of one token's activations does 64 multiply-adds; the
// 32-value sub-block sums are scaled by vpmulld and summed in int32 over the super-block. The 16 rows are
// transposed ("repacked") on the fly into a per-thread buffer (~5 KB per 256 columns), once per call for
// all tokens: no copy of the model is kept.
//
// On by default where the CPU has AVX-512 VNNI (cpu_level() == Avx512), for Q4_K (and Q5_K, Q6_K, below) jobs with
// >= kQ4kGemmMinTok (9) tokens in MatmulMode::Fast; STRATA_Q4K_GEMM=0 turns it off (read once; tests and
// benchmarks switch it with q4k_gemm_set_enabled).
#include <cstdint>

#include "quant/types.h"

namespace strata::q {

// Fewer tokens: the decode kernels. Not lower: the fused MoE decode path (<= kMoeFusedMaxTokens = 8
// tokens) promises matmul_many's bytes. (At 9 tokens this kernel is already ~1.8x the 4-token kernels.)
inline constexpr int64_t kQ4kGemmMinTok = 9;
inline constexpr int64_t kQ4kGemmRows = 16;   // rows per kernel call

bool q4k_gemm_enabled();          // STRATA_Q4K_GEMM (default on), or the last q4k_gemm_set_enabled
void q4k_gemm_set_enabled(bool on);
bool q4k_gemm_cpu_ok();           // this process runs the AVX-512 level (VNNI)

// 16 rows x n_tok tokens: out[t * os + r] = row r of W . token t (r < 16, t < n_tok).
//   w: row 0 of the 16 (Q4_K, cols values a row, row_bytes apart); xq: n_tok Q8_K rows xs bytes apart.
void q4k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os);
// The same numbers (bit-identical to the reference), AVX-512 VNNI; only call when q4k_gemm_cpu_ok().
void q4k_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os);

// Q5_K: Q4_K's formula with the 5-bit codes u = nibble | (bit s of qh[i]) << 4 (0..31); the same kernel
// after the transpose adds the high bits.
void q5k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os);
void q5k_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os);

// IQ4_XS through the same kernel: codes u = kvalues_iq4nl[index] + 128 (1..241), sc[s] = the 6-bit scale - 32
// (signed), and in the formula above m[s] = sc[s], dmin = 128 * d (so d*S - dmin*M = d * sum sc * sum (u-128) x).
void iq4xs_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                      float* out, int64_t os);
void iq4xs_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                         int64_t n_tok, float* out, int64_t os);

// Q6_K, the same scheme (q4k_gemm_enabled() switches both). Per (row, token, super-block), with the
// unsigned 6-bit quants u = q + 32 (0..63), the 16 int8 scales sc[16] of 16-value sub-blocks and Q8_K bsums:
//   S   = sum_{s<16} sc[s] * sum_{i<16} u[16 s + i] * x[16 s + i]      (int32, exact)
//   M   = sum_{s<16} sc[s] * bsums[s]                                    (int32, exact)
//   acc = fma(d * x.d, float(S - 32 M), acc)
void q6k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os);
void q6k_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os);

// Q3_K through Q6_K's kernel: codes u = q + 4 (0..7), sc[s] = the 6-bit scale - 32, and 4 in place of 32:
//   acc = fma(d * x.d, float(S - 4 M), acc)
void q3k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os);
void q3k_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os);

// Q2_K: Q6_K's 16-value sub-blocks with Q4_K's two float steps. Codes q (0..3), 4-bit scales sc[16] and
// mins m[16]:
//   S   = sum_{s<16} sc[s] * sum_{i<16} q[16 s + i] * x[16 s + i]        (int32, exact)
//   M   = sum_{s<16} m[s] * bsums[s]                                      (int32, exact)
//   acc = fma(-(dmin * x.d), float(M), fma(d * x.d, float(S), acc))
void q2k_gemm16_ref(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs, int64_t n_tok,
                    float* out, int64_t os);
void q2k_gemm16_avx512(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                       int64_t n_tok, float* out, int64_t os);

// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M through Q6_K's kernel: each super-block decoded to the
// integer form of iq_gemm_decode.h (u = signed value + 64, an odd integer scale per 16 values, d' = d / 8,
// d / 4 or d) and, with 64 in place of 32: acc = fma(d' * x.d, float(S - 64 M), acc). The decode is scalar
// (grid lookups), once per 16 rows and call, shared by every token.
void iq_gemm16_ref(GgmlType t, int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                   int64_t n_tok, float* out, int64_t os);
void iq_gemm16_avx512(GgmlType t, int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                      int64_t n_tok, float* out, int64_t os);

using Gemm16Fn = void (*)(int64_t cols, const uint8_t* w, int64_t row_bytes, const uint8_t* xq, int64_t xs,
                          int64_t n_tok, float* out, int64_t os);

// The AVX-512 16-row kernel of type t (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S here; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// IQ4_NL in q32_gemm.h), its
// activations in t's activation type (vec_dot.h act_type_for); nullptr for any other type.
Gemm16Fn gemm16_kernel(GgmlType t);
// The fewest tokens for which matmul takes t's 16-row kernel: kQ4kGemmMinTok, and 16 for IQ2_XXS / IQ2_XS /
// IQ2_S / IQ1_S / IQ1_M, whose scalar decode costs more than the decode kernels save below that (9 tokens:
// 0.75-1.0x the decode kernels; 32: 1.7-2.2x; bench_matvec Prefill arms).
int64_t gemm16_min_tokens(GgmlType t);
// Its scalar reference (the same types; nullptr for any other).
Gemm16Fn gemm16_reference(GgmlType t);

}  // namespace strata::q
