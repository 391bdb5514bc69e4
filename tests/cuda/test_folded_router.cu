// The folded router (cuda/q8_kernels.cuh) vs its CPU references (cuda/host/folded_router_ref.h), at the
// Qwen3-30B-A3B decode shapes (n_embd 2048, n_att 4096, 128 experts, k 8, n_ff 768, Q4_K):
//  * fold_router: within 1e-6 of the sum of |terms| (both sum in double, r in order);
//  * the fold is the router through the norm weight and wo: fold . [x; att] = (router * g) . (x + wo . att)
//    in double, within 1e-4 of the sum of |terms|;
//  * wo_router: mid bit-identical to q8::matvec accumulating into a copy of x; the partial sums of mid^2 add
//    up to the reference's total (1e-5 relative); raw within 1e-5 of the sum of |fold . [x; att]| terms;
//  * moe_gate_up_routed: the ids of the reference (a 128-value top 8, ties impossible with random data),
//    weights within 1e-5, and hq / hds equal to q8::moe_gate_up run on the reference's activations and ids
//    (codes may differ by 1 where the scale s rounds differently: at most 1% of them); with predicted slots
//    (a hint: none, a wrong one, the right ones reordered) the same bits;
//  * moe_down with a separate residual: the same bits as in place on a copy of it;
//  * deterministic (the whole chain twice gives the same bits); 60 experts, k 4 (keys padded to 64);
//  * both ways to the top k (gate_up_warp_topk) and the blocks-per-SM caps: the same bits;
//  * unsupported shapes are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/host/folded_router_ref.h"
#include "cuda/host/q8_reference.h"
#include "cuda/moe_kernels.cuh"
#include "cuda/q8_kernels.cuh"
#include "gpu_test_util.h"
#include "quant/dequant.h"

namespace {

using namespace strata;
namespace q8 = strata::cuda::q8;
namespace q8ref = strata::cuda::q8ref;
using q8ref::Q8Ds;

class CudaFoldedRouter : public test::GpuKernelTest {
 protected:
  static constexpr int64_t n_embd = 2048, n_att = 4096, n_ff = 768;
  static constexpr int n_slots = 6;

  void run(int n_expert, int k, uint32_t seed, GgmlType wt = GgmlType::Q4_K) {
    std::mt19937 rng(seed);
    const std::string what = std::to_string(n_expert) + " experts, k " + std::to_string(k) + ", " + std::string(type_name(wt));
    const int64_t wrb = int64_t(row_bytes(wt, n_att));
    // Weights: wo, the router, the ffn norm weight; activations: x (residual stream) and att.
    const auto wo = test::random_weights(wt, n_embd, n_att, rng);
    std::vector<float> wo_f32(size_t(n_embd * n_att));
    for (int64_t r = 0; r < n_embd; ++r) dequantize_row(wt, wo.data() + r * wrb, wo_f32.data() + r * n_att, n_att);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> router(size_t(n_expert * n_embd)), g(n_embd), x(n_embd), att(n_att);
    for (auto& v : router) v = 0.05f * nd(rng);
    for (auto& v : g) v = 1.f + 0.2f * nd(rng);
    for (auto& v : x) v = nd(rng);
    for (auto& v : att) v = 0.5f * nd(rng);
    std::vector<int8_t> attq(n_att);
    std::vector<Q8Ds> attds(n_att / 32);
    q8ref::quantize(att.data(), 1, n_att, attq.data(), attds.data());

    // fold_router.
    auto d_router = upload_vec(router);
    auto d_g = upload_vec(g);
    auto d_wof = upload_vec(wo_f32);
    const int64_t len = n_embd + n_att;
    auto d_fold = output(size_t(n_expert * len) * 4);
    q8::fold_router(d_router.ptr<float>(), d_g.ptr<float>(), d_wof.ptr<float>(), n_expert, n_embd, n_att,
                    d_fold.ptr<float>(), stream());
    cuda::note_launch(dev->compute(), {d_router.span(), d_g.span(), d_wof.span()}, {d_fold.span()});
    const auto fold = download<float>(d_fold, size_t(n_expert * len));
    std::vector<float> fold_ref(fold.size());
    q8ref::fold_router(router.data(), g.data(), wo_f32.data(), n_expert, n_embd, n_att, fold_ref.data());
    int64_t fold_bad = 0;
    for (int e = 0; e < n_expert; ++e)
      for (int64_t i = 0; i < n_att; ++i) {
        double mag = 0;
        for (int64_t r = 0; r < n_embd; r += 1) mag += std::fabs(double(router[e * n_embd + r]) * g[r] * wo_f32[r * n_att + i]);
        const size_t at = size_t(e * len + n_embd + i);
        fold_bad += std::fabs(double(fold[at]) - fold_ref[at]) > 1e-6 * mag + 1e-30;
        if (i == 0) {
          for (int64_t r = 0; r < n_embd; ++r) fold_bad += !test::same_bits(fold[size_t(e * len + r)], fold_ref[size_t(e * len + r)]);
        }
        if (e > 3 && i > 64) break;  // the magnitudes are slow on the host: all columns of 4 experts, 65 of the rest
      }
    EXPECT_EQ(fold_bad, 0) << what << ": fold_router off its reference";

    // The fold's meaning, in double on a few experts: fold . [x; att] == (router * g) . (x + wo . att).
    for (int e : {0, n_expert / 2, n_expert - 1}) {
      double lhs = 0, rhs = 0, mag = 0;
      for (int64_t c = 0; c < len; ++c) lhs += double(fold[size_t(e * len + c)]) * (c < n_embd ? x[c] : att[c - n_embd]);
      for (int64_t r = 0; r < n_embd; ++r) {
        double h = x[r];
        for (int64_t i = 0; i < n_att; ++i) h += double(wo_f32[r * n_att + i]) * att[i];
        rhs += double(router[e * n_embd + r]) * g[r] * h;
        mag += std::fabs(double(router[e * n_embd + r]) * g[r] * h);
      }
      EXPECT_LE(std::fabs(lhs - rhs), 1e-4 * mag) << what << ": expert " << e << " fold . [x; att] " << lhs
                                                  << " vs router . (g * h) " << rhs;
    }

    // wo_router.
    ASSERT_TRUE(q8::wo_router_supported(wt, n_embd, n_att, n_expert));
    const int64_t n_ss = q8::wo_router_ss_count(wt, n_embd, n_att, wrb);
    ASSERT_GT(n_ss, 0);
    auto d_wo = upload_vec(wo);
    auto d_attq = upload_vec(attq);
    auto d_attds = upload_vec(attds);
    auto d_att = upload_vec(att);
    auto d_x = upload_vec(x);
    auto d_mid = output(n_embd * 4);
    auto d_raw = output(size_t(n_expert) * 4);
    auto d_ss = output(size_t(n_ss) * 4);
    auto wo_router_gpu = [&] {
      q8::wo_router(wt, d_wo.ptr(), n_embd, n_att, wrb, d_attq.ptr<int8_t>(), d_attds.ptr<float2>(),
                    d_att.ptr<float>(), d_x.ptr<float>(), d_fold.ptr<float>(), n_expert, d_mid.ptr<float>(),
                    d_raw.ptr<float>(), d_ss.ptr<float>(), stream());
      cuda::note_launch(dev->compute(), {d_wo.span(), d_attq.span(), d_attds.span(), d_att.span(), d_x.span(),
                                         d_fold.span()}, {d_mid.span(), d_raw.span(), d_ss.span()});
    };
    wo_router_gpu();
    const auto mid = download<float>(d_mid, n_embd);
    const auto raw = download<float>(d_raw, n_expert);
    const auto ss = download<float>(d_ss, n_ss);
    auto d_y = upload_vec(x);  // q8::matvec accumulating into a copy of x
    q8::matvec(wt, d_wo.ptr(), n_embd, n_att, wrb, d_attq.ptr<int8_t>(), d_attds.ptr<float2>(), 1, d_y.ptr<float>(),
               /*accumulate=*/true, stream());
    cuda::note_launch(dev->compute(), {d_wo.span(), d_attq.span(), d_attds.span(), d_y.span()}, {d_y.span()});
    const auto y = download<float>(d_y, n_embd);
    EXPECT_EQ(std::memcmp(mid.data(), y.data(), size_t(n_embd) * 4), 0) << what << ": mid differs from matvec's x += wo . att";
    std::vector<float> mid_ref(n_embd), raw_ref(n_expert);
    float ss_ref = 0;
    q8ref::wo_router(wt, wo.data(), n_embd, n_att, wrb, attq.data(), attds.data(), att.data(), x.data(), fold.data(),
                     n_expert, mid_ref.data(), raw_ref.data(), &ss_ref);
    double ss_sum = 0;
    for (float v : ss) ss_sum += v;
    EXPECT_NEAR(ss_sum, ss_ref, 1e-5 * ss_ref) << what << ": the partial sums of mid^2";
    int64_t raw_bad = 0;
    for (int e = 0; e < n_expert; ++e) {
      double mag = 0;
      for (int64_t c = 0; c < len; ++c) mag += std::fabs(double(fold[size_t(e * len + c)]) * (c < n_embd ? x[c] : att[c - n_embd]));
      raw_bad += !(std::fabs(double(raw[e]) - raw_ref[e]) <= 1e-5 * mag);
    }
    EXPECT_EQ(raw_bad, 0) << what << ": raw logits off the reference";

    // moe_gate_up_routed: experts in 6 slots, expert e in slot e % 6 (routing, not the products, is tested).
    cuda::moe::ExpertLayerView v;
    const int64_t grb = int64_t(row_bytes(wt, n_embd)), drb = int64_t(row_bytes(wt, n_ff));
    v.gate_type = v.up_type = v.down_type = wt;
    v.gate_off = 0, v.up_off = grb * n_ff, v.down_off = 2 * grb * n_ff;
    v.slot_bytes = v.down_off + drb * n_embd;
    v.n_embd = n_embd, v.n_ff = n_ff;
    std::vector<uint8_t> slots(size_t(v.slot_bytes * n_slots));
    for (int s = 0; s < n_slots; ++s) {
      uint8_t* base = slots.data() + s * v.slot_bytes;
      const auto gw = test::random_weights(wt, n_ff, n_embd, rng), uw = test::random_weights(wt, n_ff, n_embd, rng),
                 dw = test::random_weights(wt, n_embd, n_ff, rng);
      std::copy(gw.begin(), gw.end(), base + v.gate_off);
      std::copy(uw.begin(), uw.end(), base + v.up_off);
      std::copy(dw.begin(), dw.end(), base + v.down_off);
    }
    std::vector<int32_t> table(n_expert);
    for (int e = 0; e < n_expert; ++e) table[e] = e % n_slots;
    auto d_slots = upload_vec(slots);
    auto d_table = upload_vec(table);
    v.slots = d_slots.ptr<uint8_t>();
    v.n_expert = n_expert;
    q8ref::ExpertView hv;
    hv.slots = slots.data(), hv.slot_bytes = v.slot_bytes, hv.gate_type = hv.up_type = hv.down_type = wt;
    hv.gate_off = v.gate_off, hv.up_off = v.up_off, hv.down_off = v.down_off, hv.n_embd = n_embd, hv.n_ff = n_ff;

    const float eps = 1e-6f;
    auto d_ids = output(size_t(k) * 4);
    auto d_wts = output(size_t(k) * 4);
    auto d_hq = output(size_t(k * n_ff));
    auto d_hds = output(size_t(k * n_ff / 32) * sizeof(float2));
    const q8::FoldedRoute fr{d_mid.ptr<float>(), d_g.ptr<float>(), eps, d_ss.ptr<float>(), int(n_ss),
                             d_raw.ptr<float>(), n_expert, true, d_ids.ptr<int32_t>(), d_wts.ptr<float>()};
    auto gate_up_gpu = [&] {
      q8::moe_gate_up_routed(v, d_table.ptr<int32_t>(), fr, k, d_hq.ptr<int8_t>(), d_hds.ptr<float2>(), stream());
      cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_mid.span(), d_g.span(), d_ss.span(),
                                         d_raw.span()}, {d_hq.span(), d_hds.span(), d_ids.span(), d_wts.span()});
    };
    gate_up_gpu();
    const auto ids = download<int32_t>(d_ids, k);
    const auto wts = download<float>(d_wts, k);
    const auto hq = download<int8_t>(d_hq, k * n_ff);
    const auto hds = download<float2>(d_hds, k * n_ff / 32);
    {
      // A prediction (expert_predict mode 4's hint) changes no bit: no slot, a wrong slot, the right slots
      // in another order.
      std::vector<int32_t> pred(k);
      for (int j = 0; j < k; ++j) pred[j] = j == 0 ? -1 : j == 1 ? (table[ids[0]] + 1) % n_slots : table[ids[(j + 1) % k]];
      auto d_pred = upload_vec(pred);
      q8::FoldedRoute fp = fr;
      fp.pred_slots = d_pred.ptr<int32_t>();
      auto d_hq_p = output(size_t(k * n_ff), 0x55);
      auto d_hds_p = output(size_t(k * n_ff / 32) * sizeof(float2), 0x55);
      auto d_ids_p = output(size_t(k) * 4, 0x55);
      auto d_wts_p = output(size_t(k) * 4, 0x55);
      fp.ids = d_ids_p.ptr<int32_t>(), fp.wts = d_wts_p.ptr<float>();
      q8::moe_gate_up_routed(v, d_table.ptr<int32_t>(), fp, k, d_hq_p.ptr<int8_t>(), d_hds_p.ptr<float2>(), stream());
      cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_mid.span(), d_g.span(), d_ss.span(),
                                         d_raw.span(), d_pred.span()},
                        {d_hq_p.span(), d_hds_p.span(), d_ids_p.span(), d_wts_p.span()});
      EXPECT_EQ(download<int32_t>(d_ids_p, k), ids) << what << ": ids with a prediction";
      const auto wts_p = download<float>(d_wts_p, k);
      const auto hq_p = download<int8_t>(d_hq_p, k * n_ff);
      const auto hds_p = download<float2>(d_hds_p, k * n_ff / 32);
      EXPECT_EQ(std::memcmp(wts_p.data(), wts.data(), size_t(k) * 4), 0) << what << ": weights with a prediction";
      EXPECT_EQ(std::memcmp(hq_p.data(), hq.data(), size_t(k * n_ff)), 0) << what << ": h codes with a prediction";
      EXPECT_EQ(std::memcmp(hds_p.data(), hds.data(), size_t(k * n_ff / 32) * sizeof(float2)), 0)
          << what << ": h scales with a prediction";
    }
    std::vector<int32_t> ids_ref(k);
    std::vector<float> wts_ref(k);
    std::vector<int8_t> hq_ref(k * n_ff), xq_ref(n_embd);
    std::vector<Q8Ds> hds_ref(k * n_ff / 32), xds_ref(n_embd / 32);
    const q8ref::FoldedRoute hr{mid.data(), g.data(), eps, ss.data(), int(n_ss), raw.data(), n_expert, true,
                                ids_ref.data(), wts_ref.data()};
    q8ref::moe_gate_up_routed(hv, table.data(), hr, k, hq_ref.data(), hds_ref.data(), xq_ref.data(), xds_ref.data());
    EXPECT_EQ(ids, ids_ref) << what << ": the chosen experts";
    for (int j = 0; j < k; ++j) EXPECT_NEAR(wts[j], wts_ref[j], 1e-5) << what << ": weight " << j;
    // q8::moe_gate_up on the reference's activations and ids.
    auto d_xq = upload_vec(xq_ref);
    auto d_xds = upload_vec(xds_ref);
    auto d_ids_ref = upload_vec(ids_ref);
    auto d_hq2 = output(size_t(k * n_ff));
    auto d_hds2 = output(size_t(k * n_ff / 32) * sizeof(float2));
    q8::moe_gate_up(v, d_table.ptr<int32_t>(), d_xq.ptr<int8_t>(), d_xds.ptr<float2>(), d_ids_ref.ptr<int32_t>(), 1, k,
                    d_hq2.ptr<int8_t>(), d_hds2.ptr<float2>(), stream());
    cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_xq.span(), d_xds.span(), d_ids_ref.span()},
                      {d_hq2.span(), d_hds2.span()});
    const auto hq2 = download<int8_t>(d_hq2, k * n_ff);
    int64_t diff = 0, big = 0;
    for (int64_t i = 0; i < k * n_ff; ++i) {
      const int d = std::abs(int(hq[i]) - int(hq2[i]));
      diff += d != 0, big += d > 1;
    }
    EXPECT_EQ(big, 0) << what << ": h codes off moe_gate_up's on the reference's activations by more than 1";
    EXPECT_LE(diff, k * n_ff / 100) << what << ": h codes differing from moe_gate_up's on the reference's activations";
    std::printf("folded router %s: %lld of %lld h codes differ by 1 from gate_up on the reference's activations\n",
                what.c_str(), (long long)diff, (long long)(k * n_ff));

    // moe_down with the residual apart == in place on a copy of it.
    auto d_out = output(n_embd * 4, 0x7F);
    q8::moe_down(v, d_table.ptr<int32_t>(), d_hq.ptr<int8_t>(), d_hds.ptr<float2>(), d_ids.ptr<int32_t>(),
                 d_wts.ptr<float>(), 1, k, d_out.ptr<float>(), stream(), false, d_mid.ptr<float>());
    cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_hq.span(), d_hds.span(), d_ids.span(),
                                       d_wts.span(), d_mid.span()}, {d_out.span()});
    auto d_inplace = upload_vec(mid);
    q8::moe_down(v, d_table.ptr<int32_t>(), d_hq.ptr<int8_t>(), d_hds.ptr<float2>(), d_ids.ptr<int32_t>(),
                 d_wts.ptr<float>(), 1, k, d_inplace.ptr<float>(), stream());
    cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_hq.span(), d_hds.span(), d_ids.span(),
                                       d_wts.span(), d_inplace.span()}, {d_inplace.span()});
    const auto out = download<float>(d_out, n_embd);
    EXPECT_EQ(std::memcmp(out.data(), download<float>(d_inplace, n_embd).data(), size_t(n_embd) * 4), 0)
        << what << ": moe_down with resid differs from in place";

    // Deterministic: the chain again.
    wo_router_gpu();
    gate_up_gpu();
    EXPECT_EQ(std::memcmp(download<float>(d_mid, n_embd).data(), mid.data(), size_t(n_embd) * 4), 0) << what;
    EXPECT_EQ(std::memcmp(download<float>(d_raw, n_expert).data(), raw.data(), size_t(n_expert) * 4), 0) << what;
    EXPECT_EQ(std::memcmp(download<int8_t>(d_hq, k * n_ff).data(), hq.data(), size_t(k * n_ff)), 0) << what;
    EXPECT_EQ(download<float>(d_wts, k), wts) << what;

    // gate_up's blocks-per-SM cap (the default 2 applies to this grid of 25 x 8 blocks on an H200) is a
    // launch shape only: the same bits without it and with 1 and 3, routed and not.
    const int cap_was = q8::gate_up_per_sm();
    for (const int cap : {0, 1, 3}) {
      q8::set_gate_up_per_sm(cap);
      gate_up_gpu();
      EXPECT_EQ(std::memcmp(download<int8_t>(d_hq, k * n_ff).data(), hq.data(), size_t(k * n_ff)), 0)
          << what << ": h codes, routed, cap " << cap;
      EXPECT_EQ(std::memcmp(download<float2>(d_hds, k * n_ff / 32).data(), hds.data(),
                            size_t(k * n_ff / 32) * sizeof(float2)), 0) << what << ": h scales, routed, cap " << cap;
      q8::moe_gate_up(v, d_table.ptr<int32_t>(), d_xq.ptr<int8_t>(), d_xds.ptr<float2>(), d_ids_ref.ptr<int32_t>(), 1,
                      k, d_hq2.ptr<int8_t>(), d_hds2.ptr<float2>(), stream());
      cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_xq.span(), d_xds.span(), d_ids_ref.span()},
                        {d_hq2.span(), d_hds2.span()});
      EXPECT_EQ(download<int8_t>(d_hq2, k * n_ff), hq2) << what << ": h codes, cap " << cap;
    }
    q8::set_gate_up_per_sm(cap_was);
    EXPECT_THROW(q8::set_gate_up_per_sm(9), Error);
    // Both ways to the top k (each warp's keys sorted, then ranks among the candidates; every key ranked
    // among all) give the same ids, weights and bits.
    const int topk_was = q8::gate_up_warp_topk();
    for (const int on : {0, 1}) {
      q8::set_gate_up_warp_topk(on);
      auto d_hq_v = output(size_t(k * n_ff), 0x55);
      auto d_hds_v = output(size_t(k * n_ff / 32) * sizeof(float2), 0x55);
      auto d_ids_v = output(size_t(k) * 4, 0x55);
      auto d_wts_v = output(size_t(k) * 4, 0x55);
      q8::FoldedRoute fv = fr;
      fv.ids = d_ids_v.ptr<int32_t>(), fv.wts = d_wts_v.ptr<float>();
      q8::moe_gate_up_routed(v, d_table.ptr<int32_t>(), fv, k, d_hq_v.ptr<int8_t>(), d_hds_v.ptr<float2>(), stream());
      cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_mid.span(), d_g.span(), d_ss.span(),
                                         d_raw.span()}, {d_hq_v.span(), d_hds_v.span(), d_ids_v.span(), d_wts_v.span()});
      EXPECT_EQ(download<int32_t>(d_ids_v, k), ids) << what << ": ids, warp top-k " << on;
      EXPECT_EQ(std::memcmp(download<float>(d_wts_v, k).data(), wts.data(), size_t(k) * 4), 0)
          << what << ": weights, warp top-k " << on;
      EXPECT_EQ(std::memcmp(download<int8_t>(d_hq_v, k * n_ff).data(), hq.data(), size_t(k * n_ff)), 0)
          << what << ": h codes, warp top-k " << on;
      EXPECT_EQ(std::memcmp(download<float2>(d_hds_v, k * n_ff / 32).data(), hds.data(),
                            size_t(k * n_ff / 32) * sizeof(float2)), 0) << what << ": h scales, warp top-k " << on;
    }
    q8::set_gate_up_warp_topk(topk_was);
    EXPECT_THROW(q8::set_gate_up_warp_topk(2), Error);
    EXPECT_THROW(q8::set_gate_up_per_sm(-1), Error);
  }
};

TEST_F(CudaFoldedRouter, Qwen3MoeShapes) { run(128, 8, 5); }
// Q8_0 rows go through shared memory (staged): at this size more than 48 KiB of it, beside the routing's
// static part.
TEST_F(CudaFoldedRouter, Qwen3MoeShapesStagedRows) { run(128, 8, 9, GgmlType::Q8_0); }
TEST_F(CudaFoldedRouter, ExpertsNotAMultipleOf32) { run(60, 4, 6); }
// The low-bit formats' kernels as wo and as the routed gate_up's experts (session 34: with them on, the fixture
// KL of the IQ4_XS and IQ3_S files rose 15-30x while every plain moe_gate_up / matvec test passed; the routed
// path had been tested at Q4_K and Q8_0 only).
TEST_F(CudaFoldedRouter, LowBitFormats) {
  uint32_t seed = 20;
  for (GgmlType t : test::kLowBitTypes) run(128, 8, seed++, t);
}

TEST_F(CudaFoldedRouter, UnsupportedShapesAreErrors) {
  EXPECT_FALSE(q8::wo_router_supported(GgmlType::Q4_K, 2048, 4096, 513));
  EXPECT_FALSE(q8::wo_router_supported(GgmlType::Q4_K, 2048 + 32, 4096, 128));  // n_embd % 256
  EXPECT_FALSE(q8::wo_router_supported(GgmlType::Q4_K, 4096, 8192, 128));       // a fold row over 8192
  EXPECT_FALSE(q8::wo_router_supported(GgmlType::F32, 2048, 4096, 128));
  EXPECT_TRUE(q8::wo_router_supported(GgmlType::Q4_K, 4096, 4096, 128));
  auto buf = output(1 << 20);
  EXPECT_THROW(q8::wo_router(GgmlType::Q4_K, buf.ptr(), 2048, 4096, int64_t(row_bytes(GgmlType::Q4_K, 4096)),
                             buf.ptr<int8_t>(), buf.ptr<float2>(), buf.ptr<float>(), buf.ptr<float>(),
                             buf.ptr<float>(), 600, buf.ptr<float>(), buf.ptr<float>(), buf.ptr<float>(), stream()),
               Error);
}

}  // namespace
