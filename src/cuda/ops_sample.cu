// Greedy and sampled token choice on the GPU (declarations in cuda/ops.cuh): argmax, banned tokens, and the CPU
// Sampler's filters (engine/sampling.cpp) over the whole vocabulary without sorting it.
#include "cuda/ops.cuh"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>
#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>

#include "common/env_switch.h"
#include "common/error.h"
#include "cuda/cluster_launch.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/mass_pieces.cuh"
#include "cuda/ops_common.cuh"
#include "cuda/route_key.cuh"
#include "cuda/row_scan.cuh"
#include "cuda/warp_merge.cuh"

namespace strata::cuda::ops {

namespace {

using namespace detail;  // (cuda/ops_common.cuh)

constexpr int kRowThreads = 1024;  // argmax / sample: one block per row

// logits: [n_tok][n_vocab]; out: [n_tok]. One block per row.
__global__ void argmax_kernel(const float* logits, int64_t n_vocab, int32_t* out) {
  __shared__ uint64_t sh[32];
  const float* row = logits + blockIdx.x * n_vocab;
  uint64_t best = 0;
  for (int64_t i = threadIdx.x; i < n_vocab; i += blockDim.x)
    best = MaxOp{}(best, order_key(row[i], static_cast<uint32_t>(i)));
  best = block_reduce(best, sh, MaxOp{});
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(key_id(best));
}

// ---- sample: the CPU Sampler's filters over the whole vocabulary, without sorting it.
// The candidates in the CPU's sorted order are the row's order keys in descending order. A radix select
// (8 passes of 8 bits over the row, histogram in shared memory) finds the key of any rank; the walks
// over ranks (cumulative probabilities for top-p and for the draw) go in chunks of kChunk ranks: the
// chunk's keys are gathered, bitonic-sorted in shared memory and prefix-summed in double.
constexpr int kChunk = 2 * kRowThreads;

struct SampleShared {
  uint64_t keys[kChunk];
  unsigned hist[256];
  union {
    typename cub::BlockScan<double, kRowThreads>::TempStorage scan;  // scan_sorted's
    // gather_sorted's keys of this block's share in a cluster (read by every block of it, then a barrier,
    // all inside gather_sorted: never live with scan)
    uint64_t keys_part[kChunk];
  };
  uint64_t red_u64[32];
  double red_d[32];
  long long red_i[32];
  uint64_t sel_prefix;
  long long sel_rank;
  bool sel_unique;
  int cached;  // ranks [0, cached) are in keys[], sorted (0: none)
  int count;
  int first;
  // deep_walk's: the mass of each bucket (fixed point), and the block-uniform outcome of a level.
  unsigned long long mass[256];
  uint64_t deep_lo, deep_hi;
  double deep_cum;
  long long deep_above;
  int deep_state;  // 0: descend, 1: gather the bucket [deep_lo, deep_hi], 2: no bucket reaches the target
  bool batched;    // for_row's batched loads (the kernel's switch)
  bool deep_agg;   // deep_walk's atomics a warp at a time (warp_mass_add; the kernel's switch)
  bool deep_warp;  // deep_walk's bin pick by warp 0 (pick_mass_bin; else thread 0, pick_mass_bin_serial)
  // The row's candidates from sample_cand_kernel (null: the whole row): [n_cand] keys, 0 for none.
  const uint64_t* cand;
  long long n_cand;
  // A cluster of cl_size blocks a row (STRATA_CUDA_SAMPLE_CLUSTER; 1: one block). Each block passes over its
  // share of the row into its own parts; every block reads every block's parts through distributed shared
  // memory and merges them in rank order, so every block holds the same merged histograms, sums and keys and
  // takes the same decisions. Two of each part, by cl_parity (flipped at each merge): a block may start the
  // next merge's part while another still reads this one (one cluster barrier a merge keeps them within one).
  unsigned cl_rank, cl_size;
  int cl_parity;
  unsigned hist_part[2][256];
  unsigned long long mass_part[2][256];
  uint64_t red_part[2];  // a block's reduced value (the bits of a double, u64 or long long)
  int count_part;
  // set_sample_cluster_jitter's seed (0: off) and the count of merges this block has made (cluster::jitter).
  unsigned jitter, jitter_n;
};
static_assert(sizeof(SampleShared) <= 48 * 1024, "the sampler's shared memory fits the static limit");

// ---- The cluster's merges (no-ops for one block). Every block of the cluster calls each, in the same order.
namespace cluster {
__device__ __forceinline__ void sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#endif
}
// Block `rank`'s copy of *p (p in this block's shared memory).
template <typename T>
__device__ __forceinline__ const T* at(const T* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(const_cast<T*>(p), int(rank));
#else
  return p;
#endif
}
// The test hook set_sample_cluster_jitter: with a seed, each block sleeps a pseudo-random 0-4 us (by block, seed
// and merge) right after a merge's cluster barrier, before it reads the other blocks' parts, so the blocks reach
// their reads, and their next parts' writes, in shuffled orders. A merge whose parts its barriers and parity did
// not protect would then read another pass's values: other picks, or a hang where the blocks' decisions part.
// Why a hook: racecheck cannot check distributed shared memory (an internal sanitizer error on the first
// cluster launch, session 51). Block-uniform; all threads.
__device__ __forceinline__ void jitter(SampleShared& sh) {
  if (sh.jitter == 0u) return;
  if (threadIdx.x == 0) {
    uint32_t h = sh.jitter ^ (blockIdx.x * 0x9E3779B9u) ^ (sh.jitter_n++ * 0x85EBCA6Bu);
    h ^= h >> 16, h *= 0x7FEB352Du, h ^= h >> 15, h *= 0x846CA68Bu, h ^= h >> 16;
    __nanosleep(h % 4096u);
  }
  __syncthreads();
}
__device__ __forceinline__ void flip(SampleShared& sh) {
  __syncthreads();  // (every thread has read cl_parity)
  if (threadIdx.x == 0) sh.cl_parity ^= 1;
  __syncthreads();
}
// v: a block-uniform value (the block's reduction); returns op over the cluster's blocks in rank order.
template <typename T, typename Op>
__device__ T reduce(T v, SampleShared& sh, Op op) {
  static_assert(sizeof(T) == sizeof(uint64_t), "a part is 64 bits");
  if (sh.cl_size == 1) return v;
  const int p = sh.cl_parity;
  if (threadIdx.x == 0) memcpy(&sh.red_part[p], &v, sizeof v);
  sync();
  jitter(sh);
  T r;
  for (unsigned k = 0; k < sh.cl_size; ++k) {
    T x;
    memcpy(&x, at(&sh.red_part[p], k), sizeof x);
    r = k == 0 ? x : op(r, x);
  }
  flip(sh);
  return r;
}
// The bins a pass adds to: this block's own (its part, the merge's parity) or sh.hist / sh.mass for one block.
__device__ __forceinline__ unsigned* hist_acc(SampleShared& sh) {
  return sh.cl_size == 1 ? sh.hist : sh.hist_part[sh.cl_parity];
}
__device__ __forceinline__ unsigned long long* mass_acc(SampleShared& sh) {
  return sh.cl_size == 1 ? sh.mass : sh.mass_part[sh.cl_parity];
}
// After a pass into hist_acc (and mass_acc when with_mass) and a __syncthreads: sh.hist (sh.mass) := the sum
// of every block's part. The sums are integers: the same bins whatever the order.
__device__ void merge_bins(SampleShared& sh, bool with_mass) {
  if (sh.cl_size == 1) return;
  const int p = sh.cl_parity;
  sync();
  jitter(sh);
  for (int b = threadIdx.x; b < 256; b += blockDim.x) {
    unsigned h = 0;
    unsigned long long m = 0;
    for (unsigned k = 0; k < sh.cl_size; ++k) {
      h += at(&sh.hist_part[p][b], k)[0];
      if (with_mass) m += at(&sh.mass_part[p][b], k)[0];
    }
    sh.hist[b] = h;
    if (with_mass) sh.mass[b] = m;
  }
  flip(sh);
}
}  // namespace cluster

// f(i, row[i]) over this thread's share of the row (row_scan::for_row; batched: SampleShared::batched), or,
// where the row has a candidate list (sh.cand), over its share of the candidates: the same (id, value) pairs
// for every key the row's top-k can hold, so every pass that only looks at ranks below top-k (the radix
// select, the gather, the maximum) finds the same keys. Block-uniform. In a cluster, this block's share: the
// callers merge what the blocks found (cluster::).
template <typename F>
__device__ __forceinline__ void for_row(const float* row, int64_t n, const SampleShared& sh, F&& f) {
  if (const uint64_t* cand = sh.cand) {
    const long long nc = sh.n_cand;
#pragma unroll 4
    for (long long j = sh.cl_rank * blockDim.x + threadIdx.x; j < nc; j += sh.cl_size * blockDim.x) {
      const uint64_t k = cand[j];
      if (k != 0) f(static_cast<int64_t>(key_id(k)), key_value(k));
    }
    return;
  }
  row_scan::for_row(row, n, int64_t(sh.cl_rank) * blockDim.x + threadIdx.x, int64_t(sh.cl_size) * blockDim.x,
                    sh.batched, f);
}

// hist[bin] += 1 for each thread of the warp that takes part, one atomic per distinct bin. Why: a pass of the
// radix select puts most of a row's keys in a few bins (logits share their top bits), and shared-memory atomics
// on one word serialize: the warp's threads of one bin add their count at once (integer sums: the same counts).
__device__ __forceinline__ void warp_hist_add(unsigned* hist, bool take, unsigned bin) {
  const unsigned peers = __match_any_sync(__activemask(), take ? bin : 0xffffffffu);
  if (take && (threadIdx.x & 31u) == unsigned(__ffs(peers) - 1)) atomicAdd(&hist[bin], unsigned(__popc(peers)));
}

// deep_walk's hist[bin] += 1 and mass[bin] += m for each thread of the warp that takes part, one pair of
// atomics per distinct bin. Why: a deep walk's first levels put nearly every key of a flat row in one or two
// bins, and 152k shared-memory atomics on the same two words serialize (the deep draw of one row took ~1.9 ms
// of a sampled decode step on an H100, session 48: 282 tok/s in `strata serve` with top-k off against 583 at
// top-k 40). The group's masses are summed exactly: 32-bit warp reductions of their 16-bit pieces, joined mod
// 2^64 as the atomics would have added them (cuda/mass_pieces.cuh), so the bins hold the same integers and the
// walk picks the same keys.
__device__ __forceinline__ void warp_mass_add(unsigned* hist, unsigned long long* mass, bool take, unsigned bin,
                                              unsigned long long m) {
  const unsigned peers = __match_any_sync(__activemask(), take ? bin : 0xffffffffu);
  if (!take) return;  // (the lanes that take no part form their own group: no reduction below names them)
  unsigned sums[mass_pieces::kPieces];
#pragma unroll
  for (int j = 0; j < mass_pieces::kPieces; ++j) sums[j] = __reduce_add_sync(peers, mass_pieces::piece(m, j));
  if ((threadIdx.x & 31u) == unsigned(__ffs(peers) - 1)) {
    atomicAdd(&hist[bin], unsigned(__popc(peers)));
    atomicAdd(&mass[bin], mass_pieces::join(sums));
  }
}

// Warp 0 (all its lanes): the bin b of sh.hist where rank r falls, walking the bins from 255 down (the
// first b whose count exceeds what is left of r; bin 0 when none of 255..1 does) into sh.sel_prefix (prefix with
// b at shift), sh.sel_rank (r less the bins above b) and sh.sel_unique (b holds one key). Why a warp: one
// thread walking 256 counts in shared memory took up to ~4 us a level; each lane sums 8 bins, a scan over
// the lanes finds the lane, and that lane walks its 8.
__device__ __forceinline__ void pick_bin(SampleShared& sh, long long r, uint64_t prefix, int shift) {
  const int lane = threadIdx.x & 31;
  unsigned h[8], local = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) local += (h[j] = sh.hist[255 - 8 * lane - j]);
  unsigned incl = local;  // bins above and in this lane's, lane 0 holding the top ones
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned t = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += t;
  }
  const unsigned excl = incl - local;
  const unsigned ball = __ballot_sync(0xffffffffu, static_cast<long long>(excl) <= r && r < static_cast<long long>(incl));
  const int owner = ball != 0u ? __ffs(ball) - 1 : 31;  // none: r is past every key, the walk ends at bin 0
  if (lane != owner) return;
  long long rr = r - excl;
  int b = 0;
  bool done = false;
#pragma unroll
  for (int j = 0; j < 8; ++j) {  // (unrolled: h stays in registers)
    const int bj = 255 - 8 * lane - j;
    if (done) continue;
    b = bj;
    if (bj == 0 || rr < static_cast<long long>(h[j]))
      done = true;
    else
      rr -= h[j];
  }
  sh.sel_prefix = prefix | (static_cast<uint64_t>(b) << shift);
  sh.sel_rank = rr;
  sh.sel_unique = sh.hist[b] == 1u;
}

// The key of rank r (0 = first in the CPU's order) among the n_vocab keys of the row. All threads.
// Once the bucket holding rank r has a single key, one more pass fetches that key (typically after 3-4
// of the 8 passes for real logits).
__device__ uint64_t select_rank(const float* row, int64_t n_vocab, int64_t r, SampleShared& sh) {
  uint64_t prefix = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    const uint64_t hi_mask = shift == 56 ? 0ull : (~0ull << (shift + 8));
    unsigned* hist = cluster::hist_acc(sh);
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for_row(row, n_vocab, sh, [&](int64_t i, float v) {
      const uint64_t key = order_key(v, static_cast<uint32_t>(i));
      warp_hist_add(hist, (key & hi_mask) == prefix, unsigned((key >> shift) & 255u));
    });
    __syncthreads();
    cluster::merge_bins(sh, false);
    if (threadIdx.x < 32) pick_bin(sh, r, prefix, shift);
    __syncthreads();
    prefix = sh.sel_prefix;
    r = sh.sel_rank;
    const bool unique = sh.sel_unique;
    __syncthreads();  // sel_* are rewritten below or in the next pass
    if (unique && shift > 0) {  // the one key with this prefix is the answer
      const uint64_t mask = ~0ull << shift;
      for_row(row, n_vocab, sh, [&](int64_t i, float v) {
        const uint64_t key = order_key(v, static_cast<uint32_t>(i));
        if ((key & mask) == prefix) sh.sel_prefix = key;
      });
      __syncthreads();
      // (in a cluster one block found the key; the others kept the prefix, which is below it)
      prefix = cluster::reduce(sh.sel_prefix, sh, MaxOp{});
      __syncthreads();
      break;
    }
  }
  return prefix;
}

// Remembers the last selections (block-uniform registers): the walks ask for the same ranks again.
struct RankCache {
  int64_t rank[4] = {-1, -1, -1, -1};
  uint64_t key[4] = {0, 0, 0, 0};
  int next = 0;
  __device__ uint64_t get(const float* row, int64_t n_vocab, int64_t r, SampleShared& sh) {
    for (int i = 0; i < 4; ++i)
      if (rank[i] == r) return key[i];
    const uint64_t k = select_rank(row, n_vocab, r, sh);
    rank[next] = r;
    key[next] = k;
    next = (next + 1) & 3;
    return k;
  }
};

// Bitonic sort of keys[0, size) (shared memory; size a power of two), descending. All threads of the block.
__device__ void sort_desc(uint64_t* keys, int size) {
  for (int k2 = 2; k2 <= size; k2 <<= 1) {
    for (int j = k2 >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int ixj = i ^ j;
        if (ixj > i) {
          const uint64_t a = keys[i], b = keys[ixj];
          const bool desc = (i & k2) == 0;
          if (desc ? a < b : a > b) {
            keys[i] = b;
            keys[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

// Fills sh.keys[0, count) with the row's keys in [lo, upper) (no upper bound unless has_upper), sorted
// descending; the rest of keys[] is 0. The caller makes sure at most kChunk keys fall in the range.
__device__ void gather_sorted(const float* row, int64_t n_vocab, uint64_t lo, bool has_upper, uint64_t upper,
                              SampleShared& sh) {
  const bool one = sh.cl_size == 1;
  int* count = one ? &sh.count : &sh.count_part;
  uint64_t* keys = one ? sh.keys : sh.keys_part;
  if (threadIdx.x == 0) *count = 0;
  for (int i = threadIdx.x; i < kChunk; i += blockDim.x) sh.keys[i] = 0;
  __syncthreads();
  for_row(row, n_vocab, sh, [&](int64_t i, float v) {
    const uint64_t key = order_key(v, static_cast<uint32_t>(i));
    if (key >= lo && (!has_upper || key < upper)) {
      const int slot = atomicAdd(count, 1);
      if (slot < kChunk) keys[slot] = key;
    }
  });
  __syncthreads();
  if (!one) {  // every block's keys, in rank order, into sh.keys (the sort below makes the order canonical)
    cluster::sync();
    cluster::jitter(sh);
    int base = 0;
    for (unsigned k = 0; k < sh.cl_size; ++k) {
      const int n_k = min(*cluster::at(&sh.count_part, k), kChunk);
      const uint64_t* src = cluster::at(sh.keys_part, k);
      for (int i = threadIdx.x; i < n_k && base + i < kChunk; i += blockDim.x) sh.keys[base + i] = src[i];
      base += n_k;
    }
    if (threadIdx.x == 0) sh.count = base;
    cluster::sync();  // (every block has read the parts before any gathers again)
  }
  // Bitonic sort, descending, of keys[0, size): size is the power of two from the count up (at least 2), and
  // keys[size, kChunk) are all 0, the smallest keys, so they stay last. Why not all kChunk: a top-k of 40
  // sorts 64 keys in 21 steps instead of 2048 in 66.
  const int c = sh.count < kChunk ? sh.count : kChunk;
  int size = 2;
  while (size < c) size <<= 1;
  sort_desc(sh.keys, size);
}

// The first of the sorted keys sh.keys[0, c) whose cumulative probability (cum + prob of keys 0..idx, summed
// in double by a block scan) satisfies stop, or kChunk when none does; *total: the c keys' probability. All
// threads; sh.first and sh.scan are the scratch (the caller syncs before reusing them).
template <typename Prob, typename Stop>
__device__ int scan_sorted(const float* row, int c, double cum, Prob prob, Stop stop, SampleShared& sh, double* total) {
  if (threadIdx.x == 0) sh.first = kChunk;
  __syncthreads();
  double v[2];
  for (int j = 0; j < 2; ++j) {
    const int idx = 2 * threadIdx.x + j;
    v[j] = idx < c ? static_cast<double>(prob(row[key_id(sh.keys[idx])])) : 0.0;
  }
  cub::BlockScan<double, kRowThreads>(sh.scan).InclusiveSum(v, v, *total);
  for (int j = 0; j < 2; ++j) {
    const int idx = 2 * threadIdx.x + j;
    if (idx < c && stop(cum + v[j])) atomicMin(&sh.first, idx);
  }
  __syncthreads();
  return sh.first;
}

// Warp 0 (all its lanes), for deep_walk's level at shift over the keys [lo, hi] (cum: the probability above
// them; above: the candidates above them): the first non-empty bin b, from 255 down, where stop(cum + the
// fixed-point mass of the bins from 255 to b) holds. Writes sh.deep_lo/hi (that bin's keys within [lo, hi]),
// sh.deep_cum (cum + the mass above b), sh.deep_above and sh.deep_state (1: gather it, 0: descend, 2: no bin
// reaches the target). Why a warp: one thread walking 256 bins in shared memory, a double test each, took
// ~4 us a level (as pick_bin's). Each lane sums 8 bins, an exact integer scan over the lanes gives each lane
// the mass above it, and a ballot finds the first lane whose bins reach the target; that lane walks its 8.
// The same bin as one thread's walk: stop is monotone in the sum (cum >= p, u < cum), the running sums are
// the same integers, and the first lane with keys whose sum reaches the target holds that bin: the lanes with
// keys above it fall short at every bin, and its own last non-empty bin's sum is the lane's.
template <typename Stop>
__device__ __forceinline__ void pick_mass_bin(SampleShared& sh, double cum, Stop stop, uint64_t lo, uint64_t hi,
                                              int shift, long long above) {
  constexpr double kFx = 1152921504606846976.0;  // 2^60 (deep_walk's)
  const int lane = threadIdx.x & 31;
  unsigned long long m[8], local = 0;
  unsigned cnt = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    local += (m[j] = sh.mass[255 - 8 * lane - j]);
    cnt += sh.hist[255 - 8 * lane - j];
  }
  unsigned long long incl = local;  // mass of the bins above and in this lane's, lane 0 holding the top ones
  long long cnt_incl = cnt;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long t = __shfl_up_sync(0xffffffffu, incl, o);
    const long long tc = __shfl_up_sync(0xffffffffu, cnt_incl, o);
    if (lane >= o) incl += t, cnt_incl += tc;
  }
  // (a lane of empty bins tests nothing, as one thread's walk skips empty bins)
  const unsigned ball = __ballot_sync(0xffffffffu, cnt > 0u && stop(cum + static_cast<double>(incl) / kFx));
  if (ball == 0u) {  // no bin reaches the target
    if (lane == 31) sh.deep_state = 2, sh.deep_above = above + cnt_incl;
    return;
  }
  if (lane != __ffs(ball) - 1) return;
  // The keys of the range share their bits above shift + 8; bucket b is [base + b << shift, + 2^shift).
  const uint64_t base = shift == 56 ? 0ull : lo & ~((uint64_t(1) << (shift + 8)) - 1);
  unsigned long long acc = incl - local;
  above += cnt_incl - cnt;
#pragma unroll
  for (int j = 0; j < 8; ++j) {  // (unrolled: m stays in registers)
    const int b = 255 - 8 * lane - j;
    const unsigned h = sh.hist[b];
    if (h == 0u) continue;
    if (stop(cum + static_cast<double>(acc + m[j]) / kFx)) {
      const uint64_t b_lo = base + (uint64_t(b) << shift), b_hi = b_lo + ((uint64_t(1) << shift) - 1);
      sh.deep_lo = b_lo > lo ? b_lo : lo;
      sh.deep_hi = b_hi < hi ? b_hi : hi;
      sh.deep_cum = cum + static_cast<double>(acc) / kFx;
      sh.deep_state = h <= unsigned(kChunk) || shift == 0 ? 1 : 0;
      sh.deep_above = above;
      return;
    }
    acc += m[j];
    above += h;
  }
}

// Thread 0: pick_mass_bin's outcome by walking the 256 bins one at a time (STRATA_CUDA_SAMPLE_DEEP_WARP=0).
template <typename Stop>
__device__ __forceinline__ void pick_mass_bin_serial(SampleShared& sh, double cum, Stop stop, uint64_t lo,
                                                     uint64_t hi, int shift, long long above) {
  constexpr double kFx = 1152921504606846976.0;  // 2^60 (deep_walk's)
  // The keys of the range share their bits above shift + 8; bucket b is [base + b << shift, + 2^shift).
  const uint64_t base = shift == 56 ? 0ull : lo & ~((uint64_t(1) << (shift + 8)) - 1);
  unsigned long long acc = 0;
  int state = 2;
  for (int b = 255; b >= 0; --b) {
    if (sh.hist[b] == 0u) continue;
    if (stop(cum + static_cast<double>(acc + sh.mass[b]) / kFx)) {
      const uint64_t b_lo = base + (uint64_t(b) << shift), b_hi = b_lo + ((uint64_t(1) << shift) - 1);
      sh.deep_lo = b_lo > lo ? b_lo : lo;
      sh.deep_hi = b_hi < hi ? b_hi : hi;
      sh.deep_cum = cum + static_cast<double>(acc) / kFx;
      state = sh.hist[b] <= unsigned(kChunk) || shift == 0 ? 1 : 0;
      break;
    }
    acc += sh.mass[b];
    above += sh.hist[b];
  }
  sh.deep_state = state;
  sh.deep_above = above;
}

// walk_ranks past its first chunk when the deep search is on (sample_deep, the default): the ranks [start, n)
// are the keys in [lo, hi] (hi: the key below the first chunk's last, lo: the key of rank n - 1, 0 for the
// whole row); cum: the probability of ranks [0, start). Instead of walking them in chunks of kChunk (each a
// full-row radix select, gather and sort: a draw over a flat distribution went ~tens of thousands of ranks
// deep, ~1 ms a row), it descends the keys' bytes from the top:
// one pass per level sums each 256-way bucket's probability in fixed point (2^-60 units, integer atomics:
// the same sums whatever the order), the bucket where the target falls is kept, and once it holds at most
// kChunk keys they are gathered, sorted and walked in double as in walk_ranks. The cumulative sums before
// that bucket differ from rank-order double sums by ~1e-13 at most, so a pick differs from the CPU's only
// where the target falls that close to a boundary (as the CPU's own split walk, engine/sampling.cpp).
// Returns the rank (and *key_out) as walk_ranks, or -1 when the target is beyond every candidate.
template <typename Prob, typename Stop>
__device__ int64_t deep_walk(const float* row, int64_t n_vocab, int64_t start, uint64_t lo, uint64_t hi, double cum,
                             Prob prob, Stop stop, SampleShared& sh, uint64_t* key_out) {
  constexpr double kFx = 1152921504606846976.0;  // 2^60
  long long above = 0;  // candidates with keys above the current range
  for (int shift = 56;; shift -= 8) {
    unsigned* hist = cluster::hist_acc(sh);
    unsigned long long* mass = cluster::mass_acc(sh);
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0u, mass[b] = 0ull;
    __syncthreads();
    const bool agg = sh.deep_agg;
    for_row(row, n_vocab, sh, [&](int64_t i, float v) {
      const uint64_t key = order_key(v, static_cast<uint32_t>(i));
      const bool take = key >= lo && key <= hi;
      const unsigned b = unsigned((key >> shift) & 255u);
      const unsigned long long m = take ? static_cast<unsigned long long>(static_cast<double>(prob(v)) * kFx) : 0ull;
      if (agg) {  // (every lane of the warp reaches the reductions: no return before them)
        warp_mass_add(hist, mass, take, b, m);
      } else if (take) {
        atomicAdd(&hist[b], 1u);
        atomicAdd(&mass[b], m);
      }
    });
    __syncthreads();
    cluster::merge_bins(sh, true);
    if (sh.deep_warp) {
      if (threadIdx.x < 32) pick_mass_bin(sh, cum, stop, lo, hi, shift, above);
    } else if (threadIdx.x == 0) {
      pick_mass_bin_serial(sh, cum, stop, lo, hi, shift, above);
    }
    __syncthreads();
    const int state = sh.deep_state;
    if (state == 2) return -1;
    lo = sh.deep_lo, hi = sh.deep_hi, cum = sh.deep_cum, above = sh.deep_above;
    __syncthreads();  // (sh.deep_* are rewritten by the next level)
    if (state == 0) continue;
    // The bucket's keys, sorted, walked in double.
    gather_sorted(row, n_vocab, lo, hi != ~0ull, hi + 1, sh);
    if (threadIdx.x == 0) sh.cached = 0;
    __syncthreads();
    const int c = sh.count < kChunk ? sh.count : kChunk;
    double total;
    const int found = scan_sorted(row, c, cum, prob, stop, sh, &total);
    // (The fixed-point sums put the target in this bucket; where the double walk falls short of it by
    // their rounding, the bucket's last key.)
    const int first = found < c ? found : c - 1;
    *key_out = sh.keys[first];
    __syncthreads();
    return start + above + first;
  }
}

// Walks ranks [0, n) in the CPU's order accumulating cum += prob(logit) in double; returns the first
// rank whose cumulative value satisfies stop(cum) and its key in *key_out, or -1 when none does.
// Chunk 0 comes from sh.keys when they already hold it (sh.cached).
template <typename Prob, typename Stop>
__device__ int64_t walk_ranks(const float* row, int64_t n_vocab, int64_t n, Prob prob, Stop stop, RankCache& rc,
                              SampleShared& sh, uint64_t* key_out, bool deep) {
  double cum = 0.0;
  uint64_t upper = 0;  // keys of earlier chunks are >= upper (exclusive bound), once has_upper
  bool has_upper = false;
  for (int64_t start = 0; start < n; start += kChunk) {
    if (deep && has_upper && upper > 0) {  // past the first chunk: the byte descent by mass
      const uint64_t floor_key = n < n_vocab ? rc.get(row, n_vocab, n - 1, sh) : 0ull;
      return deep_walk(row, n_vocab, start, floor_key, upper - 1, cum, prob, stop, sh, key_out);
    }
    const int64_t end = start + kChunk < n ? start + kChunk : n;
    const int c = static_cast<int>(end - start);
    uint64_t lo;  // the key of rank end-1 (0 for the row's last chunk when gathering)
    if (start == 0 && sh.cached >= end) {
      lo = sh.keys[c - 1];
    } else {
      lo = end < n_vocab ? rc.get(row, n_vocab, end - 1, sh) : 0ull;
      gather_sorted(row, n_vocab, lo, has_upper, upper, sh);
      if (threadIdx.x == 0) sh.cached = start == 0 ? c : 0;
    }
    double total;
    const int first = scan_sorted(row, c, cum, prob, stop, sh, &total);
    if (first < c) {
      *key_out = sh.keys[first];
      __syncthreads();
      return start + first;
    }
    cum += total;
    upper = lo;
    has_upper = true;
    __syncthreads();
  }
  return -1;
}

// Sum over ranks [0, n) of f(logit), in double: from the sorted keys when they hold those ranks, else one
// pass over the row keeping keys >= lo (the key of rank n-1; 0 when n is the whole row). All threads.
template <typename F>
__device__ double sum_top(const float* row, int64_t n_vocab, int64_t n, uint64_t lo, F f, SampleShared& sh) {
  double acc = 0.0;
  if (n <= sh.cached) {  // (every block of a cluster holds the same keys: no merge)
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += f(row[key_id(sh.keys[i])]);
    return block_reduce(acc, sh.red_d, SumOp{});
  }
  for_row(row, n_vocab, sh, [&](int64_t i, float v) {
    if (order_key(v, static_cast<uint32_t>(i)) >= lo) acc += f(v);
  });
  return cluster::reduce(block_reduce(acc, sh.red_d, SumOp{}), sh, SumOp{});
}

// ---- The candidate prefilter. A row whose top-k is at most kSampleCandMaxK (the usual case: 40 by default)
// only ever looks at its top-k keys, and those are among the top-k keys of each stretch of kSampleCandStretch
// values. So many blocks a row (sample_cand_kernel) each sort one stretch's keys and keep its top-k, and the
// sampler's one block a row (sample_kernel) makes its passes over those parts x top-k keys instead of the
// whole row. Why: that block re-read a 152k-value row in every pass of its radix select and gather, ~1 ms a
// sampled decode step on an H100 (session 46: 368 tok/s sampled against 608 greedy).
constexpr int kCandThreads = 512;
constexpr int kCandPerThread = int(kSampleCandStretch) / kCandThreads;

__host__ __device__ __forceinline__ bool uses_cand(const SampleParams& P, int64_t n_vocab) {
  return P.temperature > 0.0f && P.top_k > 0 && P.top_k <= kSampleCandMaxK && P.top_k < n_vocab;
}

// logits: [n_tok][n_vocab]; cand: [n_tok][stride] keys. Block (b, t): row t's values [b * kSampleCandStretch,
// + kSampleCandStretch), sorted by key, their top_k largest keys (0 past the row's end) to cand[t][b * top_k, +
// top_k). rows: as sample_kernel's. Rows that do not use candidates are left alone.
__global__ void __launch_bounds__(kCandThreads) sample_cand_kernel(const float* logits, int64_t n_vocab,
                                                                   SampleParams P0, const SampleParams* rows,
                                                                   uint64_t* cand, int64_t stride) {
  __shared__ uint64_t keys[kSampleCandStretch];
  const SampleParams P = rows != nullptr ? rows[blockIdx.y] : P0;  // block-uniform
  if (!uses_cand(P, n_vocab)) return;
  const float* row = logits + int64_t(blockIdx.y) * n_vocab;
  const int64_t s0 = int64_t(blockIdx.x) * kSampleCandStretch;
  float v[kCandPerThread];
#pragma unroll
  for (int j = 0; j < kCandPerThread; ++j) {  // every load first, then the keys
    const int64_t i = s0 + threadIdx.x + j * kCandThreads;
    v[j] = i < n_vocab ? row[i] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kCandPerThread; ++j) {
    const int64_t i = s0 + threadIdx.x + j * kCandThreads;
    keys[threadIdx.x + j * kCandThreads] = i < n_vocab ? order_key(v[j], static_cast<uint32_t>(i)) : 0ull;
  }
  __syncthreads();
  sort_desc(keys, int(kSampleCandStretch));
  uint64_t* dst = cand + int64_t(blockIdx.y) * stride + int64_t(blockIdx.x) * P.top_k;
  for (int i = threadIdx.x; i < P.top_k; i += blockDim.x) dst[i] = keys[i];
}

// ---- The prefilter by warp merges (STRATA_CUDA_SAMPLE_MERGE=1; cuda/warp_merge.cuh says why). The stretch's
// 2048 keys: each of 32 warps sorts 64 in registers, a tree of merges keeps the top 64 of the 32 lists; the
// sampler's block merges the row's stretch lists the same way into its sorted top-k (sh.keys, sh.cached)
// instead of selecting and gathering it from the candidates. The same keys come out, so the same picks.
constexpr int kMergeThreads = 1024;  // 32 warps x 64 keys = one stretch
static_assert(kMergeThreads / 32 * 64 == int(kSampleCandStretch) && kSampleCandMaxK <= 64, "warp merge shape");
static_assert(kRowThreads / 32 * 64 == kChunk, "the sampler's merge tree fills sh.keys");

// As sample_cand_kernel (same grid, output and rows), by warp sorts and a merge tree.
__global__ void __launch_bounds__(kMergeThreads) sample_cand_merge_kernel(const float* logits, int64_t n_vocab,
                                                                         SampleParams P0, const SampleParams* rows,
                                                                         uint64_t* cand, int64_t stride) {
  __shared__ uint64_t keys[kSampleCandStretch];  // [32 warps][64]
  const SampleParams P = rows != nullptr ? rows[blockIdx.y] : P0;  // block-uniform
  if (!uses_cand(P, n_vocab)) return;
  const float* row = logits + int64_t(blockIdx.y) * n_vocab;
  const int w = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31u);
  const int64_t i0 = int64_t(blockIdx.x) * kSampleCandStretch + w * 64 + lane, i1 = i0 + 32;
  const float v0 = i0 < n_vocab ? row[i0] : 0.0f, v1 = i1 < n_vocab ? row[i1] : 0.0f;
  uint64_t a0 = i0 < n_vocab ? order_key(v0, static_cast<uint32_t>(i0)) : 0ull;
  uint64_t a1 = i1 < n_vocab ? order_key(v1, static_cast<uint32_t>(i1)) : 0ull;
  warp_merge::sort64_desc(warp_merge::DeviceLanes{}, a0, a1);
  keys[w * 64 + lane] = a0;
  keys[w * 64 + lane + 32] = a1;
  __syncthreads();
  warp_merge::tree_top64(warp_merge::DeviceLanes{}, keys);
  uint64_t* dst = cand + int64_t(blockIdx.y) * stride + int64_t(blockIdx.x) * P.top_k;
  for (int i = int(threadIdx.x); i < P.top_k; i += blockDim.x) dst[i] = keys[i];
}

// The sampler's block (kRowThreads): the top k <= 64 keys of a row from its n_parts stretch lists (cand: [n_parts][k],
// each descending, from either prefilter kernel) into sh.keys[0, k), descending, and 0 in sh.keys[k, kChunk).
// Warp w merges lists w, w + 32, ... (an absent list is 64 zeros), then the tree.
__device__ void merge_cand(const uint64_t* cand, int n_parts, int k, SampleShared& sh) {
  const int w = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31u);
  uint64_t a0 = 0, a1 = 0;
  for (int p = w; p < n_parts; p += kRowThreads / 32) {
    const uint64_t* L = cand + int64_t(p) * k;
    warp_merge::merge64_desc(warp_merge::DeviceLanes{}, a0, a1, lane < k ? L[lane] : 0ull,
                             lane + 32 < k ? L[lane + 32] : 0ull);
  }
  sh.keys[w * 64 + lane] = a0;
  sh.keys[w * 64 + lane + 32] = a1;
  __syncthreads();
  warp_merge::tree_top64(warp_merge::DeviceLanes{}, sh.keys);
  for (int i = k + int(threadIdx.x); i < kChunk; i += blockDim.x) sh.keys[i] = 0;
  if (threadIdx.x == 0) sh.cached = k;
  __syncthreads();
}

// One row's pick (all threads of the row's blocks; sh set up by sample_kernel). cand_row: the row's stretch lists
// ([n_parts][P.top_k], null: none), merged into sh.keys where merge and the row uses them.
__device__ int32_t sample_row(const float* row, int64_t n_vocab, const SampleParams& P, float u_t,
                              const uint64_t* cand_row, int n_parts, bool merge, bool deep, SampleShared& sh) {
  // merged: the row's top-k keys are in sh.keys already (block-uniform: the same inputs in every thread).
  const bool merged = merge && cand_row != nullptr && uses_cand(P, n_vocab);
  uint64_t kmax = 0;
  if (merged) {
    merge_cand(cand_row, n_parts, P.top_k, sh);
    kmax = sh.keys[0];
  } else {
    for_row(row, n_vocab, sh,
            [&](int64_t i, float v) { kmax = MaxOp{}(kmax, order_key(v, static_cast<uint32_t>(i))); });
    kmax = cluster::reduce(block_reduce(kmax, sh.red_u64, MaxOp{}), sh, MaxOp{});
  }
  const int32_t best = static_cast<int32_t>(key_id(kmax));
  if (P.temperature <= 0.0f) return best;
  const float mx = row[best];
  RankCache rc;
  // top-k: ranks [0, m).
  const int64_t m = P.top_k > 0 && P.top_k < n_vocab ? P.top_k : n_vocab;
  // (merged: ranks [0, m) are cached, so nothing below reads lo_m or the row's other keys)
  const uint64_t lo_m = !merged && m < n_vocab ? rc.get(row, n_vocab, m - 1, sh) : 0ull;
  if (!merged && m <= kChunk) {
    gather_sorted(row, n_vocab, lo_m, false, 0, sh);
    if (threadIdx.x == 0) sh.cached = static_cast<int>(m);
    __syncthreads();
  }
  int64_t n = m;
  uint64_t key_unused = 0;
  // top-p over the softmax (temperature 1) of the m candidates.
  if (P.top_p < 1.0f) {
    const double s1 = sum_top(row, n_vocab, m, lo_m, [=](float l) { return exp_cr((l - mx) / 1.0f); }, sh);
    const double top_p = P.top_p;
    const int64_t at = walk_ranks(
        row, n_vocab, m, [=](float l) { return static_cast<float>(exp_cr((l - mx) / 1.0f) / s1); },
        [=](double cum) { return cum >= top_p; }, rc, sh, &key_unused, deep);
    if (at >= 0) n = at + 1;
  }
  // min-p: the candidates with logit >= max + log(min_p) are a prefix of the order (at least one).
  if (P.min_p > 0.0f) {
    const float thresh = mx + static_cast<float>(log(static_cast<double>(P.min_p)));
    long long cnt = 0;
    if (n <= sh.cached) {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) cnt += row[key_id(sh.keys[i])] >= thresh;
    } else {
      for_row(row, n_vocab, sh, [&](int64_t, float v) { cnt += v >= thresh; });
    }
    cnt = block_reduce(cnt, sh.red_i, SumOp{});
    if (n > sh.cached) cnt = cluster::reduce(cnt, sh, SumOp{});  // (the cached keys are every block's)
    n = cnt < n ? static_cast<int64_t>(cnt) : n;
    if (n < 1) n = 1;
  }
  // temperature softmax over ranks [0, n), then the draw.
  const float temp = P.temperature;
  const uint64_t lo_n = n < n_vocab && n > sh.cached ? rc.get(row, n_vocab, n - 1, sh) : 0ull;
  const double s2 = sum_top(row, n_vocab, n, lo_n, [=](float l) { return exp_cr((l - mx) / temp); }, sh);
  const double ud = u_t;
  uint64_t key = 0;
  const int64_t at = walk_ranks(
      row, n_vocab, n, [=](float l) { return static_cast<float>(exp_cr((l - mx) / temp) / s2); },
      [=](double cum) { return ud < cum; }, rc, sh, &key, deep);
  if (at < 0) {  // u beyond the last cumulative sum: the last candidate, as the CPU
    if (n <= sh.cached) {
      key = sh.keys[n - 1];
    } else {
      key = rc.get(row, n_vocab, n - 1, sh);
    }
  }
  return static_cast<int32_t>(key_id(key));
}

// logits: [n_tok][n_vocab]; u: [n_tok]; out: [n_tok]. One block of kRowThreads per row, or a cluster of blocks
// a row (blocks [t * size, + size) are row t's; cluster:: says how they share the passes).
// Why the cache of chunk 0: with top-k <= kChunk (the usual case) the k candidates are selected and
// sorted once and every later step reads them from shared memory instead of the whole row.
// rows: null (P for every row) or [n_tok] device rules, row t's at rows[t] (ops::sample_rows).
// cand: null, or [n_tok][stride] keys from sample_cand_kernel over n_parts stretches a row (the rows that
// use_cand read theirs instead of the row in every pass; merge: they merge the lists instead, merge_cand).
__global__ void __launch_bounds__(kRowThreads) sample_kernel(const float* logits, int64_t n_vocab, SampleParams P0,
                                                             const SampleParams* rows, const float* u, int32_t* out,
                                                             bool deep, bool batched, const uint64_t* cand,
                                                             int64_t stride, int n_parts, bool merge,
                                                             bool deep_agg, bool deep_warp, unsigned jitter) {
  __shared__ SampleShared sh;
  // A row's blocks: one, or a cluster (cluster::): rank 0 writes the pick.
  unsigned cl_rank = 0, cl_size = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  {
    const auto cl = cooperative_groups::this_cluster();
    cl_rank = cl.block_rank(), cl_size = cl.num_blocks();
  }
#endif
  const int64_t t = blockIdx.x / cl_size;  // the row
  const SampleParams P = rows != nullptr ? rows[t] : P0;  // block-uniform
  const float* row = logits + t * n_vocab;
  // A row whose passes read only its merged candidate lists (sample_row's `merged`: every block of a cluster
  // would repeat the same work) runs on rank 0 as one block, and the other blocks leave at once. Why: in a batch
  // (sample_rows) those blocks would hold SMs that other rows' blocks could use. The same picks: rank 0 runs
  // the one-block path (cl_size 1: no cluster:: merge), and no block reads another's shared memory on it.
  const bool c = cand != nullptr && uses_cand(P, n_vocab);  // the row reads its candidate lists
  const bool alone = merge && c;  // (the row's blocks agree)
  if (alone && cl_rank != 0) return;
  const unsigned size = alone ? 1u : cl_size;
  if (threadIdx.x == 0) {
    sh.cached = 0, sh.batched = batched, sh.deep_agg = deep_agg, sh.deep_warp = deep_warp;
    sh.cand = c ? cand + t * stride : nullptr;
    sh.n_cand = c ? static_cast<long long>(n_parts) * P.top_k : 0;
    sh.cl_rank = cl_rank, sh.cl_size = size, sh.cl_parity = 0;
    sh.jitter = jitter, sh.jitter_n = 0;
  }
  __syncthreads();
  const int32_t pick = sample_row(row, n_vocab, P, u[t], cand == nullptr ? nullptr : cand + t * stride, n_parts,
                                  merge, deep, sh);
  if (threadIdx.x == 0 && cl_rank == 0) out[t] = pick;
  // (no block of a cluster leaves while another may still read its shared memory)
  if (size > 1) cluster::sync();
}

}  // namespace

void argmax(const float* logits, int64_t n_tok, int64_t n_vocab, int32_t* out, cudaStream_t stream) {
  STRATA_REQUIRE(n_vocab >= 1 && n_vocab <= INT32_MAX, "argmax: vocabulary size {}", n_vocab);
  if (n_tok <= 0) return;
  argmax_kernel<<<static_cast<unsigned>(n_tok), kRowThreads, 0, stream>>>(logits, n_vocab, out);
  CUDA_CHECK_LAUNCH();
}

// logits: [n_tok][n_vocab]; ban: [n_ban]; rows: [n_tok] or null. One thread per (row, banned id).
__global__ void ban_tokens_kernel(float* logits, int64_t n_tok, int64_t n_vocab, const int32_t* ban, int32_t n_ban,
                                  const uint8_t* rows) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tok * n_ban) return;
  const int64_t t = i / n_ban;
  const int32_t id = ban[i % n_ban];
  if ((rows == nullptr || rows[t] != 0) && id >= 0 && id < n_vocab) logits[t * n_vocab + id] = -INFINITY;
}

void ban_tokens(float* logits, int64_t n_tok, int64_t n_vocab, const int32_t* ban, int32_t n_ban,
                const uint8_t* rows, cudaStream_t stream) {
  STRATA_REQUIRE(n_tok >= 0 && n_ban >= 0 && n_vocab >= 1 && n_vocab <= INT32_MAX,
                 "ban_tokens: {} rows of {} logits, {} banned ids", n_tok, n_vocab, n_ban);
  STRATA_REQUIRE(n_tok <= INT32_MAX / std::max(n_ban, 1), "ban_tokens: {} rows x {} ids", n_tok, n_ban);
  if (n_tok == 0 || n_ban == 0) return;
  const int64_t n = n_tok * n_ban;
  ban_tokens_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(logits, n_tok, n_vocab, ban, n_ban,
                                                                                rows);
  CUDA_CHECK_LAUNCH();
}

namespace {
int64_t cand_parts(int64_t n_vocab) { return (n_vocab + kSampleCandStretch - 1) / kSampleCandStretch; }
// Whether a launch over n_tok rows can take the prefilter (its grid's y and the scratch's size are bounded).
bool cand_fits(int64_t n_tok, int64_t n_vocab) { return n_tok <= 65535 && cand_parts(n_vocab) <= kSampleCandMaxParts; }
DigitSetting g_sample_prefilter("STRATA_CUDA_SAMPLE_PREFILTER", "the device sampler's candidate prefilter", 0, 1, 1);
}  // namespace

size_t sample_scratch_bytes(int64_t n_tok, int64_t n_vocab) {
  STRATA_REQUIRE(n_tok >= 0 && n_vocab >= 1, "sample_scratch_bytes: {} rows of {}", n_tok, n_vocab);
  if (!cand_fits(n_tok, n_vocab)) return 0;  // (the sampler then reads the whole row in every pass)
  return size_t(n_tok) * size_t(cand_parts(n_vocab)) * size_t(kSampleCandMaxK) * sizeof(uint64_t);
}

void set_sample_prefilter(bool on) { g_sample_prefilter.set(on ? 1 : 0); }
bool sample_prefilter() { return g_sample_prefilter.get() == 1; }
namespace {
DigitSetting g_sample_merge("STRATA_CUDA_SAMPLE_MERGE", "the prefilter's warp merges", 0, 1, 1);
}  // namespace
void set_sample_merge(bool on) { g_sample_merge.set(on ? 1 : 0); }
bool sample_merge() { return g_sample_merge.get() == 1; }

namespace {
DigitSetting g_sample_deep("STRATA_CUDA_SAMPLE_DEEP", "the device sampler's deep search by mass", 0, 1, 1);
}  // namespace
void set_sample_deep(bool on) { g_sample_deep.set(on ? 1 : 0); }
bool sample_deep() { return g_sample_deep.get() == 1; }
namespace {
// (on since session 49: bench/results/2026-12-07-gpu-session49-h100.md)
DigitSetting g_sample_deep_agg("STRATA_CUDA_SAMPLE_DEEP_AGG", "the deep search's atomics a warp at a time", 0, 1, 1);
}  // namespace
void set_sample_deep_agg(bool on) { g_sample_deep_agg.set(on ? 1 : 0); }
bool sample_deep_agg() { return g_sample_deep_agg.get() == 1; }
namespace {
DigitSetting g_sample_deep_warp("STRATA_CUDA_SAMPLE_DEEP_WARP", "the deep search's bin pick by a warp", 0, 1, 0);
}  // namespace
void set_sample_deep_warp(bool on) { g_sample_deep_warp.set(on ? 1 : 0); }
bool sample_deep_warp() { return g_sample_deep_warp.get() == 1; }
namespace {
DigitSetting g_sample_batched("STRATA_CUDA_SAMPLE_BATCH", "the device sampler's batched row loads", 0, 1, 1);
}  // namespace
bool sample_batched() { return g_sample_batched.get() == 1; }

namespace {
DigitSetting g_sample_cluster("STRATA_CUDA_SAMPLE_CLUSTER", "the device sampler's blocks a row", 1, 8, 8);
}  // namespace
void set_sample_cluster(int blocks) { g_sample_cluster.set(blocks); }
int sample_cluster() { return g_sample_cluster.get(); }
namespace {
std::atomic<uint32_t> g_sample_cluster_jitter{0};
}  // namespace
void set_sample_cluster_jitter(uint32_t seed) { g_sample_cluster_jitter.store(seed, std::memory_order_relaxed); }

void check_sample_params(const SampleParams& p) {
  STRATA_REQUIRE(std::isfinite(p.temperature), "sample: temperature must be finite, got {}", p.temperature);
  STRATA_REQUIRE(p.top_p > 0.0f && p.top_p <= 1.0f, "sample: top-p must be in (0, 1], got {}", p.top_p);
  STRATA_REQUIRE(p.min_p >= 0.0f && p.min_p <= 1.0f, "sample: min-p must be in [0, 1], got {}", p.min_p);
}

namespace {
// The blocks a row for this launch: sample_cluster(), or 1 where this device cannot run clusters of that many
// sampler blocks (checked once a size and device; a warning names the fallback).
int sample_cluster_blocks() {
  const int want = sample_cluster();
  if (want == 1) return 1;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> known;  // (device, size) -> blocks to use
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find({dev, want});
  if (it != known.end()) return it->second;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  int clusters = 0;
  if (prop.major >= 9) {
    LaunchAttrs attr;
    const cudaLaunchConfig_t cfg = cluster_launch_config(dim3(unsigned(want)), dim3(kRowThreads), unsigned(want),
                                                         nullptr, attr);
    if (cudaOccupancyMaxActiveClusters(&clusters, sample_kernel, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();  // (the query's error is not the stream's)
      clusters = 0;
    }
  }
  const int use = clusters > 0 ? want : 1;
  if (use != want)
    std::fprintf(stderr, "strata: STRATA_CUDA_SAMPLE_CLUSTER=%d: device %d (%s, sm_%d%d) cannot run clusters of %d "
                 "sampler blocks; using one block a row\n", want, dev, prop.name, prop.major, prop.minor, want);
  known[{dev, want}] = use;
  return use;
}

// Both entry points: the prefilter where scratch is given and the launch fits it, then the sampler.
void launch_sample(const float* logits, int64_t n_tok, int64_t n_vocab, const SampleParams& p,
                   const SampleParams* rows, const float* u, void* scratch, int32_t* out, cudaStream_t stream) {
  uint64_t* cand = scratch != nullptr && sample_prefilter() && cand_fits(n_tok, n_vocab)
                       ? static_cast<uint64_t*>(scratch)
                       : nullptr;
  const int64_t parts = cand_parts(n_vocab), stride = parts * kSampleCandMaxK;
  const bool merge = sample_merge();
  if (cand != nullptr && (rows != nullptr || uses_cand(p, n_vocab))) {
    const dim3 grid{unsigned(parts), unsigned(n_tok)};
    if (merge)
      sample_cand_merge_kernel<<<grid, kMergeThreads, 0, stream>>>(logits, n_vocab, p, rows, cand, stride);
    else
      sample_cand_kernel<<<grid, kCandThreads, 0, stream>>>(logits, n_vocab, p, rows, cand, stride);
    CUDA_CHECK_LAUNCH();
  }
  // One block where one rule holds every row and its passes read the merged candidates, never the row: a cluster
  // would only repeat that block's work. (sample_rows' rules are on the device: the cluster it is.)
  const bool no_pass = rows == nullptr && cand != nullptr && merge && uses_cand(p, n_vocab);
  const int cl = no_pass ? 1 : sample_cluster_blocks();
  STRATA_REQUIRE(n_tok <= INT32_MAX / cl, "sample: {} rows x {} blocks a row", n_tok, cl);
  LaunchAttrs attr;
  const cudaLaunchConfig_t cfg = cluster_launch_config(dim3(static_cast<unsigned>(n_tok) * unsigned(cl)),
                                                       dim3(kRowThreads), unsigned(cl), stream, attr);
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, sample_kernel, logits, n_vocab, p, rows, u, out, sample_deep(),
                                sample_batched(), static_cast<const uint64_t*>(cand), stride, int(parts), merge,
                                sample_deep_agg(), sample_deep_warp(),
                                g_sample_cluster_jitter.load(std::memory_order_relaxed)));
}
}  // namespace

void sample(const float* logits, int64_t n_tok, int64_t n_vocab, const SampleParams& p, const float* u,
            void* scratch, int32_t* out, cudaStream_t stream) {
  STRATA_REQUIRE(n_vocab >= 1 && n_vocab <= INT32_MAX, "sample: vocabulary size {}", n_vocab);
  check_sample_params(p);
  if (n_tok <= 0) return;
  launch_sample(logits, n_tok, n_vocab, p, nullptr, u, scratch, out, stream);
}

void sample_rows(const float* logits, int64_t n_tok, int64_t n_vocab, const SampleParams* rows, const float* u,
                 void* scratch, int32_t* out, cudaStream_t stream) {
  STRATA_REQUIRE(n_vocab >= 1 && n_vocab <= INT32_MAX, "sample: vocabulary size {}", n_vocab);
  STRATA_REQUIRE(rows != nullptr || n_tok <= 0, "sample_rows: no rules");
  if (n_tok <= 0) return;
  launch_sample(logits, n_tok, n_vocab, SampleParams{}, rows, u, scratch, out, stream);
}

namespace {
int64_t argmax_parts(int64_t n_vocab) {
  return std::min(kArgmaxMaxParts, (n_vocab + kArgmaxStretch - 1) / kArgmaxStretch);
}

constexpr int kArgmaxThreads = 256;  // kArgmaxStretch / 8: 8 loads in flight a thread per stretch

// logits: [n_tok][n_vocab]; parts: [n_tok][gridDim.x]. Block (b, t): stretches b, b + gridDim.x, ... of row t.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_part_kernel(const float* logits, int64_t n_vocab,
                                                                     uint64_t* parts) {
  __shared__ uint64_t sh[32];
  const float* row = logits + blockIdx.y * n_vocab;
  uint64_t best = 0;
  for (int64_t s0 = int64_t(blockIdx.x) * kArgmaxStretch; s0 < n_vocab; s0 += int64_t(gridDim.x) * kArgmaxStretch) {
    float v[kArgmaxStretch / kArgmaxThreads];
#pragma unroll
    for (int j = 0; j < kArgmaxStretch / kArgmaxThreads; ++j) {  // every load first, then the keys
      const int64_t i = s0 + threadIdx.x + j * kArgmaxThreads;
      v[j] = i < n_vocab ? row[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kArgmaxStretch / kArgmaxThreads; ++j) {
      const int64_t i = s0 + threadIdx.x + j * kArgmaxThreads;
      if (i < n_vocab) best = MaxOp{}(best, order_key(v[j], static_cast<uint32_t>(i)));
    }
  }
  best = block_reduce(best, sh, MaxOp{});
  if (threadIdx.x == 0) parts[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = best;
}

// parts: [n_tok][n_parts]; out: [n_tok]. One block a row.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_join_kernel(const uint64_t* parts, int n_parts,
                                                                     int32_t* out) {
  __shared__ uint64_t sh[32];
  uint64_t best = 0;
  for (int b = threadIdx.x; b < n_parts; b += blockDim.x)
    best = MaxOp{}(best, parts[int64_t(blockIdx.x) * n_parts + b]);
  best = block_reduce(best, sh, MaxOp{});
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(key_id(best));
}

// dst, src: [n]
__global__ void copy_i32_kernel(int32_t* dst, const int32_t* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}
}  // namespace

size_t argmax_parts_bytes(int64_t n_tok, int64_t n_vocab) {
  STRATA_REQUIRE(n_tok >= 0 && n_vocab >= 1, "argmax_parts_bytes: {} rows of {}", n_tok, n_vocab);
  return size_t(n_tok) * size_t(argmax_parts(n_vocab)) * sizeof(uint64_t);
}

void argmax_wide(const float* logits, int64_t n_tok, int64_t n_vocab, uint64_t* parts, int32_t* out,
                 cudaStream_t stream) {
  STRATA_REQUIRE(n_vocab >= 1 && n_vocab <= INT32_MAX && n_tok >= 0 && n_tok <= 65535,
                 "argmax_wide: {} rows of {} values", n_tok, n_vocab);
  if (n_tok == 0) return;
  const int64_t n_parts = argmax_parts(n_vocab);
  argmax_part_kernel<<<dim3(unsigned(n_parts), unsigned(n_tok)), kArgmaxThreads, 0, stream>>>(logits, n_vocab, parts);
  CUDA_CHECK_LAUNCH();
  argmax_join_kernel<<<unsigned(n_tok), kArgmaxThreads, 0, stream>>>(parts, int(n_parts), out);
  CUDA_CHECK_LAUNCH();
}

void copy_i32(int32_t* dst, const int32_t* src, int64_t n, cudaStream_t stream) {
  STRATA_REQUIRE(n >= 0 && n <= int64_t(1) << 30, "copy_i32: {} values", n);
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1024));
  copy_i32_kernel<<<blocks, 256, 0, stream>>>(dst, src, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace strata::cuda::ops
