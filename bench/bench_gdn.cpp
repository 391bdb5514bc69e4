// Gated DeltaNet core of one qwen3next layer at Qwen3-Next-80B-A3B geometry (16 key heads, 32 value
// heads, head size 128, conv kernel 4 over 8192 channels), CPU.
//   prefill: the chunked form (chunk 64/32/16) vs the recurrent form over the same tokens (the
//            baseline, same process)
//   decode:  one token through the recurrent form, and the conv1d of one token
// Results: bench/results/2026-11-29-qwen3next-cpu.md
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/gdn.h"

namespace {

using namespace strata;

constexpr int64_t kHk = 16, kHv = 32, kD = 128;

struct Inputs {
  std::vector<float> q, k, v, g, beta, state, out;
  explicit Inputs(int64_t T) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1, 1), neg(-1, 0), pos(0, 1);
    auto fill = [&](std::vector<float>& x, size_t n, auto& d) {
      x.resize(n);
      for (auto& e : x) e = d(rng);
    };
    fill(q, size_t(T * kHk * kD), u);
    fill(k, size_t(T * kHk * kD), u);
    fill(v, size_t(T * kHv * kD), u);
    fill(g, size_t(T * kHv), neg);
    fill(beta, size_t(T * kHv), pos);
    state.assign(size_t(kHv * kD * kD), 0.0f);
    out.resize(size_t(T * kHv * kD));
    l2_norm_rows(q.data(), T * kHk, kD, 1e-6f);
    l2_norm_rows(k.data(), T * kHk, kD, 1e-6f);
  }
};

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

void BM_DeltaRulePrefillChunked(benchmark::State& st) {
  const int64_t T = st.range(0);
  Inputs in(T);
  const DeltaRuleShape s{T, kHk, kHv, kD};
  for (auto _ : st) {
    gdn_delta_rule_chunked(s, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                           1.0f / std::sqrt(float(kD)), in.state.data(), in.out.data(), pool(),
                           int(st.range(1)));
    benchmark::DoNotOptimize(in.out.data());
  }
  st.SetItemsProcessed(st.iterations() * T);
}

void BM_DeltaRulePrefillRecurrent(benchmark::State& st) {
  const int64_t T = st.range(0);
  Inputs in(T);
  const DeltaRuleShape s{T, kHk, kHv, kD};
  for (auto _ : st) {
    gdn_delta_rule_recurrent(s, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                             1.0f / std::sqrt(float(kD)), in.state.data(), in.out.data(), pool());
    benchmark::DoNotOptimize(in.out.data());
  }
  st.SetItemsProcessed(st.iterations() * T);
}

void BM_DeltaRuleDecode(benchmark::State& st) {
  Inputs in(1);
  const DeltaRuleShape s{1, kHk, kHv, kD};
  for (auto _ : st) {
    gdn_delta_rule_recurrent(s, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                             1.0f / std::sqrt(float(kD)), in.state.data(), in.out.data(), pool());
    benchmark::DoNotOptimize(in.out.data());
  }
  st.SetItemsProcessed(st.iterations());
}

void BM_Conv1dDecode(benchmark::State& st) {
  const int64_t C = 2 * kHk * kD + kHv * kD;
  const int K = 4;
  std::vector<float> x(size_t(C), 0.5f), w(size_t(C * K), 0.25f), state(size_t((K - 1) * C), 0.0f),
      y(static_cast<size_t>(C));
  for (auto _ : st) {
    gdn_conv1d_silu(x.data(), 1, C, K, state.data(), w.data(), y.data());
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(st.iterations());
}

BENCHMARK(BM_DeltaRulePrefillRecurrent)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DeltaRulePrefillChunked)->Args({512, 64})->Args({512, 32})->Args({512, 16})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DeltaRuleDecode)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Conv1dDecode)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
