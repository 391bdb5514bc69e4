// Decode-speed benchmark of cuda::quant::matmul (issue 7): GB/s of weight bytes at n = 1, 2, 4, 8 for
// Q4_K, Q4_0, Q8_0, Q6_K, Q5_K at Qwen3-30B-A3B shapes, against two rooflines measured in the same run:
//   read: a plain kernel that only reads HBM (16-byte loads, grid-stride) - the ceiling of a matvec;
//   d2d:  a device-to-device copy through cuda::Transfer (bytes read + written / time).
// Small matrices are rotated through enough copies (>= 512 MiB in all) that every call reads HBM, not the
// 50 MB L2. Times are CUDA events on the compute stream around many calls (mean per call).
// (Named cuda_matvec, not bench_matvec: bench/bench_matvec.cpp already owns that target name.)
//
// Then one MoE layer's routed experts (moe_gate_up + moe_down, Q4_K gate/up and Q6_K down, 128 experts all
// resident, k = 8, n = 1) with the token's experts drawn at random per call from 64 precomputed sets
// (the q8 part also with Q4_K down, and moe_down alone with each of its two kernels).
//
// Every case is timed twice in the same process: the default path (fast_dot.cuh for these formats) and the
// generic per-8-values kernels (quant::set_generic_only): the last column is the speed-up.
//
// Then the int8-activation path (cuda/q8_kernels.cuh: activations quantized once to int8 blocks, dp4a
// dots) on the same formats, shapes and MoE layer, each next to the default f32-activation path timed
// again in the same loop: us, GB/s, % of the read roofline and the f32/q8 speed-up. The activation
// quantization (once per token, shared by every matrix reading the same x) is timed on its own. The low-bit
// formats (Q2_K, Q3_K, IQ4_XS, IQ4_NL, IQ2_*, IQ3_*, IQ1_*; session 33) at n = 1 and 2 against their f32 path.
// Q6_K_X8 (Q6_K regrouped for dense products, quant/q6_k_x8.h; session 42) on the shapes of whole 2048-value
// rows, its scales random bytes (the values do not change the time).
//
// Usage: cuda_matvec [--iters 200]      Prints a markdown table; runs in well under 20 s on an H200.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "cuda/device.h"
#include "cuda/moe_kernels.cuh"
#include "cuda/q8_kernels.cuh"
#include "cuda/quant_kernels.cuh"
#include "cuda/transfer.h"
#include "quant/types.h"
#include "bench_main.h"

namespace {

using namespace strata;
using namespace strata::cuda;

// w[i] = hash bytes; then every block's f16 scale fields (offsets f0, f1; -1 = none) = 2^-9 so values stay
// finite. w: [n_blocks][block_bytes].
__global__ void init_weights(uint8_t* w, int64_t n_blocks, int block_bytes, int f0, int f1, uint32_t seed) {
  const int64_t bytes = n_blocks * block_bytes;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    const int in_block = int(i % block_bytes);
    uint8_t b = uint8_t(h >> 7);
    if (in_block == f0 || in_block == f1) b = 0x00;          // low byte of 0x1800
    if (in_block == f0 + 1 || in_block == f1 + 1) b = 0x18;  // high byte
    w[i] = b;
  }
}

// x: [n] f32 in [-1, 1).
__global__ void init_acts(float* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = float(int((uint32_t(i) * 2654435761u) >> 16) % 2001 - 1000) / 1000.f;
}

// Reads src [n16] uint4 once; out [gridDim.x] keeps the reads alive.
__global__ void read_only(const uint4* __restrict__ src, int64_t n16, uint32_t* out) {
  uint32_t acc = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n16; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;  // practically never: no write traffic
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

void scale_fields(GgmlType t, int& f0, int& f1) {
  f0 = f1 = -1;
  switch (t) {
    case GgmlType::Q4_K: case GgmlType::Q5_K: f0 = 0, f1 = 2; break;
    case GgmlType::Q6_K: f0 = 208; break;
    case GgmlType::Q4_0: case GgmlType::Q8_0: f0 = 0; break;
    case GgmlType::Q2_K: f0 = 80, f1 = 82; break;
    case GgmlType::Q3_K: f0 = 108; break;
    case GgmlType::IQ4_NL: case GgmlType::IQ4_XS: case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS: case GgmlType::IQ2_S:
    case GgmlType::IQ3_XXS: case GgmlType::IQ3_S: case GgmlType::IQ1_S: f0 = 0; break;
    default: break;  // (IQ1_M: d is spread over its scales' top nibbles; random bytes time the same)
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 200;
  if (const int rc = bench::start("cuda_matvec", argc, argv, {{"--iters", &iters, 1}})) return rc;
  const auto wall0 = std::chrono::steady_clock::now();
  Device dev(0);
  Transfer xfer(dev);
  Stream& cs = dev.compute();
  const cudaStream_t s = cs.handle();
  Timer timer;

  // ---- rooflines ----
  const size_t big = size_t(1) << 30;
  DeviceBuffer a = dev.alloc(big, "roofline a"), b = dev.alloc(big, "roofline b");
  DeviceBuffer sink = dev.alloc(4 << 20, "roofline sink");
  init_weights<<<4096, 256, 0, s>>>(a.as<uint8_t>(), int64_t(big / 64), 64, -1, -1, 1);
  CUDA_CHECK_LAUNCH();
  double read_gbs = 0;
  for (int rep = 0; rep < 4; ++rep) {  // best of 4, 5 passes each
    timer.start(s);
    for (int k = 0; k < 5; ++k) read_only<<<dev.info().sm_count * 8, 512, 0, s>>>(a.as<uint4>(), big / 16, sink.as<uint32_t>());
    CUDA_CHECK_LAUNCH();
    read_gbs = std::max(read_gbs, 5.0 * big / (timer.stop_ms(s) * 1e6));
  }
  double d2d_gbs = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    Ticket tk;
    for (int k = 0; k < 3; ++k) tk = xfer.copy(b.span(), a.span(), cs, {&cs});
    tk.wait();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    d2d_gbs = std::max(d2d_gbs, 3.0 * 2.0 * big / (sec * 1e9));  // read + write
  }
  b = DeviceBuffer();
  std::printf("# cuda::quant::matmul on %s (%d SMs)\n\n", dev.info().name.c_str(), dev.info().sm_count);
  std::printf("rooflines: HBM read-only kernel %.0f GB/s; device-to-device copy (Transfer::copy, read+write) %.0f GB/s\n\n",
              read_gbs, d2d_gbs);
  std::printf("| type | rows x cols | n | us/call | us/token | weight GB/s | %% of read | %% of d2d | generic us/call | "
              "fast/generic speed-up |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");

  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{"expert gate/up", 768, 2048}, {"expert down", 2048, 768}, {"attn q", 4096, 2048},
                          {"output", 151936, 2048}};
  DeviceBuffer x = dev.alloc(8 * 4096 * sizeof(float), "x"), y = dev.alloc(8 * 151936 * sizeof(float), "y");
  init_acts<<<64, 256, 0, s>>>(x.as<float>(), 8 * 4096);
  CUDA_CHECK_LAUNCH();
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::Q5_K}) {
    const auto& tt = type_traits(t);
    int f0, f1;
    scale_fields(t, f0, f1);
    for (const Shape& sh : shapes) {
      const int64_t bytes = int64_t(row_bytes(t, sh.cols)) * sh.rows;
      const int copies = int(std::max<int64_t>(1, (int64_t(512) << 20) / bytes));
      DeviceBuffer w = dev.alloc(size_t(bytes) * copies, "weights");
      init_weights<<<4096, 256, 0, s>>>(w.as<uint8_t>(), bytes * copies / tt.type_size, int(tt.type_size), f0, f1, 7);
      CUDA_CHECK_LAUNCH();
      for (int64_t n : {1, 2, 4, 8}) {
        auto call = [&](int i) {
          quant::matmul(t, w.as<uint8_t>() + int64_t(i % copies) * bytes, sh.rows, sh.cols, x.as<float>(), n,
                        y.as<float>(), s);
        };
        // Mean us per call of the current path (fast by default; generic with set_generic_only(true)).
        auto time_calls = [&] {
          for (int i = 0; i < 3; ++i) call(i);  // warm-up
          const int it = sh.rows > 100000 ? std::max(1, iters / 10) : iters;
          timer.start(s);
          for (int i = 0; i < it; ++i) call(i);
          return timer.stop_ms(s) / it;
        };
        const double ms = time_calls();
        quant::set_generic_only(true);
        const double ms_generic = time_calls();
        quant::set_generic_only(false);
        const double gbs = bytes / (ms * 1e6);
        std::printf("| %s | %s %lldx%lld | %lld | %.1f | %.2f | %.0f | %.1f%% | %.1f%% | %.1f | %.2fx |\n",
                    std::string(tt.name).c_str(), sh.name, (long long)sh.rows, (long long)sh.cols, (long long)n,
                    ms * 1e3, ms * 1e3 / n, gbs, 100.0 * gbs / read_gbs, 100.0 * gbs / d2d_gbs, ms_generic * 1e3,
                    ms_generic / ms);
      }
    }
  }
  // ---- one MoE layer: Qwen3-30B-A3B experts (n_embd 2048, n_ff 768, 128 experts, k 8) ----
  {
    const int64_t n_embd = 2048, n_ff = 768;
    const int n_expert = 128, k = 8, n_sets = 64;
    moe::ExpertLayerView v;
    v.gate_type = v.up_type = GgmlType::Q4_K, v.down_type = GgmlType::Q6_K;
    const int64_t gb = int64_t(row_bytes(GgmlType::Q4_K, n_embd)) * n_ff;
    const int64_t db = int64_t(row_bytes(GgmlType::Q6_K, n_ff)) * n_embd;
    v.gate_off = 0, v.up_off = gb, v.down_off = 2 * gb;
    v.slot_bytes = (2 * gb + db + 255) / 256 * 256;
    v.n_embd = n_embd, v.n_ff = n_ff;
    DeviceBuffer slots = dev.alloc(size_t(v.slot_bytes) * n_expert, "expert slots");
    // Arbitrary bytes (some values inf/nan: only the time matters here).
    init_weights<<<4096, 256, 0, s>>>(slots.as<uint8_t>(), v.slot_bytes * n_expert / 16, 16, -1, -1, 11);
    CUDA_CHECK_LAUNCH();
    v.slots = slots.as<uint8_t>();
    std::vector<int32_t> table(n_expert);
    for (int e = 0; e < n_expert; ++e) table[e] = (e * 37) % n_expert;  // scattered slots
    const std::vector<int32_t> ids = bench::random_routing(n_sets, k, n_expert, 12345);
    std::vector<float> wts(size_t(n_sets) * k, 1.f / k);
    DeviceBuffer d_table = dev.alloc(table.size() * 4, "table"), d_ids = dev.alloc(ids.size() * 4, "ids"),
                 d_wts = dev.alloc(wts.size() * 4, "wts"), d_h = dev.alloc(size_t(k) * n_ff * 4, "h"),
                 d_out = dev.alloc(size_t(n_embd) * 4, "out");
    xfer.upload(d_table.span(), table.data(), table.size() * 4, cs, {&cs});
    xfer.upload(d_ids.span(), ids.data(), ids.size() * 4, cs, {&cs});
    xfer.upload(d_wts.span(), wts.data(), wts.size() * 4, cs, {&cs});
    auto layer = [&](int i) {
      const int q = i % n_sets;
      moe::moe_gate_up(v, d_table.as<int32_t>(), x.as<float>(), d_ids.as<int32_t>() + q * k, 1, k, d_h.as<float>(), s);
      moe::moe_down(v, d_table.as<int32_t>(), d_h.as<float>(), d_ids.as<int32_t>() + q * k, d_wts.as<float>() + q * k,
                    1, k, d_out.as<float>(), s);
    };
    auto time_layers = [&] {
      for (int i = 0; i < 3; ++i) layer(i);
      timer.start(s);
      for (int i = 0; i < iters; ++i) layer(i);
      return timer.stop_ms(s) / iters;
    };
    const double ms = time_layers();
    quant::set_generic_only(true);
    const double ms_generic = time_layers();
    quant::set_generic_only(false);
    const double bytes = double(k) * (2 * gb + db);
    const double gbs = bytes / (ms * 1e6);
    std::printf("| moe layer (q4_K gate/up, q6_K down) | 128 experts, k 8, 2048/768 | 1 | %.1f | %.2f | %.0f | %.1f%% | "
                "%.1f%% | %.1f | %.2fx |\n",
                ms * 1e3, ms * 1e3, gbs, 100.0 * gbs / read_gbs, 100.0 * gbs / d2d_gbs, ms_generic * 1e3,
                ms_generic / ms);
  }
  // ---- int8 activations (q8_kernels.cuh) against the default f32 path, same shapes ----
  {
    DeviceBuffer xq = dev.alloc(8 * 4096, "xq"), xds = dev.alloc(8 * 128 * sizeof(float2), "xds");
    std::printf("\n# q8::matvec (int8 activations, dp4a) vs quant::matmul (f32 activations, default path)\n\n");
    {
      q8::quantize(x.as<float>(), 8, 2048, xq.as<int8_t>(), xds.as<float2>(), s);  // warm-up
      for (int64_t n : {1, 8}) {
        timer.start(s);
        for (int i = 0; i < iters; ++i) q8::quantize(x.as<float>(), n, 2048, xq.as<int8_t>(), xds.as<float2>(), s);
        std::printf("q8::quantize of %lld x 2048 activations: %.2f us/call\n", (long long)n,
                    timer.stop_ms(s) / iters * 1e3);
      }
      q8::quantize(x.as<float>(), 8, 4096, xq.as<int8_t>(), xds.as<float2>(), s);  // (wo reads 4096 columns)
    }
    // The shapes above plus Qwen3-30B-A3B's attention output (wo: 2048 rows of 4096 columns, 2 tasks per lane).
    std::vector<Shape> shapes_q8(std::begin(shapes), std::end(shapes));
    shapes_q8.push_back({"attn out (wo)", 2048, 4096});
    // n >= 2 on the formats of the tensor-core kernels (q8::mma_matvec_takes): q8 is the path of the mode
    // (STRATA_CUDA_Q8_MMA: 1, the default, the tile kernel from n = 8; 2 the persistent kernel from n = 2),
    // and the dp4a kernel (mode 0) is timed in the same loop: its us/call and the dp4a/q8 speed-up.
    std::printf("\n| type | rows x cols | n | q8 us/call | q8 weight GB/s | q8 %% of read | f32 us/call | f32 %% of read | "
                "f32/q8 speed-up | dp4a us/call | dp4a/mma |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    // The low-bit formats (q8::low_bit_enabled, off in the models by default; the kernels take them either
    // way) at n = 1 and 2 only: their f32 path is the generic one (no fast_dot path).
    const GgmlType low_bit[] = {GgmlType::Q2_K,   GgmlType::Q3_K,    GgmlType::IQ4_XS, GgmlType::IQ4_NL,
                                GgmlType::IQ2_XXS, GgmlType::IQ2_XS,  GgmlType::IQ2_S,  GgmlType::IQ3_XXS,
                                GgmlType::IQ3_S,  GgmlType::IQ1_S,   GgmlType::IQ1_M};
    std::vector<std::pair<GgmlType, std::vector<int64_t>>> q8_cases;
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::Q6_K_X8,
                       GgmlType::Q5_K})
      q8_cases.push_back({t, {1, 2, 4, 8}});
    for (GgmlType t : low_bit) q8_cases.push_back({t, {1, 2}});
    for (const auto& q8_case : q8_cases) {
      const GgmlType t = q8_case.first;  // (not a structured binding: the lambdas below capture t)
      const std::vector<int64_t>& ns = q8_case.second;
      const auto& tt = type_traits(t);
      int f0, f1;
      scale_fields(t, f0, f1);
      for (const Shape& sh : shapes_q8) {
        if (sh.cols % int64_t(tt.block_size) != 0) continue;  // (Q6_K_X8: rows of whole 2048-value groups)
        const int64_t rb = int64_t(row_bytes(t, sh.cols)), bytes = rb * sh.rows;
        const int copies = int(std::max<int64_t>(1, (int64_t(512) << 20) / bytes));
        DeviceBuffer w = dev.alloc(size_t(bytes) * copies, "weights");
        init_weights<<<4096, 256, 0, s>>>(w.as<uint8_t>(), bytes * copies / tt.type_size, int(tt.type_size), f0, f1, 7);
        CUDA_CHECK_LAUNCH();
        for (int64_t n : ns) {
          const int it = sh.rows > 100000 ? std::max(1, iters / 10) : iters;
          auto time_calls = [&](auto call) {
            for (int i = 0; i < 3; ++i) call(i);  // warm-up
            timer.start(s);
            for (int i = 0; i < it; ++i) call(i);
            return timer.stop_ms(s) / it;
          };
          const double ms_q8 = time_calls([&](int i) {
            q8::matvec(t, w.as<uint8_t>() + int64_t(i % copies) * bytes, sh.rows, sh.cols, rb, xq.as<int8_t>(),
                       xds.as<float2>(), n, y.as<float>(), false, s);
          });
          const double ms_f32 = time_calls([&](int i) {
            quant::matmul(t, w.as<uint8_t>() + int64_t(i % copies) * bytes, sh.rows, sh.cols, x.as<float>(), n,
                          y.as<float>(), s);
          });
          double ms_dp4a = 0;
          const int mode = q8::mma_mode();
          if (n >= 2 && mode != 0 && q8::mma_matvec_takes(t)) {
            q8::set_mma_mode(0);
            ms_dp4a = time_calls([&](int i) {
              q8::matvec(t, w.as<uint8_t>() + int64_t(i % copies) * bytes, sh.rows, sh.cols, rb, xq.as<int8_t>(),
                         xds.as<float2>(), n, y.as<float>(), false, s);
            });
            q8::set_mma_mode(mode);
          }
          const double gq = bytes / (ms_q8 * 1e6), gf = bytes / (ms_f32 * 1e6);
          std::printf("| %s | %s %lldx%lld | %lld | %.1f | %.0f | %.1f%% | %.1f | %.1f%% | %.2fx | ",
                      std::string(tt.name).c_str(), sh.name, (long long)sh.rows, (long long)sh.cols, (long long)n,
                      ms_q8 * 1e3, gq, 100.0 * gq / read_gbs, ms_f32 * 1e3, 100.0 * gf / read_gbs, ms_f32 / ms_q8);
          if (ms_dp4a > 0) std::printf("%.1f | %.2fx |\n", ms_dp4a * 1e3, ms_dp4a / ms_q8);
          else std::printf("- | - |\n");
        }
      }
    }
    // One MoE layer as above (Q4_K gate/up, Q6_K down, 128 experts, k 8, n 1, random expert sets), q8
    // (moe_gate_up + moe_down on the quantized x; the x quantization itself is the line printed above)
    // against the f32 moe::moe_gate_up + moe::moe_down; then the same with Q6_K down padded as Q6_K_P
    // (STRATA_CUDA_Q6_K_P_DOWN, session 42) and with Q4_K down (the all-Q4_K files).
    // Then moe_down alone with each of its kernels (q8::set_moe_down_kernel: slots looked up once per warp,
    // or per term, the first kernel and the default for these formats).
    for (const GgmlType down_t : {GgmlType::Q6_K, GgmlType::Q6_K_P, GgmlType::Q4_K}) {
    const int64_t n_embd = 2048, n_ff = 768;
    const int n_expert = 128, k = 8, n_sets = 64;
    moe::ExpertLayerView v;
    v.gate_type = v.up_type = GgmlType::Q4_K, v.down_type = down_t;
    const int64_t gb = int64_t(row_bytes(GgmlType::Q4_K, n_embd)) * n_ff;
    const int64_t db = int64_t(row_bytes(down_t, n_ff)) * n_embd;
    v.gate_off = 0, v.up_off = gb, v.down_off = 2 * gb;
    v.slot_bytes = (2 * gb + db + 255) / 256 * 256;
    v.n_embd = n_embd, v.n_ff = n_ff;
    DeviceBuffer slots = dev.alloc(size_t(v.slot_bytes) * n_expert, "expert slots");
    // Arbitrary bytes (some values inf/nan: only the time matters here).
    init_weights<<<4096, 256, 0, s>>>(slots.as<uint8_t>(), v.slot_bytes * n_expert / 16, 16, -1, -1, 11);
    CUDA_CHECK_LAUNCH();
    v.slots = slots.as<uint8_t>();
    std::vector<int32_t> table(n_expert);
    for (int e = 0; e < n_expert; ++e) table[e] = (e * 37) % n_expert;
    const std::vector<int32_t> ids = bench::random_routing(n_sets, k, n_expert, 777);
    std::vector<float> wts(size_t(n_sets) * k, 1.f / k);
    DeviceBuffer d_table = dev.alloc(table.size() * 4, "table"), d_ids = dev.alloc(ids.size() * 4, "ids"),
                 d_wts = dev.alloc(wts.size() * 4, "wts"), d_h = dev.alloc(size_t(k) * n_ff * 4, "h"),
                 d_out = dev.alloc(size_t(n_embd) * 4, "out"), d_hq = dev.alloc(size_t(k) * n_ff, "hq"),
                 d_hds = dev.alloc(size_t(k) * (n_ff / 32) * sizeof(float2), "hds");
    xfer.upload(d_table.span(), table.data(), table.size() * 4, cs, {&cs});
    xfer.upload(d_ids.span(), ids.data(), ids.size() * 4, cs, {&cs});
    xfer.upload(d_wts.span(), wts.data(), wts.size() * 4, cs, {&cs});
    auto time_layers = [&](auto layer) {
      for (int i = 0; i < 3; ++i) layer(i);
      timer.start(s);
      for (int i = 0; i < iters; ++i) layer(i);
      return timer.stop_ms(s) / iters;
    };
    const double ms_q8 = time_layers([&](int i) {
      const int q = i % n_sets;
      q8::moe_gate_up(v, d_table.as<int32_t>(), xq.as<int8_t>(), xds.as<float2>(), d_ids.as<int32_t>() + q * k, 1, k,
                      d_hq.as<int8_t>(), d_hds.as<float2>(), s);
      q8::moe_down(v, d_table.as<int32_t>(), d_hq.as<int8_t>(), d_hds.as<float2>(), d_ids.as<int32_t>() + q * k,
                   d_wts.as<float>() + q * k, 1, k, d_out.as<float>(), s);
    });
    const double ms_gu = time_layers([&](int i) {
      const int q = i % n_sets;
      q8::moe_gate_up(v, d_table.as<int32_t>(), xq.as<int8_t>(), xds.as<float2>(), d_ids.as<int32_t>() + q * k, 1, k,
                      d_hq.as<int8_t>(), d_hds.as<float2>(), s);
    });
    const double ms_f32 = time_layers([&](int i) {
      const int q = i % n_sets;
      moe::moe_gate_up(v, d_table.as<int32_t>(), x.as<float>(), d_ids.as<int32_t>() + q * k, 1, k, d_h.as<float>(), s);
      moe::moe_down(v, d_table.as<int32_t>(), d_h.as<float>(), d_ids.as<int32_t>() + q * k, d_wts.as<float>() + q * k,
                    1, k, d_out.as<float>(), s);
    });
    const double bytes = double(k) * (2 * gb + db);
    const double gq = bytes / (ms_q8 * 1e6), gf = bytes / (ms_f32 * 1e6);
    std::printf("| moe layer (q4_K gate/up, %s down) | 128 experts, k 8, 2048/768 | 1 | %.1f (gate_up %.1f) | %.0f | "
                "%.1f%% | %.1f | %.1f%% | %.2fx |\n",
                std::string(type_name(down_t)).c_str(), ms_q8 * 1e3, ms_gu * 1e3, gq, 100.0 * gq / read_gbs,
                ms_f32 * 1e3, 100.0 * gf / read_gbs, ms_f32 / ms_q8);
    const int kernel_was = q8::moe_down_kernel();
    double ms_down[2];
    for (int slots_on = 0; slots_on < 2; ++slots_on) {
      q8::set_moe_down_kernel(slots_on);
      ms_down[slots_on] = time_layers([&](int i) {
        const int q = i % n_sets;
        q8::moe_down(v, d_table.as<int32_t>(), d_hq.as<int8_t>(), d_hds.as<float2>(), d_ids.as<int32_t>() + q * k,
                     d_wts.as<float>() + q * k, 1, k, d_out.as<float>(), s);
      });
    }
    q8::set_moe_down_kernel(kernel_was);
    std::printf("q8 moe_down alone (%s down, k 8, n 1): slots once per warp (STRATA_CUDA_Q8_DOWN=slots) %.2f us, "
                "per term (default) %.2f us, %.2fx\n",
                std::string(type_name(down_t)).c_str(), ms_down[1] * 1e3, ms_down[0] * 1e3, ms_down[0] / ms_down[1]);
    }
  }
  dev.synchronize();
  std::printf("\n(total %.1f s)\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count());
  return 0;
}
