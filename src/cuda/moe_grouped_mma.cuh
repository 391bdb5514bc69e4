#pragma once
// The grouped expert products of moe_grouped.cu on mma.sync (private to that file). One block: a tile of up
// to kMt sorted pairs of one expert times a band of weight rows. Two kernels:
//   grouped_mma_staged_kernel (STRATA_CUDA_MOE_GROUPED=2, the default where it applies: quantized formats,
//     n_embd and n_ff multiples of 256) copies each 256-column stage of its raw weight rows and of A into
//     shared memory by cp.async, a ring of 3 stages (2 where 3 do not fit), while it multiplies the oldest;
//   grouped_mma_kernel (=1, and where the staged one does not apply) stages only A; each thread reads its
//     weights from device memory where it dequantizes them.
// Why they are faster than the WMMA kernel (grouped_kernel):
//   * A (the pairs' input rows) is bf16 in device memory already (x converted once a layer; h written as
//     bf16 by the gate/up pass), copied into shared memory by cp.async, instead of f32 loads and
//     conversions in every block of a tile;
//   * B (the weights) never goes through shared memory as bf16: each thread dequantizes exactly the values
//     its mma fragments hold. The k order inside each 32-column step is permuted so that those values are
//     one deq8 unit: thread t of a quad (lane & 3) holds physical columns 8t..8t+7, which are its
//     fragment's logical columns {2t, 2t+1, 2t+8, 2t+9} of the first k16 step and the same of the second.
//     A is read with the same permutation (one 16-byte shared load per row gives both steps), so every
//     product is the same sum of the same terms, in another order;
//   * tiles of 64 pairs, so an expert with up to 64 pairs (512 tokens, top-8 of 128: ~32) dequantizes
//     its weights once; 16-row groups past the tile's count are skipped.
// Inputs are rounded to bf16 as in grouped_kernel; sums are f32 (mma's accumulate). Not bit-identical to
// grouped_kernel (the order of the terms inside each 16-column step differs); the two mma kernels give the
// same bits (the same steps in the same order).
#include <cuda_bf16.h>
#include <cuda_pipeline.h>

#include <cstdint>

#include "cuda/dequant_device.cuh"

namespace strata::cuda::moe {

// What a product kernel writes (every kernel of moe_grouped.cu; the WMMA kernel's h is f32).
enum Mode : int { kGateUp = 0, kGateOnly = 1, kUpApply = 2, kDown = 3 };

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

}  // namespace strata::cuda::moe

namespace strata::cuda::moe::mma {

constexpr int kMt = 64;                  // pairs per tile (4 groups of 16 rows)
constexpr int kWarps = 8;                // a block
constexpr int kThreads = 32 * kWarps;
constexpr int kKc = 128;                 // A columns per pipeline stage (4 steps of 32)
constexpr int kApitch = kKc + 32;        // bf16 per shared row: 320 bytes = 64 (mod 128), so the 16-byte loads
                                         // of a quarter warp (rows g, g+1, four quads) hit 32 distinct banks
constexpr int kRowsDual = 8 * kWarps;    // gate/up rows a block (each warp: 8 gate + the same 8 up rows)
constexpr int kRowsSingle = 16 * kWarps; // rows a block of one tensor (each warp: two n8 tiles)

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&p);
}

// c += A (16x16, row) * B (16x8, col), bf16 in, f32 accumulate. a0..a3, b0..b1: the PTX fragment registers.
__device__ __forceinline__ void mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A block's start in both kernels: the tile blockIdx.x of the routing, its expert e, the sorted position
// of its first pair and its pair count (<= kMt), and src_row[i] = the row of `in` for pair i of the tile
// (gather: x's row perm[pos0 + i] / k; else h's row pos0 + i), -1 past cnt. False for a tile past the
// routing's last (the block returns). src_row is read after the caller's next barrier.
__device__ __forceinline__ bool begin_tile(const int32_t* __restrict__ counts, const int32_t* __restrict__ offsets,
                                           const int32_t* __restrict__ tile_start, int n_expert,
                                           const int32_t* __restrict__ perm, int k, bool gather, int64_t* src_row,
                                           int& e, int& pos0, int& cnt) {
  const int tile = blockIdx.x;
  if (tile >= tile_start[n_expert]) return false;
  int lo = 0, hi = n_expert - 1;  // e = the largest with tile_start[e] <= tile (it owns the tile)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_start[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  e = lo;
  const int t_in = tile - tile_start[e];
  pos0 = offsets[e] + t_in * kMt;
  cnt = min(kMt, counts[e] - t_in * kMt);
  if (threadIdx.x < kMt) {
    const int i = threadIdx.x;
    src_row[i] = i < cnt ? (gather ? int64_t(perm[pos0 + i] / k) : int64_t(pos0 + i)) : -1;
  }
  return true;
}

// cp.async of the tile's A columns [col0, col0 + Cols) into dst [kMt][Pitch] (bf16), 16 bytes a copy, by
// Threads threads: pair i's row src_row[i] of in [.][K]; rows of src_row -1 (past the tile's count) are left
// as they are.
template <int Cols, int Pitch, int Threads>
__device__ __forceinline__ void copy_a_async(__nv_bfloat16* dst, const __nv_bfloat16* __restrict__ in,
                                             const int64_t* src_row, int64_t K, int64_t col0) {
  for (int u = threadIdx.x; u < kMt * (Cols / 8); u += Threads) {
    const int i = u / (Cols / 8), c8 = (u % (Cols / 8)) * 8;
    const int64_t sr = src_row[i];
    if (sr >= 0) __pipeline_memcpy_async(dst + i * Pitch + c8, in + sr * K + col0 + c8, 16);
  }
}

// b[0..3] for one n8 tile and one 32-column step: this thread's 8 physical columns (8t .. 8t+7 of the
// step) as bf16 pairs: b0, b1 of the first k16 step, then of the second.
__device__ __forceinline__ void pack_b(const float v[8], uint32_t b[4]) {
  b[0] = pack_bf16(v[0], v[1]), b[1] = pack_bf16(v[2], v[3]);
  b[2] = pack_bf16(v[4], v[5]), b[3] = pack_bf16(v[6], v[7]);
}

// One 32-column step of the tile: for each 16-row group m < groups, A rows 16m + g and 16m + 8 + g at
// columns col .. col + 8 (this thread's 8 physical columns; Ab: [kMt][pitch] bf16 in shared memory) times
// the two n8 tiles' b. acc: [group][tile][fragment].
template <int Pitch>
__device__ __forceinline__ void mma_step(float (&acc)[4][2][4], const __nv_bfloat16* Ab, int col, int g, int groups,
                                         const uint32_t (&b)[2][4]) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    if (m >= groups) break;  // (block-uniform)
    const uint4 rlo = *reinterpret_cast<const uint4*>(Ab + (16 * m + g) * Pitch + col);
    const uint4 rhi = *reinterpret_cast<const uint4*>(Ab + (16 * m + 8 + g) * Pitch + col);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      mma16816(acc[m][s], rlo.x, rhi.x, rlo.y, rhi.y, b[s][0], b[s][1]);
      mma16816(acc[m][s], rlo.z, rhi.z, rlo.w, rhi.w, b[s][2], b[s][3]);
    }
  }
}

// Stores the tile's results: fragment q of group m, tile s is pair row 16m + g (+8 for q >= 2), weight row
// r_tile[s] + 2t (+1 for odd q); rows past cnt are not stored. Modes: see grouped_mma_kernel.
template <bool Dual>
__device__ __forceinline__ void store_tile(const float (&acc)[4][2][4], int groups, int cnt, int pos0, int64_t rows,
                                           const int64_t (&r_tile)[2], int g, int t, int mode, float* outf,
                                           __nv_bfloat16* outb) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    if (m >= groups) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 16 * m + g + 8 * h;
      if (i >= cnt) continue;
      const int64_t orow = int64_t(pos0 + i) * rows;
      if constexpr (Dual) {
        const float* ga = &acc[m][0][2 * h];
        const float* ua = &acc[m][1][2 * h];
        *reinterpret_cast<uint32_t*>(outb + orow + r_tile[0] + 2 * t) =
            pack_bf16(silu(ga[0]) * ua[0], silu(ga[1]) * ua[1]);
      } else {
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const float* a = &acc[m][s][2 * h];
          const int64_t o = orow + r_tile[s] + 2 * t;
          if (mode == kUpApply) {
            const float2 gv = *reinterpret_cast<const float2*>(outf + o);
            *reinterpret_cast<uint32_t*>(outb + o) = pack_bf16(silu(gv.x) * a[0], silu(gv.y) * a[1]);
          } else {  // kGateOnly, kDown
            *reinterpret_cast<float2*>(outf + o) = make_float2(a[0], a[1]);
          }
        }
      }
    }
  }
}

// One block: tile `blockIdx.x` of the routing (expert e, pairs at sorted positions pos0 .. pos0 + cnt,
// cnt <= kMt) times a band of weight rows (blockIdx.y; Dual: kRowsDual rows of gate at off0 and of up at off1,
// else kRowsSingle rows at off0), W: [rows][K] in format F (blocks aligned to A bytes), read by each thread
// from device memory (the staged kernel below copies them to shared memory first).
//   in: gather ? xb [n][K] (row perm[pos]/k) : hb [P][K] (row pos), bf16
//   kGateUp (Dual): outb = hb [P][rows] = bf16(silu(gate) * up)
//   kGateOnly:      outf = hf [P][rows] = gate (f32)
//   kUpApply:       outb = hb [P][rows] = bf16(silu(outf) * up)
//   kDown:          outf = y [P][rows] (f32)
// Requires K % kKc == 0 and rows % (Dual ? kRowsDual : kRowsSingle) == 0 (the caller checks).
template <typename F, int A, bool Dual>
__global__ void __launch_bounds__(kThreads, 2)
    grouped_mma_kernel(const uint8_t* __restrict__ slots, int64_t slot_bytes, int64_t off0, int64_t off1,
                       int64_t row_bytes, int64_t K, int64_t rows, const int32_t* __restrict__ table, int n_expert,
                       const int32_t* __restrict__ counts, const int32_t* __restrict__ offsets,
                       const int32_t* __restrict__ tile_start, const int32_t* __restrict__ perm, int k,
                       const __nv_bfloat16* __restrict__ in, bool gather, float* outf, __nv_bfloat16* outb,
                       int mode) {
  __shared__ __align__(16) __nv_bfloat16 As[2][kMt][kApitch];  // [stage][pair][column of the stage]
  __shared__ int64_t src_row[kMt];                             // row of `in` for each pair of the tile, or -1
  int e, pos0, cnt;
  if (!begin_tile(counts, offsets, tile_start, n_expert, perm, k, gather, src_row, e, pos0, cnt)) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // The warp's two n8 tiles s = 0, 1: this thread dequantizes weight row wrow[s] (fragment column g).
  const uint8_t* base = slots + int64_t(table[e]) * slot_bytes;
  int64_t r_tile[2];
  const uint8_t* wrow[2];
  if constexpr (Dual) {
    r_tile[0] = r_tile[1] = int64_t(blockIdx.y) * kRowsDual + 8 * warp;
    wrow[0] = base + off0 + (r_tile[0] + g) * row_bytes;
    wrow[1] = base + off1 + (r_tile[1] + g) * row_bytes;
  } else {
    r_tile[0] = int64_t(blockIdx.y) * kRowsSingle + 16 * warp;
    r_tile[1] = r_tile[0] + 8;
    wrow[0] = base + off0 + (r_tile[0] + g) * row_bytes;
    wrow[1] = base + off0 + (r_tile[1] + g) * row_bytes;
  }
  const int nc = int(K / kKc);
  __syncthreads();  // src_row

  auto stage = [&](int c, int buf) {  // kMt rows x kKc columns = 1024 16-byte copies, 4 a thread
    copy_a_async<kKc, kApitch, kThreads>(&As[buf][0][0], in, src_row, K, int64_t(c) * kKc);
    __pipeline_commit();
  };

  const int groups = (cnt + 15) / 16;  // 16-row groups holding pairs (rows past cnt: garbage, never stored)
  float acc[4][2][4] = {};             // [group][n8 tile][fragment]
  stage(0, 0);
  for (int c = 0; c < nc; ++c) {
    if (c + 1 < nc) stage(c + 1, (c + 1) & 1);
    else __pipeline_commit();  // an empty group: the wait below always leaves one behind
    __pipeline_wait_prior(1);
    __syncthreads();  // stage c is in shared memory for every thread
#pragma unroll
    for (int kk = 0; kk < kKc / 32; ++kk) {
      const int64_t col = int64_t(c) * kKc + 32 * kk + 8 * t;  // this thread's 8 physical columns
      uint32_t b[2][4];
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        float v[8];
        F::template deq8<A>(wrow[s] + col / F::kVals * F::kBytes, int((col % F::kVals) / 8), v);
        pack_b(v, b[s]);
      }
      mma_step<kApitch>(acc, &As[c & 1][0][0], 32 * kk + 8 * t, g, groups, b);
    }
    __syncthreads();  // every read of buffer c & 1 is done before iteration c + 1 stages c + 2 into it
  }
  store_tile<Dual>(acc, groups, cnt, pos0, rows, r_tile, g, t, mode, outf, outb);
}

// ---- the staged kernel: weights copied to shared memory by cp.async with A ----
// Why: the kernel above reads each weight where it dequantizes it, a few bytes per thread and step, so an
// SM has only ~5 KB of weight loads in flight and HBM's latency bounds it (~0.4 TB/s measured on the H200,
// 2026-12-04); here a block copies a whole stage of its 256 raw weight rows (and the pairs' A) while it
// multiplies the previous one: ~40 KB in flight a stage for Q4_K.
constexpr int kSWarps = 16;
constexpr int kSThreads = 32 * kSWarps;
constexpr int kSc = 256;                    // columns a stage (a whole 256-value block of every K-quant)
constexpr int kSApitch = kSc + 32;          // bf16: 576 bytes = 64 (mod 128), as kApitch
constexpr int kSRowsDual = 8 * kSWarps;     // 128 rows of gate and the same of up a block
constexpr int kSRowsSingle = 16 * kSWarps;  // 256 rows of one tensor a block
constexpr int kSWrows = kSRowsSingle;       // raw weight rows a stage (Dual: gate's 128, then up's)

// Raw bytes a stage's columns take of one row of F, and the largest shared-memory pitch they can need: the
// 16-byte units covering those bytes wherever they start (a block of F is F::kAlign-aligned, so at most
// 16 - kAlign bytes precede it in its first unit). Where every row's stage bytes start 16-byte aligned the
// pitch is stage_row_bytes itself (the caller passes the pitch).
template <typename F>
constexpr int stage_row_bytes() {
  return kSc / F::kVals * F::kBytes;
}
template <typename F>
constexpr int stage_pitch_max() {
  return (stage_row_bytes<F>() + (F::kAlign >= 16 ? 0 : 16 - F::kAlign) + 15) / 16 * 16;
}
// Dynamic shared memory of grouped_mma_staged_kernel: `stages` stages of A and of raw weights at pitch wp.
constexpr size_t staged_smem_bytes(int stages, int wp) {
  return size_t(stages) * (size_t(kMt) * kSApitch * 2 + size_t(kSWrows) * size_t(wp));
}

// As grouped_mma_kernel (same modes and outputs), with blocks of kSThreads, bands of kSRowsDual /
// kSRowsSingle rows and stages of kSc columns in a ring of Stages buffers (Stages - 1 stages in flight
// while one is multiplied; one barrier a stage). wp: the pitch of a raw row in shared memory (a multiple of
// 16, >= the 16-byte units covering a row's stage bytes). Requires K % kSc == 0, rows % band == 0, the slots
// 16-byte aligned with slot_bytes % 16 == 0 (every copied unit lies inside the slots' memory), F quantized
// (kVals >= 32) and staged_smem_bytes(Stages, wp) dynamic shared memory.
template <typename F, int A, bool Dual, int Stages>
__global__ void __launch_bounds__(kSThreads, 1)
    grouped_mma_staged_kernel(const uint8_t* __restrict__ slots, int64_t slot_bytes, int64_t off0, int64_t off1,
                              int64_t row_bytes, int64_t K, int64_t rows, const int32_t* __restrict__ table,
                              int n_expert, const int32_t* __restrict__ counts, const int32_t* __restrict__ offsets,
                              const int32_t* __restrict__ tile_start, const int32_t* __restrict__ perm, int k,
                              const __nv_bfloat16* __restrict__ in, bool gather, float* outf,
                              __nv_bfloat16* outb, int mode, int wp) {
  static_assert(Stages >= 2, "a ring of at least two stages");
  constexpr int kCb = stage_row_bytes<F>();
  extern __shared__ __align__(16) uint8_t smem[];
  __nv_bfloat16* As = reinterpret_cast<__nv_bfloat16*>(smem);  // [Stages][kMt][kSApitch]
  uint8_t* Ws = smem + Stages * kMt * kSApitch * 2;             // [Stages][kSWrows][wp]
  __shared__ int64_t src_row[kMt];
  int e, pos0, cnt;
  if (!begin_tile(counts, offsets, tile_start, n_expert, perm, k, gather, src_row, e, pos0, cnt)) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint8_t* base = slots + int64_t(table[e]) * slot_bytes;
  const int64_t band = int64_t(blockIdx.y) * (Dual ? kSRowsDual : kSRowsSingle);
  // Raw row q (0 .. kSWrows) of the block: its start in device memory.
  auto raw_row = [&](int q) -> const uint8_t* {
    if constexpr (Dual) return base + (q < kSRowsDual ? off0 : off1) + (band + (q % kSRowsDual)) * row_bytes;
    else return base + off0 + (band + q) * row_bytes;
  };
  int64_t r_tile[2];
  int q_tile[2];  // the raw rows of this thread's two n8 tiles (fragment column g)
  if constexpr (Dual) {
    r_tile[0] = r_tile[1] = band + 8 * warp;
    q_tile[0] = 8 * warp + g, q_tile[1] = kSRowsDual + 8 * warp + g;
  } else {
    r_tile[0] = band + 16 * warp, r_tile[1] = r_tile[0] + 8;
    q_tile[0] = 16 * warp + g, q_tile[1] = 16 * warp + 8 + g;
  }
  const uint8_t* my_row[2] = {raw_row(q_tile[0]), raw_row(q_tile[1])};
  const int nc = int(K / kSc), nu = wp / 16;
  __syncthreads();  // src_row

  auto stage = [&](int c, int buf) {
    // A: 2048 copies, 4 a thread
    copy_a_async<kSc, kSApitch, kSThreads>(As + buf * kMt * kSApitch, in, src_row, K, int64_t(c) * kSc);
    uint8_t* Wb = Ws + buf * kSWrows * wp;
    for (int u = threadIdx.x; u < kSWrows * nu; u += kSThreads) {  // W: the units covering each row's bytes
      const int q = u / nu, j = u % nu;
      const uint8_t* p = raw_row(q) + int64_t(c) * kCb;
      const int lead = int(reinterpret_cast<uintptr_t>(p) & 15);
      if (16 * j < lead + kCb) __pipeline_memcpy_async(Wb + q * wp + 16 * j, p - lead + 16 * j, 16);
    }
    __pipeline_commit();
  };

  const int groups = (cnt + 15) / 16;
  float acc[4][2][4] = {};
#pragma unroll
  for (int c = 0; c < Stages - 1; ++c) {
    if (c < nc) stage(c, c);
    else __pipeline_commit();  // empty groups keep the count the waits below expect
  }
  for (int c = 0; c < nc; ++c) {
    __pipeline_wait_prior(Stages - 2);  // this thread's copies of stage c have landed
    __syncthreads();                    // everyone's have, and everyone is done with stage c - 1
    const int pre = c + Stages - 1;     // into the buffer of stage c - 1
    if (pre < nc) stage(pre, pre % Stages);
    else __pipeline_commit();
    const int buf = c % Stages;
    const __nv_bfloat16* Ab = As + buf * kMt * kSApitch;
    const uint8_t* wsrc[2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {  // the row's stage bytes in shared memory (same alignment mod 16 as in memory)
      const uint8_t* p = my_row[s] + int64_t(c) * kCb;
      wsrc[s] = Ws + buf * kSWrows * wp + q_tile[s] * wp + (reinterpret_cast<uintptr_t>(p) & 15);
    }
#pragma unroll
    for (int kk = 0; kk < kSc / 32; ++kk) {
      const int col = 32 * kk + 8 * t;  // this thread's 8 physical columns of the stage
      uint32_t b[2][4];
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        float v[8];
        F::template deq8<A>(wsrc[s] + col / F::kVals * F::kBytes, (col % F::kVals) / 8, v);
        pack_b(v, b[s]);
      }
      mma_step<kSApitch>(acc, Ab, col, g, groups, b);
    }
  }
  store_tile<Dual>(acc, groups, cnt, pos0, rows, r_tile, g, t, mode, outf, outb);
}

}  // namespace strata::cuda::moe::mma
