// moe_experts_grouped (cuda/moe_kernels.cuh, the prefill path), its product kernels (2, 1: mma.sync; 0: WMMA),
// vs a CPU reference from matmul Exact, vs the per-pair kernels moe_gate_up + moe_down on the same data and
// vs each other: 16 experts, 10 resident in scattered slots, k 8, n 1 / 40 / 300 (up to 150 pairs per
// expert: several 32- and 64-pair tiles), token 1 routed only to non-resident experts (two of them twice),
// so its output must be exact zeros. Gate and up of different types take the gate pass then the up pass.
// Error: max |gpu - ref| over a token's outputs / max |ref| of that token. The grouped path rounds x, the
// weights and h to bf16 (unit roundoff 2^-9 = 2e-3) before each product; a dot of random-signed terms
// then errs by a few u of its magnitude, through gate/up and down: tolerance 3e-2 (the per-pair kernels
// are f32 and stay below 1e-4 in test_moe_kernels). Also: bit-identical on a second run; the two mma
// kernels (2: weights staged in shared memory, in rings of 3 and of 2 stages; 1: read in place) give the
// same bits; accumulate adds the same bits into out; scratch-size errors; and the fallback for unaligned
// slots equals moe_gate_up + moe_down bit for bit (both kernel settings).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"
#include "cpu/thread_pool.h"
#include "cuda/moe_kernels.cuh"
#include "gpu_test_util.h"
#include "moe_test_util.h"
#include "quant/matmul.h"

namespace {

using namespace strata;
namespace cm = strata::cuda::moe;

struct GroupedCase {
  GgmlType gate, up, down;
  int64_t extra_offset;  // added to the tensors' offsets and the slot size (odd: the fallback path)
};

class CudaMoeGrouped : public test::GpuKernelTest {
 protected:
  void run(const GroupedCase& mc, std::initializer_list<int64_t> ns, double tol) {
    constexpr int k = 8;
    std::mt19937 rng(4321 + 7 * static_cast<int>(mc.down) + static_cast<int>(mc.extra_offset));
    ThreadPool& pool = test::test_pool();
    test::MoeTestLayer L = test::make_moe_test_layer(mc.gate, mc.up, mc.down, mc.extra_offset, rng);
    const int64_t n_embd = L.n_embd, n_ff = L.n_ff;
    const int n_expert = L.n_expert;
    cm::ExpertLayerView& v = L.view;
    const auto &G = L.G, &U = L.U, &D = L.D;
    const auto& table = L.table;
    const auto& slots = L.slots;
    auto d_slots = upload_vec(slots);
    auto d_table = upload_vec(table);
    v.slots = d_slots.ptr<uint8_t>();
    // Aligned cases must take the grouped path (else this test would only check the fallback).
    EXPECT_EQ(cm::moe_grouped_supported(v), mc.extra_offset % 2 == 0);
    const int64_t max_n = *std::max_element(ns.begin(), ns.end());
    const size_t scratch_bytes = cm::moe_grouped_scratch_bytes(v, n_expert, max_n, k);
    auto scratch = output(scratch_bytes, 0xFF);

    for (int64_t n : ns) {
      std::vector<int32_t> ids;
      std::vector<float> wts;
      test::make_moe_test_routing(n, k, rng, ids, wts);
      const auto x = test::random_acts(n * n_embd, rng);

      // CPU reference (as in test_moe_kernels), pairs in parallel, summed per token in j order.
      std::vector<float> d_ref(n * k * n_embd, 0.f), out_ref(n * n_embd, 0.f);
      pool.parallel_for(n * k, 8, [&](int64_t p0, int64_t p1, int) {
        std::vector<float> g(n_ff), u(n_ff), hr(n_ff);
        ThreadPool serial(1);
        for (int64_t p = p0; p < p1; ++p) {
          const int e = ids[p];
          if (table[e] < 0) continue;
          const float* xr = x.data() + (p / k) * n_embd;
          matmul(mc.gate, G[e].data(), n_ff, n_embd, xr, 1, g.data(), MatmulMode::Exact, serial);
          matmul(mc.up, U[e].data(), n_ff, n_embd, xr, 1, u.data(), MatmulMode::Exact, serial);
          for (int64_t r = 0; r < n_ff; ++r) hr[r] = g[r] / (1.f + std::exp(-g[r])) * u[r];
          matmul(mc.down, D[e].data(), n_embd, n_ff, hr.data(), 1, d_ref.data() + p * n_embd, MatmulMode::Exact,
                 serial);
        }
      });
      for (int64_t p = 0; p < n * k; ++p)
        if (table[ids[p]] >= 0)
          for (int64_t r = 0; r < n_embd; ++r) out_ref[(p / k) * n_embd + r] += wts[p] * d_ref[p * n_embd + r];

      auto d_ids = upload_vec(ids);
      auto d_wts = upload_vec(wts);
      auto d_x = upload_vec(x);
      auto d_old = output(n * n_embd * 4, 0xFF);
      auto d_h = output(n * k * n_ff * 4, 0xFF);
      // kernel 2 (mma, weights staged), 1 (mma, the same bits) and 0 (WMMA)
      auto grouped = [&](int which, int stages = 3) {
        cm::set_moe_grouped_kernel(which);
        cm::set_moe_grouped_stages(stages);
        auto d_out = output(n * n_embd * 4, 0xFF);
        cm::moe_experts_grouped(v, d_table.ptr<int32_t>(), n_expert, d_x.ptr<float>(), d_ids.ptr<int32_t>(),
                                d_wts.ptr<float>(), n, k, d_out.ptr<float>(), scratch.ptr(), scratch_bytes, stream());
        cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_x.span(), d_ids.span(), d_wts.span()},
                          {d_out.span(), scratch.span()});
        return download<float>(d_out, n * n_embd);
      };
      const auto out = grouped(2);
      const auto again = grouped(2);
      // accumulate: y0 + the sum, the same f32 addition as the sum written apart and then added
      const auto y0 = test::random_acts(n * n_embd, rng);
      auto d_acc = upload_vec(y0);
      cm::moe_experts_grouped(v, d_table.ptr<int32_t>(), n_expert, d_x.ptr<float>(), d_ids.ptr<int32_t>(),
                              d_wts.ptr<float>(), n, k, d_acc.ptr<float>(), scratch.ptr(), scratch_bytes, stream(),
                              /*accumulate=*/true);
      cuda::note_launch(dev->compute(),
                        {d_slots.span(), d_table.span(), d_x.span(), d_ids.span(), d_wts.span(), d_acc.span()},
                        {d_acc.span(), scratch.span()});
      const auto acc = download<float>(d_acc, n * n_embd);
      int64_t acc_bad = 0;
      for (int64_t i = 0; i < n * n_embd; ++i) {
        const float want = y0[size_t(i)] + out[size_t(i)];
        acc_bad += std::memcmp(&acc[size_t(i)], &want, 4) != 0;
      }
      const auto out2 = grouped(1);
      const auto out3 = grouped(2, 2);
      const auto wmma = grouped(0);
      cm::set_moe_grouped_kernel(2);
      cm::set_moe_grouped_stages(3);
      cm::moe_gate_up(v, d_table.ptr<int32_t>(), d_x.ptr<float>(), d_ids.ptr<int32_t>(), n, k, d_h.ptr<float>(),
                      stream());
      cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_x.span(), d_ids.span()}, {d_h.span()});
      cm::moe_down(v, d_table.ptr<int32_t>(), d_h.ptr<float>(), d_ids.ptr<int32_t>(), d_wts.ptr<float>(), n, k,
                   d_old.ptr<float>(), stream());
      cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_h.span(), d_ids.span(), d_wts.span()},
                        {d_old.span()});
      const auto old = download<float>(d_old, n * n_embd);

      const std::string what = std::string(type_name(mc.gate)) + "/" + std::string(type_name(mc.up)) + "/" +
                               std::string(type_name(mc.down)) + " offset+" + std::to_string(mc.extra_offset) +
                               " n " + std::to_string(n);
      auto token_err = [&](const std::vector<float>& a, const std::vector<float>& b, int64_t t) {
        double scale = 0, err = 0;
        for (int64_t r = 0; r < n_embd; ++r) {
          const double u = a[t * n_embd + r], w = b[t * n_embd + r];
          scale = std::max(scale, std::fabs(w));
          err = std::max(err, std::isfinite(u) ? std::fabs(u - w) : 1e30);
        }
        return std::pair{err, scale};
      };
      // worst over tokens of max |a - b| / max |b| (token 1: a must be exact zeros)
      auto worst = [&](const std::vector<float>& a, const std::vector<float>& b, const char* vs) {
        double w = 0;
        for (int64_t t = 0; t < n; ++t) {
          const auto [e, sc] = token_err(a, b, t);
          if (t == 1) {
            EXPECT_EQ(token_err(a, out_ref, t).first, 0.0) << what << " " << vs << ": token 1 has no resident expert";
            continue;
          }
          w = std::max(w, e / std::max(sc, 1e-30));
        }
        return w;
      };
      const double worst_ref = worst(out, out_ref, "mma"), worst_old = worst(out, old, "mma vs per-pair");
      const double wmma_ref = worst(wmma, out_ref, "wmma"), mma_wmma = worst(out, wmma, "mma vs wmma");
      EXPECT_LT(worst_ref, tol) << what << ": mma kernel vs CPU";
      EXPECT_LT(wmma_ref, tol) << what << ": wmma kernel vs CPU";
      EXPECT_LT(worst_old, tol) << what << ": vs moe_gate_up + moe_down";
      EXPECT_LT(mma_wmma, tol) << what << ": mma vs wmma kernel";
      EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * 4), 0) << what << ": not deterministic";
      EXPECT_EQ(acc_bad, 0) << what << ": accumulate is not y0 + the sum";
      EXPECT_EQ(std::memcmp(out.data(), out2.data(), out.size() * 4), 0) << what << ": kernels 2 and 1 differ";
      EXPECT_EQ(std::memcmp(out.data(), out3.data(), out.size() * 4), 0) << what << ": rings of 3 and 2 differ";
      if (mc.extra_offset % 2 == 1)  // unaligned slots: the fallback is the per-pair kernels themselves
        for (const auto* o : {&out, &wmma})
          EXPECT_EQ(std::memcmp(o->data(), old.data(), out.size() * 4), 0) << what << ": fallback != per-pair kernels";
      std::printf("moe grouped %s: mma err vs CPU %.3g, vs per-pair kernels %.3g, vs wmma %.3g; wmma vs CPU %.3g "
                  "(tol %.1g)\n",
                  what.c_str(), worst_ref, worst_old, mma_wmma, wmma_ref, tol);
    }
  }
};

TEST_F(CudaMoeGrouped, Q4KGateUpQ6KDown) { run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, 0}, {1, 40, 300}, 3e-2); }

TEST_F(CudaMoeGrouped, Q4KAll) { run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K, 0}, {33, 128}, 3e-2); }

TEST_F(CudaMoeGrouped, DifferentGateAndUpTypes) {  // gate pass then up pass
  run({GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q4_0, 0}, {7, 64}, 3e-2);
}

TEST_F(CudaMoeGrouped, Q40All) { run({GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0, 0}, {64, 200}, 3e-2); }
TEST_F(CudaMoeGrouped, Q40X8All) { run({GgmlType::Q4_0_X8, GgmlType::Q4_0_X8, GgmlType::Q4_0_X8, 0}, {64, 200}, 3e-2); }

TEST_F(CudaMoeGrouped, Q5KGateUpIQ4XSDown) { run({GgmlType::Q5_K, GgmlType::Q5_K, GgmlType::IQ4_XS, 0}, {96}, 3e-2); }

TEST_F(CudaMoeGrouped, Q80All) { run({GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0, 0}, {48}, 3e-2); }

TEST_F(CudaMoeGrouped, FloatExperts) { run({GgmlType::F32, GgmlType::F16, GgmlType::BF16, 0}, {50}, 3e-2); }

TEST_F(CudaMoeGrouped, UnalignedSlotsFallBack) {  // odd offsets: per-pair kernels, bit-identical
  run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, 1}, {20}, 1e-4);
}

TEST_F(CudaMoeGrouped, ScratchAndViewErrors) {
  auto buf = output(1 << 20);
  cm::ExpertLayerView v;
  v.slots = buf.ptr<uint8_t>();
  v.n_embd = 256, v.n_ff = 256;
  v.gate_type = v.up_type = v.down_type = GgmlType::Q4_K;
  v.slot_bytes = 3 * 36864;
  v.up_off = 36864, v.down_off = 2 * 36864;
  const int32_t* ip = buf.ptr<int32_t>();
  float* fp = buf.ptr<float>();
  const size_t need = cm::moe_grouped_scratch_bytes(v, 8, 4, 2);
  EXPECT_GT(need, size_t(4 * 2 * (256 + 256) * 4));
  // scratch sized for 4 tokens, asked for 5
  EXPECT_THROW(cm::moe_experts_grouped(v, ip, 8, fp, ip, fp, 5, 2, fp, buf.ptr(), need, stream()), Error);
  EXPECT_THROW(cm::moe_experts_grouped(v, ip, 8, fp, ip, fp, 4, 2, fp, nullptr, need, stream()), Error);
  EXPECT_THROW(cm::moe_experts_grouped(v, ip, 0, fp, ip, fp, 4, 2, fp, buf.ptr(), need, stream()), Error);
  v.down_type = GgmlType::TQ1_0;  // no GPU kernel
  EXPECT_THROW(cm::moe_experts_grouped(v, ip, 8, fp, ip, fp, 4, 2, fp, buf.ptr(), need, stream()), Error);
  EXPECT_THROW(cm::moe_grouped_scratch_bytes(v, 0, 4, 2), Error);
}

}  // namespace
