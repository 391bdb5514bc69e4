// Chained decode on the GPU (Engine::generate over Model::chains_decode, ForwardOptions::chain / defer): with
// every expert resident, each step is launched from the previous step's picks on the device and left
// pending while the host takes the picks before it. The same picks, positions and sampler states as a
// decode_sample loop, greedy and at temperature 0.8, one and two sequences, stopped at several steps (the
// step launched ahead then dropped) and continued after the stop; at 50% resident (no chaining: CPU-pool
// passes) the same. A synthetic Q4_0 qwen3moe of 2 layers and 16 experts, fast mode. The engine's side of
// the protocol is tested on the CPU (tests/test_engine_generate.cpp). Skipped without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "cpu/thread_pool.h"
#include "cuda/backend.h"
#include "cuda/device.h"
#include "decode_test_util.h"

using namespace strata;

namespace {

struct ChainRun {
  std::vector<int32_t> picks;      // every step's, in order (sequences interleaved), then the steps after
  std::vector<int32_t> n_past;     // each sequence's, at the end
  std::vector<double> next_draws;  // each sampler's next draw at the end
  int steps = 0;
};

// n_seqs sequences, each prefilled with its own prompt, then `max_steps` steps from fixed first tokens:
// Engine::generate (chained) or a decode_sample loop, stopping after step `stop` (-1: none); then `extra`
// plain decode_sample steps from the last picks.
ChainRun run(std::shared_ptr<const Model> model, bool generate, int n_seqs, float temperature, int max_steps,
             int stop, int extra) {
  EngineOptions opt = test::small_engine_options(MatmulMode::Fast, cpu::AttnMath::F32);
  Engine eng(model, opt);
  const uint32_t V = uint32_t(eng.n_vocab());
  std::vector<std::unique_ptr<SequenceState>> owned;
  std::vector<SequenceState*> seqs;
  std::vector<Sampler> samplers;
  std::vector<Sampler*> sp;
  SamplingParams p;
  p.temperature = temperature;
  p.repeat_penalty = 1.0f;
  for (int i = 0; i < n_seqs; ++i) {
    seqs.push_back(owned.emplace_back(eng.new_sequence()).get());
    eng.prefill(*seqs.back(), test::random_prompt(size_t(6 + 3 * i), V, uint32_t(11 + i)), nullptr);
    p.seed = uint64_t(21 + i);
    samplers.emplace_back(p, int32_t(V));
  }
  for (auto& s : samplers) sp.push_back(&s);
  std::vector<int32_t> first_toks(static_cast<size_t>(n_seqs)), outs(static_cast<size_t>(n_seqs));
  for (int i = 0; i < n_seqs; ++i) first_toks[size_t(i)] = int32_t((97u * uint32_t(i) + 5u) % V);
  ChainRun r;
  const auto on_step = [&](int step, std::span<const int32_t> picks) {
    r.picks.insert(r.picks.end(), picks.begin(), picks.end());
    return step != stop;
  };
  if (generate) {
    r.steps = eng.generate(seqs, first_toks, sp, max_steps, on_step);
  } else {
    std::vector<int32_t> cur = first_toks;
    for (int s = 0; s < max_steps; ++s) {
      eng.decode_sample(seqs, cur, sp, outs.data());
      ++r.steps;
      if (!on_step(s, outs)) break;
      cur = outs;
    }
  }
  for (int e = 0; e < extra; ++e) {
    const std::vector<int32_t> in(r.picks.end() - n_seqs, r.picks.end());
    eng.decode_sample(seqs, in, sp, outs.data());
    r.picks.insert(r.picks.end(), outs.begin(), outs.end());
  }
  for (auto* s : seqs) r.n_past.push_back(s->n_past());
  for (auto& s : samplers) r.next_draws.push_back(s.next_draw());
  return r;
}

}  // namespace

TEST(DecodeChainGpu, GenerateGivesTheDecodeSampleLoopsPicks) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const std::string path = test::write_small_synthetic("Q4_0", 19, "decode-chain");
  for (const char* cache : {"100%", "50%"}) {
    SCOPED_TRACE(std::string("expert cache ") + cache);
    std::shared_ptr<const Model> model = cuda::load_model_cuda(path, test::small_cuda_options(cache, false));
    {
      auto ws = model->new_workspace(16, 64, 2);
      EXPECT_EQ(model->chains_decode(*ws, 1), std::string(cache) == "100%");
      EXPECT_EQ(model->chains_decode(*ws, 2), std::string(cache) == "100%");
      EXPECT_FALSE(model->chains_decode(*ws, 9));  // (more than a graph's tokens)
    }
    for (int n_seqs : {1, 2})
      for (float t : {0.0f, 0.8f})
        for (int stop : {-1, 0, 3, 11}) {
          SCOPED_TRACE(std::to_string(n_seqs) + " sequences, temperature " + std::to_string(t) + ", stop after " +
                       std::to_string(stop));
          const ChainRun got = run(model, true, n_seqs, t, 12, stop, 2);
          const ChainRun want = run(model, false, n_seqs, t, 12, stop, 2);
          EXPECT_EQ(got.steps, stop < 0 ? 12 : stop + 1);
          EXPECT_EQ(got.steps, want.steps);
          EXPECT_EQ(got.picks, want.picks);
          EXPECT_EQ(got.n_past, want.n_past);
          EXPECT_EQ(got.next_draws, want.next_draws);
        }
  }
}

// A chained pass without the previous pass's device picks is an error, and the workspace keeps working.
TEST(DecodeChainGpu, ChainWithoutPicksIsAnError) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const std::string path = test::write_small_synthetic("Q4_0", 19, "decode-chain-bad");
  std::shared_ptr<const Model> model = cuda::load_model_cuda(path, test::small_cuda_options("100%", false));
  auto ws = model->new_workspace(16, 64, 2);
  ThreadPool pool(2);
  auto seq = model->new_sequence(64, KvType::F32);
  SequenceState* sp = seq.get();
  std::vector<float> logits(size_t(model->n_vocab()));
  const BatchToken first{3, 0, 0, true};
  model->forward({std::span<const BatchToken>(&first, 1), std::span<SequenceState* const>(&sp, 1)}, *ws,
                 logits.data(), pool, ForwardOptions{});
  sp->advance(1);
  float u = 0.5f;
  int32_t out = -1;
  DeviceSampling ds;
  ds.temperature = 0.0f;
  ds.u = &u;
  ds.out = &out;
  ForwardOptions fo;
  fo.sampling = &ds;
  fo.chain = true;
  fo.defer = true;
  const BatchToken next{0, 1, 0, true};
  const Batch b{std::span<const BatchToken>(&next, 1), std::span<SequenceState* const>(&sp, 1)};
  EXPECT_THROW(model->forward(b, *ws, nullptr, pool, fo), Error);  // the last pass brought logits back
  fo.chain = false;
  BatchToken again = next;
  again.token = 7;
  model->forward({std::span<const BatchToken>(&again, 1), b.seqs}, *ws, nullptr, pool, fo);
  model->finish_deferred(*ws);
  EXPECT_GE(out, 0);
  EXPECT_LT(out, model->n_vocab());
  model->finish_deferred(*ws);  // none pending: nothing
}
