#include "model/moe_ffn.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "common/error.h"
#include "cpu/cpu_features.h"
#include "cpu/ops.h"
#include "quant/q4k_gemm.h"
#include "quant/vec_dot.h"

namespace strata {

MoeScratch::MoeScratch(int64_t max_tokens_, int k_, int n_expert, int64_t n_embd, int64_t n_ff)
    : offset(static_cast<size_t>(n_expert) + 1),
      fill(static_cast<size_t>(n_expert)),
      row_of(static_cast<size_t>(max_tokens_ * k_)),
      tok_of(static_cast<size_t>(max_tokens_ * k_)),
      xe(static_cast<size_t>(max_tokens_ * k_ * n_embd)),
      g(static_cast<size_t>(max_tokens_ * k_ * n_ff)),
      u(static_cast<size_t>(max_tokens_ * k_ * n_ff)),
      d(static_cast<size_t>(max_tokens_ * k_ * n_embd)),
      max_tokens(max_tokens_),
      k(k_),
      n_sync(static_cast<size_t>(2 * n_expert + n_embd / 16 + 1)),
      sync(std::make_unique<Counter[]>(n_sync)) {
  active.reserve(static_cast<size_t>(n_expert));
}

size_t MoeScratch::memory_bytes() const {
  return (xe.size() + g.size() + u.size() + d.size()) * 4 +
         (offset.size() + fill.size() + row_of.size() + tok_of.size() + active.capacity()) * 4 + xq_gate.size() +
         xq_up.size() + hq.size() +
         n_sync * sizeof(Counter);
}

const MoeOptions& MoeOptions::from_env() {
  static const MoeOptions opt = [] {
    MoeOptions o;
    if (const char* v = std::getenv("STRATA_MOE_FUSED")) o.fused = std::atoi(v) != 0;
    if (const char* v = std::getenv("STRATA_MOE_PREFETCH")) o.prefetch_bytes = std::max(0, std::atoi(v));
    if (const char* v = std::getenv("STRATA_MOE_PREFETCH_L2")) o.prefetch_l2 = std::atoi(v) != 0;
    if (const char* v = std::getenv("STRATA_MOE_ONE_REGION")) o.one_region = std::atoi(v) != 0;
    if (const char* v = std::getenv("STRATA_MOE_TAIL_KIB")) o.tail_item_bytes = std::max(0, std::atoi(v)) << 10;
    if (const char* v = std::getenv("STRATA_MOE_PAIR")) o.pair_rows = std::atoi(v) != 0;
    if (const char* v = std::getenv("STRATA_MOE_ITEM_KIB")) o.item_bytes = std::max(1, std::atoi(v)) << 10;
    return o;
  }();
  return opt;
}

namespace {

#if defined(__x86_64__) || defined(_M_X64)
#define STRATA_MOE_RELAX() _mm_pause()
#else
#define STRATA_MOE_RELAX() std::this_thread::yield()
#endif

// Prefetches the cache lines that hold [p, end) into L2 (l2) or L1.
inline void prefetch_range(const uint8_t* p, const uint8_t* end, bool l2) {
  p = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63));
  if (l2)
    for (; p < end; p += 64) __builtin_prefetch(p, 0, 2);
  else
    for (; p < end; p += 64) __builtin_prefetch(p, 0, 3);
}

// Software prefetch of one work item's weights, read as one stream over up to 2 contiguous segments
// (gate rows then up rows): start() prefetches the first `dist` bytes, and each row read advances the
// window by that row's bytes, so prefetches stay `dist` bytes ahead of the reader, never past the item.
class PrefetchStream {
 public:
  PrefetchStream(int64_t dist, bool l2) : dist_(dist), l2_(l2) {}
  void add(const uint8_t* begin, const uint8_t* end) { seg_[n_++] = {begin, end}; }
  void start() { advance(dist_); }
  void advance(int64_t bytes) {
    while (bytes > 0 && i_ < n_) {
      const uint8_t* p = seg_[i_].begin + pos_;
      const int64_t len = std::min<int64_t>(bytes, seg_[i_].end - p);
      prefetch_range(p, p + len, l2_);
      pos_ += len;
      bytes -= len;
      if (seg_[i_].begin + pos_ >= seg_[i_].end) ++i_, pos_ = 0;
    }
  }

 private:
  struct Seg {
    const uint8_t *begin, *end;
  };
  Seg seg_[2] = {};
  int n_ = 0, i_ = 0;
  int64_t pos_ = 0;  // bytes of segment i_ already prefetched
  int64_t dist_;
  bool l2_;
};

// One matrix of the fused path: its kernel and the layout of its quantized activations.
struct FusedMat {
  q::DotKernel k;
  int passes = 1;     // 2: FastPrecise (first rounding and residual rows, back to back)
  int64_t rb = 0;     // bytes of one weight row
  int64_t xb = 0;     // bytes of one quantized activation row (one pass)
  int64_t cols = 0;

  FusedMat(const Weight& wt, MatmulMode mode, CpuLevel level) {
    k = q::dot_kernel(wt.type, level);
    passes = mode == MatmulMode::FastPrecise && k.act != q::ActType::F32 ? 2 : 1;
    rb = wt.row_bytes();
    cols = wt.ne[0];
    xb = k.fn ? q::act_row_bytes(k.act, cols) : 0;
  }
  int64_t act_bytes() const { return passes * xb; }  // one token's quantized activations

  // y[t * y_stride + r] = row r of w . token t's activations (at xq + t * act_bytes()), r in [r0, r1),
  // t < cnt. The same kernel calls, in the same combination, as matmul_many's run_chunk (fn4 is
  // bit-identical to fn), so the same values. ps (may be null): advanced by each row read.
  void rows(const uint8_t* w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t cnt, float* y, int64_t y_stride,
            PrefetchStream* ps) const {
    const int64_t ab = act_bytes();
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* wr = w + r * rb;
      if (ps) ps->advance(rb);
      int64_t t = 0;
      if (passes == 2) {
        if (k.fn4)  // two tokens' two passes per weight decode
          for (; t + 2 <= cnt; t += 2) {
            float o[4];
            k.fn4(cols, wr, xq + t * ab, xb, o, 1);
            y[t * y_stride + r] = o[0] + o[1];
            y[(t + 1) * y_stride + r] = o[2] + o[3];
          }
        for (; t < cnt; ++t) y[t * y_stride + r] = k.fn(cols, wr, xq + t * ab) + k.fn(cols, wr, xq + t * ab + xb);
      } else {
        if (k.fn4)
          for (; t + 4 <= cnt; t += 4) k.fn4(cols, wr, xq + t * ab, ab, y + t * y_stride + r, y_stride);
        for (; t < cnt; ++t) y[t * y_stride + r] = k.fn(cols, wr, xq + t * ab);
      }
    }
  }
};

// The block handed out at position c of n blocks (0 <= c < n) when the blocks form `groups` contiguous
// runs (sizes n / groups or one more, the longer ones first) and consecutive positions go to
// consecutive runs. Why: the pool hands items out in order, so with `groups` = its threads each thread
// tends to keep one run of an expert's rows and streams it without holes (consecutive blocks to
// alternating threads leave every thread's stream full of holes the prefetchers read for nothing).
// Only the order changes, never a value.
inline int64_t spread(int64_t c, int64_t n, int64_t groups) {
  if (groups <= 1 || n <= groups) return c;
  const int64_t m = n / groups, r = n % groups;
  const auto start = [&](int64_t g) { return g * m + std::min(g, r); };
  return c < m * groups ? start(c % groups) + c / groups : start(c - m * groups) + m;
}

// Rows per work item: about `item_bytes` of weights at `bytes_per_row` (all matrices an item reads per
// row), a multiple of `align` (whole cache lines of the float outputs), at least `align`, at most
// `total` rounded up to `align`.
int64_t item_rows(int64_t item_bytes, int64_t bytes_per_row, int64_t align, int64_t total) {
  int64_t r = item_bytes / std::max<int64_t>(1, bytes_per_row);
  r = std::max(align, (r + align - 1) / align * align);
  return std::min(r, (total + align - 1) / align * align);
}

// The fused path promises matmul_many's bytes; matmul_many's Q4_K prefill kernel rounds differently and
// must never see a decode-sized batch.
static_assert(q::kQ4kGemmMinTok > kMoeFusedMaxTokens);

// The fused decode path (n <= kMoeFusedMaxTokens, an integer kernel for all three matrices): one
// parallel region (or two, MoeOptions::one_region = false) and no serial work between the phases:
// 1. gate+up items (active expert, range of n_ff rows), expert-major. An item computes the range's
//    gate and up rows for each token of the expert, then swiglu on them (in s.g); the thread that
//    finishes an expert's last item quantizes that expert's swiglu rows for down (s.hq) and marks
//    them ready.
// 2. down items (active expert, range of n_embd rows: ~item_bytes of contiguous weights, a long
//    stream for the prefetchers; the last expert's ranges split in smaller items, tail_item_bytes),
//    after all gate+up items in the same list; an item waits for its expert's inputs if they are not
//    ready yet (only at the boundary). The item that completes a range (per-range counter) writes the
//    slot-ordered weighted sum of the range's rows (out).
// Same kernels, same quantized activations, same swiglu and same sum order as the general path:
// the same bytes (tests/test_moe_decode_path.cpp).
void moe_fused(const ExpertWeights& ew, const float* x, int64_t n, const float* w, int k, float* out,
               MoeScratch& s, ThreadPool& pool, const MoeOptions& opt, const FusedMat& fg, const FusedMat& fu,
               const FusedMat& fd) {
  const int64_t n_embd = ew.gate.ne[0], n_ff = ew.gate.ne[1];
  const int n_expert = static_cast<int>(ew.gate.ne[2]);
  const int64_t n_rows = s.offset[static_cast<size_t>(n_expert)];
  s.active.clear();
  for (int e = 0; e < n_expert; ++e)
    if (s.offset[e + 1] > s.offset[e]) s.active.push_back(e);
  const int64_t n_act = static_cast<int64_t>(s.active.size());
  if (n_act == 0) {  // no pair runs here: every token's sum is 0
    std::fill(out, out + n * n_embd, 0.0f);
    return;
  }
  // Token activations, quantized once per token for gate (and for up when its format needs others).
  const bool same_acts = fg.k.act == fu.k.act && fg.passes == fu.passes;
  auto grow = [](std::vector<uint8_t>& v, int64_t bytes) {
    if (static_cast<int64_t>(v.size()) < bytes) v.resize(static_cast<size_t>(bytes));
  };
  grow(s.xq_gate, n * fg.act_bytes());
  if (!same_acts) grow(s.xq_up, n * fu.act_bytes());
  grow(s.hq, n_rows * fd.act_bytes());
  for (int64_t t = 0; t < n; ++t) {
    q::quantize_act_row_passes(fg.k.act, x + t * n_embd, s.xq_gate.data() + t * fg.act_bytes(), n_embd, fg.passes);
    if (!same_acts)
      q::quantize_act_row_passes(fu.k.act, x + t * n_embd, s.xq_up.data() + t * fu.act_bytes(), n_embd, fu.passes);
  }
  // Gate and up rows of a one-token expert through the two-row kernel: same type, same activations,
  // one pass (MoeOptions::pair_rows).
  const bool pair = opt.pair_rows && same_acts && fg.passes == 1 && fg.k.fn2 != nullptr && fg.k.fn2 == fu.k.fn2;
  const uint8_t* xqg = s.xq_gate.data();
  const uint8_t* xqu = same_acts ? xqg : s.xq_up.data();
  uint8_t* hq = s.hq.data();
  float* g = s.g.data();
  float* u = s.u.data();
  float* d = s.d.data();
  const int32_t* act = s.active.data();
  const int32_t* off = s.offset.data();
  const int32_t* tok = s.tok_of.data();
  // Counters (scratch, one cache line each): gate+up items done per active expert, down inputs ready
  // per active expert, down items done per row range.
  MoeScratch::Counter* done = s.sync.get();
  MoeScratch::Counter* ready = done + n_expert;
  MoeScratch::Counter* range_done = done + 2 * n_expert;
  const int64_t pf = opt.prefetch_bytes;
  const bool l2 = opt.prefetch_l2;
  const int64_t rows1 = item_rows(opt.item_bytes, fg.rb + fu.rb, 8, n_ff);
  const int64_t per1 = (n_ff + rows1 - 1) / rows1;  // gate+up items per expert
  const int64_t n_thr = pool.size();                // runs of row blocks per expert (spread)
  // Down: ranges of rows2 rows, one item per range and expert; the last expert's ranges are split in
  // `split` items of rows_tail rows (tail_item_bytes), the last work handed out, so the threads run
  // out of work together. Range c is complete after (n_act - 1) + split items.
  const int64_t rows2 = item_rows(opt.item_bytes, fd.rb, 16, n_embd);
  const int64_t n_ranges = (n_embd + rows2 - 1) / rows2;  // <= n_embd / 16 + 1: scratch size
  const int64_t tail_bytes = opt.tail_item_bytes > 0 ? opt.tail_item_bytes : opt.item_bytes;
  const int64_t split = std::max<int64_t>(1, rows2 / item_rows(tail_bytes, fd.rb, 16, n_embd));
  const int64_t rows_tail = (rows2 / split + 15) / 16 * 16;
  const int32_t range_items = static_cast<int32_t>(n_act - 1 + split);
  for (int64_t a = 0; a < n_act; ++a) {
    done[a].v.store(0, std::memory_order_relaxed);
    ready[a].v.store(0, std::memory_order_relaxed);
  }
  for (int64_t c = 0; c < n_ranges; ++c) range_done[c].v.store(0, std::memory_order_relaxed);

  // Gate+up item i (expert-major): gate and up rows of one range for each token of the expert, swiglu
  // on them; the expert's last item quantizes its swiglu rows for down and marks them ready.
  auto gate_up_item = [&](int64_t i) {
    const int64_t a = i / per1, r0 = spread(i % per1, per1, n_thr) * rows1, r1 = std::min(n_ff, r0 + rows1);
    const int e = act[a];
    const int64_t R0 = off[e], R1 = off[e + 1];
    const uint8_t* gw = ew.gate.matrix(e);
    const uint8_t* uw = ew.up.matrix(e);
    const uint8_t* gend = gw + r1 * fg.rb;
    const uint8_t* uend = uw + r1 * fu.rb;
    if (R1 - R0 == 1) {
      // One token (decode): gate row r and up row r in turns, two streams in flight at once (one core
      // streams more bytes/s through two; bench/results/2026-11-29-cpu-decode-q4k.md). Same kernel calls.
      PrefetchStream psg(pf, l2), psu(pf, l2);
      psg.add(gw + r0 * fg.rb, gend);
      psu.add(uw + r0 * fu.rb, uend);
      if (pf > 0) psg.start(), psu.start();
      const uint8_t* xg = xqg + tok[R0] * fg.act_bytes();
      const uint8_t* xu = xqu + tok[R0] * fu.act_bytes();
      if (pair) {
        // Both rows in one call: the activations are loaded once for the two (bit-identical to fn twice).
        float o[2];
        for (int64_t r = r0; r < r1; ++r) {
          if (pf > 0) psg.advance(fg.rb), psu.advance(fu.rb);
          fg.k.fn2(fg.cols, gw + r * fg.rb, uw + r * fu.rb, xg, o);
          g[R0 * n_ff + r] = o[0];
          u[R0 * n_ff + r] = o[1];
        }
      } else {
        for (int64_t r = r0; r < r1; ++r) {
          fg.rows(gw, r, r + 1, xg, 1, g + R0 * n_ff, 0, pf > 0 ? &psg : nullptr);
          fu.rows(uw, r, r + 1, xu, 1, u + R0 * n_ff, 0, pf > 0 ? &psu : nullptr);
        }
      }
    } else {
      PrefetchStream ps(pf, l2);
      ps.add(gw + r0 * fg.rb, gend);
      ps.add(uw + r0 * fu.rb, uend);
      if (pf > 0) ps.start();
      // One token at a time through its own quantized row (an expert's tokens need not be adjacent).
      for (int64_t R = R0; R < R1; ++R)
        fg.rows(gw, r0, r1, xqg + tok[R] * fg.act_bytes(), 1, g + R * n_ff, 0, pf > 0 && R == R0 ? &ps : nullptr);
      for (int64_t R = R0; R < R1; ++R)
        fu.rows(uw, r0, r1, xqu + tok[R] * fu.act_bytes(), 1, u + R * n_ff, 0, pf > 0 && R == R0 ? &ps : nullptr);
    }
    for (int64_t R = R0; R < R1; ++R) cpu::swiglu(g + R * n_ff + r0, u + R * n_ff + r0, r1 - r0, g + R * n_ff + r0);
    // The last item of this expert (acq_rel: sees every other item's swiglu rows) quantizes them.
    if (done[a].v.fetch_add(1, std::memory_order_acq_rel) + 1 == per1) {
      for (int64_t R = R0; R < R1; ++R)
        q::quantize_act_row_passes(fd.k.act, g + R * n_ff, hq + R * fd.act_bytes(), n_ff, fd.passes);
      ready[a].v.store(1, std::memory_order_release);
    }
  };
  // Down item i (expert-major): rows of one range of the expert's down product (the whole range, or
  // a part of it for the last expert) for each of its tokens; the item that completes a range writes
  // the weighted sum of its rows.
  const int64_t n_big = (n_act - 1) * n_ranges;  // items of the experts but the last
  auto down_item = [&](int64_t i) {
    const int64_t a = i < n_big ? i / n_ranges : n_act - 1;
    const int64_t c = i < n_big ? spread(i % n_ranges, n_ranges, n_thr) : (i - n_big) / split;
    const int64_t c0 = c * rows2, c1 = std::min(n_embd, c0 + rows2);  // the range
    const int64_t r0 = i < n_big ? c0 : std::min(c1, c0 + (i - n_big) % split * rows_tail);
    const int64_t r1 = i < n_big ? c1 : std::min(c1, r0 + rows_tail);  // (may be empty: still counted)
    const int e = act[a];
    const uint8_t* dw = ew.down.matrix(e);
    const uint8_t* dend = dw + r1 * fd.rb;
    PrefetchStream ps(pf, l2);
    ps.add(dw + r0 * fd.rb, dend);
    if (pf > 0 && r1 > r0) ps.start();
    // One region: the expert's down inputs may still be in the making (only near the phase boundary:
    // all gate+up items come first in the list, so they are all handed out already).
    for (uint32_t spin = 0; ready[a].v.load(std::memory_order_acquire) == 0; ++spin) {
      if (spin < 1024)
        STRATA_MOE_RELAX();
      else
        std::this_thread::yield();  // the producer may be waiting for a core
    }
    const int64_t R0 = off[e];
    fd.rows(dw, r0, r1, hq + R0 * fd.act_bytes(), off[e + 1] - R0, d + R0 * n_embd, n_embd, pf > 0 ? &ps : nullptr);
    if (range_done[c].v.fetch_add(1, std::memory_order_acq_rel) + 1 != range_items) return;
    // Weighted sum of the range's rows in slot order (as the general path); a token with no pair: 0.
    for (int64_t t = 0; t < n; ++t) {
      float* o = out + t * n_embd;
      bool first = true;
      for (int j = 0; j < k; ++j) {
        const int32_t row = s.row_of[static_cast<size_t>(t * k + j)];
        if (row < 0) continue;
        const float wj = w[t * k + j];
        const float* dr = d + static_cast<int64_t>(row) * n_embd;
        if (first)
          for (int64_t y = c0; y < c1; ++y) o[y] = wj * dr[y];
        else
          for (int64_t y = c0; y < c1; ++y) o[y] += wj * dr[y];
        first = false;
      }
      if (first) std::fill(o + c0, o + c1, 0.0f);
    }
  };
  const int64_t n1 = n_act * per1, n2 = n_big + n_ranges * split;
  if (opt.one_region) {
    pool.parallel_for(n1 + n2, 1, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        if (i >= n1) {
          down_item(i - n1);
          continue;
        }
        try {
          gate_up_item(i);
        } catch (...) {  // (allocation failure) release the down items waiting; the pool rethrows it
          for (int64_t a = 0; a < n_act; ++a) ready[a].v.store(1, std::memory_order_release);
          throw;
        }
      }
    });
  } else {
    pool.parallel_for(n1, 1, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) gate_up_item(i);
    });
    pool.parallel_for(n2, 1, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) down_item(i);
    });
  }
}

}  // namespace

void moe_experts(const ExpertWeights& ew, const float* x, int64_t n, const int32_t* ids,
                 const float* w, int k, float* out, MoeScratch& s, cpu::MatmulBatch& mb,
                 ThreadPool& pool, MatmulMode mode) {
  moe_experts(ew, x, n, ids, w, k, out, s, mb, pool, mode, MoeOptions::from_env());
}

void moe_experts(const ExpertWeights& ew, const float* x, int64_t n, const int32_t* ids,
                 const float* w, int k, float* out, MoeScratch& s, cpu::MatmulBatch& mb,
                 ThreadPool& pool, MatmulMode mode, const MoeOptions& opt) {
  const int64_t n_embd = ew.gate.ne[0], n_ff = ew.gate.ne[1];
  const int n_expert = static_cast<int>(ew.gate.ne[2]);
  STRATA_REQUIRE(n <= s.max_tokens && k == s.k, "moe: batch of {} x {} exceeds scratch {} x {}", n,
                 k, s.max_tokens, s.k);
  // Group (token, slot) pairs by expert: counting sort.
  std::fill(s.offset.begin(), s.offset.end(), 0);
  // A negative id is a pair another worker runs (the GPU expert cache): skipped here.
  for (int64_t i = 0; i < n * k; ++i) {
    STRATA_REQUIRE(ids[i] < n_expert, "moe: expert id {} out of range", ids[i]);
    if (ids[i] >= 0) ++s.offset[static_cast<size_t>(ids[i]) + 1];
  }
  for (int e = 0; e < n_expert; ++e) s.offset[e + 1] += s.offset[e];
  std::copy(s.offset.begin(), s.offset.end() - 1, s.fill.begin());
  const int64_t n_rows = s.offset[static_cast<size_t>(n_expert)];  // pairs run here
  for (int64_t i = 0; i < n * k; ++i) {
    if (ids[i] < 0) {
      s.row_of[static_cast<size_t>(i)] = -1;
      continue;
    }
    const int32_t r = s.fill[static_cast<size_t>(ids[i])]++;
    s.row_of[static_cast<size_t>(i)] = r;
    s.tok_of[static_cast<size_t>(r)] = static_cast<int32_t>(i / k);
  }
  if (opt.fused && mode != MatmulMode::Exact && n <= kMoeFusedMaxTokens) {
    const CpuLevel level = cpu_level();
    const FusedMat fg(ew.gate, mode, level), fu(ew.up, mode, level), fd(ew.down, mode, level);
    if (fg.k.fn && fu.k.fn && fd.k.fn) {
      moe_fused(ew, x, n, w, k, out, s, pool, opt, fg, fu, fd);
      return;
    }
  }
  // Inputs of each expert: xe [n*k][n_embd], x gathered in grouped order. An expert with one token
  // reads that token's row of x in place instead: every expert of a decoded token then has the same
  // x pointer, and matmul_many quantizes the token's activations once for all of them (same values).
  auto expert_x = [&](int e) -> const float* {
    const int64_t r0 = s.offset[e];
    if (s.offset[e + 1] - r0 == 1) return x + s.tok_of[static_cast<size_t>(r0)] * n_embd;
    return s.xe.data() + r0 * n_embd;
  };
  for (int e = 0; e < n_expert; ++e) {
    if (s.offset[e + 1] - s.offset[e] < 2) continue;
    for (int64_t r = s.offset[e]; r < s.offset[e + 1]; ++r)
      std::memcpy(s.xe.data() + r * n_embd, x + s.tok_of[static_cast<size_t>(r)] * n_embd,
                  static_cast<size_t>(n_embd) * 4);
  }
  // gate and up of every active expert in one job.
  mb.clear();
  for (int e = 0; e < n_expert; ++e) {
    const int64_t r0 = s.offset[e], cnt = s.offset[e + 1] - r0;
    if (cnt == 0) continue;
    mb.add({ew.gate.type, ew.gate.matrix(e), n_ff, n_embd, expert_x(e), cnt, s.g.data() + r0 * n_ff});
    mb.add({ew.up.type, ew.up.matrix(e), n_ff, n_embd, expert_x(e), cnt, s.u.data() + r0 * n_ff});
  }
  mb.run(mode, pool);
  // Grain 256: a decode step's few thousand values spread over every thread (exp is the cost).
  const int64_t n_act = n_rows * n_ff;
  pool.parallel_for(n_act, 256, [&](int64_t b, int64_t e, int) {
    cpu::swiglu(s.g.data() + b, s.u.data() + b, e - b, s.g.data() + b);
  });
  // down of every active expert in one job.
  mb.clear();
  for (int e = 0; e < n_expert; ++e) {
    const int64_t r0 = s.offset[e], cnt = s.offset[e + 1] - r0;
    if (cnt == 0) continue;
    mb.add({ew.down.type, ew.down.matrix(e), n_embd, n_ff, s.g.data() + r0 * n_ff, cnt,
            s.d.data() + r0 * n_embd});
  }
  mb.run(mode, pool);
  // Weighted sum in slot order (as ggml adds the expert views); a token with no pair run here gets 0.
  for (int64_t t = 0; t < n; ++t) {
    float* o = out + t * n_embd;
    bool first = true;
    for (int j = 0; j < k; ++j) {
      const int32_t row = s.row_of[static_cast<size_t>(t * k + j)];
      if (row < 0) continue;
      const float wj = w[t * k + j];
      const float* dr = s.d.data() + static_cast<int64_t>(row) * n_embd;
      if (first)
        for (int64_t i = 0; i < n_embd; ++i) o[i] = wj * dr[i];
      else
        for (int64_t i = 0; i < n_embd; ++i) o[i] += wj * dr[i];
      first = false;
    }
    if (first) std::fill(o, o + n_embd, 0.0f);
  }
}

}  // namespace strata
