// The int8-activation kernels' per-lane code (src/cuda/q8_formats.cuh: the 5 formats' task dots and
// row_lane_partial) run on the host, without a GPU:
//  * one lane doing every task of a row in order (lpr = 1) gives q8ref::row_dot's value bit for bit, for
//    random weights at 2048 and 768 columns and for the zoo tensors (llama.cpp's data), tokens tiled by
//    8 with a partial tile (the kernels' token loop);
//  * 32 and 16 lanes per row summed with the kernels' butterfly order: within 1e-5 of sum|w*x|.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/host/q8_reference.h"
#include "cuda/q8_formats.cuh"
#include "gguf/gguf.h"
#include "gpu_test_util.h"
#include "quant/dequant.h"

namespace {

using namespace strata;
namespace q8d = strata::cuda::q8d;
namespace q8ref = strata::cuda::q8ref;

const GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

struct Result {
  int64_t not_identical = 0;  // lpr = 1 vs the reference (bits)
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
  q8d::dispatch(t, true, [&](auto f, auto a) {
    using F = decltype(f);
    constexpr int A = decltype(a)::value;
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* wr = w + r * rb;
      dequantize_row(t, wr, wf.data(), cols);
      float one[16] = {};
      for (int64_t t0 = 0; t0 < n; t0 += 8)  // tiles of 8 tokens, the last one partial
        q8d::row_lane_partial<F, A, 8>(wr, cols, 0, 1, xq.data() + t0 * cols, ds2 + t0 * (cols / 32),
                                       int(std::min<int64_t>(8, n - t0)), one + t0);
      for (int64_t tk = 0; tk < n; ++tk) {
        const float ref = q8ref::row_dot(t, wr, cols, xq.data() + tk * cols, xds.data() + tk * (cols / 32));
        res.not_identical += !test::same_bits(one[tk], ref);
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
  EXPECT_EQ(compared, 5) << "zoo tensors of the 5 q8 formats";
}

}  // namespace
