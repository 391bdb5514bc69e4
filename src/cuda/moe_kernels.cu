// Routed experts of one MoE layer from expert-cache slots (contract: moe_kernels.cuh).
// One warp per output row of one (token, expert) pair, as in quant_kernels.cu's matmul (fast_dot.cuh's
// formats through the fast_* kernels, the others through the generic ones); the expert's
// slot comes from the device residency-table row at run time, so a non-resident expert costs one table
// read. No atomics: every output element is written by exactly one warp, and moe_down sums the experts
// of a token inside that warp in a fixed order (generic: j order; fast: per lane, then a warp tree), so
// results are deterministic.
#include "cuda/moe_kernels.cuh"

#include <algorithm>
#include <string>
#include <tuple>
#include <type_traits>

#include "common/error.h"
#include "cuda/dequant_device.cuh"
#include "cuda/fast_dot.cuh"
#include "cuda/pdl.cuh"
#include "cuda/quant_kernels.cuh"
#include "moe/direct_rule.h"

namespace strata::cuda::moe {
namespace {

constexpr int kWarps = 4;  // output rows per block

// Where the kernels read an expert's weights: its slot, or for a direct pair (moe/direct_rule.h) its
// pinned host copy over PCIe (same layout, slot_bytes apart, indexed by expert id).
struct Src {
  const uint8_t* slots;   // device: [n_slots][slot_bytes]
  int64_t slot_bytes;
  const uint8_t* direct;  // pinned host, device-accessible: [n_expert][slot_bytes]; null: none
  int share;              // direct share of each token's misses (1/256ths)
  uint8_t* stage;         // device: [n][per_tok][slot_bytes] (moe_direct_fetch); null: read direct
  int per_tok;
  int64_t expert_bytes;   // bytes moe_direct_fetch copies of a pair's expert (<= slot_bytes)
};

Src src_of(const ExpertLayerView& v) {
  return {v.slots, v.slot_bytes, v.direct, v.direct ? v.direct_share : 0, v.stage, v.stage_per_token,
          v.copy_bytes()};
}

// The weights of pair p = t*k + j: its slot when resident; when direct, its staging slot (or its host copy
// without staging); else null (the CPU pool runs it, or a negative id).
__device__ __forceinline__ const uint8_t* pair_base(const Src& s, const int32_t* table, const int32_t* ids, int64_t p,
                                                    int k) {
  const int32_t e = ids[p];
  if (e < 0) return nullptr;
  const int slot = table[e];
  if (slot >= 0) return s.slots + int64_t(slot) * s.slot_bytes;
  if (s.share <= 0) return nullptr;
  const int64_t t = p / k;
  const int rank = strata::moe::direct_rank(ids + t * k, table, k, int(p - t * k), s.share);
  if (rank < 0) return nullptr;
  return s.stage ? s.stage + (t * s.per_tok + rank) * s.slot_bytes : s.direct + int64_t(e) * s.slot_bytes;
}

// moe_direct_fetch: grid x = slices of an expert, y = pairs (grid-stride). Why only expert_bytes: in a file
// whose layers differ in type (llama.cpp's Q4_K_M: Q6_K down in half of them) the smaller layers' experts
// fill ~84% of a slot, and these copies are PCIe-bound. kVec: 16-byte copies (host copy, staging,
// slot_bytes and expert_bytes 16-byte aligned), each thread with 8 loads in flight before its stores (a PCIe
// read takes ~1-2 us; session 10's probe reached the copy engine's rate with 8 in flight and >= 64 blocks).
constexpr int kFetchThreads = 256, kFetchSlices = 64, kFetchInFlight = 8;
template <bool kVec>
__global__ void __launch_bounds__(kFetchThreads)
    direct_fetch_kernel(Src src, const int32_t* __restrict__ table, const int32_t* __restrict__ ids, int64_t n_pairs,
                        int k) {
  pdl_wait();  // ids come from the router
  pdl_launch_dependents();
  for (int64_t p = blockIdx.y; p < n_pairs; p += gridDim.y) {
    const int32_t e = ids[p];
    if (e < 0 || table[e] >= 0) continue;
    const int64_t t = p / k;
    const int rank = strata::moe::direct_rank(ids + t * k, table, k, int(p - t * k), src.share);
    if (rank < 0) continue;
    const uint8_t* from = src.direct + int64_t(e) * src.slot_bytes;
    uint8_t* to = src.stage + (t * src.per_tok + rank) * src.slot_bytes;
    const int64_t units = kVec ? src.expert_bytes / 16 : src.expert_bytes;
    const int64_t per = (units + gridDim.x - 1) / gridDim.x;
    const int64_t lo = int64_t(blockIdx.x) * per, hi = min(units, lo + per);
    constexpr int B = kFetchThreads;
    if constexpr (kVec) {
      const uint4* f = reinterpret_cast<const uint4*>(from);
      uint4* o = reinterpret_cast<uint4*>(to);
      constexpr int R = kFetchInFlight;
      int64_t i = lo + threadIdx.x;
      for (; i + (R - 1) * B < hi; i += R * B) {
        uint4 q[R];
#pragma unroll
        for (int u = 0; u < R; ++u) q[u] = f[i + u * B];
#pragma unroll
        for (int u = 0; u < R; ++u) o[i + u * B] = q[u];
      }
      for (; i < hi; i += B) o[i] = f[i];
    } else {
      for (int64_t i = lo + threadIdx.x; i < hi; i += B) to[i] = from[i];
    }
  }
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// Gate and up of the same format: h[p][r] = silu(gate_e[r] . x[t]) * (up_e[r] . x[t]) for p = t*k + j.
// Grid: x = row blocks of n_ff, y = pairs (grid-stride).
template <typename F, int A>
__global__ void __launch_bounds__(32 * kWarps)
    gate_up_kernel(Src src, int64_t gate_off, int64_t up_off,
                   int64_t row_bytes, int64_t n_embd, int64_t n_ff, const int32_t* __restrict__ table,
                   const float* __restrict__ x, const int32_t* __restrict__ ids, int64_t n_pairs, int k,
                   float* __restrict__ h, bool xvec) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  pdl_wait();  // ids, the table and x / h come from earlier kernels and copies
  pdl_launch_dependents();
  if (r >= n_ff) return;
  for (int64_t p = blockIdx.y; p < n_pairs; p += gridDim.y) {
    const uint8_t* base = pair_base(src, table, ids, p, k);
    if (base == nullptr) continue;
    const float* xr = x + (p / k) * n_embd;
    const uint8_t* gr = base + gate_off + r * row_bytes;
    const uint8_t* ur = base + up_off + r * row_bytes;
    // Gate and up rows in one loop: both rows' loads in flight together, x read once.
    constexpr int kUnits = F::kVals / 8;
    const int units = int(n_embd / F::kVals) * kUnits;
    float ga = 0.f, ua = 0.f;
#pragma unroll 2
    for (int u = threadIdx.x & 31; u < units; u += 32) {
      const int b = u / kUnits, i8 = u % kUnits;
      float gv[8], uv[8], xv[8];
      F::template deq8<A>(gr + int64_t(b) * F::kBytes, i8, gv);
      F::template deq8<A>(ur + int64_t(b) * F::kBytes, i8, uv);
      dq::load_x8(xr, int64_t(b) * F::kVals + 8 * i8, xvec, xv);
#pragma unroll
      for (int q = 0; q < 8; ++q) ga = fmaf(gv[q], xv[q], ga), ua = fmaf(uv[q], xv[q], ua);
    }
    if constexpr (F::kFloat)
      for (int64_t c = int64_t(units) * 8 + (threadIdx.x & 31); c < n_embd; c += 32) {
        const float xc = __ldg(xr + c);
        ga = fmaf(F::one(gr, c), xc, ga), ua = fmaf(F::one(ur, c), xc, ua);
      }
    const float g = dq::warp_sum(ga), u = dq::warp_sum(ua);
    if ((threadIdx.x & 31) == 0) h[p * n_ff + r] = silu(g) * u;
  }
}

// Gate and up of different formats, one pass each. Pass 0 (gate): h[p][r] = gate . x. Pass 1 (up):
// h[p][r] = silu(h[p][r]) * (up . x). Same grid as gate_up_kernel; the passes are ordered on the stream.
template <typename F, int A, bool kUp>
__global__ void __launch_bounds__(32 * kWarps)
    gate_or_up_kernel(Src src, int64_t off, int64_t row_bytes,
                      int64_t n_embd, int64_t n_ff, const int32_t* __restrict__ table, const float* __restrict__ x,
                      const int32_t* __restrict__ ids, int64_t n_pairs, int k, float* __restrict__ h, bool xvec) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  pdl_wait();  // ids, the table and x / h come from earlier kernels and copies
  pdl_launch_dependents();
  if (r >= n_ff) return;
  for (int64_t p = blockIdx.y; p < n_pairs; p += gridDim.y) {
    const uint8_t* base = pair_base(src, table, ids, p, k);
    if (base == nullptr) continue;
    const uint8_t* wr = base + off + r * row_bytes;
    const float d = dq::warp_row_dot<F, A>(wr, n_embd, x + (p / k) * n_embd, xvec);
    if ((threadIdx.x & 31) == 0) {
      float* hp = h + p * n_ff + r;
      *hp = kUp ? silu(*hp) * d : d;
    }
  }
}

// out[t][r] = sum_j (resident) wts[t*k+j] * (down_e[r] . h[t*k+j]), j increasing.
// Grid: x = row blocks of n_embd, y = tokens (grid-stride). The experts of a token are taken 4 at a time
// in one loop over the row's units (why: a token's k rows are short, e.g. 768 values; one expert at a
// time would leave one dependent chain of table read, weight loads and reduction per expert). Each
// expert's dot is still reduced on its own and added in j order: the same sum, deterministic.
template <typename F, int A>
__global__ void __launch_bounds__(32 * kWarps)
    down_kernel(Src src, int64_t down_off, int64_t row_bytes,
                int64_t n_embd, int64_t n_ff, const int32_t* __restrict__ table, const float* __restrict__ h,
                const int32_t* __restrict__ ids, const float* __restrict__ wts, int64_t n, int k,
                float* __restrict__ out, bool hvec) {
  constexpr int kGroup = 4;
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  pdl_wait();  // ids, the table and x / h come from earlier kernels and copies
  pdl_launch_dependents();
  if (r >= n_embd) return;
  constexpr int kUnits = F::kVals / 8;
  const int units = int(n_ff / F::kVals) * kUnits;
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    float acc = 0.f;
    for (int j0 = 0; j0 < k; j0 += kGroup) {
      const uint8_t* wr[kGroup];
      const float* hr[kGroup];
      bool live[kGroup];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const int64_t p = t * k + j0 + g;
        const uint8_t* base = j0 + g < k ? pair_base(src, table, ids, p, k) : nullptr;
        live[g] = base != nullptr;
        wr[g] = (live[g] ? base : src.slots) + down_off + r * row_bytes;
        hr[g] = h + p * n_ff;
      }
      float part[kGroup] = {0.f, 0.f, 0.f, 0.f};
      for (int u = lane; u < units; u += 32) {
        const int b = u / kUnits, i8 = u % kUnits;
        const int64_t c = int64_t(b) * F::kVals + 8 * i8;
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          if (!live[g]) continue;  // warp-uniform
          float v[8], hv[8];
          F::template deq8<A>(wr[g] + int64_t(b) * F::kBytes, i8, v);
          dq::load_x8(hr[g], c, hvec, hv);
#pragma unroll
          for (int q = 0; q < 8; ++q) part[g] = fmaf(v[q], hv[q], part[g]);
        }
      }
      if constexpr (F::kFloat)
        for (int64_t c = int64_t(units) * 8 + lane; c < n_ff; c += 32)
#pragma unroll
          for (int g = 0; g < kGroup; ++g)
            if (live[g]) part[g] = fmaf(F::one(wr[g], c), __ldg(hr[g] + c), part[g]);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float d = dq::warp_sum(part[g]);
        if (live[g]) acc += wts[t * k + j0 + g] * d;
      }
    }
    if (lane == 0) out[t * n_embd + r] = acc;
  }
}

// ---- Fast path (fast_dot.cuh formats, rows aligned for their loads) ----

// Gate and up of the same fast format: the warp's gate row and up row are the R = 2 rows of
// fd::chunk_dot, so each x load serves both. Grid as gate_up_kernel.
template <typename K>
__global__ void __launch_bounds__(32 * kWarps)
    fast_gate_up_kernel(Src src, int64_t gate_off, int64_t up_off,
                        int64_t row_bytes, int64_t n_embd, int64_t n_ff, const int32_t* __restrict__ table,
                        const float* __restrict__ x, const int32_t* __restrict__ ids, int64_t n_pairs, int k,
                        float* __restrict__ h, bool xvec) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  pdl_wait();  // ids, the table and x / h come from earlier kernels and copies
  pdl_launch_dependents();
  if (r >= n_ff) return;
  const int chunks = int(n_embd / K::kVals) * K::kChunks;
  for (int64_t p = blockIdx.y; p < n_pairs; p += gridDim.y) {
    const uint8_t* pb = pair_base(src, table, ids, p, k);
    if (pb == nullptr) continue;
    const uint8_t* base = pb + r * row_bytes;
    const float* xr = x + (p / k) * n_embd;
    float acc[2][1] = {{0.f}, {0.f}};
#pragma unroll 2
    for (int c = threadIdx.x & 31; c < chunks; c += 32) {
      const int64_t bo = int64_t(c / K::kChunks) * K::kBytes;
      const uint8_t* blk[2] = {base + gate_off + bo, base + up_off + bo};
      fd::chunk_dot<K, 2, 1>(blk, c % K::kChunks, xr + int64_t(c / K::kChunks) * K::kVals, 0, 1, xvec, acc);
    }
    const float g = dq::warp_sum(acc[0][0]), u = dq::warp_sum(acc[1][0]);
    if ((threadIdx.x & 31) == 0) h[p * n_ff + r] = silu(g) * u;
  }
}

// One fast-format row dot of a warp (every lane gets the total). wr: [cols] in K, xr: [cols].
template <typename K>
__device__ __forceinline__ float fast_warp_dot(const uint8_t* wr, int64_t cols, const float* xr, bool xvec) {
  const int chunks = int(cols / K::kVals) * K::kChunks;
  float acc[1][1] = {{0.f}};
#pragma unroll 2
  for (int c = threadIdx.x & 31; c < chunks; c += 32) {
    const uint8_t* blk[1] = {wr + int64_t(c / K::kChunks) * K::kBytes};
    fd::chunk_dot<K, 1, 1>(blk, c % K::kChunks, xr + int64_t(c / K::kChunks) * K::kVals, 0, 1, xvec, acc);
  }
  return dq::warp_sum(acc[0][0]);
}

// gate_or_up_kernel with a fast format.
template <typename K, bool kUp>
__global__ void __launch_bounds__(32 * kWarps)
    fast_gate_or_up_kernel(Src src, int64_t off, int64_t row_bytes,
                           int64_t n_embd, int64_t n_ff, const int32_t* __restrict__ table,
                           const float* __restrict__ x, const int32_t* __restrict__ ids, int64_t n_pairs, int k,
                           float* __restrict__ h, bool xvec) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  pdl_wait();  // ids, the table and x / h come from earlier kernels and copies
  pdl_launch_dependents();
  if (r >= n_ff) return;
  for (int64_t p = blockIdx.y; p < n_pairs; p += gridDim.y) {
    const uint8_t* base = pair_base(src, table, ids, p, k);
    if (base == nullptr) continue;
    const uint8_t* wr = base + off + r * row_bytes;
    const float d = fast_warp_dot<K>(wr, n_embd, x + (p / k) * n_embd, xvec);
    if ((threadIdx.x & 31) == 0) {
      float* hp = h + p * n_ff + r;
      *hp = kUp ? silu(*hp) * d : d;
    }
  }
}

// down_kernel with a fast format: the lanes share out the (expert j, chunk) pairs of all k experts of the
// token (why: a down row is short, 768 values = 24 chunks, so one expert leaves lanes idle and one expert
// after another is a chain of k dependent memory round trips; here all k experts' loads are in flight
// together). Each lane adds wts[j] * (its chunk's dot) in a fixed order, then one warp sum: a fixed
// summation order, so the result is deterministic (not the same order as down_kernel's).
template <typename K>
__global__ void __launch_bounds__(32 * kWarps)
    fast_down_kernel(Src src, int64_t down_off, int64_t row_bytes,
                     int64_t n_embd, int64_t n_ff, const int32_t* __restrict__ table, const float* __restrict__ h,
                     const int32_t* __restrict__ ids, const float* __restrict__ wts, int64_t n, int k,
                     float* __restrict__ out, bool hvec) {
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  pdl_wait();  // ids, the table and x / h come from earlier kernels and copies
  pdl_launch_dependents();
  if (r >= n_embd) return;
  const int chunks = int(n_ff / K::kVals) * K::kChunks;
  const int tasks = k * chunks;
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    float acc = 0.f;
#pragma unroll 2
    for (int i = lane; i < tasks; i += 32) {
      const int j = i / chunks, c = i % chunks;
      const int64_t p = t * k + j;
      const uint8_t* base = pair_base(src, table, ids, p, k);
      if (base != nullptr) {
        const int64_t b = c / K::kChunks;
        const uint8_t* blk[1] = {base + down_off + r * row_bytes + b * K::kBytes};
        float a[1][1] = {{0.f}};
        fd::chunk_dot<K, 1, 1>(blk, c % K::kChunks, h + p * n_ff + b * K::kVals, 0, 1, hvec, a);
        acc = fmaf(wts[p], a[0][0], acc);
      }
    }
    const float s = dq::warp_sum(acc);
    if (lane == 0) out[t * n_embd + r] = s;
  }
}

// Where the kernels read direct pairs: the staging slots when fetched, else the host copy.
const uint8_t* direct_base(const ExpertLayerView& v) { return v.stage ? v.stage : v.direct; }

// Every row of a slot tensor at slots + s*slot_bytes + off (and direct_base + i*slot_bytes + off) is
// K::kAlign-aligned (the fast path's loads).
template <typename K>
bool fast_rows_aligned(const ExpertLayerView& v, int64_t off, int64_t row_bytes) {
  return fd::rows_aligned<K>(v.slots + off, row_bytes) && v.slot_bytes % K::kAlign == 0 &&
         (v.direct == nullptr || fd::rows_aligned<K>(direct_base(v) + off, row_bytes));
}

// Every row of a tensor at slots + s*slot_bytes + off (and direct_base + i*slot_bytes + off; row_bytes apart) is
// F::kAlign-aligned.
template <typename F>
bool slot_rows_aligned(const ExpertLayerView& v, int64_t off, int64_t row_bytes) {
  return dq::aligned_for<F>(v.slots + off, row_bytes) && v.slot_bytes % F::kAlign == 0 &&
         (v.direct == nullptr || dq::aligned_for<F>(direct_base(v) + off, row_bytes));
}

void check_view(const ExpertLayerView& v, const char* what, int64_t n, int k) {
  STRATA_REQUIRE(v.slots != nullptr && v.slot_bytes > 0, "cuda {}: no expert slots", what);
  STRATA_REQUIRE(v.expert_bytes >= 0 && v.expert_bytes <= v.slot_bytes, "cuda {}: {} expert bytes in a {}-byte slot",
                 what, v.expert_bytes, v.slot_bytes);
  STRATA_REQUIRE(v.direct_share >= 0 && v.direct_share <= strata::moe::kDirectShareOne,
                 "cuda {}: direct share {} outside [0, {}]", what, v.direct_share, strata::moe::kDirectShareOne);
  STRATA_REQUIRE(v.stage == nullptr || (v.direct != nullptr && v.stage_per_token >= 0 &&
                                        v.stage_per_token >= strata::moe::direct_count(k, v.direct_share)),
                 "cuda {}: {} staging slots a token for a direct share of {} of {} pairs", what, v.stage_per_token,
                 v.direct_share, k);
  STRATA_REQUIRE(v.n_embd > 0 && v.n_ff > 0 && n >= 0 && k > 0, "cuda {}: bad shape n_embd {} n_ff {} n {} k {}",
                 what, v.n_embd, v.n_ff, n, k);
  STRATA_REQUIRE(n * k <= int64_t(1) << 40, "cuda {}: {} x {} pairs is too many", what, n, k);
  for (auto [t, cols, off, rows] : {std::tuple{v.gate_type, v.n_embd, v.gate_off, v.n_ff},
                                    std::tuple{v.up_type, v.n_embd, v.up_off, v.n_ff},
                                    std::tuple{v.down_type, v.n_ff, v.down_off, v.n_embd}}) {
    const TypeTraits* tt = find_type_traits(t);
    STRATA_REQUIRE(tt != nullptr && quant::has_kernel(t), "cuda {}: expert type {} has no GPU kernel", what,
                   tt ? std::string(tt->name) : std::to_string(static_cast<uint32_t>(t)));
    STRATA_REQUIRE(cols % tt->block_size == 0, "cuda {}: {} columns is not a multiple of the {} block size {}",
                   what, cols, tt->name, tt->block_size);
    STRATA_REQUIRE(off >= 0 && off + int64_t(row_bytes(t, cols)) * rows <= v.copy_bytes(),
                   "cuda {}: a {} tensor at offset {} does not fit in the {} bytes of an expert", what, tt->name, off,
                   v.copy_bytes());
  }
}

unsigned grid_y(int64_t n) { return unsigned(std::min<int64_t>(std::max<int64_t>(n, 1), 65535)); }

}  // namespace

void moe_direct_fetch(const ExpertLayerView& v, const int32_t* table, const int32_t* ids, int64_t n, int k,
                      cudaStream_t stream) {
  check_view(v, "moe_direct_fetch", n, k);
  STRATA_REQUIRE(v.direct != nullptr && v.stage != nullptr && v.direct_share > 0,
                 "cuda moe_direct_fetch: needs a direct view with staging slots");
  if (n == 0) return;
  const bool vec = reinterpret_cast<uintptr_t>(v.direct) % 16 == 0 && reinterpret_cast<uintptr_t>(v.stage) % 16 == 0 &&
                   v.slot_bytes % 16 == 0 && v.copy_bytes() % 16 == 0;
  const dim3 grid(kFetchSlices, grid_y(n * k));
  if (vec)
    pdl::launch(direct_fetch_kernel<true>, grid, kFetchThreads, 0, stream, src_of(v), table, ids, n * k, k);
  else
    pdl::launch(direct_fetch_kernel<false>, grid, kFetchThreads, 0, stream, src_of(v), table, ids, n * k, k);
}

void check_expert_view(const ExpertLayerView& v, const char* what, int64_t n, int k) { check_view(v, what, n, k); }

void moe_gate_up(const ExpertLayerView& v, const int32_t* table, const float* x, const int32_t* ids, int64_t n,
                 int k, float* h, cudaStream_t stream) {
  check_view(v, "moe_gate_up", n, k);
  if (n == 0) return;
  const int64_t pairs = n * k;
  const dim3 grid(unsigned((v.n_ff + kWarps - 1) / kWarps), grid_y(pairs));
  const bool xvec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && v.n_embd % 4 == 0;
  if (v.gate_type == v.up_type) {
    const int64_t rb = int64_t(row_bytes(v.gate_type, v.n_embd));
    bool fast = false;
    fd::dispatch(v.gate_type, [&](auto kf) {
      using K = decltype(kf);
      if (quant::generic_only() || !fast_rows_aligned<K>(v, v.gate_off, rb) || !fast_rows_aligned<K>(v, v.up_off, rb))
        return;
      fast = true;
      pdl::launch(fast_gate_up_kernel<K>, grid, 32 * kWarps, 0, stream, src_of(v), v.gate_off, v.up_off,
          rb, v.n_embd, v.n_ff, table, x, ids, pairs, k, h, xvec);
    });
    if (fast) return;
    dq::dispatch(v.gate_type, [&](auto f) {
      using F = decltype(f);
      if (slot_rows_aligned<F>(v, v.gate_off, rb) && slot_rows_aligned<F>(v, v.up_off, rb))
        pdl::launch(gate_up_kernel<F, F::kAlign>, grid, 32 * kWarps, 0, stream, src_of(v), v.gate_off,
            v.up_off, rb, v.n_embd, v.n_ff, table, x, ids, pairs, k, h, xvec);
      else
        pdl::launch(gate_up_kernel<F, 1>, grid, 32 * kWarps, 0, stream, src_of(v), v.gate_off, v.up_off,
            rb, v.n_embd, v.n_ff, table, x, ids, pairs, k, h, xvec);
    });
    return;
  }
  auto pass = [&](GgmlType type, int64_t off, auto up) {
    constexpr bool kUp = decltype(up)::value;
    const int64_t rb = int64_t(row_bytes(type, v.n_embd));
    bool fast = false;
    fd::dispatch(type, [&](auto kf) {
      using K = decltype(kf);
      if (quant::generic_only() || !fast_rows_aligned<K>(v, off, rb)) return;
      fast = true;
      pdl::launch(fast_gate_or_up_kernel<K, kUp>, grid, 32 * kWarps, 0, stream, src_of(v), off, rb,
          v.n_embd, v.n_ff, table, x, ids, pairs, k, h, xvec);
    });
    if (fast) return;
    dq::dispatch(type, [&](auto f) {
      using F = decltype(f);
      if (slot_rows_aligned<F>(v, off, rb))
        pdl::launch(gate_or_up_kernel<F, F::kAlign, kUp>, grid, 32 * kWarps, 0, stream, src_of(v), off,
            rb, v.n_embd, v.n_ff, table, x, ids, pairs, k, h, xvec);
      else
        pdl::launch(gate_or_up_kernel<F, 1, kUp>, grid, 32 * kWarps, 0, stream, src_of(v), off, rb,
            v.n_embd, v.n_ff, table, x, ids, pairs, k, h, xvec);
    });
  };
  pass(v.gate_type, v.gate_off, std::false_type{});
  pass(v.up_type, v.up_off, std::true_type{});
}

void moe_down(const ExpertLayerView& v, const int32_t* table, const float* h, const int32_t* ids, const float* wts,
              int64_t n, int k, float* out, cudaStream_t stream) {
  check_view(v, "moe_down", n, k);
  if (n == 0) return;
  const dim3 grid(unsigned((v.n_embd + kWarps - 1) / kWarps), grid_y(n));
  const bool hvec = reinterpret_cast<uintptr_t>(h) % 16 == 0 && v.n_ff % 4 == 0;
  const int64_t rb = int64_t(row_bytes(v.down_type, v.n_ff));
  bool fast = false;
  fd::dispatch(v.down_type, [&](auto kf) {
    using K = decltype(kf);
    if (quant::generic_only() || !fast_rows_aligned<K>(v, v.down_off, rb)) return;
    fast = true;
    pdl::launch(fast_down_kernel<K>, grid, 32 * kWarps, 0, stream, src_of(v), v.down_off, rb, v.n_embd,
        v.n_ff, table, h, ids, wts, n, k, out, hvec);
  });
  if (fast) return;
  dq::dispatch(v.down_type, [&](auto f) {
    using F = decltype(f);
    if (slot_rows_aligned<F>(v, v.down_off, rb))
      pdl::launch(down_kernel<F, F::kAlign>, grid, 32 * kWarps, 0, stream, src_of(v), v.down_off, rb,
          v.n_embd, v.n_ff, table, h, ids, wts, n, k, out, hvec);
    else
      pdl::launch(down_kernel<F, 1>, grid, 32 * kWarps, 0, stream, src_of(v), v.down_off, rb, v.n_embd,
          v.n_ff, table, h, ids, wts, n, k, out, hvec);
  });
}

}  // namespace strata::cuda::moe
