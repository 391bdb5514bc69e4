#include "model/moe_ffn.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "cpu/ops.h"

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
      k(k_) {}

size_t MoeScratch::memory_bytes() const {
  return (xe.size() + g.size() + u.size() + d.size()) * 4 +
         (offset.size() + fill.size() + row_of.size() + tok_of.size()) * 4;
}

void moe_experts(const ExpertWeights& ew, const float* x, int64_t n, const int32_t* ids,
                 const float* w, int k, float* out, MoeScratch& s, cpu::MatmulBatch& mb,
                 ThreadPool& pool, MatmulMode mode) {
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
