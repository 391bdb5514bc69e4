// Prefill-speed benchmark (issue 7): the old tiled kernels vs the prefill paths, at Qwen3-30B-A3B shapes,
// Q4_K weights, in the same run:
//   dense: quant::matmul without a context (warp-per-row, 8-token tiles) vs with a GemmContext (bf16
//          dequantize + cuBLAS) for the 2048x4096 (attn output) and 4096x2048 (attn q) matrices at
//          n = 16, 32, 64, 512 (where the kGemmMinTokens threshold should sit);
//   moe:   one layer's routed experts (128 experts all resident, top-8, n_embd 2048, n_ff 768, Q4_K and
//          Q4_0 gate/up/down) at n = 512 and 2048: moe_gate_up + moe_down (512 only) and moe_experts_grouped
//          with each product kernel (0 WMMA, 1 mma.sync, 2 mma.sync with the weights staged by cp.async, in
//          a ring of 2 or 3 stages).
// Prints ms per call, TFLOP/s (2 * multiply-adds / time), the speed-up, and the max difference between
// the two paths relative to the largest |output| (a sanity check; the tests own correctness).
// Weights: hash bytes with every block's f16 scales = 2^-9 (finite values). Times: CUDA events on the
// compute stream around `iters` calls after a warm-up. Usage: cuda_gemm [--iters N]; ~10 s on an H200.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "cuda/device.h"
#include "cuda/gemm_context.h"
#include "cuda/moe_kernels.cuh"
#include "cuda/quant_kernels.cuh"
#include "cuda/transfer.h"
#include "quant/types.h"
#include "bench_main.h"

namespace {

using namespace strata;
using namespace strata::cuda;

// w[i] = hash bytes, except the f16 scale fields at offsets f0/f1 of each block = 2^-9. w: [n_blocks][block_bytes].
__global__ void init_weights(uint8_t* w, int64_t n_blocks, int block_bytes, int f0, int f1, uint32_t seed) {
  const int64_t bytes = n_blocks * block_bytes;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    const int in_block = int(i % block_bytes);
    uint8_t b = uint8_t(h >> 7);
    if (in_block == f0 || in_block == f1) b = 0x00;
    if (in_block == f0 + 1 || in_block == f1 + 1) b = 0x18;
    w[i] = b;
  }
}

// x: [n] f32 in [-1, 1).
__global__ void init_acts(float* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = float(int((uint32_t(i) * 2654435761u) >> 16) % 2001 - 1000) / 1000.f;
}

struct Timer {
  cudaEvent_t a{}, b{};
  Timer() {
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  void start(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(a, s)); }
  double stop_ms(cudaStream_t s) {
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
  }
};

// max |a - b| / max |b| over count values downloaded from two device buffers.
double rel_diff(Transfer& xfer, Stream& cs, const DeviceBuffer& a, const DeviceBuffer& b, size_t count) {
  std::vector<float> ha(count), hb(count);
  xfer.download_sync(ha.data(), a.span(), count * 4, cs);
  xfer.download_sync(hb.data(), b.span(), count * 4, cs);
  double err = 0, scale = 0;
  for (size_t i = 0; i < count; ++i) {
    err = std::max(err, std::isfinite(ha[i]) ? std::fabs(double(ha[i]) - hb[i]) : 1e30);
    scale = std::max(scale, std::fabs(double(hb[i])));
  }
  return err / std::max(scale, 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  if (const int rc = bench::start("cuda_gemm", argc, argv, {{"--iters", &iters, 1}})) return rc;
  const auto wall0 = std::chrono::steady_clock::now();
  Device dev(0);
  Transfer xfer(dev);
  Stream& cs = dev.compute();
  const cudaStream_t s = cs.handle();
  Timer timer;
  const GgmlType q4k = GgmlType::Q4_K;
  const int64_t max_n = 512;
  auto time_ms = [&](int it, auto&& call) {
    for (int i = 0; i < 2; ++i) call();  // warm-up (cuBLAS picks and loads its kernels)
    timer.start(s);
    for (int i = 0; i < it; ++i) call();
    return timer.stop_ms(s) / it;
  };

  std::printf("# prefill paths on %s (%d SMs)\n\n", dev.info().name.c_str(), dev.info().sm_count);
  std::printf("| op | shape | n | old ms | old TFLOP/s | new ms | new TFLOP/s | speed-up | max diff / max |out| |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");

  // ---- dense ----
  auto ctx = make_gemm_context(dev, 4096, 4096, max_n);
  DeviceBuffer x = dev.alloc(size_t(max_n) * 4096 * 4, "x");
  DeviceBuffer y_old = dev.alloc(size_t(max_n) * 4096 * 4, "y old"), y_new = dev.alloc(size_t(max_n) * 4096 * 4, "y new");
  init_acts<<<256, 256, 0, s>>>(x.as<float>(), max_n * 4096);
  CUDA_CHECK_LAUNCH();
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  for (const Shape& sh : {Shape{"attn out 2048x4096", 2048, 4096}, Shape{"attn q 4096x2048", 4096, 2048}}) {
    const int64_t bytes = int64_t(row_bytes(q4k, sh.cols)) * sh.rows;
    DeviceBuffer w = dev.alloc(size_t(bytes), "weights");
    init_weights<<<4096, 256, 0, s>>>(w.as<uint8_t>(), bytes / 144, 144, 0, 2, 7);
    CUDA_CHECK_LAUNCH();
    for (int64_t n : {16, 32, 64, 512}) {
      const int it = n == 512 ? iters : 3 * iters;
      const double old_ms = time_ms(it, [&] {
        quant::matmul(q4k, w.data(), sh.rows, sh.cols, x.as<float>(), n, y_old.as<float>(), s);
      });
      const double new_ms = time_ms(it, [&] {
        matmul_gemm(*ctx, q4k, w.data(), sh.rows, sh.cols, x.as<float>(), n, y_new.as<float>(), s);
      });
      const double flop = 2.0 * sh.rows * sh.cols * n;
      std::printf("| q4_K matmul | %s | %lld | %.3f | %.1f | %.3f | %.1f | %.2fx | %.2g |\n", sh.name, (long long)n,
                  old_ms, flop / (old_ms * 1e9), new_ms, flop / (new_ms * 1e9), old_ms / new_ms,
                  rel_diff(xfer, cs, y_new, y_old, size_t(n * sh.rows)));
    }
  }

  // ---- one MoE layer: the per-pair kernels (n = 512 only) and the grouped kernels ----
  std::printf("\n| moe layer (128 experts, top-8, 2048/768) | n | per-pair ms | wmma ms | mma ms | staged 2 ms | "
              "staged 3 ms | staged 3 TFLOP/s | staged 3 / wmma | max diff staged-wmma / max |out| "
              "|\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const GgmlType wt : {GgmlType::Q4_K, GgmlType::Q4_0}) {
    const int64_t n_embd = 2048, n_ff = 768;
    const int n_expert = 128, k = 8;
    moe::ExpertLayerView v;
    v.gate_type = v.up_type = v.down_type = wt;
    const int64_t tb = int64_t(row_bytes(wt, n_embd)) * n_ff;  // = row_bytes(wt, n_ff) * n_embd
    const int block_bytes = wt == GgmlType::Q4_K ? 144 : 18;
    v.gate_off = 0, v.up_off = tb, v.down_off = 2 * tb;
    v.slot_bytes = 3 * tb;  // a multiple of the block size and of 16
    v.n_embd = n_embd, v.n_ff = n_ff;
    DeviceBuffer slots = dev.alloc(size_t(v.slot_bytes) * n_expert, "expert slots");
    init_weights<<<4096, 256, 0, s>>>(slots.as<uint8_t>(), v.slot_bytes * n_expert / block_bytes, block_bytes, 0,
                                      wt == GgmlType::Q4_K ? 2 : 0, 11);
    CUDA_CHECK_LAUNCH();
    v.slots = slots.as<uint8_t>();
    for (const int64_t n : {int64_t(512), int64_t(2048)}) {
      std::vector<int32_t> table(n_expert);
      for (int e = 0; e < n_expert; ++e) table[e] = (e * 37) % n_expert;
      const std::vector<int32_t> ids = bench::random_routing(n, k, n_expert, 12345);
      std::vector<float> wts(size_t(n) * k, 1.f / k);
      DeviceBuffer xm = dev.alloc(size_t(n) * n_embd * 4, "x");
      init_acts<<<256, 256, 0, s>>>(xm.as<float>(), n * n_embd);
      CUDA_CHECK_LAUNCH();
      DeviceBuffer d_table = dev.alloc(table.size() * 4, "table"), d_ids = dev.alloc(ids.size() * 4, "ids"),
                   d_wts = dev.alloc(wts.size() * 4, "wts"), d_h = dev.alloc(size_t(n) * k * n_ff * 4, "h"),
                   d_old = dev.alloc(size_t(n) * n_embd * 4, "out old"),
                   d_wmma = dev.alloc(size_t(n) * n_embd * 4, "out wmma"),
                   d_new = dev.alloc(size_t(n) * n_embd * 4, "out mma");
      const size_t sb = moe::moe_grouped_scratch_bytes(v, n_expert, n, k);
      DeviceBuffer scratch = dev.alloc(sb, "moe grouped scratch");
      xfer.upload(d_table.span(), table.data(), table.size() * 4, cs, {&cs});
      xfer.upload(d_ids.span(), ids.data(), ids.size() * 4, cs, {&cs});
      xfer.upload(d_wts.span(), wts.data(), wts.size() * 4, cs, {&cs});
      double old_ms = 0;
      if (n == 512)
        old_ms = time_ms(std::max(1, iters / 5), [&] {
          moe::moe_gate_up(v, d_table.as<int32_t>(), xm.as<float>(), d_ids.as<int32_t>(), n, k, d_h.as<float>(), s);
          moe::moe_down(v, d_table.as<int32_t>(), d_h.as<float>(), d_ids.as<int32_t>(), d_wts.as<float>(), n, k,
                        d_old.as<float>(), s);
        });
      auto grouped_ms = [&](int which, DeviceBuffer& out, int stages = 3) {
        moe::set_moe_grouped_kernel(which);
        moe::set_moe_grouped_stages(stages);
        return time_ms(iters, [&] {
          moe::moe_experts_grouped(v, d_table.as<int32_t>(), n_expert, xm.as<float>(), d_ids.as<int32_t>(),
                                   d_wts.as<float>(), n, k, out.as<float>(), scratch.data(), sb, s);
        });
      };
      const double wmma_ms = grouped_ms(0, d_wmma);
      const double mma_ms = grouped_ms(1, d_new);
      const double staged2_ms = grouped_ms(2, d_new, 2);
      const double staged_ms = grouped_ms(2, d_new);
      const double flop = 2.0 * n * k * 3.0 * n_embd * n_ff;
      char old_col[32] = "-";
      if (n == 512) std::snprintf(old_col, sizeof old_col, "%.3f", old_ms);
      std::printf("| %s | %lld | %s | %.3f | %.3f | %.3f | %.3f | %.1f | %.2fx | %.2g |\n",
                  std::string(type_name(wt)).c_str(), (long long)n, old_col, wmma_ms, mma_ms, staged2_ms, staged_ms, flop / (staged_ms * 1e9), wmma_ms / staged_ms,
                  rel_diff(xfer, cs, d_new, d_wmma, size_t(n * n_embd)));
    }
  }
  dev.synchronize();
  std::printf("(total %.1f s)\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count());
  return 0;
}
