// The int8-activation kernels' per-lane code (src/cuda/q8_formats.cuh, q8_formats_low.cuh, q8_formats_iq.cuh:
// the 17 formats' task dots and row_lane_partial) run on the host, without a GPU:
//  * one lane doing every task of a row in order (lpr = 1) gives q8ref::row_dot's value bit for bit, for
//    random weights at 2048 and 768 columns and for the zoo tensors (llama.cpp's data), tokens tiled by
//    8 with a partial tile (the kernels' token loop);
//  * 32 and 16 lanes per row summed with the kernels' butterfly order: within 1e-5 of sum|w*x|;
//  * rows_lane_partial (moe_gate_up's 8 rows per task loop) and rows_tokens_lane_partial (matvec's two rows
//    per lane group) bit for bit with row_dot, one lane;
//  * down_lane_partial (moe_down's lanes over the k experts' tasks), 32 lanes and the butterfly, against
//    q8ref::moe_down within 1e-5 of sum|wts * w * h|, with non-resident and negative ids;
//  * the same from rows staged by warp_copy (the shared-memory path of the 2-byte aligned formats);
//  * Q4_0_X8 (Q4_0 regrouped, the GPU's storage for Q4_0 experts): every lane's partial, at every lanes-per-row
//    split and in moe_down's lane loop, has the same bits as Q4_0's on the same blocks; Q6_K_X8 (Q6_K
//    regrouped, for dense products) the same against Q6_K.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/host/q8_reference.h"
#include "cuda/q8_formats.cuh"
#include "cuda/q8_kernels.cuh"
#include "gguf/gguf.h"
#include "gpu_test_util.h"
#include "quant/dequant.h"
#include "quant/iq_tables.h"

namespace {

using namespace strata;
namespace q8d = strata::cuda::q8d;
namespace q8ref = strata::cuda::q8ref;

const GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q4_0_X8, GgmlType::Q8_0,   GgmlType::Q4_K,
                           GgmlType::Q5_K, GgmlType::Q6_K,    GgmlType::Q2_K,   GgmlType::Q3_K,
                           GgmlType::IQ4_XS, GgmlType::IQ4_NL, GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
                           GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S,
                           GgmlType::IQ1_M};

// What a warp's warp_copy leaves in a 16-byte aligned staging region (all 32 lanes run on the host).
struct Stage {
  std::vector<uint4> mem;
  uint8_t* region() { return reinterpret_cast<uint8_t*>(mem.data()); }
};
const uint8_t* stage_rows(Stage& st, const uint8_t* src, int64_t bytes) {
  st.mem.assign(size_t(q8d::stage_stride(bytes) / 16), uint4{0xAAAAAAAAu, 0xAAAAAAAAu, 0xAAAAAAAAu, 0xAAAAAAAAu});
  uint8_t* dst = q8d::stage_dst(st.region(), src);
  for (int lane = 0; lane < 32; ++lane) q8d::warp_copy(dst, src, bytes, lane);
  return dst;
}

struct Result {
  int64_t not_identical = 0;  // lpr = 1 vs the reference (bits), direct and staged rows
  double worst_split = 0;     // lpr = 16 / 32 vs the reference, error / (1e-5 sum|w*x|)
};

Result check_rows(GgmlType t, const uint8_t* w, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t rb = int64_t(row_bytes(t, cols)), n = 11;
  std::vector<float> x(n * cols);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng);
  std::vector<int8_t> xq(n * cols);
  std::vector<q8ref::Q8Ds> xds(n * cols / 32);
  q8ref::quantize(x.data(), n, cols, xq.data(), xds.data());
  const auto* ds2 = reinterpret_cast<const float2*>(xds.data());
  std::vector<float> wf(cols);
  Result res;
  q8d::dispatch(t, q8d::Align{16}, [&](auto f, auto a) {
    using F = decltype(f);
    constexpr int A = decltype(a)::value;
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* wr = w + r * rb;
      dequantize_row(t, wr, wf.data(), cols);
      float one[16] = {};
      for (int64_t t0 = 0; t0 < n; t0 += 8)  // tiles of 8 tokens, the last one partial
        q8d::row_lane_partial<F, A, 8>(wr, cols, 0, 1, xq.data() + t0 * cols, ds2 + t0 * (cols / 32),
                                       int(std::min<int64_t>(8, n - t0)), one + t0);
      // The same from a staged copy of the row (the kernels' path for the 2-byte aligned formats).
      Stage st;
      const uint8_t* staged = stage_rows(st, wr, rb);
      res.not_identical += std::memcmp(staged, wr, size_t(rb)) != 0;
      float one_staged[16] = {};
      for (int64_t t0 = 0; t0 < n; t0 += 8)
        q8d::row_lane_partial<F, q8d::kStaged, 8>(staged, cols, 0, 1, xq.data() + t0 * cols, ds2 + t0 * (cols / 32),
                                                  int(std::min<int64_t>(8, n - t0)), one_staged + t0);
      for (int64_t tk = 0; tk < n; ++tk) {
        const float ref = q8ref::row_dot(t, wr, cols, xq.data() + tk * cols, xds.data() + tk * (cols / 32));
        res.not_identical += !test::same_bits(one[tk], ref);
        res.not_identical += !test::same_bits(one_staged[tk], ref);
        double mag = 0;
        for (int64_t c = 0; c < cols; ++c) mag += std::fabs(double(wf[c]) * xds[tk * (cols / 32) + c / 32].d * xq[tk * cols + c]);
        for (int lpr : {16, 32}) {
          float part[32][1];
          for (int sub = 0; sub < lpr; ++sub) {
            part[sub][0] = 0.f;
            q8d::row_lane_partial<F, A, 1>(wr, cols, sub, lpr, xq.data() + tk * cols, ds2 + tk * (cols / 32), 1,
                                           part[sub]);
          }
          for (int o = lpr / 2; o > 0; o >>= 1) {  // the butterfly: lane l adds lane l ^ o
            float nxt[32];
            for (int l = 0; l < lpr; ++l) nxt[l] = part[l][0] + part[l ^ o][0];
            for (int l = 0; l < lpr; ++l) part[l][0] = nxt[l];
          }
          res.worst_split = std::max(res.worst_split, std::fabs(double(part[0][0]) - ref) / (1e-5 * mag + 1e-30));
        }
      }
    }
  });
  return res;
}

TEST(Q8Host, LaneTasksMatchReferenceRandomWeights) {
  std::mt19937 rng(21);
  for (GgmlType t : kTypes)
    for (int64_t cols : {int64_t(2048), int64_t(768)}) {
      const auto w = test::random_weights(t, 48, cols, rng);
      const Result r = check_rows(t, w.data(), 48, cols, rng);
      EXPECT_EQ(r.not_identical, 0) << type_name(t) << " cols " << cols;
      EXPECT_LE(r.worst_split, 1.0) << type_name(t) << " cols " << cols;
      std::printf("q8 host %s cols %lld: split lanes worst error / 1e-5 sum|w*x| %.3g\n",
                  std::string(type_name(t)).c_str(), (long long)cols, r.worst_split);
    }
}

TEST(Q8Host, LaneTasksMatchReferenceZoo) {
  const auto f = gguf::File::open(std::string(STRATA_FIXTURES_DIR) + "/formats/zoo.gguf");
  std::mt19937 rng(22);
  int compared = 0;
  for (const auto& t : f.tensors()) {
    if (!q8ref::supported(t.type)) continue;
    const int64_t cols = int64_t(t.ne[0]), rows = int64_t(t.n_elements()) / cols;
    if (cols % 32 != 0) continue;
    std::vector<uint8_t> w(static_cast<const uint8_t*>(t.data), static_cast<const uint8_t*>(t.data) + t.nbytes);
    const Result r = check_rows(t.type, w.data(), rows, cols, rng);
    EXPECT_EQ(r.not_identical, 0) << t.name;
    EXPECT_LE(r.worst_split, 1.0) << t.name;
    ++compared;
  }
  EXPECT_EQ(compared, 16) << "zoo tensors of the 16 q8 formats (Q4_0_X8 is strata's own)";
}


TEST(Q8Host, MoeGateUpRowsMatchRowDot) {
  std::mt19937 rng(23);
  for (GgmlType t : kTypes) {
    const int64_t cols = 2048, rows = 8, rb = int64_t(row_bytes(t, cols));
    const auto w = test::random_weights(t, rows, cols, rng);
    std::vector<float> x(cols);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : x) v = nd(rng);
    std::vector<int8_t> xq(cols);
    std::vector<q8ref::Q8Ds> xds(cols / 32);
    q8ref::quantize(x.data(), 1, cols, xq.data(), xds.data());
    float acc[8] = {}, acc2[2][1] = {};
    q8d::dispatch(t, q8d::Align{16}, [&](auto f, auto a) {
      const uint8_t* wr[8];
      for (int r = 0; r < 8; ++r) wr[r] = w.data() + r * rb;
      q8d::rows_lane_partial<decltype(f), decltype(a)::value, 8>(wr, cols, 0, 1, xq.data(),
                                                                 reinterpret_cast<const float2*>(xds.data()), acc);
      const uint8_t* w2[2] = {wr[3], wr[6]};
      q8d::rows_tokens_lane_partial<decltype(f), decltype(a)::value, 2, 1>(
          w2, cols, 0, 1, xq.data(), reinterpret_cast<const float2*>(xds.data()), 1, acc2);
    });
    for (int r = 0; r < 8; ++r)
      EXPECT_TRUE(test::same_bits(acc[r], q8ref::row_dot(t, w.data() + r * rb, cols, xq.data(), xds.data())))
          << type_name(t) << " row " << r;
    EXPECT_TRUE(test::same_bits(acc2[0][0], acc[3]) && test::same_bits(acc2[1][0], acc[6])) << type_name(t);
  }
}

TEST(Q8Host, MoeDownLanesMatchReference) {
  std::mt19937 rng(24);
  for (GgmlType t : kTypes) {
    const int64_t n_embd = 256, n_ff = 768, n = 2;  // few output rows (the lane code does not depend on them)
    const int k = 8, n_slots = 5;
    const int64_t drb = int64_t(row_bytes(t, n_ff));
    q8ref::ExpertView v;
    v.down_type = v.gate_type = v.up_type = t;
    // Only the down tensor is read: rows at the smallest offset the format allows (2; Q2_K 4, IQ4_XS / IQ1_M 8).
    v.gate_off = v.up_off = 0, v.down_off = q8ref::min_row_align(t);
    v.slot_bytes = v.down_off + drb * n_embd;
    v.n_embd = n_embd, v.n_ff = n_ff;
    std::vector<uint8_t> slots(v.slot_bytes * n_slots);
    for (int s = 0; s < n_slots; ++s) {
      const auto d = test::random_weights(t, n_embd, n_ff, rng);
      std::copy(d.begin(), d.end(), slots.begin() + s * v.slot_bytes + v.down_off);
    }
    v.slots = slots.data();
    const std::vector<int32_t> table = {3, -1, 0, -1, 4, 1, -1, -1, 2, -1, -1, -1};
    const std::vector<int32_t> ids = {2, 1, 5, 2, -1, 8, 11, 4,   // token 0: 2 twice, non-resident 1, 11, an id -1
                                      0, 3, 6, 7, 9, 10, 1, 2};   // token 1: resident 0 and 2 only
    std::vector<float> wts(n * k);
    for (auto& e : wts) e = 0.05f + float(rng() % 100) / 400.f;
    std::vector<float> hf(n * k * n_ff);
    std::normal_distribution<float> nd(0.f, 0.3f);
    for (auto& e : hf) e = nd(rng);
    std::vector<int8_t> hq(hf.size());
    std::vector<q8ref::Q8Ds> hds(hf.size() / 32);
    q8ref::quantize(hf.data(), n * k, n_ff, hq.data(), hds.data());
    std::vector<float> x_ref(n * n_embd, 0.25f);
    q8ref::moe_down(v, table.data(), hq.data(), hds.data(), ids.data(), wts.data(), n, k, x_ref.data());
    double worst = 0;
    int64_t slots_diff = 0;
    std::vector<float> wd(n_ff);
    int dispatched = 0;
    for (bool staged : {false, true})
    dispatched += q8d::dispatch(t, q8d::Align{q8ref::min_row_align(t)}, [&](auto f, auto a) {
      for (int64_t tk = 0; tk < n; ++tk)
        for (int64_t r = 0; r < n_embd; ++r) {
          float part[32];
          if (staged) {  // the kernel's staged path: the k experts' rows r copied into one region
            const int64_t stride = q8d::stage_stride(drb);
            std::vector<uint4> region(size_t(stride * k / 16));
            for (int j = 0; j < k; ++j) {
              const int64_t p = tk * k + j;
              if (ids[p] < 0 || table[ids[p]] < 0) continue;
              const uint8_t* src = slots.data() + table[ids[p]] * v.slot_bytes + v.down_off + r * drb;
              uint8_t* base = reinterpret_cast<uint8_t*>(region.data()) + j * stride;
              for (int lane = 0; lane < 32; ++lane) q8d::warp_copy(q8d::stage_dst(base, src), src, drb, lane);
            }
            for (int l = 0; l < 32; ++l)
              part[l] = q8d::down_lane_partial<decltype(f), q8d::kStaged>(
                  slots.data(), v.slot_bytes, v.down_off, drb, r, n_ff, table.data(), hq.data(),
                  reinterpret_cast<const float2*>(hds.data()), ids.data(), wts.data(), tk, k, l, 32,
                  reinterpret_cast<uint8_t*>(region.data()), stride);
          } else {
            for (int l = 0; l < 32; ++l)
              part[l] = q8d::down_lane_partial<decltype(f), decltype(a)::value>(
                  slots.data(), v.slot_bytes, v.down_off, drb, r, n_ff, table.data(), hq.data(),
                  reinterpret_cast<const float2*>(hds.data()), ids.data(), wts.data(), tk, k, l, 32);
          }
          // down_lane_partial_slots (the slots kernel's: slots looked up once) gives the same bits per
          // lane, with 2 terms unrolled (3 per lane here: the loop takes the third), with 4 and with 8 (the
          // formats of 8 tasks a block: 6 per lane here).
          {
            int jslot[8];
            for (int j = 0; j < k; ++j) {
              const int32_t e = ids[tk * k + j];
              jslot[j] = e < 0 ? -1 : table[e];
            }
            const int64_t stride = q8d::stage_stride(drb);
            std::vector<uint4> region(size_t(stride * k / 16));
            for (int j = 0; j < k && staged; ++j) {
              if (jslot[j] < 0) continue;
              const uint8_t* src = slots.data() + jslot[j] * v.slot_bytes + v.down_off + r * drb;
              uint8_t* base = reinterpret_cast<uint8_t*>(region.data()) + j * stride;
              for (int lane = 0; lane < 32; ++lane) q8d::warp_copy(q8d::stage_dst(base, src), src, drb, lane);
            }
            auto* stage = staged ? reinterpret_cast<uint8_t*>(region.data()) : nullptr;
            for (int l = 0; l < 32; ++l) {
              float a2, a4, a8;
              if (staged) {
                a2 = q8d::down_lane_partial_slots<decltype(f), q8d::kStaged, 2>(
                    slots.data(), v.slot_bytes, v.down_off, drb, r, n_ff, jslot, hq.data(),
                    reinterpret_cast<const float2*>(hds.data()), wts.data(), tk, k, l, 32, stage, stride);
                a4 = q8d::down_lane_partial_slots<decltype(f), q8d::kStaged, 4>(
                    slots.data(), v.slot_bytes, v.down_off, drb, r, n_ff, jslot, hq.data(),
                    reinterpret_cast<const float2*>(hds.data()), wts.data(), tk, k, l, 32, stage, stride);
                a8 = q8d::down_lane_partial_slots<decltype(f), q8d::kStaged, 8>(
                    slots.data(), v.slot_bytes, v.down_off, drb, r, n_ff, jslot, hq.data(),
                    reinterpret_cast<const float2*>(hds.data()), wts.data(), tk, k, l, 32, stage, stride);
              } else {
                a2 = q8d::down_lane_partial_slots<decltype(f), decltype(a)::value, 2>(
                    slots.data(), v.slot_bytes, v.down_off, drb, r, n_ff, jslot, hq.data(),
                    reinterpret_cast<const float2*>(hds.data()), wts.data(), tk, k, l, 32);
                a4 = q8d::down_lane_partial_slots<decltype(f), decltype(a)::value, 4>(
                    slots.data(), v.slot_bytes, v.down_off, drb, r, n_ff, jslot, hq.data(),
                    reinterpret_cast<const float2*>(hds.data()), wts.data(), tk, k, l, 32);
                a8 = q8d::down_lane_partial_slots<decltype(f), decltype(a)::value, 8>(
                    slots.data(), v.slot_bytes, v.down_off, drb, r, n_ff, jslot, hq.data(),
                    reinterpret_cast<const float2*>(hds.data()), wts.data(), tk, k, l, 32);
              }
              slots_diff += !test::same_bits(a2, part[l]) || !test::same_bits(a4, part[l]) ||
                            !test::same_bits(a8, part[l]);
            }
          }
          for (int o = 16; o > 0; o >>= 1) {
            float nxt[32];
            for (int l = 0; l < 32; ++l) nxt[l] = part[l] + part[l ^ o];
            std::copy(nxt, nxt + 32, part);
          }
          const float got = 0.25f + part[0];
          double mag = 0;
          for (int j = 0; j < k; ++j) {
            const int64_t p = tk * k + j;
            if (ids[p] < 0 || table[ids[p]] < 0) continue;
            dequantize_row(t, slots.data() + table[ids[p]] * v.slot_bytes + v.down_off + r * drb, wd.data(), n_ff);
            for (int64_t c = 0; c < n_ff; ++c)
              mag += std::fabs(wts[p] * wd[c] * double(hds[p * (n_ff / 32) + c / 32].d) * hq[p * n_ff + c]);
          }
          worst = std::max(worst, std::fabs(double(got) - x_ref[tk * n_embd + r]) / (1e-5 * mag + 2.4e-7 * 0.25));
        }
    });
    EXPECT_EQ(dispatched, 2) << type_name(t);
    EXPECT_LE(worst, 1.0) << type_name(t);
    EXPECT_EQ(slots_diff, 0) << type_name(t) << ": down_lane_partial_slots differs from down_lane_partial";
    std::printf("q8 host moe down %s: worst error / tolerance %.3g\n", std::string(type_name(t)).c_str(), worst);
  }
}

// Every lane's partial of a regrouped format FX (type tx, rows regrouped or padded by `repack`) at A = 16 and
// A = 2, at every lanes-per-row split, against the file format F0's (type t0) on the same blocks; and q8ref's
// row_dot of both.
template <typename F0, typename FX, typename Repack>
void expect_regrouped_lanes_same_bits(GgmlType t0, GgmlType tx, int64_t cols, Repack repack, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t rows = 6, n = 3;
  const int64_t rb = int64_t(row_bytes(t0, cols)), rbx = int64_t(row_bytes(tx, cols));
  const auto w0 = test::random_weights(t0, rows, cols, rng);
  std::vector<uint8_t> w8(size_t(rbx * rows));
  for (int64_t r = 0; r < rows; ++r) repack(w0.data() + r * rb, w8.data() + r * rbx, cols);
  std::vector<float> x(n * cols);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng);
  std::vector<int8_t> xq(n * cols);
  std::vector<q8ref::Q8Ds> xds(n * cols / 32);
  q8ref::quantize(x.data(), n, cols, xq.data(), xds.data());
  const auto* ds2 = reinterpret_cast<const float2*>(xds.data());
  int64_t compared = 0, differ = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int lpr : {1, 2, 4, 8, 16, 32})
      for (int sub = 0; sub < lpr; ++sub) {
        float a[4] = {}, b16[4] = {}, b2[4] = {};
        q8d::row_lane_partial<F0, 2, 4>(w0.data() + r * rb, cols, sub, lpr, xq.data(), ds2, int(n), a);
        q8d::row_lane_partial<FX, 16, 4>(w8.data() + r * rbx, cols, sub, lpr, xq.data(), ds2, int(n), b16);
        q8d::row_lane_partial<FX, 2, 4>(w8.data() + r * rbx, cols, sub, lpr, xq.data(), ds2, int(n), b2);
        for (int t = 0; t < n; ++t, ++compared)
          differ += !test::same_bits(a[t], b16[t]) || !test::same_bits(a[t], b2[t]);
      }
  EXPECT_EQ(differ, 0) << "of " << compared << " lane partials";
  EXPECT_GT(compared, 0);
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_TRUE(test::same_bits(q8ref::row_dot(tx, w8.data() + r * rbx, cols, xq.data(), xds.data()),
                                q8ref::row_dot(t0, w0.data() + r * rb, cols, xq.data(), xds.data())))
        << "row " << r;
}

TEST(Q8Host, Q4_0X8LanesSameBitsAsQ4_0) {
  expect_regrouped_lanes_same_bits<q8d::DQ40, q8d::DQ40X8>(GgmlType::Q4_0, GgmlType::Q4_0_X8, 2048,
                                                          repack_q4_0_x8, 25);
}

// Q6_K_X8 (Q6_K regrouped, the GPU's storage for Q6_K dense products): the tasks of a row in Q6_K's order
// with Q6_K's sums, at 2048 and 4096 columns (one and two groups a row).
// Q6_K_P (Q6_K padded to 224-byte blocks, the GPU's storage for Q6_K expert down matrices): Q6_K's tasks on
// the same blocks, at an expert down row's 768 columns and at 256.
TEST(Q8Host, Q6_KPLanesSameBitsAsQ6_K) {
  for (int64_t cols : {256, 768}) {
    SCOPED_TRACE(cols);
    expect_regrouped_lanes_same_bits<q8d::DQ6K, q8d::DQ6KP>(GgmlType::Q6_K, GgmlType::Q6_K_P, cols, repack_q6_k_p,
                                                           uint32_t(27 + cols));
  }
}

TEST(Q8Host, Q6_KX8LanesSameBitsAsQ6_K) {
  for (int64_t cols : {2048, 4096}) {
    SCOPED_TRACE(cols);
    expect_regrouped_lanes_same_bits<q8d::DQ6K, q8d::DQ6KX8>(GgmlType::Q6_K, GgmlType::Q6_K_X8, cols,
                                                            repack_q6_k_x8, uint32_t(26 + cols));
  }
}

// The low-bit formats' byte helpers: iq4nl4 (the IQ4 table by byte_perm, the device's code path run with the
// host's byte_perm) on every word of four indices, sub4 on every code word of Q3_K, signed4 on every sign
// pattern of a few magnitude words.
TEST(Q8Host, LowBitByteHelpers) {
  int64_t wrong = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint32_t n = (i & 15) | ((i >> 4 & 15) << 8) | ((i >> 8 & 15) << 16) | ((i >> 12 & 15) << 24);
    const uint32_t got = uint32_t(q8d::iq4nl4(n));
    for (int k = 0; k < 4; ++k)
      wrong += int8_t(got >> (8 * k)) != iq::kIq4nlValues[(n >> (8 * k)) & 15];
  }
  EXPECT_EQ(wrong, 0);
  for (uint32_t i = 0; i < 4096; ++i) {
    const uint32_t c = (i & 7) | ((i >> 3 & 7) << 8) | ((i >> 6 & 7) << 16) | ((i >> 9 & 7) << 24);
    const uint32_t got = uint32_t(q8d::sub4(c));
    for (int k = 0; k < 4; ++k) wrong += int8_t(got >> (8 * k)) != int((c >> (8 * k)) & 7) - 4;
  }
  EXPECT_EQ(wrong, 0);
  for (uint32_t g : {0x2B19082Bu, 0x7F000108u, 0x3E2C1A04u})
    for (uint32_t s = 0; s < 32; ++s) {  // (bit 4 must be ignored)
      const uint32_t got = uint32_t(q8d::signed4(g, s));
      for (int k = 0; k < 4; ++k) {
        const int mag = int((g >> (8 * k)) & 0xFF);
        wrong += int8_t(got >> (8 * k)) != ((s >> k) & 1 ? -mag : mag);
      }
    }
  EXPECT_EQ(wrong, 0);
}

// Loads by alignment: align_of, the A each format gets from dispatch, and gate_up's pairs.
TEST(Q8Host, DispatchAlignmentAndPairs) {
  EXPECT_EQ(q8d::align_of(0x1000, 1088).bytes, 16);
  EXPECT_EQ(q8d::align_of(0x1000, 408).bytes, 8);
  EXPECT_EQ(q8d::align_of(0x1004, 672).bytes, 4);
  EXPECT_EQ(q8d::align_of(0x1000, 110).bytes, 2);
  auto a_of = [](GgmlType t, int al) {
    int a = -1;
    q8d::dispatch(t, q8d::Align{al}, [&](auto, auto ac) { a = decltype(ac)::value; });
    return a;
  };
  EXPECT_EQ(a_of(GgmlType::Q2_K, 16), 4);
  EXPECT_EQ(a_of(GgmlType::Q2_K, 2), -1);  // below q8ref::min_row_align: no kernel (the callers refuse first)
  EXPECT_EQ(a_of(GgmlType::IQ4_XS, 16), 8);
  EXPECT_EQ(a_of(GgmlType::IQ4_XS, 4), -1);
  EXPECT_EQ(a_of(GgmlType::Q3_K, 16), 2);
  EXPECT_EQ(a_of(GgmlType::IQ4_NL, 16), 2);
  EXPECT_EQ(a_of(GgmlType::Q4_K, 16), 16);
  EXPECT_EQ(a_of(GgmlType::Q4_K, 8), 2);
  EXPECT_EQ(a_of(GgmlType::IQ1_M, 16), 8);
  EXPECT_EQ(a_of(GgmlType::IQ1_M, 4), -1);
  for (GgmlType t : kTypes) EXPECT_NE(a_of(t, q8ref::min_row_align(t)), -1) << type_name(t);
  EXPECT_EQ(a_of(GgmlType::IQ2_XS, 16), 2);
  EXPECT_EQ(a_of(GgmlType::Q5_0, 16), -1);
  auto pair = [](GgmlType g, int ga, GgmlType u, int ua) {
    int ag = -1, au = -1;
    const bool ok = q8d::dispatch_pair(g, q8d::Align{ga}, u, q8d::Align{ua}, [&](auto, auto a, auto, auto b) {
      ag = decltype(a)::value, au = decltype(b)::value;
    });
    return ok ? ag * 100 + au : -1;
  };
  EXPECT_EQ(pair(GgmlType::Q4_K, 16, GgmlType::Q6_K, 16), 1602);
  EXPECT_EQ(pair(GgmlType::IQ4_XS, 16, GgmlType::IQ4_XS, 8), 808);
  EXPECT_EQ(pair(GgmlType::IQ4_XS, 16, GgmlType::IQ4_XS, 4), -1);  // both at the smaller alignment: too small
  EXPECT_EQ(pair(GgmlType::Q3_K, 16, GgmlType::Q3_K, 4), 202);
  EXPECT_EQ(pair(GgmlType::Q2_K, 4, GgmlType::Q2_K, 4), 404);
  EXPECT_EQ(pair(GgmlType::Q3_K, 2, GgmlType::Q4_K, 16), -1);
  EXPECT_EQ(pair(GgmlType::Q4_K, 16, GgmlType::IQ4_NL, 2), -1);
  // The reference's rule is the same (the models ask moe_supported before launching).
  for (GgmlType g : kTypes)
    for (GgmlType u : kTypes) {
      q8ref::ExpertView v;
      alignas(16) static uint8_t slot[16];
      v.slots = slot, v.slot_bytes = 1 << 20, v.n_embd = 2048, v.n_ff = 768;
      v.gate_type = g, v.up_type = u, v.down_type = GgmlType::Q6_K;
      EXPECT_EQ(q8ref::moe_supported(v), pair(g, 16, u, 16) >= 0) << type_name(g) << " / " << type_name(u);
    }
}

// moe_down's kernel choice by mode (q8_kernels.cuh moe_down_kernel): 2 (the default) slots for one token of
// Q4_0_X8 down only; 3 also for one token of Q6_K_P down; 1 always; 0 never; anything else an error.
TEST(Q8Host, MoeDownKernelChoice) {
  namespace q8 = strata::cuda::q8;
  const int was = q8::moe_down_kernel();
  auto pick = [](int mode, int64_t n, GgmlType t) {
    q8::set_moe_down_kernel(mode);
    return q8::moe_down_slots(n, t);
  };
  for (GgmlType t : {GgmlType::Q4_0_X8, GgmlType::Q6_K_P, GgmlType::Q4_K, GgmlType::Q6_K}) {
    for (int64_t n : {1, 2}) {
      const bool x8 = t == GgmlType::Q4_0_X8 && n == 1, kp = t == GgmlType::Q6_K_P && n == 1;
      EXPECT_FALSE(pick(0, n, t)) << type_name(t) << " n " << n;
      EXPECT_TRUE(pick(1, n, t)) << type_name(t) << " n " << n;
      EXPECT_EQ(pick(2, n, t), x8) << type_name(t) << " n " << n;
      EXPECT_EQ(pick(3, n, t), x8 || kp) << type_name(t) << " n " << n;
    }
  }
  EXPECT_THROW(q8::set_moe_down_kernel(4), Error);
  EXPECT_THROW(q8::set_moe_down_kernel(-1), Error);
  q8::set_moe_down_kernel(was);
}

}  // namespace
