// The CPU pool's decode work: moe_experts on one Qwen3-30B-A3B-geometry MoE layer (n_embd 2048, expert
// ff 768, 128 experts, top-8, Q4_K, fast mode) for n = 1, 2, 4 tokens, with all 8 routed experts of a
// token run here or only 6 of 8 (two ids set to -1, as the GPU backend does for resident experts).
// Reports GB/s of expert weights touched (3 matrices per distinct expert) and the ratio x_memcpy to a
// memcpy of the very same matrices (same experts, same pool, same thread count) measured in this run.
// The memcpy copies into a small per-thread buffer that stays in cache, so it is a read-bandwidth
// roofline for the bytes the kernels must stream. Pool region: an empty parallel_for (the wake-up and
// join cost a MoE layer pays per parallel region).
//
//   ./build/bench/bench_moe_decode [--benchmark_filter=...]   (STRATA_THREADS = the "all" pool size)
//
// The layer's 128 experts are 340 MB, more than any L3, and each iteration picks new random experts,
// so every call streams its weights from DRAM, as decode does.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "../tests/quant_test_util.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul_batch.h"
#include "cpu/thread_pool.h"
#include "model/moe_ffn.h"

using namespace strata;

namespace {

constexpr int64_t kEmbd = 2048, kFf = 768;
constexpr int kExperts = 128, kTopK = 8;
constexpr GgmlType kType = GgmlType::Q4_K;
constexpr int kIdSets = 512;  // random routings cycled through

struct Layer {
  std::vector<uint8_t> gate, up, down;  // [kExperts][rows][row_bytes] each
  int64_t matrix_bytes = 0;             // one expert's one matrix (gate, up and down are the same size)
  ExpertWeights ew;
};

std::vector<uint8_t> stack(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t rb = static_cast<int64_t>(row_bytes(t, cols));
  // 64 distinct random rows, repeated (random generation is slow; the values do not change speed).
  std::vector<uint8_t> pattern;
  for (int i = 0; i < 64; ++i) {
    auto r = test::random_row(t, cols, rng);
    pattern.insert(pattern.end(), r.begin(), r.end());
  }
  std::vector<uint8_t> out(static_cast<size_t>(rb * rows * kExperts));
  for (int64_t r = 0; r < rows * kExperts; ++r)
    std::memcpy(out.data() + r * rb, pattern.data() + (r % 64) * rb, static_cast<size_t>(rb));
  return out;
}

Layer& layer() {
  static Layer* l = [] {
    auto* L = new Layer;
    std::mt19937 rng(11);
    L->gate = stack(kType, kFf, kEmbd, rng);
    L->up = stack(kType, kFf, kEmbd, rng);
    L->down = stack(kType, kEmbd, kFf, rng);
    L->matrix_bytes = static_cast<int64_t>(row_bytes(kType, kEmbd)) * kFf;
    auto w = [](const std::vector<uint8_t>& d, int64_t ne0, int64_t ne1) {
      Weight x;
      x.type = kType;
      x.data = d.data();
      x.ne[0] = ne0;
      x.ne[1] = ne1;
      x.ne[2] = kExperts;
      return x;
    };
    L->ew = {w(L->gate, kEmbd, kFf), w(L->up, kEmbd, kFf), w(L->down, kFf, kEmbd)};
    return L;
  }();
  return *l;
}

// kIdSets routings of n tokens: k distinct experts per token, the last (k - active) set to -1.
std::vector<int32_t> routings(int64_t n, int active) {
  std::mt19937 rng(static_cast<uint32_t>(100 + n * 10 + active));
  std::vector<int32_t> ids(static_cast<size_t>(kIdSets * n * kTopK));
  std::vector<int32_t> perm(kExperts);
  for (int64_t s = 0; s < kIdSets * n; ++s) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < kTopK; ++j) ids[static_cast<size_t>(s * kTopK + j)] = j < active ? perm[j] : -1;
  }
  return ids;
}

// Distinct experts of one routing (n tokens).
std::vector<int32_t> distinct(const int32_t* ids, int64_t n) {
  std::vector<int32_t> e;
  for (int64_t i = 0; i < n * kTopK; ++i)
    if (ids[i] >= 0) e.push_back(ids[i]);
  std::sort(e.begin(), e.end());
  e.erase(std::unique(e.begin(), e.end()), e.end());
  return e;
}

ThreadPool& pool_of(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

int all_threads() { return default_thread_pool().size(); }

// state.range: 0 = n tokens, 1 = active experts per token (of 8), 2 = threads (0 = all).
void BM_MoeExperts(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int active = static_cast<int>(state.range(1));
  const int threads = state.range(2) ? static_cast<int>(state.range(2)) : all_threads();
  Layer& L = layer();
  ThreadPool& pool = pool_of(threads);
  const auto ids = routings(n, active);
  std::mt19937 rng(5);
  const auto x = test::random_acts(n * kEmbd, rng);
  std::vector<float> w(static_cast<size_t>(n * kTopK), 0.125f), out(static_cast<size_t>(n * kEmbd));
  MoeScratch s(n, kTopK, kExperts, kEmbd, kFf);
  cpu::MatmulBatch mb(threads, n);
  double bytes = 0;
  int64_t it = 0;
  for (auto _ : state) {
    const int32_t* id = ids.data() + (it % kIdSets) * n * kTopK;
    moe_experts(L.ew, x.data(), n, id, w.data(), kTopK, out.data(), s, mb, pool, MatmulMode::Fast);
    benchmark::DoNotOptimize(out.data());
    state.PauseTiming();
    bytes += 3.0 * L.matrix_bytes * static_cast<double>(distinct(id, n).size());
    state.ResumeTiming();
    ++it;
  }
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}

// memcpy of the same matrices (same routings) into a per-thread 64 KiB buffer: read bandwidth.
void BM_MemcpySame(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int active = static_cast<int>(state.range(1));
  const int threads = state.range(2) ? static_cast<int>(state.range(2)) : all_threads();
  Layer& L = layer();
  ThreadPool& pool = pool_of(threads);
  const auto ids = routings(n, active);
  constexpr int64_t kPiece = 64 << 10;
  std::vector<uint8_t> dst(static_cast<size_t>(threads * kPiece));
  std::vector<const uint8_t*> mats;
  double bytes = 0;
  int64_t it = 0;
  for (auto _ : state) {
    state.PauseTiming();
    mats.clear();
    for (int32_t e : distinct(ids.data() + (it % kIdSets) * n * kTopK, n))
      for (const auto* v : {&L.gate, &L.up, &L.down}) mats.push_back(v->data() + e * L.matrix_bytes);
    bytes += static_cast<double>(mats.size()) * L.matrix_bytes;
    const int64_t per = (L.matrix_bytes + kPiece - 1) / kPiece;
    state.ResumeTiming();
    pool.parallel_for(static_cast<int64_t>(mats.size()) * per, 1, [&](int64_t b, int64_t e, int ti) {
      for (int64_t c = b; c < e; ++c) {
        const int64_t off = (c % per) * kPiece, len = std::min(kPiece, L.matrix_bytes - off);
        std::memcpy(dst.data() + ti * kPiece, mats[static_cast<size_t>(c / per)] + off, static_cast<size_t>(len));
      }
    });
    benchmark::ClobberMemory();
    ++it;
  }
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}

// One empty parallel region with one item per thread: the pool's wake-up + join cost.
void BM_PoolRegion(benchmark::State& state) {
  const int threads = state.range(0) ? static_cast<int>(state.range(0)) : all_threads();
  ThreadPool& pool = pool_of(threads);
  std::vector<int64_t> sink(static_cast<size_t>(threads) * 16);
  for (auto _ : state) {
    pool.parallel_for(threads, 1, [&](int64_t b, int64_t, int ti) { sink[static_cast<size_t>(ti) * 16] += b; });
    benchmark::ClobberMemory();
  }
  state.counters["threads"] = threads;
}

// x_memcpy = GB/s / the MemcpySame run with the same (n, active, threads), reported after both ran.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  RatioReporter() : ConsoleReporter(OO_None) {}  // plain text: easy to grep and diff
  bool ReportContext(const Context& c) override { return ConsoleReporter::ReportContext(c); }
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> out = runs;
    for (auto& r : out) {
      const std::string name = r.run_name.function_name;
      auto it = r.counters.find("GB/s");
      if (it == r.counters.end()) continue;
      const std::string key = r.run_name.args;
      if (name.find("MemcpySame") != std::string::npos) {
        memcpy_[key] = it->second.value;
      } else if (memcpy_.count(key)) {
        r.counters["x_memcpy"] = benchmark::Counter(it->second.value / memcpy_[key]);
      }
    }
    ConsoleReporter::ReportRuns(out);
  }

 private:
  std::map<std::string, double> memcpy_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  layer();  // build the weights before timing anything
  std::printf("MoE layer: n_embd %lld, ff %lld, %d experts, top-%d, %s (%lld bytes per expert matrix); "
              "threads all = %d, kernel level %s\n",
              static_cast<long long>(kEmbd), static_cast<long long>(kFf), kExperts, kTopK,
              std::string(type_name(kType)).c_str(), static_cast<long long>(layer().matrix_bytes), all_threads(),
              std::string(cpu_level_name(cpu_level())).c_str());
  for (int threads : {1, 0}) {
    benchmark::RegisterBenchmark("PoolRegion", BM_PoolRegion)->Arg(threads)->UseRealTime()->Unit(benchmark::kMicrosecond);
    for (int64_t n : {1, 2, 4})
      for (int active : {8, 6}) {
        if (n > 1 && active == 6) continue;
        // The memcpy runs first so the reporter has its number when the MoE run is reported.
        benchmark::RegisterBenchmark("MemcpySame", BM_MemcpySame)->Args({n, active, threads})->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark("MoeExperts", BM_MoeExperts)->Args({n, active, threads})->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
  }
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
