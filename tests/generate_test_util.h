#pragma once
// Engine::generate against the step-by-step decode_sample loop it promises to equal: one run of either, the
// picks, positions and sampler states it leaves (tests/test_engine_generate.cpp on the CPU,
// tests/cuda/test_decode_chain_gpu.cpp on the GPU).
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace strata::test {

struct GenRun {
  std::vector<int32_t> picks;      // every step's, in order (sequences interleaved), then the extra steps'
  std::vector<int32_t> n_past;     // each sequence's, at the end
  std::vector<double> next_draws;  // each sampler's next draw at the end
  int steps = 0;
};

// n sequences of eng, sequence i prefilled with prompt(i), each with its sampler (temperature, penalties off,
// seed seed0 + i).
struct GenSeqs {
  std::vector<std::unique_ptr<SequenceState>> owned;
  std::vector<SequenceState*> seqs;
  std::vector<Sampler> samplers;
  std::vector<Sampler*> sp;  // into samplers
};
inline GenSeqs gen_seqs(Engine& eng, int n, float temperature, uint64_t seed0,
                        const std::function<std::vector<int32_t>(int)>& prompt) {
  GenSeqs g;
  SamplingParams p;
  p.temperature = temperature;
  p.repeat_penalty = 1.0f;
  for (int i = 0; i < n; ++i) {
    g.seqs.push_back(g.owned.emplace_back(eng.new_sequence()).get());
    eng.prefill(*g.seqs.back(), prompt(i), nullptr);
    p.seed = seed0 + uint64_t(i);
    g.samplers.emplace_back(p, eng.n_vocab());
  }
  for (auto& s : g.samplers) g.sp.push_back(&s);
  return g;
}

// From `first` (a token per sequence), max_steps steps by Engine::generate (generate) or by a decode_sample
// loop, stopping after step `stop` (-1: none); then `extra` plain decode_sample steps from the last picks.
// bans: in every step of either (not in the extra ones).
inline GenRun generate_run(Engine& eng, std::span<SequenceState* const> seqs, std::span<Sampler* const> samplers,
                           std::span<const int32_t> first, bool generate, int max_steps, int stop, int extra,
                           const SampleBans& bans = {}) {
  const size_t n = seqs.size();
  GenRun r;
  const auto on_step = [&](int step, std::span<const int32_t> picks) {
    r.picks.insert(r.picks.end(), picks.begin(), picks.end());
    return step != stop;
  };
  std::vector<int32_t> outs(n);
  if (generate) {
    r.steps = eng.generate(seqs, first, samplers, max_steps, on_step, bans);
  } else {
    std::vector<int32_t> cur(first.begin(), first.end());
    for (int s = 0; s < max_steps; ++s) {
      eng.decode_sample(seqs, cur, samplers, outs.data(), bans);
      ++r.steps;
      if (!on_step(s, outs)) break;
      cur = outs;
    }
  }
  for (int e = 0; e < extra; ++e) {
    const std::vector<int32_t> in(r.picks.end() - std::ptrdiff_t(n), r.picks.end());
    eng.decode_sample(seqs, in, samplers, outs.data());
    r.picks.insert(r.picks.end(), outs.begin(), outs.end());
  }
  for (SequenceState* s : seqs) r.n_past.push_back(s->n_past());
  for (Sampler* s : samplers) r.next_draws.push_back(s->next_draw());
  return r;
}

}  // namespace strata::test
