// Routed experts of one MoE layer as grouped GEMMs for prefill (contract and why: moe_kernels.cuh,
// moe_experts_grouped). Every step runs on the device from the residency table and the routing, so the
// host enqueues a fixed list of launches and never waits:
//   sort_kernel    counts[e]     = resident pairs routed to e                    (block per expert)
//                  offsets[e]    = first sorted position of e's pairs; tile_start[e] = its first tile
//                  perm[pos] = p, inv[p] = pos, stable (pairs of an expert in increasing p)
//   the products, by one of three kernels (moe_grouped_kernel()):
//     2 (the default) and 1: mma::grouped_mma_staged_kernel / grouped_mma_kernel (moe_grouped_mma.cuh):
//       tiles of 64 pairs, x in bf16 once (convert16), A (and for 2 the raw weights) by cp.async,
//       weights dequantized straight into mma.sync fragments, h in bf16;
//     0 grouped_kernel below: one block per (32-pair tile, 64 output rows): A = 32 gathered f32 input rows,
//       B = 64 weight rows dequantized in registers, both as bf16 in shared memory, WMMA 16x16x16;
//     both f32 accumulate; the mma kernel needs n_embd and n_ff multiples of 128 (else the WMMA kernel runs)
//   combine_kernel out[t] = sum_j in order wts * y[inv[t*k+j]]
// The grid of a product has the most tiles any routing can need (ceil(P/T) + min(n_expert, P) for P
// pairs and tiles of T); blocks past the routing's real tile count return at once.
#include <mma.h>

#include <cuda_bf16.h>

#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <string>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/convert16.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/dequant_device.cuh"
#include "cuda/moe_grouped_mma.cuh"
#include "cuda/moe_kernels.cuh"
#include "cuda/ops.cuh"
#include "cuda/smem_cap.cuh"

namespace strata::cuda::moe {
namespace {

constexpr int kMt = 32;        // pairs per tile (rows of A)
constexpr int kNt = 64;        // output rows per block (weight rows)
constexpr int kKc = 32;        // columns per shared-memory step
constexpr int kLd = kKc + 8;   // bf16 row pitch in shared memory (80 bytes: rows of 16 stay 32-byte aligned)
constexpr int kLdc = kNt + 4;  // f32 pitch of the accumulator staging
constexpr int kThreads = 128;  // 4 warps: warp w owns output rows [16w, 16w+16) of the block's 64

__device__ __forceinline__ bool resident(const int32_t* table, int n_expert, int32_t e) {
  return e >= 0 && e < n_expert && table[e] >= 0;
}

// The counting sort of the pairs by expert, one launch (grid: n_expert blocks of kSortThreads; n_expert <=
// kSortMaxExperts). Every block builds the histogram of resident experts over all pairs in shared memory,
// then block e writes
//   counts[e]     = resident pairs routed to e (0 when e is not resident),
//   offsets[e]    = first sorted position of e's pairs (the sum of counts below e),
//   tile_start[e] = its first tile of `mt` pairs (the sum of ceil(count / mt) below e),
// block 0 also offsets[n_expert] and tile_start[n_expert] (the totals), and then places e's pairs:
// perm[offsets[e] + rank] = p, inv[p] = that position, rank = number of earlier pairs of e (stable). Why one
// launch: three (count, a one-thread scan, place), each walking the pairs in 256-pair steps with barriers
// between, took 21.3 us of a 512-token layer (ncu, session 29); a block now loads kSortPer pairs a thread at
// once and ranks them with one block scan.
constexpr int kSortThreads = 256, kSortPer = 16, kSortMaxExperts = 4096;
__global__ void __launch_bounds__(kSortThreads)
    sort_kernel(const int32_t* __restrict__ table, int n_expert, const int32_t* __restrict__ ids, int64_t n_pairs,
                int mt, int32_t* __restrict__ counts, int32_t* __restrict__ offsets, int32_t* __restrict__ tile_start,
                int32_t* __restrict__ perm, int32_t* __restrict__ inv) {
  using Scan = cub::BlockScan<int, kSortThreads>;
  using Reduce = cub::BlockReduce<int, kSortThreads>;
  __shared__ int hist[kSortMaxExperts];  // resident pairs per expert
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } tmp;
  const int e = blockIdx.x;
  for (int i = threadIdx.x; i < n_expert; i += kSortThreads) hist[i] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n_pairs; p += kSortThreads) {
    const int32_t id = ids[p];
    if (resident(table, n_expert, id)) atomicAdd(&hist[id], 1);
  }
  __syncthreads();
  // Sums over the experts below e (and over all of them, which block 0 writes).
  int below = 0, tiles_below = 0, all = 0, tiles_all = 0;
  for (int i = threadIdx.x; i < n_expert; i += kSortThreads) {
    const int c = hist[i], t = (c + mt - 1) / mt;
    if (i < e) below += c, tiles_below += t;
    all += c, tiles_all += t;
  }
  below = Reduce(tmp.reduce).Sum(below);
  __syncthreads();
  tiles_below = Reduce(tmp.reduce).Sum(tiles_below);
  __syncthreads();
  if (e == 0) {
    all = Reduce(tmp.reduce).Sum(all);
    __syncthreads();
    tiles_all = Reduce(tmp.reduce).Sum(tiles_all);
    __syncthreads();
  }
  __shared__ int s_below;
  if (threadIdx.x == 0) {
    counts[e] = hist[e];
    offsets[e] = below, tile_start[e] = tiles_below;
    if (e == 0) offsets[n_expert] = all, tile_start[n_expert] = tiles_all;
    s_below = below;
  }
  __syncthreads();
  if (hist[e] == 0) return;  // block-uniform: no pair to place (e.g. e not resident)
  int base = s_below;
  for (int64_t p0 = 0; p0 < n_pairs; p0 += int64_t(kSortThreads) * kSortPer) {
    const int64_t q = p0 + int64_t(threadIdx.x) * kSortPer;  // this thread's kSortPer consecutive pairs
    unsigned mine = 0;
#pragma unroll
    for (int j = 0; j < kSortPer; ++j) mine |= unsigned(q + j < n_pairs && ids[q + j] == e) << j;
    int before, total;
    Scan(tmp.scan).ExclusiveSum(__popc(mine), before, total);
    __syncthreads();  // tmp is reused by the next step's scan
#pragma unroll
    for (int j = 0; j < kSortPer; ++j)
      if (mine >> j & 1u) {
        const int pos = base + before + __popc(mine & ((1u << j) - 1u));
        perm[pos] = int32_t(q + j);
        inv[q + j] = pos;
      }
    base += total;
  }
}

// One block: tile `blockIdx.x` of the routing (expert e, pairs at sorted positions pos0 .. pos0+cnt) times
// weight rows [r0, r0 + 64) of the expert's tensor(s) at off0 (and off1 for kGateUp), W: [rows][K].
//   kGateUp/kGateOnly/kUpApply: A row i = x[perm[pos0+i] / k]  (in = x: [n][K]),  out = h: [P][rows]
//   kDown:                      A row i = h[pos0 + i]          (in = h: [P][K]),  out = y: [P][rows]
// Writes: kGateUp h = silu(gate)*up; kGateOnly h = gate; kUpApply h = silu(h)*up; kDown y = down.
template <typename F>
__global__ void __launch_bounds__(kThreads)
    grouped_kernel(const uint8_t* __restrict__ slots, int64_t slot_bytes, int64_t off0, int64_t off1,
                   int64_t row_bytes, int64_t K, int64_t rows, const int32_t* __restrict__ table, int n_expert,
                   const int32_t* __restrict__ counts, const int32_t* __restrict__ offsets,
                   const int32_t* __restrict__ tile_start, const int32_t* __restrict__ perm, int k,
                   const float* __restrict__ in, bool invec, float* __restrict__ out, int mode) {
  namespace wm = nvcuda::wmma;
  constexpr int A = F::kAlign;
  __shared__ __align__(128) __nv_bfloat16 As[kMt][kLd];
  __shared__ __align__(128) __nv_bfloat16 Bs[2][kNt][kLd];
  __shared__ __align__(128) float Cs[2][kMt][kLdc];
  __shared__ int64_t src_row[kMt];

  const int tile = blockIdx.x;
  if (tile >= tile_start[n_expert]) return;
  int lo = 0, hi = n_expert - 1;  // e = the largest with tile_start[e] <= tile (it owns the tile)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_start[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  const int e = lo;
  const int t_in = tile - tile_start[e];
  const int pos0 = offsets[e] + t_in * kMt;
  const int cnt = min(kMt, counts[e] - t_in * kMt);
  const int64_t r0 = int64_t(blockIdx.y) * kNt;
  const uint8_t* base = slots + int64_t(table[e]) * slot_bytes;
  const bool dual = mode == kGateUp;
  if (threadIdx.x < kMt) {
    const int i = threadIdx.x;
    src_row[i] = i < cnt ? (mode == kDown ? int64_t(pos0 + i) : int64_t(perm[pos0 + i] / k)) : -1;
  }
  __syncthreads();

  const int warp = threadIdx.x >> 5;
  wm::fragment<wm::accumulator, 16, 16, 16, float> acc[2][2];  // [tensor][16-row half of the tile]
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int m = 0; m < 2; ++m) wm::fill_fragment(acc[a][m], 0.f);

  for (int64_t k0 = 0; k0 < K; k0 += kKc) {
    {  // A: 32 rows x 32 columns, 8 values per thread
      const int i = threadIdx.x >> 2, c8 = (threadIdx.x & 3) * 8;
      const int64_t sr = src_row[i];
      float v[8];
      if (sr >= 0) dq::load_x8(in + sr * K, k0 + c8, invec, v);
      else
#pragma unroll
        for (int q = 0; q < 8; ++q) v[q] = 0.f;
#pragma unroll
      for (int q = 0; q < 8; ++q) As[i][c8 + q] = __float2bfloat16_rn(v[q]);
    }
    // B: 64 weight rows x 32 columns = 256 units of 8 values, 2 per thread (per tensor)
    for (int uu = threadIdx.x; uu < kNt * (kKc / 8); uu += kThreads) {
      const int i = uu / (kKc / 8), c8 = (uu % (kKc / 8)) * 8;
      const int64_t r = r0 + i, c = k0 + c8;
      const int64_t blk = c / F::kVals;
      const int i8 = int((c % F::kVals) / 8);
      for (int s = 0; s < (dual ? 2 : 1); ++s) {
        float v[8];
        if (r < rows) F::template deq8<A>(base + (s ? off1 : off0) + r * row_bytes + blk * F::kBytes, i8, v);
        else
#pragma unroll
          for (int q = 0; q < 8; ++q) v[q] = 0.f;
#pragma unroll
        for (int q = 0; q < 8; ++q) Bs[s][i][c8 + q] = __float2bfloat16_rn(v[q]);
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kKc; kk += 16) {
      wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> a0, a1;
      wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major> b;
      wm::load_matrix_sync(a0, &As[0][kk], kLd);
      wm::load_matrix_sync(a1, &As[16][kk], kLd);
      wm::load_matrix_sync(b, &Bs[0][warp * 16][kk], kLd);
      wm::mma_sync(acc[0][0], a0, b, acc[0][0]);
      wm::mma_sync(acc[0][1], a1, b, acc[0][1]);
      if (dual) {
        wm::load_matrix_sync(b, &Bs[1][warp * 16][kk], kLd);
        wm::mma_sync(acc[1][0], a0, b, acc[1][0]);
        wm::mma_sync(acc[1][1], a1, b, acc[1][1]);
      }
    }
    __syncthreads();
  }
  // Constant fragment indices only (a runtime index would put the accumulators in local memory).
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    wm::store_matrix_sync(&Cs[0][16 * m][warp * 16], acc[0][m], kLdc, wm::mem_row_major);
    if (dual) wm::store_matrix_sync(&Cs[1][16 * m][warp * 16], acc[1][m], kLdc, wm::mem_row_major);
  }
  __syncthreads();
  for (int q = threadIdx.x; q < kMt * kNt; q += kThreads) {
    const int i = q / kNt, j = q % kNt;
    const int64_t r = r0 + j;
    if (i >= cnt || r >= rows) continue;
    float* o = out + int64_t(pos0 + i) * rows + r;
    const float a = Cs[0][i][j];
    if (mode == kGateUp) *o = silu(a) * Cs[1][i][j];
    else if (mode == kUpApply) *o = silu(*o) * a;
    else *o = a;  // kGateOnly, kDown
  }
}

// out[t][c] = sum over j < k (resident, increasing j) of wts[t*k+j] * y[inv[t*k+j]][c]; Acc: out[t][c] +=
// that sum (the same float addition as the sum written apart, then an add).
// Grid: x = column blocks of kCombineThreads, y = tokens (grid-stride). The block first looks up the
// token's pairs (whether resident, their y row and weight) into shared memory, kCombineChunk at a time, so
// that each thread's loads of y are independent (why: one lookup chain ids -> table -> inv per pair, then
// the load of y, made every pair a dependent round trip; ncu, session 29: 22.7 us a 512-token layer).
constexpr int kCombineThreads = 256, kCombineChunk = 32;
template <bool Acc>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const int32_t* __restrict__ table, int n_expert, const int32_t* __restrict__ ids,
                   const float* __restrict__ wts, const int32_t* __restrict__ inv, const float* __restrict__ y,
                   int64_t n, int k, int64_t n_embd, float* __restrict__ out) {
  __shared__ int64_t s_row[kCombineChunk];  // y's row offset of pair j, -1: not resident
  __shared__ float s_w[kCombineChunk];
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    float acc = 0.f;
    for (int j0 = 0; j0 < k; j0 += kCombineChunk) {
      const int nj = min(kCombineChunk, k - j0);
      __syncthreads();  // the previous chunk's reads of s_row / s_w are done
      if (int(threadIdx.x) < nj) {
        const int64_t p = t * k + j0 + threadIdx.x;
        const bool r = resident(table, n_expert, ids[p]);
        s_row[threadIdx.x] = r ? int64_t(inv[p]) * n_embd : -1;
        s_w[threadIdx.x] = wts[p];
      }
      __syncthreads();
      if (c < n_embd) {
#pragma unroll 8
        for (int j = 0; j < nj; ++j)
          if (s_row[j] >= 0) acc += s_w[j] * y[s_row[j] + c];
      }
    }
    if (c < n_embd) out[t * n_embd + c] = Acc ? out[t * n_embd + c] + acc : acc;
  }
}

// Scratch regions, each 256-byte aligned, for P = n * k pairs.
struct Layout {
  size_t counts, offsets, tile_start, perm, inv, h, y, xb, hb, total;
};
Layout layout(const ExpertLayerView& v, int n_expert, int64_t n, int k) {
  const size_t P = size_t(n) * size_t(k);
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  Layout L{};
  size_t at = 0;
  L.counts = at, at += up(size_t(n_expert) * 4);
  L.offsets = at, at += up(size_t(n_expert + 1) * 4);
  L.tile_start = at, at += up(size_t(n_expert + 1) * 4);
  L.perm = at, at += up(P * 4);
  L.inv = at, at += up(P * 4);
  L.h = at, at += up(P * size_t(v.n_ff) * 4);
  L.y = at, at += up(P * size_t(v.n_embd) * 4);
  L.xb = at, at += up(size_t(n) * size_t(v.n_embd) * 2);
  L.hb = at, at += up(P * size_t(v.n_ff) * 2);
  L.total = at;
  return L;
}

// The tensor at `off` of every slot has rows aligned to its format's block alignment.
bool rows_aligned(GgmlType t, const ExpertLayerView& v, int64_t off, int64_t cols) {
  bool ok = false;
  const int64_t rb = int64_t(row_bytes(t, cols));
  dq::dispatch(t, [&](auto f) {
    using F = decltype(f);
    ok = dq::aligned_for<F>(v.slots + off, rb) && v.slot_bytes % F::kAlign == 0;
  });
  return ok;
}

DigitSetting g_grouped_kernel("STRATA_CUDA_MOE_GROUPED", "grouped expert kernel", 0, 2, 2);
DigitSetting g_grouped_stages("STRATA_CUDA_MOE_GROUPED_STAGES", "staged grouped kernel's ring", 2, 3, 3);

}  // namespace

void set_moe_grouped_kernel(int which) { g_grouped_kernel.set(which); }
int moe_grouped_kernel() { return g_grouped_kernel.get(); }
void set_moe_grouped_stages(int stages) { g_grouped_stages.set(stages); }
int moe_grouped_stages() { return g_grouped_stages.get(); }

bool moe_grouped_supported(const ExpertLayerView& v) {
  check_expert_view(v, "moe_grouped_supported", 0, 1);
  return v.n_embd % kKc == 0 && v.n_ff % kKc == 0 && rows_aligned(v.gate_type, v, v.gate_off, v.n_embd) &&
         rows_aligned(v.up_type, v, v.up_off, v.n_embd) && rows_aligned(v.down_type, v, v.down_off, v.n_ff);
}

size_t moe_grouped_scratch_bytes(const ExpertLayerView& v, int n_expert, int64_t max_n, int k) {
  STRATA_REQUIRE(n_expert > 0 && max_n >= 0 && k > 0 && v.n_embd > 0 && v.n_ff > 0,
                 "moe grouped scratch: bad sizes n_expert {} max_n {} k {} n_embd {} n_ff {}", n_expert, max_n, k,
                 v.n_embd, v.n_ff);
  return layout(v, n_expert, max_n, k).total;
}

void moe_experts_grouped(const ExpertLayerView& v, const int32_t* table, int n_expert, const float* x,
                         const int32_t* ids, const float* wts, int64_t n, int k, float* out, void* scratch,
                         size_t scratch_bytes, cudaStream_t stream, bool accumulate) {
  check_expert_view(v, "moe_experts_grouped", n, k);
  STRATA_REQUIRE(v.direct == nullptr || v.direct_share == 0, "cuda moe_experts_grouped: direct reads run on moe_gate_up / moe_down only");
  STRATA_REQUIRE(n_expert > 0 && n_expert <= (1 << 20), "cuda moe_experts_grouped: bad n_expert {}", n_expert);
  STRATA_REQUIRE(n * k < (int64_t(1) << 31) - int64_t(kMt) * n_expert,
                 "cuda moe_experts_grouped: {} x {} pairs is too many", n, k);
  const Layout L = layout(v, n_expert, n, k);
  STRATA_REQUIRE(scratch != nullptr && L.total <= scratch_bytes,
                 "cuda moe_experts_grouped: {} tokens need {} scratch bytes, {} given (moe_grouped_scratch_bytes)", n,
                 L.total, scratch_bytes);
  if (n == 0) return;
  auto* s = static_cast<uint8_t*>(scratch);
  auto* counts = reinterpret_cast<int32_t*>(s + L.counts);
  auto* offsets = reinterpret_cast<int32_t*>(s + L.offsets);
  auto* tile_start = reinterpret_cast<int32_t*>(s + L.tile_start);
  auto* perm = reinterpret_cast<int32_t*>(s + L.perm);
  auto* inv = reinterpret_cast<int32_t*>(s + L.inv);
  auto* h = reinterpret_cast<float*>(s + L.h);  // [P][n_ff]
  auto* y = reinterpret_cast<float*>(s + L.y);  // [P][n_embd]

  // Odd shapes, unaligned slots or more experts than the sort takes: the per-pair kernels (h indexed by pair).
  if (!moe_grouped_supported(v) || n_expert > kSortMaxExperts) {
    moe_gate_up(v, table, x, ids, n, k, h, stream);
    moe_down(v, table, h, ids, wts, n, k, accumulate ? y : out, stream);
    if (accumulate) ops::add_inplace(out, y, n * v.n_embd, stream);  // (y holds [P][n_embd] >= [n][n_embd])
    return;
  }
  const int64_t pairs = n * k;
  const int which = moe_grouped_kernel();
  const bool use_mma = which >= 1 && v.n_embd % mma::kKc == 0 && v.n_ff % mma::kKc == 0 &&
                       reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int mt = use_mma ? mma::kMt : kMt;
  sort_kernel<<<n_expert, kSortThreads, 0, stream>>>(table, n_expert, ids, pairs, mt, counts, offsets, tile_start,
                                                     perm, inv);
  CUDA_CHECK_LAUNCH();

  const unsigned max_tiles = unsigned((pairs + mt - 1) / mt + std::min<int64_t>(n_expert, pairs));
  if (use_mma) {
    auto* xb = reinterpret_cast<__nv_bfloat16*>(s + L.xb);  // [n][n_embd]
    auto* hb = reinterpret_cast<__nv_bfloat16*>(s + L.hb);  // [P][n_ff]
    convert16(x, n * v.n_embd, xb, stream);
    const bool staged_shape = which == 2 && v.n_embd % mma::kSc == 0 && v.n_ff % mma::kSc == 0 &&
                              reinterpret_cast<uintptr_t>(v.slots) % 16 == 0 && v.slot_bytes % 16 == 0;
    auto gemm = [&](GgmlType type, int64_t off0, int64_t off1, int64_t K, int64_t rows, const __nv_bfloat16* in,
                    bool gather, float* of, __nv_bfloat16* ob, Mode mode) {
      const int64_t rb = int64_t(row_bytes(type, K));
      const bool dual = mode == kGateUp;
      dq::dispatch(type, [&](auto f) {
        using F = decltype(f);
        auto launch = [&](auto dual_tag) {
          constexpr bool D = decltype(dual_tag)::value;
          bool staged = false;
          if constexpr (F::kVals >= 32) {  // quantized formats only (a float stage would not fit)
            // Raw rows whose stage bytes all start 16-byte aligned need no lead room in shared memory.
            constexpr int cb = mma::stage_row_bytes<F>();
            const auto at = reinterpret_cast<uintptr_t>(v.slots);
            const bool a16 = rb % 16 == 0 && cb % 16 == 0 && (at + uintptr_t(off0)) % 16 == 0 &&
                             (!D || (at + uintptr_t(off1)) % 16 == 0);
            const int wp = a16 ? cb : mma::stage_pitch_max<F>();
            auto try_launch = [&](auto stages_tag) {
              constexpr int St = decltype(stages_tag)::value;
              const void* kern =
                  reinterpret_cast<const void*>(&mma::grouped_mma_staged_kernel<F, F::kAlign, D, St>);
              const size_t smem = mma::staged_smem_bytes(St, wp);
              if (int64_t(smem) > dynamic_limit(kern)) return false;
              allow_dynamic_bytes(kern, int64_t(smem));
              const dim3 grid(max_tiles, unsigned(rows / (D ? mma::kSRowsDual : mma::kSRowsSingle)));
              mma::grouped_mma_staged_kernel<F, F::kAlign, D, St><<<grid, mma::kSThreads, smem, stream>>>(
                  v.slots, v.slot_bytes, off0, off1, rb, K, rows, table, n_expert, counts, offsets, tile_start, perm,
                  k, in, gather, of, ob, int(mode), wp);
              return true;
            };
            if (staged_shape) {
              if (moe_grouped_stages() == 3) staged = try_launch(std::integral_constant<int, 3>{});
              if (!staged) staged = try_launch(std::integral_constant<int, 2>{});
            }
          }
          if (!staged) {
            const dim3 grid(max_tiles, unsigned(rows / (D ? mma::kRowsDual : mma::kRowsSingle)));
            mma::grouped_mma_kernel<F, F::kAlign, D><<<grid, mma::kThreads, 0, stream>>>(
                v.slots, v.slot_bytes, off0, off1, rb, K, rows, table, n_expert, counts, offsets, tile_start, perm,
                k, in, gather, of, ob, int(mode));
          }
          CUDA_CHECK_LAUNCH();
        };
        if (dual) launch(std::true_type{});
        else launch(std::false_type{});
      });
    };
    if (v.gate_type == v.up_type) {
      gemm(v.gate_type, v.gate_off, v.up_off, v.n_embd, v.n_ff, xb, true, nullptr, hb, kGateUp);
    } else {  // gate f32 into h, then up reads it and writes bf16(silu(gate) * up)
      gemm(v.gate_type, v.gate_off, 0, v.n_embd, v.n_ff, xb, true, h, nullptr, kGateOnly);
      gemm(v.up_type, v.up_off, 0, v.n_embd, v.n_ff, xb, true, h, hb, kUpApply);
    }
    gemm(v.down_type, v.down_off, 0, v.n_ff, v.n_embd, hb, false, y, nullptr, kDown);
  } else {
    auto gemm = [&](GgmlType type, int64_t off0, int64_t off1, int64_t K, int64_t rows, const float* in, bool invec,
                    float* dst, Mode mode) {
      const int64_t rb = int64_t(row_bytes(type, K));
      const dim3 grid(max_tiles, unsigned((rows + kNt - 1) / kNt));
      dq::dispatch(type, [&](auto f) {
        using F = decltype(f);
        grouped_kernel<F><<<grid, kThreads, 0, stream>>>(v.slots, v.slot_bytes, off0, off1, rb, K, rows, table,
                                                         n_expert, counts, offsets, tile_start, perm, k, in, invec,
                                                         dst, int(mode));
        CUDA_CHECK_LAUNCH();
      });
    };
    const bool xvec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && v.n_embd % 4 == 0;
    if (v.gate_type == v.up_type) {
      gemm(v.gate_type, v.gate_off, v.up_off, v.n_embd, v.n_ff, x, xvec, h, kGateUp);
    } else {
      gemm(v.gate_type, v.gate_off, 0, v.n_embd, v.n_ff, x, xvec, h, kGateOnly);
      gemm(v.up_type, v.up_off, 0, v.n_embd, v.n_ff, x, xvec, h, kUpApply);
    }
    gemm(v.down_type, v.down_off, 0, v.n_ff, v.n_embd, h, v.n_ff % 4 == 0, y, kDown);
  }
  const dim3 cgrid(unsigned((v.n_embd + kCombineThreads - 1) / kCombineThreads),
                   unsigned(std::min<int64_t>(n, 65535)));
  auto* combine = accumulate ? combine_kernel<true> : combine_kernel<false>;
  combine<<<cgrid, kCombineThreads, 0, stream>>>(table, n_expert, ids, wts, inv, y, n, k, v.n_embd, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace strata::cuda::moe
