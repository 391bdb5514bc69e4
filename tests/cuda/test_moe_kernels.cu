// GPU MoE expert kernels (cuda/moe_kernels.cuh) vs a CPU reference built from strata::matmul Exact:
// experts in scattered slots, some not resident (table -1), mixed types per tensor; optionally a share of
// each token's misses read directly from a pinned host copy (moe/direct_rule.h). Checks h of every GPU
// (resident or direct) pair, that rows of the other pairs are left untouched, and out (zeros for a token
// with no GPU pair). Errors are relative to the largest |value| of the compared row.
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
#include "cuda/quant_kernels.cuh"
#include "gpu_test_util.h"
#include "moe/direct_rule.h"
#include "moe_test_util.h"
#include "quant/matmul.h"

namespace {

using namespace strata;
namespace cm = strata::cuda::moe;

struct MoeCase {
  GgmlType gate, up, down;
  int64_t extra_offset;  // added to the tensors' offsets and the slot size (odd: the byte-load path)
  int direct_share = 0;  // moe/direct_rule.h share (1/256ths) of each token's misses read from host memory
  bool fetch = false;    // direct pairs fetched into staging slots first (moe_direct_fetch)
  int64_t slot_tail = 0;  // slots this many bytes larger than the expert (moe_test_util.h)
};

class CudaMoe : public test::GpuKernelTest {
 protected:
  // One set of experts per case (quantizing them dominates the test's time), then each n.
  void run(const MoeCase& mc, std::initializer_list<int64_t> ns) {
    constexpr int k = 8;
    std::mt19937 rng(1234 + 7 * static_cast<int>(mc.down) + static_cast<int>(mc.extra_offset));
    ThreadPool& pool = test::test_pool();
    // Experts: weights on the host; 10 of 16 resident in scattered slots, the rest -1.
    test::MoeTestLayer L = test::make_moe_test_layer(mc.gate, mc.up, mc.down, mc.extra_offset, rng, mc.slot_tail);
    const int64_t n_embd = L.n_embd, n_ff = L.n_ff;
    cm::ExpertLayerView& v = L.view;
    const auto &G = L.G, &U = L.U, &D = L.D;
    const auto& table = L.table;
    const auto& slots = L.slots;

    auto d_slots = upload_vec(slots);
    auto d_table = upload_vec(table);
    v.slots = d_slots.ptr<uint8_t>();
    // Direct reads: every expert in slot layout in pinned host memory, [n_expert][slot_bytes], at the same
    // alignment offset as the slots.
    cuda::PinnedBuffer host;
    if (mc.direct_share > 0) {
      host = dev->alloc_pinned(size_t(L.n_expert) * size_t(v.slot_bytes), "direct expert copy");
      uint8_t* hb = host.as<uint8_t>();
      std::fill(hb, hb + size_t(L.n_expert) * size_t(v.slot_bytes), uint8_t(0xC3));  // (a slot's tail: not copied)
      for (int e = 0; e < L.n_expert; ++e) {
        uint8_t* base = hb + int64_t(e) * v.slot_bytes;
        std::copy(G[e].begin(), G[e].end(), base + v.gate_off);
        std::copy(U[e].begin(), U[e].end(), base + v.up_off);
        std::copy(D[e].begin(), D[e].end(), base + v.down_off);
      }
      v.direct = hb;
      v.direct_share = mc.direct_share;
    }
    for (int64_t n : ns) {
      // Routing: k distinct random experts per token, except token 1: no resident expert (moe_test_util.h).
      std::vector<int32_t> ids;
      std::vector<float> wts;
      test::make_moe_test_routing(n, k, rng, ids, wts);
      const auto x = test::random_acts(n * n_embd, rng);
      // Which pairs the GPU runs: resident, or direct by the shared rule.
      std::vector<char> on_gpu(size_t(n * k));
      int64_t n_direct = 0;
      for (int64_t p = 0; p < n * k; ++p) {
        const bool direct =
            moe::pair_is_direct(ids.data() + (p / k) * k, table.data(), k, int(p % k), mc.direct_share);
        on_gpu[size_t(p)] = table[ids[p]] >= 0 || direct;
        n_direct += direct;
      }
      if (mc.direct_share > 0) EXPECT_GT(n_direct, 0);

      // CPU reference.
      std::vector<float> h_ref(n * k * n_ff, 0.f), out_ref(n * n_embd, 0.f), g(n_ff), u(n_ff), d(n_embd);
      for (int64_t t = 0; t < n; ++t)
        for (int j = 0; j < k; ++j) {
          const int e = ids[t * k + j];
          if (!on_gpu[size_t(t * k + j)]) continue;
          matmul(mc.gate, G[e].data(), n_ff, n_embd, x.data() + t * n_embd, 1, g.data(), MatmulMode::Exact, pool);
          matmul(mc.up, U[e].data(), n_ff, n_embd, x.data() + t * n_embd, 1, u.data(), MatmulMode::Exact, pool);
          float* hr = h_ref.data() + (t * k + j) * n_ff;
          for (int64_t r = 0; r < n_ff; ++r) hr[r] = g[r] / (1.f + std::exp(-g[r])) * u[r];
          matmul(mc.down, D[e].data(), n_embd, n_ff, hr, 1, d.data(), MatmulMode::Exact, pool);
          for (int64_t r = 0; r < n_embd; ++r) out_ref[t * n_embd + r] += wts[t * k + j] * d[r];
        }

      auto d_ids = upload_vec(ids);
      auto d_wts = upload_vec(wts);
      auto d_x = upload_vec(x);
      Buf d_stage;
      v.stage = nullptr, v.stage_per_token = 0;
      if (mc.fetch) {  // staging slots start as garbage: every byte a kernel reads must come from the fetch
        const int per = moe::direct_count(k, mc.direct_share);
        d_stage = output(size_t(n) * size_t(per) * size_t(v.slot_bytes) + 16, 0xA5);
        v.stage = d_stage.ptr<uint8_t>();
        v.stage_per_token = per;
        cm::moe_direct_fetch(v, d_table.ptr<int32_t>(), d_ids.ptr<int32_t>(), n, k, stream());
        cuda::note_launch(dev->compute(), {d_table.span(), d_ids.span()}, {d_stage.span()});
        if (v.expert_bytes > 0) {  // the fetch copies the expert only: every staging slot's tail keeps 0xA5
          const auto staged = download<uint8_t>(d_stage, size_t(n) * size_t(per) * size_t(v.slot_bytes));
          int64_t tail_written = 0;
          for (int64_t i = 0; i < n * per; ++i)
            for (int64_t b = v.expert_bytes; b < v.slot_bytes; ++b)
              tail_written += staged[size_t(i * v.slot_bytes + b)] != 0xA5;
          EXPECT_EQ(tail_written, 0) << "moe_direct_fetch wrote past the " << v.expert_bytes << " bytes of an expert";
        }
      }
      auto d_h = output(n * k * n_ff * sizeof(float), 0xFF);  // NaN pattern: rows not written stay 0xFFFFFFFF
      auto d_out = output(n * n_embd * sizeof(float), 0xFF);
      cm::moe_gate_up(v, d_table.ptr<int32_t>(), d_x.ptr<float>(), d_ids.ptr<int32_t>(), n, k, d_h.ptr<float>(),
                      stream());
      cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_x.span(), d_ids.span()}, {d_h.span()});
      cm::moe_down(v, d_table.ptr<int32_t>(), d_h.ptr<float>(), d_ids.ptr<int32_t>(), d_wts.ptr<float>(), n, k,
                   d_out.ptr<float>(), stream());
      cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_h.span(), d_ids.span(), d_wts.span()},
                        {d_out.span()});
      const auto h = download<float>(d_h, n * k * n_ff);
      const auto out = download<float>(d_out, n * n_embd);

      const std::string what = std::string(type_name(mc.gate)) + "/" + std::string(type_name(mc.up)) + "/" +
                               std::string(type_name(mc.down)) + " offset+" + std::to_string(mc.extra_offset) +
                               " n " + std::to_string(n) +
                               (mc.direct_share ? " direct " + moe::direct_share_str(mc.direct_share) : "") +
                               (mc.fetch ? " fetched" : "");
      double worst_h = 0, worst_out = 0;
      int64_t untouched_bad = 0;
      for (int64_t p = 0; p < n * k; ++p) {
        const float* hr = h.data() + p * n_ff;
        const float* rr = h_ref.data() + p * n_ff;
        if (!on_gpu[size_t(p)]) {
          for (int64_t r = 0; r < n_ff; ++r) {
            uint32_t bits;
            std::memcpy(&bits, &hr[r], 4);
            untouched_bad += bits != 0xFFFFFFFFu;
          }
          continue;
        }
        double scale = 0, err = 0;
        for (int64_t r = 0; r < n_ff; ++r) {
          scale = std::max(scale, std::fabs(double(rr[r])));
          err = std::max(err, std::isfinite(hr[r]) ? std::fabs(double(hr[r]) - rr[r]) : 1e30);
        }
        worst_h = std::max(worst_h, err / std::max(scale, 1e-30));
      }
      for (int64_t t = 0; t < n; ++t) {
        double scale = 0, err = 0;
        for (int64_t r = 0; r < n_embd; ++r) {
          const float a = out[t * n_embd + r], b = out_ref[t * n_embd + r];
          scale = std::max(scale, std::fabs(double(b)));
          err = std::max(err, std::isfinite(a) ? std::fabs(double(a) - b) : 1e30);
        }
        bool any_gpu = false;
        for (int j = 0; j < k; ++j) any_gpu |= on_gpu[size_t(t * k + j)] != 0;
        if (!any_gpu) {  // token 1 without direct reads: no resident expert, exact zeros
          EXPECT_EQ(err, 0.0) << what << ": token " << t << " has no GPU pair, max |out| " << err;
          continue;
        }
        worst_out = std::max(worst_out, err / std::max(scale, 1e-30));
      }
      EXPECT_EQ(untouched_bad, 0) << what << ": h rows of the CPU pool's pairs were written";
      EXPECT_LT(worst_h, 1e-4) << what << ": h max error / max |h| of the row";
      EXPECT_LT(worst_out, 1e-4) << what << ": out max error / max |out| of the token";
      std::printf("moe %s: h err %.3g, out err %.3g\n", what.c_str(), worst_h, worst_out);

      // Deterministic: a second run gives the same bits.
      auto d_out2 = output(n * n_embd * sizeof(float), 0);
      cm::moe_down(v, d_table.ptr<int32_t>(), d_h.ptr<float>(), d_ids.ptr<int32_t>(), d_wts.ptr<float>(), n, k,
                   d_out2.ptr<float>(), stream());
      cuda::note_launch(dev->compute(), {d_slots.span(), d_table.span(), d_h.span(), d_ids.span(), d_wts.span()},
                        {d_out2.span()});
      const auto out2 = download<float>(d_out2, n * n_embd);
      EXPECT_EQ(std::memcmp(out.data(), out2.data(), out.size() * 4), 0) << what << ": moe_down not deterministic";
    }
  }
};

TEST_F(CudaMoe, MixedTypesQ4KGateUpQ6KDown) {
  run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, 0}, {1, 3, 9});
}

TEST_F(CudaMoe, DifferentGateAndUpTypes) {  // the two-pass gate/up path
  run({GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q4_0, 0}, {1, 4});
}

TEST_F(CudaMoe, UnalignedSlotOffsets) {  // odd offsets and slot size: byte loads
  run({GgmlType::Q5_K, GgmlType::Q5_K, GgmlType::IQ4_XS, 1}, {2});
  run({GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::F16, 3}, {3});
}

// The fast path (fast_dot.cuh) for the other formats: Q5_K gate/up as one pass, Q8_0 down; then slots at
// +2 bytes: Q8_0 gate/up and Q6_K down stay on the fast path with 2-byte loads, Q4_K needs 16 and falls
// back to the generic kernels.
TEST_F(CudaMoe, FastPathFormatsAndTwoByteAlignment) {
  run({GgmlType::Q5_K, GgmlType::Q5_K, GgmlType::Q8_0, 0}, {1, 3});
  run({GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q6_K, 2}, {2});
  run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_0, 2}, {1});
}

// Q4_0 experts kept as Q4_0_X8 (the fast path's FQ40X8: 16-byte code loads), with direct reads; then at +2
// bytes (the fast path needs 16: the generic kernels).
TEST_F(CudaMoe, Q40X8Experts) {
  run({GgmlType::Q4_0_X8, GgmlType::Q4_0_X8, GgmlType::Q4_0_X8, 0}, {1, 4});
  run({GgmlType::Q4_0_X8, GgmlType::Q4_0_X8, GgmlType::Q4_0_X8, 0, 128}, {2});
  run({GgmlType::Q4_0_X8, GgmlType::Q4_0_X8, GgmlType::Q4_0_X8, 2}, {3});
}

// Direct reads (moe/direct_rule.h): a share of each token's misses read from pinned host memory over
// PCIe, on the fast path (Q4_K / Q6_K, Q8_0) and the generic one (odd offsets: byte loads), with token 1's
// all-miss routing (duplicates included).
TEST_F(CudaMoe, DirectReadsFromPinnedHostMemory) {
  run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, 0, 96}, {1, 3, 9});
  run({GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0, 0, 256}, {2});
  run({GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q4_0, 0, 128}, {2});  // gate and up in two passes
  run({GgmlType::Q5_K, GgmlType::Q5_K, GgmlType::IQ4_XS, 1, 128}, {3});
}

// The same with the direct pairs fetched into staging slots first (16-byte copies; bytes at odd offsets).
TEST_F(CudaMoe, DirectReadsFetchedIntoStagingSlots) {
  run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, 0, 96, true}, {1, 3, 9});
  run({GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0, 0, 256, true}, {2});
  run({GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q4_0, 0, 128, true}, {2});
  run({GgmlType::Q5_K, GgmlType::Q5_K, GgmlType::IQ4_XS, 1, 128, true}, {3});
}

// Slots larger than the layer's experts (a file whose layers differ in type): the fetch copies expert_bytes
// only (16-byte copies, then byte copies at an odd offset), and the kernels read nothing past them.
TEST_F(CudaMoe, DirectFetchCopiesTheExpertNotTheSlot) {
  run({GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, 0, 96, true, 160}, {1, 3});
  run({GgmlType::Q5_K, GgmlType::Q5_K, GgmlType::IQ4_XS, 1, 128, true, 7}, {3});
}

TEST_F(CudaMoe, BadViewsAreErrors) {
  auto buf = output(4096);
  cm::ExpertLayerView v;
  v.slots = buf.ptr<uint8_t>();
  v.slot_bytes = 4096;
  v.n_embd = 256, v.n_ff = 256;
  v.gate_type = v.up_type = v.down_type = GgmlType::Q4_K;
  const int32_t* ip = buf.ptr<int32_t>();
  float* fp = buf.ptr<float>();
  // 256x256 Q4_K = 36864 bytes: does not fit in a 4096-byte slot.
  EXPECT_THROW(cm::moe_gate_up(v, ip, fp, ip, 1, 2, fp, stream()), Error);
  v.slot_bytes = 3 * 36864;
  v.up_off = 36864, v.down_off = 2 * 36864;
  v.direct_share = 300;  // more than all misses
  EXPECT_THROW(cm::moe_gate_up(v, ip, fp, ip, 1, 2, fp, stream()), Error);
  v.direct_share = 0;
  v.down_type = GgmlType::TQ1_0;  // no GPU kernel
  EXPECT_THROW(cm::moe_down(v, ip, fp, ip, fp, 1, 2, fp, stream()), Error);
  v.down_type = GgmlType::Q4_K;
  v.n_ff = 100;  // not a multiple of 256
  EXPECT_THROW(cm::moe_down(v, ip, fp, ip, fp, 1, 2, fp, stream()), Error);
  v.n_ff = 256;
  EXPECT_THROW(cm::moe_down(v, ip, fp, ip, fp, 1, 0, fp, stream()), Error);  // k = 0
}

}  // namespace
