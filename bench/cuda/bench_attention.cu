// Attention kernels of src/cuda/ops.cu on Qwen3-30B-A3B's geometry (32 query heads, 4 KV heads of 128,
// f16 KV cache): decode (1 token) at contexts 512 / 4096 / 16384 with the F32 flash-decoding kernel and
// the GgmlF16 exact-mode kernel, plus causal prefill rows (64 tokens at context 4096, 512 tokens at 4096
// and 512 tokens from position 0; each with the CUDA-core and the tensor-core prefill kernel). Prints a markdown table with microseconds per call, the achieved
// KV-read bandwidth (bytes of K and V the call must read / time) and its ratio to the device-to-device
// copy bandwidth measured in the same run (the HBM baseline), and the attention arithmetic rate
// (Q.K and P.V multiply-adds of the causal positions, 2 flops each) for the compute-bound prefill rows.
//
// Usage: bench_attention [--reps 200]     (GgmlF16 runs reps/20, at least 3: it is sequential by design)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/half.h"
#include "cuda/attn_tile.cuh"
#include "cuda/cuda_check.cuh"
#include "bench_main.h"
#include "event_timer.cuh"
#include "cuda/device.h"
#include "cuda/ops.cuh"
#include "cuda/transfer.h"

namespace {

using namespace strata;
using namespace strata::cuda;

constexpr int kHead = 32, kHeadKv = 4, kDim = 128;

using strata::bench::time_us;

}  // namespace

int main(int argc, char** argv) {
  int reps = 200;
  if (const int rc = bench::start("bench_attention", argc, argv, {{"--reps", &reps, 1}})) return rc;
  Device dev(0);
  Transfer xfer(dev);
  Stream& cs = dev.compute();
  const cudaStream_t s = cs.handle();

  // HBM baseline: a 1 GiB device-to-device copy reads and writes every byte once.
  const size_t copy_bytes = size_t(1) << 30;
  auto src = dev.alloc(copy_bytes, "copy src"), dst = dev.alloc(copy_bytes, "copy dst");
  xfer.fill(src.span(), 1, cs, {&cs});
  double copy_us = 0;
  {
    const int n = 10;
    xfer.copy(dst.span(), src.span(), cs, {&cs}).wait();  // warm-up
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) xfer.copy(dst.span(), src.span(), cs, {&cs}).wait();
    copy_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
  }
  const double hbm_gbs = 2.0 * double(copy_bytes) / copy_us * 1e-3;  // read + write
  std::printf("HBM baseline (1 GiB device copy, read+write): %.0f GB/s\n\n", hbm_gbs);

  const int max_ctx = 16384;
  const size_t kv_vals = size_t(max_ctx) * kHeadKv * kDim;  // one layer
  std::vector<uint16_t> kv(kv_vals);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : kv) x = cpu::float_to_half(nd(rng));
  auto dk = dev.alloc(kv_vals * 2, "k"), dv = dev.alloc(kv_vals * 2, "v");
  xfer.upload(dk.span(), kv.data(), kv_vals * 2, cs, {&cs});
  xfer.upload(dv.span(), kv.data(), kv_vals * 2, cs, {&cs});
  const int max_tok = 512;
  std::vector<float> q(size_t(max_tok) * kHead * kDim);
  for (auto& x : q) x = nd(rng);
  auto dq = dev.alloc(q.size() * 4, "q");
  xfer.upload(dq.span(), q.data(), q.size() * 4, cs, {&cs});
  auto dout = dev.alloc(q.size() * 4, "out");
  auto drefs = dev.alloc(sizeof(ops::KvRef) * max_tok, "refs");
  size_t scratch_floats = 0;
  for (int n : {1, 64, max_tok})
    scratch_floats = std::max(scratch_floats, ops::attention_scratch_floats(n, kHead, kDim, max_ctx));
  auto dscratch = dev.alloc(scratch_floats * 4, "scratch");
  const float scale = 1.0f / std::sqrt(float(kDim));

  std::printf("| case | maths | tokens | context | us/call | KV bytes read | GB/s | of HBM copy | TFLOP/s |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  auto row = [&](const char* name, cpu::AttnMath math, int n_tok, int ctx, int r) {
    std::vector<ops::KvRef> refs(static_cast<size_t>(n_tok));
    for (int t = 0; t < n_tok; ++t)  // a prefill's tokens end at ctx-1
      refs[size_t(t)] = {dk.as<uint16_t>(), dv.as<uint16_t>(), max_ctx, ctx - n_tok + t};
    xfer.upload(drefs.span(), refs.data(), refs.size() * sizeof(ops::KvRef), cs, {&cs}).wait();
    const double us = time_us(s, r, [&] {
      ops::attention(dq.as<float>(), drefs.as<ops::KvRef>(), n_tok, 0, kHead, kHeadKv, kDim, kDim, scale, math,
                     ctx, dscratch.as<float>(), dout.as<float>(), s);
    });
    // Bytes the call must read at least: K and V of every attended position once (the KV heads'
    // rows; the query heads of a group share them; a prefill's tokens share their prefix).
    const double bytes = double(ctx) * kHeadKv * (2.0 * kDim) * 2.0;
    const double gbs = bytes / us * 1e-3;
    double flops = 0;  // token t attends ctx - n_tok + t + 1 positions: Q.K and P.V, 2 flops per multiply-add
    for (int t = 0; t < n_tok; ++t) flops += double(ctx - n_tok + t + 1) * kHead * (2.0 * kDim) * 2.0;
    std::printf("| %s | %s | %d | %d | %.1f | %.1f MB | %.0f | %.1f%% | %.2f |\n", name,
                math == cpu::AttnMath::F32 ? "F32" : "GgmlF16", n_tok, ctx, us, bytes * 1e-6, gbs,
                100.0 * gbs / hbm_gbs, flops / us * 1e-6);
  };
  const int slow_reps = std::max(3, reps / 20);
  for (int ctx : {512, 4096, 16384}) row("decode", cpu::AttnMath::F32, 1, ctx, reps);
  for (int ctx : {512, 4096, 16384}) row("decode", cpu::AttnMath::GgmlF16, 1, ctx, slow_reps);
  for (bool mma : {false, true}) {  // the CUDA-core prefill kernel (default), then the tensor-core one
    attn_tile::set_prefill_mma(mma);
    const char* name = mma ? "prefill (tensor cores)" : "prefill";
    row(name, cpu::AttnMath::F32, 64, 4096, std::max(3, reps / 10));
    row(name, cpu::AttnMath::F32, 512, 4096, std::max(3, reps / 20));
    row(name, cpu::AttnMath::F32, 512, 512, std::max(3, reps / 20));
  }
  // The split rules (ops::set_attn_split_rule) on the tensor-core prefill: 0 splits a 512-token prefill
  // in two and merges, 1 does not.
  for (int rule : {0, 1}) {
    ops::set_attn_split_rule(rule);
    const char* name = rule == 0 ? "prefill (tensor cores, split rule 0)" : "prefill (tensor cores, split rule 1)";
    row(name, cpu::AttnMath::F32, 512, 512, std::max(3, reps / 20));
    row(name, cpu::AttnMath::F32, 320, 320, std::max(3, reps / 20));
  }
  attn_tile::set_prefill_mma(false);
  cs.synchronize();
  return 0;
}
