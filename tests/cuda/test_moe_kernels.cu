// GPU MoE expert kernels (cuda/moe_kernels.cuh) vs a CPU reference built from strata::matmul Exact:
// experts in scattered slots, some not resident (table -1), mixed types per tensor. Checks h of every
// resident (token, j), that rows of non-resident experts are left untouched, and out (zeros for a token
// with no resident expert). Errors are relative to the largest |value| of the compared row.
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
#include "quant/matmul.h"

namespace {

using namespace strata;
namespace cm = strata::cuda::moe;

struct MoeCase {
  GgmlType gate, up, down;
  int64_t extra_offset;  // added to the tensors' offsets and the slot size (odd: the byte-load path)
};

class CudaMoe : public test::GpuKernelTest {
 protected:
  // One set of experts per case (quantizing them dominates the test's time), then each n.
  void run(const MoeCase& mc, std::initializer_list<int64_t> ns) {
    const int64_t n_embd = 2048, n_ff = 768;
    const int n_expert = 16, n_slots = 12, k = 8;
    std::mt19937 rng(1234 + 7 * static_cast<int>(mc.down) + static_cast<int>(mc.extra_offset));
    ThreadPool& pool = test::test_pool();
    const int64_t gb = int64_t(row_bytes(mc.gate, n_embd)) * n_ff, ub = int64_t(row_bytes(mc.up, n_embd)) * n_ff,
                  db = int64_t(row_bytes(mc.down, n_ff)) * n_embd;
    cm::ExpertLayerView v;
    v.gate_type = mc.gate, v.up_type = mc.up, v.down_type = mc.down;
    v.gate_off = mc.extra_offset, v.up_off = v.gate_off + gb + mc.extra_offset, v.down_off = v.up_off + ub;
    v.slot_bytes = v.down_off + db + mc.extra_offset;
    v.n_embd = n_embd, v.n_ff = n_ff;

    // Experts: weights on the host; 10 of 16 resident in scattered slots, the rest -1.
    std::vector<std::vector<uint8_t>> G(n_expert), U(n_expert), D(n_expert);
    for (int e = 0; e < n_expert; ++e) {
      G[e] = test::random_weights(mc.gate, n_ff, n_embd, rng);
      U[e] = test::random_weights(mc.up, n_ff, n_embd, rng);
      D[e] = test::random_weights(mc.down, n_embd, n_ff, rng);
    }
    std::vector<int32_t> table(n_expert, -1);
    const int resident[] = {0, 2, 3, 5, 8, 9, 11, 12, 14, 15};
    const int slot_of[] = {7, 0, 11, 3, 9, 1, 5, 10, 2, 6};  // slots 4 and 8 stay empty (garbage)
    std::vector<uint8_t> slots(v.slot_bytes * n_slots);
    for (auto& b : slots) b = static_cast<uint8_t>(rng());
    for (int i = 0; i < 10; ++i) {
      const int e = resident[i], s = slot_of[i];
      table[e] = s;
      uint8_t* base = slots.data() + s * v.slot_bytes;
      std::copy(G[e].begin(), G[e].end(), base + v.gate_off);
      std::copy(U[e].begin(), U[e].end(), base + v.up_off);
      std::copy(D[e].begin(), D[e].end(), base + v.down_off);
    }

    auto d_slots = upload_vec(slots);
    auto d_table = upload_vec(table);
    v.slots = d_slots.ptr<uint8_t>();
    for (int64_t n : ns) {
      // Routing: k distinct random experts per token, except token 1 (when n > 1): only the 6 non-resident
      // experts (two of them twice), so it has no resident expert.
      std::vector<int32_t> ids(n * k);
      std::vector<float> wts(n * k);
      const int non_resident[] = {1, 4, 6, 7, 10, 13};
      for (int64_t t = 0; t < n; ++t) {
        std::vector<int32_t> perm(n_expert);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int j = 0; j < k; ++j) ids[t * k + j] = t == 1 ? non_resident[j % 6] : perm[j];
        float sum = 0;
        for (int j = 0; j < k; ++j) sum += (wts[t * k + j] = 0.1f + float(rng() % 1000) / 1000.f);
        for (int j = 0; j < k; ++j) wts[t * k + j] /= sum;
      }
      const auto x = test::random_acts(n * n_embd, rng);

      // CPU reference.
      std::vector<float> h_ref(n * k * n_ff, 0.f), out_ref(n * n_embd, 0.f), g(n_ff), u(n_ff), d(n_embd);
      for (int64_t t = 0; t < n; ++t)
        for (int j = 0; j < k; ++j) {
          const int e = ids[t * k + j];
          if (table[e] < 0) continue;
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
                               " n " + std::to_string(n);
      double worst_h = 0, worst_out = 0;
      int64_t untouched_bad = 0;
      for (int64_t p = 0; p < n * k; ++p) {
        const float* hr = h.data() + p * n_ff;
        const float* rr = h_ref.data() + p * n_ff;
        if (table[ids[p]] < 0) {
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
        if (t == 1) {  // no resident expert: exact zeros
          EXPECT_EQ(err, 0.0) << what << ": token 1 has no resident expert, max |out| " << err;
          continue;
        }
        worst_out = std::max(worst_out, err / std::max(scale, 1e-30));
      }
      EXPECT_EQ(untouched_bad, 0) << what << ": h rows of non-resident experts were written";
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
  v.down_type = GgmlType::TQ1_0;  // no GPU kernel
  EXPECT_THROW(cm::moe_down(v, ip, fp, ip, fp, 1, 2, fp, stream()), Error);
  v.down_type = GgmlType::Q4_K;
  v.n_ff = 100;  // not a multiple of 256
  EXPECT_THROW(cm::moe_down(v, ip, fp, ip, fp, 1, 2, fp, stream()), Error);
  v.n_ff = 256;
  EXPECT_THROW(cm::moe_down(v, ip, fp, ip, fp, 1, 0, fp, stream()), Error);  // k = 0
}

}  // namespace
