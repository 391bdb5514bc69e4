#pragma once
// Gated DeltaNet (GDN) ops for the qwen3next architecture, CPU. Semantics match llama.cpp's
// `qwen3next` graph (ggml_ssm_conv + silu, ggml_l2_norm, its gated delta net, gated RMSNorm).
//
// Each op `foo` has a plain reference `foo_ref` with the same signature (tests compare them at real
// sizes). All tensors are dense row-major f32; the shape comment lists dims slowest-first.
//
// Head grouping: value head h reads key head h / (n_v_heads / n_k_heads) (HF `repeat_interleave`,
// llama.cpp's repeat of q/k before the delta net).
#include <cstdint>

#include "cpu/thread_pool.h"

namespace strata {

// ---- causal depthwise conv1d + SiLU with a rolling per-sequence state ----------------------------
//   x:     [n_tok][C]    new inputs (qwen3next: the q|k|v channels of attn_qkv)
//   state: [K-1][C]      the K-1 inputs before x, oldest first (zeros at sequence start);
//                        on return: the last K-1 inputs of (state ++ x)
//   w:     [C][K]        kernel, GGUF `ssm_conv1d` (ne = {K, C}); w[c][K-1] weighs the newest token
//   y:     [n_tok][C]    y[t][c] = silu(sum_k w[c][k] * xx[t + k][c]),  xx = state ++ x  (K-1+n_tok rows)
// y must not alias x.
void gdn_conv1d_silu(const float* x, int64_t n_tok, int64_t C, int K, float* state, const float* w,
                     float* y);
void gdn_conv1d_silu_ref(const float* x, int64_t n_tok, int64_t C, int K, float* state,
                         const float* w, float* y);

// ---- gates of the delta rule from the ssm_ba projection ------------------------------------------------
//   ba:      [n_tok][2 * Hv]   ssm_ba output, grouped by key head: for key head j (r = Hv / Hk) the r
//                              beta logits of value heads j*r .. j*r+r-1, then their r alpha logits
//   a:       [Hv]              GGUF `ssm_a` (= -exp(A_log))
//   dt_bias: [Hv]              GGUF `ssm_dt.bias`
//   g:       [n_tok][Hv]       g = a * softplus(alpha + dt_bias)   (log-decay, <= 0 for a <= 0)
//   beta:    [n_tok][Hv]       beta = sigmoid(b)
void gdn_gates(const float* ba, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads, const float* a,
               const float* dt_bias, float* g, float* beta);
void gdn_gates_ref(const float* ba, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads,
                   const float* a, const float* dt_bias, float* g, float* beta);

// ---- split the conv output into q, k, v and L2-normalise q and k ---------------------------------------
//   conv: [n_tok][2*Hk*D + Hv*D]  (q | k | v per token, as attn_qkv lays them out)
//   q, k: [n_tok][Hk][D]  (L2-normalised, eps as ggml_l2_norm)     v: [n_tok][Hv][D]
void gdn_split_qkv(const float* conv, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads,
                   int64_t D, float eps, float* q, float* k, float* v);

// ---- legacy fused input projection (`ssm_in`, older qwen3next GGUFs) ----------------------------------
//   mixed: [n_tok][Hk][2*D + 2*r*D]   per key head j: q_j (D), k_j (D), v of heads j*r.. (r*D), z (r*D)
//   qkv:   [n_tok][2*Hk*D + Hv*D]     the attn_qkv layout (q | k | v)        z: [n_tok][Hv*D]
void gdn_unpack_qkvz(const float* mixed, int64_t n_tok, int64_t n_k_heads, int64_t n_v_heads,
                     int64_t D, float* qkv, float* z);

// ---- L2 normalisation of rows (ggml_l2_norm): x <- x / max(||x||, eps) ---------------------------
//   x: [n_rows][D], in place
void l2_norm_rows(float* x, int64_t n_rows, int64_t D, float eps);
void l2_norm_rows_ref(float* x, int64_t n_rows, int64_t D, float eps);

// ---- gated delta rule ------------------------------------------------------------------------------
// Per value head h with key head kh = h / (Hv / Hk), per token t (S = state, [D value][D key]):
//   S <- exp(g[t][h]) * S
//   u  = beta[t][h] * (v[t][h] - S k[t][kh])
//   S <- S + u k[t][kh]^T
//   o[t][h] = S (q_scale * q[t][kh])
// q, k are expected L2-normalised (l2_norm_rows); q_scale is 1/sqrt(D) in qwen3next.
struct DeltaRuleShape {
  int64_t n_tok;  // tokens of this call (one sequence)
  int64_t n_k_heads;  // Hk
  int64_t n_v_heads;  // Hv, a multiple of Hk
  int64_t head_dim;   // D: key and value head size (qwen3next: ssm.state_size)
};
//   q, k:  [n_tok][Hk][D]
//   v:     [n_tok][Hv][D]
//   g:     [n_tok][Hv]        log-decay (qwen3next: ssm_a * softplus(alpha + ssm_dt.bias), <= 0)
//   beta:  [n_tok][Hv]        write strength (sigmoid(b))
//   state: [Hv][D][D]         per-sequence recurrent state, [value][key]; updated in place
//   out:   [n_tok][Hv][D]
// Recurrent form: one token after the other (decode; also the reference for the chunked form).
void gdn_delta_rule_recurrent(const DeltaRuleShape& s, const float* q, const float* k,
                              const float* v, const float* g, const float* beta, float q_scale,
                              float* state, float* out, ThreadPool& pool);
void gdn_delta_rule_recurrent_ref(const DeltaRuleShape& s, const float* q, const float* k,
                                  const float* v, const float* g, const float* beta,
                                  float q_scale, float* state, float* out, ThreadPool& pool);
// Chunked (parallel) form for prefill: tokens in chunks of `chunk` (64 as llama.cpp); within a chunk the
// state reads/writes are matrix products and only a unit lower-triangular solve is sequential.
// Same result as the recurrent form up to f32 summation order.
void gdn_delta_rule_chunked(const DeltaRuleShape& s, const float* q, const float* k,
                            const float* v, const float* g, const float* beta, float q_scale,
                            float* state, float* out, ThreadPool& pool, int chunk = 64);

// ---- gated RMSNorm (Qwen3-Next `norm(core_attn_out, z)`) -------------------------------------------
//   x, z, y: [n_rows][D]  (n_rows = n_tok * Hv),  w: [D] (GGUF `ssm_norm`, shared by the heads)
//   y = x / sqrt(mean(x^2) + eps) * w * silu(z)        y may alias x
void gated_rms_norm(const float* x, const float* z, const float* w, int64_t n_rows, int64_t D,
                    float eps, float* y);
void gated_rms_norm_ref(const float* x, const float* z, const float* w, int64_t n_rows, int64_t D,
                        float eps, float* y);

// Partial NeoX RoPE (rope.dimension_count < head size) is cpu::rope_neox (cpu/ops.h) with n_rot.

// ---- gated attention (qwen3next full-attention layers) -----------------------------------------------
//   qg:   [n_tok][H][2*D]  attn_q output: per head the query (D) then its output gate (D)
//   q:    [n_tok][H][D]    gate: [n_tok][H][D]
void split_q_gate(const float* qg, int64_t n_tok, int64_t n_head, int64_t D, float* q, float* gate);
// x[i] *= sigmoid(gate[i]), i < n
void mul_sigmoid(float* x, const float* gate, int64_t n);

// ---- shared expert gating -------------------------------------------------------------------------------
//   y, x: [n_tok][n]   logit: [n_tok]    y[t] += sigmoid(logit[t]) * x[t]
void add_sigmoid_scaled(float* y, const float* x, const float* logit, int64_t n_tok, int64_t n);

}  // namespace strata
