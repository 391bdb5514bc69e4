// GPU ops (src/cuda/ops.cu, ops_route.cu, ops_sample.cu) against their CPU references (cpu/ops.h,
// engine/sampling.h) on random data at the real sizes of Qwen3-30B-A3B (n_embd 2048, 32 query / 4 KV heads
// of 128, 128 experts top-8, vocab 151936) and a few odd ones. Every failure prints the numbers (max error,
// where, how many). Skipped where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "cpu/half.h"
#include "cpu/ops.h"
#include "cpu/thread_pool.h"
#include "cuda/attn_tile.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/device.h"
#include "cuda/ops.cuh"
#include "cuda/transfer.h"
#include "engine/sampling.h"

namespace {

using namespace strata;
using namespace strata::cuda;
namespace sc = strata::stream_check;

class GpuOps : public ::testing::Test {
 public:  // the helpers are used by free functions below too
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device";
    sc::global().take_reports();
    dev = std::make_unique<Device>(0);
    xfer = std::make_unique<Transfer>(*dev);
  }
  void TearDown() override {
    if (dev) dev->synchronize();
    if (sc::enabled())
      for (const auto& r : sc::global().take_reports()) ADD_FAILURE() << "stream-order checker: " << r.message;
    xfer.reset();
    dev.reset();
  }
  cudaStream_t stream() { return dev->compute().handle(); }

  template <typename T>
  DeviceBuffer upload(const std::vector<T>& h, const char* name) {
    const size_t bytes = std::max<size_t>(h.size() * sizeof(T), 16);
    DeviceBuffer b = dev->alloc(bytes, name);
    if (!h.empty()) xfer->upload(b.span(), h.data(), h.size() * sizeof(T), dev->compute(), {&dev->compute()});
    return b;
  }
  template <typename T>
  DeviceBuffer alloc(size_t n, const char* name) {
    return dev->alloc(std::max<size_t>(n * sizeof(T), 16), name);
  }
  template <typename T>
  std::vector<T> download(const DeviceBuffer& b, size_t n) {
    std::vector<T> h(n);
    if (n) xfer->download_sync(h.data(), b.span(), n * sizeof(T), dev->compute());
    return h;
  }

  std::unique_ptr<Device> dev;
  std::unique_ptr<Transfer> xfer;
};

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Max |a-b| / (atol + rtol*|b|) over the arrays, with where it happened; <= 1 means within tolerance.
struct Cmp {
  double worst = 0, max_abs = 0;
  size_t at = 0, bad = 0;
  float a_at = 0, b_at = 0;
};
Cmp compare(const std::vector<float>& a, const std::vector<float>& b, double atol, double rtol) {
  Cmp c;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    const double r = d / (atol + rtol * std::fabs(double(b[i])));
    if (!(r <= 1.0)) ++c.bad;
    c.max_abs = std::max(c.max_abs, d);
    if (!(r <= c.worst)) {
      c.worst = r;
      c.at = i;
      c.a_at = a[i];
      c.b_at = b[i];
    }
  }
  return c;
}
std::string describe(const Cmp& c, const char* what) {
  return std::string(what) + ": " + std::to_string(c.bad) + " values out of tolerance; max abs err " +
         std::to_string(c.max_abs) + "; worst at [" + std::to_string(c.at) + "] gpu " + std::to_string(c.a_at) +
         " cpu " + std::to_string(c.b_at) + " (err/tol " + std::to_string(c.worst) + ")";
}

// ------------------------------------------------------------------ elementwise

TEST_F(GpuOps, RmsnormMatchesCpu) {
  for (auto [rows, n] : std::vector<std::pair<int64_t, int64_t>>{{1, 2048}, {3, 2048}, {64, 2048}, {64 * 32, 128},
                                                                 {5, 1000}}) {
    auto x = randn(size_t(rows * n), 11 + uint32_t(rows), 3.0f), w = randn(size_t(n), 12);
    std::vector<float> ref(x.size());
    cpu::rmsnorm(x.data(), w.data(), rows, n, 1e-6f, ref.data());
    auto dx = upload(x, "x"), dw = upload(w, "w");
    auto dy = alloc<float>(x.size(), "y");
    ops::rmsnorm(dx.as<float>(), dw.as<float>(), rows, n, 1e-6f, dy.as<float>(), stream());
    ops::rmsnorm(dx.as<float>(), dw.as<float>(), rows, n, 1e-6f, dx.as<float>(), stream());  // in place
    auto c = compare(download<float>(dy, x.size()), ref, 1e-6, 1e-6);
    EXPECT_EQ(c.bad, 0u) << describe(c, "rmsnorm") << " rows " << rows << " n " << n;
    auto ci = compare(download<float>(dx, x.size()), ref, 1e-6, 1e-6);
    EXPECT_EQ(ci.bad, 0u) << describe(ci, "rmsnorm in place") << " rows " << rows << " n " << n;
  }
}

TEST_F(GpuOps, RopeNeoxMatchesCpu) {
  struct Case { int64_t n_tok; int n_head, head_dim, n_rot; float base; int max_pos; };
  for (const Case& k : {Case{1, 32, 128, 128, 1e6f, 1000}, Case{3, 4, 128, 128, 1e6f, 1000},
                        Case{64, 32, 128, 128, 1e6f, 40000}, Case{7, 16, 256, 64, 1e7f, 5000},
                        Case{5, 2, 80, 80, 10000.0f, 1000}}) {
    auto x = randn(size_t(k.n_tok * k.n_head * k.head_dim), 21 + uint32_t(k.n_tok));
    std::vector<int32_t> pos(static_cast<size_t>(k.n_tok));
    std::mt19937 rng(22);
    for (auto& p : pos) p = int32_t(rng() % uint32_t(k.max_pos));
    pos[0] = 0;
    auto dx = upload(x, "x");
    auto dpos = upload(pos, "pos");
    cpu::rope_neox(x.data(), pos.data(), k.n_tok, k.n_head, k.head_dim, k.n_rot, k.base);
    ops::rope_neox(dx.as<float>(), dpos.as<int32_t>(), k.n_tok, k.n_head, k.head_dim, k.n_rot, k.base, stream());
    auto c = compare(download<float>(dx, x.size()), x, 1e-5, 1e-5);
    EXPECT_EQ(c.bad, 0u) << describe(c, "rope_neox") << " n_tok " << k.n_tok << " heads " << k.n_head << " dim "
                         << k.head_dim << " n_rot " << k.n_rot;
  }
  EXPECT_THROW(ops::rope_neox(nullptr, nullptr, 1, 1, 128, 127, 1e4f, stream()), strata::Error);
}

TEST_F(GpuOps, SwigluAndAddMatchCpu) {
  for (int64_t n : {int64_t(768), int64_t(3 * 768), int64_t(64 * 6144), int64_t(1)}) {
    auto g = randn(size_t(n), 31, 4.0f), u = randn(size_t(n), 32);
    std::vector<float> ref(static_cast<size_t>(n)), sum = g;
    cpu::swiglu(g.data(), u.data(), n, ref.data());
    cpu::add_inplace(sum.data(), u.data(), n);
    auto dg = upload(g, "gate"), du = upload(u, "up");
    auto dout = alloc<float>(size_t(n), "out");
    ops::swiglu(dg.as<float>(), du.as<float>(), n, dout.as<float>(), stream());
    auto c = compare(download<float>(dout, size_t(n)), ref, 1e-7, 1e-6);
    EXPECT_EQ(c.bad, 0u) << describe(c, "swiglu") << " n " << n;
    ops::swiglu(dg.as<float>(), du.as<float>(), n, dg.as<float>(), stream());  // out aliases gate
    c = compare(download<float>(dg, size_t(n)), ref, 1e-7, 1e-6);
    EXPECT_EQ(c.bad, 0u) << describe(c, "swiglu aliased") << " n " << n;
    auto dx = upload(g, "x");
    ops::add_inplace(dx.as<float>(), du.as<float>(), n, stream());
    auto got = download<float>(dx, size_t(n));
    EXPECT_EQ(got, sum) << "add_inplace differs (n " << n << ")";
  }
}

// copy_i32 (a chained decode pass's tokens from the previous pass's picks): std::copy's values, nothing past n.
TEST_F(GpuOps, CopyI32MatchesCpu) {
  for (int64_t n : {int64_t(1), int64_t(8), int64_t(1000), int64_t(300000)}) {
    std::vector<int32_t> src(static_cast<size_t>(n)), dst(static_cast<size_t>(n) + 5, -7);
    for (int64_t i = 0; i < n; ++i) src[size_t(i)] = int32_t(i * 2654435761u);
    std::vector<int32_t> want = dst;
    std::copy(src.begin(), src.end(), want.begin());
    auto ds = upload(src, "src"), dd = upload(dst, "dst");
    ops::copy_i32(dd.as<int32_t>(), ds.as<const int32_t>(), n, stream());
    EXPECT_EQ(download<int32_t>(dd, dst.size()), want) << "n " << n;
  }
  EXPECT_THROW(ops::copy_i32(nullptr, nullptr, -1, stream()), strata::Error);
}

// ------------------------------------------------------------------ KV cache and attention

// One sequence's device KV cache: [n_layer][n_ctx][n_head_kv][head_dim] f16 for K (V likewise), with a
// host copy of the same bits for the CPU reference.
struct Seq {
  int n_ctx = 0;
  std::vector<uint16_t> k, v;  // host mirror
  DeviceBuffer dk, dv;
};

struct Geometry {
  int n_layer, n_head, n_head_kv, head_dim, head_dim_v;
  int64_t k_row() const { return int64_t(n_head_kv) * head_dim; }
  int64_t v_row() const { return int64_t(n_head_kv) * head_dim_v; }
};

TEST_F(GpuOps, KvStoreIsBitExactF16) {
  const Geometry g{3, 32, 4, 128, 128};
  const int n_ctx = 1000, layer = 2;
  // Values that exercise rounding: normal, tiny (subnormal halves), huge (overflow to inf), exact ties.
  const int64_t n_tok = 64;
  auto k = randn(size_t(n_tok * g.k_row()), 41), v = randn(size_t(n_tok * g.v_row()), 42, 100.0f);
  for (size_t i = 0; i < k.size(); i += 7) k[i] *= 1e-6f;       // subnormal f16 range
  for (size_t i = 3; i < v.size(); i += 101) v[i] = 70000.0f;    // rounds to inf
  for (size_t i = 5; i < k.size(); i += 13) k[i] = 1.0f + 1.0f / 2048.0f;  // tie between two halves
  for (size_t i = 6; i < k.size(); i += 17) k[i] = -(1.0f + 3.0f / 2048.0f);
  // Two sequences; tokens alternate between them at scattered positions.
  Seq s[2];
  std::vector<ops::KvRef> refs(static_cast<size_t>(n_tok));
  const size_t cache_vals = size_t(g.n_layer) * n_ctx * size_t(g.k_row());
  for (auto& q : s) {
    q.n_ctx = n_ctx;
    q.dk = dev->alloc(cache_vals * 2, "k cache");
    q.dv = dev->alloc(cache_vals * 2, "v cache");
    xfer->fill(q.dk.span(), 0xab, dev->compute(), {&dev->compute()});
    xfer->fill(q.dv.span(), 0xab, dev->compute(), {&dev->compute()});
  }
  for (int64_t t = 0; t < n_tok; ++t)
    refs[size_t(t)] = {s[t % 2].dk.as<uint16_t>(), s[t % 2].dv.as<uint16_t>(), n_ctx, int32_t((t * 37) % n_ctx)};
  auto dk = upload(k, "k"), dv = upload(v, "v");
  auto drefs = upload(refs, "refs");
  ops::kv_store(dk.as<float>(), dv.as<float>(), drefs.as<ops::KvRef>(), n_tok, layer, g.k_row(), g.v_row(),
                stream());
  size_t bad = 0, checked = 0, touched_elsewhere = 0;
  std::string first;
  for (int si = 0; si < 2; ++si) {
    auto hk = download<uint16_t>(s[si].dk, cache_vals), hv = download<uint16_t>(s[si].dv, cache_vals);
    std::vector<char> written(static_cast<size_t>(g.n_layer) * n_ctx, 0);
    for (int64_t t = si; t < n_tok; t += 2) {
      const int64_t row = int64_t(layer) * n_ctx + refs[size_t(t)].pos;
      written[size_t(row)] = 1;
      std::vector<uint16_t> ek(static_cast<size_t>(g.k_row())), ev(static_cast<size_t>(g.v_row()));
      cpu::kv_store(cpu::KvType::F16, k.data() + t * g.k_row(), g.k_row(), ek.data());
      cpu::kv_store(cpu::KvType::F16, v.data() + t * g.v_row(), g.v_row(), ev.data());
      for (int64_t i = 0; i < g.k_row(); ++i, ++checked) {
        const uint16_t gk = hk[size_t(row * g.k_row() + i)], gv = hv[size_t(row * g.v_row() + i)];
        if (gk != ek[size_t(i)] || gv != ev[size_t(i)]) {
          if (bad++ == 0)
            first = "token " + std::to_string(t) + " elem " + std::to_string(i) + ": k " +
                    std::to_string(k[size_t(t * g.k_row() + i)]) + " gpu " + std::to_string(gk) + " cpu " +
                    std::to_string(ek[size_t(i)]) + "; v gpu " + std::to_string(gv) + " cpu " +
                    std::to_string(ev[size_t(i)]);
        }
      }
    }
    for (size_t r = 0; r < written.size(); ++r) {
      if (written[r]) continue;
      for (int64_t i = 0; i < g.k_row(); ++i)
        touched_elsewhere += hk[r * size_t(g.k_row()) + size_t(i)] != 0xabab ||
                             hv[r * size_t(g.v_row()) + size_t(i)] != 0xabab;
    }
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << checked << " f16 values differ from cpu::kv_store; first: " << first;
  EXPECT_EQ(touched_elsewhere, 0u) << "kv_store wrote outside the tokens' rows";
}

struct AttnCase {
  const char* name;
  Geometry g;
  std::vector<int> seq_ctx;                   // n_ctx of each sequence
  std::vector<std::pair<int, int>> tokens;    // (sequence, pos)
  int64_t gpu_max_kv = 0;                     // 0: the largest n_ctx; else what the GPU call is told
  bool misaligned = false;  // caches start 2 bytes past a 16-byte boundary (the tile kernel's scalar loads)
  bool one_cache = false;   // the F32 call is told every token is of one cache (ops::attention's one_cache)
};

class GpuAttention : public GpuOps {
 protected:
  void run(const AttnCase& c) {
    const Geometry& g = c.g;
    const int layer = g.n_layer - 1;
    std::vector<Seq> seqs(c.seq_ctx.size());
    std::mt19937 rng(51);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = seqs[i];
      s.n_ctx = c.seq_ctx[i];
      const size_t nk = size_t(g.n_layer) * s.n_ctx * size_t(g.k_row());
      const size_t nv = size_t(g.n_layer) * s.n_ctx * size_t(g.v_row());
      s.k.resize(nk);
      s.v.resize(nv);
      for (auto& x : s.k) x = cpu::float_to_half(nd(rng));
      for (auto& x : s.v) x = cpu::float_to_half(nd(rng));
      if (c.misaligned) {  // one f16 in front: the cache the kernel sees starts at element 1
        std::vector<uint16_t> k1(1, 0), v1(1, 0);
        k1.insert(k1.end(), s.k.begin(), s.k.end());
        v1.insert(v1.end(), s.v.begin(), s.v.end());
        s.dk = upload(k1, "k cache");
        s.dv = upload(v1, "v cache");
      } else {
        s.dk = upload(s.k, "k cache");
        s.dv = upload(s.v, "v cache");
      }
    }
    const int off = c.misaligned ? 1 : 0;
    const int64_t n_tok = int64_t(c.tokens.size());
    auto q = randn(size_t(n_tok * g.n_head * g.head_dim), 52, 1.5f);
    std::vector<ops::KvRef> refs;
    std::vector<cpu::AttnKv> kv;
    int64_t max_kv = 0;
    for (auto [si, pos] : c.tokens) {
      Seq& s = seqs[size_t(si)];
      refs.push_back({s.dk.as<uint16_t>() + off, s.dv.as<uint16_t>() + off, s.n_ctx, pos});
      kv.push_back({s.k.data() + size_t(layer) * s.n_ctx * size_t(g.k_row()),
                    s.v.data() + size_t(layer) * s.n_ctx * size_t(g.v_row()), pos + 1});
      max_kv = std::max<int64_t>(max_kv, s.n_ctx);
    }
    const float scale = 1.0f / std::sqrt(float(g.head_dim));
    const size_t n_out = size_t(n_tok * g.n_head * g.head_dim_v);
    ThreadPool pool(2);
    std::vector<float> scratch(static_cast<size_t>(pool.size()) * size_t(max_kv));
    std::vector<float> ref_f32(n_out), ref_f16(n_out);
    cpu::attention(q.data(), kv.data(), n_tok, g.n_head, g.n_head_kv, g.head_dim, g.head_dim_v, cpu::KvType::F16,
                   scale, ref_f32.data(), scratch.data(), max_kv, pool, cpu::AttnMath::F32);
    cpu::attention(q.data(), kv.data(), n_tok, g.n_head, g.n_head_kv, g.head_dim, g.head_dim_v, cpu::KvType::F16,
                   scale, ref_f16.data(), scratch.data(), max_kv, pool, cpu::AttnMath::GgmlF16);

    const int64_t gpu_max_kv = c.gpu_max_kv ? c.gpu_max_kv : max_kv;
    auto dq = upload(q, "q");
    auto drefs = upload(refs, "refs");
    auto dscratch = alloc<float>(ops::attention_scratch_floats(n_tok, g.n_head, g.head_dim_v, gpu_max_kv), "scratch");
    auto dout = alloc<float>(n_out, "out");
    xfer->fill(dout.span(), 0xFF, dev->compute(), {&dev->compute()});  // NaN: a row no launch writes fails
    ops::attention(dq.as<float>(), drefs.as<ops::KvRef>(), n_tok, layer, g.n_head, g.n_head_kv, g.head_dim,
                   g.head_dim_v, scale, cpu::AttnMath::F32, gpu_max_kv, dscratch.as<float>(), dout.as<float>(),
                   stream(), c.one_cache);
    auto got_f32 = download<float>(dout, n_out);
    ops::attention(dq.as<float>(), drefs.as<ops::KvRef>(), n_tok, layer, g.n_head, g.n_head_kv, g.head_dim,
                   g.head_dim_v, scale, cpu::AttnMath::GgmlF16, gpu_max_kv, dscratch.as<float>(),
                   dout.as<float>(), stream());
    auto got_f16 = download<float>(dout, n_out);

    // F32: same maths up to summation order and expf's last bit.
    auto c32 = compare(got_f32, ref_f32, 1e-5, 1e-4);
    EXPECT_EQ(c32.bad, 0u) << c.name << ": " << describe(c32, "attention F32");
    // GgmlF16: the f16 accumulator is rounded after every position, so a dot product summed in another
    // order can move one rounding by an f16 ulp; allow a few ulps per value. And the GPU must be far
    // closer to the CPU's f16 maths than the f16 maths is to f32 (else it is not the same arithmetic).
    auto c16 = compare(got_f16, ref_f16, 2e-3, 4e-3);
    size_t same = 0;
    double err16 = 0, err_maths = 0;
    for (size_t i = 0; i < n_out; ++i) {
      same += got_f16[i] == ref_f16[i];
      err16 += std::fabs(double(got_f16[i]) - double(ref_f16[i]));
      err_maths += std::fabs(double(ref_f16[i]) - double(ref_f32[i]));
    }
    err16 /= double(n_out);
    err_maths /= double(n_out);
    EXPECT_EQ(c16.bad, 0u) << c.name << ": " << describe(c16, "attention GgmlF16");
    int max_pos = 0;
    for (auto [si, pos] : c.tokens) max_pos = std::max(max_pos, pos);
    if (max_pos >= 16)
      EXPECT_LT(err16, 0.25 * err_maths) << c.name << ": GgmlF16 mean abs err vs CPU " << err16
                                         << " is not well below the f16-vs-f32 maths difference " << err_maths;
    std::printf("[attention %s] F32: max abs err %.3g | GgmlF16: max abs err %.3g, mean abs err %.3g, identical "
                "%zu/%zu | CPU f16 vs f32 maths mean abs diff %.3g\n",
                c.name, c32.max_abs, c16.max_abs, err16, same, n_out, err_maths);
  }
};

TEST_F(GpuAttention, DecodeQwen3) {
  const Geometry g{2, 32, 4, 128, 128};
  run({"decode pos 0", g, {1}, {{0, 0}}});
  run({"decode ctx 17", g, {17}, {{0, 16}}});
  run({"decode ctx 1000", g, {1000}, {{0, 999}}});
  run({"decode 3 sequences", g, {1000, 300, 700}, {{0, 999}, {1, 5}, {2, 511}}});
  // The engine's decode: the call is sized for the whole cache (max_kv = n_ctx), the context is short, so
  // most splits are empty (the combine skips them).
  run({"decode ctx 9 of a 4096 cache", g, {4096}, {{0, 8}}, 4096});
  run({"decode 2 sequences, ctx 70 and 3000 of 4096", g, {4096, 4096}, {{0, 69}, {1, 2999}}, 4096});
}

// One-token decode with splits of at least 2, 4 and 8 tiles (ops::set_attn_decode_tiles): one split up to that
// many positions (no combine), more past it, against the CPU at contexts on both sides of each bound.
TEST_F(GpuAttention, DecodeTilesASplit) {
  const Geometry g{2, 32, 4, 128, 128};
  const int was = ops::attn_decode_tiles();
  for (const int tiles : {2, 4, 8}) {
    SCOPED_TRACE("tiles a split " + std::to_string(tiles));
    ops::set_attn_decode_tiles(tiles);
    run({"decode ctx 65", g, {65}, {{0, 64}}});
    run({"decode ctx 128", g, {128}, {{0, 127}}});
    run({"decode ctx 129 of 256", g, {256}, {{0, 128}}});
    run({"decode ctx 512", g, {512}, {{0, 511}}});
    run({"decode ctx 1000", g, {1000}, {{0, 999}}});
    run({"decode ctx 70 of a 4096 cache", g, {4096}, {{0, 69}}, 4096});
  }
  ops::set_attn_decode_tiles(was);
  EXPECT_THROW(ops::set_attn_decode_tiles(0), strata::Error);
  EXPECT_THROW(ops::set_attn_decode_tiles(9), strata::Error);
}

// One-token decode with the splits merged by their blocks in clusters (ops::set_attn_cluster_merge) against
// the CPU: 2 to 8 splits, and past 8 (the combine again), also with 2 tiles a split.
TEST_F(GpuAttention, DecodeClusterMerge) {
  const Geometry g{2, 32, 4, 128, 128};
  const bool was = ops::attn_cluster_merge();
  const int was_tiles = ops::attn_decode_tiles();
  ops::set_attn_cluster_merge(true);
  for (const int tiles : {1, 2}) {
    SCOPED_TRACE("tiles a split " + std::to_string(tiles));
    ops::set_attn_decode_tiles(tiles);
    run({"decode ctx 65", g, {65}, {{0, 64}}});
    run({"decode ctx 200", g, {200}, {{0, 199}}});
    run({"decode ctx 512", g, {512}, {{0, 511}}});
    run({"decode ctx 70 of 512", g, {512}, {{0, 69}}});
    run({"decode ctx 1000", g, {1000}, {{0, 999}}});
    run({"decode ctx 9 of a 4096 cache", g, {4096}, {{0, 8}}, 4096});
  }
  run({"decode 3 sequences (no merge: 3 tokens)", g, {1000, 300, 700}, {{0, 999}, {1, 5}, {2, 511}}});
  ops::set_attn_decode_tiles(was_tiles);
  ops::set_attn_cluster_merge(was);
}

TEST_F(GpuAttention, PrefillCausal) {
  // Both prefill kernels: CUDA cores (the default) and tensor cores (attn_tile::set_prefill_mma).
  for (bool mma : {false, true}) {
    SCOPED_TRACE(mma ? "tensor-core prefill kernel" : "CUDA-core prefill kernel");
    std::printf("[attention] prefill kernel: %s\n", mma ? "tensor cores" : "CUDA cores");
    attn_tile::set_prefill_mma(mma);
    const Geometry g{2, 32, 4, 128, 128};
    AttnCase c{"prefill 64 tokens", g, {1000}, {}};
    for (int p = 0; p < 64; ++p) c.tokens.push_back({0, 900 + p});
    run(c);
    AttnCase c2{"prefill 64 from 0 + 3 others", g, {128, 1000}, {}};
    for (int p = 0; p < 64; ++p) c2.tokens.push_back({0, p});
    for (int p : {3, 400, 999}) c2.tokens.push_back({1, p});
    run(c2);
  }
  attn_tile::set_prefill_mma(false);
}

// The tiled kernel's prefill shape (8 tokens or more in a call): tiles of 8 tokens x 8 heads, runs of
// tokens from different sequences inside one tile, positions not starting at 0, contexts and token counts
// that are not multiples of the tile sizes, one split (no combine) and many.
TEST_F(GpuAttention, PrefillTiles) {
  // Both prefill kernels: CUDA cores (the default) and tensor cores (attn_tile::set_prefill_mma).
  for (bool mma : {false, true}) {
    SCOPED_TRACE(mma ? "tensor-core prefill kernel" : "CUDA-core prefill kernel");
    std::printf("[attention] prefill kernel: %s\n", mma ? "tensor cores" : "CUDA cores");
    attn_tile::set_prefill_mma(mma);
    const Geometry g{2, 32, 4, 128, 128};
    AttnCase c{"prefill 37 tokens at 263..299 (ctx 300)", g, {300}, {}};
    for (int p = 263; p < 300; ++p) c.tokens.push_back({0, p});
    run(c);
    AttnCase c1{"prefill 40 tokens from 0, ctx 50 (one split)", g, {50}, {}};
    for (int p = 0; p < 40; ++p) c1.tokens.push_back({0, p});
    run(c1);
    // Two sequences in one batch, the boundary inside a tile: seq 0 at 100..110, seq 1 at 0..5, seq 0 again
    // at 111..120, then decode tokens of both.
    AttnCase c2{"two sequences mixed in tiles", g, {700, 130}, {}};
    for (int p = 100; p <= 110; ++p) c2.tokens.push_back({0, p});
    for (int p = 0; p <= 5; ++p) c2.tokens.push_back({1, p});
    for (int p = 111; p <= 120; ++p) c2.tokens.push_back({0, p});
    c2.tokens.push_back({1, 129});
    c2.tokens.push_back({0, 699});
    run(c2);
    AttnCase c3{"prefill 530 tokens from 0 (one split from the token count)", g, {600}, {}};
    for (int p = 0; p < 530; ++p) c3.tokens.push_back({0, p});
    run(c3);
    AttnCase c4{"prefill, caches not 16-byte aligned (scalar tile loads)", g, {333}, {}, 0, true};
    for (int p = 300; p < 333; ++p) c4.tokens.push_back({0, p});
    run(c4);
    run({"decode, cache not 16-byte aligned", g, {333}, {{0, 332}}, 0, true});
    // A batch of decodes from 9 sequences: every tile mixed, all tokens go to the decode shape.
    AttnCase c5{"batched decode of 9 sequences", g, {}, {}};
    for (int i = 0; i < 9; ++i) {
      c5.seq_ctx.push_back(100 + 97 * i);
      c5.tokens.push_back({i, 99 + 97 * i - 3 * i});
    }
    run(c5);
    // Group of 4: decode tiles of 2 tokens, prefill tiles of 16; one mixed class tile, one single-cache one.
    AttnCase c6{"group 4: mixed and single-cache tiles", Geometry{1, 16, 4, 128, 128}, {90, 40}, {}};
    for (int p = 0; p < 10; ++p) c6.tokens.push_back({0, 70 + p});
    for (int p = 0; p < 13; ++p) c6.tokens.push_back({1, 20 + p});
    run(c6);
  }
  attn_tile::set_prefill_mma(false);
}

// The split rules (ops::set_attn_split_rule): 300 tokens x 32 heads give 150 prefill blocks, which rule 0
// splits in two (and merges) and rule 1 does not; the tensor-core kernel takes its tiles from the last.
// Both kernels, both rules, one sequence (also told so: one_cache) and two (a tile of mixed caches, a
// second cache's tiles).
TEST_F(GpuAttention, PrefillSplitRules) {
  const Geometry g{2, 32, 4, 128, 128};
  const int rule0 = ops::attn_split_rule();
  for (int rule : {0, 1}) {
    ops::set_attn_split_rule(rule);
    for (bool mma : {false, true}) {
      SCOPED_TRACE(std::string("split rule ") + std::to_string(rule) + (mma ? ", tensor cores" : ", CUDA cores"));
      attn_tile::set_prefill_mma(mma);
      AttnCase a{"prefill 300 tokens from 0", g, {300}, {}};
      for (int p = 0; p < 300; ++p) a.tokens.push_back({0, p});
      run(a);
      a.name = "prefill 300 tokens from 0, one cache (the prefill shape's launch only)";
      a.one_cache = true;
      run(a);
      AttnCase b{"prefill 200 + 101 tokens of two sequences", g, {260, 400}, {}};
      for (int p = 0; p < 200; ++p) b.tokens.push_back({1, 150 + p});
      for (int p = 0; p < 101; ++p) b.tokens.push_back({0, 159 + p});
      run(b);
    }
  }
  ops::set_attn_split_rule(rule0);
  attn_tile::set_prefill_mma(false);
}

TEST_F(GpuAttention, PrefillTilesOtherHeadSizes) {
  // Both prefill kernels: CUDA cores (the default) and tensor cores (attn_tile::set_prefill_mma).
  for (bool mma : {false, true}) {
    SCOPED_TRACE(mma ? "tensor-core prefill kernel" : "CUDA-core prefill kernel");
    std::printf("[attention] prefill kernel: %s\n", mma ? "tensor cores" : "CUDA cores");
    attn_tile::set_prefill_mma(mma);
    AttnCase a{"head 64, 12/1 heads, 21 tokens at 180..200", Geometry{1, 12, 1, 64, 64}, {201}, {}};
    for (int p = 180; p <= 200; ++p) a.tokens.push_back({0, p});
    run(a);
    AttnCase b{"head 256, 16/2 heads, 19 tokens at 70..88", Geometry{1, 16, 2, 256, 256}, {89}, {}};
    for (int p = 70; p <= 88; ++p) b.tokens.push_back({0, p});
    run(b);
    AttnCase c{"head 64, 64/4 heads (group 16 > decode rows)", Geometry{1, 64, 4, 64, 64}, {150}, {{0, 149}, {0, 3}}};
    run(c);
    AttnCase d{"head 80 prefill (per-warp fallback kernel)", Geometry{1, 8, 2, 80, 80}, {120}, {}};
    for (int p = 100; p < 120; ++p) d.tokens.push_back({0, p});
    run(d);
  }
  attn_tile::set_prefill_mma(false);
}

TEST_F(GpuAttention, OtherGeometries) {
  run({"head 256, 16/2 heads", Geometry{1, 16, 2, 256, 256}, {600}, {{0, 599}, {0, 10}, {0, 300}}});
  run({"head 64, 12/1 heads (two head tiles)", Geometry{1, 12, 1, 64, 64}, {500}, {{0, 499}, {0, 0}}});
  run({"head 80 (no vector loads)", Geometry{1, 8, 8, 80, 80}, {200}, {{0, 199}, {0, 57}}});
  run({"head 128 K, 64 V", Geometry{1, 8, 2, 128, 64}, {300}, {{0, 299}}});
  run({"max_kv below the context (last split takes the rest)", Geometry{1, 32, 4, 128, 128}, {1000},
       {{0, 999}, {0, 200}}, 100});
}

TEST_F(GpuOps, AttentionRejectsBadShapes) {
  EXPECT_THROW(ops::attention(nullptr, nullptr, 1, 0, 32, 4, 512, 128, 1.0f, cpu::AttnMath::F32, 16, nullptr,
                              nullptr, stream()),
               strata::Error);
  EXPECT_THROW(ops::attention(nullptr, nullptr, 1, 0, 30, 4, 128, 128, 1.0f, cpu::AttnMath::F32, 16, nullptr,
                              nullptr, stream()),
               strata::Error);
}

// ------------------------------------------------------------------ routing

TEST_F(GpuOps, MoeRouteMatchesCpu) {
  struct Case { int64_t n_tok; int n_expert, k; bool norm; bool ties; };
  for (const Case& c : {Case{1, 128, 8, true, false}, Case{3, 128, 8, true, false}, Case{64, 128, 8, true, false},
                        Case{512, 128, 8, false, false}, Case{64, 512, 10, true, false},
                        Case{64, 128, 8, true, true}, Case{7, 1024, 64, true, true}, Case{5, 4, 4, true, false}}) {
    auto logits = randn(size_t(c.n_tok * c.n_expert), 61 + uint32_t(c.n_expert), 2.0f);
    if (c.ties)  // few distinct values: many exactly equal probabilities, decided by the lower id
      for (auto& x : logits) x = std::round(x * 2.0f) / 2.0f;
    const size_t n_out = size_t(c.n_tok * c.k);
    std::vector<int32_t> ids(n_out);
    std::vector<float> w(n_out);
    cpu::moe_route(logits.data(), c.n_tok, c.n_expert, c.k, c.norm, ids.data(), w.data());
    auto dl = upload(logits, "logits");
    auto dids = alloc<int32_t>(n_out, "ids");
    auto dw = alloc<float>(n_out, "weights");
    ops::moe_route(dl.as<float>(), c.n_tok, c.n_expert, c.k, c.norm, dids.as<int32_t>(), dw.as<float>(), stream());
    auto gids = download<int32_t>(dids, n_out);
    auto gw = download<float>(dw, n_out);
    size_t id_bad = 0;
    std::string first;
    for (size_t i = 0; i < n_out; ++i)
      if (gids[i] != ids[i] && id_bad++ == 0)
        first = "token " + std::to_string(i / size_t(c.k)) + " rank " + std::to_string(i % size_t(c.k)) + ": gpu " +
                std::to_string(gids[i]) + " cpu " + std::to_string(ids[i]);
    auto cw = compare(gw, w, 1e-6, 0);
    EXPECT_EQ(id_bad, 0u) << id_bad << " ids differ (" << c.n_tok << " tokens, " << c.n_expert << " experts, top "
                          << c.k << "); first: " << first;
    EXPECT_EQ(cw.bad, 0u) << describe(cw, "moe_route weights");
  }
  EXPECT_THROW(ops::moe_route(nullptr, 1, 2000, 8, true, nullptr, nullptr, stream()), strata::Error);
  EXPECT_THROW(ops::moe_route(nullptr, 1, 128, 0, true, nullptr, nullptr, stream()), strata::Error);
}

// ------------------------------------------------------------------ sampling

constexpr int64_t kVocab = 151936;

TEST_F(GpuOps, ArgmaxMatchesGreedySampler) {
  const int64_t n_tok = 4;
  auto logits = randn(size_t(n_tok * kVocab), 71, 3.0f);
  // Row 1: the maximum twice (lower id wins); row 2: all equal; row 3: the max in the last slot.
  logits[size_t(kVocab + 1000)] = 50.0f;
  logits[size_t(kVocab + 900)] = 50.0f;
  std::fill(logits.begin() + 2 * kVocab, logits.begin() + 3 * kVocab, -1.0f);
  logits[size_t(4 * kVocab - 1)] = 60.0f;
  auto dl = upload(logits, "logits");
  auto dout = alloc<int32_t>(size_t(n_tok), "out");
  ops::argmax(dl.as<float>(), n_tok, kVocab, dout.as<int32_t>(), stream());
  auto got = download<int32_t>(dout, size_t(n_tok));
  SamplingParams sp;
  sp.temperature = 0.0f;
  for (int64_t t = 0; t < n_tok; ++t) {
    Sampler s(sp, int32_t(kVocab));
    EXPECT_EQ(got[size_t(t)], s.sample(logits.data() + t * kVocab)) << "row " << t;
  }
  EXPECT_EQ(got[1], 900);
  EXPECT_EQ(got[2], 0);
  EXPECT_EQ(got[3], int32_t(kVocab - 1));
}

// argmax_wide (greedy picks over many blocks a row): argmax's ids, the CPU greedy sampler's, at row lengths
// around its stretches and past its block cap (several stretches a block), ties and equal rows included.
TEST_F(GpuOps, ArgmaxWideMatchesArgmaxAndTheGreedySampler) {
  SamplingParams sp;
  sp.temperature = 0.0f;
  for (int64_t V : {int64_t(1), int64_t(100), int64_t(2048), int64_t(2049), kVocab, int64_t(3000000)}) {
    const int64_t n_tok = V > 1000000 ? 2 : 5;
    auto logits = randn(size_t(n_tok * V), 73 + uint32_t(V % 97), 3.0f);
    if (n_tok > 2 && V > 3) {
      std::fill(logits.begin() + V, logits.begin() + 2 * V, -1.0f);  // row 1: all equal
      logits[size_t(2 * V + V / 2)] = 80.0f;                           // row 2: the max twice (lower id wins)
      logits[size_t(2 * V + V - 1)] = 80.0f;
      logits[size_t(4 * V - 1)] = 90.0f;                               // row 3: the last slot
    }
    logits[size_t(n_tok * V - 1) / 2] = 70.0f;
    auto dl = upload(logits, "logits");
    auto dw = alloc<int32_t>(size_t(n_tok), "wide"), da = alloc<int32_t>(size_t(n_tok), "one");
    auto dp = alloc<uint64_t>(ops::argmax_parts_bytes(n_tok, V) / 8, "parts");
    ops::argmax_wide(dl.as<float>(), n_tok, V, dp.as<uint64_t>(), dw.as<int32_t>(), stream());
    ops::argmax(dl.as<float>(), n_tok, V, da.as<int32_t>(), stream());
    const auto wide = download<int32_t>(dw, size_t(n_tok)), one = download<int32_t>(da, size_t(n_tok));
    EXPECT_EQ(wide, one) << "V " << V;
    for (int64_t t = 0; t < n_tok; ++t) {
      Sampler smp(sp, int32_t(V));
      EXPECT_EQ(wide[size_t(t)], smp.sample(logits.data() + t * V)) << "V " << V << " row " << t;
    }
  }
  EXPECT_THROW(ops::argmax_wide(nullptr, 1, 0, nullptr, nullptr, stream()), strata::Error);
}

// The CPU Sampler's candidate list and cumulative sums (penalties off), to judge a disagreement: it is
// allowed only when the result hinges on a comparison closer than 1e-6 (u against a cumulative sum,
// top-p against one, or a logit against the min-p threshold).
bool near_boundary(const float* logits, int64_t n_vocab, const ops::SampleParams& p, double u, double eps) {
  if (p.temperature <= 0.0f) return false;  // greedy: no boundary to be near
  struct C { int32_t id; float l; float pr; };
  std::vector<C> c(static_cast<size_t>(n_vocab));
  for (int64_t i = 0; i < n_vocab; ++i) c[size_t(i)] = {int32_t(i), logits[i], 0};
  std::sort(c.begin(), c.end(), [](const C& a, const C& b) { return a.l > b.l || (a.l == b.l && a.id < b.id); });
  size_t n = p.top_k > 0 && p.top_k < n_vocab ? size_t(p.top_k) : size_t(n_vocab);
  auto softmax = [&](size_t m, float temp) {
    double s = 0;
    for (size_t i = 0; i < m; ++i) s += (c[i].pr = std::exp((c[i].l - c[0].l) / temp));
    for (size_t i = 0; i < m; ++i) c[i].pr = float(c[i].pr / s);
  };
  bool near = false;
  if (p.top_p < 1.0f) {
    softmax(n, 1.0f);
    double cum = 0;
    for (size_t i = 0; i < n; ++i) {
      cum += c[i].pr;
      near |= std::fabs(cum - p.top_p) < eps;
      if (cum >= p.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const float th = c[0].l + std::log(p.min_p);
    size_t keep = 1;
    while (keep < n && c[keep].l >= th) ++keep;
    for (size_t i = 0; i < std::min(n, keep + 2); ++i) near |= std::fabs(double(c[i].l) - double(th)) < eps;
    n = keep;
  }
  softmax(n, p.temperature);
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += c[i].pr;
    near |= std::fabs(cum - u) < eps;
  }
  return near;
}

void sample_case(GpuOps& f, int64_t n_vocab, int rows, float logit_sd, bool quantized, const ops::SampleParams& p,
                 uint64_t seed, int* n_rows, int* n_mismatch_near, int* n_mismatch_far, std::string* report) {
  auto logits = randn(size_t(rows) * size_t(n_vocab), uint32_t(seed), logit_sd);
  if (quantized)
    for (auto& x : logits) x = std::round(x * 4.0f) / 4.0f;
  std::vector<float> u(static_cast<size_t>(rows));
  std::vector<int32_t> want(static_cast<size_t>(rows));
  std::vector<double> ud(static_cast<size_t>(rows));
  SamplingParams sp;
  sp.temperature = p.temperature;
  sp.top_k = p.top_k;
  sp.top_p = p.top_p;
  sp.min_p = p.min_p;
  sp.repeat_penalty = 1.0f;
  for (int r = 0; r < rows; ++r) {
    sp.seed = seed * 1000 + uint64_t(r);
    Sampler s(sp, int32_t(n_vocab));
    want[size_t(r)] = s.sample(logits.data() + size_t(r) * size_t(n_vocab));
    Rng rng(sp.seed);  // the draw the Sampler made
    ud[size_t(r)] = rng.uniform();
    u[size_t(r)] = float(ud[size_t(r)]);
  }
  auto dl = f.upload(logits, "logits");
  auto du = f.upload(u, "u");
  auto dout = f.alloc<int32_t>(size_t(rows), "out");
  auto dscratch = f.alloc<unsigned char>(ops::sample_scratch_bytes(rows, n_vocab), "scratch");
  ops::sample(dl.as<float>(), rows, n_vocab, p, du.as<float>(), dscratch.data(), dout.as<int32_t>(), f.stream());
  auto got = f.download<int32_t>(dout, size_t(rows));
  for (int r = 0; r < rows; ++r) {
    ++*n_rows;
    if (got[size_t(r)] == want[size_t(r)]) continue;
    // float(u) may differ from u by 3e-8: within the same 1e-6 allowance.
    const bool near = near_boundary(logits.data() + size_t(r) * size_t(n_vocab), n_vocab, p, ud[size_t(r)], 1e-6);
    ++*(near ? n_mismatch_near : n_mismatch_far);
    *report += "  vocab " + std::to_string(n_vocab) + " T " + std::to_string(p.temperature) + " top_k " +
               std::to_string(p.top_k) + " top_p " + std::to_string(p.top_p) + " min_p " + std::to_string(p.min_p) +
               " sd " + std::to_string(logit_sd) + (quantized ? " (ties)" : "") + " row " + std::to_string(r) +
               ": gpu " + std::to_string(got[size_t(r)]) + " cpu " + std::to_string(want[size_t(r)]) + " u " +
               std::to_string(ud[size_t(r)]) + (near ? " [near a boundary: allowed]" : " [NOT near a boundary]") + "\n";
  }
}

void sample_matches_cpu_sampler(GpuOps& f) {
  int n_rows = 0, near = 0, far = 0;
  std::string report;
  std::mt19937 rng(81);
  const float temps[] = {0.0f, 0.3f, 0.8f, 1.0f, 1.7f};
  const int32_t top_ks[] = {0, 1, 40, 100, 3000};
  const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.999f};
  const float min_ps[] = {0.0f, 0.05f, 0.2f};
  const float sds[] = {0.3f, 1.0f, 3.0f, 8.0f};
  uint64_t seed = 1;
  for (int i = 0; i < 40; ++i) {  // random parameter sets, 6 rows each, at the real vocabulary size
    ops::SampleParams p;
    p.temperature = temps[rng() % 5];
    p.top_k = top_ks[rng() % 5];
    p.top_p = top_ps[rng() % 4];
    p.min_p = min_ps[rng() % 3];
    sample_case(f, kVocab, 6, sds[rng() % 4], i % 5 == 4, p, seed++, &n_rows, &near, &far, &report);
  }
  // The defaults, the everything-off case (the draw over the whole sorted vocabulary), small vocabularies.
  sample_case(f, kVocab, 8, 1.0f, false, ops::SampleParams{}, seed++, &n_rows, &near, &far, &report);
  sample_case(f, kVocab, 4, 0.5f, false, ops::SampleParams{1.0f, 0, 1.0f, 0.0f}, seed++, &n_rows, &near, &far,
              &report);
  sample_case(f, kVocab, 4, 2.0f, false, ops::SampleParams{0.7f, 0, 0.9f, 0.0f}, seed++, &n_rows, &near, &far,
              &report);
  sample_case(f, 5, 16, 1.0f, false, ops::SampleParams{1.0f, 40, 1.0f, 0.0f}, seed++, &n_rows, &near, &far,
              &report);
  sample_case(f, 3000, 16, 1.0f, true, ops::SampleParams{1.2f, 0, 0.97f, 0.01f}, seed++, &n_rows, &near, &far,
              &report);
  std::printf("[sample] %d rows: %d identical, %d differ near a 1e-6 boundary (allowed), %d differ otherwise\n%s",
              n_rows, n_rows - near - far, near, far, report.c_str());
  EXPECT_EQ(far, 0) << "GPU and CPU sampler picked different tokens away from any boundary:\n" << report;
  EXPECT_LE(near, n_rows / 50) << "too many boundary cases to be chance:\n" << report;
}

TEST_F(GpuOps, SampleMatchesCpuSampler) { sample_matches_cpu_sampler(*this); }

// sample_matches_cpu_sampler with one of the sampler's switches (get / set) at `on`, then set back.
void sample_matches_cpu_sampler_with(GpuOps& f, bool (*get)(), void (*set)(bool), bool on) {
  const bool was = get();
  set(on);
  sample_matches_cpu_sampler(f);
  set(was);
}

// The same with each way past the first 2048 ranks: the deep search by mass (ops::sample_deep, the default)
// and the walk over the ranks in chunks (the everything-off and flat cases above go tens of thousands of
// ranks deep, the top-p ones too).
TEST_F(GpuOps, SampleDeepMatchesCpuSampler) {
  sample_matches_cpu_sampler_with(*this, ops::sample_deep, ops::set_sample_deep, true);
}
TEST_F(GpuOps, SampleWalkMatchesCpuSampler) {
  sample_matches_cpu_sampler_with(*this, ops::sample_deep, ops::set_sample_deep, false);
}
// The picks of `rows` rows through sample (rule p for every row) and sample_rows (rules: [rows] on the device),
// with the sampler's switches as they are now: {sample's, sample_rows'}.
std::array<std::vector<int32_t>, 2> sample_both_ways(GpuOps& f, const DeviceBuffer& dl, int rows, int64_t V,
                                                     const ops::SampleParams& p, const DeviceBuffer& drules,
                                                     const DeviceBuffer& du, DeviceBuffer& dscratch, DeviceBuffer& dout) {
  std::array<std::vector<int32_t>, 2> got;
  ops::sample(dl.as<float>(), rows, V, p, du.as<float>(), dscratch.data(), dout.as<int32_t>(), f.stream());
  got[0] = f.download<int32_t>(dout, size_t(rows));
  ops::sample_rows(dl.as<float>(), rows, V, drules.as<ops::SampleParams>(), du.as<float>(), dscratch.data(),
                   dout.as<int32_t>(), f.stream());
  got[1] = f.download<int32_t>(dout, size_t(rows));
  return got;
}

TEST_F(GpuOps, SampleDeepAggMatchesCpuSampler) {
  sample_matches_cpu_sampler_with(*this, ops::sample_deep_agg, ops::set_sample_deep_agg, true);
}

// rows x V random logits of spread sd (tie_step > 0: rounded to multiples of it, many ties) and rows draws in
// [0, 1), the rows of a picks-as test.
std::pair<std::vector<float>, std::vector<float>> random_rows(int rows, int64_t V, uint32_t seed, float sd,
                                                              float tie_step, std::mt19937& rng) {
  auto logits = randn(size_t(rows) * size_t(V), seed, sd);
  if (tie_step > 0.0f)
    for (auto& x : logits) x = std::round(x / tie_step) * tie_step;
  std::vector<float> u(static_cast<size_t>(rows));
  for (auto& x : u) x = float(rng() % 1000000) / 1e6f;
  return {std::move(logits), std::move(u)};
}

// The deep search's atomics a warp at a time (ops::sample_deep_agg) add the same integers to the same bins as one
// atomic a key, so every pick is the same id, exactly: rows that go deep (flat logits, top-k off or past 2048,
// top-p and min-p on and off, ties from logits in steps of 1/64 and 1/4), at the real vocabulary and at sizes
// with a partial last warp, through sample and sample_rows.
// One test a vocabulary size, so racecheck can take the small one (the real vocabulary runs past its limit).
// rows a launch and cases (the first ones of the 6 below): the full test's by default; fewer for racecheck.
// deep_switch_picks_the_same: the same comparison for any switch of the deep search (get / set; name: the log's).
void deep_switch_picks_the_same(GpuOps& f, int64_t V, uint32_t seed0, int rows, int cases, bool (*get)(),
                                void (*set)(bool), const char* name) {
  const float sds[] = {0.05f, 0.3f, 1.0f};
  std::mt19937 rng(seed0);
  uint64_t seed = seed0 + 500;
  int compared = 0;
  const bool was = get();
  auto dscratch = f.alloc<unsigned char>(ops::sample_scratch_bytes(rows, V), "scratch");
  auto dout = f.alloc<int32_t>(size_t(rows), "out");
  for (int c = 0; c < cases; ++c) {
    const float tie = c < 3 ? 0.0f : c == 3 ? 1.0f / 64 : 0.25f;
    const auto [logits, u] = random_rows(rows, V, uint32_t(seed++), sds[c % 3], tie, rng);
    const float temps[] = {0.7f, 1.0f, 1.5f};
    std::vector<ops::SampleParams> rules(rows);
    for (int r = 0; r < rows; ++r)
      rules[size_t(r)] = {temps[rng() % 3], r % 3 == 2 ? 3000 : 0, r % 2 ? 0.9f : 1.0f, r % 4 == 1 ? 0.001f : 0.0f};
    const ops::SampleParams p{temps[c % 3], 0, c % 2 ? 0.97f : 1.0f, 0.0f};
    auto dl = f.upload(logits, "logits");
    auto du = f.upload(u, "u");
    auto drules = f.upload(rules, "rules");
    std::array<std::vector<int32_t>, 2> got[2];  // [switch off, on][sample, sample_rows]
    for (int on = 0; on < 2; ++on) {
      set(on == 1);
      got[on] = sample_both_ways(f, dl, rows, V, p, drules, du, dscratch, dout);
    }
    EXPECT_EQ(got[1][0], got[0][0]) << "sample, vocabulary " << V << ", case " << c;
    EXPECT_EQ(got[1][1], got[0][1]) << "sample_rows, vocabulary " << V << ", case " << c;
    compared += 2 * rows;
  }
  set(was);
  std::printf("[%s] vocabulary %lld: %d picks compared\n", name, static_cast<long long>(V), compared);
}
void deep_agg_picks_as_one_atomic_a_key(GpuOps& f, int64_t V, uint32_t seed0, int rows = 8, int cases = 6) {
  deep_switch_picks_the_same(f, V, seed0, rows, cases, ops::sample_deep_agg, ops::set_sample_deep_agg, "deep agg");
}
TEST_F(GpuOps, SampleDeepAggPicksAsOneAtomicAKey) { deep_agg_picks_as_one_atomic_a_key(*this, kVocab, 93); }
TEST_F(GpuOps, SampleDeepAggPicksAsOneAtomicAKeyPartialWarp) {
  deep_agg_picks_as_one_atomic_a_key(*this, 50000 + 17, 94);
}
TEST_F(GpuOps, SampleDeepAggPicksAsOneAtomicAKeySmall) { deep_agg_picks_as_one_atomic_a_key(*this, 4099, 95); }
// For compute-sanitizer racecheck (the tests above run past its limits): 2 rows of 4099 values, 2 cases (a flat
// whole-vocabulary draw, then top-p 0.97), each way: 8 launches.
TEST_F(GpuOps, SampleDeepAggRacecheckProbe) { deep_agg_picks_as_one_atomic_a_key(*this, 4099, 96, 2, 2); }

// The deep search's bin pick by a warp (ops::sample_deep_warp: a scan over the lanes and a ballot) takes the same
// bins as thread 0's walk, so every pick is the same id: the rows and sizes of the deep agg tests above (flat and
// tied rows, top-k off and 3000, top-p and min-p, through sample and sample_rows).
void deep_warp_picks_as_one_thread(GpuOps& f, int64_t V, uint32_t seed0) {
  deep_switch_picks_the_same(f, V, seed0, 8, 6, ops::sample_deep_warp, ops::set_sample_deep_warp, "deep warp");
}
TEST_F(GpuOps, SampleDeepWarpPicksAsOneThread) { deep_warp_picks_as_one_thread(*this, kVocab, 97); }
TEST_F(GpuOps, SampleDeepWarpPicksAsOneThreadPartialWarp) { deep_warp_picks_as_one_thread(*this, 50000 + 17, 98); }
TEST_F(GpuOps, SampleDeepWarpPicksAsOneThreadSmall) { deep_warp_picks_as_one_thread(*this, 4099, 99); }
TEST_F(GpuOps, SampleDeepWarpMatchesCpuSampler) {
  sample_matches_cpu_sampler_with(*this, ops::sample_deep_warp, ops::set_sample_deep_warp, true);
}

// A cluster of blocks a row (ops::sample_cluster) splits the passes and merges their histograms (integers: the
// same), sums (doubles, in another order) and gathered keys, so its picks are one block's. The rows: flat and
// tied logits, greedy, top-k off / 40 / 3000, top-p and min-p, at the real vocabulary, past a partial warp, and
// small enough that some blocks hold no value; with the prefilter's scratch (sample_rows' top-k 40 rows merge the
// stretch lists on their cluster's rank 0 alone; sample launches one block for them) and without; through sample
// and sample_rows. Cluster sizes 2, 3 (not a power of two) and 8.
// rows a launch, cases of the 8 below (the first ones), cluster sizes: the full test's by default; a few
// launches for compute-sanitizer's racecheck (SampleClusterRacecheckProbe).
void cluster_picks_as_one_block(GpuOps& f, int64_t V, uint32_t seed0, int rows = 8, int cases = 8,
                                std::vector<int> sizes = {2, 3, 8}) {
  const float sds[] = {0.05f, 0.3f, 1.0f, 4.0f};
  std::mt19937 rng(seed0);
  uint64_t seed = seed0 + 700;
  int compared = 0;
  const int was = ops::sample_cluster();
  auto dscratch = f.alloc<unsigned char>(ops::sample_scratch_bytes(rows, V), "scratch");
  auto dout = f.alloc<int32_t>(size_t(rows), "out");
  for (int c = 0; c < cases; ++c) {
    const float tie = c < 4 ? 0.0f : c == 4 ? 1.0f / 64 : 0.25f;
    const auto [logits, u] = random_rows(rows, V, uint32_t(seed++), sds[c % 4], tie, rng);
    const float temps[] = {0.0f, 0.7f, 1.0f, 1.5f};
    const int32_t top_ks[] = {0, 40, 3000, 0};
    std::vector<ops::SampleParams> rules(rows);
    for (int r = 0; r < rows; ++r)
      rules[size_t(r)] = {temps[rng() % 4], top_ks[rng() % 4], r % 2 ? 0.9f : 1.0f, r % 4 == 1 ? 0.01f : 0.0f};
    const ops::SampleParams p{temps[1 + c % 3], top_ks[c % 4], c % 2 ? 0.97f : 1.0f, c % 3 == 2 ? 0.05f : 0.0f};
    auto dl = f.upload(logits, "logits");
    auto du = f.upload(u, "u");
    auto drules = f.upload(rules, "rules");
    for (const bool scratch : {true, false}) {
      DeviceBuffer none;
      DeviceBuffer& sc = scratch ? dscratch : none;
      ops::set_sample_cluster(1);
      const auto want = sample_both_ways(f, dl, rows, V, p, drules, du, sc, dout);
      for (const int blocks : sizes) {
        ops::set_sample_cluster(blocks);
        const auto got = sample_both_ways(f, dl, rows, V, p, drules, du, sc, dout);
        EXPECT_EQ(got[0], want[0]) << "sample, vocabulary " << V << ", case " << c << ", " << blocks << " blocks"
                                   << (scratch ? ", prefilter" : "");
        EXPECT_EQ(got[1], want[1]) << "sample_rows, vocabulary " << V << ", case " << c << ", " << blocks
                                   << " blocks" << (scratch ? ", prefilter" : "");
        compared += 2 * rows;
      }
    }
  }
  ops::set_sample_cluster(was);
  std::printf("[cluster] vocabulary %lld: %d picks compared\n", static_cast<long long>(V), compared);
}
TEST_F(GpuOps, SampleClusterPicksAsOneBlock) { cluster_picks_as_one_block(*this, kVocab, 101); }
TEST_F(GpuOps, SampleClusterPicksAsOneBlockPartialWarp) { cluster_picks_as_one_block(*this, 50000 + 17, 102); }
TEST_F(GpuOps, SampleClusterPicksAsOneBlockSmall) {
  cluster_picks_as_one_block(*this, 4099, 103);
  cluster_picks_as_one_block(*this, 70, 104);  // (fewer values than one block's threads: most blocks hold none)
}
// For compute-sanitizer racecheck (the tests above run past its limits): 2 rows of 4099 values, a flat row drawn
// over the whole vocabulary (the deep walk's merges) and a top-k 40 / top-p row, clusters of 8, with and
// without the prefilter: 16 launches. (Natively it is part of what the tests above check.)
TEST_F(GpuOps, SampleClusterRacecheckProbe) { cluster_picks_as_one_block(*this, 4099, 105, 2, 2, {8}); }
// racecheck cannot check the cluster's merges (distributed shared memory: an internal sanitizer error on the first
// launch, session 51). So the merges' order is tested by shuffling the blocks: with set_sample_cluster_jitter each
// block sleeps 0-4 us after every merge's barrier before it reads the others' parts, letting the other blocks run
// ahead into their next parts. A part that its barriers and parity did not guard would be read after another
// pass overwrote it, and the picks would differ from one block's (or the cluster would hang). Several seeds, rows
// that go deep (flat logits, top-k off), clusters of 2, 3 and 8.
TEST_F(GpuOps, SampleClusterPicksUnderJitter) {
  struct Off {
    ~Off() { ops::set_sample_cluster_jitter(0); }
  } off;
  for (const uint32_t seed : {1u, 0x5EEDu, 0xC0FFEEu}) {
    ops::set_sample_cluster_jitter(seed);
    cluster_picks_as_one_block(*this, 4099, 106 + seed % 7, 4, 8);
    cluster_picks_as_one_block(*this, 50000 + 17, 107 + seed % 5, 2, 4);
  }
}
bool sample_cluster_of_8() { return ops::sample_cluster() == 8; }
void set_sample_cluster_of_8(bool on) { ops::set_sample_cluster(on ? 8 : 1); }
TEST_F(GpuOps, SampleClusterMatchesCpuSampler) {
  sample_matches_cpu_sampler_with(*this, sample_cluster_of_8, set_sample_cluster_of_8, true);
}

// With the candidate prefilter off (every pass reads the whole row; the tests above pass scratch, so their
// top-k 1, 40 and 100 rows go through the prefilter), and with the block-sort prefilter (ops::sample_merge off;
// the warp merges are the default since session 48).
TEST_F(GpuOps, SamplePrefilterOffMatchesCpuSampler) {
  sample_matches_cpu_sampler_with(*this, ops::sample_prefilter, ops::set_sample_prefilter, false);
}
TEST_F(GpuOps, SampleBlockSortMatchesCpuSampler) {
  sample_matches_cpu_sampler_with(*this, ops::sample_merge, ops::set_sample_merge, false);
}

// The prefilter changes which keys the sampler's passes visit, not what they compute: with it (by the block
// sort and by warp merges) and without it the picks are the same ids, exactly, for every top-k it takes (1 to
// kSampleCandMaxK, and just past it), at the real vocabulary and at sizes around the stretch (a last stretch
// of 1 value, fewer values than top-k in it, a row shorter than one stretch), with ties (logits in steps of
// 1/4), through sample and sample_rows.
TEST_F(GpuOps, SamplePrefilterPicksAsTheWholeRow) {
  const int rows = 8;
  const int32_t K = ops::kSampleCandMaxK;
  const int32_t top_ks[] = {1, 2, 20, 40, K - 1, K, K + 1};
  const int64_t vocabs[] = {kVocab, 2 * ops::kSampleCandStretch + 1, ops::kSampleCandStretch + 30, 1000, 70};
  const float temps[] = {0.3f, 0.8f, 1.5f};
  std::mt19937 rng(91);
  uint64_t seed = 300;
  int compared = 0;
  const bool was = ops::sample_prefilter(), was_merge = ops::sample_merge();
  for (const int64_t V : vocabs) {
    auto dscratch = alloc<unsigned char>(ops::sample_scratch_bytes(rows, V), "scratch");
    auto dout = alloc<int32_t>(size_t(rows), "out");
    for (const int32_t k : top_ks) {
      auto logits = randn(size_t(rows) * size_t(V), uint32_t(seed++), rng() % 2 ? 1.0f : 4.0f);
      if (k % 2 == 0)
        for (auto& x : logits) x = std::round(x * 4.0f) / 4.0f;
      std::vector<float> u(rows);
      for (auto& x : u) x = float(rng() % 1000000) / 1e6f;
      std::vector<ops::SampleParams> rules(rows);
      for (int r = 0; r < rows; ++r)  // sample_rows: the row's rule takes the prefilter or not, mixed
        rules[size_t(r)] = {temps[rng() % 3], r % 3 == 2 ? 0 : k, r % 2 ? 0.9f : 1.0f, r % 4 == 1 ? 0.05f : 0.0f};
      const ops::SampleParams p{temps[rng() % 3], k, 0.95f, 0.05f};
      auto dl = upload(logits, "logits");
      auto du = upload(u, "u");
      auto drules = upload(rules, "rules");
      std::array<std::vector<int32_t>, 2> got[3];  // [off, prefilter, prefilter by merges][sample, sample_rows]
      for (int on = 0; on < 3; ++on) {
        ops::set_sample_prefilter(on >= 1);
        ops::set_sample_merge(on == 2);
        got[on] = sample_both_ways(*this, dl, rows, V, p, drules, du, dscratch, dout);
      }
      EXPECT_EQ(got[1][0], got[0][0]) << "sample, vocabulary " << V << ", top-k " << k;
      EXPECT_EQ(got[1][1], got[0][1]) << "sample_rows, vocabulary " << V << ", top-k " << k;
      EXPECT_EQ(got[2][0], got[0][0]) << "sample, merges, vocabulary " << V << ", top-k " << k;
      EXPECT_EQ(got[2][1], got[0][1]) << "sample_rows, merges, vocabulary " << V << ", top-k " << k;
      compared += 4 * rows;
    }
  }
  ops::set_sample_prefilter(was);
  ops::set_sample_merge(was_merge);
  std::printf("[prefilter] %d picks compared\n", compared);
}

// sample_rows: a rule per row in one launch (a batch of requests with different parameters) against the CPU
// Sampler with each row's own parameters, at the real vocabulary; the same boundary allowance as above.
TEST_F(GpuOps, SampleRowsFollowsEachRowsRule) {
  const int rows = 16;
  const int64_t V = kVocab;
  std::mt19937 rng(82);
  const float temps[] = {0.0f, 0.5f, 0.8f, 1.0f, 1.6f};
  const int32_t top_ks[] = {0, 1, 40, 500};
  const float top_ps[] = {1.0f, 0.95f, 0.6f};
  const float min_ps[] = {0.0f, 0.05f};
  std::vector<ops::SampleParams> rules(rows);
  for (auto& r : rules) r = {temps[rng() % 5], top_ks[rng() % 4], top_ps[rng() % 3], min_ps[rng() % 2]};
  const auto logits = randn(size_t(rows) * size_t(V), 83, 2.0f);
  std::vector<float> u(rows);
  std::vector<double> ud(rows);
  std::vector<int32_t> want(rows);
  for (int r = 0; r < rows; ++r) {
    SamplingParams sp;
    sp.temperature = rules[size_t(r)].temperature;
    sp.top_k = rules[size_t(r)].top_k;
    sp.top_p = rules[size_t(r)].top_p;
    sp.min_p = rules[size_t(r)].min_p;
    sp.seed = 500 + uint64_t(r);
    Sampler s(sp, int32_t(V));
    want[size_t(r)] = s.sample(logits.data() + size_t(r) * size_t(V));
    Rng draw(sp.seed);
    ud[size_t(r)] = sp.temperature <= 0.0f ? 0.0 : draw.uniform();
    u[size_t(r)] = float(ud[size_t(r)]);
  }
  auto dl = upload(logits, "logits");
  auto du = upload(u, "u");
  auto drules = upload(rules, "rules");
  auto dout = alloc<int32_t>(size_t(rows), "out");
  auto dscratch = alloc<unsigned char>(ops::sample_scratch_bytes(rows, V), "scratch");
  ops::sample_rows(dl.as<float>(), rows, V, drules.as<ops::SampleParams>(), du.as<float>(), dscratch.data(),
                   dout.as<int32_t>(), stream());
  const auto got = download<int32_t>(dout, size_t(rows));
  int differ = 0;
  for (int r = 0; r < rows; ++r) {
    if (got[size_t(r)] == want[size_t(r)]) continue;
    ++differ;
    EXPECT_TRUE(near_boundary(logits.data() + size_t(r) * size_t(V), V, rules[size_t(r)], ud[size_t(r)], 1e-6))
        << "row " << r << ": gpu " << got[size_t(r)] << " cpu " << want[size_t(r)];
  }
  EXPECT_LE(differ, 1);
  EXPECT_THROW(
      ops::sample_rows(dl.as<float>(), 1, V, nullptr, du.as<float>(), nullptr, dout.as<int32_t>(), stream()),
      strata::Error);
}

// Four equal logits: probabilities exactly 1/4, cumulative sums exactly 0.25, 0.5, 0.75, 1 in the id
// order; the draw takes the first candidate whose cumulative sum is strictly above u (Sampler's u < cum).
TEST_F(GpuOps, SampleDrawIsStrictlyBelowTheCumulativeSum) {
  const std::vector<float> u = {0.0f, 0.2499f, 0.25f, 0.5f, 0.74f, 0.75f, 0.99999994f};
  const std::vector<int32_t> want = {0, 0, 1, 2, 2, 3, 3};
  const int64_t rows = int64_t(u.size()), vocab = 4;
  std::vector<float> logits(size_t(rows * vocab), 1.5f);
  auto dl = upload(logits, "logits");
  auto du = upload(u, "u");
  auto dout = alloc<int32_t>(size_t(rows), "out");
  ops::sample(dl.as<float>(), rows, vocab, ops::SampleParams{1.0f, 0, 1.0f, 0.0f}, du.as<float>(), nullptr,
              dout.as<int32_t>(), stream());
  EXPECT_EQ(download<int32_t>(dout, size_t(rows)), want);
  // top-k 2 of the same row: probabilities 1/2 over ids 0 and 1.
  ops::sample(dl.as<float>(), rows, vocab, ops::SampleParams{1.0f, 2, 1.0f, 0.0f}, du.as<float>(), nullptr,
              dout.as<int32_t>(), stream());
  EXPECT_EQ(download<int32_t>(dout, size_t(rows)), (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 1}));
}

TEST_F(GpuOps, SampleRejectsBadParams) {
  ops::SampleParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(ops::sample(nullptr, 1, 10, p, nullptr, nullptr, nullptr, stream()), strata::Error);
  p = {};
  p.min_p = 1.5f;
  EXPECT_THROW(ops::sample(nullptr, 1, 10, p, nullptr, nullptr, nullptr, stream()), strata::Error);
}

// ban_tokens against cpu::ban_tokens at the real vocabulary: flagged rows only (and every row without
// flags), ids out of range skipped, repeated ids, the rest of each row untouched (bit for bit); then the
// greedy pick of a banned row is the best id outside the ban.
TEST_F(GpuOps, BanTokensMatchesCpu) {
  const int64_t rows = 5, V = kVocab;
  const auto logits = randn(size_t(rows * V), 91, 2.0f);
  const std::vector<int32_t> ban = {7, int32_t(V - 1), -3, int32_t(V), 7, 151643, 0};
  const std::vector<uint8_t> flags = {1, 0, 1, 1, 0};
  for (const bool all_rows : {false, true}) {
    std::vector<float> want = logits;
    cpu::ban_tokens(want.data(), rows, V, ban.data(), int32_t(ban.size()), all_rows ? nullptr : flags.data());
    auto dl = upload(logits, "logits");
    auto db = upload(ban, "ban");
    auto dfl = upload(flags, "flags");
    ops::ban_tokens(dl.as<float>(), rows, V, db.as<int32_t>(), int32_t(ban.size()),
                    all_rows ? nullptr : dfl.as<uint8_t>(), stream());
    const auto got = download<float>(dl, size_t(rows * V));
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "all rows " << all_rows;
    int n_inf = 0;
    for (float x : got) n_inf += std::isinf(x) ? 1 : 0;
    EXPECT_EQ(n_inf, (all_rows ? 5 : 3) * 4) << "4 distinct ids in range a banned row";
  }
  // Greedy over a row whose best logit is banned picks the runner-up.
  std::vector<float> row(size_t(V), 0.0f);
  row[10] = 5.0f;
  row[20] = 4.0f;
  const std::vector<int32_t> ten = {10};
  auto dl = upload(row, "row");
  auto db = upload(ten, "ban");
  auto dout = alloc<int32_t>(1, "out");
  ops::ban_tokens(dl.as<float>(), 1, V, db.as<int32_t>(), 1, nullptr, stream());
  ops::argmax(dl.as<float>(), 1, V, dout.as<int32_t>(), stream());
  EXPECT_EQ(download<int32_t>(dout, 1), std::vector<int32_t>{20});
  EXPECT_THROW(ops::ban_tokens(nullptr, -1, V, nullptr, 1, nullptr, stream()), strata::Error);
}

}  // namespace
