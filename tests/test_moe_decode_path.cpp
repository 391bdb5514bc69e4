// The decode fast paths of moe_experts / matmul_many, checked bit for bit against the plain path:
// - matmul_many jobs that share an x pointer quantize the activations once; the results must be the
//   same bytes as each job run alone by matmul() on its own copy of x.
// - moe_experts lets a single-token expert read the token's row of x in place (so all experts of a
//   decoded token share one quantized copy); its output must equal, bit for bit, the expert-by-expert
//   computation on gathered copies (separate matmul() calls, swiglu, weighted sum in slot order).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/matmul_batch.h"
#include "cpu/ops.h"
#include "cpu/thread_pool.h"
#include "model/moe_ffn.h"
#include "quant/matmul.h"
#include "quant_test_util.h"

using namespace strata;

namespace {

std::vector<uint8_t> random_matrix(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<uint8_t> m;
  for (int64_t r = 0; r < rows; ++r) {
    auto row = test::random_row(t, cols, rng);
    m.insert(m.end(), row.begin(), row.end());
  }
  return m;
}

TEST(MatmulManySharedActs, SameBytesAsSeparateCalls) {
  const int64_t rows = 96, cols = 512;
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q6_K}) {
    for (MatmulMode mode : {MatmulMode::Fast, MatmulMode::FastPrecise}) {
      for (int64_t n_tok : {1, 3, 5}) {
        std::mt19937 rng(17);
        const auto w0 = random_matrix(t, rows, cols, rng), w1 = random_matrix(t, rows, cols, rng);
        const auto xa = test::random_acts(n_tok * cols, rng), xb = test::random_acts(n_tok * cols, rng);
        std::vector<float> y(4 * n_tok * rows), ref(4 * n_tok * rows);
        // Jobs 0, 1, 3 share xa (1 and 3 not adjacent to their owner), job 2 reads xb.
        const MatmulJob jobs[4] = {{t, w0.data(), rows, cols, xa.data(), n_tok, y.data()},
                                   {t, w1.data(), rows, cols, xa.data(), n_tok, y.data() + n_tok * rows},
                                   {t, w0.data(), rows, cols, xb.data(), n_tok, y.data() + 2 * n_tok * rows},
                                   {t, w1.data(), rows, cols, xa.data(), n_tok, y.data() + 3 * n_tok * rows}};
        ThreadPool pool(2);
        matmul_many(jobs, 4, mode, pool);
        for (int i = 0; i < 4; ++i) {
          const std::vector<float> xcopy(jobs[i].x, jobs[i].x + n_tok * cols);  // a distinct pointer
          matmul(t, jobs[i].w, rows, cols, xcopy.data(), n_tok, ref.data() + i * n_tok * rows, mode, pool);
        }
        ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 4))
            << type_name(t) << " mode " << int(mode) << " n_tok " << n_tok;
      }
    }
  }
}

struct Stack {
  std::vector<uint8_t> bytes;
  Weight w;
};

Stack random_stack(GgmlType t, int64_t ne0, int64_t ne1, int64_t ne2, std::mt19937& rng) {
  Stack s;
  s.bytes = random_matrix(t, ne1 * ne2, ne0, rng);
  s.w.type = t;
  s.w.data = s.bytes.data();
  s.w.ne[0] = ne0;
  s.w.ne[1] = ne1;
  s.w.ne[2] = ne2;
  return s;
}

// The plain computation: per expert (ascending), its tokens gathered in pair order, three matmul() calls.
std::vector<float> reference(const ExpertWeights& ew, const std::vector<float>& x, int64_t n,
                             const std::vector<int32_t>& ids, const std::vector<float>& w, int k, MatmulMode mode,
                             ThreadPool& pool) {
  const int64_t E = ew.gate.ne[0], F = ew.gate.ne[1];
  const int X = static_cast<int>(ew.gate.ne[2]);
  std::vector<std::vector<float>> d(static_cast<size_t>(n * k));  // per pair: [E]
  for (int e = 0; e < X; ++e) {
    std::vector<int64_t> pairs;
    for (int64_t i = 0; i < n * k; ++i)
      if (ids[i] == e) pairs.push_back(i);
    if (pairs.empty()) continue;
    const int64_t cnt = static_cast<int64_t>(pairs.size());
    std::vector<float> xs(cnt * E), g(cnt * F), u(cnt * F), dd(cnt * E);
    for (int64_t r = 0; r < cnt; ++r) std::memcpy(&xs[r * E], &x[(pairs[r] / k) * E], E * 4);
    matmul(ew.gate.type, ew.gate.matrix(e), F, E, xs.data(), cnt, g.data(), mode, pool);
    matmul(ew.up.type, ew.up.matrix(e), F, E, xs.data(), cnt, u.data(), mode, pool);
    cpu::swiglu(g.data(), u.data(), cnt * F, g.data());
    matmul(ew.down.type, ew.down.matrix(e), E, F, g.data(), cnt, dd.data(), mode, pool);
    for (int64_t r = 0; r < cnt; ++r) d[pairs[r]].assign(dd.begin() + r * E, dd.begin() + (r + 1) * E);
  }
  std::vector<float> out(n * E, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    bool first = true;
    for (int j = 0; j < k; ++j) {
      const auto& dr = d[t * k + j];
      if (dr.empty()) continue;
      const float wj = w[t * k + j];
      for (int64_t i = 0; i < E; ++i) out[t * E + i] = first ? wj * dr[i] : out[t * E + i] + wj * dr[i];
      first = false;
    }
  }
  return out;
}

TEST(MoeExpertsDecodePath, BitIdenticalToExpertByExpert) {
  const int64_t E = 512, F = 256;
  const int X = 16, k = 8;
  std::mt19937 rng(23);
  Stack gate = random_stack(GgmlType::Q4_K, E, F, X, rng), up = random_stack(GgmlType::Q4_K, E, F, X, rng),
        down = random_stack(GgmlType::Q4_K, F, E, X, rng);
  const ExpertWeights ew{gate.w, up.w, down.w};
  ThreadPool pool(2);
  for (MatmulMode mode : {MatmulMode::Fast, MatmulMode::FastPrecise, MatmulMode::Exact}) {
    for (int64_t n : {1, 2, 4, 7}) {
      for (int active : {8, 6}) {
        const auto x = test::random_acts(n * E, rng);
        std::vector<int32_t> ids(n * k);
        std::vector<float> w(n * k);
        std::uniform_real_distribution<float> uw(0.01f, 1.0f);
        for (int64_t t = 0; t < n; ++t) {
          std::vector<int32_t> perm(X);
          for (int e = 0; e < X; ++e) perm[e] = e;
          std::shuffle(perm.begin(), perm.end(), rng);  // distinct experts per token, shared across tokens
          for (int j = 0; j < k; ++j) {
            ids[t * k + j] = j < active ? perm[j] : -1;
            w[t * k + j] = uw(rng);
          }
        }
        MoeScratch s(n, k, X, E, F);
        cpu::MatmulBatch mb(2, n);
        std::vector<float> out(n * E, 99.0f);
        moe_experts(ew, x.data(), n, ids.data(), w.data(), k, out.data(), s, mb, pool, mode);
        const auto ref = reference(ew, x, n, ids, w, k, mode, pool);
        ASSERT_EQ(0, std::memcmp(out.data(), ref.data(), out.size() * 4))
            << "mode " << int(mode) << " n " << n << " active " << active;
      }
    }
  }
}

}  // namespace

namespace {

// The fused decode path (MoeOptions::fused) under every option the benchmark compares: the same bytes
// as the general path and as the expert-by-expert reference. Mixed formats (gate Q4_K with Q8_K
// activations, up Q8_0 with 32-value activations, down Q6_K) exercise separate quantized copies of x;
// tokens that all pick the same experts exercise the 4-token (and FastPrecise 2-token) kernels in down.
TEST(MoeExpertsFused, EveryVariantSameBytes) {
  const int64_t E = 512, F = 256;
  const int X = 16, k = 8;
  struct Types {
    GgmlType g, u, d;
  };
  for (const Types ty : {Types{GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K},
                         Types{GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q6_K}}) {
    std::mt19937 rng(29);
    Stack gate = random_stack(ty.g, E, F, X, rng), up = random_stack(ty.u, E, F, X, rng),
          down = random_stack(ty.d, F, E, X, rng);
    const ExpertWeights ew{gate.w, up.w, down.w};
    for (int threads : {1, 3}) {
      ThreadPool pool(threads);
      for (MatmulMode mode : {MatmulMode::Fast, MatmulMode::FastPrecise}) {
        for (int64_t n : {1, 2, 5, 8, 9}) {
          for (int active : {8, 6, 0}) {
            for (bool shared : {false, true}) {
              const auto x = test::random_acts(n * E, rng);
              std::vector<int32_t> ids(n * k);
              std::vector<float> w(n * k);
              std::uniform_real_distribution<float> uw(0.01f, 1.0f);
              std::vector<int32_t> perm(X);
              for (int e = 0; e < X; ++e) perm[e] = e;
              for (int64_t t = 0; t < n; ++t) {
                if (!shared || t == 0) std::shuffle(perm.begin(), perm.end(), rng);
                for (int j = 0; j < k; ++j) {
                  ids[t * k + j] = j < active ? perm[j] : -1;
                  w[t * k + j] = uw(rng);
                }
              }
              const auto ref = reference(ew, x, n, ids, w, k, mode, pool);
              cpu::MatmulBatch mb(threads, n);
              MoeOptions general;
              general.fused = false;
              MoeScratch s0(n, k, X, E, F);
              std::vector<float> out0(n * E, 99.0f);
              moe_experts(ew, x.data(), n, ids.data(), w.data(), k, out0.data(), s0, mb, pool, mode, general);
              ASSERT_EQ(0, std::memcmp(out0.data(), ref.data(), out0.size() * 4));
              EXPECT_TRUE(s0.hq.empty());  // the general path never touches the fused path's buffers
              for (int pf : {0, 256, 4096, -4096}) {  // negative: that distance into L1
                for (int item : {1, 4096, 32 << 10, 1 << 20})
                for (bool one_region : {true, false}) {
                  MoeOptions o;
                  o.fused = true;
                  o.one_region = one_region;
                  o.tail_item_bytes = item == 4096 ? 0 : (item == 1 ? 1 << 20 : 1);  // off, larger, smaller
                  o.prefetch_bytes = std::abs(pf);
                  o.prefetch_l2 = pf >= 0;
                  o.item_bytes = item;
                  o.pair_rows = pf != 256;  // the two-row gate+up kernel (where the level has one) or not
                  MoeScratch s(n, k, X, E, F);
                  std::vector<float> out(n * E, 99.0f);
                  for (int rep = 0; rep < 2; ++rep) {  // a reused scratch gives the same bytes
                    moe_experts(ew, x.data(), n, ids.data(), w.data(), k, out.data(), s, mb, pool, mode, o);
                    ASSERT_EQ(0, std::memcmp(out.data(), ref.data(), out.size() * 4))
                        << type_name(ty.g) << "/" << type_name(ty.u) << "/" << type_name(ty.d) << " threads "
                        << threads << " mode " << int(mode) << " n " << n << " active " << active << " shared "
                        << shared << " prefetch " << pf << " item " << item << " one region " << one_region << " pair " << o.pair_rows << " rep " << rep;
                  }
                  // The fused path ran (it quantizes the down inputs into s.hq) iff n is decode-sized
                  // and some pair runs here.
                  EXPECT_EQ(n <= kMoeFusedMaxTokens && active > 0, !s.hq.empty()) << "n " << n;
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
