#pragma once
// Decode products with int8 activations (issue 7), declarations only. Implementation: q8_kernels.cu;
// CPU references with the same signatures: host/q8_reference.h; tests: tests/cuda/test_q8_kernels.cu.
//
// Why: the f32-activation kernels (quant_kernels.cuh, fast_dot.cuh) spend ~4 instructions per weight
// (byte -> float, subtract, FMA, sum of x), which caps a Q4_K matvec near a quarter of HBM bandwidth on
// the H200. With the activations quantized once per token to int8 blocks of 32 (ggml's q8_1 idea), one
// dp4a multiplies 4 weights by 4 activations: the kernels become bound by memory, not by issue.
// Used by the fast GPU mode only (llama.cpp's GPU quantizes activations the same way; the exact mode keeps
// f32 weights and f32 activations).
//
// Activation layout ("Q8 activations"), for n rows of `cols` values, cols % 32 == 0:
//   q:  [n][cols] int8          q = round(x / d), |q| <= 127
//   ds: [n][cols / 32] float2   {d, d * sum(q over the block)}, d = max|x over the block| / 127
//                                (d = 0 and q = 0 for an all-zero block)
// Both device, q 16-byte aligned per row (cols % 32 == 0 keeps every row aligned when q is).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/moe_kernels.cuh"
#include "quant/types.h"

namespace strata::cuda::q8 {

// Whether the models use these kernels at all (their fast decode): on unless the environment sets
// STRATA_CUDA_Q8=0 (read once; benchmarks and accuracy checks compare against the f32-activation path).
// The kernels below work either way.
bool enabled();

// True when `t` has int8-activation kernels (Q4_0, Q4_0_X8, Q8_0, Q4_K, Q5_K, Q6_K, Q6_K_X8 (dense products
// only: no expert is stored in it), and the low-bit Q2_K, Q3_K, IQ4_XS, IQ4_NL, IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M). Any other type (Q4_1, Q5_0, Q5_1, the float types) keeps the f32 path of
// quant_kernels.cuh / moe_kernels.cuh.
bool supported(GgmlType t);

// Whether the models take the low-bit formats' int8 kernels (q8ref::low_bit):
// STRATA_CUDA_Q8_LOW_BIT=0/1 (read once) or set_low_bit. On by default since session 35: ~2x the decode of a
// Q2_K file (H100: 423.8 against 217.9 tok/s), each fixture's median KL below llama.cpp's own
// (bench/results/2026-12-05-gpu-session35-h100.md); off, those tensors take the f32-activation kernels.
void set_low_bit(bool on);
bool low_bit_enabled();

// What the models ask (the kernels take any supported type): supported(t), and low_bit_enabled() for
// a low-bit t; use_moe: moe_supported(v) with that rule for its three types.
bool use_type(GgmlType t);
bool use_moe(const moe::ExpertLayerView& v);

// x: [n][cols] f32 -> (q, ds) as above. cols % 32 == 0 (throws strata::Error otherwise).
void quantize(const float* x, int64_t n, int64_t cols, int8_t* q, float2* ds, cudaStream_t stream);

// y = rmsnorm(x) * w exactly as ops::rmsnorm computes it (same values), and (q, ds) = quantize(y), in one
// launch. x, y: [n][cols] f32 (y may be x)  w: [cols] f32. With PDL (cuda/pdl.cuh) w is loaded before the
// kernel waits for the previous kernel of the stream: w must not be written by an earlier kernel of the
// same stream (norm weights: uploaded, ordered by events). matvec only prefetches its weights into L2
// before that wait (harmless whatever wrote them).
void rmsnorm_quantize(const float* x, const float* w, int64_t n, int64_t cols, float eps, float* y, int8_t* q,
                      float2* ds, cudaStream_t stream);

// y[t][r] = W[r] . x[t] (accumulate = false) or y[t][r] += W[r] . x[t] (accumulate = true; the residual
// add fused), for t < n, any n >= 1 (tiled). x given as Q8 activations of [n][cols]. W: [rows][cols] in
// `type` (supported(type)), row r at w + r * row_bytes. Throws strata::Error for an unsupported type or
// cols not a multiple of the type's block size.
void matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes, const int8_t* xq,
            const float2* xds, int64_t n, float* y, bool accumulate, cudaStream_t stream);

// How matvec copies the 2-byte aligned formats' rows (Q6_K, Q4_0, Q8_0, ...) into shared memory: by cp.async,
// all of a lane's pieces in flight (1, the default), or loads and stores (0). The same bytes, the same bits.
// Process-wide; the first call reads STRATA_CUDA_MATVEC_ASYNC_STAGE unless set_matvec_async_stage ran before.
void set_matvec_async_stage(int on);
int matvec_async_stage();

// matvec's tensor-core paths (q8_mma_tile.cu, q8_mma_matvec.cu) for the formats Q4_0, Q4_0_X8, Q8_0, Q4_K,
// Q5_K, Q6_K, Q6_K_X8 (mma_matvec_takes), by mma_mode(): STRATA_CUDA_Q8_MMA (read once) or set_mma_mode:
//   0: off (the dp4a kernel for every n);
//   1: the tile kernel for n >= 8 (tiles of 8 tokens, the last one partial; measured ahead of dp4a at
//      n = 8, behind it at n = 2: bench/results/2026-12-06-gpu-session39-h100.md);
//   2: the persistent, double-buffered kernel for n >= 2 (behind dp4a at n = 2, ahead at 4, behind the tile
//      kernel at 8: bench/results/2026-12-06-gpu-session41-h100.md);
//   3 (default): the persistent kernel for 4 <= n < 8, the tile kernel from 8 (session 41: +2.3% at 4
//      sequences, +7.8% at 6 against mode 1).
// Same contract as matvec; the sums differ from the dp4a kernel's only in the order of float additions.
// mma_matvec returns false (launching nothing) where the mode or the format leaves it to dp4a.
void set_mma_mode(int mode);
int mma_mode();
bool mma_matvec_takes(GgmlType t);
bool mma_matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes, const int8_t* xq,
                const float2* xds, int64_t n, float* y, bool accumulate, cudaStream_t stream);

// rmsnorm_quantize and matvec in one launch: xn = rmsnorm(x) * nw, (xq, xds) = its Q8 activations (the
// same bits as rmsnorm_quantize; written by block 0), and y (+)= W . xn's Q8 activations (the same bits
// as matvec on them). Every block computes the norm and its quantization into shared memory itself.
// Why: a decode norm is a one-block kernel on the chain's critical path. Measured on the H200 (48-layer
// 30B-A3B decode, bench/results/2026-12-02-gpu-session13-h200.md): the norm's and q|k|v's steps were
// 3.7 + 4.1 us a layer, this launch's 7.2. (With PDL a launch boundary costs well under a microsecond;
// what is left are the norm's dependent loads, now in every block.)
// x: [n][cols] f32  nw: [cols] f32 (read before the PDL wait: uploaded weights only)  xn: [n][cols] f32
// xq: [n][cols] int8  xds: [n][cols/32]  W, y, accumulate: as matvec. y must not overlap x, xn, xq, xds.
// Needs norm_matvec_supported(cols, n) and supported(type) (throws strata::Error otherwise).
void norm_matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, int64_t row_bytes, const float* x,
                 const float* nw, float eps, int64_t n, float* xn, int8_t* xq, float2* xds, float* y,
                 bool accumulate, cudaStream_t stream);
// n == 1 (decode of one sequence) and cols 256 (the test models), 1024, 2048 or 4096 (the norm's values
// stay in registers).
// Whether norm_matvec takes `t`: the first six int8 formats (Q4_0, Q4_0_X8, Q8_0, Q4_K, Q5_K, Q6_K) and Q6_K_X8
// (rows of 2048 or 4096 columns). Why not the low-bit ones: its launch variants per format made it the
// longest file to compile (394 s with them), and a low-bit file's q, k and v rarely share one type
// (llama.cpp raises attn_v's), which the fused q|k|v product needs; their q|k|v run rmsnorm_quantize + matvec.
bool norm_matvec_takes(GgmlType t);
bool norm_matvec_supported(int64_t cols, int64_t n);
// Whether the models use norm_matvec where it applies: on unless STRATA_CUDA_NORM_MATVEC=0 (read once).
bool norm_matvec_enabled();
// norm_matvec's early norm (a process-wide switch, on by default: the first call reads
// STRATA_CUDA_NORM_EARLY=0 to turn it off unless set_norm_matvec_early ran before): every block quantizes x * nw
// without the norm's scale and multiplies each dot by it instead, so the product need not wait for the
// block's sum of squares. Then y = W . Q8(x * nw) * scale (each dot rounded, times scale rounded, then the
// accumulate's add), not the bits of rmsnorm_quantize + matvec; xn keeps its bits; xq, xds are not
// written. CPU reference: q8ref::norm_matvec_early.
void set_norm_matvec_early(bool on);
bool norm_matvec_early();
// How the early norm lays out its quantization (the same bits either way; a process-wide switch, on by
// default: STRATA_CUDA_NORM_LANES=0 turns it off unless set_norm_matvec_lanes ran before): on, each lane
// quantizes a run of consecutive values (q8c::quantize_lanes); off, one value a lane (quantize_warp).
void set_norm_matvec_lanes(bool on);
bool norm_matvec_lanes();
// norm_matvec's launch shape for 2048 and 4096 columns (the same bits; process-wide, the first call reads
// the environment unless the setter ran before):
// - rows: weight rows a lane group holds, 1 to 5 (3 to 5 only with the early norm in runs, the default:
//   else the geometry's choice: 2 for whole-warp rows of at least 4096 rows, else 1); 0 (the default) 3
//   where the geometry's choice is 2, else the geometry's. STRATA_CUDA_QKV_ROWS=0..5.
// - per SM: the grid's blocks an SM at most, by shared-memory padding where the grid fits on the GPU at
//   once under it (smem_cap.cuh), 0 no cap. STRATA_CUDA_QKV_PER_SM=0..8, default 2.
void set_norm_matvec_rows(int rows);
int norm_matvec_rows();
void set_norm_matvec_per_sm(int cap);
int norm_matvec_per_sm();

// MoE decode with Q8 activations, experts read from expert-cache slots through the layer's residency
// table row (same view and table contract as moe::moe_gate_up / moe::moe_down).
// For every (t, j), t < n, j < k, with e = ids[t*k+j] resident (table[e] >= 0):
//   h = silu(gate_e . x[t]) * (up_e . x[t])   (n_ff values), stored only as Q8 activations:
//   hq: [n*k][n_ff] int8, hds: [n*k][n_ff/32] float2. Pairs of non-resident experts are left untouched.
// Needs n_ff % 32 == 0 and supported(gate_type) && supported(up_type) (check with moe_supported).
void moe_gate_up(const moe::ExpertLayerView& v, const int32_t* table, const int8_t* xq, const float2* xds,
                 const int32_t* ids, int64_t n, int k, int8_t* hq, float2* hds, cudaStream_t stream);

// x[t][:] = resid[t][:] + sum over j < k with ids[t*k+j] resident of wts[t*k+j] * (down_e . h[t*k+j]), the
// k terms summed in a fixed order first (deterministic, no atomics), then added once. x: [n][n_embd] f32;
// resid: the same shape, nullptr = x itself (x += the sum); otherwise it must not overlap x.
// after_gate_up: the call directly follows moe_gate_up with the same ids and table on `stream`. The kernel
// then reads ids and the table before its PDL wait (cuda/pdl.cuh) to put its experts' rows into L2 while
// gate_up runs. Why this is ordered: gate_up's blocks let this grid launch only after their own wait, i.e.
// after the kernel that wrote ids had completed with its memory visible; the table is written by uploads
// only (ordered by events). Why: the down rows (7 MB a layer for Qwen3-30B-A3B) were read from HBM only
// after gate_up ended, on the decode chain's critical path. STRATA_CUDA_DOWN_PREFETCH=0: no prefetch.
void moe_down(const moe::ExpertLayerView& v, const int32_t* table, const int8_t* hq, const float2* hds,
              const int32_t* ids, const float* wts, int64_t n, int k, float* x, cudaStream_t stream,
              bool after_gate_up = false, const float* resid = nullptr);

// ---- The folded router (q8_folded_router.cu; CPU references: host/q8_reference.h).
// Decode of one token: the router's logits are a linear function of the residual stream h = x + wo . att
// up to the ffn norm's scale, logits = s * R . (g * h) with R the router [n_expert][n_embd], g the ffn
// norm weight and s = 1 / sqrt(mean(h^2) + eps). So with C = R * g (per column) and M = C . Wo:
//   R . (g * h) = C . x + M . att,
// which needs only x and att, both known when wo starts. wo_router computes them beside wo in the same
// launch, and moe_gate_up_routed's blocks take s, the top-k and the ffn norm's Q8 activations from there:
// the router's own launch (norm -> logits -> ticket -> top-k, ~7 us a layer on the H200) leaves the
// decode chain. The logits differ from the router's by the order of the float sums and by M's rounding
// (M is computed in double, then rounded to f32).

// fold[e][0..n_embd) = router[e][c] * norm_w[c] and fold[e][n_embd + i] = sum_c router[e][c] * norm_w[c] *
// wo[c][i], both computed in double and rounded once. router: [n_expert][n_embd] f32, norm_w: [n_embd],
// wo: [n_embd][n_att] f32 (dequantized), fold: [n_expert][n_embd + n_att]. Device pointers; load time.
void fold_router(const float* router, const float* norm_w, const float* wo, int n_expert, int64_t n_embd,
                 int64_t n_att, float* fold, cudaStream_t stream);

// One launch, n = 1: mid = x + Wo . att (as matvec with accumulate into a copy of x: the same bits),
// ss[b] = the sum of mid^2 over the rows of block b (b < wo_router_ss_count(...)), and raw[e] =
// fold[e] . [x; att] for e < n_expert (f32, a fixed order). Wo: [n_embd][n_att] in `type` as matvec
// (row_bytes apart); attq/attds: att's Q8 activations; att: [n_att] f32; x, mid: [n_embd] (mid must not
// overlap x); fold: as fold_router. Needs wo_router_supported (throws strata::Error otherwise).
void wo_router(GgmlType type, const void* wo, int64_t n_embd, int64_t n_att, int64_t row_bytes, const int8_t* attq,
               const float2* attds, const float* att, const float* x, const float* fold, int n_expert, float* mid,
               float* raw, float* ss, cudaStream_t stream);
// Entries wo_router writes to ss (its wo blocks) for this shape.
int64_t wo_router_ss_count(GgmlType type, int64_t n_embd, int64_t n_att, int64_t row_bytes);
// n_embd a multiple of 256 up to 4096, n_embd + n_att a multiple of 4 up to 8192, n_expert <= 512,
// supported(type).
bool wo_router_supported(GgmlType type, int64_t n_embd, int64_t n_att, int n_expert);
// Whether the models use the folded router where it applies: on unless STRATA_CUDA_FOLDED_ROUTER=0, or as
// set_folded_router said last (tests). A model decides when it loads (the fold is built then).
bool folded_router_enabled();
void set_folded_router(bool on);

// The routing inputs of moe_gate_up_routed (written by wo_router). Device pointers.
struct FoldedRoute {
  const float* mid;     // [n_embd] h, the ffn's residual input
  const float* norm_w;  // [n_embd] the ffn norm weight (read before the PDL wait: uploaded weights only)
  float eps;
  const float* ss;      // [n_ss] partial sums of h^2
  int n_ss;
  const float* raw;     // [n_expert] (router * norm_w) . h, before the norm's scale
  int n_expert;
  bool norm;            // the k chosen weights renormalized to sum 1 (expert_weights_norm)
  int32_t* ids;         // [k] out: the chosen experts, best first
  float* wts;           // [k] out: their weights
  // [k] or null: the slots of the experts the predictor (cuda/expert_predict.h, mode 4) expects, best
  // first (-1: none). A hint: right after its wait, each product block of pair j asks L2 for its own gate
  // and up rows of slot pred_slots[j] while it routes; what it reads and computes is the router's choice.
  const int32_t* pred_slots = nullptr;
  // Set by moe_gate_up_routed from gate_up_warp_topk() (the caller's value is not read): the top k by each
  // warp's sort of its 32 keys and ranks among those candidates (n_expert <= 256, k <= 32), else by every
  // key's rank among all. The same choice.
  bool warp_topk = false;
};

// moe_gate_up for one token whose routing every block does itself: s = 1 / sqrt(sum(ss) / n_embd + eps)
// (the partial sums added in double, in a fixed order), the top k of raw (value desc, id asc: the order
// of the router's probabilities, which are increasing in raw), xq = Q8(mid * s * norm_w) in shared memory,
// then the product as moe_gate_up with those ids. One more column of blocks than moe_gate_up: its block
// y = 0 writes ids and the weights (softmax of s * raw over all experts, then the k chosen, renormalized if
// r.norm) for moe_down. mid and norm_w 16-byte aligned.
void moe_gate_up_routed(const moe::ExpertLayerView& v, const int32_t* table, const FoldedRoute& r, int k,
                        int8_t* hq, float2* hds, cudaStream_t stream);

// moe_down's two kernels (same results, tests compare both): with the k slots of a token looked up once
// per warp, in parallel, and the lanes' weight loads all in flight ("slots"), or the first kernel, where each
// term looks up its own slot ("per term"). moe_down_kernel(): 0 per term, 1 slots, 2 (the default) slots for
// one token of Q4_0_X8 experts (Q4_0 files), per term otherwise. Why (session 41, H100, 48-layer Q4_0 decode):
// one token 615.9 / 616.7 / 618.3 tok/s with slots against 593.9 / 615.3 / 606.1 per term; steps of 2 and 8
// tokens 641.0 and 1072.6 with slots against 659.6 and 1197.6. The other formats were not measured since
// session 4 (H200: slots slower for Q4_K and Q6_K down at one token). 3: the default's choice and one token of
// Q6_K_P down too (bench/cuda_matvec, H100, session 43: 8.22 against 8.55 us per term; Q4_K down 6.87 against
// 6.64), for an end-to-end comparison on a Q4_K_M file. Process-wide; the first call reads the environment
// (STRATA_CUDA_Q8_DOWN=slots: 1, =term: 0, =one-q6kp: 3) unless set_moe_down_kernel ran before.
void set_moe_down_kernel(int mode);
int moe_down_kernel();
// Whether a moe_down call of n tokens of down type `down` takes the slots kernel under moe_down_kernel().
bool moe_down_slots(int64_t n, GgmlType down);
// moe_down's launch shape (the same bits; process-wide, the first call reads the environment unless the
// setter ran before): warps a block, 8 (the default) or 4 (STRATA_CUDA_DOWN_WARPS=4); its blocks an SM at
// most, by shared-memory padding where the grid fits on the GPU at once under it (smem_cap.cuh), 0 no cap
// (STRATA_CUDA_DOWN_PER_SM=0..8, default 2).
void set_moe_down_warps(int warps);
int moe_down_warps();
void set_moe_down_per_sm(int cap);
int moe_down_per_sm();
// How moe_down's warps stage 2-byte aligned rows (Q4_0, Q8_0, Q6_K) in shared memory (the same bytes, so the
// same bits): all k experts' rows by asynchronous copies in flight at once (1, the default), or one row's
// copy after another (0). Process-wide; the first call reads STRATA_CUDA_DOWN_ASYNC_STAGE unless
// set_moe_down_async_stage ran before.
void set_moe_down_async_stage(int on);
int moe_down_async_stage();
// The warps a block moe_down launches with for v's down tensor and k experts a token: moe_down_warps(),
// except 4 where 8 would push a format staged through shared memory (2-byte aligned rows) out of it while
// 4 keep it there (the shape measured for those sizes). Host only.
int moe_down_launch_warps(const moe::ExpertLayerView& v, int k);

// gate_up's blocks per SM at most (moe_gate_up and moe_gate_up_routed, where the grid fits on the GPU at
// once under it: smem_cap.cuh's spreading_cap): 0 no cap. Launch shape only, the same bits. Process-wide; the
// first call reads the environment (STRATA_CUDA_GATE_UP_PER_SM=0..8, default 2) unless set_gate_up_per_sm
// ran before.
void set_gate_up_per_sm(int cap);
int gate_up_per_sm();
// How moe_gate_up_routed's blocks find the top k (the same ids, weights and bits either way): each warp's
// 32 keys sorted in registers, then ranks among the warps' candidates (1, the default), or every key's rank
// among all keys (0). Process-wide; the first call reads STRATA_CUDA_GATE_UP_TOPK unless
// set_gate_up_warp_topk ran before.
void set_gate_up_warp_topk(int on);
int gate_up_warp_topk();

// True when the three expert tensors' types are supported and n_ff, n_embd are multiples of 32 and of
// their types' block sizes (else the caller keeps moe::moe_gate_up / moe::moe_down).
bool moe_supported(const moe::ExpertLayerView& v);

}  // namespace strata::cuda::q8
