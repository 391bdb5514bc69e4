// The small ops of a decode layer's attention input on Qwen3-30B-A3B's geometry (32 query / 4 KV heads of
// 128, f16 KV cache), old against new in the same run: the five launches rmsnorm(q), rmsnorm(k),
// rope_neox(q), rope_neox(k), kv_store against one ops::attn_prep (plus ops::rope_cos_sin, which a forward
// runs once for all layers: shown per call and per 48 layers); and the router of a layer (128 x 2048 F32,
// top 8): quant::matmul + ops::moe_route against ops::router_route's two kernels (warp per row, block per
// row). The router rows go through 96 different matrices (96 MB, more than the H200's 50 MB L2) so each
// call reads its weights from HBM, as in a 48-layer decode. The block kernel also with PDL switched the
// other way, and the ffn norm + router (q8::rmsnorm_quantize + router_route against norm_router_route).
// Each row is timed two ways: 48 back-to-back direct launches (a 48-layer decode without graphs) and one
// CUDA graph of 48 repetitions (the graph decode). Prints a markdown table of microseconds per layer and
// the ratio new/old.
//
// Usage: bench_attn_prep [--reps 200]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "bench_main.h"
#include "event_timer.cuh"
#include "cuda/device.h"
#include "cuda/graph.h"
#include "cuda/ops.cuh"
#include "cuda/ops_fused.cuh"
#include "cuda/pdl.cuh"
#include "cuda/q8_kernels.cuh"
#include "cuda/quant_kernels.cuh"
#include "cuda/transfer.h"

namespace {

using namespace strata;
using namespace strata::cuda;

constexpr int kHead = 32, kHeadKv = 4, kDim = 128, kLayers = 48, kCtx = 4096, kExperts = 128, kUsed = 8,
              kEmbd = 2048;
constexpr float kBase = 1e6f, kEps = 1e-6f;

using strata::bench::time_us;

}  // namespace

int main(int argc, char** argv) {
  int reps = 200;
  if (const int rc = bench::start("bench_attn_prep", argc, argv, {{"--reps", &reps, 1}})) return rc;
  Device dev(0);
  Transfer xfer(dev);
  Stream& cs = dev.compute();
  const cudaStream_t s = cs.handle();
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto upload = [&](const std::vector<float>& h, const char* name) {
    DeviceBuffer b = dev.alloc(h.size() * 4, name);
    xfer.upload(b.span(), h.data(), h.size() * 4, cs, {&cs});
    return b;
  };
  auto randv = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  const int max_tok = 8;
  const int64_t qw = kHead * kDim, kw = kHeadKv * kDim, W = qw + 2 * kw;
  DeviceBuffer qkv = upload(randv(size_t(max_tok * W)), "qkv");
  DeviceBuffer q = upload(randv(size_t(max_tok * qw)), "q"), k = upload(randv(size_t(max_tok * kw)), "k"),
               v = upload(randv(size_t(max_tok * kw)), "v");
  DeviceBuffer q_out = dev.alloc(size_t(max_tok * qw) * 4, "q_out");
  DeviceBuffer qn = upload(randv(kDim), "q_norm"), kn = upload(randv(kDim), "k_norm");
  DeviceBuffer kc = dev.alloc(size_t(kLayers) * kCtx * size_t(kw) * 2, "k cache"),
               vc = dev.alloc(size_t(kLayers) * kCtx * size_t(kw) * 2, "v cache");
  std::vector<ops::KvRef> refs(max_tok);
  std::vector<int32_t> pos(max_tok);
  for (int t = 0; t < max_tok; ++t) {
    pos[size_t(t)] = 1000 + t;
    refs[size_t(t)] = {kc.as<uint16_t>(), vc.as<uint16_t>(), kCtx, pos[size_t(t)]};
  }
  DeviceBuffer drefs = dev.alloc(refs.size() * sizeof(ops::KvRef), "refs"), dpos = dev.alloc(pos.size() * 4, "pos");
  xfer.upload(drefs.span(), refs.data(), refs.size() * sizeof(ops::KvRef), cs, {&cs});
  xfer.upload(dpos.span(), pos.data(), pos.size() * 4, cs, {&cs});
  DeviceBuffer cs_tab = dev.alloc(size_t(max_tok) * kDim * 4, "rope cs");
  DeviceBuffer logits = upload(randv(size_t(max_tok) * kExperts), "router logits");
  DeviceBuffer ids = dev.alloc(size_t(max_tok) * kUsed * 4, "ids"), wts = dev.alloc(size_t(max_tok) * kUsed * 4, "wts");
  constexpr int kRouterCopies = 96;
  const size_t router_floats = size_t(kExperts) * kEmbd;
  std::vector<float> rw = randv(router_floats);
  for (auto& f : rw) f *= 0.02f;
  rw.resize(router_floats * kRouterCopies);
  for (int c = 1; c < kRouterCopies; ++c) std::copy(rw.begin(), rw.begin() + long(router_floats), rw.begin() + long(c * router_floats));
  DeviceBuffer router_w = upload(rw, "router"), xn = upload(randv(size_t(max_tok) * kEmbd), "xn");
  DeviceBuffer counter = dev.alloc(16, "route counter");
  xfer.fill(counter.span(), 0, cs, {&cs});
  cs.synchronize();

  const ops::AttnPrepShape shape{kHead, kHeadKv, kDim, kDim, kDim, kEps};
  // Per layer: the old five launches, the new one; a forward's one rope_cos_sin; moe_route.
  auto old_seq = [&](int n, int layer) {
    ops::rmsnorm(q.as<float>(), qn.as<float>(), n * kHead, kDim, kEps, q.as<float>(), s);
    ops::rmsnorm(k.as<float>(), kn.as<float>(), n * kHeadKv, kDim, kEps, k.as<float>(), s);
    ops::rope_neox(q.as<float>(), dpos.as<int32_t>(), n, kHead, kDim, kDim, kBase, s);
    ops::rope_neox(k.as<float>(), dpos.as<int32_t>(), n, kHeadKv, kDim, kDim, kBase, s);
    ops::kv_store(k.as<float>(), v.as<float>(), drefs.as<ops::KvRef>(), n, layer, kw, kw, s);
  };
  auto new_seq = [&](int n, int layer) {
    const float* b = qkv.as<float>();
    ops::attn_prep(b, W, b + qw, W, b + qw + kw, W, qn.as<float>(), kn.as<float>(), cs_tab.as<float>(),
                   drefs.as<ops::KvRef>(), n, layer, shape, q_out.as<float>(), s);
  };
  auto angles = [&](int n) { ops::rope_cos_sin(dpos.as<int32_t>(), n, kDim, kBase, cs_tab.as<float>(), s); };
  auto route = [&](int n) {
    ops::moe_route(logits.as<float>(), n, kExperts, kUsed, true, ids.as<int32_t>(), wts.as<float>(), s);
  };
  auto rmat = [&](int l) { return router_w.as<float>() + size_t(l % kRouterCopies) * router_floats; };
  auto router_old = [&](int n, int l) {
    quant::matmul(GgmlType::F32, rmat(l), kExperts, kEmbd, xn.as<float>(), n, logits.as<float>(), s);
    route(n);
  };
  // The ffn norm + router: q8::rmsnorm_quantize then router_route (two launches) against norm_router_route.
  DeviceBuffer nw = upload(randv(kEmbd), "ffn_norm"), xres = upload(randv(size_t(max_tok) * kEmbd), "x");
  DeviceBuffer ny = dev.alloc(size_t(max_tok) * kEmbd * 4, "xn"), nq = dev.alloc(size_t(max_tok) * kEmbd, "xq"),
               nds = dev.alloc(size_t(max_tok) * kEmbd / 32 * 8, "xds");
  auto norm_then_router = [&](int n, int l) {
    q8::rmsnorm_quantize(xres.as<float>(), nw.as<float>(), n, kEmbd, kEps, ny.as<float>(), nq.as<int8_t>(),
                         nds.as<float2>(), s);
    ops::router_route(rmat(l), kExperts, kEmbd, ny.as<float>(), n, kUsed, true, logits.as<float>(), ids.as<int32_t>(),
                      wts.as<float>(), counter.as<uint32_t>(), s);
  };
  auto norm_router = [&](int n, int l) {
    ops::norm_router_route(xres.as<float>(), nw.as<float>(), kEps, rmat(l), kExperts, kEmbd, n, kUsed, true,
                           ny.as<float>(), nq.as<int8_t>(), nds.as<float2>(), logits.as<float>(), ids.as<int32_t>(),
                           wts.as<float>(), counter.as<uint32_t>(), s);
  };
  auto router_new = [&](int n, int l, ops::RouterRouteKernel kern) {
    ops::router_route(rmat(l), kExperts, kEmbd, xn.as<float>(), n, kUsed, true, logits.as<float>(),
                      ids.as<int32_t>(), wts.as<float>(), counter.as<uint32_t>(), s, kern);
  };
  // us per layer: `calls` (default 48) layers launched directly, and the same in one graph.
  auto per_layer = [&](auto&& layer_fn, int calls = kLayers) {
    const double direct = time_us(s, reps, [&] {
      for (int l = 0; l < calls; ++l) layer_fn(l);
    }) / calls;
    Graph g = Graph::capture(cs, [&] {
      for (int l = 0; l < calls; ++l) layer_fn(l);
    });
    const double graph = time_us(s, reps, [&] { g.launch(cs); }) / calls;
    return std::pair<double, double>(direct, graph);
  };

  std::printf("| op (per layer) | tokens | launches | direct us | graph us | graph new/old |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (int n : {1, 8}) {
    angles(n);
    const auto o = per_layer([&](int l) { old_seq(n, l); });
    const auto f = per_layer([&](int l) { new_seq(n, l); });
    const auto a = per_layer([&](int) { angles(n); });
    const auto r = per_layer([&](int) { route(n); });
    const auto ro = per_layer([&](int l) { router_old(n, l); }, kRouterCopies);
    const auto rw1 = per_layer([&](int l) { router_new(n, l, ops::RouterRouteKernel::kWarpPerRow); }, kRouterCopies);
    const auto rn = per_layer([&](int l) { router_new(n, l, ops::RouterRouteKernel::kBlockPerRow); }, kRouterCopies);
    const bool pdl_was = pdl::enabled();
    pdl::set_enabled(!pdl_was);  // the same kernel launched the other way (PDL lets the next row's weights load early)
    const auto rp = per_layer([&](int l) { router_new(n, l, ops::RouterRouteKernel::kBlockPerRow); }, kRouterCopies);
    pdl::set_enabled(pdl_was);
    const auto nr2 = per_layer([&](int l) { norm_then_router(n, l); }, kRouterCopies);
    const auto nr1 = per_layer([&](int l) { norm_router(n, l); }, kRouterCopies);
    std::printf("| rmsnorm q,k + rope q,k + kv_store (old) | %d | 5 | %.2f | %.2f | 1 |\n", n, o.first, o.second);
    std::printf("| attn_prep (new) | %d | 1 | %.2f | %.2f | %.3f |\n", n, f.first, f.second, f.second / o.second);
    std::printf("| attn_prep + rope_cos_sin/48 (new, per layer of a forward) | %d | 1 + 1/48 | %.2f | %.2f | %.3f |\n", n,
                f.first + a.first / kLayers, f.second + a.second / kLayers,
                (f.second + a.second / kLayers) / o.second);
    std::printf("| rope_cos_sin (once per forward) | %d | 1 | %.2f | %.2f | - |\n", n, a.first, a.second);
    std::printf("| moe_route (128 experts, top 8) | %d | 1 | %.2f | %.2f | - |\n", n, r.first, r.second);
    std::printf("| router matmul (F32 128x2048) + moe_route (old) | %d | 2 | %.2f | %.2f | 1 |\n", n, ro.first,
                ro.second);
    std::printf("| router_route, warp per row (STRATA_CUDA_ROUTER=warp) | %d | 1 | %.2f | %.2f | %.3f |\n", n,
                rw1.first, rw1.second, rw1.second / ro.second);
    std::printf("| router_route, block per row (default), PDL %s | %d | 1 | %.2f | %.2f | %.3f |\n",
                pdl_was ? "on" : "off", n, rn.first, rn.second, rn.second / ro.second);
    std::printf("| router_route, block per row, PDL %s | %d | 1 | %.2f | %.2f | %.3f |\n", pdl_was ? "off" : "on", n,
                rp.first, rp.second, rp.second / ro.second);
    std::printf("| q8::rmsnorm_quantize + router_route (STRATA_CUDA_NORM_ROUTER=0) | %d | 2 | %.2f | %.2f | 1 |\n", n,
                nr2.first, nr2.second);
    std::printf("| norm_router_route (default) | %d | 1 | %.2f | %.2f | %.3f |\n", n, nr1.first, nr1.second,
                nr1.second / nr2.second);
  }
  cs.synchronize();
  return 0;
}
