// Quantization error and speed of strata's row quantizers against ggml's (`ggml_quantize_chunk`, no
// importance matrix, as `llama-quantize` without --imatrix) on the same rows, in the same process.
//
//   ./build/bench/bench_quantize [--benchmark_filter=...]
//
// ggml: the prebuilt libggml-base.so of node-llama-cpp (bench/llama: `npm ci --prefix bench/llama`),
// dlopen-ed from STRATA_GGML_BASE or bench/llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/
// (run from the repository root). Without it only strata's numbers are reported.
// Rows: "gauss" 64 rows of 4096 N(0, 1) values; "real" the real weights of ../shared/fixtures/formats/
// zoo.gguf (STRATA_FIXTURES_DIR) that are stored with >= 5 bits (f32, f16, bf16, q8_0, q6_k, q5_k, q5_0,
// q5_1; 32 rows of 256 each, ggml's dequantized values).
// Counters: rmse = RMS error / RMS of the rows (strata), ggml_rmse (ggml on the same rows),
// err_vs_ggml = rmse / ggml_rmse (< 1: strata's rounding is closer), time_vs_ggml = strata's time per
// call / ggml's (same rows, one thread each).
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/dequant.h"
#include "quant/quantize.h"
#include "quant/types.h"

using namespace strata;

namespace {

using GgmlQuantizeChunk = size_t (*)(int type, const float* src, void* dst, int64_t start, int64_t nrows,
                                     int64_t n_per_row, const float* imatrix);
using GgmlQuantizeInit = void (*)(int type);
GgmlQuantizeChunk g_ggml_quantize = nullptr;
GgmlQuantizeInit g_ggml_init = nullptr;

void load_ggml() {
  const char* env = std::getenv("STRATA_GGML_BASE");
  const std::string path =
      env ? env : "bench/llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fmt::print(stderr, "bench_quantize: no ggml ({}): strata's numbers only\n", dlerror());
    return;
  }
  g_ggml_quantize = reinterpret_cast<GgmlQuantizeChunk>(dlsym(h, "ggml_quantize_chunk"));
  g_ggml_init = reinterpret_cast<GgmlQuantizeInit>(dlsym(h, "ggml_quantize_init"));
  if (!g_ggml_quantize || !g_ggml_init) g_ggml_quantize = nullptr;
}

struct Rows {
  std::vector<float> x;  // [n_rows][n_per_row]
  int64_t n_per_row = 0;
  int64_t n_rows() const { return n_per_row ? int64_t(x.size()) / n_per_row : 0; }
};

Rows gaussian_rows() {
  Rows r;
  r.n_per_row = 4096;
  r.x.resize(64 * 4096);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : r.x) v = nd(rng);
  return r;
}

Rows real_rows() {
  Rows r;
  const char* env = std::getenv("STRATA_FIXTURES_DIR");
  const std::string path = std::string(env ? env : "../shared/fixtures") + "/formats/zoo.gguf";
  try {
    auto f = gguf::File::open(path);
    for (const char* name : {"zoo.f32", "zoo.f16", "zoo.bf16", "zoo.q8_0", "zoo.q6_k", "zoo.q5_k", "zoo.q5_0", "zoo.q5_1"}) {
      const auto* t = f.find_tensor(name);
      if (!t) continue;
      const size_t at = r.x.size();
      r.x.resize(at + t->n_elements());
      dequantize_row(t->type, t->data, r.x.data() + at, int64_t(t->n_elements()));
      r.n_per_row = int64_t(t->ne[0]);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_quantize: {}: no real rows\n", e.what());
    r.x.clear();
  }
  return r;
}

double rel_rmse(GgmlType t, const Rows& r, const std::vector<uint8_t>& q) {
  std::vector<float> y(r.x.size());
  dequantize_row(t, q.data(), y.data(), int64_t(y.size()));
  double e = 0, s = 0;
  for (size_t i = 0; i < y.size(); ++i) e += (double(r.x[i]) - y[i]) * (double(r.x[i]) - y[i]), s += double(r.x[i]) * r.x[i];
  return std::sqrt(e / s);
}

void quantize_strata(GgmlType t, const Rows& r, std::vector<uint8_t>& q) {
  const size_t rb = row_bytes(t, r.n_per_row);
  for (int64_t i = 0; i < r.n_rows(); ++i) quantize_row(t, r.x.data() + i * r.n_per_row, q.data() + i * rb, r.n_per_row);
}

void BM_Quantize(benchmark::State& state, GgmlType t, const Rows* rows) {
  const Rows& r = *rows;
  if (r.x.empty()) {
    state.SkipWithError("rows missing");
    return;
  }
  std::vector<uint8_t> q(row_bytes(t, r.n_per_row) * r.n_rows());
  for (auto _ : state) {
    quantize_strata(t, r, q);
    benchmark::DoNotOptimize(q.data());
  }
  state.counters["rmse"] = rel_rmse(t, r, q);
  if (g_ggml_quantize) {
    std::vector<uint8_t> g(q.size());
    g_ggml_init(int(t));
    double best = 1e30, best_ours = 1e30;
    for (int rep = 0; rep < 3; ++rep) {  // the time ratio from alternating calls
      auto t0 = std::chrono::steady_clock::now();
      g_ggml_quantize(int(t), r.x.data(), g.data(), 0, r.n_rows(), r.n_per_row, nullptr);
      auto t1 = std::chrono::steady_clock::now();
      quantize_strata(t, r, q);
      auto t2 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
      best_ours = std::min(best_ours, std::chrono::duration<double>(t2 - t1).count());
    }
    const double ge = rel_rmse(t, r, g);
    state.counters["ggml_rmse"] = ge;
    state.counters["err_vs_ggml"] = ge > 0 ? state.counters["rmse"] / ge : 0;
    state.counters["time_vs_ggml"] = best_ours / best;
  }
  state.SetItemsProcessed(state.iterations() * int64_t(r.x.size()));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  load_ggml();
  static const Rows gauss = gaussian_rows(), real = real_rows();
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL,
                     GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS}) {
    for (const auto& [name, rows] : {std::pair{"gauss", &gauss}, std::pair{"real", &real}}) {
      benchmark::RegisterBenchmark(fmt::format("Quantize/{}/{}", type_name(t), name).c_str(), BM_Quantize, t, rows)
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.2);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
