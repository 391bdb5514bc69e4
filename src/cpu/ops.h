#pragma once
// The CPU ops the forward passes are written in. Each is the plain f32 reference (summation in the
// obvious order, wide accumulators where ggml uses them) and, where it pays, split over the thread pool
// along an independent axis (rows, heads). tests/test_ops.cpp checks each against a naive version.
#include <cstdint>

#include "cpu/thread_pool.h"
#include "quant/types.h"

namespace strata::cpu {

constexpr int kMaxRot = 1024;      // rope_neox: largest rotated dimension
constexpr int kMaxExperts = 1024;  // moe_route: largest expert count

// Storage type of a KV cache row.
enum class KvType { F32, F16 };
const char* kv_type_name(KvType t);
size_t kv_type_size(KvType t);  // bytes per value

// y[r][:] = x[r][:] / sqrt(mean(x[r]^2) + eps) * w[:].  x, y: [n_rows][n]; w: [n]. y may alias x.
void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y);

// In-place softmax of x[0..n).
void softmax(float* x, int64_t n);

// NeoX-style rotary embedding, in place. x: [n_tok][n_head][head_dim]; pos: [n_tok].
// The first n_rot dims of each head rotate as pairs (i, i + n_rot/2) by pos * base^(-2i/n_rot).
void rope_neox(float* x, const int32_t* pos, int64_t n_tok, int n_head, int head_dim, int n_rot,
               float base);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may alias gate or up.
void swiglu(const float* gate, const float* up, int64_t n, float* out);

// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t n);

// dst[t][:] = row ids[t] of an [n_rows][n] matrix stored in `type` (embedding lookup). ids are
// checked against n_rows by the caller.
void get_rows(GgmlType type, const void* data, int64_t n, const int32_t* ids, int64_t n_ids,
              float* dst);

// Store one token's K or V heads into a cache row of `type`. src: [n] f32.
void kv_store(KvType type, const float* src, int64_t n, void* dst_row);

// One token's view of its sequence's cache for one attention layer.
struct AttnKv {
  const void* k;  // [n_ctx][n_head_kv][head_dim]    in KvType
  const void* v;  // [n_ctx][n_head_kv][head_dim_v]  in KvType
  int32_t n_kv;   // attend to cache positions [0, n_kv) (causal: the token's pos + 1)
};

// The arithmetic of attention.
//   F32:      scores, softmax and the V sum in f32 (the plain reference).
//   GgmlF16:  llama.cpp's CPU flash attention, which the fixtures' references were made with: it casts
//             an f32 KV cache to f16, rounds Q to f16, and accumulates V with an online softmax in an
//             f16 accumulator (rounded after every position). Matching it is what makes exact mode
//             agree with the references to KL ~1e-8 instead of ~1e-5.
enum class AttnMath { F32, GgmlF16 };
constexpr int kMaxHeadDim = 1024;

// Causal softmax attention with grouped KV heads (query head h reads KV head h / (n_head/n_head_kv)).
//   q:   [n_tok][n_head][head_dim]     kv: [n_tok] (one view per token, sequences may differ)
//   out: [n_tok][n_head][head_dim_v]   scratch: [pool.size()][max_kv] f32
// out = softmax(scale * q . K^T) V over the token's n_kv positions. Split over (token, head).
void attention(const float* q, const AttnKv* kv, int64_t n_tok, int n_head, int n_head_kv,
               int head_dim, int head_dim_v, KvType type, float scale, float* out, float* scratch,
               int64_t max_kv, ThreadPool& pool, AttnMath math = AttnMath::F32);

// MoE router: probs = softmax(logits[t]) over all n_expert; the k largest are chosen (ties: the
// lower expert id first); with `norm` their weights are divided by their sum (llama.cpp clamps the sum
// at 6.103515625e-5). logits: [n_tok][n_expert]; ids, weights: [n_tok][k].
void moe_route(const float* logits, int64_t n_tok, int n_expert, int k, bool norm, int32_t* ids,
               float* weights);

// Tokens a row must never pick (a request's ignore_eos): logits[t][ban[j]] = -inf for every j < n_ban in
// each row t whose rows[t] is nonzero (every row when rows is null). Ids outside [0, n_vocab) are skipped.
// logits: [n_tok][n_vocab]; ban: [n_ban]; rows: [n_tok] or null.
void ban_tokens(float* logits, int64_t n_tok, int64_t n_vocab, const int32_t* ban, int32_t n_ban,
                const uint8_t* rows);

}  // namespace strata::cpu
