// The CPU pool's decode work: moe_experts on one Qwen3-30B-A3B-geometry MoE layer (n_embd 2048, expert
// ff 768, 128 experts, top-8, Q4_K or STRATA_BENCH_TYPE, fast mode) for n = 1, 2, 4 tokens, with all 8 routed experts of a
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
//
// Variants, side by side in one run (all give the same bytes; tests/test_moe_decode_path.cpp):
//   MoeExperts      the engine's default (MoeOptions::from_env(): STRATA_MOE_* or the built-in default)
//   MoeGeneral      the general path (matmul_many gate+up, swiglu region, matmul_many down, serial sum):
//                   the path before the fused one; x_general = MoeGeneral time / this time (> 1: faster)
//   MoeFused_*      the fused decode path, built-in defaults with one option changed: pfN_L2 / pfN_L1 =
//                   prefetch N bytes ahead into L2 / L1 (pf0: none), two_regions = gate+up and down in
//                   separate parallel regions, tail_off = the last expert's down items as large as
//                   the others, itemNk = N KiB of weights per item, pair_off = no two-row kernel for
//                   gate and up (MoeOptions::pair_rows)
//   MoeHot          MoeExperts with one routing every call: the weights stay in the last-level cache
//                   (the kernels' compute ceiling; its x_memcpy compares it with the cold memcpy)
// Args: n / active experts of 8 / threads (0 = all) / pages (0: the weights on 4 KiB pages
// (MADV_NOHUGEPAGE), 1: on 2 MiB pages (MADV_HUGEPAGE; the header says how much the kernel gave)).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
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
// STRATA_BENCH_TYPE=Q4_0 (any type with a CPU kernel) for another format; Q4_K by default.
const GgmlType kType = [] {
  const char* e = std::getenv("STRATA_BENCH_TYPE");
  if (e == nullptr) return GgmlType::Q4_K;
  const auto t = type_from_name(e);
  if (!t) {
    std::fprintf(stderr, "STRATA_BENCH_TYPE=%s: not a ggml type name\n", e);
    std::exit(2);
  }
  return *t;
}();
constexpr int kIdSets = 512;  // random routings cycled through

// Anonymous memory, 2 MiB aligned, on 4 KiB pages (huge = false: MADV_NOHUGEPAGE) or asking for
// 2 MiB pages (MADV_HUGEPAGE). Lives for the whole run.
struct Pages {
  uint8_t* p = nullptr;
  size_t bytes = 0;
  std::vector<uint8_t> data_holder;  // only used if mmap fails
  uint8_t* data() { return p; }
};

Pages alloc_pages(size_t bytes, bool huge) {
  constexpr size_t k2M = size_t(2) << 20;
  Pages pg;
  pg.bytes = bytes;
  void* m = mmap(nullptr, bytes + k2M, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    pg.data_holder.resize(bytes);
    pg.p = pg.data_holder.data();
    return pg;
  }
  auto* a = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(m) + k2M - 1) / k2M * k2M);
  madvise(a, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  pg.p = a;
  return pg;
}

// kB of AnonHugePages of the mapping that contains p (/proc/self/smaps), -1 if not found.
long anon_huge_kb(const void* p) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  bool in = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's header line
      in = addr >= lo && addr < hi;
      continue;
    }
    if (in && line.rfind("AnonHugePages:", 0) == 0) return std::atol(line.c_str() + 14);
  }
  return -1;
}

struct Layer {
  Pages gate, up, down;      // [kExperts][rows][row_bytes] each
  int64_t matrix_bytes = 0;  // one expert's one matrix (gate, up and down are the same size)
  ExpertWeights ew;
};

Pages stack(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng, bool huge) {
  const int64_t rb = static_cast<int64_t>(row_bytes(t, cols));
  // 64 distinct random rows, repeated (random generation is slow; the values do not change speed).
  std::vector<uint8_t> pattern;
  for (int i = 0; i < 64; ++i) {
    auto r = test::random_row(t, cols, rng);
    pattern.insert(pattern.end(), r.begin(), r.end());
  }
  Pages out = alloc_pages(static_cast<size_t>(rb * rows * kExperts), huge);
  for (int64_t r = 0; r < rows * kExperts; ++r)
    std::memcpy(out.data() + r * rb, pattern.data() + (r % 64) * rb, static_cast<size_t>(rb));
  return out;
}

// pages 0: 4 KiB pages, 1: 2 MiB pages asked for (built on first use, before timing).
Layer& layer(int pages = 0) {
  static Layer* ls[2] = {nullptr, nullptr};
  Layer*& l = ls[pages ? 1 : 0];
  if (!l) {
    auto* L = new Layer;
    std::mt19937 rng(11);
    L->gate = stack(kType, kFf, kEmbd, rng, pages != 0);
    L->up = stack(kType, kFf, kEmbd, rng, pages != 0);
    L->down = stack(kType, kEmbd, kFf, rng, pages != 0);
    L->matrix_bytes = static_cast<int64_t>(row_bytes(kType, kEmbd)) * kFf;
    auto w = [](Pages& d, int64_t ne0, int64_t ne1) {
      Weight x;
      x.type = kType;
      x.data = d.data();
      x.ne[0] = ne0;
      x.ne[1] = ne1;
      x.ne[2] = kExperts;
      return x;
    };
    L->ew = {w(L->gate, kEmbd, kFf), w(L->up, kEmbd, kFf), w(L->down, kFf, kEmbd)};
    l = L;
  }
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

// state.range: 0 = n tokens, 1 = active experts per token (of 8), 2 = threads (0 = all), 3 = pages.
// hot: the same routing every call, so its experts' weights stay in the last-level cache (16 MB of a
// 6-expert layer): the kernels' compute ceiling at this thread count, against the cold runs' DRAM case.
void BM_Moe(benchmark::State& state, MoeOptions opt, bool hot = false) {
  const int64_t n = state.range(0);
  const int active = static_cast<int>(state.range(1));
  const int threads = state.range(2) ? static_cast<int>(state.range(2)) : all_threads();
  Layer& L = layer(static_cast<int>(state.range(3)));
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
    const int32_t* id = ids.data() + (hot ? 0 : it % kIdSets) * n * kTopK;
    moe_experts(L.ew, x.data(), n, id, w.data(), kTopK, out.data(), s, mb, pool, MatmulMode::Fast, opt);
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
  Layer& L = layer(static_cast<int>(state.range(3)));
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
      for (Pages* v : {&L.gate, &L.up, &L.down}) mats.push_back(v->data() + e * L.matrix_bytes);
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

// x_memcpy = GB/s / the MemcpySame run with the same args; x_general = the MoeGeneral run's time with the
// same args / this run's time (the speed-up over the general path). Reported after both ran.
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
      // With --benchmark_repetitions: single runs pair with single runs, mean/median with mean/median.
      if (r.aggregate_name == "stddev" || r.aggregate_name == "cv") continue;
      const std::string key = r.run_name.args + "|" + r.aggregate_name;
      if (name.find("MemcpySame") != std::string::npos) {
        memcpy_[key] = it->second.value;
        continue;
      }
      if (memcpy_.count(key)) r.counters["x_memcpy"] = benchmark::Counter(it->second.value / memcpy_[key]);
      const double t = r.GetAdjustedRealTime();
      if (name == "MoeGeneral") general_[key] = t;
      if (general_.count(key) && t > 0) r.counters["x_general"] = benchmark::Counter(general_[key] / t);
    }
    ConsoleReporter::ReportRuns(out);
  }

 private:
  std::map<std::string, double> memcpy_, general_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  layer(0);  // build the weights before timing anything
  layer(1);
  const MoeOptions& env = MoeOptions::from_env();
  std::printf("MoE layer: n_embd %lld, ff %lld, %d experts, top-%d, %s (%lld bytes per expert matrix); "
              "threads all = %d, kernel level %s\n",
              static_cast<long long>(kEmbd), static_cast<long long>(kFf), kExperts, kTopK,
              std::string(type_name(kType)).c_str(), static_cast<long long>(layer().matrix_bytes), all_threads(),
              std::string(cpu_level_name(cpu_level())).c_str());
  std::printf("MoeExperts options (STRATA_MOE_*): fused %d, one region %d, prefetch %d bytes into %s, item %d KiB, "
              "tail item %d KiB; pages/1: "
              "AnonHugePages %ld of %lld kB (gate stack), pages/0: %ld kB\n",
              int(env.fused), int(env.one_region), env.prefetch_bytes, env.prefetch_l2 ? "L2" : "L1", env.item_bytes >> 10,
              env.tail_item_bytes >> 10,
              anon_huge_kb(layer(1).gate.data()),
              static_cast<long long>(layer(1).gate.bytes >> 10), anon_huge_kb(layer(0).gate.data()));
  auto general = [] {
    MoeOptions o;
    o.fused = false;
    return o;
  };
  // The built-in defaults with one option changed.
  const MoeOptions d;
  auto fused = [&](int pf, bool l2, int item_kib) {
    MoeOptions o = d;
    o.prefetch_bytes = pf;
    o.prefetch_l2 = l2;
    o.item_bytes = item_kib << 10;
    return o;
  };
  const std::vector<std::pair<std::string, MoeOptions>> variants = {
      {"MoeFused_pf0", fused(0, d.prefetch_l2, d.item_bytes >> 10)},
      {"MoeFused_pf1024_L2", fused(1024, true, d.item_bytes >> 10)},
      {"MoeFused_pf4096_L2", fused(4096, true, d.item_bytes >> 10)},
      {"MoeFused_pf8192_L2", fused(8192, true, d.item_bytes >> 10)},
      {"MoeFused_pf16384_L2", fused(16384, true, d.item_bytes >> 10)},
      {"MoeFused_pf32768_L2", fused(32768, true, d.item_bytes >> 10)},
      {"MoeFused_pf1024_L1", fused(1024, false, d.item_bytes >> 10)},
      {"MoeFused_pf4096_L1", fused(4096, false, d.item_bytes >> 10)},
      {"MoeFused_two_regions", [&] {
         MoeOptions o = d;
         o.one_region = false;
         return o;
       }()},
      {"MoeFused_tail_off", [&] {
         MoeOptions o = d;
         o.tail_item_bytes = 0;
         return o;
       }()},
      {"MoeFused_pair_off", [&] {
         MoeOptions o = d;
         o.pair_rows = false;
         return o;
       }()},
      {"MoeFused_item32k", fused(d.prefetch_bytes, d.prefetch_l2, 32)},
      {"MoeFused_item128k", fused(d.prefetch_bytes, d.prefetch_l2, 128)}};
  auto reg = [](const std::string& name, MoeOptions o, std::vector<int64_t> args) {
    benchmark::RegisterBenchmark(name.c_str(), [o](benchmark::State& st) { BM_Moe(st, o); })
        ->Args(args)->UseRealTime()->Unit(benchmark::kMicrosecond);
  };
  // Per (n, active, threads, pages): the memcpy first (the reporter needs it when the MoE runs are
  // reported), then the general path (the x_general baseline), then the default and the variants.
  auto group = [&](int64_t n, int active, int threads, int pages, bool all_variants) {
    const std::vector<int64_t> args = {n, active, threads, pages};
    benchmark::RegisterBenchmark("MemcpySame", BM_MemcpySame)->Args(args)->UseRealTime()->Unit(benchmark::kMicrosecond);
    reg("MoeGeneral", general(), args);
    reg("MoeExperts", env, args);
    benchmark::RegisterBenchmark("MoeHot", [env](benchmark::State& st) { BM_Moe(st, env, true); })
        ->Args(args)->UseRealTime()->Unit(benchmark::kMicrosecond);
    MoeOptions unpaired = env;
    unpaired.pair_rows = false;
    benchmark::RegisterBenchmark("MoeHot_pair_off", [unpaired](benchmark::State& st) { BM_Moe(st, unpaired, true); })
        ->Args(args)->UseRealTime()->Unit(benchmark::kMicrosecond);
    if (all_variants)
      for (const auto& [name, o] : variants) reg(name, o, args);
  };
  const int all = all_threads();
  benchmark::RegisterBenchmark("PoolRegion", BM_PoolRegion)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("PoolRegion", BM_PoolRegion)->Arg(0)->UseRealTime()->Unit(benchmark::kMicrosecond);
  group(1, 6, 1, 0, false);
  group(1, 8, 1, 0, false);
  for (int active : {6, 8}) group(1, active, 0, 0, true);  // the decode case, every variant
  group(1, 6, 0, 1, true);                                 // ... on 2 MiB pages
  if (all >= 4) {                                          // one thread per physical core (if SMT 2)?
    benchmark::RegisterBenchmark("PoolRegion", BM_PoolRegion)->Arg(all / 2)->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    group(1, 6, all / 2, 0, false);
    group(1, 6, all / 2, 1, false);
  }
  for (int64_t n : {2, 4}) group(n, 8, 0, 0, false);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
