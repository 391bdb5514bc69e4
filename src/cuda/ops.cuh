#pragma once
// The small ops of the forward pass on the GPU (issue 7), declarations only. Each mirrors the CPU
// reference of the same name in cpu/ops.h (same shapes, same arithmetic up to summation order);
// tests/cuda/test_ops_kernels.cu compares every one with it on random data at real sizes.
// All pointers are device memory unless said otherwise; every call is enqueued on `stream`.
#include <cuda_runtime.h>

#include <cstdint>

#include "cpu/ops.h"

namespace strata::cuda::ops {

// y[r][:] = x[r][:] / sqrt(mean(x[r]^2) + eps) * w[:].  x, y: [n_rows][n]; w: [n]. y may alias x.
void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y,
             cudaStream_t stream);

// NeoX rotary embedding in place. x: [n_tok][n_head][head_dim]; pos: [n_tok] device int32.
void rope_neox(float* x, const int32_t* pos, int64_t n_tok, int n_head, int head_dim, int n_rot,
               float base, cudaStream_t stream);

// out[i] = silu(gate[i]) * up[i]. out may alias gate or up.
void swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);

// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream);

// One token's view of its sequence's device KV cache (all layers in one allocation per sequence).
// K and V are stored as f16 (IEEE half bits): f16 is what llama.cpp's flash attention uses, so it is also
// what the exact mode must store to match the references.
struct KvRef {
  uint16_t* k;    // [n_layer][n_ctx][n_head_kv][head_dim]   f16
  uint16_t* v;    // [n_layer][n_ctx][n_head_kv][head_dim_v] f16
  int32_t n_ctx;  // positions per layer in this sequence's cache
  int32_t pos;    // this token's position: kv_store writes there; attention reads [0, pos]
};

// For each token t: K/V rows of layer `layer` at refs[t].pos = f16(k[t]), f16(v[t]) (round to nearest).
//   k: [n_tok][k_row] f32, v: [n_tok][v_row] f32; refs: [n_tok] device. k_row = n_head_kv * head_dim.
void kv_store(const float* k, const float* v, const KvRef* refs, int64_t n_tok, int layer, int64_t k_row,
              int64_t v_row, cudaStream_t stream);

// Causal attention with grouped KV heads: query head h reads KV head h / (n_head / n_head_kv); token t
// attends to positions [0, refs[t].pos] of its own sequence's layer `layer`.
//   q: [n_tok][n_head][head_dim] f32   out: [n_tok][n_head][head_dim_v] f32
// math = GgmlF16: llama.cpp's CPU flash-attention arithmetic, like cpu::attention with GgmlF16 (Q rounded
//   to f16, f16 K.Q products summed in f32, online softmax, V accumulated in an f16 accumulator rounded
//   after each position); one warp per (token, head) walks the positions in order. The exact mode.
// math = F32: the fast path, f32 throughout. Head sizes 64/128/256 (K and V alike): the tiled kernel of
//   cuda/attn_tile.cu — a block takes a tile of query rows (one token's group heads for decode; 8 tokens x
//   8 heads once a call has >= 8 tokens, i.e. a causal prefill tile) and walks K/V tiles in shared memory
//   with online softmax; positions are split over blocks when the rows alone do not fill the GPU (partial
//   states merged by a combine kernel; one split writes out directly). Prefill tiles whose tokens share a
//   cache take the 64-row shape; tokens of mixed tiles (batched decodes) the decode shape. Other head
//   sizes: the older per-warp flash-decoding kernel.
// max_kv: the largest n_ctx of any sequence (sizes the split); scratch: attention_scratch_floats() f32.
// refs must not be written by a kernel of the stream (the tiled kernel reads them before its PDL wait).
// one_cache: the caller knows every token's refs name one cache (a one-sequence prefill), so no tile is
// mixed and a prefill-sized call launches the prefill shape only (why: the decode shape's launch is one
// block per token and head group, which all return: 12.8 us of a 512-token layer, session 29).
size_t attention_scratch_floats(int64_t n_tok, int n_head, int head_dim_v, int64_t max_kv);
// How positions are split (ops.cu attn_splits_by): 1 (the default) no split once the query rows alone give
// a block per SM (a prefill), 0 the older rule (split up to two blocks per SM). STRATA_CUDA_ATTN_SPLIT_RULE,
// read once; set_attn_split_rule (benchmarks, tests) wins. Process-wide; the same values up to the order of
// the softmax's partial sums.
void set_attn_split_rule(int rule);
int attn_split_rule();
// One-token decode (the tiled kernel): each split walks at least `tiles` K/V tiles of 64 positions (1-8; 1, the
// default: a split a tile), so a context of up to tiles x 64 positions is one split, whose block writes the output
// itself, with no combine launch after it. Why a switch: the combine is a dependent step of ~5 us a layer (H100
// trace, session 51) past 64 positions, while session 18 (H200) found a block walking a second tile slower than
// the combine at contexts to 512; the kernel has changed since (K/V prefetched before the wait, 4 heads a block).
// STRATA_CUDA_ATTN_DECODE_TILES, read once; set_attn_decode_tiles (tests, benchmarks: before graphs are captured,
// whose split counts it changes) wins. The same values up to the order of the softmax's partial sums.
void set_attn_decode_tiles(int tiles);
int attn_decode_tiles();
// One-token decode with 2 to 8 splits (contexts of 65 to 512 positions at one tile a split): the splits' blocks
// run as one thread block cluster a head chunk and merge their partial states themselves after a cluster
// barrier (attn_tile.cu merge_splits), with the combine kernel's arithmetic and bits, so no combine launch follows.
// Why: the combine is a dependent step of ~5 us a layer past 64 positions (H100 trace, session 51). Off by
// default until measured (STRATA_CUDA_ATTN_CLUSTER_MERGE=1, read once; set_attn_cluster_merge wins; tests,
// benchmarks: before graphs are captured). Devices without clusters (before sm_90) keep the combine.
void set_attn_cluster_merge(bool on);
bool attn_cluster_merge();
void attention(const float* q, const KvRef* refs, int64_t n_tok, int layer, int n_head, int n_head_kv,
               int head_dim, int head_dim_v, float scale, cpu::AttnMath math, int64_t max_kv,
               float* scratch, float* out, cudaStream_t stream, bool one_cache = false);

// MoE router like cpu::moe_route: probs = softmax(logits[t]); the k largest (ties: lower id first);
// with norm, weights divided by their sum (clamped at 6.103515625e-5). logits: [n_tok][n_expert];
// ids: [n_tok][k] int32, weights: [n_tok][k] f32. n_expert <= cpu::kMaxExperts, k <= 64.
void moe_route(const float* logits, int64_t n_tok, int n_expert, int k, bool norm, int32_t* ids,
               float* weights, cudaStream_t stream);

// Greedy sampling: out[t] = argmax_v logits[t][v] (ties: lowest id). logits: [n_tok][n_vocab].
void argmax(const float* logits, int64_t n_tok, int64_t n_vocab, int32_t* out, cudaStream_t stream);

// Random sampling on the GPU with the same rule as the engine's CPU Sampler (engine/sampling.cpp) minus
// the penalties, given the same uniform draw u (Rng::uniform): top-k, top-p, min-p, temperature, draw.
// With the same u it picks the same token as Sampler::sample on the same logits. logits: [n_tok][n_vocab]; u: [n_tok] in [0,1);
// temperature <= 0 means greedy. scratch: sample_scratch_bytes(n_tok, n_vocab) bytes of device memory, or null.
// With scratch, rows with 0 < top_k <= kSampleCandMaxK (the default 40 among them) first keep each stretch of
// kSampleCandStretch values' top-k keys (many blocks a row), and the sampler's passes read those instead of the
// whole row: the same picks, ~1 ms less a row at a 152k vocabulary (ops_sample.cu). Without scratch (or with
// STRATA_CUDA_SAMPLE_PREFILTER=0, read once, or set_sample_prefilter(false)) every pass reads the row.
struct SampleParams {
  float temperature = 0.8f;
  int32_t top_k = 40;  // 0: off
  float top_p = 0.95f; // 1: off
  float min_p = 0.05f; // 0: off
};
constexpr int64_t kSampleCandStretch = 2048;
constexpr int32_t kSampleCandMaxK = 64;  // 20, 40, 50, 64: the usual top-k settings
constexpr int64_t kSampleCandMaxParts = 1024;  // longer rows (and launches over 65535 rows) read the whole row
size_t sample_scratch_bytes(int64_t n_tok, int64_t n_vocab);
void set_sample_prefilter(bool on);
bool sample_prefilter();
// The prefilter by warp sorts and merge trees (cuda/warp_merge.cuh): each stretch's top-k by 32 warps sorting 64
// keys in registers, and the sampler's block merges the stretches' lists into its sorted top-k instead of
// selecting and gathering it (the same keys, so the same picks). STRATA_CUDA_SAMPLE_MERGE=0 (read once) or
// set_sample_merge(false): the block-sort prefilter. On by default since session 48 (H100, sampled chained
// tg64: 593.7 against 583.5 tok/s, 3 of 3 rounds; warm ncu: prefilter 8.0 against 29.7 us, the sampler's block
// 27.7 against 36.1).
void set_sample_merge(bool on);
bool sample_merge();

// As cpu::ban_tokens (a request's ignore_eos before sample/argmax): logits[t][ban[j]] = -inf in each row t
// whose rows[t] is nonzero (every row when rows is null); ids outside [0, n_vocab) are skipped.
// logits: [n_tok][n_vocab]; ban: [n_ban] int32; rows: [n_tok] uint8 or null. All on the device.
void ban_tokens(float* logits, int64_t n_tok, int64_t n_vocab, const int32_t* ban, int32_t n_ban,
                const uint8_t* rows, cudaStream_t stream);
void sample(const float* logits, int64_t n_tok, int64_t n_vocab, const SampleParams& p, const float* u,
            void* scratch, int32_t* out, cudaStream_t stream);
// sample / sample_rows past the first 2048 ranks (a draw or a top-p over a flat distribution): with
// sample_deep() a descent of the keys' bytes by probability mass (ops_sample.cu deep_walk; picks as the CPU's except
// within ~1e-13 of a cumulative boundary) instead of walking the ranks in chunks (~1 ms a row at 151936
// tokens when the target is deep). STRATA_CUDA_SAMPLE_DEEP=0/1 (read once) or set_sample_deep; on by
// default since session 41 (H100, 8 requests at 8 temperatures drawing over the whole vocabulary of the
// random-weight 48-layer file: 921 / 901 tok/s against 484 / 481 walking; GpuOps.SampleDeepMatchesCpuSampler
// and SampleWalkMatchesCpuSampler compare both against the CPU sampler).
void set_sample_deep(bool on);
bool sample_deep();
// The deep search's histogram atomics a warp at a time (warp_mass_add: one atomic per distinct bin of a warp,
// the bins' integer sums unchanged, so the same picks); STRATA_CUDA_SAMPLE_DEEP_AGG=1 (read once) or
// set_sample_deep_agg. On by default since session 49 (H100, sampled chained decode over the whole vocabulary of
// a flat row, top-k off: 386.4 against 297.5 tok/s; `strata serve`, one request: 366.5 against 283.2; its tests
// and memcheck pass; racecheck on the one-block sampler, GpuOps.SampleDeepAggRacecheckProbe: 0 hazards, session 51.
// Under clusters racecheck stops with an internal error, so those merges are tested by set_sample_cluster_jitter).
void set_sample_deep_agg(bool on);
bool sample_deep_agg();
// The deep search's choice of bin at each level by warp 0 (pick_mass_bin: an integer scan of the bins' masses
// over the lanes and a ballot) instead of thread 0 walking the 256 bins (~4 us a level, as pick_bin's was).
// The stop tests are monotone in the same integer sums, so the same bins and picks.
// STRATA_CUDA_SAMPLE_DEEP_WARP=1 (read once) or set_sample_deep_warp; off until measured on a GPU.
void set_sample_deep_warp(bool on);
bool sample_deep_warp();
// The sampler's blocks a row: a cluster of 2 to 8 blocks (sm_90 thread block clusters; 8 by default) that split
// every pass over the row and merge their histograms, sums and gathered keys through distributed shared memory,
// every block then taking the same decisions; or 1. Why: a draw over the whole vocabulary of a flat row is ~10
// passes over 152k values, instruction-bound on one SM (session 50, H100, sampled chained decode at top-k off:
// 531.4 tok/s with 8 against 384.2 with one block, 593 at top-k 40 either way; `strata serve`, one request with
// the API's defaults: 496.0 against 364.7). The integer histograms are the same; the double sums differ in their
// order only (every pick of the tests equal to one block's). STRATA_CUDA_SAMPLE_CLUSTER=N (read once) or
// set_sample_cluster; a device that cannot run the cluster falls back to one block (a warning). A row whose
// passes read only the prefilter's merged candidates (top-k <= kSampleCandMaxK, scratch given) runs on one
// block either way: sample() launches one for such a rule; in sample_rows the row's other blocks leave at once.
void set_sample_cluster(int blocks);
int sample_cluster();
// Test hook: a nonzero seed makes each block of a sampler cluster sleep a pseudo-random 0-4 us after every merge's
// cluster barrier, before it reads the other blocks' parts (0, the default: off). The picks must not change:
// GpuOps.SampleClusterPicksUnderJitter. Why: compute-sanitizer's racecheck stops with an internal error on
// distributed shared memory (session 51), so the merges' ordering is tested by shuffling the blocks instead.
void set_sample_cluster_jitter(uint32_t seed);
// sample / sample_rows read a whole row with row_scan::kBatch loads a thread in flight (cuda/row_scan.cuh; the
// same values in the same per-thread order, so the same picks); STRATA_CUDA_SAMPLE_BATCH=0 (read once): one
// load at a time (session 46, H100, sampled decode over whole rows: 546.2 against 526.2 tok/s).
bool sample_batched();
// strata::Error naming the parameter sample() would refuse (sample_rows' caller checks its rules with it).
void check_sample_params(const SampleParams& p);
// As sample, with row t's rule at rows[t] (device memory, [n_tok], each passing check_sample_params): a
// batch of requests with different parameters picks in one launch.
void sample_rows(const float* logits, int64_t n_tok, int64_t n_vocab, const SampleParams* rows, const float* u,
                 void* scratch, int32_t* out, cudaStream_t stream);
// argmax's picks (the same ids: the largest order key of each row) spread over the GPU (decode's greedy
// picks take it with STRATA_CUDA_WIDE_ARGMAX=1: pool_io.cpp launch_sampler): grid (parts, n_tok),
// each block the largest key of a stretch of kArgmaxStretch values of its row into parts[t][b], then one
// block a row over the row's parts. Why: argmax's one block a row read a 152k-value row from one SM, ~40 us
// on an H100 (a greedy decode step's pick; session 45), where 75 blocks read it at the GPU's bandwidth.
// parts: argmax_parts_bytes(n_tok, n_vocab) of device scratch.
constexpr int64_t kArgmaxStretch = 2048;
constexpr int64_t kArgmaxMaxParts = 1024;  // rows longer than 1024 stretches: each block takes several
size_t argmax_parts_bytes(int64_t n_tok, int64_t n_vocab);
void argmax_wide(const float* logits, int64_t n_tok, int64_t n_vocab, uint64_t* parts, int32_t* out,
                 cudaStream_t stream);
// dst[i] = src[i] for i < n (int32, device): a chained decode pass's tokens from the previous pass's picks
// (ForwardOptions::chain), on the stream both passes run on. CPU reference: std::copy.
void copy_i32(int32_t* dst, const int32_t* src, int64_t n, cudaStream_t stream);

}  // namespace strata::cuda::ops
