// Chained decode on the GPU (Engine::generate over Model::chains_decode, ForwardOptions::chain / defer): with
// every expert resident, each step is launched from the previous step's picks on the device and left
// pending while the host takes the picks before it. The same picks, positions and sampler states as a
// decode_sample loop, greedy and at temperature 0.8, one and two sequences, stopped at several steps (the
// step launched ahead then dropped) and continued after the stop; at 50% resident (no chaining: CPU-pool
// passes) the same. A synthetic Q4_0 qwen3moe of 2 layers and 16 experts, fast mode. The engine's side of
// the protocol is tested on the CPU (tests/test_engine_generate.cpp). Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "cpu/thread_pool.h"
#include "cuda/backend.h"
#include "cuda/device.h"
#include "decode_test_util.h"
#include "../generate_test_util.h"

using namespace strata;

namespace {

// n_seqs sequences, each prefilled with its own prompt, then test::generate_run from fixed first tokens.
test::GenRun run(std::shared_ptr<const Model> model, bool generate, int n_seqs, float temperature, int max_steps,
                 int stop, int extra) {
  Engine eng(model, test::small_engine_options(MatmulMode::Fast, cpu::AttnMath::F32));
  const uint32_t V = uint32_t(eng.n_vocab());
  test::GenSeqs g = test::gen_seqs(eng, n_seqs, temperature, 21, [&](int i) {
    return test::random_prompt(size_t(6 + 3 * i), V, uint32_t(11 + i));
  });
  std::vector<int32_t> first_toks(static_cast<size_t>(n_seqs));
  for (int i = 0; i < n_seqs; ++i) first_toks[size_t(i)] = int32_t((97u * uint32_t(i) + 5u) % V);
  return test::generate_run(eng, g.seqs, g.sp, first_toks, generate, max_steps, stop, extra);
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
          const test::GenRun got = run(model, true, n_seqs, t, 12, stop, 2);
          const test::GenRun want = run(model, false, n_seqs, t, 12, stop, 2);
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

// Bans (the server's ignore_eos) in every chained step: the picks of generate with bans are the decode_sample
// loop's with the same bans, no flagged sequence picks a banned id, the unflagged one picks as without bans.
TEST(DecodeChainGpu, BansHoldInEveryChainedStep) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const std::string path = test::write_small_synthetic("Q4_0", 19, "decode-chain-bans");
  std::shared_ptr<const Model> model = cuda::load_model_cuda(path, test::small_cuda_options("100%", false));
  const std::vector<uint8_t> rows = {1, 0};
  const auto go = [&](bool generate, const std::vector<int32_t>& ids, float t) {
    Engine eng(model, test::small_engine_options(MatmulMode::Fast, cpu::AttnMath::F32));
    const uint32_t V = uint32_t(eng.n_vocab());
    test::GenSeqs g = test::gen_seqs(eng, 2, t, 21, [&](int i) {
      return test::random_prompt(size_t(6 + 3 * i), V, uint32_t(11 + i));
    });
    const std::vector<int32_t> first = {5, 102};
    const SampleBans bans{ids, ids.empty() ? std::span<const uint8_t>() : std::span<const uint8_t>(rows)};
    const test::GenRun r = test::generate_run(eng, g.seqs, g.sp, first, generate, 10, -1, 0, bans);
    EXPECT_EQ(r.steps, 10);
    return r.picks;
  };
  for (float t : {0.0f, 0.8f}) {
    SCOPED_TRACE("temperature " + std::to_string(t));
    const std::vector<int32_t> free = go(true, {}, t);
    std::vector<int32_t> ids;
    for (size_t i = 0; i < free.size(); i += 2)
      if (std::find(ids.begin(), ids.end(), free[i]) == ids.end()) ids.push_back(free[i]);
    const std::vector<int32_t> banned = go(true, ids, t);
    EXPECT_EQ(banned, go(false, ids, t));
    for (size_t i = 0; i < banned.size(); i += 2)
      EXPECT_EQ(std::count(ids.begin(), ids.end(), banned[i]), 0) << "step " << i / 2 << " picked a banned id";
    if (t == 0.0f)
      for (size_t i = 1; i < banned.size(); i += 2) EXPECT_EQ(banned[i], free[i]) << "step " << i / 2;
  }
}
