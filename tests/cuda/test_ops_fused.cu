// The fused attention-input op (cuda/ops_fused.cuh) at the real sizes of Qwen3-30B-A3B (32 query / 4 KV
// heads of 128) and two odd geometries: bit for bit against the op sequence it replaces on the GPU
// (rmsnorm, rmsnorm, rope_neox, rope_neox, kv_store), within tolerance against its CPU reference, and the
// CPU reference bit for bit against the CPU ops it is made of. Skipped where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "cpu/half.h"
#include "cpu/ops.h"
#include "cuda/attn_tile.cuh"
#include "cuda/ops.cuh"
#include "cuda/ops_fused.cuh"
#include "cuda/ops_fused_ref.h"
#include "cuda/expert_predict.h"
#include "cuda/q8_kernels.cuh"
#include "cuda/quant_kernels.cuh"
#include "gpu_test_util.h"

namespace {

using namespace strata;
using namespace strata::cuda;
using strata::test::same_bits;

struct Case {
  int64_t n_tok;
  int n_head, n_head_kv, head_dim, head_dim_v, n_rot;
  float base;
  int64_t q_w() const { return int64_t(n_head) * head_dim; }
  int64_t k_w() const { return int64_t(n_head_kv) * head_dim; }
  int64_t v_w() const { return int64_t(n_head_kv) * head_dim_v; }
  int64_t qkv_w() const { return q_w() + k_w() + v_w(); }
  std::string name() const {
    return "n " + std::to_string(n_tok) + " heads " + std::to_string(n_head) + "/" + std::to_string(n_head_kv) +
           " dims " + std::to_string(head_dim) + "/" + std::to_string(head_dim_v) + " n_rot " + std::to_string(n_rot);
  }
};

std::vector<float> randn(size_t n, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

size_t count_bit_diffs(const std::vector<float>& a, const std::vector<float>& b, std::string* first) {
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i]) && bad++ == 0)
      *first = "[" + std::to_string(i) + "] " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
  return bad;
}
size_t count_diffs(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, std::string* first) {
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i] && bad++ == 0)
      *first = "[" + std::to_string(i) + "] " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
  return bad;
}

class GpuOpsFused : public strata::test::GpuKernelTest {
 protected:
  // One token's attention run of H query heads of D at position pos (prep_attention_q8, or attn_prep then
  // attention_q8): its own copies of the caches kc / vc ([L][n_ctx][KV heads][D] f16) and its outputs.
  struct AttnRun {
    Buf k, v, refs, scratch, out, xq, xds;
  };
  AttnRun attn_run(const std::vector<uint16_t>& kc, const std::vector<uint16_t>& vc, int n_ctx, int pos, int H,
                   int D) {
    const size_t n_out = size_t(H) * size_t(D);
    AttnRun r;
    r.k = upload_vec(kc);
    r.v = upload_vec(vc);
    r.refs = upload_vec(std::vector<ops::KvRef>{{r.k.ptr<uint16_t>(), r.v.ptr<uint16_t>(), n_ctx, pos}});
    r.scratch = output(ops::attention_scratch_floats(1, H, D, n_ctx) * 4);
    r.out = output(n_out * 4);
    r.xq = output(n_out);
    r.xds = output(n_out / 32 * 8);
    return r;
  }
  // got's out, xq, xds and both caches equal want's bit for bit (n_out values, caches of `cache` halves).
  // Returns got's K cache.
  std::vector<uint16_t> expect_same_run(const AttnRun& got, const AttnRun& want, size_t n_out, size_t cache) {
    const size_t n_blk = n_out / 32;
    std::string first;
    EXPECT_EQ(count_bit_diffs(download<float>(got.out, n_out), download<float>(want.out, n_out), &first), 0u)
        << "out: " << first;
    EXPECT_TRUE(download<int8_t>(got.xq, n_out) == download<int8_t>(want.xq, n_out)) << "xq codes differ";
    EXPECT_EQ(count_bit_diffs(download<float>(got.xds, 2 * n_blk), download<float>(want.xds, 2 * n_blk), &first), 0u)
        << "xds: " << first;
    std::vector<uint16_t> gk = download<uint16_t>(got.k, cache);
    EXPECT_EQ(count_diffs(gk, download<uint16_t>(want.k, cache), &first), 0u) << "K cache: " << first;
    EXPECT_EQ(count_diffs(download<uint16_t>(got.v, cache), download<uint16_t>(want.v, cache), &first), 0u)
        << "V cache: " << first;
    return gk;
  }
};

constexpr int kLayers = 2, kLayer = 1, kCtx = 600;
constexpr float kEps = 1e-6f;

// Both attn_prep kernels (loads issued at the start: the default; the first kernel).
TEST_F(GpuOpsFused, AttnPrepEqualsTheOpSequence) {
  const bool was_first = ops::attn_prep_first();
  for (const bool first_kernel : {false, true})
  for (const Case& c : {Case{1, 32, 4, 128, 128, 128, 1e6f}, Case{3, 32, 4, 128, 128, 128, 1e6f},
                        Case{8, 32, 4, 128, 128, 128, 1e6f}, Case{5, 16, 2, 256, 256, 64, 1e7f},
                        Case{4, 6, 3, 80, 64, 80, 1e4f}, Case{2, 4, 2, 64, 128, 32, 1e4f}}) {
    ops::set_attn_prep_first(first_kernel);
    SCOPED_TRACE(c.name() + (first_kernel ? " (first kernel)" : " (loads first)"));
    const int64_t n = c.n_tok;
    // q|k|v rows of one concatenated product; varied scales so the norms differ per head.
    std::vector<float> qkv = randn(size_t(n * c.qkv_w()), 100 + uint32_t(n) + uint32_t(c.head_dim), 1.0f);
    for (size_t i = 0; i < qkv.size(); i += 97) qkv[i] *= 40.0f;
    const std::vector<float> qn = randn(size_t(c.head_dim), 7, 1.0f), kn = randn(size_t(c.head_dim), 8, 1.0f);
    std::vector<float> q(size_t(n * c.q_w())), k(size_t(n * c.k_w())), v(size_t(n * c.v_w()));
    for (int64_t t = 0; t < n; ++t) {
      const float* row = qkv.data() + t * c.qkv_w();
      std::memcpy(q.data() + t * c.q_w(), row, size_t(c.q_w()) * 4);
      std::memcpy(k.data() + t * c.k_w(), row + c.q_w(), size_t(c.k_w()) * 4);
      std::memcpy(v.data() + t * c.v_w(), row + c.q_w() + c.k_w(), size_t(c.v_w()) * 4);
    }
    // Two sequences, tokens alternating, scattered positions (position 0 included).
    std::vector<int32_t> pos(static_cast<size_t>(n));
    std::mt19937 rng(9);
    for (auto& p : pos) p = int32_t(rng() % kCtx);
    pos[0] = 0;
    const size_t k_cache = size_t(kLayers) * kCtx * size_t(c.k_w()), v_cache = size_t(kLayers) * kCtx * size_t(c.v_w());

    // Three GPU runs into their own caches: the old op sequence, attn_prep on the concatenated rows, and
    // attn_prep on three separate buffers with q normed in place.
    struct Run {
      Buf k[2], v[2];
      std::vector<ops::KvRef> refs;
      Buf drefs;
    };
    auto make_run = [&](Run& r) {
      for (int s = 0; s < 2; ++s) {
        r.k[s] = output(k_cache * 2, 0xab);
        r.v[s] = output(v_cache * 2, 0xab);
      }
      r.refs.resize(size_t(n));
      for (int64_t t = 0; t < n; ++t)
        r.refs[size_t(t)] = {r.k[t % 2].ptr<uint16_t>(), r.v[t % 2].ptr<uint16_t>(), kCtx, pos[size_t(t)]};
      r.drefs = upload_vec(r.refs);
    };
    Run old_run, cat_run, sep_run;
    make_run(old_run);
    make_run(cat_run);
    make_run(sep_run);
    Buf dpos = upload_vec(pos);
    const ops::AttnPrepShape shape{c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.n_rot, kEps};
    Buf dqn = upload_vec(qn), dkn = upload_vec(kn);

    // The old sequence.
    Buf oq = upload_vec(q), ok = upload_vec(k), ov = upload_vec(v);
    ops::rmsnorm(oq.ptr<float>(), dqn.ptr<float>(), n * c.n_head, c.head_dim, kEps, oq.ptr<float>(), stream());
    ops::rmsnorm(ok.ptr<float>(), dkn.ptr<float>(), n * c.n_head_kv, c.head_dim, kEps, ok.ptr<float>(), stream());
    ops::rope_neox(oq.ptr<float>(), dpos.ptr<int32_t>(), n, c.n_head, c.head_dim, c.n_rot, c.base, stream());
    ops::rope_neox(ok.ptr<float>(), dpos.ptr<int32_t>(), n, c.n_head_kv, c.head_dim, c.n_rot, c.base, stream());
    ops::kv_store(ok.ptr<float>(), ov.ptr<float>(), old_run.drefs.ptr<ops::KvRef>(), n, kLayer, c.k_w(), c.v_w(),
                  stream());

    // attn_prep, concatenated rows.
    Buf dcs = output(size_t(n * c.n_rot) * 4);
    ops::rope_cos_sin(dpos.ptr<int32_t>(), n, c.n_rot, c.base, dcs.ptr<float>(), stream());
    Buf dqkv = upload_vec(qkv);
    Buf cq = output(size_t(n * c.q_w()) * 4);
    const float* dq = dqkv.ptr<float>();
    ops::attn_prep(dq, c.qkv_w(), dq + c.q_w(), c.qkv_w(), dq + c.q_w() + c.k_w(), c.qkv_w(), dqn.ptr<float>(),
                   dkn.ptr<float>(), dcs.ptr<float>(), cat_run.drefs.ptr<ops::KvRef>(), n, kLayer, shape,
                   cq.ptr<float>(), stream());
    // attn_prep, separate buffers, q in place.
    Buf sq = upload_vec(q), sk = upload_vec(k), sv = upload_vec(v);
    ops::attn_prep(sq.ptr<float>(), c.q_w(), sk.ptr<float>(), c.k_w(), sv.ptr<float>(), c.v_w(), dqn.ptr<float>(),
                   dkn.ptr<float>(), dcs.ptr<float>(), sep_run.drefs.ptr<ops::KvRef>(), n, kLayer, shape,
                   sq.ptr<float>(), stream());

    const auto old_q = download<float>(oq, q.size());
    std::string first;
    EXPECT_EQ(count_bit_diffs(download<float>(cq, q.size()), old_q, &first), 0u) << "q (concatenated) first " << first;
    EXPECT_EQ(count_bit_diffs(download<float>(sq, q.size()), old_q, &first), 0u) << "q (separate) first " << first;
    for (int s = 0; s < 2; ++s) {  // whole caches: the rows written and every other byte untouched
      const auto ek = download<uint16_t>(old_run.k[s], k_cache), evv = download<uint16_t>(old_run.v[s], v_cache);
      EXPECT_EQ(count_diffs(download<uint16_t>(cat_run.k[s], k_cache), ek, &first), 0u) << "K cache " << s << " " << first;
      EXPECT_EQ(count_diffs(download<uint16_t>(cat_run.v[s], v_cache), evv, &first), 0u) << "V cache " << s << " " << first;
      EXPECT_EQ(count_diffs(download<uint16_t>(sep_run.k[s], k_cache), ek, &first), 0u) << "K cache (sep) " << s << " " << first;
      EXPECT_EQ(count_diffs(download<uint16_t>(sep_run.v[s], v_cache), evv, &first), 0u) << "V cache (sep) " << s << " " << first;
    }

    // CPU: the reference against the CPU ops it is made of (bit for bit), then the GPU against it.
    std::vector<uint16_t> rk[2], rv[2], ck[2], cv[2];
    std::vector<ops::KvRef> rrefs(static_cast<size_t>(n));
    for (int s = 0; s < 2; ++s) {
      rk[s].assign(k_cache, 0xabab);
      rv[s].assign(v_cache, 0xabab);
      ck[s] = rk[s];
      cv[s] = rv[s];
    }
    for (int64_t t = 0; t < n; ++t) rrefs[size_t(t)] = {rk[t % 2].data(), rv[t % 2].data(), kCtx, pos[size_t(t)]};
    std::vector<float> rcs(size_t(n * c.n_rot)), rq(q.size());
    ops::ref::rope_cos_sin(pos.data(), n, c.n_rot, c.base, rcs.data());
    ops::ref::attn_prep(qkv.data(), c.qkv_w(), qkv.data() + c.q_w(), c.qkv_w(), qkv.data() + c.q_w() + c.k_w(),
                        c.qkv_w(), qn.data(), kn.data(), rcs.data(), rrefs.data(), n, kLayer, shape, rq.data());
    std::vector<float> cq_cpu = q, ck_cpu = k;
    cpu::rmsnorm(cq_cpu.data(), qn.data(), n * c.n_head, c.head_dim, kEps, cq_cpu.data());
    cpu::rmsnorm(ck_cpu.data(), kn.data(), n * c.n_head_kv, c.head_dim, kEps, ck_cpu.data());
    cpu::rope_neox(cq_cpu.data(), pos.data(), n, c.n_head, c.head_dim, c.n_rot, c.base);
    cpu::rope_neox(ck_cpu.data(), pos.data(), n, c.n_head_kv, c.head_dim, c.n_rot, c.base);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t row = int64_t(kLayer) * kCtx + pos[size_t(t)];
      cpu::kv_store(cpu::KvType::F16, ck_cpu.data() + t * c.k_w(), c.k_w(), ck[t % 2].data() + row * c.k_w());
      cpu::kv_store(cpu::KvType::F16, v.data() + t * c.v_w(), c.v_w(), cv[t % 2].data() + row * c.v_w());
    }
    EXPECT_EQ(count_bit_diffs(rq, cq_cpu, &first), 0u) << "CPU reference q vs cpu ops " << first;
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(count_diffs(rk[s], ck[s], &first), 0u) << "CPU reference K vs cpu ops " << first;
      EXPECT_EQ(count_diffs(rv[s], cv[s], &first), 0u) << "CPU reference V vs cpu ops " << first;
    }
    // GPU vs CPU: the angles (cos/sin correctly rounded vs glibc's), q to 1e-5, K within one f16 step.
    const auto gcs = download<float>(dcs, rcs.size());
    double cs_err = 0;
    for (size_t i = 0; i < rcs.size(); ++i) cs_err = std::max(cs_err, std::fabs(double(gcs[i]) - rcs[i]));
    EXPECT_LE(cs_err, 1.2e-7) << "rope_cos_sin vs CPU: max abs error " << cs_err;
    const auto gq = download<float>(cq, q.size());
    double q_err = 0;
    size_t q_bad = 0, q_exact = 0;
    for (size_t i = 0; i < rq.size(); ++i) {
      const double d = std::fabs(double(gq[i]) - rq[i]);
      q_err = std::max(q_err, d);
      q_bad += !(d <= 1e-5 + 1e-5 * std::fabs(rq[i]));
      q_exact += same_bits(gq[i], rq[i]);
    }
    EXPECT_EQ(q_bad, 0u) << "q vs CPU: max abs error " << q_err << ", " << q_exact << "/" << rq.size() << " exact";
    size_t k_bad = 0, k_exact = 0, k_n = 0;
    for (int s = 0; s < 2; ++s) {
      const auto gk = download<uint16_t>(cat_run.k[s], k_cache), gv = download<uint16_t>(cat_run.v[s], v_cache);
      for (size_t i = 0; i < k_cache; ++i, ++k_n) {
        k_exact += gk[i] == rk[s][i];
        k_bad += std::abs(int(gk[i]) - int(rk[s][i])) > 1;  // same sign here: adjacent bit patterns = one step
      }
      EXPECT_EQ(count_diffs(gv, rv[s], &first), 0u) << "V cache vs CPU " << first;
    }
    EXPECT_EQ(k_bad, 0u) << "K cache vs CPU: " << k_bad << " values more than one f16 step apart; " << k_exact << "/"
                         << k_n << " exact";
  }
  ops::set_attn_prep_first(was_first);
}

// The CPU reference alone (no GPU needed): bit for bit the CPU ops it stands for, with q_out aliasing q
// and with q, k, v in separate buffers, at the same sizes.
TEST(OpsFusedReference, EqualsTheCpuOpSequence) {
  for (const Case& c : {Case{1, 32, 4, 128, 128, 128, 1e6f}, Case{8, 32, 4, 128, 128, 128, 1e6f},
                        Case{5, 16, 2, 256, 256, 64, 1e7f}, Case{4, 6, 3, 80, 64, 80, 1e4f}}) {
    SCOPED_TRACE(c.name());
    const int64_t n = c.n_tok;
    std::vector<float> q = randn(size_t(n * c.q_w()), 200 + uint32_t(n), 2.0f), k = randn(size_t(n * c.k_w()), 201, 1.0f),
                       v = randn(size_t(n * c.v_w()), 202, 1.0f);
    const std::vector<float> qn = randn(size_t(c.head_dim), 203, 1.0f), kn = randn(size_t(c.head_dim), 204, 1.0f);
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) pos[size_t(t)] = int32_t((t * 131 + 17) % kCtx);
    const size_t k_cache = size_t(kLayers) * kCtx * size_t(c.k_w()), v_cache = size_t(kLayers) * kCtx * size_t(c.v_w());
    // The reference, q normed in place, one cache.
    std::vector<uint16_t> rk(k_cache, 0xabab), rv(v_cache, 0xabab), ek = rk, ev = rv;
    std::vector<ops::KvRef> refs(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) refs[size_t(t)] = {rk.data(), rv.data(), kCtx, pos[size_t(t)]};
    std::vector<float> cs(size_t(n * c.n_rot)), rq = q;
    ops::ref::rope_cos_sin(pos.data(), n, c.n_rot, c.base, cs.data());
    const ops::AttnPrepShape shape{c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.n_rot, kEps};
    ops::ref::attn_prep(rq.data(), c.q_w(), k.data(), c.k_w(), v.data(), c.v_w(), qn.data(), kn.data(), cs.data(),
                        refs.data(), n, kLayer, shape, rq.data());
    // The CPU ops.
    std::vector<float> eq = q, kk = k;
    cpu::rmsnorm(eq.data(), qn.data(), n * c.n_head, c.head_dim, kEps, eq.data());
    cpu::rmsnorm(kk.data(), kn.data(), n * c.n_head_kv, c.head_dim, kEps, kk.data());
    cpu::rope_neox(eq.data(), pos.data(), n, c.n_head, c.head_dim, c.n_rot, c.base);
    cpu::rope_neox(kk.data(), pos.data(), n, c.n_head_kv, c.head_dim, c.n_rot, c.base);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t row = int64_t(kLayer) * kCtx + pos[size_t(t)];
      cpu::kv_store(cpu::KvType::F16, kk.data() + t * c.k_w(), c.k_w(), ek.data() + row * c.k_w());
      cpu::kv_store(cpu::KvType::F16, v.data() + t * c.v_w(), c.v_w(), ev.data() + row * c.v_w());
    }
    std::string first;
    EXPECT_EQ(count_bit_diffs(rq, eq, &first), 0u) << "q " << first;
    EXPECT_EQ(count_diffs(rk, ek, &first), 0u) << "K cache " << first;
    EXPECT_EQ(count_diffs(rv, ev, &first), 0u) << "V cache " << first;
    EXPECT_NE(rq, q) << "q was not transformed";
    EXPECT_NE(rk, std::vector<uint16_t>(k_cache, 0xabab)) << "no K stored";
  }
}

// router_route against the two launches it replaces (quant::matmul F32 + moe_route): logits, ids and
// weights bit for bit, both kernels (block per row, warp per row) twice each (the counter must come back to
// zero), at Qwen3's router (128 experts of 2048, top 8, 1/3/8 tokens), a wider one, an odd width (vector
// loads off, the tail loop on), and rows longer than the block kernel's 2048-float pass (4608: 2 full
// passes + a part; 5003: odd, 3 passes and the tail).
// Then against the CPU reference on values whose dot products are exact in f32 (so the ids must agree).
TEST_F(GpuOpsFused, RouterRouteEqualsMatmulThenRoute) {
  struct RCase { int64_t n_tok; int n_expert; int64_t cols; int k; bool norm; };
  for (const RCase& c : {RCase{1, 128, 2048, 8, true}, RCase{3, 128, 2048, 8, true}, RCase{8, 128, 2048, 8, false},
                         RCase{5, 512, 1000, 10, true}, RCase{2, 60, 1003, 4, true}, RCase{7, 64, 4608, 6, true},
                         RCase{1, 32, 5003, 2, false}}) {
    SCOPED_TRACE("n " + std::to_string(c.n_tok) + " experts " + std::to_string(c.n_expert) + " cols " +
                 std::to_string(c.cols) + " top " + std::to_string(c.k));
    const size_t nl = size_t(c.n_tok * c.n_expert), ni = size_t(c.n_tok * c.k);
    for (int exact_values = 0; exact_values < 2; ++exact_values) {
      std::vector<float> w = randn(size_t(c.n_expert * c.cols), 300 + uint32_t(c.cols), 0.05f),
                         x = randn(size_t(c.n_tok * c.cols), 301, 1.0f);
      if (exact_values)  // multiples of 1/16 in [-1, 1]: every product and partial sum exact in f32
        for (auto* v : {&w, &x})
          for (auto& f : *v) f = std::round(std::clamp(f * (v == &w ? 20.0f : 1.0f), -1.0f, 1.0f) * 16.0f) / 16.0f;
      Buf dw = upload_vec(w), dx = upload_vec(x);
      Buf l0 = output(nl * 4), i0 = output(ni * 4), w0 = output(ni * 4);
      quant::matmul(GgmlType::F32, dw.ptr(), c.n_expert, c.cols, dx.ptr<float>(), c.n_tok, l0.ptr<float>(), stream());
      ops::moe_route(l0.ptr<float>(), c.n_tok, c.n_expert, c.k, c.norm, i0.ptr<int32_t>(), w0.ptr<float>(), stream());
      const auto el = download<float>(l0, nl);
      const auto ei = download<int32_t>(i0, ni);
      const auto ew = download<float>(w0, ni);
      Buf counter = output(4, 0);
      for (int rep = 0; rep < 4; ++rep) {  // each kernel twice, the calls interleaved on one counter
        const auto kern = rep % 2 ? ops::RouterRouteKernel::kWarpPerRow : ops::RouterRouteKernel::kBlockPerRow;
        SCOPED_TRACE(rep % 2 ? "warp-per-row kernel" : "block-per-row kernel");
        Buf l1 = output(nl * 4), i1 = output(ni * 4), w1 = output(ni * 4);
        ops::router_route(dw.ptr<float>(), c.n_expert, c.cols, dx.ptr<float>(), c.n_tok, c.k, c.norm, l1.ptr<float>(),
                          i1.ptr<int32_t>(), w1.ptr<float>(), counter.ptr<uint32_t>(), stream(), kern);
        std::string first;
        EXPECT_EQ(count_bit_diffs(download<float>(l1, nl), el, &first), 0u) << "logits, call " << rep << ": " << first;
        EXPECT_EQ(download<int32_t>(i1, ni), ei) << "ids, call " << rep;
        EXPECT_EQ(count_bit_diffs(download<float>(w1, ni), ew, &first), 0u) << "weights, call " << rep << ": " << first;
        EXPECT_EQ(download<uint32_t>(counter, 1)[0], 0u) << "the counter was not reset";
      }
      if (!exact_values) continue;
      std::vector<float> rl(nl), rw(ni);
      std::vector<int32_t> ri(ni);
      ops::ref::router_route(w.data(), c.n_expert, c.cols, x.data(), c.n_tok, c.k, c.norm, rl.data(), ri.data(),
                             rw.data());
      std::string first;
      EXPECT_EQ(count_bit_diffs(el, rl, &first), 0u) << "exact-valued logits vs the CPU reference: " << first;
      EXPECT_EQ(ei, ri) << "ids vs the CPU reference";
      double werr = 0;
      for (size_t i = 0; i < ni; ++i) werr = std::max(werr, std::fabs(double(ew[i]) - rw[i]));
      EXPECT_LE(werr, 1e-6) << "weights vs the CPU reference";
    }
  }
  EXPECT_THROW(ops::router_route(nullptr, 128, 2048, nullptr, 9, 8, true, nullptr, nullptr, nullptr, nullptr, stream()),
               strata::Error);
  EXPECT_THROW(ops::router_route(nullptr, 2000, 2048, nullptr, 1, 8, true, nullptr, nullptr, nullptr, nullptr, stream()),
               strata::Error);
}

// attention_q8 against ops::attention + q8::quantize: out, xq and xds bit for bit, fused (the combine kernel
// quantizes) and not, at Qwen3's decode shape (32 / 4 heads of 128): short and long contexts of a
// 4096-position cache (the combine path, mostly empty splits at ctx 9), 3 tokens of one batch, a 1000
// cache with 2 tokens, and max_kv 64 (one split, no combine: the tiled kernel quantizes, or with !fused the
// quantize launch), also at head sizes 64 and 256 and 5 tokens (the decode shape), and a span of 128 in a
// 4096 cache (2 splits).
TEST_F(GpuOpsFused, AttentionQ8EqualsAttentionThenQuantize) {
  constexpr int H = 32, Hkv = 4, L = 2, layer = 1;
  struct ACase { int n_ctx; int64_t max_kv; std::vector<int> pos; int D = 128; };
  for (const ACase& c : {ACase{4096, 4096, {8}}, ACase{4096, 4096, {3000}}, ACase{4096, 4096, {5, 700, 4095}},
                         ACase{1000, 1000, {999, 3}}, ACase{64, 64, {40}}, ACase{64, 64, {40, 63}, 64},
                         ACase{64, 64, {17}, 256}, ACase{4096, 64, {3, 11, 25, 40, 63}},
                         ACase{4096, 128, {100}}}) {
    const int D = c.D;
    const float scale = 1.0f / std::sqrt(float(D));
    const int64_t n = int64_t(c.pos.size());
    SCOPED_TRACE("cache " + std::to_string(c.n_ctx) + " max_kv " + std::to_string(c.max_kv) + " tokens " +
                 std::to_string(n) + " first pos " + std::to_string(c.pos[0]) + " head size " + std::to_string(D));
    std::vector<uint16_t> kc(size_t(L) * size_t(c.n_ctx) * Hkv * D), vc(kc.size());
    std::mt19937 rng(7 + uint32_t(c.n_ctx));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& x : kc) x = cpu::float_to_half(nd(rng));
    for (auto& x : vc) x = cpu::float_to_half(nd(rng));
    Buf dk = upload_vec(kc), dv = upload_vec(vc);
    std::vector<ops::KvRef> refs;
    for (int p : c.pos) refs.push_back({dk.ptr<uint16_t>(), dv.ptr<uint16_t>(), c.n_ctx, p});
    Buf drefs = upload_vec(refs);
    Buf dq = upload_vec(randn(size_t(n * H * D), 900 + uint32_t(n), 1.5f));
    const size_t n_out = size_t(n * H * D), n_blk = n_out / 32;
    Buf scratch = output(ops::attention_scratch_floats(n, H, D, c.max_kv) * 4);
    // Reference: the two launches.
    Buf o0 = output(n_out * 4), q0 = output(n_out), d0 = output(n_blk * 8);
    ops::attention(dq.ptr<float>(), drefs.ptr<ops::KvRef>(), n, layer, H, Hkv, D, D, scale, cpu::AttnMath::F32,
                   c.max_kv, scratch.ptr<float>(), o0.ptr<float>(), stream());
    q8::quantize(o0.ptr<float>(), n, H * D, q0.ptr<int8_t>(), d0.ptr<float2>(), stream());
    const auto eo = download<float>(o0, n_out);
    const auto eq = download<int8_t>(q0, n_out);
    const auto ed = download<float>(d0, 2 * n_blk);
    for (bool fused : {true, false}) {
      SCOPED_TRACE(fused ? "fused" : "not fused");
      Buf o1 = output(n_out * 4), q1 = output(n_out), d1 = output(n_blk * 8);
      ops::attention_q8(dq.ptr<float>(), drefs.ptr<ops::KvRef>(), n, layer, H, Hkv, D, D, scale, cpu::AttnMath::F32,
                        c.max_kv, scratch.ptr<float>(), o1.ptr<float>(), q1.ptr<int8_t>(), d1.ptr<float2>(), stream(),
                        fused);
      std::string first;
      EXPECT_EQ(count_bit_diffs(download<float>(o1, n_out), eo, &first), 0u) << "out: " << first;
      const auto gq = download<int8_t>(q1, n_out);
      size_t qbad = 0;
      for (size_t i = 0; i < n_out; ++i) qbad += gq[i] != eq[i];
      EXPECT_EQ(qbad, 0u) << "xq codes differ";
      EXPECT_EQ(count_bit_diffs(download<float>(d1, 2 * n_blk), ed, &first), 0u) << "xds: " << first;
    }
  }
  EXPECT_THROW(ops::attention_q8(nullptr, nullptr, 1, 0, 1, 1, 40, 40, 1.0f, cpu::AttnMath::F32, 64, nullptr, nullptr,
                                 nullptr, nullptr, stream()),
               strata::Error);  // 40 output columns: not whole Q8 blocks
}

// prep_attention_q8 (one token, the prep inside the attention kernel) against attn_prep then attention_q8:
// out, xq, xds and both whole caches bit for bit. Cases: Qwen3-30B-A3B's heads (32/4 of 128) at one split
// (max_kv 64: the quantize launch), two splits with the token alone in the second (65), 64 splits, and 66
// splits of 5 tiles each (the token's row in a later tile of its split, so in the second buffer); a group
// of 16 (two head chunks: both blocks need the row, one stores it), a group of 4 (two tokens' rows per
// decode tile, one used), head sizes 64 and 256 with a partial rope. Each at 8, 4 and 3 heads a block
// (attn_tile::set_decode_heads: a group in 1, 2 or 3 blocks, warps without a head), both paths against
// the two launches at 8; and both with the splits merged in clusters (ops::set_attn_cluster_merge: 2, 4, 5 and 8
// splits here; 16 and more fall back to the combine), which must give the combine's bits.
TEST_F(GpuOpsFused, PrepAttentionEqualsPrepThenAttention) {
  constexpr int L = 2, layer = 1;
  struct PCase {
    int n_head, n_head_kv, D, n_rot;
    int n_ctx;
    std::vector<int> pos;
  };
  for (const PCase& c : {PCase{32, 4, 128, 128, 64, {0, 40, 63}}, PCase{32, 4, 128, 128, 65, {63, 64}},
                         PCase{32, 4, 128, 128, 4096, {0, 8, 64, 3000, 4095}},
                         PCase{32, 4, 128, 128, 20000, {4800, 4864, 5100, 5119, 19999}},
                         PCase{32, 4, 128, 128, 256, {130, 255}}, PCase{32, 4, 128, 128, 512, {100, 511}},
                         PCase{32, 2, 128, 128, 1000, {500, 999}}, PCase{16, 4, 64, 32, 300, {0, 299}},
                         PCase{16, 2, 256, 64, 200, {130}}}) {
    const int H = c.n_head, Hkv = c.n_head_kv, D = c.D;
    const float scale = 1.0f / std::sqrt(float(D));
    const int64_t qw = int64_t(H) * D, kw = int64_t(Hkv) * D, width = qw + 2 * kw;  // q|k|v row
    const ops::AttnPrepShape shape{H, Hkv, D, D, c.n_rot, kEps};
    ASSERT_TRUE(ops::prep_attention_supported(1, shape));
    const size_t cache = size_t(L) * size_t(c.n_ctx) * size_t(kw);
    std::vector<uint16_t> kc(cache), vc(cache);
    std::mt19937 rng(31 + uint32_t(c.n_ctx) + uint32_t(D));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& x : kc) x = cpu::float_to_half(nd(rng));
    for (auto& x : vc) x = cpu::float_to_half(nd(rng));
    const std::vector<float> qn = randn(size_t(D), 17, 1.0f), kn = randn(size_t(D), 18, 1.0f);
    Buf dqn = upload_vec(qn), dkn = upload_vec(kn);
    for (const int pos : c.pos) {
      SCOPED_TRACE("heads " + std::to_string(H) + "/" + std::to_string(Hkv) + " of " + std::to_string(D) + " n_rot " +
                   std::to_string(c.n_rot) + " max_kv " + std::to_string(c.n_ctx) + " pos " + std::to_string(pos));
      std::vector<float> qkv = randn(size_t(width), 700 + uint32_t(pos), 1.0f);
      for (size_t i = 0; i < qkv.size(); i += 53) qkv[i] *= 30.0f;
      Buf dqkv = upload_vec(qkv);
      const float* dq = dqkv.ptr<float>();
      Buf dpos = upload_vec(std::vector<int32_t>{pos});
      Buf dcs = output(size_t(c.n_rot) * 4);
      ops::rope_cos_sin(dpos.ptr<int32_t>(), 1, c.n_rot, 1e6f, dcs.ptr<float>(), stream());
      const ops::AttnPrepIn in{dq, width, dq + qw, width, dq + qw + kw, width, dqn.ptr<float>(), dkn.ptr<float>(),
                               dcs.ptr<float>()};
      const size_t n_out = size_t(qw);
      // The two launches at 8 heads a block (the reference), then both ways at 8, 4 and 3.
      auto run_seq = [&] {
        AttnRun seq = attn_run(kc, vc, c.n_ctx, pos, H, D);
        Buf dqo = output(n_out * 4);
        ops::attn_prep(in.q, in.q_ld, in.k, in.k_ld, in.v, in.v_ld, in.q_norm, in.k_norm, in.cs,
                       seq.refs.ptr<ops::KvRef>(), 1, layer, shape, dqo.ptr<float>(), stream());
        ops::attention_q8(dqo.ptr<float>(), seq.refs.ptr<ops::KvRef>(), 1, layer, H, Hkv, D, D, scale,
                          cpu::AttnMath::F32, c.n_ctx, seq.scratch.ptr<float>(), seq.out.ptr<float>(),
                          seq.xq.ptr<int8_t>(), seq.xds.ptr<float2>(), stream(), /*fused=*/true);
        return seq;
      };
      const int was_heads = attn_tile::decode_heads();
      const bool was_merge = ops::attn_cluster_merge();
      ops::set_attn_cluster_merge(false);
      attn_tile::set_decode_heads(attn_tile::kDecodeRows);
      const AttnRun seq = run_seq();
      const bool was_early = ops::prep_early_weights();
      for (const int heads : {attn_tile::kDecodeRows, 4, 3}) {  // one-token heads a block
        SCOPED_TRACE("heads a block " + std::to_string(heads));
        attn_tile::set_decode_heads(heads);
        if (heads != attn_tile::kDecodeRows) expect_same_run(run_seq(), seq, n_out, cache);
        for (const bool early : {true, false}) {  // the norm weights loaded before the PDL wait, or after it
          SCOPED_TRACE(early ? "norm weights before the wait" : "norm weights after the wait");
          ops::set_prep_early_weights(early);
          AttnRun fused = attn_run(kc, vc, c.n_ctx, pos, H, D);
          ops::prep_attention_q8(in, shape, fused.refs.ptr<ops::KvRef>(), layer, scale, c.n_ctx,
                                 fused.scratch.ptr<float>(), fused.out.ptr<float>(), fused.xq.ptr<int8_t>(),
                                 fused.xds.ptr<float2>(), stream());
          const std::vector<uint16_t> gk = expect_same_run(fused, seq, n_out, cache);
          // The token's row was written (it differs from the random row before).
          const size_t at = (size_t(layer) * size_t(c.n_ctx) + size_t(pos)) * size_t(kw);
          EXPECT_FALSE(std::equal(gk.begin() + long(at), gk.begin() + long(at + size_t(kw)), kc.begin() + long(at)));
        }
        {  // the splits merged by their blocks in clusters (2-8 splits; else the combine as before): its bits
          SCOPED_TRACE("cluster merge");
          ops::set_attn_cluster_merge(true);
          ops::set_prep_early_weights(true);
          expect_same_run(run_seq(), seq, n_out, cache);
          AttnRun fused = attn_run(kc, vc, c.n_ctx, pos, H, D);
          ops::prep_attention_q8(in, shape, fused.refs.ptr<ops::KvRef>(), layer, scale, c.n_ctx,
                                 fused.scratch.ptr<float>(), fused.out.ptr<float>(), fused.xq.ptr<int8_t>(),
                                 fused.xds.ptr<float2>(), stream());
          expect_same_run(fused, seq, n_out, cache);
          ops::set_attn_cluster_merge(false);
        }
      }
      ops::set_attn_cluster_merge(was_merge);
      attn_tile::set_decode_heads(was_heads);
      ops::set_prep_early_weights(was_early);
    }
  }
  EXPECT_THROW(attn_tile::set_decode_heads(0), strata::Error);
  EXPECT_THROW(attn_tile::set_decode_heads(attn_tile::kDecodeRows + 1), strata::Error);
  // What it does not take: several tokens, head sizes without a tiled kernel, an odd rope.
  EXPECT_FALSE(ops::prep_attention_supported(2, ops::AttnPrepShape{32, 4, 128, 128, 128, kEps}));
  EXPECT_FALSE(ops::prep_attention_supported(1, ops::AttnPrepShape{32, 4, 80, 80, 80, kEps}));
  EXPECT_FALSE(ops::prep_attention_supported(1, ops::AttnPrepShape{32, 4, 128, 64, 128, kEps}));
  EXPECT_FALSE(ops::prep_attention_supported(1, ops::AttnPrepShape{32, 4, 128, 128, 127, kEps}));
  EXPECT_FALSE(ops::prep_attention_supported(1, ops::AttnPrepShape{30, 4, 128, 128, 128, kEps}));
  const ops::AttnPrepIn none{};
  EXPECT_THROW(ops::prep_attention_q8(none, ops::AttnPrepShape{32, 4, 80, 80, 80, kEps}, nullptr, 0, 1.0f, 64, nullptr,
                                      nullptr, nullptr, nullptr, stream()),
               strata::Error);
  EXPECT_THROW(ops::prep_attention_q8(none, ops::AttnPrepShape{32, 4, 128, 128, 128, kEps}, nullptr, 0, 1.0f, 64,
                                      nullptr, nullptr, nullptr, nullptr, stream()),
               strata::Error);  // row strides 0
}

// The expert predictor (cuda/expert_predict.h) inside the one-token attention launch: the attention's
// outputs and caches are the same bits with and without it; the predicted experts are the k best of
// w . x (CPU reference; where the k-th and the next logit are closer than the f32 sums' rounding could
// move them, only the first k-1 are compared); the counter grows by the block count per launch (32 and 128). Layers in a row
// share the counter (one launch after the other), at one split (max_kv 64) and at 64 splits (4096:
// the other rows of the grid hold predictor copies with nothing to do). A prefetch of every range (gate,
// up, down; the last chunk partial) of slots with non-resident experts (-1) among the winners; at 4096 no
// ranges (mode 4). The slots written beside the ids are the table's for those ids.
TEST_F(GpuOpsFused, PrepAttentionWithExpertPrefetch) {
  constexpr int L = 2, H = 32, Hkv = 4, D = 128, E = 128, X = 2048, K = 8, kSlots = 12;
  constexpr int64_t kSlotBytes = 3 * 40016;
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t qw = int64_t(H) * D, kw = int64_t(Hkv) * D, width = qw + 2 * kw;
  const ops::AttnPrepShape shape{H, Hkv, D, D, D, kEps};
  // The predictor's weight: build_weight against its reference.
  const std::vector<float> router = randn(size_t(E) * X, 91, 0.05f), nw = randn(size_t(X), 92, 1.0f);
  std::vector<uint16_t> wref(size_t(E) * X);
  predict::build_weight_ref(router.data(), nw.data(), E, X, wref.data());
  Buf drouter = upload_vec(router), dnw = upload_vec(nw);
  Buf dw = output(wref.size() * 2);
  predict::build_weight(drouter.ptr<float>(), dnw.ptr<float>(), E, X, dw.ptr<uint16_t>(), stream());
  EXPECT_TRUE(download<uint16_t>(dw, wref.size()) == wref) << "build_weight differs from its reference";
  // Slots: experts e % 3 == 0 not resident.
  std::vector<int32_t> table(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) table[size_t(e)] = e % 3 == 0 ? -1 : e % kSlots;
  Buf dtable = upload_vec(table), dslots = output(size_t(kSlots) * kSlotBytes, 0);
  Buf dcounter = upload_vec(std::vector<uint32_t>{0}), dlogits = output(size_t(E) * 4);
  Buf dids = output(size_t(L) * K * 4), dslots_out = output(size_t(L) * K * 4);
  const std::vector<float> qn = randn(size_t(D), 17, 1.0f), kn = randn(size_t(D), 18, 1.0f);
  Buf dqn = upload_vec(qn), dkn = upload_vec(kn);
  uint32_t arrivals = 0;
  for (const int n_ctx : {64, 4096}) {
    const size_t cache = size_t(L) * size_t(n_ctx) * size_t(kw);
    std::mt19937 rng(5 + uint32_t(n_ctx));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> kc(cache), vc(cache);
    for (auto& x : kc) x = cpu::float_to_half(nd(rng));
    for (auto& x : vc) x = cpu::float_to_half(nd(rng));
    for (int layer = 0; layer < L; ++layer) {
      const int pos = n_ctx == 64 ? 40 : 3000;
      SCOPED_TRACE("max_kv " + std::to_string(n_ctx) + " layer " + std::to_string(layer));
      const std::vector<float> qkv = randn(size_t(width), 300 + uint32_t(layer + n_ctx), 1.0f);
      const std::vector<float> x = randn(size_t(X), 400 + uint32_t(layer + n_ctx), 3.0f);
      Buf dqkv = upload_vec(qkv), dx = upload_vec(x);
      const float* dq = dqkv.ptr<float>();
      Buf dpos = upload_vec(std::vector<int32_t>{pos});
      Buf dcs = output(size_t(D) * 4);
      ops::rope_cos_sin(dpos.ptr<int32_t>(), 1, D, 1e6f, dcs.ptr<float>(), stream());
      const ops::AttnPrepIn in{dq, width, dq + qw, width, dq + qw + kw, width, dqn.ptr<float>(), dkn.ptr<float>(),
                               dcs.ptr<float>()};
      AttnRun plain = attn_run(kc, vc, n_ctx, pos, H, D), with = attn_run(kc, vc, n_ctx, pos, H, D);
      predict::ExpertPrefetch pf;
      pf.w = dw.ptr<uint16_t>();
      pf.x = dx.ptr<float>();
      pf.n_embd = X, pf.n_expert = E, pf.k = K;
      pf.logits = dlogits.ptr<float>();
      pf.counter = dcounter.ptr<uint32_t>();
      pf.blocks = n_ctx == 64 ? predict::kMaxBlocks : 32;  // (the counter stays a multiple of the count)
      pf.table = dtable.ptr<int32_t>();
      pf.slots = dslots.ptr<uint8_t>();
      pf.slot_bytes = kSlotBytes;
      for (int r = 0; r < 3; ++r) pf.off[r] = r * 40016, pf.bytes[r] = 40016;
      pf.n_ranges = n_ctx == 64 ? 3 : 0;  // (0: mode 4's predictor, which only writes ids and slots)
      pf.ids = dids.ptr<int32_t>() + layer * K;
      pf.slots_out = dslots_out.ptr<int32_t>() + layer * K;
      pf.lines = layer == 1;
      auto run = [&](AttnRun& r, const predict::ExpertPrefetch* p) {
        ops::prep_attention_q8(in, shape, r.refs.ptr<ops::KvRef>(), layer, scale, n_ctx, r.scratch.ptr<float>(),
                               r.out.ptr<float>(), r.xq.ptr<int8_t>(), r.xds.ptr<float2>(), stream(), p);
      };
      run(plain, nullptr);
      run(with, &pf);
      arrivals += uint32_t(pf.blocks);
      expect_same_run(with, plain, size_t(qw), cache);
      std::vector<int32_t> want(K);
      std::vector<double> logits(E);
      predict::predict_ref(wref.data(), x.data(), E, X, K, want.data(), logits.data());
      const std::vector<int32_t> got = download<int32_t>(dids, size_t(L) * K);
      std::vector<double> sorted(logits);
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      const int check = std::abs(sorted[K - 1] - sorted[K]) > 1e-3 ? K : K - 1;
      for (int j = 0; j < check; ++j) EXPECT_EQ(got[size_t(layer * K + j)], want[size_t(j)]) << "rank " << j;
      const std::vector<int32_t> got_slots = download<int32_t>(dslots_out, size_t(L) * K);
      for (int j = 0; j < K; ++j) {
        const int32_t e = got[size_t(layer * K + j)];
        ASSERT_TRUE(e >= 0 && e < E) << "rank " << j;
        EXPECT_EQ(got_slots[size_t(layer * K + j)], table[size_t(e)]) << "the slot of rank " << j;
      }
      EXPECT_EQ(download<uint32_t>(dcounter, 1)[0], arrivals);
    }
  }
  // What it refuses: an unsupported width, a range outside the slot.
  predict::ExpertPrefetch bad;
  bad.w = dw.ptr<uint16_t>();
  bad.n_embd = 2000, bad.n_expert = E, bad.k = K;
  EXPECT_THROW(predict::check(bad), strata::Error);
  EXPECT_FALSE(predict::supported(E, 8192, K));
  EXPECT_FALSE(predict::supported(300, X, K));
  EXPECT_FALSE(predict::supported(E, X, 65));
}

// norm_router_route against the launches it replaces (q8::rmsnorm_quantize, or ops::rmsnorm without Q8
// output, then router_route): xn, xq, xds, logits, ids and weights bit for bit, three times in a row (the
// counter comes back to zero), at Qwen3's shapes (2048 columns, 128 experts, top 8, 1/3/8 tokens), a narrower and an
// odd expert count, and misaligned router rows (scalar loads). Then against the CPU reference within
// tolerance (its sums run in another order).
TEST_F(GpuOpsFused, NormRouterRouteEqualsNormThenRouter) {
  struct NCase { int64_t n_tok; int n_expert; int64_t cols; int k; bool norm; size_t w_offset; };
  constexpr float eps = 1e-6f;
  for (const NCase& c : {NCase{1, 128, 2048, 8, true, 0}, NCase{3, 128, 2048, 8, true, 0},
                         NCase{8, 128, 2048, 8, false, 0}, NCase{2, 60, 1024, 4, true, 0},
                         NCase{5, 512, 992, 10, true, 4}, NCase{1, 128, 2048, 8, true, 4}}) {
    SCOPED_TRACE("n " + std::to_string(c.n_tok) + " experts " + std::to_string(c.n_expert) + " cols " +
                 std::to_string(c.cols) + " top " + std::to_string(c.k) + " w offset " + std::to_string(c.w_offset));
    const int64_t n = c.n_tok, E = c.cols;
    const size_t nx = size_t(n * E), nl = size_t(n * c.n_expert), ni = size_t(n * c.k), ng = nx / 32;
    std::vector<float> x = randn(nx, 400 + uint32_t(E), 1.0f), nw = randn(size_t(E), 401, 0.2f),
                       w = randn(size_t(c.n_expert * E), 402, 0.05f);
    for (size_t i = 0; i < x.size(); i += 61) x[i] *= 30.0f;
    for (auto& v : nw) v += 1.0f;
    Buf dx = upload_vec(x), dnw = upload_vec(nw), dw = upload_vec(w, c.w_offset);
    // Reference launches.
    Buf y0 = output(nx * 4), q0 = output(nx), d0 = output(ng * 8), l0 = output(nl * 4), i0 = output(ni * 4),
        w0 = output(ni * 4), c0 = output(16, 0);
    q8::rmsnorm_quantize(dx.ptr<float>(), dnw.ptr<float>(), n, E, eps, y0.ptr<float>(), q0.ptr<int8_t>(),
                         d0.ptr<float2>(), stream());
    ops::router_route(dw.ptr<float>(), c.n_expert, E, y0.ptr<float>(), n, c.k, c.norm, l0.ptr<float>(),
                      i0.ptr<int32_t>(), w0.ptr<float>(), c0.ptr<uint32_t>(), stream());
    const auto ey = download<float>(y0, nx);
    const auto eq = download<int8_t>(q0, nx);
    const auto ed = download<float>(d0, 2 * ng);
    const auto el = download<float>(l0, nl);
    const auto ei = download<int32_t>(i0, ni);
    const auto ew = download<float>(w0, ni);
    Buf counter = output(16, 0);
    for (int rep = 0; rep < 3; ++rep) {  // rep 2: without the Q8 output
      const bool with_q8 = rep != 2;
      SCOPED_TRACE("call " + std::to_string(rep) + (with_q8 ? " with Q8 output" : " without Q8 output"));
      Buf y1 = output(nx * 4), q1 = output(nx), d1 = output(ng * 8), l1 = output(nl * 4), i1 = output(ni * 4),
          w1 = output(ni * 4);
      ops::norm_router_route(dx.ptr<float>(), dnw.ptr<float>(), eps, dw.ptr<float>(), c.n_expert, E, n, c.k, c.norm,
                             y1.ptr<float>(), with_q8 ? q1.ptr<int8_t>() : nullptr,
                             with_q8 ? d1.ptr<float2>() : nullptr, l1.ptr<float>(), i1.ptr<int32_t>(),
                             w1.ptr<float>(), counter.ptr<uint32_t>(), stream());
      std::string first;
      EXPECT_EQ(count_bit_diffs(download<float>(y1, nx), ey, &first), 0u) << "xn: " << first;
      if (with_q8) {
        const auto gq = download<int8_t>(q1, nx);
        size_t qbad = 0;
        for (size_t i = 0; i < nx; ++i) qbad += gq[i] != eq[i];
        EXPECT_EQ(qbad, 0u) << "xq codes differ";
        EXPECT_EQ(count_bit_diffs(download<float>(d1, 2 * ng), ed, &first), 0u) << "xds: " << first;
      } else {
        const auto gq = download<uint8_t>(q1, nx);
        size_t touched = 0;
        for (uint8_t b : gq) touched += b != 0xFF;
        EXPECT_EQ(touched, 0u) << "xq written although null was passed";  // (q1 was not passed: stays 0xFF)
      }
      EXPECT_EQ(count_bit_diffs(download<float>(l1, nl), el, &first), 0u) << "logits: " << first;
      EXPECT_EQ(download<int32_t>(i1, ni), ei) << "ids";
      EXPECT_EQ(count_bit_diffs(download<float>(w1, ni), ew, &first), 0u) << "weights: " << first;
      EXPECT_EQ(download<uint32_t>(counter, 1)[0], 0u) << "the counter was not reset";
    }
    // The CPU reference (cpu::rmsnorm, q8ref::quantize, serial dot products): within tolerance.
    std::vector<float> ry(nx), rl(nl), rw(ni);
    std::vector<int8_t> rq(nx);
    std::vector<float2> rd(ng);
    std::vector<int32_t> ri(ni);
    ops::ref::norm_router_route(x.data(), nw.data(), eps, w.data(), c.n_expert, E, n, c.k, c.norm, ry.data(),
                                rq.data(), rd.data(), rl.data(), ri.data(), rw.data());
    double yerr = 0, ymax = 0, lerr = 0, lmax = 0;
    for (size_t i = 0; i < nx; ++i) yerr = std::max(yerr, std::fabs(double(ey[i]) - ry[i])), ymax = std::max(ymax, std::fabs(double(ry[i])));
    for (size_t i = 0; i < nl; ++i) lerr = std::max(lerr, std::fabs(double(el[i]) - rl[i])), lmax = std::max(lmax, std::fabs(double(rl[i])));
    size_t qbig = 0;
    for (size_t i = 0; i < nx; ++i) qbig += std::abs(int(eq[i]) - int(rq[i])) > 1;
    EXPECT_LE(yerr, 1e-6 * ymax) << "xn vs the CPU reference";
    EXPECT_LE(lerr, 1e-5 * lmax) << "logits vs the CPU reference";
    EXPECT_EQ(qbig, 0u) << "xq codes more than 1 from the CPU reference's";
    std::printf("[norm_router_route n %lld cols %lld] vs CPU: xn max err %.3g (max |xn| %.3g), logits max err %.3g "
                "(max |logit| %.3g)\n", (long long)n, (long long)E, yerr, ymax, lerr, lmax);
  }
  EXPECT_THROW(ops::norm_router_route(nullptr, nullptr, eps, nullptr, 128, 2050, 1, 8, true, nullptr, nullptr, nullptr,
                                      nullptr, nullptr, nullptr, nullptr, stream()),
               strata::Error);  // columns not a multiple of 32
  EXPECT_THROW(ops::norm_router_route(nullptr, nullptr, eps, nullptr, 128, 2048, 9, 8, true, nullptr, nullptr, nullptr,
                                      nullptr, nullptr, nullptr, nullptr, stream()),
               strata::Error);  // too many tokens
  EXPECT_THROW(ops::norm_router_route(nullptr, nullptr, eps, nullptr, 128, 4096, 1, 8, true, nullptr, nullptr, nullptr,
                                      nullptr, nullptr, nullptr, nullptr, stream()),
               strata::Error);  // wider than one staged row
}

TEST_F(GpuOpsFused, AttnPrepRejectsBadShapes) {
  const ops::AttnPrepShape odd_rot{32, 4, 128, 128, 127, kEps}, big_rot{32, 4, 64, 64, 128, kEps},
      huge{1, 1, 2048, 128, 128, kEps}, ok{32, 4, 128, 128, 128, kEps};
  for (const auto& s : {odd_rot, big_rot, huge})
    EXPECT_THROW(ops::attn_prep(nullptr, 8192, nullptr, 8192, nullptr, 8192, nullptr, nullptr, nullptr, nullptr, 1, 0, s,
                                nullptr, stream()),
                 strata::Error);
  // Strides shorter than the rows; q_out aliasing q with a stride.
  EXPECT_THROW(ops::attn_prep(nullptr, 100, nullptr, 512, nullptr, 512, nullptr, nullptr, nullptr, nullptr, 1, 0, ok,
                              nullptr, stream()),
               strata::Error);
  float* fake = reinterpret_cast<float*>(uintptr_t(256));
  EXPECT_THROW(ops::attn_prep(fake, 5120, fake, 5120, fake, 5120, nullptr, nullptr, nullptr, nullptr, 1, 0, ok, fake,
                              stream()),
               strata::Error);
  EXPECT_THROW(ops::rope_cos_sin(nullptr, 1, 3, 1e4f, nullptr, stream()), strata::Error);
}

}  // namespace
