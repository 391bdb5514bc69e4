// CPU sampling of one logits row at the Qwen vocabulary size (151,936), temperature 1, no penalties:
//   BM_Sample/<top_k>/<sd>           strata::Sampler
//   BM_SampleFullSort/<top_k>/<sd>   the same rule with every candidate sorted (tests/sampling_reference.h:
//                                    the sampler before session 38) as baseline
// top_k 0 is the OpenAI API's default (`strata serve` without top_k): every token a candidate. sd: the
// logits' spread (normal), 1 flat (the draw lands deep in the order), 4 peaked.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "../tests/sampling_reference.h"
#include "engine/sampling.h"

using namespace strata;

namespace {

constexpr int32_t kVocab = 151936;

std::vector<float> logits_row(float sd) {
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> l(static_cast<size_t>(kVocab));
  for (float& x : l) x = nd(g);
  return l;
}

SamplingParams params(int top_k) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = top_k;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

void BM_Sample(benchmark::State& st) {
  const std::vector<float> l = logits_row(float(st.range(1)));
  Sampler s(params(int(st.range(0))), kVocab);
  for (auto _ : st) benchmark::DoNotOptimize(s.sample(l.data()));
}

void BM_SampleFullSort(benchmark::State& st) {
  const std::vector<float> l = logits_row(float(st.range(1)));
  const SamplingParams p = params(int(st.range(0)));
  Rng rng(p.seed);
  for (auto _ : st) benchmark::DoNotOptimize(test::reference_pick(p, l, {}, rng));
}

}  // namespace

BENCHMARK(BM_Sample)->ArgsProduct({{0, 40}, {1, 4}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SampleFullSort)->ArgsProduct({{0, 40}, {1, 4}})->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
