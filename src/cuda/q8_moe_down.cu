// moe_down (q8_kernels.cuh): the experts' down products of every (token, expert) pair, weighted, added to the
// residual; its launch-shape settings. Shared helpers: q8_moe_detail.cuh.
#include <cuda_pipeline.h>

#include <cstdlib>
#include <string>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/pdl.cuh"
#include "cuda/q8_moe_detail.cuh"
#include "cuda/smem_cap.cuh"

namespace strata::cuda::q8 {

using namespace moe_detail;

namespace {

// q8d::warp_copy_with's 16-byte copies as asynchronous copies (cp.async; dst = src mod 16, so both ends of
// each are 16-byte aligned); the 2-byte head and tail stay plain copies. The caller commits and waits
// (__pipeline_commit, __pipeline_wait_prior(0), then __syncwarp) before any lane reads dst. Why: the warp can
// start the copies of all k rows before it waits for any. One warp_copy after another waited for each row's
// loads in turn: k = 8 dependent memory round trips (session 27's trace: Q4_0 down 10.46 us a layer against
// Q4_K's 6.11, whose rows are read in place).

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
// Slots: terms per lane unrolled with all loads in flight: 4 (k 8 x 768-column K-quant rows: 96 terms = 3 per
// lane), 8 for the formats of 8 tasks a block (Q4_0_X8, the IQ formats: 192 terms = 6 per lane).
template <typename F>
constexpr int kDownUnroll = F::kTasks >= 8 ? 8 : 4;
// Slots (k <= kDownMaxK; by default one-token calls of Q4_0_X8 experts, moe_down_slots): the warp first looks
// up the k slots of token t in parallel (lane j: ids[t*k+j], then table[e]) into shared memory, and the lanes
// run down_lane_partial_slots (same sum).
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
        if (async_stage) q8d::warp_copy_with(q8d::stage_dst(region + j * stride, src), src, drb, lane, q8d::Copy16Async{});
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
      acc = q8d::down_lane_partial_slots<F, A, kDownUnroll<F>>(slots, slot_bytes, down_off, drb, r, n_ff, jslot, hq,
                                                               hds, wts, t, k, lane, 32, region, stride);
    else
      acc = q8d::down_lane_partial<F, A>(slots, slot_bytes, down_off, drb, r, n_ff, tb, hq, hds, ids, wts, t, k,
                                         lane, 32, region, stride);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) x[t * n_embd + r] = base + acc;
  }
  pdl_end();  // (traced builds: the block's end, and every block's in a histogram)
}

// moe_down's prefetch switch: on unless the environment sets STRATA_CUDA_DOWN_PREFETCH=0 (read once).
bool down_prefetch() {
  static const bool on = env_on_unless_zero("STRATA_CUDA_DOWN_PREFETCH");
  return on;
}

}  // namespace

namespace {
EnvInt g_down_kernel;
}  // namespace

void set_moe_down_kernel(int mode) {
  STRATA_REQUIRE(mode >= 0 && mode <= 3,
                 "moe_down kernel: {} (0 per term, 1 slots, 2 slots for one token of Q4_0_X8, 3 and of Q6_K_P)", mode);
  g_down_kernel.set(mode);
}

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
  q8d::dispatch_down(v.down_type, rows_align(v, v.down_off, drb),
                [&](auto, auto a) { staged_format = decltype(a)::value == 2; });
  const int warps = moe_down_warps();
  // 8 warps only where the 4-warp block's path stays the same: where a staged format's rows fit at 4 warps
  // but not at 8 (larger k or n_ff than the 30B-A3B geometry's), 4 warps as before session 24 (8 warps
  // unstaged against 4 staged was not measured).
  if (warps == 8 && staged_format && !down_stage_fits(stride, k, 8) && down_stage_fits(stride, k, kDownWarps))
    return kDownWarps;
  return warps;
}

// (Session 4 had measured the slots kernel slower, on an H200 in bench/cuda_matvec: Q4_K down 8.68 against
// 6.57 us at n = 1. Since then it unrolls 8 terms a lane for Q4_0_X8, and moe_down's rows are prefetched
// into L2 while gate_up runs; see moe_down_kernel's comment for what won in session 41.)
int moe_down_kernel() {
  return g_down_kernel.get([] {
    const char* e = std::getenv("STRATA_CUDA_Q8_DOWN");
    if (e != nullptr && std::string(e) == "slots") return 1;
    if (e != nullptr && std::string(e) == "term") return 0;
    if (e != nullptr && std::string(e) == "one-q6kp") return 3;
    return 2;
  });
}

bool moe_down_slots(int64_t n, GgmlType down) {
  const int mode = moe_down_kernel();
  const bool one = n == 1 && (down == GgmlType::Q4_0_X8 || (mode == 3 && down == GgmlType::Q6_K_P));
  return mode == 1 || (mode >= 2 && one);
}


void moe_down(const moe::ExpertLayerView& v, const int32_t* table, const int8_t* hq, const float2* hds,
              const int32_t* ids, const float* wts, int64_t n, int k, float* x, cudaStream_t stream,
              bool after_gate_up, const float* resid) {
  moe_detail::check(v, "q8 moe_down", n, k, hq, hq);
  if (n == 0) return;
  const int64_t drb = int64_t(row_bytes(v.down_type, uint64_t(v.n_ff)));
  const bool pre = k <= kDownMaxK && moe_down_slots(n, v.down_type);
  const int64_t stride = q8d::stage_stride(drb);
  const int warps = moe_down_launch_warps(v, k);
  auto go = [&](auto warps_c) {
    constexpr int W = decltype(warps_c)::value;
    const dim3 grid(unsigned((v.n_embd + W - 1) / W), grid_y(n));
    const int64_t stage_bytes = stride * k * W;
    const int cap = spreading_cap(int64_t(grid.x) * grid.y, moe_down_per_sm());
    const bool ran = q8d::dispatch_down(v.down_type, rows_align(v, v.down_off, drb), [&](auto f, auto a) {
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
