// MoE decode with int8 activations, experts read from expert-cache slots through the residency table
// (contract: q8_kernels.cuh; per-format dots: q8_formats.cuh; CPU reference: host/q8_reference.cpp
// moe_gate_up / moe_down). No atomics: every output element is written by one warp (gate_up: one block
// per 32 rows of a pair), sums in a fixed order, so results are deterministic.
#include <cuda_pipeline.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/host/q8_reference.h"
#include "cuda/q8_common.cuh"
#include "cuda/q8_folded_route.cuh"
#include "cuda/q8_formats.cuh"
#include "cuda/q8_kernels.cuh"
#include "cuda/pdl.cuh"
#include "cuda/smem_cap.cuh"

namespace strata::cuda::q8 {
namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kRowsPerWarp = 4;  // gate_up: 8 warps x 4 rows = the 32 rows of one quantization block

// Slot of the expert of pair p, or -1 (negative id or not resident), as moe_kernels.cu reads it.
__device__ __forceinline__ int slot_of(const int32_t* table, const int32_t* ids, int64_t p) {
  const int32_t e = ids[p];
  return e < 0 ? -1 : table[e];
}

// The layer's table row in shared memory (n_table entries; 0 or more than kViewTableMax: not staged) before
// the PDL wait: slots are then found one memory round trip after the router's ids instead of two. Every
// thread of the block calls it; the caller syncs the block before reading the copy. Returns the row to
// read slots from (the copy, or `table` itself). Why before the wait is allowed: the table is written by
// uploads only (the expert cache's table, a streaming pass's row, the shared expert's {0}), which are
// ordered by events, never by a kernel of the stream (cuda/pdl.cuh's contract for weights).
__device__ __forceinline__ const int32_t* stage_table(const int32_t* table, int n_table, int32_t* tab, int nthreads) {
  if (n_table <= 0 || n_table > moe::kViewTableMax) return table;
  for (int i = threadIdx.x; i < n_table; i += nthreads) tab[i] = table[i];
  return tab;
}

// moe_kernels.cu's silu, the same expression.
__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// Block (x: 32 rows r0.. of n_ff, y: pairs p = t*k + j, grid-stride): warp w computes gate and up rows
// r0 + 4w .. r0 + 4w + 3 against x[t] (a whole warp per row: lane = task), h = silu(g) * u into shared
// memory, then warp 0 quantizes the 32 values into hq[p][r0..r0+32) and hds[p][r0/32].
// AG == AU == kStaged (gate and up both 2-byte aligned formats: Q4_0 / Q8_0 / Q6_K): the warp's 4 gate
// rows and 4 up rows (each 4 consecutive rows of memory) are first copied into its shared-memory region
// (gstride + ustride bytes), coalesced, as matvec_kernel does.
// Routed (moe_gate_up_routed, one token): xq, xds and ids are not read; every block first routes the token
// and quantizes x itself from `fr` (q8_folded_route.cuh), into shared memory.
//   slots: [n_slots][slot_bytes]  table: [n_expert]  xq: [n][n_embd]  xds: [n][n_embd/32]  ids: [n*k]
//   hq: [n*k][n_ff]  hds: [n*k][n_ff/32]
template <typename G, int AG, typename U, int AU, bool Routed>
__global__ void __launch_bounds__(kThreads)
    gate_up_kernel(const uint8_t* __restrict__ slots, int64_t slot_bytes, int64_t gate_off, int64_t up_off,
                   int64_t grb, int64_t urb, int64_t n_embd, int64_t n_ff, const int32_t* __restrict__ table,
                   const int8_t* xq, const float2* xds, const int32_t* ids, int64_t n_pairs, int k,
                   int8_t* __restrict__ hq, float2* __restrict__ hds, int64_t gstride, int64_t ustride, int n_table,
                   FoldedRoute fr) {
  static_assert((AG == q8d::kStaged) == (AU == q8d::kStaged), "gate and up are staged together");
  __shared__ float hs[32];
  __shared__ int32_t tab[moe::kViewTableMax];
  const int32_t* tb = stage_table(table, n_table, tab, kThreads);  // before the wait: the table is uploaded
  if constexpr (Routed) {
    __shared__ q8fr::Shared rsh;
    // The predicted expert's rows this block reads if the router agrees (fr.pred_slots, mode 4), asked into
    // L2 while the block routes. Why: gate_up's ~3.4 us of routing left the HBM idle before its 14 MB read.
    auto ask = [&] {
      if (fr.pred_slots == nullptr || threadIdx.x != 0 || blockIdx.x + 1 >= gridDim.x || int(blockIdx.y) >= k)
        return;
      const int slot = __ldcg(fr.pred_slots + blockIdx.y);
      if (slot < 0) return;
      const uint8_t* base = slots + int64_t(slot) * slot_bytes;
      const int64_t r0 = int64_t(blockIdx.x) * 32;
      prefetch_l2_bulk(base + gate_off + r0 * grb, uint32_t(32 * grb));
      prefetch_l2_bulk(base + up_off + r0 * urb, uint32_t(32 * urb));
    };
    // (waits; ends with a barrier, which also publishes tab; the last column of blocks writes the weights)
    if (!q8fr::route_block(fr, k, n_embd, rsh, ask)) return;
    xq = rsh.xq, xds = rsh.xds, ids = rsh.sel;
  } else {
    pdl_wait();  // (PDL: everything below reads the router's ids and x's quantization)
    pdl_launch_dependents();
    if (tb == tab) __syncthreads();
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r0 = int64_t(blockIdx.x) * 32, rw = r0 + kRowsPerWarp * warp;
  for (int64_t p = blockIdx.y; p < n_pairs; p += gridDim.y) {
    const int slot = slot_of(tb, ids, p);  // block-uniform
    if (p == 0 && slot != -2) pdl_mark();  // (traced builds: the first pair's slot known; the test waits for it)
    if (slot < 0) continue;
    const uint8_t* base = slots + int64_t(slot) * slot_bytes;
    const uint8_t* gsrc = base + gate_off + rw * grb;  // the warp's 4 gate rows, consecutive
    const uint8_t* usrc = base + up_off + rw * urb;
    if constexpr (AG == q8d::kStaged) {
      extern __shared__ __align__(16) uint8_t stage[];  // [warps][gstride + ustride]
      uint8_t* region = stage + warp * (gstride + ustride);
      uint8_t* gdst = q8d::stage_dst(region, gsrc);
      uint8_t* udst = q8d::stage_dst(region + gstride, usrc);
      q8d::warp_copy(gdst, gsrc, kRowsPerWarp * grb, lane);
      q8d::warp_copy(udst, usrc, kRowsPerWarp * urb, lane);
      __syncwarp();  // (the previous pair's reads ended before the __syncthreads closing its iteration)
      gsrc = gdst, usrc = udst;
    }
    const int8_t* xt = xq + (p / k) * n_embd;
    const float2* dt = xds + (p / k) * (n_embd / 32);
    float acc[2 * kRowsPerWarp];  // gate rows, then up rows
#pragma unroll
    for (int i = 0; i < 2 * kRowsPerWarp; ++i) acc[i] = 0.f;
    if constexpr (std::is_same_v<G, U> && AG == AU) {
      // Same format: the 8 rows in one task loop (8 loads in flight per lane).
      const uint8_t* wr[2 * kRowsPerWarp];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i)
        wr[i] = gsrc + i * grb, wr[kRowsPerWarp + i] = usrc + i * urb;
      q8d::rows_lane_partial<G, AG, 2 * kRowsPerWarp>(wr, n_embd, lane, 32, xt, dt, acc);
    } else {
      const uint8_t* wg[kRowsPerWarp];
      const uint8_t* wu[kRowsPerWarp];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i)
        wg[i] = gsrc + i * grb, wu[i] = usrc + i * urb;
      q8d::rows_lane_partial<G, AG, kRowsPerWarp>(wg, n_embd, lane, 32, xt, dt, acc);
      q8d::rows_lane_partial<U, AU, kRowsPerWarp>(wu, n_embd, lane, 32, xt, dt, acc + kRowsPerWarp);
    }
#pragma unroll
    for (int i = 0; i < 2 * kRowsPerWarp; ++i)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
    if (p == 0 && acc[0] != -2.f) pdl_mark();  // (traced builds: the first pair's dots)
    if (lane == 0)
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) hs[kRowsPerWarp * warp + i] = silu(acc[i]) * acc[kRowsPerWarp + i];
    __syncthreads();
    if (warp == 0) q8c::quantize_warp(hs[lane], hq + p * n_ff + r0, hds + p * (n_ff / 32) + r0 / 32);
    __syncthreads();  // hs is rewritten by the next pair
  }
  pdl_end();  // (traced builds: the block's end, and every block's in a histogram)
}

// q8d::warp_copy_with's 16-byte copies as asynchronous copies (cp.async; dst = src mod 16, so both ends of
// each are 16-byte aligned); the 2-byte head and tail stay plain copies. The caller commits and waits
// (__pipeline_commit, __pipeline_wait_prior(0), then __syncwarp) before any lane reads dst. Why: the warp can
// start the copies of all k rows before it waits for any. One warp_copy after another waited for each row's
// loads in turn: k = 8 dependent memory round trips (session 27's trace: Q4_0 down 10.46 us a layer against
// Q4_K's 6.11, whose rows are read in place).
struct Copy16Async {
  __device__ __forceinline__ void operator()(uint8_t* dst, const uint8_t* src, int64_t i) const {
    __pipeline_memcpy_async(dst + 16 * i, src + 16 * i, 16);
  }
};

// Warp = output row r of n_embd (x: blocks of W rows, y: tokens, grid-stride). The lanes share
// out the (j, task) pairs of all k experts of token t (why: a down row is short, 768 values = 12 K-quant
// tasks, so one expert at a time would leave lanes idle and chain k memory round trips); each lane adds
// wts[p] * (its task's dot) in its fixed order, then a butterfly, then x[t][r] = resid[t][r] + the sum
// (resid may be x). resid is loaded before the dot (why: after it, one more L2 round trip ended every
// block on the decode chain; the same float addition).
// Non-resident pairs (slot -1) add nothing. A == kStaged (Q4_0 / Q8_0 / Q6_K, 2-byte aligned blocks):
// the warp first copies the k experts' rows r into its shared-memory region (stride bytes per expert),
// coalesced, as matvec_kernel does; with async_stage (moe_down_async_stage(), the default) all k rows' copies
// are in flight at once (Copy16Async), else one row after another (warp_copy; the same bytes).
//   hq: [n*k][n_ff]  hds: [n*k][n_ff/32]  wts: [n*k]  x: [n][n_embd]
constexpr int kDownWarps = 4;
constexpr int kDownMaxK = 32;  // Slots: at most this many experts per token (the slot list is one per lane)
constexpr int kDownUnroll = 4; // Slots: terms per lane unrolled with all loads in flight (k 8 x 768-column
                               // K-quant rows: 96 terms = 3 per lane)
// Slots (the default; k <= kDownMaxK): the warp first looks up the k slots of token t in parallel (lane j:
// ids[t*k+j], then table[e]) into shared memory, and the lanes run down_lane_partial_slots (same sum).
// !Slots: the first kernel, every term looks its slot up itself (down_lane_partial).
// W: warps (rows) a block (moe_down_warps(): 8, or kDownWarps).
template <typename F, int A, bool Slots, int W>
__global__ void __launch_bounds__(32 * W)
    down_kernel(const uint8_t* __restrict__ slots, int64_t slot_bytes, int64_t down_off, int64_t drb, int64_t n_embd,
                int64_t n_ff, const int32_t* __restrict__ table, const int8_t* __restrict__ hq,
                const float2* __restrict__ hds, const int32_t* __restrict__ ids, const float* __restrict__ wts,
                int64_t n, int k, const float* resid, float* x, int64_t stride, bool prefetch, int n_table,
                bool async_stage) {
  __shared__ int jslot_all[W][Slots ? kDownMaxK : 1];
  __shared__ int32_t tab[moe::kViewTableMax];
  const int32_t* tb = stage_table(table, n_table, tab, 32 * W);  // (uploads only: before the wait)
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * W + (threadIdx.x >> 5);
  if (prefetch && r < n_embd && int64_t(blockIdx.y) < n) {
    // Row r of the first token's k experts into L2 while gate_up runs (see moe_down's `after_gate_up`):
    // lane j looks up expert j's slot (L2 reads: ids and the table are not in this SM's L1 from an earlier
    // write) and prefetches the lines of its row.
    const int64_t t = blockIdx.y;
    for (int j = lane; j < k; j += 32) {
      const int32_t e = __ldcg(ids + t * k + j);
      const int slot = e < 0 ? -1 : __ldcg(table + e);
      if (slot >= 0) prefetch_l2_range(slots + int64_t(slot) * slot_bytes + down_off + r * drb, drb);
    }
  }
  pdl_wait();  // (PDL: everything below reads ids, h and x of earlier kernels)
  pdl_launch_dependents();
  if (tb == tab) __syncthreads();
  if (r >= n_embd) return;  // warp-uniform
  int* jslot = jslot_all[threadIdx.x >> 5];
  uint8_t* region = nullptr;
  if constexpr (A == q8d::kStaged) {
    extern __shared__ __align__(16) uint8_t stage[];  // [warps][k][stride]
    region = stage + (threadIdx.x >> 5) * k * stride;
  }
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    const float base = lane == 0 ? resid[t * n_embd + r] : 0.f;
    if constexpr (Slots) {
      __syncwarp();  // the previous token's reads of jslot are done
      if (lane < k) jslot[lane] = slot_of(tb, ids, t * k + lane);
      __syncwarp();
    }
    if constexpr (A == q8d::kStaged) {
      __syncwarp();  // the previous token's reads of the region are done
      for (int j = 0; j < k; ++j) {
        int slot;
        if constexpr (Slots) slot = jslot[j];
        else slot = slot_of(tb, ids, t * k + j);  // warp-uniform
        if (slot < 0) continue;
        const uint8_t* src = slots + int64_t(slot) * slot_bytes + down_off + r * drb;
        if (async_stage) q8d::warp_copy_with(q8d::stage_dst(region + j * stride, src), src, drb, lane, Copy16Async{});
        else q8d::warp_copy(q8d::stage_dst(region + j * stride, src), src, drb, lane);
      }
      if (async_stage) {
        __pipeline_commit();
        __pipeline_wait_prior(0);
      }
      __syncwarp();
    }
    float acc;
    if constexpr (Slots)
      acc = q8d::down_lane_partial_slots<F, A, kDownUnroll>(slots, slot_bytes, down_off, drb, r, n_ff, jslot, hq, hds,
                                                            wts, t, k, lane, 32, region, stride);
    else
      acc = q8d::down_lane_partial<F, A>(slots, slot_bytes, down_off, drb, r, n_ff, tb, hq, hds, ids, wts, t, k,
                                         lane, 32, region, stride);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) x[t * n_embd + r] = base + acc;
  }
  pdl_end();  // (traced builds: the block's end, and every block's in a histogram)
}

q8ref::ExpertView host_view(const moe::ExpertLayerView& v) {
  q8ref::ExpertView h;
  h.slots = v.slots, h.slot_bytes = v.slot_bytes;
  h.gate_type = v.gate_type, h.up_type = v.up_type, h.down_type = v.down_type;
  h.gate_off = v.gate_off, h.up_off = v.up_off, h.down_off = v.down_off;
  h.n_embd = v.n_embd, h.n_ff = v.n_ff;
  return h;
}

// The alignment of every row of a slot tensor at slots + s * slot_bytes + off (row_bytes apart).
q8d::Align rows_align(const moe::ExpertLayerView& v, int64_t off, int64_t rb) {
  return q8d::min_align(q8d::align_of(reinterpret_cast<uintptr_t>(v.slots) + uintptr_t(off), v.slot_bytes),
                        q8d::align_of(0, rb));
}

void check(const moe::ExpertLayerView& v, const char* what, int64_t n, int k, const void* act, const void* h) {
  moe::check_expert_view(v, what, n, k);
  STRATA_REQUIRE(v.direct == nullptr || v.direct_share == 0, "{}: direct reads run on the f32 kernels only", what);
  STRATA_REQUIRE(moe_supported(v), "{}: expert types {}/{}/{} or shape n_embd {} n_ff {} have no int8-activation "
                 "kernel (or rows are not 2-byte aligned)", what, type_name(v.gate_type), type_name(v.up_type),
                 type_name(v.down_type), v.n_embd, v.n_ff);
  STRATA_REQUIRE(reinterpret_cast<uintptr_t>(act) % 16 == 0 && reinterpret_cast<uintptr_t>(h) % 16 == 0,
                 "{}: int8 activations must be 16-byte aligned", what);
}

// moe_down's prefetch switch: on unless the environment sets STRATA_CUDA_DOWN_PREFETCH=0 (read once).
bool down_prefetch() {
  static const bool on = env_on_unless_zero("STRATA_CUDA_DOWN_PREFETCH");
  return on;
}

// Static shared memory of the kernels, at most: the table copy and 1 KiB for the rest (hs, jslot_all).
constexpr int64_t kStaticSmem = int64_t(sizeof(int32_t)) * moe::kViewTableMax + 1024;

unsigned grid_y(int64_t n) { return unsigned(std::min<int64_t>(std::max<int64_t>(n, 1), 65535)); }

DigitSetting g_gate_up_per_sm("STRATA_CUDA_GATE_UP_PER_SM", "gate_up blocks per SM", 0, 8, 2);
DigitSetting g_gate_up_topk("STRATA_CUDA_GATE_UP_TOPK", "gate_up's warp top-k", 0, 1, 1);

}  // namespace

bool moe_supported(const moe::ExpertLayerView& v) { return q8ref::moe_supported(host_view(v)); }

void set_gate_up_per_sm(int cap) { g_gate_up_per_sm.set(cap); }

// Why a cap (2 by default): gate_up's blocks are launched while wo_router's still run, and each SM that
// wo_router frees takes as many of them as fit (3 of the 30B-A3B geometry's 200). Session 22 traced 87% of
// them on SMs holding 3 and about half of the 132 SMs in use: blocks alone on an SM ended 9.2 us after their
// wait, 2 to an SM 10.0, 3 to an SM 10.7, and every launch's latest block was on an SM of 3. Shared memory
// the kernel does not otherwise need caps how many fit (smem_for_cap).
int gate_up_per_sm() { return g_gate_up_per_sm.get(); }

void set_gate_up_warp_topk(int on) { g_gate_up_topk.set(on); }

// Why on (session 26, 30B-A3B geometry, alternating, three machines): 617.9 against 605.4 tok/s median (2 of 2
// pairs won), 596.2 against 586.3 (3 of 3), 616.5 against 615.6 (2 of 3); traced, the experts are chosen
// 0.29 us sooner and gate_up's step is 11.72 -> 11.44 us.
int gate_up_warp_topk() { return g_gate_up_topk.get(); }

namespace {

// moe_gate_up and moe_gate_up_routed (fr != nullptr: n == 1).
void launch_gate_up(const moe::ExpertLayerView& v, const int32_t* table, const int8_t* xq, const float2* xds,
                    const int32_t* ids, int64_t n, int k, int8_t* hq, float2* hds, const FoldedRoute* fr,
                    cudaStream_t stream) {
  if (n == 0) return;
  FoldedRoute route = fr != nullptr ? *fr : FoldedRoute{};
  route.warp_topk = fr != nullptr && gate_up_warp_topk() != 0;
  const int64_t pairs = n * k;
  const int64_t grb = int64_t(row_bytes(v.gate_type, uint64_t(v.n_embd)));
  const int64_t urb = int64_t(row_bytes(v.up_type, uint64_t(v.n_embd)));
  // (routed: one more column of blocks, whose block y = 0 writes moe_down's weights: q8_folded_route.cuh)
  const dim3 grid(unsigned(v.n_ff / 32 + (fr != nullptr ? 1 : 0)), grid_y(pairs));
  const int64_t gstride = q8d::stage_stride(kRowsPerWarp * grb), ustride = q8d::stage_stride(kRowsPerWarp * urb);
  const int64_t stage_bytes = (kThreads / 32) * (gstride + ustride);
  const int cap = spreading_cap(int64_t(grid.x) * grid.y, gate_up_per_sm());
  const q8d::Align ga = rows_align(v, v.gate_off, grb), ua = rows_align(v, v.up_off, urb);
  const bool ran = q8d::dispatch_pair(v.gate_type, ga, v.up_type, ua, [&](auto g, auto ag, auto u, auto au) {
    using G = decltype(g);
    using U = decltype(u);
    constexpr int AG = decltype(ag)::value, AU = decltype(au)::value;
    auto run = [&](auto routed) {
      constexpr bool R = decltype(routed)::value;
      if constexpr (AG == 2 && AU == 2) {
        auto* kern = gate_up_kernel<G, q8d::kStaged, U, q8d::kStaged, R>;
        if (stage_bytes <= dynamic_limit(reinterpret_cast<const void*>(kern))) {
          allow_dynamic_bytes(reinterpret_cast<const void*>(kern), stage_bytes);
          const size_t smem = smem_for_cap(reinterpret_cast<const void*>(kern), size_t(stage_bytes), cap, kThreads);
          pdl::launch(kern, grid, kThreads, smem, stream, v.slots, v.slot_bytes, v.gate_off, v.up_off, grb, urb,
                      v.n_embd, v.n_ff, table, xq, xds, ids, pairs, k, hq, hds, gstride, ustride, v.n_expert, route);
          return;
        }
      }
      auto* kern = gate_up_kernel<G, AG, U, AU, R>;
      const size_t smem = smem_for_cap(reinterpret_cast<const void*>(kern), 0, cap, kThreads);
      pdl::launch(kern, grid, kThreads, smem, stream, v.slots, v.slot_bytes, v.gate_off, v.up_off, grb, urb,
                  v.n_embd, v.n_ff, table, xq, xds, ids, pairs, k, hq, hds, int64_t(0), int64_t(0), v.n_expert,
                  route);
    };
    if (fr != nullptr) run(std::true_type{});
    else run(std::false_type{});
  });
  STRATA_REQUIRE(ran, "q8 moe_gate_up: no kernel for gate {} / up {} rows", type_name(v.gate_type),
                 type_name(v.up_type));
}

}  // namespace

void moe_gate_up(const moe::ExpertLayerView& v, const int32_t* table, const int8_t* xq, const float2* xds,
                 const int32_t* ids, int64_t n, int k, int8_t* hq, float2* hds, cudaStream_t stream) {
  check(v, "q8 moe_gate_up", n, k, xq, hq);
  launch_gate_up(v, table, xq, xds, ids, n, k, hq, hds, nullptr, stream);
}

void moe_gate_up_routed(const moe::ExpertLayerView& v, const int32_t* table, const FoldedRoute& r, int k,
                        int8_t* hq, float2* hds, cudaStream_t stream) {
  check(v, "q8 moe_gate_up_routed", 1, k, hq, hq);
  STRATA_REQUIRE(v.n_embd % 256 == 0 && v.n_embd <= q8fr::kMaxEmbd && r.n_expert >= 1 &&
                 r.n_expert <= q8fr::kMaxExperts && k <= q8fr::kMaxK && k <= r.n_expert && r.n_ss >= 0,
                 "q8 moe_gate_up_routed: n_embd {} (a multiple of 256 up to {}), {} experts (up to {}), k {} (up to "
                 "{}): unsupported", v.n_embd, q8fr::kMaxEmbd, r.n_expert, q8fr::kMaxExperts, k, q8fr::kMaxK);
  STRATA_REQUIRE(r.mid != nullptr && r.norm_w != nullptr && r.raw != nullptr && r.ids != nullptr && r.wts != nullptr &&
                 (r.n_ss == 0 || r.ss != nullptr), "q8 moe_gate_up_routed: a null input or output");
  STRATA_REQUIRE(reinterpret_cast<uintptr_t>(r.mid) % 16 == 0 && reinterpret_cast<uintptr_t>(r.norm_w) % 16 == 0,
                 "q8 moe_gate_up_routed: mid and norm_w must be 16-byte aligned");
  launch_gate_up(v, table, nullptr, nullptr, nullptr, 1, k, hq, hds, &r, stream);
}

namespace {
EnvSwitch g_down_slots;
}  // namespace

void set_moe_down_slots(bool on) { g_down_slots.set(on); }

namespace {
EnvInt g_down_warps;
DigitSetting g_down_per_sm("STRATA_CUDA_DOWN_PER_SM", "moe_down blocks per SM", 0, 8, 2);
DigitSetting g_down_async_stage("STRATA_CUDA_DOWN_ASYNC_STAGE", "moe_down's staging by asynchronous copies", 0, 1, 1);
}  // namespace

void set_moe_down_warps(int warps) {
  STRATA_REQUIRE(warps == 4 || warps == 8, "moe_down warps a block: {} (4 or 8)", warps);
  g_down_warps.set(warps);
}

// 8 by default (STRATA_CUDA_DOWN_WARPS=4: the shape before session 24); why: with the cap below, see there.
int moe_down_warps() {
  return g_down_warps.get([] { return env_digit("STRATA_CUDA_DOWN_WARPS", 4, 4, 8); });
}

void set_moe_down_per_sm(int cap) { g_down_per_sm.set(cap); }

// Why 8 warps, at most 2 blocks an SM (the defaults): session 23's trace put 90% of moe_down's 512 blocks of
// 4 warps 4 to an SM, and every launch's latest block on such an SM (4.61 us a block against 4.29 at 3); 512
// blocks do not fit 3 to an SM, 256 blocks of 8 warps fit 2. Session 24 (30B-A3B geometry, 7 alternating
// pairs over three calls, 6 won): medians 595.7 against 589.2 tok/s for 4 warps uncapped; moe_down's step
// 6.00 -> 5.85 us traced.
int moe_down_per_sm() { return g_down_per_sm.get(); }

void set_moe_down_async_stage(int on) { g_down_async_stage.set(on); }

// Why on: see Copy16Async (the staged formats' down: Q4_0, Q8_0, Q6_K, and 2-byte aligned K-quant rows).
int moe_down_async_stage() { return g_down_async_stage.get(); }

namespace {
// The k rows of a block's w warps fit the shared memory the staged kernels take (formats with 2-byte aligned
// rows: A == 2 in q8d::dispatch). stride: q8d::stage_stride of a row.
bool down_stage_fits(int64_t stride, int k, int w) { return stride * k * w + kStaticSmem <= 48 * 1024; }
}  // namespace

int moe_down_launch_warps(const moe::ExpertLayerView& v, int k) {
  const int64_t drb = int64_t(row_bytes(v.down_type, uint64_t(v.n_ff))), stride = q8d::stage_stride(drb);
  bool staged_format = false;
  q8d::dispatch(v.down_type, rows_align(v, v.down_off, drb),
                [&](auto, auto a) { staged_format = decltype(a)::value == 2; });
  const int warps = moe_down_warps();
  // 8 warps only where the 4-warp block's path stays the same: where a staged format's rows fit at 4 warps
  // but not at 8 (larger k or n_ff than the 30B-A3B geometry's), 4 warps as before session 24 (8 warps
  // unstaged against 4 staged was not measured).
  if (warps == 8 && staged_format && !down_stage_fits(stride, k, 8) && down_stage_fits(stride, k, kDownWarps))
    return kDownWarps;
  return warps;
}

bool moe_down_slots() {
  return g_down_slots.get([] {
    const char* e = std::getenv("STRATA_CUDA_Q8_DOWN");
    // Default: the per-term kernel. On the H200 (bench/results/2026-11-29-gpu-session4-h200.md, call 3,
    // cuda_matvec, k 8, n 1) the slots-once kernel took 8.68 vs 6.57 us (Q4_K down) and 20.8 vs 17.3 us
    // (Q6_K down). STRATA_CUDA_Q8_DOWN=slots selects it.
    return e != nullptr && std::string(e) == "slots";
  });
}


void moe_down(const moe::ExpertLayerView& v, const int32_t* table, const int8_t* hq, const float2* hds,
              const int32_t* ids, const float* wts, int64_t n, int k, float* x, cudaStream_t stream,
              bool after_gate_up, const float* resid) {
  check(v, "q8 moe_down", n, k, hq, hq);
  if (n == 0) return;
  const int64_t drb = int64_t(row_bytes(v.down_type, uint64_t(v.n_ff)));
  const bool pre = k <= kDownMaxK && moe_down_slots();
  const int64_t stride = q8d::stage_stride(drb);
  const int warps = moe_down_launch_warps(v, k);
  auto go = [&](auto warps_c) {
    constexpr int W = decltype(warps_c)::value;
    const dim3 grid(unsigned((v.n_embd + W - 1) / W), grid_y(n));
    const int64_t stage_bytes = stride * k * W;
    const int cap = spreading_cap(int64_t(grid.x) * grid.y, moe_down_per_sm());
    const bool ran = q8d::dispatch(v.down_type, rows_align(v, v.down_off, drb), [&](auto f, auto a) {
      using F = decltype(f);
      constexpr int A = decltype(a)::value;
      auto launch = [&](auto kern, int64_t bytes, int64_t st) {
        const auto* kp = reinterpret_cast<const void*>(kern);
        const size_t smem = smem_for_cap(kp, size_t(bytes), cap, 32 * W);
        pdl::launch(kern, grid, 32 * W, smem, stream, v.slots, v.slot_bytes, v.down_off, drb, v.n_embd, v.n_ff, table,
                    hq, hds, ids, wts, n, k, resid != nullptr ? resid : x, x, st, after_gate_up && down_prefetch(),
                    v.n_expert, moe_down_async_stage() != 0);
      };
      // The low-bit formats take only the default per-term kernel (pre: the slots-once one, a switch for
      // comparisons), one variant fewer to compile.
      constexpr bool kPre = !q8d::kLowBit<F>;
      if constexpr (A == 2) {
        if (down_stage_fits(stride, k, W)) {
          if constexpr (kPre)
            if (pre) return launch(down_kernel<F, q8d::kStaged, true, W>, stage_bytes, stride);
          launch(down_kernel<F, q8d::kStaged, false, W>, stage_bytes, stride);
          return;
        }
      }
      if constexpr (kPre)
        if (pre) return launch(down_kernel<F, A, true, W>, 0, 0);
      launch(down_kernel<F, A, false, W>, 0, 0);
    });
    STRATA_REQUIRE(ran, "q8 moe_down: no kernel for {} rows", type_name(v.down_type));
  };
  if (warps == 8) go(std::integral_constant<int, 8>{});
  else go(std::integral_constant<int, kDownWarps>{});
}

}  // namespace strata::cuda::q8
