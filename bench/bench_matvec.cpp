// Matrix-vector (decode) and small-batch (n_tok = 8) products against quantized weights, per format.
// Reports GB/s of weight bytes streamed and the ratio to a memcpy bandwidth measured in the same run
// (same thread pool, same number of threads: both sides of the ratio use every core).
//
//   ./build/bench/bench_matvec [--benchmark_filter=...]   (STRATA_THREADS, STRATA_CPU apply)
//
// Shapes: 4096x14336 (a dense FFN projection: 14336 rows of 4096) and 2048x768 (an expert of a
// Qwen3-30B-A3B-like MoE: 768 rows of 2048). Expert matrices are small enough to sit in cache, so the
// benchmark cycles through enough distinct copies (>= 128 MiB) that every call streams from DRAM, as a
// MoE layer does. MatvecStreams: decode with 1-4 weight streams per work item (matmul_streams()), also
// on 2048x151936 (the output matrix of Qwen3-30B-A3B, 175 MB of Q4_K). The weights are anonymous memory
// on 4 KiB pages (THP is madvise-only on the dev box); mmapped GGUF weights behave differently
// (bench/results/2026-11-29-cpu-decode-q4k.md).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "../tests/quant_test_util.h"
#include "cpu/cpu_features.h"
#include "cpu/thread_pool.h"
#include "quant/matmul.h"
#include "quant/q4k_gemm.h"
#include "quant/q4k_repack.h"
#include "quant/vec_dot.h"

using namespace strata;

namespace {

double g_memcpy_gbps = 0;  // bytes read + written per second / 1e9, all threads

// memcpy of 256 MiB split over the pool's threads; best of 5.
double measure_memcpy_gbps(ThreadPool& pool) {
  const size_t bytes = size_t(256) << 20;
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t chunks = pool.size() * 4;
    pool.parallel_for(chunks, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t c = b; c < e; ++c) {
        const size_t off = bytes / chunks * c;
        std::memcpy(dst.data() + off, src.data() + off, bytes / chunks);
      }
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * bytes / s / 1e9);
  }
  benchmark::DoNotOptimize(dst.data());
  return best;
}

struct Weights {
  std::vector<uint8_t> data;  // [copies][rows][row_bytes]
  int64_t copies, matrix_bytes;
};

Weights make_weights(GgmlType t, int64_t rows, int64_t cols) {
  std::mt19937 rng(42);
  Weights w;
  w.matrix_bytes = static_cast<int64_t>(row_bytes(t, cols)) * rows;
  w.copies = std::max<int64_t>(1, ((int64_t(128) << 20) + w.matrix_bytes - 1) / w.matrix_bytes);
  // One random matrix, replicated (random generation is slow; the bytes' values do not change speed).
  auto row = test::random_row(t, cols, rng);
  std::vector<uint8_t> m;
  m.reserve(w.matrix_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    if (r % 64 == 0) row = test::random_row(t, cols, rng);
    m.insert(m.end(), row.begin(), row.end());
  }
  w.data.resize(w.matrix_bytes * w.copies);
  for (int64_t c = 0; c < w.copies; ++c) std::memcpy(w.data.data() + c * w.matrix_bytes, m.data(), w.matrix_bytes);
  return w;
}

void BM_Memcpy(benchmark::State& state) {
  ThreadPool& pool = default_thread_pool();
  const size_t bytes = size_t(256) << 20;
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  const int64_t chunks = pool.size() * 4;
  for (auto _ : state) {
    pool.parallel_for(chunks, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t c = b; c < e; ++c) {
        const size_t off = bytes / chunks * c;
        std::memcpy(dst.data() + off, src.data() + off, bytes / chunks);
      }
    });
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(2.0 * bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void BM_Matmul(benchmark::State& state, GgmlType t, int64_t rows, int64_t cols, int64_t n_tok, MatmulMode mode) {
  ThreadPool& pool = default_thread_pool();
  const Weights w = make_weights(t, rows, cols);
  std::mt19937 rng(3);
  const auto x = test::random_acts(cols * n_tok, rng);
  std::vector<float> y(rows * n_tok);
  int64_t c = 0;
  for (auto _ : state) {
    matmul(t, w.data.data() + c * w.matrix_bytes, rows, cols, x.data(), n_tok, y.data(), mode, pool);
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % w.copies;
  }
  const double gb = double(w.matrix_bytes) * state.iterations() / 1e9;
  state.counters["GB/s"] = benchmark::Counter(gb, benchmark::Counter::kIsRate);
  state.counters["tok/s"] = benchmark::Counter(double(n_tok) * state.iterations(), benchmark::Counter::kIsRate);
  state.SetLabel(fmt::format("{} bytes/matrix", w.matrix_bytes));
}

// Decode (1 token, fast mode) with the weight streams per work item set to `streams` (matmul_streams(): 1 =
// rows in plain order); all settings run in this process: compare their GB/s.
void BM_MatvecStreams(benchmark::State& state, GgmlType t, int64_t rows, int64_t cols, int streams) {
  const int was = matmul_streams();
  matmul_set_streams(streams);
  BM_Matmul(state, t, rows, cols, 1, MatmulMode::Fast);
  matmul_set_streams(was);
}

// Prefill (n_tok tokens) against one in-cache expert-sized matrix, fast mode, Q4_K (or Q5_K, Q6_K, IQ4_XS,
// Q4_0, Q8_0, Q3_K, Q2_K, Q4_1, Q5_0, Q5_1, IQ4_NL, and the IQ2/IQ3 formats) through one of three paths: the 4-token decode kernels ("4tok"), the 8-row repack cache
// (q4k_repack.h, "repack8"; Q4_K only; the copy is built before timing) or the 16-row integer kernel
// (q4k_gemm.h / q32_gemm.h, "gemm16"). All arms run in this process: compare their GMAC/s.
enum class PrefillPath { Tok4, Repack8, Gemm16 };
void BM_Prefill(benchmark::State& state, GgmlType t, int64_t rows, int64_t cols, int64_t n_tok, PrefillPath path) {
  ThreadPool& pool = default_thread_pool();
  const Weights w = make_weights(t, rows, cols);
  std::mt19937 rng(3);
  const auto x = test::random_acts(cols * n_tok, rng);
  std::vector<float> y(rows * n_tok);
  const bool gemm_was = q::q4k_gemm_enabled();
  q::q4k_gemm_set_enabled(path == PrefillPath::Gemm16);
  if (path == PrefillPath::Gemm16 && !q::q4k_gemm_cpu_ok()) state.SkipWithError("CPU lacks AVX-512 VNNI");
  q::q4k_repack_set_budget(path == PrefillPath::Repack8 ? size_t(1) << 30 : 0);
  matmul(t, w.data.data(), rows, cols, x.data(), n_tok, y.data(), MatmulMode::Fast, pool);  // builds the copy
  if (path == PrefillPath::Repack8 && q::q4k_repack_bytes() == 0)
    state.SkipWithError("no repacked copy (CPU lacks AVX-512 VNNI+VBMI?)");
  for (auto _ : state) {
    matmul(t, w.data.data(), rows, cols, x.data(), n_tok, y.data(), MatmulMode::Fast, pool);
    benchmark::DoNotOptimize(y.data());
  }
  q::q4k_repack_set_budget(0);
  q::q4k_gemm_set_enabled(gemm_was);
  state.counters["GMAC/s"] =
      benchmark::Counter(double(rows) * cols * n_tok * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// Kernel compute throughput, one thread, weights and activations in cache (32 rows of 4096): what a core
// does when memory is not the limit (prefill). 4-token kernels count 4 tokens per weight row.
void BM_Kernel(benchmark::State& state, GgmlType t, int n_tok) {
  std::mt19937 rng(9);
  const int64_t n = 4096, rows = 32;
  const q::DotKernel k = q::dot_kernel(t, cpu_level());
  std::vector<uint8_t> w;
  for (int64_t r = 0; r < rows; ++r) {
    auto row = test::random_row(t, n, rng);
    w.insert(w.end(), row.begin(), row.end());
  }
  const int64_t rb = static_cast<int64_t>(row_bytes(t, n)), xb = q::act_row_bytes(k.act, n);
  std::vector<uint8_t> xq(4 * xb);
  for (int i = 0; i < 4; ++i) {
    auto x = test::random_acts(n, rng);
    q::quantize_act_row(k.act, x.data(), xq.data() + i * xb, n);
  }
  float out[4];
  for (auto _ : state) {
    for (int64_t r = 0; r < rows; ++r) {
      if (n_tok == 4) k.fn4(n, w.data() + r * rb, xq.data(), xb, out, 1);
      else out[0] = k.fn(n, w.data() + r * rb, xq.data());
      benchmark::DoNotOptimize(out);
    }
  }
  state.counters["GMAC/s"] = benchmark::Counter(double(n) * rows * n_tok * state.iterations() / 1e9,
                                                benchmark::Counter::kIsRate);
}

// Activation quantization (once per matmul call per token): 4096 values.
void BM_ActQuant(benchmark::State& state, q::ActType act) {
  std::mt19937 rng(4);
  const auto x = test::random_acts(4096, rng);
  std::vector<uint8_t> out(q::act_row_bytes(act, 4096));
  for (auto _ : state) {
    q::quantize_act_row(act, x.data(), out.data(), 4096);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["values/s"] = benchmark::Counter(4096.0 * state.iterations(), benchmark::Counter::kIsRate);
}

// GB/s -> ratio to memcpy, added after the run (counters are rates computed by the library).
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> out = runs;
    for (auto& r : out) {
      auto it = r.counters.find("GB/s");
      if (it != r.counters.end() && g_memcpy_gbps > 0 && r.run_name.function_name.rfind("Memcpy") == std::string::npos) {
        // Counters reach the reporter already finished (rates divided by time).
        r.counters["x_memcpy"] = benchmark::Counter(it->second.value / g_memcpy_gbps);
      }
    }
    ConsoleReporter::ReportRuns(out);
  }
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  g_memcpy_gbps = measure_memcpy_gbps(default_thread_pool());
  std::printf("threads %d, kernel level %s, memcpy %.2f GB/s (read+write)\n", default_thread_pool().size(),
              std::string(cpu_level_name(cpu_level())).c_str(), g_memcpy_gbps);
  benchmark::RegisterBenchmark("Memcpy/256MiB", BM_Memcpy)->UseRealTime()->Unit(benchmark::kMillisecond);
  const GgmlType types[] = {GgmlType::Q8_0,   GgmlType::Q4_K,    GgmlType::Q6_K,   GgmlType::Q5_K,  GgmlType::Q4_0,
                            GgmlType::Q2_K,   GgmlType::Q3_K,    GgmlType::IQ4_XS, GgmlType::IQ4_NL, GgmlType::IQ2_XS,
                            GgmlType::IQ3_S,  GgmlType::IQ1_M,   GgmlType::IQ2_XXS, GgmlType::IQ3_XXS, GgmlType::IQ2_S,
                            GgmlType::IQ1_S,  GgmlType::Q5_0,    GgmlType::Q5_1,   GgmlType::Q4_1,  GgmlType::F16,
                            GgmlType::BF16};
  for (const int64_t n_tok : {64, 32, 16, 9})
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{768, 2048}, {2048, 768}})
      for (const auto& [path, name] : {std::pair{PrefillPath::Tok4, "4tok"}, {PrefillPath::Repack8, "repack8"},
                                       {PrefillPath::Gemm16, "gemm16"}})
        benchmark::RegisterBenchmark(fmt::format("Prefill{}/{}x{}/Q4_K/{}", n_tok, cols, rows, name).c_str(), BM_Prefill,
                                     GgmlType::Q4_K, rows, cols, n_tok, path)
            ->Unit(benchmark::kMillisecond);
  // The other formats with a 16-row kernel (no repack cache): 4tok = the decode kernels (our previous path).
  for (const GgmlType t : {GgmlType::Q6_K, GgmlType::Q5_K, GgmlType::IQ4_XS, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q3_K,
                           GgmlType::Q2_K, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL,
                           GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S,
                           GgmlType::IQ1_S, GgmlType::IQ1_M})
    for (const int64_t n_tok : {64, 32, 9})
      for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{768, 2048}, {2048, 768}})
        for (const auto& [path, name] : {std::pair{PrefillPath::Tok4, "4tok"}, {PrefillPath::Gemm16, "gemm16"}})
          benchmark::RegisterBenchmark(fmt::format("Prefill{}/{}x{}/{}/{}", n_tok, cols, rows, type_name(t), name).c_str(),
                                       BM_Prefill, t, rows, cols, n_tok, path)
              ->Unit(benchmark::kMillisecond);
  for (GgmlType t : types) {
    const std::string n(type_name(t));
    benchmark::RegisterBenchmark(("Matvec/4096x14336/" + n).c_str(), BM_Matmul, t, 14336, 4096, 1, MatmulMode::Fast)
        ->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("Matvec/2048x768/" + n).c_str(), BM_Matmul, t, 768, 2048, 1, MatmulMode::Fast)
        ->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K})
    for (int streams : {1, 2, 3, 4})
      for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{14336, 4096}, {151936, 2048}})
        benchmark::RegisterBenchmark(fmt::format("MatvecStreams/{}x{}/{}/s{}", cols, rows, type_name(t), streams).c_str(),
                                     BM_MatvecStreams, t, rows, cols, streams)
            ->UseRealTime()->Unit(benchmark::kMillisecond);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q4_0}) {
    const std::string n(type_name(t));
    benchmark::RegisterBenchmark(("Matmul8/4096x14336/" + n).c_str(), BM_Matmul, t, 14336, 4096, 8, MatmulMode::Fast)
        ->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("MatvecExact/4096x14336/" + n).c_str(), BM_Matmul, t, 14336, 4096, 1,
                                 MatmulMode::Exact)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("MatvecPrecise/4096x14336/" + n).c_str(), BM_Matmul, t, 14336, 4096, 1,
                                 MatmulMode::FastPrecise)->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  for (GgmlType t : types) {
    const std::string n(type_name(t));
    if (!type_traits(t).quantized) continue;
    benchmark::RegisterBenchmark(("Kernel1tok/" + n).c_str(), BM_Kernel, t, 1)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("Kernel4tok/" + n).c_str(), BM_Kernel, t, 4)->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("ActQuant/Q8_32/4096", BM_ActQuant, q::ActType::Q8_32)->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("ActQuant/Q8_K/4096", BM_ActQuant, q::ActType::Q8_K)->Unit(benchmark::kMicrosecond);
  RatioReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
}
