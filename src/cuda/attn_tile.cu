// The tiled F32 attention kernel (declarations and contract in cuda/attn_tile.cuh).
//
// One block takes a tile of query rows — TQ consecutive tokens of the call x HG query heads of one KV
// head's group — and one split of the positions. It walks that split's K/V positions in tiles of
// kTileKv rows copied into shared memory (cp.async, double buffered), and every query row of the block
// reads them from there: K and V cross HBM once per block instead of once per query head and token.
// Why rows = tokens x heads: for decode the heads of a group share the KV rows (GQA); for a prefill the
// tokens of a sequence share them too (their prefixes overlap).
//
// Inside a tile each warp owns RPW query rows. Scores: lane i computes the full dot products of
// positions i and i+32 (no cross-lane reduction per position: the shuffles were what bounded the older
// one-warp-per-position kernel). Softmax: per row a warp max per tile, the online rescale, the weights
// to shared memory. P.V: lane i owns dims [i*D/32, (i+1)*D/32) and walks the tile's positions.
//
// Tokens of a call may belong to different sequences at any positions (a KvRef per token). A call of 8
// tokens or more is cut into "class tiles" of the prefill shape's token count: those whose tokens share
// one cache (same k, v, n_ctx: a prefill's) go to the prefill shape (64 rows per block, or the tensor-core
// kernel below when switched on); the tokens of the other tiles go to the decode shape (one token's group
// heads per block), each launch skipping the other's tiles. Inside a block, rows walk the positions up to
// the tile's largest position with per-row causal masks (a row attends p <= its own pos), so positions
// need not be consecutive. A decode-shape tile of several tokens (groups smaller than 8) may still span
// two caches: the block then takes the runs of tokens sharing a cache one after the other.
#include "cuda/attn_tile.cuh"

#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cooperative_groups.h>
#include <mma.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/attn_prep_head.cuh"
#include "cuda/cluster_launch.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/expert_predict.cuh"
#include "cuda/host/attn_span.h"
#include "cuda/ops_common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/q8_common.cuh"

namespace strata::cuda::attn_tile {

static_assert(kTileKv == kAttnSpanMin, "an attention span of one tile: cuda/host/attn_span.h");

namespace {

constexpr int KT = kTileKv;

enum class Select : int { All, OneCache, Mixed };

// Dynamic shared memory of one block, in this order (every part 16-byte aligned):
//   q:    [R][D] f32, already multiplied by the scale
//   k:    [2][KT][D + 8] f16, double buffered; 8 halves of padding per row so that the 8 lanes of a
//         quarter warp reading 16 bytes each from 8 different rows hit 8 distinct groups of banks
//   v:    [2][KT][D] f16 (read along a row: no padding needed)
//   p:    [W][RPW][KT] f32, each warp's softmax weights of the current tile
//   refs: [R] KvRef, the tile's tokens (TQ <= R)
//   kn:   [D] f32, only with a Prep (prep_bytes): the warp preparing the token's K norms it here
template <int D, int RPW, int W>
struct Layout {
  static constexpr int R = RPW * W;
  static constexpr int KS = D + 8;
  static constexpr size_t q_off = 0;
  static constexpr size_t k_off = q_off + size_t(R) * D * 4;
  static constexpr size_t v_off = k_off + size_t(2) * KT * KS * 2;
  static constexpr size_t p_off = v_off + size_t(2) * KT * D * 2;
  static constexpr size_t r_off = p_off + size_t(W) * RPW * KT * 4;
  static constexpr size_t bytes = r_off + size_t(R) * sizeof(ops::KvRef);
  static constexpr size_t kn_off = (bytes + 15) / 16 * 16;
  static constexpr size_t prep_bytes() { return kn_off + size_t(D) * 4; }
};

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The cluster merge of a one-token decode's splits (ops::set_attn_cluster_merge): the launch's clusters are the
// n_split blocks of one head chunk (blockIdx.y = split). Each block has written its rows' partial states to part;
// after the cluster barrier (arrive.release / wait.acquire at cluster scope: the other blocks' writes are visible
// to the plain loads after it, which the barrier's asm also keeps from moving above it) block
// `split` merges rows split, split + n_split, ... of the chunk's `rows` head rows, a warp a row, and writes out
// and xq / xds as ops.cu's combine kernel would: the same weights, sums, order and quantization, so the same
// bits. Why: the combine is a dependent launch, a ~5 us step a layer past 64 positions (H100, session 51).
// part: [rows of the call][n_split][2 + D]; row0: the call's row of the chunk's first head; out: [..][D];
// xq, xds: null, or out's Q8 activations. All threads of every block of the cluster.
template <int D>
__device__ void merge_splits(const float* part, int n_split, int split, int64_t row0, int rows,
                             float* __restrict__ out, int8_t* __restrict__ xq, float2* __restrict__ xds) {
  using ops::detail::MaxOp;
  using ops::detail::SumOp;
  using ops::detail::warp_reduce;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#endif
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  constexpr int row = 2 + D;
  for (int r = split + n_split * warp; r < rows; r += n_split * n_warps) {  // warp-uniform
    const int64_t hr = row0 + r;
    const float* pr = part + hr * n_split * row;
    const float mi = lane < n_split ? pr[lane * row] : -INFINITY;
    const float M = warp_reduce(fmaxf(-INFINITY, mi), MaxOp{});  // (lanes past n_split hold -inf)
    const float c = mi == -INFINITY ? 0.0f : expf(mi - M);
    float S = 0.0f;
    if (lane < n_split) S += c * pr[lane * row + 1];
    S = warp_reduce(S, SumOp{});
    const unsigned live = __ballot_sync(0xffffffffu, mi != -INFINITY);  // (the combine's compact list, in order)
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int d0 = 0; d0 < D; d0 += 32) {
      const int d = d0 + lane;
      float a = 0.0f;
      for (unsigned b = live; b != 0u; b &= b - 1u) {
        const int i = __ffs(b) - 1;
        const float w = __shfl_sync(0xffffffffu, c, i);
        a += w * pr[i * row + 2 + d];
      }
      const int64_t f = hr * D + d;
      out[f] = a * inv;
      if (xq != nullptr) q8c::quantize_warp(a * inv, xq + (f - lane), xds + f / 32);
    }
  }
}

__device__ __forceinline__ float2 h2_to_f2(uint32_t w) {
  __half2 h;
  static_assert(sizeof(h) == sizeof(w));
  memcpy(&h, &w, sizeof(w));
  return __half22float2(h);
}

// N consecutive f16 values at p (aligned to 2N bytes) as floats. N: 2, 4 or 8.
template <int N>
__device__ __forceinline__ void load_f16(const uint16_t* p, float (&f)[N]) {
  if constexpr (N == 2) {
    const float2 a = h2_to_f2(*reinterpret_cast<const uint32_t*>(p));
    f[0] = a.x;
    f[1] = a.y;
  } else if constexpr (N == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 a = h2_to_f2(u.x), b = h2_to_f2(u.y);
    f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
  } else {
    static_assert(N == 8);
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 a = h2_to_f2(w[j]);
      f[2 * j] = a.x;
      f[2 * j + 1] = a.y;
    }
  }
}

// The one-token kernel's prepared heads: each warp's RPW query heads and, in warp 0, the KV head's K.
template <int RPW, int DPL>
struct TokenIn {
  prep::HeadIn<DPL> q[RPW], k;
};

// The norm weights of the heads prepare_token norms (warp 0 also K's), into `in`. Weights only, so the kernel
// may call it before its PDL wait (Prep::early_weights). Why: those few hundred bytes a layer were the
// prepared token's first loads after the wait, and long out of L2 (a whole pass of weights streams through
// it between two uses), so their HBM latency came before the norm. The angles are a kernel's output (the
// pass's rope_cos_sin): only asked into L2 here.
template <int D, int RPW, int DPL>
__device__ __forceinline__ void prepare_token_weights(const Prep& pp, int hg, int hc, int group, TokenIn<RPW, DPL>& in) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int row = warp * RPW + rr;
    if (row < hg && hc * hg + row < group) prep::load_head_weight(pp.in.q_norm, D, lane, in.q[rr]);
  }
  if (warp == 0) prep::load_head_weight(pp.in.k_norm, D, lane, in.k);
  if (threadIdx.x == 0) prefetch_l2_range(pp.in.cs, int64_t(pp.n_rot) * 4);  // [n_rot/2][2]
}

// The one-token kernel's own attention input (attn_tile_kernel with P): each warp norms and rotates its
// RPW query rows into qs (times scale, as the plain kernel scales q), rows of no head zeroed as there; with
// own_new, warp 0 also prepares KV head hk's K (normed in kn) and V, returns them as f16 bits in k_new /
// v_new and, in the block of head chunk 0, stores them in the cache at r.pos. Every load of the warp is
// issued before its first norm. weights_in: the norm weights are in `in` already (prepare_token_weights).
//   qs: [R][D] (shared)   kn: [D] f32 (shared)   r: the token's KvRef
template <int D, int RPW, int DPL>
__device__ __forceinline__ void prepare_token(const Prep& pp, const ops::KvRef& r, int layer, int n_head_kv, int hg,
                                              int hc, int hk, int group, int h_first, float scale, bool own_new,
                                              float* qs, float* kn, uint16_t (&k_new)[DPL], uint16_t (&v_new)[DPL],
                                              TokenIn<RPW, DPL>& in, bool weights_in) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* c = pp.in.cs;  // token 0's angles: [n_rot/2][2]
  prep::HeadIn<DPL>* hin = in.q;
  bool valid[RPW];
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int row = warp * RPW + rr;  // the token's head h_first + row when row < hg (one token: tile row = head)
    valid[rr] = row < hg && hc * hg + row < group;
    if (valid[rr]) {
      if (!weights_in) prep::load_head_weight(pp.in.q_norm, D, lane, hin[rr]);
      prep::load_head_input(pp.in.q + int64_t(h_first + row) * D, c, D, pp.n_rot, lane, hin[rr]);
    }
  }
  const bool do_kv = own_new && warp == 0;
  prep::HeadIn<DPL>& kin = in.k;
  float vv[DPL];
  if (do_kv) {
    if (!weights_in) prep::load_head_weight(pp.in.k_norm, D, lane, kin);
    prep::load_head_input(pp.in.k + int64_t(hk) * D, c, D, pp.n_rot, lane, kin);
#pragma unroll
    for (int u = 0; u < DPL; ++u) vv[u] = pp.in.v[int64_t(hk) * D + lane + 32 * u];
  }
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    float* qr = qs + (warp * RPW + rr) * D;  // [D]: the norm's scratch, then the row
    float val[DPL];
    if (valid[rr]) prep::norm_rope_head(hin[rr], D, pp.n_rot, pp.eps, lane, qr, val);
#pragma unroll
    for (int u = 0; u < DPL; ++u) qr[lane + 32 * u] = valid[rr] ? val[u] * scale : 0.0f;
  }
  if (do_kv) {
    float kv[DPL];
    prep::norm_rope_head(kin, D, pp.n_rot, pp.eps, lane, kn, kv);
    const int64_t at = int64_t(layer) * r.n_ctx + r.pos, row_len = int64_t(n_head_kv) * D;
    uint16_t* ko = r.k + at * row_len + int64_t(hk) * D;  // [D]
    uint16_t* vo = r.v + at * row_len + int64_t(hk) * D;  // [D]
#pragma unroll
    for (int u = 0; u < DPL; ++u) {
      k_new[u] = __half_as_ushort(__float2half_rn(kv[u]));
      v_new[u] = __half_as_ushort(__float2half_rn(vv[u]));
      if (hc == 0) {
        ko[lane + 32 * u] = k_new[u];
        vo[lane + 32 * u] = v_new[u];
      }
    }
  }
}

// q: [n_tok][n_head][D] f32; refs: [n_tok] device; out: [n_tok][n_head][D] f32 (n_split == 1) or
// part: [n_tok*n_head][n_split][2 + D] (n_split > 1); xq: [n_tok][n_head * D] int8, xds: [n_tok][n_head * D / 32]:
// out as Q8 activations too (q8_kernels.cuh layout, the bits of q8::quantize of out), only with n_split == 1
// (else null). hg: query heads per block (<= R), n_hchunk:
// ceil(group / hg), tq: tokens per tile (tq * hg <= R). grid: (n_tiles * n_head_kv * n_hchunk, n_split) with
// blockIdx.x = (tile * n_head_kv + hk) * n_hchunk + hc; block 32*W threads; Layout::bytes of shared memory.
// select / cls: which tiles this launch takes, by the "class tile" of cls tokens holding the block's tile
// (cls a multiple of tq): all, only class tiles of one cache (the prefill shape), or only the others
// (the decode shape, for the tokens of mixed tiles).
// P (one token, select All, q null): the block prepares its query rows from pp.in as attn_prep does, and
// a block whose split holds the token's position prepares its K/V row too: it stores the row in the
// cache (hc == 0) and puts it into its shared-memory tile itself (that row is not copied from the cache,
// which this launch is writing). Why the same bits as attn_prep then this kernel: the same arithmetic
// (cuda/attn_prep_head.cuh), the same f16 rounding, and q times the scale as below.
template <int D, int RPW, int W, bool P>
__global__ void __launch_bounds__(32 * W, 1)
    attn_tile_kernel(const float* __restrict__ q, const ops::KvRef* __restrict__ refs, int64_t n_tok, int layer,
                     int n_head, int n_head_kv, int hg, int n_hchunk, int tq, float scale, int n_split, int chunk,
                     Select select, int cls, float* __restrict__ part, float* __restrict__ out,
                     int8_t* __restrict__ xq, float2* __restrict__ xds, Prep pp, bool cl_merge) {
  using L = Layout<D, RPW, W>;
  constexpr int R = L::R, KS = L::KS, DPL = D / 32, NT = 32 * W, C8 = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  float* qs = reinterpret_cast<float*>(smem + L::q_off);               // [R][D]
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem + L::k_off);         // [2][KT][KS]
  uint16_t* vs = reinterpret_cast<uint16_t*>(smem + L::v_off);         // [2][KT][D]
  float* ps = reinterpret_cast<float*>(smem + L::p_off);               // [W][RPW][KT]
  ops::KvRef* rs = reinterpret_cast<ops::KvRef*>(smem + L::r_off);     // [R]

  if constexpr (P && 32 * W == predict::kThreads) {
    // The expert predictor's blocks (expert_predict.cuh), after the attention's: the first row of the grid
    // runs them, the other splits' copies have nothing to do. (Blocks of another size: launch_shape adds
    // none.)
    if (pp.pf.on() && blockIdx.x >= gridDim.x - unsigned(pp.pf.blocks)) {
      if (blockIdx.y == 0) predict::run_block(pp.pf, int(blockIdx.x - (gridDim.x - unsigned(pp.pf.blocks))));
      return;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = n_head / n_head_kv;
  const int64_t bx = blockIdx.x;
  const int hc = static_cast<int>(bx % n_hchunk);
  const int hk = static_cast<int>((bx / n_hchunk) % n_head_kv);
  const int64_t t0 = bx / (int64_t(n_hchunk) * n_head_kv) * tq;  // first token of the tile
  const int split = blockIdx.y;
  const int n_t = static_cast<int>(n_tok - t0 < tq ? n_tok - t0 : tq);  // tokens in this tile (>= 1)
  const int h_first = hk * group + hc * hg;                        // query head of row r: h_first + r % hg
  const int64_t row_len = int64_t(n_head_kv) * D;  // halves per position in the cache (K and V alike)

  // Before the PDL wait (why: in decode this kernel is on the chain's critical path, and its first loads
  // were the refs, then the K/V rows from HBM): the tile's refs to shared memory (the pass's inputs are
  // uploaded, never written by a kernel of the stream), and for a one-token tile an L2 prefetch of the
  // K/V rows of its split (a prefetch is only a hint: the row attn_prep is writing may come in stale or
  // not, the copies below read the cache after the wait either way).
  for (int i = threadIdx.x; i < n_t; i += NT) rs[i] = refs[t0 + i];
  if (select != Select::All) {  // warp 0 checks the class tile: do its tokens share one cache?
    // (before the wait and the prefetch: refs are the pass's inputs. Why here: a prefill's decode-shape
    // launch has one block per token, head group and split, and all of them return; with the prefetch first
    // they took 33 us of a 512-token layer's attention (ncu, session 29) for nothing)
    __shared__ int s_one_cache;
    if (warp == 0) {
      const int64_t c0 = t0 / cls * cls, nc = n_tok - c0 < cls ? n_tok - c0 : cls;
      const ops::KvRef a = refs[c0];
      bool same = true;
      for (int64_t i = lane; i < nc; i += 32) {
        const ops::KvRef b = refs[c0 + i];
        same = same && b.k == a.k && b.v == a.v && b.n_ctx == a.n_ctx;
      }
      same = __all_sync(0xffffffffu, same);
      if (lane == 0) s_one_cache = same;
    }
    __syncthreads();
    if ((select == Select::OneCache) != (s_one_cache != 0)) {  // block-uniform: the other launch's tile
      pdl_wait();  // (pdl.cuh: before any return)
      return;
    }
  }
  __syncthreads();
  if (n_t == 1) {
    const ops::KvRef r0 = rs[0];
    const int lo = split * chunk, hi_x = split == n_split - 1 ? r0.pos + 1 : min(r0.pos + 1, lo + chunk);
    const uint16_t* kb = r0.k + int64_t(layer) * r0.n_ctx * row_len + int64_t(hk) * D;
    const uint16_t* vb = r0.v + int64_t(layer) * r0.n_ctx * row_len + int64_t(hk) * D;
    for (int e = threadIdx.x; e < 2 * (hi_x - lo); e += NT)  // one K or V row per thread
      prefetch_l2_range((e & 1 ? vb : kb) + int64_t(lo + e / 2) * row_len, int64_t(D) * 2);
  }
  TokenIn<RPW, DPL> tin;  // P: the prepared heads' loads
  if constexpr (P) {
    if (pp.early_weights) prepare_token_weights<D, RPW, DPL>(pp, hg, hc, int(n_head / n_head_kv), tin);
  }
  pdl_wait();  // (PDL: q and the KV cache come from earlier kernels)
  pdl_launch_dependents();

  float acc[RPW][DPL], m[RPW], l[RPW];  // per row: output sum, running max, this lane's part of the sum
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int j = 0; j < DPL; ++j) acc[rr][j] = 0.0f;
  }
  // P: whether this block holds the token's position (its K/V row prepared by warp 0, kept in registers
  // as f16 bits until the tile that holds it), and that position (-1: none; no row is skipped).
  bool own_new = false;
  int new_pos = -1;
  uint16_t k_new[DPL], v_new[DPL];
  if constexpr (P) {
    const int pos = rs[0].pos, lo = split * chunk;
    own_new = pos >= lo && (split == n_split - 1 || pos < lo + chunk);
    new_pos = own_new ? pos : -1;
  }

  for (int seg = 0; seg < n_t;) {  // runs of tokens sharing a cache; block-uniform
    const ops::KvRef r0 = rs[seg];
    int end = seg + 1, hi = r0.pos;
    while (end < n_t && rs[end].k == r0.k && rs[end].v == r0.v && rs[end].n_ctx == r0.n_ctx) {
      hi = max(hi, rs[end].pos);
      ++end;
    }
    int posr[RPW];  // the row's last attended position in this run, -1 when the row is not in the run
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const int r = warp * RPW + rr, tt = r / hg;
      posr[rr] = tt >= seg && tt < end && hc * hg + r % hg < group ? rs[tt].pos : -1;
    }
    const uint16_t* kb = r0.k + int64_t(layer) * r0.n_ctx * row_len + int64_t(hk) * D;  // + p*row_len
    const uint16_t* vb = r0.v + int64_t(layer) * r0.n_ctx * row_len + int64_t(hk) * D;
    // Rows are 16-byte multiples (D % 8 == 0); only the cache base could be misaligned.
    const bool aligned = ((reinterpret_cast<uintptr_t>(r0.k) | reinterpret_cast<uintptr_t>(r0.v)) & 15u) == 0;
    const int lo = split * chunk;
    const int hi_x = split == n_split - 1 ? hi + 1 : min(hi + 1, lo + chunk);  // positions [lo, hi_x)

    auto issue = [&](int kv0, int buf) {  // K/V rows [kv0, kv0 + nt) into buffer buf, one commit group
      const int nt = min(KT, hi_x - kv0);
      uint16_t* kd = ks + buf * KT * KS;
      uint16_t* vd = vs + buf * KT * D;
      for (int e = threadIdx.x; e < nt * C8; e += NT) {
        const int p = e / C8, c = (e % C8) * 8;
        if constexpr (P) {
          if (kv0 + p == new_pos) continue;  // prepared by this block (below)
        }
        const uint16_t* kg = kb + int64_t(kv0 + p) * row_len + c;
        const uint16_t* vg = vb + int64_t(kv0 + p) * row_len + c;
        if (aligned) {
          __pipeline_memcpy_async(kd + p * KS + c, kg, 16);
          __pipeline_memcpy_async(vd + p * D + c, vg, 16);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            kd[p * KS + c + j] = kg[j];
            vd[p * D + c + j] = vg[j];
          }
        }
      }
      __pipeline_commit();
    };

    if (lo < hi_x) issue(lo, 0);
    if (P && seg == 0) {  // q prepared into shared memory (and the token's K/V) while the copies fly
      prepare_token<D, RPW, DPL>(pp, rs[0], layer, n_head_kv, hg, hc, hk, group, h_first, scale, own_new, qs,
                                 reinterpret_cast<float*>(smem + L::kn_off), k_new, v_new, tin, pp.early_weights);
      pdl_mark();  // (traced builds: q normed and rotated, the token's K/V prepared)
    } else if (seg == 0) {  // q to shared memory while the first K/V tile's copies are in flight; every read
                            // of qs follows the barrier after those copies land
      for (int e = threadIdx.x; e < R * D; e += NT) {
        const int r = e / D, d = e % D, tt = r / hg, g = hc * hg + r % hg;
        qs[e] = tt < n_t && g < group ? q[((t0 + tt) * n_head + h_first + r % hg) * D + d] * scale : 0.0f;
      }
    }
    int buf = 0;
    for (int kv0 = lo; kv0 < hi_x; kv0 += KT, buf ^= 1) {
      // Why double buffering: the next tile's loads are in flight while this one is computed.
      const bool more = kv0 + KT < hi_x;
      if (more) {
        issue(kv0 + KT, buf ^ 1);  // that buffer was last read before the previous iteration's barrier
        __pipeline_wait_prior(1);
      } else {
        __pipeline_wait_prior(0);
      }
      if constexpr (P) {  // the token's own K/V row into its tile (the buffer's earlier reads ended at the
                          // barrier closing the iteration before last; the copies skip this row)
        if (warp == 0 && new_pos >= kv0 && new_pos < kv0 + KT) {
          uint16_t* kd = ks + buf * KT * KS + (new_pos - kv0) * KS;
          uint16_t* vd = vs + buf * KT * D + (new_pos - kv0) * D;
#pragma unroll
          for (int u = 0; u < DPL; ++u) {
            kd[lane + 32 * u] = k_new[u];
            vd[lane + 32 * u] = v_new[u];
          }
        }
      }
      __syncthreads();
      if (kv0 == lo) pdl_mark();  // (traced builds: the first tile in shared memory)
      // A warp none of whose rows attends a position of this tile (no head in the run: rows past the
      // group or the tile's tokens, or tokens whose position lies before it) skips to the barrier. Why:
      // the one-token shape at fewer heads a block (decode_heads()) leaves warps without a head, and their
      // scores took issue slots from the busy warps. The same sums: such a tile changes no row (its
      // scores are all -inf: the max stays, the factor is exactly 1, nothing is added).
      bool live = false;
#pragma unroll
      for (int rr = 0; rr < RPW; ++rr) live = live || posr[rr] >= kv0;
      if (live) {  // warp-uniform
        const int nt = min(KT, hi_x - kv0);
        const uint16_t* kt = ks + buf * KT * KS;
        const uint16_t* vt = vs + buf * KT * D;

        // Scores of positions kv0 + lane and kv0 + lane + 32 (rows past nt hold stale data: masked below).
        float sc[RPW][2];
#pragma unroll
        for (int rr = 0; rr < RPW; ++rr) sc[rr][0] = sc[rr][1] = 0.0f;
#pragma unroll 4
        for (int c = 0; c < C8; ++c) {
          float ka[8], kb2[8];
          load_f16<8>(kt + lane * KS + c * 8, ka);
          load_f16<8>(kt + (lane + 32) * KS + c * 8, kb2);
#pragma unroll
          for (int rr = 0; rr < RPW; ++rr) {
            const float* qr = qs + (warp * RPW + rr) * D + c * 8;
            const float4 q0 = *reinterpret_cast<const float4*>(qr), q1 = *reinterpret_cast<const float4*>(qr + 4);
            const float qv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              sc[rr][0] = fmaf(qv[j], ka[j], sc[rr][0]);
              sc[rr][1] = fmaf(qv[j], kb2[j], sc[rr][1]);
            }
          }
        }
        // Online softmax per row.
#pragma unroll
        for (int rr = 0; rr < RPW; ++rr) {
          const int a0 = kv0 + lane, a1 = kv0 + lane + 32;
          const float s0 = lane < nt && a0 <= posr[rr] ? sc[rr][0] : -INFINITY;
          const float s1 = lane + 32 < nt && a1 <= posr[rr] ? sc[rr][1] : -INFINITY;
          const float mn = fmaxf(m[rr], warp_max(fmaxf(s0, s1)));
          float c = 1.0f, e0 = 0.0f, e1 = 0.0f;
          if (mn != -INFINITY) {  // warp-uniform; -inf: no position of the row seen yet
            c = expf(m[rr] - mn);  // 0 while m was -inf
            e0 = expf(s0 - mn);
            e1 = expf(s1 - mn);
          }
          m[rr] = mn;
          l[rr] = l[rr] * c + e0 + e1;
#pragma unroll
          for (int j = 0; j < DPL; ++j) acc[rr][j] *= c;
          float* pw = ps + (warp * RPW + rr) * KT;
          pw[lane] = e0;
          pw[lane + 32] = e1;
        }
        __syncwarp();
        if (kv0 == lo) pdl_mark();  // (traced builds: the first tile's scores and softmax)
        // P.V: lane owns dims [lane*DPL, lane*DPL + DPL). A masked position is skipped, not multiplied
        // by 0 (an inf in V must not turn rows that do not attend it into NaN).
        // Positions go 4 at a time: one 16-byte broadcast read of a row's 4 weights instead of 4 reads.
        const float* pw0 = ps + warp * RPW * KT;  // [RPW][KT]
        int p = 0;
        for (; p + 4 <= nt; p += 4) {
          float vv[4][DPL];
#pragma unroll
          for (int i = 0; i < 4; ++i) load_f16<DPL>(vt + (p + i) * D + lane * DPL, vv[i]);
          const int a = kv0 + p;
#pragma unroll
          for (int rr = 0; rr < RPW; ++rr) {
            if (a > posr[rr]) continue;  // none of the 4 attended by this row
            const float4 w4 = *reinterpret_cast<const float4*>(pw0 + rr * KT + p);
            const float w[4] = {w4.x, w4.y, w4.z, w4.w};
            const bool all = a + 3 <= posr[rr];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              if (!all && a + i > posr[rr]) break;
#pragma unroll
              for (int j = 0; j < DPL; ++j) acc[rr][j] = fmaf(w[i], vv[i][j], acc[rr][j]);
            }
          }
        }
        for (; p < nt; ++p) {
          float vv[DPL];
          load_f16<DPL>(vt + p * D + lane * DPL, vv);
          const int a = kv0 + p;
#pragma unroll
          for (int rr = 0; rr < RPW; ++rr) {
            if (a > posr[rr]) continue;
            const float w = pw0[rr * KT + p];
#pragma unroll
            for (int j = 0; j < DPL; ++j) acc[rr][j] = fmaf(w, vv[j], acc[rr][j]);
          }
        }
        if (kv0 == lo && acc[0][0] != -2.f) pdl_mark();  // (traced builds: the first tile's P.V)
      }  // live
      __syncthreads();  // the buffer and p are rewritten next
    }
    seg = end;
  }

#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int r = warp * RPW + rr, tt = r / hg, g = hc * hg + r % hg;
    const float lt = warp_sum(l[rr]);
    if (tt >= n_t || g >= group) continue;  // warp-uniform
    const int64_t row = (t0 + tt) * n_head + h_first + r % hg;
    if (part == nullptr) {
      const float inv = lt == 0.0f ? 0.0f : 1.0f / lt;
      float o[DPL];
#pragma unroll
      for (int j = 0; j < DPL; ++j) {
        o[j] = acc[rr][j] * inv;
        out[row * D + lane * DPL + j] = o[j];
      }
      // Why here: with one split no combine kernel runs, and a separate quantize launch was one more
      // dependent step before wo (the row's 32-value blocks are whole within this warp's head).
      if (xq != nullptr) q8c::quantize_lanes<DPL>(o, xq + row * D, xds + row * (D / 32));
    } else {
      float* pp = part + (row * n_split + split) * (D + 2);
      if (lane == 0) {
        pp[0] = m[rr];
        pp[1] = lt;
      }
#pragma unroll
      for (int j = 0; j < DPL; ++j) pp[2 + lane * DPL + j] = acc[rr][j];
    }
  }
  // (cl_merge: one token, n_split blocks a cluster; launch_shape's. No block of such a launch returned early.)
  if (cl_merge) merge_splits<D>(part, n_split, split, t0 * n_head + h_first, min(hg, group - hc * hg), out, xq, xds);
  pdl_end();  // (traced builds: the block's end, and every block's in a histogram)
}

// ---------------------------------------------------------------- prefill on the tensor cores

// Dynamic shared memory of the tensor-core prefill kernel (R = 64 rows, 8 warps), every part 128-byte
// aligned at its start and 32-byte aligned at every 16x16 fragment (what wmma loads and stores need):
//   qh, ql: [64][D + 8] f16  Q*scale split in two halves: qh = f16(x), ql = f16((x - qh) * 2^11)
//   k, v:   [2][64][D + 8] f16, double buffered
//   s:      [64][64 + 4] f32  scores of the tile
//   ph, pl: [64][64 + 8] f16  softmax weights split as Q
//   o:      [64][D + 4] f32  the rows' output sums (rescaled in place by the online softmax)
//   refs:   [64] KvRef, then the class flag
// Why the split in two halves: f16 alone has 11 bits; hi + lo*2^-11 carries 22, so the products match
// the f32 path to ~1e-6 relative (K and V are f16 already, exact).
template <int D>
struct MmaLayout {
  static constexpr int R = 64, QS = D + 8, SS = KT + 4, PS = KT + 8, OS = D + 4;
  static constexpr size_t qh_off = 0;
  static constexpr size_t ql_off = qh_off + size_t(R) * QS * 2;
  static constexpr size_t k_off = ql_off + size_t(R) * QS * 2;
  static constexpr size_t v_off = k_off + size_t(2) * KT * QS * 2;
  static constexpr size_t s_off = v_off + size_t(2) * KT * QS * 2;
  static constexpr size_t ph_off = s_off + size_t(R) * SS * 4;
  static constexpr size_t pl_off = ph_off + size_t(R) * PS * 2;
  static constexpr size_t o_off = pl_off + size_t(R) * PS * 2;
  static constexpr size_t r_off = o_off + size_t(R) * OS * 4;
  static constexpr size_t flag_off = r_off + size_t(R) * sizeof(ops::KvRef);
  static constexpr size_t bytes = flag_off + 16;
  static_assert(ql_off % 128 == 0 && k_off % 128 == 0 && v_off % 128 == 0 && s_off % 128 == 0 &&
                ph_off % 128 == 0 && pl_off % 128 == 0 && o_off % 128 == 0 && r_off % 16 == 0);
};

// Same grid, parameters and outputs as attn_tile_kernel's prefill shape (hg * tq <= 64; select OneCache:
// tiles of one cache only, so one run per block), the token tiles taken from the last one. D: 64 or 128.
// Per K/V tile: S = Q.K^T on the tensor cores (each warp a 16-row x 32-position slab, hi and lo halves of
// Q), the online softmax per row by the row's warp (8 rows per warp, as the CUDA-core kernel), then
// O += P.V (each warp a 16-row x D/2 slab).
template <int D>
__global__ void __launch_bounds__(256, 1)
    attn_mma_kernel(const float* __restrict__ q, const ops::KvRef* __restrict__ refs, int64_t n_tok, int layer,
                    int n_head, int n_head_kv, int hg, int n_hchunk, int tq, float scale, int n_split, int chunk,
                    int cls, float* __restrict__ part, float* __restrict__ out) {
  namespace wm = nvcuda::wmma;
  using L = MmaLayout<D>;
  constexpr int R = L::R, QS = L::QS, SS = L::SS, PS = L::PS, OS = L::OS, NT = 256, C8 = D / 8, RPW = 8;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* qh = reinterpret_cast<__half*>(smem + L::qh_off);      // [R][QS]
  __half* ql = reinterpret_cast<__half*>(smem + L::ql_off);      // [R][QS]
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem + L::k_off);   // [2][KT][QS]
  uint16_t* vs = reinterpret_cast<uint16_t*>(smem + L::v_off);   // [2][KT][QS]
  float* ss = reinterpret_cast<float*>(smem + L::s_off);         // [R][SS]
  __half* ph = reinterpret_cast<__half*>(smem + L::ph_off);      // [R][PS]
  __half* pl = reinterpret_cast<__half*>(smem + L::pl_off);      // [R][PS]
  float* os = reinterpret_cast<float*>(smem + L::o_off);         // [R][OS]
  ops::KvRef* rs = reinterpret_cast<ops::KvRef*>(smem + L::r_off);
  int* flag = reinterpret_cast<int*>(smem + L::flag_off);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = n_head / n_head_kv;
  const int64_t bx = blockIdx.x;
  const int hc = static_cast<int>(bx % n_hchunk);
  const int hk = static_cast<int>((bx / n_hchunk) % n_head_kv);
  // The last token tile first: a prefill's tokens come in increasing positions, so the blocks that walk
  // the most K/V tiles start first and the short ones fill the SMs at the end (why: one block an SM, and
  // without a position split a 512-token prefill is 256 blocks of 1 to 64 tiles' work).
  const int64_t n_tiles = (n_tok + tq - 1) / tq;
  const int64_t t0 = (n_tiles - 1 - bx / (int64_t(n_hchunk) * n_head_kv)) * tq;
  const int split = blockIdx.y;
  const int n_t = static_cast<int>(n_tok - t0 < tq ? n_tok - t0 : tq);
  const int h_first = hk * group + hc * hg;
  if (warp == 0) {  // the class tile: only tiles of one cache are this kernel's (the decode shape takes the rest)
    const int64_t c0 = t0 / cls * cls, nc = n_tok - c0 < cls ? n_tok - c0 : cls;
    const ops::KvRef a = refs[c0];
    bool same = true;
    for (int64_t i = lane; i < nc; i += 32) {
      const ops::KvRef b = refs[c0 + i];
      same = same && b.k == a.k && b.v == a.v && b.n_ctx == a.n_ctx;
    }
    same = __all_sync(0xffffffffu, same);
    if (lane == 0) *flag = same;
  }
  __syncthreads();
  if (*flag == 0) return;  // block-uniform

  for (int i = threadIdx.x; i < n_t; i += NT) rs[i] = refs[t0 + i];
  for (int e = threadIdx.x; e < R * D; e += NT) {
    const int r = e / D, d = e % D, tt = r / hg, g = hc * hg + r % hg;
    const float x = tt < n_t && g < group ? q[((t0 + tt) * n_head + h_first + r % hg) * D + d] * scale : 0.0f;
    const __half h = __float2half_rn(x);
    qh[r * QS + d] = h;
    ql[r * QS + d] = __float2half_rn((x - __half2float(h)) * 2048.0f);
    os[r * OS + d] = 0.0f;
  }
  __syncthreads();

  float m[RPW], l[RPW];
  int posr[RPW];
  int hi = rs[0].pos;
  for (int i = 1; i < n_t; ++i) hi = max(hi, rs[i].pos);
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int r = warp * RPW + rr, tt = r / hg;
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
    posr[rr] = tt < n_t && hc * hg + r % hg < group ? rs[tt].pos : -1;
  }
  const ops::KvRef r0 = rs[0];
  const int64_t row_len = int64_t(n_head_kv) * D;
  const uint16_t* kb = r0.k + int64_t(layer) * r0.n_ctx * row_len + int64_t(hk) * D;
  const uint16_t* vb = r0.v + int64_t(layer) * r0.n_ctx * row_len + int64_t(hk) * D;
  const bool aligned = ((reinterpret_cast<uintptr_t>(r0.k) | reinterpret_cast<uintptr_t>(r0.v)) & 15u) == 0;
  const int lo = split * chunk;
  const int hi_x = split == n_split - 1 ? hi + 1 : min(hi + 1, lo + chunk);

  auto issue = [&](int kv0, int buf) {  // rows [kv0, kv0 + nt); V rows past nt zeroed (0 * garbage = NaN)
    const int nt = min(KT, hi_x - kv0);
    uint16_t* kd = ks + buf * KT * QS;
    uint16_t* vd = vs + buf * KT * QS;
    for (int e = threadIdx.x; e < KT * C8; e += NT) {
      const int p = e / C8, c = (e % C8) * 8;
      if (p >= nt) {
        *reinterpret_cast<uint4*>(vd + p * QS + c) = make_uint4(0, 0, 0, 0);
        continue;
      }
      const uint16_t* kg = kb + int64_t(kv0 + p) * row_len + c;
      const uint16_t* vg = vb + int64_t(kv0 + p) * row_len + c;
      if (aligned) {
        __pipeline_memcpy_async(kd + p * QS + c, kg, 16);
        __pipeline_memcpy_async(vd + p * QS + c, vg, 16);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          kd[p * QS + c + j] = kg[j];
          vd[p * QS + c + j] = vg[j];
        }
      }
    }
    __pipeline_commit();
  };

  const int ti = warp >> 1;  // this warp's 16-row slab for both products
  if (lo < hi_x) issue(lo, 0);
  int buf = 0;
  for (int kv0 = lo; kv0 < hi_x; kv0 += KT, buf ^= 1) {
    const bool more = kv0 + KT < hi_x;
    if (more) {
      issue(kv0 + KT, buf ^ 1);
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    const int nt = min(KT, hi_x - kv0);
    const __half* kt = reinterpret_cast<const __half*>(ks + buf * KT * QS);
    const __half* vt = reinterpret_cast<const __half*>(vs + buf * KT * QS);
    {  // S[ti*16 .. +16][(warp&1)*32 .. +32] = Q . K^T
      wm::fragment<wm::matrix_a, 16, 16, 16, __half, wm::row_major> a_hi, a_lo;
      wm::fragment<wm::matrix_b, 16, 16, 16, __half, wm::col_major> b;
      wm::fragment<wm::accumulator, 16, 16, 16, float> c_hi[2], c_lo[2];
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        wm::fill_fragment(c_hi[jj], 0.0f);
        wm::fill_fragment(c_lo[jj], 0.0f);
      }
#pragma unroll
      for (int k = 0; k < D / 16; ++k) {
        wm::load_matrix_sync(a_hi, qh + ti * 16 * QS + k * 16, QS);
        wm::load_matrix_sync(a_lo, ql + ti * 16 * QS + k * 16, QS);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int j = (warp & 1) * 2 + jj;  // 16-position column tile
          wm::load_matrix_sync(b, kt + j * 16 * QS + k * 16, QS);  // K rows = columns of K^T
          wm::mma_sync(c_hi[jj], a_hi, b, c_hi[jj]);
          wm::mma_sync(c_lo[jj], a_lo, b, c_lo[jj]);
        }
      }
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
        for (int e = 0; e < c_hi[jj].num_elements; ++e) c_hi[jj].x[e] += c_lo[jj].x[e] * (1.0f / 2048.0f);
        wm::store_matrix_sync(ss + ti * 16 * SS + ((warp & 1) * 2 + jj) * 16, c_hi[jj], SS, wm::mem_row_major);
      }
    }
    __syncthreads();
    // Online softmax: this warp's 8 rows; rows of stale positions (>= nt) or past the row's pos masked.
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const int row = warp * RPW + rr;
      const int a0 = kv0 + lane, a1 = kv0 + lane + 32;
      const float s0 = lane < nt && a0 <= posr[rr] ? ss[row * SS + lane] : -INFINITY;
      const float s1 = lane + 32 < nt && a1 <= posr[rr] ? ss[row * SS + lane + 32] : -INFINITY;
      const float mn = fmaxf(m[rr], warp_max(fmaxf(s0, s1)));
      float c = 1.0f, e0 = 0.0f, e1 = 0.0f;
      if (mn != -INFINITY) {
        c = expf(m[rr] - mn);
        e0 = expf(s0 - mn);
        e1 = expf(s1 - mn);
      }
      m[rr] = mn;
      l[rr] = l[rr] * c + e0 + e1;
      if (c != 1.0f)  // warp-uniform
        for (int d = lane; d < D; d += 32) os[row * OS + d] *= c;
      const __half h0 = __float2half_rn(e0), h1 = __float2half_rn(e1);
      ph[row * PS + lane] = h0;
      ph[row * PS + lane + 32] = h1;
      pl[row * PS + lane] = __float2half_rn((e0 - __half2float(h0)) * 2048.0f);
      pl[row * PS + lane + 32] = __float2half_rn((e1 - __half2float(h1)) * 2048.0f);
    }
    __syncthreads();
    {  // O[ti*16 .. +16][(warp&1)*D/2 .. +D/2] += P . V
      constexpr int NJ = D / 32;  // 16-dim column tiles per warp
      wm::fragment<wm::matrix_a, 16, 16, 16, __half, wm::row_major> a_hi, a_lo;
      wm::fragment<wm::matrix_b, 16, 16, 16, __half, wm::row_major> b;
      wm::fragment<wm::accumulator, 16, 16, 16, float> o_hi[NJ], o_lo[NJ];
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        wm::load_matrix_sync(o_hi[jj], os + ti * 16 * OS + ((warp & 1) * NJ + jj) * 16, OS, wm::mem_row_major);
        wm::fill_fragment(o_lo[jj], 0.0f);
      }
#pragma unroll
      for (int k = 0; k < KT / 16; ++k) {
        wm::load_matrix_sync(a_hi, ph + ti * 16 * PS + k * 16, PS);
        wm::load_matrix_sync(a_lo, pl + ti * 16 * PS + k * 16, PS);
#pragma unroll
        for (int jj = 0; jj < NJ; ++jj) {
          wm::load_matrix_sync(b, vt + k * 16 * QS + ((warp & 1) * NJ + jj) * 16, QS);
          wm::mma_sync(o_hi[jj], a_hi, b, o_hi[jj]);
          wm::mma_sync(o_lo[jj], a_lo, b, o_lo[jj]);
        }
      }
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
#pragma unroll
        for (int e = 0; e < o_hi[jj].num_elements; ++e) o_hi[jj].x[e] += o_lo[jj].x[e] * (1.0f / 2048.0f);
        wm::store_matrix_sync(os + ti * 16 * OS + ((warp & 1) * NJ + jj) * 16, o_hi[jj], OS, wm::mem_row_major);
      }
    }
    __syncthreads();  // buffers, s, p and o are rewritten next
  }

#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int r = warp * RPW + rr, tt = r / hg, g = hc * hg + r % hg;
    const float lt = warp_sum(l[rr]);
    if (tt >= n_t || g >= group) continue;
    const int64_t row = (t0 + tt) * n_head + h_first + r % hg;
    if (part == nullptr) {
      const float inv = lt == 0.0f ? 0.0f : 1.0f / lt;
      for (int d = lane; d < D; d += 32) out[row * D + d] = os[r * OS + d] * inv;
    } else {
      float* pp = part + (row * n_split + split) * (D + 2);
      if (lane == 0) {
        pp[0] = m[rr];
        pp[1] = lt;
      }
      for (int d = lane; d < D; d += 32) pp[2 + d] = os[r * OS + d];
    }
  }
}

// Lets `kernel` use `bytes` of dynamic shared memory on the current device (set once per device).
template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  set_kernel_attribute_once(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(bytes));
}

template <int D>
void launch_mma(const float* q, const ops::KvRef* refs, int64_t n_tok, int layer, int n_head, int n_head_kv, int hg,
                int tq, float scale, int n_split, int chunk, float* part, float* out, cudaStream_t stream) {
  using L = MmaLayout<D>;
  const int group = n_head / n_head_kv, n_hchunk = (group + hg - 1) / hg;
  const int64_t blocks = (n_tok + tq - 1) / tq * n_head_kv * n_hchunk;
  STRATA_REQUIRE(blocks <= INT32_MAX, "attention: {} tokens x {} heads is too many blocks", n_tok, n_head);
  auto kernel = attn_mma_kernel<D>;
  allow_shared(kernel, L::bytes);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(n_split));
  kernel<<<grid, 256, L::bytes, stream>>>(q, refs, n_tok, layer, n_head, n_head_kv, hg, n_hchunk, tq, scale, n_split,
                                          chunk, tq, n_split > 1 ? part : nullptr, out);
  CUDA_CHECK_LAUNCH();
}

// The decode shape's warps: 8 warps of 1 query row (the default) or, with STRATA_CUDA_ATTN_DECODE_WARPS=4
// (read once), 4 warps of 2 rows: the same 8 rows and K/V tiles, the same values. Why 8: a one-token
// block's time is its chain of scores, softmax and P.V over the split's positions, and 8 warps halve each
// warp's part. H200, 48-layer 30B-A3B geometry fully resident (session 17, alternating in one call):
// 498.4 and 515.4 tok/s against 492.8 and 490.3 with 4 warps; 25% resident 98.2 against 97.3.
bool decode_wide() {
  static const bool on = [] {
    const char* e = std::getenv("STRATA_CUDA_ATTN_DECODE_WARPS");
    return e == nullptr || std::string(e) != "4";
  }();
  return on;
}

// The one-token decode shape's query heads a block (STRATA_CUDA_ATTN_DECODE_HEADS, attn_tile.cuh).
DigitSetting g_decode_heads("STRATA_CUDA_ATTN_DECODE_HEADS", "one-token attention heads a block", 1, kDecodeRows,
                            kDefaultDecodeHeads);

std::atomic<bool> g_prefill_mma{true};  // on: passes every attention test and ran 2.5-3x faster than the CUDA-core kernel on the H200 (bench/results/2026-11-29-gpu-kernels-h200.md)

// pdl::launch in clusters of (1, cl_y, 1) blocks (cl_y 1: pdl::launch itself).
template <typename... KArgs, typename... Args>
void launch_pdl_clusters(unsigned cl_y, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, Args&&... args) {
  if (cl_y <= 1) return pdl::launch(kernel, grid, block, smem, stream, std::forward<Args>(args)...);
  LaunchAttrs attrs;
  const cudaLaunchConfig_t cfg = cluster_launch_config(grid, block, dim3(1, cl_y, 1), smem, stream,
                                                       pdl::enabled() && !pdl::plain_launches(), attrs);
  pdl::prefer_carveout(reinterpret_cast<const void*>(kernel));
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// hg, tq: query heads and tokens per block (tq * hg <= R); select, cls: as the kernel. prep: the kernel
// with P (one token; the decode shape only). cl_merge: one token, the splits merged in clusters of n_split
// blocks (merge_splits) instead of by the combine kernel.
template <int D, int RPW, int W>
void launch_shape(const float* q, const ops::KvRef* refs, int64_t n_tok, int layer, int n_head, int n_head_kv,
                  int hg, int tq, Select select, int cls, float scale, int n_split, int chunk, float* part,
                  float* out, int8_t* xq, float2* xds, cudaStream_t stream, const Prep* prep, bool cl_merge) {
  using L = Layout<D, RPW, W>;
  const int group = n_head / n_head_kv, n_hchunk = (group + hg - 1) / hg;
  const int64_t n_tiles = (n_tok + tq - 1) / tq;
  const int64_t blocks = n_tiles * n_head_kv * n_hchunk;
  STRATA_REQUIRE(blocks <= INT32_MAX - predict::kMaxBlocks, "attention: {} tokens x {} heads is too many blocks", n_tok,
                 n_head);
  const bool pf = prep != nullptr && prep->pf.on() && 32 * W == predict::kThreads;
  if (pf) predict::check(prep->pf);
  STRATA_REQUIRE(!cl_merge || (n_tok == 1 && select == Select::All && n_split >= 2 && n_split <= kMaxMergeCluster &&
                               !pf),
                 "attention tile kernel: a cluster merge of {} tokens, {} splits", n_tok, n_split);
  const dim3 grid(static_cast<unsigned>(blocks + (pf ? prep->pf.blocks : 0)), static_cast<unsigned>(n_split));
  auto run = [&](auto kernel, size_t bytes, const Prep& pp) {
    allow_shared(kernel, bytes);
    launch_pdl_clusters(cl_merge ? unsigned(n_split) : 1u, kernel, grid, 32 * W, bytes, stream, q, refs, n_tok, layer,
                        n_head, n_head_kv, hg, n_hchunk, tq, scale, n_split, chunk, select, cls,
                        n_split > 1 ? part : nullptr, out, xq, xds, pp, cl_merge);
  };
  if constexpr (RPW * W == kDecodeRows) {
    if (prep != nullptr) return run(attn_tile_kernel<D, RPW, W, true>, L::prep_bytes(), *prep);
  }
  STRATA_REQUIRE(prep == nullptr, "attention tile kernel: the prepared token takes the decode shape");
  run(attn_tile_kernel<D, RPW, W, false>, L::bytes, Prep{});
}

}  // namespace

void set_decode_heads(int heads) { g_decode_heads.set(heads); }
int decode_heads() { return g_decode_heads.get(); }

void set_prefill_mma(bool on) { g_prefill_mma.store(on); }
bool prefill_mma() { return g_prefill_mma.load(); }

bool supported(int head_dim, int head_dim_v) {
  return head_dim == head_dim_v && (head_dim == 64 || head_dim == 128 || head_dim == 256);
}

bool launch(const float* q, const ops::KvRef* refs, int64_t n_tok, int layer, int n_head, int n_head_kv,
            int head_dim, float scale, int n_split, int chunk, float* part, float* out, int8_t* xq, float2* xds,
            cudaStream_t stream, const Prep* prep, bool one_cache, bool cl_merge) {
  STRATA_REQUIRE(supported(head_dim, head_dim) && n_split >= 1 && n_split <= 65535 && chunk % KT == 0,
                 "attention tile kernel: head size {}, {} splits of {}", head_dim, n_split, chunk);
  STRATA_REQUIRE(prep == nullptr || n_tok == 1, "attention tile kernel: {} tokens to prepare (one only)", n_tok);
  const int group = n_head / n_head_kv;
  // Decode shape: 8 warps x 1 row (or 4 x 2: decode_wide()) = one token's heads of a group of 8 (tq tokens
  // when the group is smaller).
  // One token: at most decode_heads() of them a block (the group's heads in more blocks).
  const int hg_d = std::min({group, kDecodeRows, n_tok == 1 ? decode_heads() : kDecodeRows});
  const int tq_d = std::max(1, kDecodeRows / hg_d);
  // Prefill shape: 8 warps x 8 rows (8 tokens x 8 heads); 8 x 4 at head size 256 (8 values per lane per
  // row). Its token tile is a multiple of the decode shape's so that every decode tile lies in one.
  const int rp = head_dim == 256 ? 32 : 64;
  const int hg_p = std::min(group, rp), tq_p = std::max(tq_d, rp / hg_p / tq_d * tq_d);
  const bool prefill = rows_per_block(n_tok) == kPrefillRows;
  const bool decode_shape = !(prefill && one_cache);  // (one cache: no mixed tile for the decode shape)
  // Why two launches for a prefill-sized call: tiles whose tokens share one cache (a prefill's) take the
  // prefill shape; the tokens of mixed tiles (a batch of decodes from many sequences) would each cost a
  // pass of a 64-row block there, so the decode shape takes them. Each launch skips the other's tiles.
  const Select sel_p = Select::OneCache, sel_d = prefill ? Select::Mixed : Select::All;
  const bool use_mma = prefill_mma() && head_dim <= 128;  // the mma kernel's shared memory: head size <= 128
  // Q8 output: one split (or the cluster merge), the decode shape alone (it then writes every row of out).
  const bool q8_out = xq != nullptr && (n_split == 1 || cl_merge) && !prefill;
  int8_t* const dq = q8_out ? xq : nullptr;
  float2* const dds = q8_out ? xds : nullptr;
#define STRATA_TILE_ARGS(hg, tq, sel, q8, ds, pr, cm) q, refs, n_tok, layer, n_head, n_head_kv, hg, tq, sel, tq_p, \
                                                      scale, n_split, chunk, part, out, q8, ds, stream, pr, cm
  switch (head_dim) {
    case 64:
      if (prefill && use_mma)
        launch_mma<64>(q, refs, n_tok, layer, n_head, n_head_kv, hg_p, tq_p, scale, n_split, chunk, part, out, stream);
      else if (prefill)
        launch_shape<64, 8, 8>(STRATA_TILE_ARGS(hg_p, tq_p, sel_p, nullptr, nullptr, nullptr, false));
      if (!decode_shape) break;
      if (decode_wide()) launch_shape<64, 1, 8>(STRATA_TILE_ARGS(hg_d, tq_d, sel_d, dq, dds, prep, cl_merge));
      else launch_shape<64, 2, 4>(STRATA_TILE_ARGS(hg_d, tq_d, sel_d, dq, dds, prep, cl_merge));
      break;
    case 128:
      if (prefill && use_mma)
        launch_mma<128>(q, refs, n_tok, layer, n_head, n_head_kv, hg_p, tq_p, scale, n_split, chunk, part, out,
                        stream);
      else if (prefill)
        launch_shape<128, 8, 8>(STRATA_TILE_ARGS(hg_p, tq_p, sel_p, nullptr, nullptr, nullptr, false));
      if (!decode_shape) break;
      if (decode_wide()) launch_shape<128, 1, 8>(STRATA_TILE_ARGS(hg_d, tq_d, sel_d, dq, dds, prep, cl_merge));
      else launch_shape<128, 2, 4>(STRATA_TILE_ARGS(hg_d, tq_d, sel_d, dq, dds, prep, cl_merge));
      break;
    default:
      if (prefill) launch_shape<256, 4, 8>(STRATA_TILE_ARGS(hg_p, tq_p, sel_p, nullptr, nullptr, nullptr, false));
      if (!decode_shape) break;
      if (decode_wide()) launch_shape<256, 1, 8>(STRATA_TILE_ARGS(hg_d, tq_d, sel_d, dq, dds, prep, cl_merge));
      else launch_shape<256, 2, 4>(STRATA_TILE_ARGS(hg_d, tq_d, sel_d, dq, dds, prep, cl_merge));
      break;
  }
#undef STRATA_TILE_ARGS
  return q8_out;
}

}  // namespace strata::cuda::attn_tile
