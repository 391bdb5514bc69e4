#pragma once
// The tiled F32 attention kernel behind cuda::ops::attention (math F32), declarations only. Internal to
// src/cuda: ops.cu picks it (or its older per-warp kernel for head sizes this one does not take), sizes
// the position splits and merges them with its combine kernel.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/expert_predict.h"
#include "cuda/ops.cuh"
#include "cuda/ops_fused.cuh"

namespace strata::cuda::attn_tile {

constexpr int kTileKv = 64;       // K/V positions per shared-memory tile; splits are multiples of it
constexpr int kPrefillRows = 64;  // query rows per block of the prefill shape (tokens x heads of a group)
constexpr int kDecodeRows = 8;    // query rows per block of the decode shape (one token's group heads)
constexpr int kPrefillMinTok = 8; // from this many tokens in a call the prefill shape is used

// Head sizes the tiled kernel takes: K and V of the same size, 64, 128 or 256.
bool supported(int head_dim, int head_dim_v);

// The prefill shape on the tensor cores (wmma f16 with f32 accumulate, Q and P split into two f16 halves
// to keep ~22 bits): on by default since the first H200 run (2.5-3x faster than the CUDA-core prefill kernel,
// every attention test passes with both; bench_attention prints both). Head sizes 64 and 128; 256 stays on the CUDA cores.
// Process-wide switch.
void set_prefill_mma(bool on);
bool prefill_mma();

// The one-token decode shape's query heads a block, 1 to kDecodeRows (STRATA_CUDA_ATTN_DECODE_HEADS, read
// once; default kDefaultDecodeHeads). Fewer heads put a KV head's group in more blocks (each copies the
// group's K/V tiles and, with prep, prepares the token's K/V row; the block of the group's first heads
// stores it): the same values, fewer busy warps an SM (the block keeps its warps, 8, or 4 with
// STRATA_CUDA_ATTN_DECODE_WARPS=4; those without a head skip the tiles). Why 4: a one-token block is a
// chain of prep, scores, softmax and P.V per warp, and at 8 busy warps two share each of the SM's four
// schedulers. H200, 48-layer 30B-A3B geometry fully resident (bench/results/2026-12-04-gpu-session25-h200.md,
// alternating in one call): 608.8 tok/s median at 4 (8 blocks of one KV head's 4 heads), 608.3 at 2, 602.4
// at 8. set_decode_heads (tests, benchmarks) wins; strata::Error outside 1..kDecodeRows. Process-wide.
constexpr int kDefaultDecodeHeads = 4;
void set_decode_heads(int heads);
int decode_heads();

// Query rows one block handles for a call of n_tok tokens (what the split count is computed from).
inline int rows_per_block(int64_t n_tok) { return n_tok >= kPrefillMinTok ? kPrefillRows : kDecodeRows; }

// Causal attention, F32 maths, for every token of the call (see ops::attention for q/refs/out).
// Positions [split*chunk, split*chunk + chunk) of each sequence go to split `split` (the last split also
// takes anything beyond n_split*chunk); chunk is a multiple of kTileKv.
// n_split == 1: writes out [n_tok][n_head][head_dim] directly (part unused, may be null); with xq non-null
//   and fewer than kPrefillMinTok tokens (the decode shape) also xq: [n_tok][n_head * head_dim] int8 and
//   xds: [n_tok][n_head * head_dim / 32], out's Q8 activations (the bits of q8::quantize of out).
//   Returns whether it wrote them.
// n_split  > 1: writes part [n_tok*n_head][n_split][2 + head_dim] = (max m, sum s, acc[head_dim]) for
//   ops.cu's combine kernel.
// PDL (cuda/pdl.cuh): the CUDA-core kernel reads refs before its wait, so refs must not be written by a
// kernel of the stream (the models upload them with the pass's inputs; no kernel writes a KvRef array).
// prep (ops::prep_attention_q8): one token (n_tok == 1) whose q, K and V the kernel prepares itself from
// the q|k|v product, as attn_prep does (same bits), instead of reading q (then null) and the token's own
// K/V row from the cache; the block(s) holding position refs[0].pos store that row in the cache.
// prep->pf on (expert_predict.h): prep->pf.blocks more blocks in the grid's first row predict the layer's
// experts from x and prefetch them into L2; the attention's values do not change.
// one_cache: every token's refs name one cache (ops::attention); a prefill-sized call then launches the
// prefill shape only.
struct Prep {
  ops::AttnPrepIn in;
  int n_rot;  // rotated dims per head (even, <= head_dim)
  float eps;  // q_norm / k_norm epsilon
  predict::ExpertPrefetch pf = {};
  bool early_weights = true;  // the norm weights loaded before the PDL wait (ops::prep_early_weights())
};
// cl_merge: one token (n_tok == 1), 2 <= n_split <= kMaxMergeCluster, no expert predictor (prep->pf off): the
// n_split blocks of each head chunk run as one thread block cluster (sm_90) and, after a cluster barrier, merge
// their partial states themselves, writing out (and xq / xds, as for one split) with the combine kernel's bits;
// the caller launches no combine. part is still written (the blocks' exchange). ops::set_attn_cluster_merge.
constexpr int kMaxMergeCluster = 8;  // the portable cluster size
bool launch(const float* q, const ops::KvRef* refs, int64_t n_tok, int layer, int n_head, int n_head_kv,
            int head_dim, float scale, int n_split, int chunk, float* part, float* out, int8_t* xq, float2* xds,
            cudaStream_t stream, const Prep* prep = nullptr, bool one_cache = false, bool cl_merge = false);

}  // namespace strata::cuda::attn_tile
