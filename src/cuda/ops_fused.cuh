#pragma once
// Fused small ops of the attention input (issue 7), declarations only. Implementation: ops_fused.cu;
// CPU references with the same signatures: ops_fused_ref.h; tests: tests/cuda/test_ops_fused.cu.
//
// Why: per decoded token and layer the attention input took six launches (q_norm, k_norm, two ropes,
// kv_store, plus the angle loop inside each rope), each a few microseconds of fixed cost for a few KB of
// data. attn_prep does them in one launch with the values of that sequence bit for bit; the rope angles,
// the same for every layer, are built once per forward by rope_cos_sin.
// All pointers are device memory; every call is enqueued on `stream`.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/expert_predict.h"
#include "cuda/ops.cuh"

namespace strata::cuda::ops {

// The NeoX rope angles of each token, as ops::rope_neox builds them (theta_0 = pos, theta_{i+1} =
// theta_i * base^(-2/n_rot) in f32, cos/sin correctly rounded from double).
//   pos: [n_tok] int32   cs: [n_tok][n_rot/2][2] f32 = (cos theta_i, sin theta_i)
void rope_cos_sin(const int32_t* pos, int64_t n_tok, int n_rot, float base, float* cs, cudaStream_t stream);

// The shape of attn_prep's heads.
struct AttnPrepShape {
  int n_head, n_head_kv;     // query heads, KV heads
  int head_dim, head_dim_v;  // K/Q and V head sizes (<= kAttnPrepMaxDim)
  int n_rot;                 // rotated dims per head (even, <= head_dim)
  float eps;                 // rmsnorm epsilon of q_norm / k_norm
};
constexpr int kAttnPrepMaxDim = 1024;

// The attention input of n_tok tokens in one launch, equal bit for bit to the sequence
//   rmsnorm(q, q_norm, n_tok*n_head, head_dim); rmsnorm(k, k_norm, n_tok*n_head_kv, head_dim);
//   rope_neox(q); rope_neox(k); kv_store(k, v, refs, ..., layer)       (cuda/ops.cuh)
// with the rope angles taken from `cs` (rope_cos_sin of the tokens' positions):
//   q: row t at q + t*q_ld: [n_head][head_dim] f32       (ld in floats)
//   k: row t at k + t*k_ld: [n_head_kv][head_dim] f32
//   v: row t at v + t*v_ld: [n_head_kv][head_dim_v] f32
//     (one concatenated qkv matmul output: q = qkv, k = qkv + n_head*head_dim, v = k + n_head_kv*head_dim,
//      every ld = the row width; or three separate buffers with their own widths)
//   q_norm, k_norm: [head_dim] f32    cs: [n_tok][n_rot/2][2]    refs: [n_tok] (KV rows at refs[t].pos)
//   q_out: [n_tok][n_head][head_dim] f32, the normed and rotated q; may be q itself when q_ld = n_head*head_dim.
// K goes to the cache normed and rotated, V as it is, both rounded to f16. Throws strata::Error for bad shapes.
void attn_prep(const float* q, int64_t q_ld, const float* k, int64_t k_ld, const float* v, int64_t v_ld,
               const float* q_norm, const float* k_norm, const float* cs, const KvRef* refs, int64_t n_tok,
               int layer, const AttnPrepShape& shape, float* q_out, cudaStream_t stream);

// ops::attention, and its output also as Q8 activations (q8_kernels.cuh layout) of [n_tok][n_head *
// head_dim_v]: xq, xds equal bit for bit to q8::quantize(out, n_tok, n_head * head_dim_v, xq, xds).
// fused (default attention_q8_fused()): F32 maths with head_dim_v % 32 == 0: when the call ends in the
// split combine (decode over more than one K/V tile of max_kv), the combine kernel quantizes the rows it
// writes; over one split, the tiled kernel's decode shape (fewer than 8 tokens) quantizes its own rows (one
// launch less per layer either way); otherwise, and with !fused, q8::quantize runs after.
// n_head * head_dim_v % 32 == 0 (else strata::Error). attention_q8_fused(): on unless the environment sets STRATA_CUDA_ATTN_Q8=0 (read once).
bool attention_q8_fused();
void attention_q8(const float* q, const KvRef* refs, int64_t n_tok, int layer, int n_head, int n_head_kv,
                  int head_dim, int head_dim_v, float scale, cpu::AttnMath math, int64_t max_kv, float* scratch,
                  float* out, int8_t* xq, float2* xds, cudaStream_t stream, bool fused = attention_q8_fused());

// Where attn_prep reads one token's q|k|v product from (as attn_prep's q, k, v, their row strides, the norm
// weights and the angles).
struct AttnPrepIn {
  const float* q;  // row t at q + t*q_ld: [n_head][head_dim] f32
  int64_t q_ld;
  const float* k;  // row t at k + t*k_ld: [n_head_kv][head_dim] f32
  int64_t k_ld;
  const float* v;  // row t at v + t*v_ld: [n_head_kv][head_dim_v] f32
  int64_t v_ld;
  const float* q_norm;  // [head_dim]
  const float* k_norm;  // [head_dim]
  const float* cs;      // [n_tok][n_rot/2][2] (rope_cos_sin)
};

// attn_prep then attention_q8 (F32 maths, fused) of ONE token, with the prep inside the attention kernel:
// each attention block norms and rotates its own query heads, and the block whose positions hold the
// token's own stores its K/V (to the cache, and to its shared-memory tile). The same values bit for bit
// as the two calls (out, xq, xds, the cache rows), except that the prepared q is not written anywhere.
// Why: attn_prep was a step of its own on every layer's decode chain (2.55 us of a 41.4 us layer in
// session 16's trace), for ~40 KB of data that the attention kernel reads right after it.
//   in: as attn_prep's (token 0)   shape: attn_prep's   refs: [1]   scale, max_kv, scratch, out, xq, xds:
//   as attention_q8's.
// Needs prep_attention_supported(n_tok = 1, shape) (else strata::Error). PDL: as the tiled kernel (refs
// are read before the wait). prep_attention_enabled(): on unless the environment sets
// STRATA_CUDA_PREP_ATTENTION=0 (read once; the forward then keeps attn_prep and attention_q8).
// pf (optional, cuda/expert_predict.h): the same launch also predicts the layer's experts and prefetches
// them into L2 (its blocks are added to the grid; the attention's values are the same). Ignored with the
// 4-warp decode blocks (STRATA_CUDA_ATTN_DECODE_WARPS=4).
bool prep_attention_supported(int64_t n_tok, const AttnPrepShape& shape);
bool prep_attention_enabled();
// Whether prep_attention_q8's blocks load the q_norm / k_norm weights before their PDL wait (and ask L2 for
// the angles): on unless STRATA_CUDA_PREP_EARLY=0 (read once; set_prep_early_weights overrides). Same values.
void set_prep_early_weights(bool on);
bool prep_early_weights();
void prep_attention_q8(const AttnPrepIn& in, const AttnPrepShape& shape, const KvRef* refs, int layer, float scale,
                       int64_t max_kv, float* scratch, float* out, int8_t* xq, float2* xds, cudaStream_t stream,
                       const predict::ExpertPrefetch* pf = nullptr);

// attn_prep's kernels (same results; tests run both): every global load issued at the start (the
// default), or the first kernel (angles, KvRef and value head loaded after the norm). Process-wide; the
// first call reads the environment (STRATA_CUDA_ATTN_PREP=first) unless set_attn_prep_first ran before.
void set_attn_prep_first(bool on);
bool attn_prep_first();

// The MoE router of a decode batch in one launch: logits = W . x with quant::matmul's F32 arithmetic
// (same bits), then moe_route on them (same ids and weights), done by the last block to finish, which it
// learns from `counter`. Why: the router product and the top-k were two launches of a few microseconds
// each per layer, both dominated by fixed cost.
//   w: [n_expert][cols] f32   x: [n_tok][cols] f32   logits: [n_tok][n_expert] f32 (written too)
//   ids: [n_tok][k] int32   weights: [n_tok][k] f32   (as moe_route: ties to the lower id; norm divides by
//   the sum clamped at 6.103515625e-5)
//   counter: one device uint32, zero before the first call; every call leaves it zero. Calls sharing one
//   counter must be ordered (one stream).
// PDL (cuda/pdl.cuh): the default kernel loads the first 8 KB of its row of w before it waits for the
// previous kernel of the stream, so w must not be written by a kernel earlier in the same stream (model
// weights: uploads are ordered by events, which PDL does not relax).
// n_tok <= kRouterRouteMaxTokens (the last block routes the tokens one after the other: prefill batches
// keep quant::matmul + moe_route). Implemented in ops.cu beside moe_route, whose per-token code it shares.
constexpr int64_t kRouterRouteMaxTokens = 8;
// Where the models use them: the fused router launches (norm_router_route, router_route: one block per expert row, the top-k in the
// last block) for batches of up to this many tokens; larger ones take the product + moe_route. H200,
// bench_attn_prep (bench/results/2026-11-29-gpu-session4-h200.md, call 3), graph us per layer: 1 token
// 6.5 (fused) vs 8.5 (product + moe_route); 8 tokens 28.0-38.9 vs 20.4. The fused time grows ~3 us a
// token, so they cross near 3: 2 keeps the fused path where it was measured (or interpolated) faster.
constexpr int64_t kFusedRouterMaxTokens = 2;
// The models' threshold: fused_router_max_tokens() tokens at most take the fused launches; the environment's
// STRATA_CUDA_FUSED_ROUTER_TOKENS (1..kRouterRouteMaxTokens, read once) or set_fused_router_max_tokens, else
// kFusedRouterMaxTokens. (8 with the last block's warps routing a token each, the growth per token the
// crossing above came from, measured 2% slower at 8 sequences: session 41.)
void set_fused_router_max_tokens(int n);
int64_t fused_router_max_tokens();

// The ffn norm and the router of a decode batch in one launch: the same values as
//   q8::rmsnorm_quantize(x, norm_w, n_tok, cols, eps, xn, xq, xds)   (ops::rmsnorm(...) when xq is null)
//   router_route(w, n_expert, cols, xn, n_tok, k, norm, logits, ids, weights, counter)
// bit for bit. Why: the norm was a one-block launch whose only consumers are the router (same layer) and
// the experts (after the router); each router block recomputes the norm of x (8 KB from L2) instead.
//   x: [n_tok][cols] f32 (not aliasing xn)  norm_w: [cols]  w: [n_expert][cols] f32  xn: [n_tok][cols] (may
//   be null)  xq, xds: Q8 activations of xn (both null: not written)  the rest as router_route.
// Needs norm_router_route_supported(cols) (cols % 32 == 0, cols <= 2048) and n_tok <= kRouterRouteMaxTokens
// (else strata::Error). norm_router_route_enabled(): on unless the environment sets
// STRATA_CUDA_NORM_ROUTER=0 (read once; the forward then keeps the two launches). PDL: the router row is
// read before the wait, as in router_route.
bool norm_router_route_supported(int64_t cols);
bool norm_router_route_enabled();
void norm_router_route(const float* x, const float* norm_w, float eps, const float* w, int n_expert, int64_t cols,
                       int64_t n_tok, int k, bool norm, float* xn, int8_t* xq, float2* xds, float* logits,
                       int32_t* ids, float* weights, uint32_t* counter, cudaStream_t stream);
void router_route(const float* w, int n_expert, int64_t cols, const float* x, int64_t n_tok, int k, bool norm,
                  float* logits, int32_t* ids, float* weights, uint32_t* counter, cudaStream_t stream);

// The two kernels of router_route; both give the same bits (tests compare them). kWarpPerRow: the first
// kernel, one warp per router row (n_expert / 4 blocks). kBlockPerRow: one block per row, the row staged
// in shared memory by all its threads in one memory round trip (n_expert blocks: every SM busy).
// The call without `kern` takes router_route_default(): kBlockPerRow unless the environment sets
// STRATA_CUDA_ROUTER=warp (read once; for comparisons on the device).
enum class RouterRouteKernel { kWarpPerRow, kBlockPerRow };
RouterRouteKernel router_route_default();
void router_route(const float* w, int n_expert, int64_t cols, const float* x, int64_t n_tok, int k, bool norm,
                  float* logits, int32_t* ids, float* weights, uint32_t* counter, cudaStream_t stream,
                  RouterRouteKernel kern);

}  // namespace strata::cuda::ops
