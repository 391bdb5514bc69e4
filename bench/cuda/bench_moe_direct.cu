// Direct reads of non-resident experts (moe/direct_rule.h) on Qwen3-30B-A3B's expert geometry (n_embd 2048,
// n_ff 768, Q4_K gate / up / down, 128 experts of which every 4th is resident, k = 8): one decoded token's
// GPU experts (moe_gate_up + moe_down) with the direct pairs
//   - read by the expert kernels straight from pinned host memory (zero-copy),
//   - fetched into staging slots first (moe_direct_fetch, then the kernels from device memory),
// against the baseline in the same process: the same bytes copied host -> device by the copy engine
// (Transfer::upload from pinned memory, one copy per expert). Prints microseconds per token and the
// direct bytes' rate (direct experts x slot bytes / time), and each path's share of the DMA's rate. Every
// repetition routes to other experts, so no expert is read twice in a row (the GPU's L2 holds 60 MB).
//
// Usage: bench_moe_direct [--reps 50]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "bench_main.h"
#include "event_timer.cuh"
#include "cuda/device.h"
#include "cuda/moe_kernels.cuh"
#include "cuda/transfer.h"
#include "moe/direct_rule.h"
#include "quant/types.h"

namespace {

using namespace strata;
using namespace strata::cuda;

constexpr int64_t kEmbd = 2048, kFf = 768;
constexpr int kExperts = 128, kUsed = 8;

using strata::bench::time_us;

}  // namespace

int main(int argc, char** argv) {
  int reps = 50;
  if (const int rc = bench::start("bench_moe_direct", argc, argv, {{"--reps", &reps, 1}})) return rc;
  Device dev(0);
  Transfer xfer(dev);
  Stream& cs = dev.compute();
  const cudaStream_t s = cs.handle();

  cuda::moe::ExpertLayerView v;
  v.gate_type = v.up_type = v.down_type = GgmlType::Q4_K;
  const int64_t gb = int64_t(row_bytes(GgmlType::Q4_K, kEmbd)) * kFf, db = int64_t(row_bytes(GgmlType::Q4_K, kFf)) * kEmbd;
  v.gate_off = 0, v.up_off = gb, v.down_off = 2 * gb, v.slot_bytes = (2 * gb + db + 255) / 256 * 256;
  v.n_embd = kEmbd, v.n_ff = kFf;
  // Weights: bytes 0x11 (finite values; the rate does not depend on them).
  PinnedBuffer host = dev.alloc_pinned(size_t(kExperts) * size_t(v.slot_bytes), "experts (host)");
  std::memset(host.data(), 0x11, host.bytes());
  const int n_res = kExperts / 4;
  auto slots = dev.alloc(size_t(n_res + kUsed) * size_t(v.slot_bytes), "slots + staging");
  xfer.fill(slots.span(), 0x11, cs, {&cs});
  std::vector<int32_t> table(kExperts, -1);
  for (int e = 0, sl = 0; e < kExperts; e += 4) table[size_t(e)] = sl++;
  v.slots = slots.as<uint8_t>();
  // Routing of `reps` + 2 tokens: 8 distinct experts each, 2 resident and 6 not (as at 25% resident),
  // each token's experts other than the previous token's.
  std::mt19937 rng(7);
  std::vector<int32_t> ids;
  std::vector<int> res, non;
  for (int e = 0; e < kExperts; ++e) (table[size_t(e)] >= 0 ? res : non).push_back(e);
  for (int r = 0; r < reps + 2; ++r) {  // the timed calls, then the 2 warm-ups
    std::shuffle(res.begin(), res.end(), rng);
    std::shuffle(non.begin(), non.end(), rng);
    for (int j = 0; j < 2; ++j) ids.push_back(res[size_t(j)]);
    for (int j = 0; j < 6; ++j) ids.push_back(non[size_t(j)]);
  }
  std::vector<float> x(kEmbd, 0.01f), wts(kUsed, 0.125f);
  auto d_table = dev.alloc(table.size() * 4, "table"), d_ids = dev.alloc(ids.size() * 4, "ids");
  auto d_x = dev.alloc(x.size() * 4, "x"), d_w = dev.alloc(wts.size() * 4, "wts");
  auto d_h = dev.alloc(size_t(kUsed) * kFf * 4, "h"), d_out = dev.alloc(kEmbd * 4, "out");
  xfer.upload(d_table.span(), table.data(), table.size() * 4, cs, {&cs});
  xfer.upload(d_ids.span(), ids.data(), ids.size() * 4, cs, {&cs});
  xfer.upload(d_x.span(), x.data(), x.size() * 4, cs, {&cs});
  xfer.upload(d_w.span(), wts.data(), wts.size() * 4, cs, {&cs}).wait();

  auto experts = [&](const cuda::moe::ExpertLayerView& view, int r, bool fetch) {
    const int32_t* idr = d_ids.as<int32_t>() + size_t(r) * kUsed;
    if (fetch) cuda::moe::moe_direct_fetch(view, d_table.as<int32_t>(), idr, 1, kUsed, s);
    cuda::moe::moe_gate_up(view, d_table.as<int32_t>(), d_x.as<float>(), idr, 1, kUsed, d_h.as<float>(), s);
    cuda::moe::moe_down(view, d_table.as<int32_t>(), d_h.as<float>(), idr, d_w.as<float>(), 1, kUsed, d_out.as<float>(), s);
  };
  const double resident_us = time_us(s, reps, [&](int r) { experts(v, r, false); });

  // DMA baseline: the same number of experts, each its own copy from pinned memory into a staging slot.
  const double bytes_per = double(v.slot_bytes);
  std::printf("expert %.2f MiB (slot), 6 of a token's 8 experts not resident, %d reps\n\n", bytes_per / 1048576.0, reps);
  std::printf("| share | direct experts | path | us/token | direct GB/s | of DMA |\n|---|---:|---|---:|---:|---:|\n");
  std::printf("| 0 | 0 | resident only | %.1f | - | - |\n", resident_us);
  for (int share : {64, 96, 128, 256}) {
    const int nd = strata::moe::direct_count(6, share);
    const double dma_us = time_us(s, reps, [&](int r) {
      for (int i = 0; i < nd; ++i) {
        const int e = ids[size_t(r) * kUsed + 2 + i];
        const DevSpan dst{slots.as<uint8_t>() + size_t(n_res + i) * size_t(v.slot_bytes), size_t(v.slot_bytes),
                          slots.span().check_id};
        const HostSpan src{host.as<uint8_t>() + size_t(e) * size_t(v.slot_bytes), size_t(v.slot_bytes),
                           host.span().check_id, true};
        xfer.upload(dst, src, cs, {&cs});
      }
    });
    const double dma_gbs = nd * bytes_per / dma_us * 1e-3;
    std::printf("| %s | %d | DMA copy (baseline) | %.1f | %.1f | 100%% |\n", strata::moe::direct_share_str(share).c_str(), nd,
                dma_us, dma_gbs);
    cuda::moe::ExpertLayerView d = v;
    d.direct = host.as<uint8_t>();
    d.direct_share = share;
    for (bool fetch : {false, true}) {
      d.stage = fetch ? slots.as<uint8_t>() + size_t(n_res) * size_t(v.slot_bytes) : nullptr;
      d.stage_per_token = fetch ? strata::moe::direct_count(kUsed, share) : 0;
      const double us = time_us(s, reps, [&](int r) { experts(d, r, fetch); });
      const double gbs = nd * bytes_per / us * 1e-3;
      std::printf("| %s | %d | %s | %.1f | %.1f | %.0f%% |\n", strata::moe::direct_share_str(share).c_str(), nd,
                  fetch ? "fetched, then kernels" : "kernels read host memory", us, gbs, 100.0 * gbs / dma_gbs);
    }
  }
  cs.synchronize();
  return 0;
}
