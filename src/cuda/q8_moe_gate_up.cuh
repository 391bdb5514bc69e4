// moe_gate_up's kernel and launch, for both entry points (internal: q8_moe_gate_up.cu instantiates the plain
// one, q8_moe_gate_up_routed.cu the routed one, so the two compile in parallel).
#pragma once

#include <type_traits>

#include "common/error.h"
#include "cuda/pdl.cuh"
#include "cuda/q8_common.cuh"
#include "cuda/q8_folded_route.cuh"
#include "cuda/q8_moe_detail.cuh"
#include "cuda/smem_cap.cuh"

namespace strata::cuda::q8::moe_detail {

constexpr int kThreads = 256;  // 8 warps
constexpr int kRowsPerWarp = 4;  // gate_up: 8 warps x 4 rows = the 32 rows of one quantization block

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

// moe_gate_up (Routed false: fr unused) and moe_gate_up_routed (Routed: fr set, n == 1).
template <bool Routed>
void launch_gate_up(const moe::ExpertLayerView& v, const int32_t* table, const int8_t* xq, const float2* xds,
                    const int32_t* ids, int64_t n, int k, int8_t* hq, float2* hds, const FoldedRoute* fr,
                    cudaStream_t stream) {
  if (n == 0) return;
  FoldedRoute route = Routed ? *fr : FoldedRoute{};
  route.warp_topk = Routed && gate_up_warp_topk() != 0;
  const int64_t pairs = n * k;
  const int64_t grb = int64_t(row_bytes(v.gate_type, uint64_t(v.n_embd)));
  const int64_t urb = int64_t(row_bytes(v.up_type, uint64_t(v.n_embd)));
  // (routed: one more column of blocks, whose block y = 0 writes moe_down's weights: q8_folded_route.cuh)
  const dim3 grid(unsigned(v.n_ff / 32 + (Routed ? 1 : 0)), grid_y(pairs));
  const int64_t gstride = q8d::stage_stride(kRowsPerWarp * grb), ustride = q8d::stage_stride(kRowsPerWarp * urb);
  const int64_t stage_bytes = (kThreads / 32) * (gstride + ustride);
  const int cap = spreading_cap(int64_t(grid.x) * grid.y, gate_up_per_sm());
  const q8d::Align ga = rows_align(v, v.gate_off, grb), ua = rows_align(v, v.up_off, urb);
  const bool ran = q8d::dispatch_pair(v.gate_type, ga, v.up_type, ua, [&](auto g, auto ag, auto u, auto au) {
    using G = decltype(g);
    using U = decltype(u);
    constexpr int AG = decltype(ag)::value, AU = decltype(au)::value;
    if constexpr (AG == 2 && AU == 2) {
      auto* kern = gate_up_kernel<G, q8d::kStaged, U, q8d::kStaged, Routed>;
      if (stage_bytes <= dynamic_limit(reinterpret_cast<const void*>(kern))) {
        allow_dynamic_bytes(reinterpret_cast<const void*>(kern), stage_bytes);
        const size_t smem = smem_for_cap(reinterpret_cast<const void*>(kern), size_t(stage_bytes), cap, kThreads);
        pdl::launch(kern, grid, kThreads, smem, stream, v.slots, v.slot_bytes, v.gate_off, v.up_off, grb, urb,
                    v.n_embd, v.n_ff, table, xq, xds, ids, pairs, k, hq, hds, gstride, ustride, v.n_expert, route);
        return;
      }
    }
    auto* kern = gate_up_kernel<G, AG, U, AU, Routed>;
    const size_t smem = smem_for_cap(reinterpret_cast<const void*>(kern), 0, cap, kThreads);
    pdl::launch(kern, grid, kThreads, smem, stream, v.slots, v.slot_bytes, v.gate_off, v.up_off, grb, urb,
                v.n_embd, v.n_ff, table, xq, xds, ids, pairs, k, hq, hds, int64_t(0), int64_t(0), v.n_expert,
                route);
  });
  STRATA_REQUIRE(ran, "q8 moe_gate_up: no kernel for gate {} / up {} rows", type_name(v.gate_type),
                 type_name(v.up_type));
}

}  // namespace strata::cuda::q8::moe_detail
