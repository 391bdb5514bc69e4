#pragma once
// The attention's position span of a forward pass (`max_kv` of cuda::ops::attention): the split count and
// chunk of the F32 kernels come from it alone (ops.cu attn_splits), and a captured graph bakes them in.
// Pure host arithmetic (strata_core, tested on the CPU).
#include <cstdint>

namespace strata::cuda {

constexpr int64_t kAttnSpanMin = 64;  // one K/V tile of the tiled kernel (attn_tile::kTileKv)

// n_kv: the most positions any token of the pass attends to (its position + 1); n_ctx_max: the
// workspace's context. Returns the smallest power of two >= n_kv, at least kAttnSpanMin, at most
// n_ctx_max. Why not n_ctx_max itself: a decode graph built for the whole context split every step over
// ~64 blocks and merged them in a combine kernel, one more dependent launch per layer even when the
// context fits one tile; a power of two keeps the graphs few (one per span: log2(n_ctx_max / 64) + 1).
// Logits then depend on the positions alone, not on the workspace's size. Throws strata::Error unless
// 1 <= n_kv <= n_ctx_max.
int64_t attention_span(int64_t n_kv, int64_t n_ctx_max);

// What the models use: attention_span, or n_ctx_max (the span before session 18) when the environment
// sets STRATA_CUDA_ATTN_SPAN=ctx (read once; benchmarks compare the two in one binary). Same errors.
int64_t pass_attention_span(int64_t n_kv, int64_t n_ctx_max);

}  // namespace strata::cuda
