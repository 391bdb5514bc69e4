#pragma once
// Per-format dot products of one weight "task" with int8 activations (private to q8_kernels.cu and
// q8_moe.cu; contract and activation layout: q8_kernels.cuh). CPU twin, same integer sums and the same
// float expression per task: host/q8_reference.cpp (task_*).
//
// A task is the unit one lane computes: Q4_0 / Q8_0 / IQ4_NL one 32-value block; Q2_K / Q3_K / Q4_K / Q5_K /
// Q6_K / IQ4_XS a quarter of a 256-value super-block (64 values = two activation blocks); the IQ2 / IQ3 / IQ1
// formats one 32-value sub-block. So a 2048-column K-quant row has exactly 32 tasks (one per lane) and a
// Q4_0 / Q8_0 / IQ2_XS row 64.
// Why dp4a: one instruction multiplies 4 weight codes by 4 int8 activations and adds them; the scales are
// applied once per 32 (Q6_K: 16) values, not per weight, so a weight costs ~1/2 instruction instead of ~4.
// Each task loads its weight bytes once and serves up to NT tokens (dot<A, NT>: acc[t] += task . x[t]).
//
// Weight loads by A: 16: 16-byte vector loads (Q4_K / Q5_K / Q4_0_X8 / Q6_K_X8 with 16-byte aligned rows);
// 8: 8-byte loads (IQ4_XS, IQ1_M); 4: 4-byte loads (Q2_K); 2: two 16-bit loads per word, straight from global
// memory; kStaged: from rows a warp staged in shared memory (the kernels' path for 2-byte aligned rows: Q4_0 /
// Q8_0 / Q6_K / Q3_K / IQ4_NL and the IQ2 / IQ3 / IQ1_S formats always, Q4_K / Q5_K / Q4_0_X8 / Q6_K_X8 when
// their rows are not 16-byte aligned; Q2_K, IQ4_XS and IQ1_M rows must have their A: q8ref::min_row_align).
//
// Arguments of dot: blk: the (super-)block of the task, aligned to A bytes; tt: task inside it;
// xq: int8 activations at the block's first column of token 0 (16-byte aligned), xs: int8 per token row;
// xds: float2 {d, d*sum q} of the block's first 32-value block of token 0, dss: float2 per token row;
// nt <= NT live tokens.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/dequant_device.cuh"
#include "cuda/fast_dot.cuh"
#include "cuda/host/q8_reference.h"
#include "cuda/q8_formats_iq.cuh"
#include "cuda/q8_formats_low.cuh"
#include "cuda/q8_task_io.cuh"
#include "quant/types.h"

namespace strata::cuda::q8d {

struct DQ40 {  // d f16 | qs[16]: value l = (qs[l] & 15) - 8, value l + 16 = (qs[l] >> 4) - 8
  static constexpr int kVals = 32, kBytes = 18, kTasks = 1;
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    uint32_t q[4];
    ldw<A, 4>(blk + 2, q);
    block<NT>(q, dq::h2f(dq::ld16<2>(blk)), xq, xs, xds, dss, nt, acc);
  }
  // One block's codes q (16 bytes as 4 words) and scale d against NT tokens' activations of that block.
  template <int NT>
  __host__ __device__ __forceinline__ static void block(const uint32_t q[4], float d, const int8_t* xq, int64_t xs,
                                                        const float2* xds, int64_t dss, int nt, float acc[NT]) {
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int x[8];
      ldx32(xq + t * xs, x);
      int s = 0;
STRATA_FD_UNROLL
      for (int i = 0; i < 4; ++i) s = dp4a(int(q[i] & kLo4), x[i], dp4a(int((q[i] >> 4) & kLo4), x[4 + i], s));
      const float2 ds = xds[t * dss];
      // sum (nib - 8) qx = sum nib qx - 8 sum qx: the offset through the block sum, no per-byte subtract.
      acc[t] += d * (ds.x * float(s) - 8.f * ds.y);
    }
  }
};

// Q4_0 regrouped (quant/q4_0_x8.h): d[8] f16 | qs[8][16]. Task tt = Q4_0 block tt of the group, its codes
// one 16-byte load (A = 16), with DQ40's integer sums and float expression: the same values bit for bit.
struct DQ40X8 {
  static constexpr int kVals = 256, kBytes = 144, kTasks = 8;
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int tt, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    uint32_t q[4];
    ldw<A, 4>(blk + 16 + 16 * tt, q);
    DQ40::block<NT>(q, dq::h2f(dq::ld16<2>(blk + 2 * tt)), xq + 32 * tt, xs, xds + tt, dss, nt, acc);
  }
};

struct DQ80 {  // d f16 | qs[32] int8
  static constexpr int kVals = 32, kBytes = 34, kTasks = 1;
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    uint32_t q[8];
    ldw<A, 8>(blk + 2, q);
    const float d = dq::h2f(dq::ld16<2>(blk));
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int x[8];
      ldx32(xq + t * xs, x);
      int s = 0;
STRATA_FD_UNROLL
      for (int i = 0; i < 8; ++i) s = dp4a(int(q[i]), x[i], s);
      acc[t] += d * (xds[t * dss].x * float(s));
    }
  }
};

// Q4_K (kQ5 false): d, dmin f16 | scales[12] | qs[128]. Q5_K: d, dmin | scales[12] | qh[32] | qs[128].
// Task tt: sub-blocks j = 2tt (low nibbles of qs[32tt, 32tt+32)), j+1 (high nibbles); Q5_K: bit j / j+1
// of qh[l] is bit 4. Value = d*sc*q - dmin*m: the min term goes through the activation block sums.
template <bool kQ5>
struct DK45 {
  static constexpr int kVals = 256, kBytes = kQ5 ? 176 : 144, kTasks = 4;
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int tt, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    uint32_t q[8], lo[8], hi[8];
    ldw<A, 8>(blk + (kQ5 ? 48 : 16) + 32 * tt, q);
    const int j = 2 * tt;
    if constexpr (kQ5) {
      uint32_t h[8];
      ldw<A, 8>(blk + 16, h);
STRATA_FD_UNROLL
      for (int i = 0; i < 8; ++i) {
        lo[i] = (q[i] & kLo4) | (((h[i] >> j) & 0x01010101u) << 4);
        hi[i] = ((q[i] >> 4) & kLo4) | (((h[i] >> (j + 1)) & 0x01010101u) << 4);
      }
    } else {
STRATA_FD_UNROLL
      for (int i = 0; i < 8; ++i) lo[i] = q[i] & kLo4, hi[i] = (q[i] >> 4) & kLo4;
    }
    uint32_t head[4];  // d, dmin | scales[12]: one 16-byte load when aligned
    ldw<A, 4>(blk, head);
    const float d = dq::h2f(head[0] & 0xFFFF), dmin = dq::h2f(head[0] >> 16);
    const uint32_t sw[3] = {head[1], head[2], head[3]};
    int sc0, m0, sc1, m1;
    fd::k4_scale_min_w(j, sw, sc0, m0);
    fd::k4_scale_min_w(j + 1, sw, sc1, m1);
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int x0[8], x1[8];
      ldx32(xq + t * xs + 64 * tt, x0);
      ldx32(xq + t * xs + 64 * tt + 32, x1);
      int s0 = 0, s1 = 0;
STRATA_FD_UNROLL
      for (int i = 0; i < 8; ++i) s0 = dp4a(int(lo[i]), x0[i], s0), s1 = dp4a(int(hi[i]), x1[i], s1);
      const float2 a = xds[t * dss + j], c = xds[t * dss + j + 1];
      acc[t] += d * (a.x * float(s0) * float(sc0) + c.x * float(s1) * float(sc1)) -
                dmin * (a.y * float(m0) + c.y * float(m1));
    }
  }
};
using DQ4K = DK45<false>;
using DQ5K = DK45<true>;

// Q6_K: ql[128] | qh[64] | scales[16] int8 | d f16 (210 bytes: 2-byte aligned loads only). Task tt:
// half = tt/2, par = tt%2: ql[64half + 32par + l] and qh[32half + l], l < 32, hold group par (low
// nibbles, qh bits 2par) and group par+2 (high nibbles, qh bits 4+2par) of the half, each code minus 32;
// one int8 scale per 16 values. The codes are made signed with one byte-wise subtract (no block sum for
// 16-value halves exists).
struct DQ6K {
  static constexpr int kVals = 256, kBytes = 210, kTasks = 4;
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int tt, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    body<A, NT>(blk, dq::h2f(dq::ld16<2>(blk + 208)), tt, xq, xs, xds, dss, nt, acc);
  }
  // Task tt of the block whose ql | qh | scales start at b (aligned to A) and whose scale is d.
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void body(const uint8_t* b, float d, int tt, const int8_t* xq, int64_t xs,
                                                       const float2* xds, int64_t dss, int nt, float acc[NT]) {
    const int half = tt >> 1, par = tt & 1;
    uint32_t ql[8], qh[8];
    ldw<A, 8>(b + 64 * half + 32 * par, ql);
    ldw<A, 8>(b + 128 + 32 * half, qh);
    int lo[8], hi[8];
STRATA_FD_UNROLL
    for (int i = 0; i < 8; ++i) {
      lo[i] = sub32((ql[i] & kLo4) | (((qh[i] >> (2 * par)) & 0x03030303u) << 4));
      hi[i] = sub32(((ql[i] >> 4) & kLo4) | (((qh[i] >> (4 + 2 * par)) & 0x03030303u) << 4));
    }
    const uint32_t sa = dq::ld16<2>(b + 192 + 8 * half + 2 * par), sb = dq::ld16<2>(b + 196 + 8 * half + 2 * par);
    const int sa0 = int(int8_t(sa & 0xFF)), sa1 = int(int8_t(sa >> 8));
    const int sb0 = int(int8_t(sb & 0xFF)), sb1 = int(int8_t(sb >> 8));
    const int ba = 4 * half + par, bb = ba + 2;  // activation blocks of the two groups
STRATA_FD_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int xa[8], xb[8];
      ldx32(xq + t * xs + 32 * ba, xa);
      ldx32(xq + t * xs + 32 * bb, xb);
      int a0 = 0, a1 = 0, b0 = 0, b1 = 0;
STRATA_FD_UNROLL
      for (int i = 0; i < 4; ++i) {
        a0 = dp4a(lo[i], xa[i], a0), a1 = dp4a(lo[4 + i], xa[4 + i], a1);
        b0 = dp4a(hi[i], xb[i], b0), b1 = dp4a(hi[4 + i], xb[4 + i], b1);
      }
      acc[t] += d * (xds[t * dss + ba].x * float(sa0 * a0 + sa1 * a1) + xds[t * dss + bb].x * float(sb0 * b0 + sb1 * b1));
    }
  }
};

// Q6_K regrouped (quant/q6_k_x8.h): d[8] f16 | body[8][208] (ql | qh | scales). Task tt = task tt % 4 of
// super-block tt / 4, its codes 16-byte loads (A = 16), with DQ6K's integer sums and float expression: the
// same values bit for bit, and the tasks of a row in Q6_K's order.
struct DQ6KX8 {
  static constexpr int kVals = 2048, kBytes = 1680, kTasks = 32;
  template <int A, int NT>
  __host__ __device__ __forceinline__ static void dot(const uint8_t* blk, int tt, const int8_t* xq, int64_t xs,
                                             const float2* xds, int64_t dss, int nt, float acc[NT]) {
    const int sb = tt >> 2;
    DQ6K::body<A, NT>(blk + 16 + 208 * sb, dq::h2f(dq::ld16<2>(blk + 2 * sb)), tt & 3, xq + 256 * sb, xs,
                      xds + 8 * sb, dss, nt, acc);
  }
};

// Q6_K padded (quant/q6_k_p.h): the Q6_K block, then 14 bytes of zeros (224 bytes); DQ6K's task on it (its
// dot, inherited), its codes 16-byte loads (A = 16) where the rows are 16-byte aligned.
struct DQ6KP : DQ6K {
  static constexpr int kBytes = 224;
};

#ifdef __CUDA_ARCH__
#define STRATA_Q8_UNROLL2 _Pragma("unroll 2")
#else
#define STRATA_Q8_UNROLL2
#endif

// log2 of the lanes that share one weight row: the smallest power of two >= the row's tasks, at most 32
// (why: a 768-column K-quant row has 12 tasks; 16 lanes per row keep 3/4 of the lanes busy, not 3/8).
__host__ __device__ constexpr int lanes_per_row_log2(int tasks) {
  int l = 0;
  while ((1 << l) < tasks && l < 5) ++l;
  return l;
}

// Lane `sub` of the lpr lanes of one row: acc[t] += its tasks sub, sub + lpr, ... of row wr ([cols] in F,
// A-aligned) against tokens t < nt of xt ([nt][cols] int8) / dt ([nt][cols/32]). The kernels add the
// lanes' partials with a butterfly; a host test runs it with lpr = 1 (q8ref's order, bit for bit).
template <typename F, int A, int NT>
__host__ __device__ __forceinline__ void row_lane_partial(const uint8_t* wr, int64_t cols, int sub, int lpr,
                                                          const int8_t* xt, const float2* dt, int nt,
                                                          float acc[NT]) {
  const int tasks = int(cols / F::kVals) * F::kTasks;
  const int64_t dss = cols / 32;
STRATA_Q8_UNROLL2
  for (int task = sub; task < tasks; task += lpr) {
    const int b = task / F::kTasks;
    F::template dot<A, NT>(wr + int64_t(b) * F::kBytes, task % F::kTasks, xt + int64_t(b) * F::kVals, cols,
                           dt + int64_t(b) * (F::kVals / 32), dss, nt, acc);
  }
}

// row_lane_partial for R rows at once: acc[r][t] += the lane's tasks of row wr[r] against token t (why: a
// lane with one 2048-column task per row has a single load chain in flight; two rows per warp double it,
// for the big matrices where every SM has enough rows).
template <typename F, int A, int R, int NT>
__host__ __device__ __forceinline__ void rows_tokens_lane_partial(const uint8_t* const wr[R], int64_t cols, int sub,
                                                                  int lpr, const int8_t* xt, const float2* dt, int nt,
                                                                  float acc[R][NT]) {
  const int tasks = int(cols / F::kVals) * F::kTasks;
  const int64_t dss = cols / 32;
  if constexpr (R == 1) {
    // Two tasks per step: a 4096-column K-quant row (wo) gives each lane 2 tasks, both loads in flight.
    // (Not for R = 2: the output product's 1-task rows gain nothing and ptxas gives them more registers.)
STRATA_Q8_UNROLL2
    for (int task = sub; task < tasks; task += lpr) {
      const int b = task / F::kTasks;
      F::template dot<A, NT>(wr[0] + int64_t(b) * F::kBytes, task % F::kTasks, xt + int64_t(b) * F::kVals, cols,
                             dt + int64_t(b) * (F::kVals / 32), dss, nt, acc[0]);
    }
  } else {
    for (int task = sub; task < tasks; task += lpr) {
      const int b = task / F::kTasks;
STRATA_FD_UNROLL
      for (int r = 0; r < R; ++r)
        F::template dot<A, NT>(wr[r] + int64_t(b) * F::kBytes, task % F::kTasks, xt + int64_t(b) * F::kVals, cols,
                               dt + int64_t(b) * (F::kVals / 32), dss, nt, acc[r]);
    }
  }
}

// row_lane_partial for R rows of the same format and columns at once (acc[r] += lane's tasks of row
// wr[r], one token): the R rows' loads of a task are issued together (why: MoE rows are short, e.g. one
// 2048-column task per lane; R independent loads in flight per lane instead of one). (A lane's tasks two at a
// time, 2R loads in flight, measured no faster on the 48-layer Q4_0 decode: session 41.)
template <typename F, int A, int R>
__host__ __device__ __forceinline__ void rows_lane_partial(const uint8_t* const wr[R], int64_t cols, int sub, int lpr,
                                                           const int8_t* x, const float2* ds, float acc[R]) {
  const int tasks = int(cols / F::kVals) * F::kTasks;
  const int64_t dss = cols / 32;
  for (int task = sub; task < tasks; task += lpr) {
    const int b = task / F::kTasks;
STRATA_FD_UNROLL
    for (int r = 0; r < R; ++r)
      F::template dot<A, 1>(wr[r] + int64_t(b) * F::kBytes, task % F::kTasks, x + int64_t(b) * F::kVals, cols,
                            ds + int64_t(b) * (F::kVals / 32), dss, 1, acc + r);
  }
}

// moe_down's lane work for output row r of token t: lane `lane` of `lanes` takes the (j, task) pairs
// i = lane, lane + lanes, ... of the k experts (i = j * tasks_per_row + task), skips non-resident experts
// (ids[p] < 0 or table[ids[p]] < 0) and returns sum of wts[p] * (task dot) in that order.
// A == kStaged: expert j's row was copied by warp_copy into the region
// stage + j * stride and is read from there.
//   slots: [n_slots][slot_bytes], down rows at down_off, drb bytes apart  table: [n_expert]
//   hq: [n*k][n_ff]  hds: [n*k][n_ff/32]  ids, wts: [n*k]
template <typename F, int A>
__host__ __device__ __forceinline__ float down_lane_partial(const uint8_t* slots, int64_t slot_bytes, int64_t down_off,
                                                            int64_t drb, int64_t r, int64_t n_ff, const int32_t* table,
                                                            const int8_t* hq, const float2* hds, const int32_t* ids,
                                                            const float* wts, int64_t t, int k, int lane, int lanes,
                                                            uint8_t* stage = nullptr, int64_t stride = 0) {
  const int per = int(n_ff / F::kVals) * F::kTasks, total = k * per;
  const int64_t dss = n_ff / 32;
  float acc = 0.f;
STRATA_Q8_UNROLL2
  for (int i = lane; i < total; i += lanes) {
    const int j = i / per, task = i % per;
    const int64_t p = t * k + j;
    const int32_t e = ids[p];
    const int slot = e < 0 ? -1 : table[e];
    if (slot < 0) continue;
    const int b = task / F::kTasks;
    const uint8_t* row = slots + int64_t(slot) * slot_bytes + down_off + r * drb;
    if constexpr (A == kStaged) row = stage_dst(stage + j * stride, row);
    float d[1] = {0.f};
    F::template dot<A, 1>(row + int64_t(b) * F::kBytes,
                          task % F::kTasks, hq + p * n_ff + int64_t(b) * F::kVals, n_ff,
                          hds + p * dss + int64_t(b) * (F::kVals / 32), dss, 1, d);
    acc = fmaf(wts[p], d[0], acc);
  }
  return acc;
}

// down_lane_partial with the k experts' slots resolved beforehand: jslot[j] = the slot of pair t*k + j or
// -1 (the kernel looks the k of them up once, in parallel, into shared memory). The lane's first MAXIT
// (j, task) terms are unrolled with their loads unconditional (a term to skip reads the row and h of a
// resident pair `jf` instead and is not added), so all their weight loads can be in flight at once; terms
// past MAXIT * lanes go by the loop. Same terms, same order, same float as down_lane_partial.
// Why: there every term waited for ids[p], then table[e], then its weights: three dependent memory round
// trips per unrolled pair of terms. Returns 0 when no pair of the token is resident.
template <typename F, int A, int MAXIT>
__host__ __device__ __forceinline__ float down_lane_partial_slots(const uint8_t* slots, int64_t slot_bytes,
                                                                  int64_t down_off, int64_t drb, int64_t r,
                                                                  int64_t n_ff, const int* jslot, const int8_t* hq,
                                                                  const float2* hds, const float* wts, int64_t t,
                                                                  int k, int lane, int lanes,
                                                                  uint8_t* stage = nullptr, int64_t stride = 0) {
  const int per = int(n_ff / F::kVals) * F::kTasks, total = k * per;
  const int64_t dss = n_ff / 32;
  int jf = -1;  // a resident pair: what skipped terms read
  for (int j = 0; j < k && jf < 0; ++j)
    if (jslot[j] >= 0) jf = j;
  if (jf < 0) return 0.f;
  float acc = 0.f;
  float dv[MAXIT];
  bool on[MAXIT];
  int64_t pp[MAXIT];
STRATA_FD_UNROLL
  for (int it = 0; it < MAXIT; ++it) {
    const int i = lane + it * lanes;
    int j = i / per;
    const int task = i % per;
    on[it] = i < total && jslot[j < k ? j : jf] >= 0;
    if (!on[it]) j = jf;
    pp[it] = t * k + j;
    const int b = task / F::kTasks;
    const uint8_t* row = slots + int64_t(jslot[j]) * slot_bytes + down_off + r * drb;
    if constexpr (A == kStaged) row = stage_dst(stage + j * stride, row);
    float d[1] = {0.f};
    F::template dot<A, 1>(row + int64_t(b) * F::kBytes, task % F::kTasks, hq + pp[it] * n_ff + int64_t(b) * F::kVals,
                          n_ff, hds + pp[it] * dss + int64_t(b) * (F::kVals / 32), dss, 1, d);
    dv[it] = d[0];
  }
STRATA_FD_UNROLL
  for (int it = 0; it < MAXIT; ++it)
    if (on[it]) acc = fmaf(wts[pp[it]], dv[it], acc);
  for (int i = lane + MAXIT * lanes; i < total; i += lanes) {
    const int j = i / per, task = i % per;
    const int slot = jslot[j];
    if (slot < 0) continue;
    const int64_t p = t * k + j;
    const int b = task / F::kTasks;
    const uint8_t* row = slots + int64_t(slot) * slot_bytes + down_off + r * drb;
    if constexpr (A == kStaged) row = stage_dst(stage + j * stride, row);
    float d[1] = {0.f};
    F::template dot<A, 1>(row + int64_t(b) * F::kBytes, task % F::kTasks, hq + p * n_ff + int64_t(b) * F::kVals, n_ff,
                          hds + p * dss + int64_t(b) * (F::kVals / 32), dss, 1, d);
    acc = fmaf(wts[p], d[0], acc);
  }
  return acc;
}

template <int A>
using IntC = std::integral_constant<int, A>;

// True for the low-bit formats' structs (q8_formats_low.cuh, q8_formats_iq.cuh: q8ref::low_bit's types),
// which declare kLowBit (the CUDA code is C++17: detection by void_t).
template <typename F, typename = void>
struct IsLowBit : std::false_type {};
template <typename F>
struct IsLowBit<F, std::void_t<decltype(F::kLowBit)>> : std::true_type {};
template <typename F>
inline constexpr bool kLowBit = IsLowBit<F>::value;

// The alignment in bytes (16, 8, 4 or 2) that every weight row start of a product has: the largest that
// divides the base address and the row stride (a distinct type so that no bool or count passes for it).
struct Align {
  int bytes = 2;
};
__host__ __device__ constexpr Align align_of(uintptr_t base, int64_t stride) {
  int a = 16;
  while (a > 2 && (base % uintptr_t(a) != 0 || stride % a != 0)) a /= 2;
  return Align{a};
}
__host__ __device__ constexpr Align min_align(Align a, Align b) { return a.bytes < b.bytes ? a : b; }

// dispatch for the first six formats: Q4_K / Q5_K / Q4_0_X8 with A = 16 (144 / 176-byte blocks) when the
// rows are 16-byte aligned, else A = 2; Q4_0 / Q8_0 / Q6_K always A = 2 (18 / 34 / 210-byte blocks).
// f(F{}, IntC<16>{}) for rows 16-byte aligned, else f(F{}, IntC<2>{}) (staged): the formats whose blocks are
// whole 16-byte multiples.
template <typename F, typename Fn>
void with_16_or_2(Align al, Fn&& f) {
  if (al.bytes >= 16) f(F{}, IntC<16>{});
  else f(F{}, IntC<2>{});
}

template <typename Fn>
bool dispatch_core(GgmlType t, Align al, Fn&& f) {
  switch (t) {
    case GgmlType::Q4_0: f(DQ40{}, IntC<2>{}); return true;
    case GgmlType::Q4_0_X8: with_16_or_2<DQ40X8>(al, f); return true;
    case GgmlType::Q8_0: f(DQ80{}, IntC<2>{}); return true;
    case GgmlType::Q6_K: f(DQ6K{}, IntC<2>{}); return true;
    case GgmlType::Q4_K: with_16_or_2<DQ4K>(al, f); return true;
    case GgmlType::Q5_K: with_16_or_2<DQ5K>(al, f); return true;
    default: return false;
  }
}

// dispatch for the low-bit formats (q8ref::low_bit): IQ4_XS and IQ1_M A = 8 (136 / 56-byte blocks), Q2_K A = 4
// (84), and false for rows with less alignment (q8ref::min_row_align: the callers check it first); Q3_K,
// IQ4_NL, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S always 2 (110 / 18 / 66 / 74 / 82 / 98 / 110 / 50-byte
// blocks).
template <typename Fn>
bool dispatch_low(GgmlType t, Align al, Fn&& f) {
  const int a = al.bytes;
  switch (t) {
    case GgmlType::Q2_K:
      if (a < 4) return false;
      f(DQ2K{}, IntC<4>{});
      return true;
    case GgmlType::Q3_K: f(DQ3K{}, IntC<2>{}); return true;
    case GgmlType::IQ4_XS:
      if (a < 8) return false;
      f(DIQ4XS{}, IntC<8>{});
      return true;
    case GgmlType::IQ4_NL: f(DIQ4NL{}, IntC<2>{}); return true;
    case GgmlType::IQ2_XXS: f(DIQ2XXS{}, IntC<2>{}); return true;
    case GgmlType::IQ2_XS: f(DIQ2XS{}, IntC<2>{}); return true;
    case GgmlType::IQ2_S: f(DIQ2S{}, IntC<2>{}); return true;
    case GgmlType::IQ3_XXS: f(DIQ3XXS{}, IntC<2>{}); return true;
    case GgmlType::IQ3_S: f(DIQ3S{}, IntC<2>{}); return true;
    case GgmlType::IQ1_S: f(DIQ1S{}, IntC<2>{}); return true;
    case GgmlType::IQ1_M:
      if (a < 8) return false;
      f(DIQ1M{}, IntC<8>{});
      return true;
    default: return false;
  }
}

// Calls f(Format{}, IntC<A>{}) for a supported type, A the widest load its blocks allow at the rows'
// alignment (above); the kernels stage A == 2 rows in shared memory where they fit. False for any other type.
template <typename Fn>
bool dispatch(GgmlType t, Align al, Fn&& f) {
  return dispatch_core(t, al, f) || dispatch_low(t, al, f);
}

// dispatch for the formats only dense products take (model_common.h product_type), never experts: Q6_K_X8,
// A = 16 when the rows are 16-byte aligned, else A = 2. Why apart: gate_up's pairs and moe_down instantiate
// their kernels per format of dispatch_core / dispatch, and no expert is stored in them.
template <typename Fn>
bool dispatch_dense_only(GgmlType t, Align al, Fn&& f) {
  if (t != GgmlType::Q6_K_X8) return false;
  with_16_or_2<DQ6KX8>(al, f);
  return true;
}

// dispatch for the formats only expert down matrices take (expert_cache.cpp slot types), never dense ones or
// gate / up: Q6_K_P, A = 16 when the rows are 16-byte aligned, else A = 2.
template <typename Fn>
bool dispatch_down_only(GgmlType t, Align al, Fn&& f) {
  if (t != GgmlType::Q6_K_P) return false;
  with_16_or_2<DQ6KP>(al, f);
  return true;
}

// dispatch for moe_down: every format of dispatch and the padded down ones.
template <typename Fn>
bool dispatch_down(GgmlType t, Align al, Fn&& f) {
  return dispatch(t, al, f) || dispatch_down_only(t, al, f);
}

// dispatch for the dense products (matvec, wo_router): every format of dispatch and the regrouped dense ones.
template <typename Fn>
bool dispatch_dense(GgmlType t, Align al, Fn&& f) {
  return dispatch(t, al, f) || dispatch_dense_only(t, al, f);
}

// gate_up's (gate, up) pairs: any two of the first six formats; a low-bit format only with itself (both
// then at the smaller of the two alignments). Why: the kernels are instantiated per pair; all pairs of the
// seventeen would be ~8x the compile time of the six's, for mixes no quantizer writes (llama.cpp gives gate
// and up the same type). f(G{}, IntC<AG>{}, U{}, IntC<AU>{}); false where the pair has no kernel.
template <typename Fn>
bool dispatch_pair(GgmlType g, Align ga, GgmlType u, Align ua, Fn&& f) {
  if (q8ref::low_bit(g) || q8ref::low_bit(u))
    return g == u && dispatch_low(g, min_align(ga, ua), [&](auto fm, auto a) { f(fm, a, fm, a); });
  bool ok = false;
  dispatch_core(g, ga, [&](auto gf, auto gA) {
    ok = dispatch_core(u, ua, [&](auto uf, auto uA) { f(gf, gA, uf, uA); });
  });
  return ok;
}

}  // namespace strata::cuda::q8d
