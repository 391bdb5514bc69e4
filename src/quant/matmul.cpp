// y[t][r] = sum_c W[r][c] * x[t][c], exact (dequantize + f32) or fast (integer kernels, quantized x).
//
// Work split: the rows of every job are cut into chunks (>= kRowGrain rows, >= kChunkBytes), and the
// pool hands the chunks out (one parallel region per call, however many jobs: a MoE layer's experts cost
// one wake-up of the pool); a large job's chunk takes the same rows of up to matmul_streams() far-apart
// parts of the matrix in turns (several weight streams per core: struct Chunk). Inside a chunk, tokens
// are walked in tiles and each weight row is used for every token of the tile while it is hot in L1
// (4 tokens per weight decode where the format has a 4-token kernel): the weights stream from memory
// once per call whatever n_tok is.
#include "quant/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <vector>

#include "common/error.h"
#include "cpu/cpu_features.h"
#include "quant/dequant.h"
#include "quant/q4k_gemm.h"
#include "quant/q4k_repack.h"
#include "quant/vec_dot.h"

namespace strata {
namespace {

constexpr int64_t kRowGrain = 16;  // rows per work item at least: ~36 KiB of Q4_K at 4096 columns
// ... and at least this many weight bytes: an expert's down matrix (768 columns of Q4_K: 432 bytes a
// row) would otherwise be cut into 7 KiB items, and a decode layer into ~1,800 items whose fetch_add
// on the one shared counter 16 threads contend for. Which thread computes a row does not change it.
constexpr int64_t kChunkBytes = 32 << 10;
constexpr int64_t kTokTile = 32;   // tokens per tile: their quantized rows stay in L2 across a row chunk

float dot_f32_rows(const float* a, const float* b, int64_t n) {
  // 8 independent partial sums (vectorizable, and fewer rounding steps than one running sum).
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void check_job(const MatmulJob& j) {
  const TypeTraits* tt = find_type_traits(j.type);
  STRATA_REQUIRE(tt != nullptr, "matmul: unknown type id {}", static_cast<uint32_t>(j.type));
  STRATA_REQUIRE(j.rows >= 0 && j.cols >= 0 && j.n_tok >= 0, "matmul: negative shape {}x{} n_tok {}", j.rows, j.cols,
                 j.n_tok);
  STRATA_REQUIRE(j.cols % tt->block_size == 0, "matmul: {} columns is not a multiple of the {} block size {}", j.cols,
                 tt->name, tt->block_size);
}

struct Prepared {
  q::DotKernel k;          // k.fn == nullptr: exact path (dequantize + f32)
  int64_t row_bytes = 0;   // bytes of one weight row
  int64_t xb = 0;          // bytes of one quantized activation row
  int64_t xq_offset = 0;   // where this job's quantized activations start in the shared buffer
  int passes = 1;          // 2: FastPrecise: token t's residual row follows its first row (2t, 2t+1)
  bool quantize = true;    // false: an earlier job with the same activations quantized them
  // Q4_K prefill over 8-row repacked weights (q4k_repack.h): the copy ([rows / 8][cols / 256]), or null
  std::shared_ptr<const q::RepQ4K8[]> rep;
  int64_t xperm_offset = -1;  // where its permuted activations ([n_tok][cols] bytes) start; -1: none
  bool permute = false;       // this job (the owner of its activations) fills that permuted copy
  q::Gemm16Fn gemm16 = nullptr;  // prefill of the K-quants, IQ4_XS and the 32-value formats: a 16-row integer kernel (q4k_gemm.h, q32_gemm.h) on whole 16-row groups
};

// An earlier job (among `owners`, the jobs that quantize their own activations) whose quantized
// activations job i can use: same x pointer, n_tok, cols, activation type and passes; -1 if none.
// Only the last kOwnerScan owners are looked at (jobs sharing x are added next to each other).
constexpr size_t kOwnerScan = 64;
int64_t find_same_acts(const MatmulJob* jobs, const Prepared* prep, const std::vector<int64_t>& owners, int64_t i) {
  const MatmulJob& j = jobs[i];
  const Prepared& p = prep[i];
  const size_t first = owners.size() > kOwnerScan ? owners.size() - kOwnerScan : 0;
  for (size_t o = owners.size(); o-- > first;) {
    const MatmulJob& m = jobs[owners[o]];
    const Prepared& q = prep[owners[o]];
    if (m.x == j.x && m.n_tok == j.n_tok && m.cols == j.cols && q.k.act == p.k.act && q.passes == p.passes)
      return owners[o];
  }
  return -1;
}

// Values of one quantized activation row (to form the residual x - q * d).
void dequantize_act(q::ActType act, const void* src, float* dst, int64_t n) {
  if (act == q::ActType::Q8_32) {
    const auto* b = static_cast<const q::BlockQ8A*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = b[i / 32].d * b[i / 32].qs[i % 32];
  } else if (act == q::ActType::Q8_K) {
    const auto* b = static_cast<const q::BlockQ8_K*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = b[i / 256].d * b[i / 256].qs[i % 256];
  }
}

// A work item: rows [r0, r1) of a job, and for a multi-stream job (stride > 0) the same rows of its
// parts part0 .. part0 + streams - 1 (r + p * stride, those < rows), taken in turns (r0 + part0 * stride,
// r0 + (part0 + 1) * stride, ..., then r0 + 1, ...). Why: one core streams weights from DRAM faster
// through a few far-apart sequential streams than through one (the hardware prefetchers keep more lines
// in flight: on the Zen 4 dev machine 18.6 GB/s through one, 20.1 through two, 21.1 through three;
// bench/results/2026-11-29-cpu-decode-q4k.md), and a decode step is that stream. With T threads the job
// has T groups of parts and consecutive work items go to consecutive groups: the pool hands items out
// in order, so each thread tends to keep its own group and reads it without holes. Which thread
// computes a row, and in which order, does not change it.
struct Chunk {
  int64_t job, r0, r1, stride = 0, streams = 1, rows = 0, part0 = 0;
};

// Calls f(r) for the chunk's rows in its order.
template <class F>
inline void for_rows(const Chunk& c, F&& f) {
  if (c.stride == 0) {
    for (int64_t r = c.r0; r < c.r1; ++r) f(r);
    return;
  }
  for (int64_t r = c.r0; r < c.r1; ++r)
    for (int64_t k = 0, rk = r + c.part0 * c.stride; k < c.streams && rk < c.rows; ++k, rk += c.stride) f(rk);
}

// Streams per job (matmul_streams()) where every part has at least kStreamMinRows rows (closer streams
// measured slower than one) and the job spans more than one work item per part.
constexpr int64_t kStreamMinRows = 128;
constexpr int kDefaultStreams = 3, kMaxStreams = 4;

std::atomic<int>& streams_flag() {  // 0: not read yet
  static std::atomic<int> f{0};
  return f;
}

void run_chunk(const MatmulJob& j, const Prepared& p, const uint8_t* xq, const uint8_t* xperm, const Chunk& ch) {
  const int64_t r0 = ch.r0, r1 = ch.r1;
  const auto* wb = static_cast<const uint8_t*>(j.w);
  if (p.gemm16) {  // 16 rows x every token per kernel call (the rows are transposed once per call)
    const int64_t g0 = (r0 + 15) / 16 * 16, g1 = r1 / 16 * 16;
    for (int64_t g = g0; g < g1; g += 16)
      p.gemm16(j.cols, wb + g * p.row_bytes, p.row_bytes, xq, p.xb, j.n_tok, j.y + g, j.rows);
    for (int64_t r = r0; r < r1; ++r) {  // rows outside whole groups
      if (r >= g0 && r < g1) continue;
      const uint8_t* wr = wb + r * p.row_bytes;
      int64_t t = 0;
      if (p.k.fn4)
        for (; t + 4 <= j.n_tok; t += 4) p.k.fn4(j.cols, wr, xq + t * p.xb, p.xb, j.y + t * j.rows + r, j.rows);
      for (; t < j.n_tok; ++t) j.y[t * j.rows + r] = p.k.fn(j.cols, wr, xq + t * p.xb);
    }
    return;
  }
  if (p.rep) {  // 8 rows x 4 tokens per kernel call over the repacked copy (bit-identical to fn4/fn)
    const int64_t g0 = (r0 + 7) / 8 * 8, g1 = r1 / 8 * 8;  // whole 8-row groups of this chunk
    const int64_t nb = j.cols / q::QK_K, tq = j.n_tok / 4 * 4;
    for (int64_t t0 = 0; t0 < tq; t0 += kTokTile) {
      const int64_t t1 = std::min(tq, t0 + kTokTile);
      for (int64_t g = g0; g < g1; g += 8)
        for (int64_t t = t0; t < t1; t += 4)
          q::q4k_gemm8x4_avx512(j.cols, p.rep.get() + g / 8 * nb, xq + t * p.xb, p.xb, xperm + t * j.cols,
                                j.y + t * j.rows + g, j.rows);
    }
    for (int64_t r = r0; r < r1; ++r) {  // rows outside whole groups: every token; the rest: the tail tokens
      const uint8_t* wr = wb + r * p.row_bytes;
      int64_t t = r >= g0 && r < g1 ? tq : 0;
      if (p.k.fn4)
        for (; t + 4 <= j.n_tok; t += 4) p.k.fn4(j.cols, wr, xq + t * p.xb, p.xb, j.y + t * j.rows + r, j.rows);
      for (; t < j.n_tok; ++t) j.y[t * j.rows + r] = p.k.fn(j.cols, wr, xq + t * p.xb);
    }
    return;
  }
  if (!p.k.fn) {  // exact mode (or no integer kernel): each row dequantized once, dotted with every token
    thread_local std::vector<float> row;  // [cols] f32; grows once, reused across calls
    if (static_cast<int64_t>(row.size()) < j.cols) row.resize(j.cols);
    for_rows(ch, [&](int64_t r) {
      dequantize_row(j.type, wb + r * p.row_bytes, row.data(), j.cols);
      for (int64_t t = 0; t < j.n_tok; ++t) j.y[t * j.rows + r] = dot_f32_rows(row.data(), j.x + t * j.cols, j.cols);
    });
    return;
  }
  if (p.passes == 2) {  // FastPrecise: y = w . q1 + w . q2; rows interleaved: (t, pass) at (2t + pass) * xb
    for_rows(ch, [&](int64_t r) {
      const uint8_t* wr = wb + r * p.row_bytes;
      int64_t t = 0;
      if (p.k.fn4)  // two tokens' two passes per weight decode
        for (; t + 2 <= j.n_tok; t += 2) {
          float o[4];
          p.k.fn4(j.cols, wr, xq + 2 * t * p.xb, p.xb, o, 1);
          j.y[t * j.rows + r] = o[0] + o[1];
          j.y[(t + 1) * j.rows + r] = o[2] + o[3];
        }
      for (; t < j.n_tok; ++t)
        j.y[t * j.rows + r] = p.k.fn(j.cols, wr, xq + 2 * t * p.xb) + p.k.fn(j.cols, wr, xq + (2 * t + 1) * p.xb);
    });
    return;
  }
  for (int64_t t0 = 0; t0 < j.n_tok; t0 += kTokTile) {
    const int64_t t1 = std::min(j.n_tok, t0 + kTokTile);
    for_rows(ch, [&](int64_t r) {
      const uint8_t* wr = wb + r * p.row_bytes;
      int64_t t = t0;
      if (p.k.fn4)  // 4 tokens per weight decode
        for (; t + 4 <= t1; t += 4) p.k.fn4(j.cols, wr, xq + t * p.xb, p.xb, j.y + t * j.rows + r, j.rows);
      for (; t < t1; ++t) j.y[t * j.rows + r] = p.k.fn(j.cols, wr, xq + t * p.xb);
    });
  }
}

}  // namespace

namespace q {

void quantize_act_row_passes(ActType act, const float* x, void* dst, int64_t n, int passes) {
  auto* q1 = static_cast<uint8_t*>(dst);
  quantize_act_row(act, x, q1, n);
  if (passes != 2) return;
  // Residual of the first rounding, quantized with its own scales.
  thread_local std::vector<float> resid;  // [n]
  if (static_cast<int64_t>(resid.size()) < n) resid.resize(n);
  dequantize_act(act, q1, resid.data(), n);
  for (int64_t c = 0; c < n; ++c) resid[c] = x[c] - resid[c];
  quantize_act_row(act, resid.data(), q1 + act_row_bytes(act, n), n);
}

}  // namespace q

void matmul_many(const MatmulJob* jobs, int64_t n_jobs, MatmulMode mode, ThreadPool& pool) {
  STRATA_REQUIRE(n_jobs >= 0 && (jobs || n_jobs == 0), "matmul: bad job list");
  thread_local std::vector<Prepared> prep;
  thread_local std::vector<Chunk> chunks;
  thread_local std::vector<uint8_t> xq_buf;
  thread_local std::vector<int64_t> owners;  // jobs that quantize their own activations
  thread_local std::vector<uint8_t> xperm_buf;  // permuted activations of repacked Q4_K jobs
  prep.assign(n_jobs, Prepared{});
  chunks.clear();
  owners.clear();
  int64_t xq_total = 0, xperm_total = 0;
  const CpuLevel level = cpu_level();
  const int n_streams = matmul_streams();
  for (int64_t i = 0; i < n_jobs; ++i) {
    const MatmulJob& j = jobs[i];
    check_job(j);
    Prepared& p = prep[i];
    if (mode != MatmulMode::Exact) p.k = q::dot_kernel(j.type, level);
    p.passes = mode == MatmulMode::FastPrecise && p.k.fn && p.k.act != q::ActType::F32 ? 2 : 1;
    if (!p.k.fn)
      STRATA_REQUIRE(can_dequantize(j.type), "matmul: unsupported type {}", type_name(j.type));
    p.row_bytes = static_cast<int64_t>(row_bytes(j.type, j.cols));
    if (p.k.fn) {
      p.xb = q::act_row_bytes(p.k.act, j.cols);
      // Jobs on the same activations (the gate and up of an expert; every expert of a decoded token,
      // whose x is the token's row) share one quantized copy: quantization is a pure function of
      // (x, cols, act, passes), so the result is the same bytes, computed once.
      const int64_t same = find_same_acts(jobs, prep.data(), owners, i);
      if (same >= 0) {
        p.xq_offset = prep[same].xq_offset;
        p.quantize = false;
      } else {
        p.xq_offset = xq_total;
        xq_total += p.xb * j.n_tok * p.passes;
        owners.push_back(i);
      }
      // Prefill in fast mode at the AVX-512 level: the type's 16-row integer kernel (q4k_gemm.h gemm16_kernel:
      // the K-quants, the 32-value formats, IQ4_XS and the IQ2/IQ3 formats; on unless STRATA_Q4K_GEMM=0), else
      // for Q4_K the 8-row repacked kernel when the engine has turned the repack cache on and the matrix fits
      // its budget.
      const bool avx512_fast = p.passes == 1 && p.k.level == CpuLevel::Avx512;
      if (avx512_fast && j.n_tok >= q::gemm16_min_tokens(j.type) && j.rows >= q::kQ4kGemmRows && q::q4k_gemm_enabled() &&
          q::q4k_gemm_cpu_ok())
        p.gemm16 = q::gemm16_kernel(j.type);
      if (!p.gemm16 && avx512_fast && j.type == GgmlType::Q4_K && j.n_tok >= 4)
        p.rep = q::q4k_repacked(j.w, j.rows, j.cols);
      if (p.rep) {
        Prepared& own = same >= 0 ? prep[same] : p;
        if (own.xperm_offset < 0) {
          own.xperm_offset = xperm_total;
          own.permute = true;
          xperm_total += j.n_tok * j.cols;
        }
        p.xperm_offset = own.xperm_offset;
      }
    }
    int64_t grain = std::max(kRowGrain, kChunkBytes / std::max<int64_t>(1, p.row_bytes));
    if (p.rep) grain = (grain + 7) / 8 * 8;  // chunks of whole 8-row groups
    if (p.gemm16) grain = (grain + 15) / 16 * 16;  // ... or 16-row groups
    if (j.n_tok == 0) continue;
    // Parts of >= kStreamMinRows rows and more than one work item each: `streams` per thread group.
    const int64_t per = std::max(kStreamMinRows, grain), n_thr = pool.size();
    int64_t groups = n_thr, streams = std::min<int64_t>(n_streams, j.rows / (n_thr * per));
    if (streams < 1 || groups * streams < 2) groups = 1, streams = std::min<int64_t>(n_streams, j.rows / per);
    if (!p.gemm16 && !p.rep && groups * streams > 1) {
      // item (c, g) = rows [c g, (c+1) g) of each part of group g
      const int64_t stride = (j.rows + groups * streams - 1) / (groups * streams);
      for (int64_t r = 0; r < stride; r += grain)
        for (int64_t g = 0; g < groups; ++g)
          chunks.push_back({i, r, std::min(stride, r + grain), stride, streams, j.rows, g * streams});
    } else {
      for (int64_t r = 0; r < j.rows; r += grain) chunks.push_back({i, r, std::min(j.rows, r + grain)});
    }
  }
  if (chunks.empty()) return;
  // Quantize every job's activations once: [job][n_tok][xb bytes].
  if (static_cast<int64_t>(xq_buf.size()) < xq_total) xq_buf.resize(xq_total);
  uint8_t* xq = xq_buf.data();
  const Prepared* pp = prep.data();
  for (int64_t i = 0; i < n_jobs; ++i) {
    const MatmulJob& j = jobs[i];
    if (!pp[i].k.fn || !pp[i].quantize || j.n_tok == 0) continue;
    pool.parallel_for(j.n_tok, 8, [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t)
        q::quantize_act_row_passes(pp[i].k.act, j.x + t * j.cols, xq + pp[i].xq_offset + t * pp[i].passes * pp[i].xb,
                                   j.cols, pp[i].passes);
    });
  }
  // Permuted copies of the activations the repacked Q4_K jobs read: [n_tok][cols] bytes each.
  if (static_cast<int64_t>(xperm_buf.size()) < xperm_total) xperm_buf.resize(xperm_total);
  uint8_t* xperm = xperm_buf.data();
  for (int64_t i = 0; i < n_jobs; ++i) {
    if (!pp[i].permute) continue;
    const MatmulJob& j = jobs[i];
    pool.parallel_for(j.n_tok, 8, [&](int64_t t0, int64_t t1, int) {
      q::q4k_permute_acts(xq + pp[i].xq_offset + t0 * pp[i].xb, pp[i].xb, t1 - t0, j.cols,
                          xperm + pp[i].xperm_offset + t0 * j.cols);
    });
  }
  const Chunk* cs = chunks.data();
  pool.parallel_for(static_cast<int64_t>(chunks.size()), 1, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c) {
      const Chunk& ch = cs[c];
      const Prepared& p = pp[ch.job];
      run_chunk(jobs[ch.job], p, xq + p.xq_offset, p.rep ? xperm + p.xperm_offset : nullptr, ch);
    }
  });
}

int matmul_streams() {
  int v = streams_flag().load(std::memory_order_relaxed);
  if (v == 0) {
    v = kDefaultStreams;
    if (const char* e = std::getenv("STRATA_MATMUL_STREAMS"); e && *e) {
      STRATA_REQUIRE(e[1] == 0 && e[0] >= '1' && e[0] <= '0' + kMaxStreams, "STRATA_MATMUL_STREAMS must be 1..{}, got '{}'",
                     kMaxStreams, e);
      v = e[0] - '0';
    }
    streams_flag().store(v, std::memory_order_relaxed);
  }
  return v;
}

void matmul_set_streams(int n) {
  STRATA_REQUIRE(n >= 1 && n <= kMaxStreams, "matmul_set_streams: {} is not in 1..{}", n, kMaxStreams);
  streams_flag().store(n, std::memory_order_relaxed);
}

void matmul(GgmlType type, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_tok, float* y,
            MatmulMode mode, ThreadPool& pool) {
  const MatmulJob job{type, w, rows, cols, x, n_tok, y};
  matmul_many(&job, 1, mode, pool);
}

}  // namespace strata
