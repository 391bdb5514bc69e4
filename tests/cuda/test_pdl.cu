// Programmatic dependent launch (cuda/pdl.cuh): a chain of dependent decode kernels launched with the PDL
// attribute gives the same bits as the same chain launched without it, both launched directly and
// replayed from a CUDA graph (stream capture turns the attribute into programmatic edges). The chain is
// what a decode layer does between its products: rmsnorm_quantize(x) -> router_route(y) -> q8 matvec that
// adds into x -> norm_router_route(x), 12 times, so every kernel reads what the one before it wrote (a kernel that ran ahead of
// its pdl_wait() would read a stale x, y or xq and change the result). Skipped where there is no GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/graph.h"
#include "cuda/ops.cuh"
#include "cuda/ops_fused.cuh"
#include "cuda/pdl.cuh"
#include "cuda/q8_kernels.cuh"
#include "cuda/quant_kernels.cuh"
#include "gpu_test_util.h"

namespace {

using namespace strata;
using namespace strata::cuda;

class CudaPdl : public strata::test::GpuKernelTest {};

TEST_F(CudaPdl, DependentChainSameBitsWithAndWithoutPdl) {
  constexpr int64_t E = 2048;
  constexpr int kSteps = 12, kExperts = 128, kUsed = 8;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t rb = int64_t(row_bytes(GgmlType::Q4_K, uint64_t(E)));
  const std::vector<uint8_t> w = strata::test::random_weights(GgmlType::Q4_K, E, E, rng);
  std::vector<float> norm(E), router(size_t(kExperts) * E), x0(E);
  for (auto& v : norm) v = 1.0f + 0.1f * nd(rng);
  for (auto& v : router) v = 0.02f * nd(rng);
  for (auto& v : x0) v = nd(rng);
  Buf dw = upload_vec(w), dn = upload_vec(norm), dr = upload_vec(router);

  struct Result {
    std::vector<float> x, wts;
    std::vector<int32_t> ids, ids2;
  };
  auto run = [&](bool pdl_on, bool graph) {
    pdl::set_enabled(pdl_on);
    Buf dx = upload_vec(x0), dy = output(E * 4), dq = output(E), dds = output(E / 32 * 8), dl = output(kExperts * 4),
        di = output(kSteps * kUsed * 4), dwt = output(kSteps * kUsed * 4), cnt = output(16, 0);
    Buf dy2 = output(E * 4), dq2 = output(E), dds2 = output(E / 32 * 8), dl2 = output(kExperts * 4),
        di2 = output(kSteps * kUsed * 4), dwt2 = output(kSteps * kUsed * 4), cnt2 = output(16, 0);
    auto enqueue = [&] {
      for (int s = 0; s < kSteps; ++s) {
        q8::rmsnorm_quantize(dx.ptr<float>(), dn.ptr<float>(), 1, E, 1e-6f, dy.ptr<float>(), dq.ptr<int8_t>(),
                             dds.ptr<float2>(), stream());
        ops::router_route(dr.ptr<float>(), kExperts, E, dy.ptr<float>(), 1, kUsed, true, dl.ptr<float>(),
                          di.ptr<int32_t>() + s * kUsed, dwt.ptr<float>() + s * kUsed, cnt.ptr<uint32_t>(), stream());
        q8::matvec(GgmlType::Q4_K, dw.ptr(), E, E, rb, dq.ptr<int8_t>(), dds.ptr<float2>(), 1, dx.ptr<float>(), true,
                   stream());
        ops::norm_router_route(dx.ptr<float>(), dn.ptr<float>(), 1e-6f, dr.ptr<float>(), kExperts, E, 1, kUsed, true,
                               dy2.ptr<float>(), dq2.ptr<int8_t>(), dds2.ptr<float2>(), dl2.ptr<float>(),
                               di2.ptr<int32_t>() + s * kUsed, dwt2.ptr<float>() + s * kUsed, cnt2.ptr<uint32_t>(),
                               stream());
      }
    };
    if (graph) {
      Graph g = Graph::capture(dev->compute(), enqueue);
      g.launch(dev->compute());
    } else {
      enqueue();
    }
    return Result{download<float>(dx, E), download<float>(dwt, kSteps * kUsed), download<int32_t>(di, kSteps * kUsed),
                  download<int32_t>(di2, kSteps * kUsed)};
  };
  const bool was = pdl::enabled();
  const Result ref = run(false, false);
  for (const bool graph : {false, true}) {
    SCOPED_TRACE(graph ? "graph replay" : "direct launches");
    const Result got = run(true, graph);
    size_t xbad = 0, wbad = 0;
    for (int64_t i = 0; i < E; ++i) xbad += !strata::test::same_bits(got.x[size_t(i)], ref.x[size_t(i)]);
    for (size_t i = 0; i < got.wts.size(); ++i) wbad += !strata::test::same_bits(got.wts[i], ref.wts[i]);
    EXPECT_EQ(xbad, 0u) << "x after " << kSteps << " steps differs with PDL; x[0] " << got.x[0] << " vs " << ref.x[0];
    EXPECT_EQ(got.ids, ref.ids) << "router ids differ with PDL";
    EXPECT_EQ(got.ids2, ref.ids2) << "norm_router_route ids differ with PDL";
    EXPECT_EQ(wbad, 0u) << "router weights differ with PDL";
  }
  // The graph without PDL too (the same chain, plain edges).
  const Result plain_graph = run(false, true);
  EXPECT_EQ(plain_graph.ids, ref.ids);
  pdl::set_enabled(was);
  std::printf("[pdl chain] %d steps: x[0] %.6g, first ids %d %d %d\n", kSteps, ref.x[0], ref.ids[0], ref.ids[1],
              ref.ids[2]);
}

// The f32-activation decode chain (what a CPU-pool pass runs between two gates): rmsnorm -> the fast Q4_K
// product adding into x -> rmsnorm -> the generic Q4_0 product into z -> add z into x, 12 times, each step
// reading what the one before it wrote. Same bits with PDL (direct and graph) as without.
TEST_F(CudaPdl, F32ChainSameBitsWithAndWithoutPdl) {
  constexpr int64_t E = 2048;
  constexpr int kSteps = 12;
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::vector<uint8_t> wk = strata::test::random_weights(GgmlType::Q4_K, E, E, rng);
  const std::vector<uint8_t> w0 = strata::test::random_weights(GgmlType::Q4_0, E, E, rng);
  std::vector<float> norm(E), x0(E);
  for (auto& v : norm) v = 1.0f + 0.1f * nd(rng);
  for (auto& v : x0) v = nd(rng);
  Buf dwk = upload_vec(wk), dw0 = upload_vec(w0), dn = upload_vec(norm);
  auto run = [&](bool pdl_on, bool graph) {
    pdl::set_enabled(pdl_on);
    Buf dx = upload_vec(x0), dy = output(E * 4), dz = output(E * 4);
    auto enqueue = [&] {
      for (int s = 0; s < kSteps; ++s) {
        ops::rmsnorm(dx.ptr<float>(), dn.ptr<float>(), 1, E, 1e-6f, dy.ptr<float>(), stream());
        quant::matmul(GgmlType::Q4_K, dwk.ptr(), E, E, dy.ptr<float>(), 1, dx.ptr<float>(), stream(), nullptr,
                      /*accumulate=*/true);
        ops::rmsnorm(dx.ptr<float>(), dn.ptr<float>(), 1, E, 1e-6f, dy.ptr<float>(), stream());
        quant::matmul(GgmlType::Q4_0, dw0.ptr(), E, E, dy.ptr<float>(), 1, dz.ptr<float>(), stream());
        ops::add_inplace(dx.ptr<float>(), dz.ptr<float>(), E, stream());
      }
    };
    if (graph) {
      Graph g = Graph::capture(dev->compute(), enqueue);
      g.launch(dev->compute());
    } else {
      enqueue();
    }
    return download<float>(dx, E);
  };
  const bool was = pdl::enabled();
  const std::vector<float> ref = run(false, false);
  for (const bool graph : {false, true}) {
    SCOPED_TRACE(graph ? "graph replay" : "direct launches");
    const std::vector<float> got = run(true, graph);
    size_t bad = 0;
    for (int64_t i = 0; i < E; ++i) bad += !strata::test::same_bits(got[size_t(i)], ref[size_t(i)]);
    EXPECT_EQ(bad, 0u) << "x after " << kSteps << " steps differs with PDL; x[0] " << got[0] << " vs " << ref[0];
  }
  pdl::set_enabled(was);
}

}  // namespace
