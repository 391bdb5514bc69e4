// Banned tokens picked on the GPU (Engine::decode_sample with SampleBans: a server request's ignore_eos;
// DeviceSampling::ban, ops::ban_tokens before the pick): the same picks as the CPU Sampler on the same
// model's logits with the banned ids set to -inf (cpu::ban_tokens), greedy and random, fully resident and at
// 25% (CPU-pool passes). Three sequences in one batch, bans on the last two, so the flags are read per row.
// The banned ids are the unbanned greedy run's picks, so the bans change the run. Also three samplers with
// different parameters in one batch (DeviceSampling::rules, EngineOptions::mixed_device_sampling): the
// device's picks with a rule per row equal each CPU Sampler's. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cuda/backend.h"
#include "cuda/device.h"
#include "engine/engine.h"
#include "engine/sampling.h"

using namespace strata;

namespace {

const std::string kModel = std::string(STRATA_FIXTURES_DIR) + "/models/tiny-qwen3moe-A-Q4_K_M.gguf";
const std::vector<uint8_t> kFlags = {0, 1, 1};

using Runs = std::vector<std::vector<int32_t>>;

// [3][steps] picks; device: decode_sample with bans, else decode + cpu::ban_tokens + each Sampler. Sequence s
// samples with params[s] (seeded 300 + s).
Runs run(Engine& eng, const std::vector<SamplingParams>& params, const std::vector<int32_t>& ban, bool device,
         int steps) {
  const int V = eng.n_vocab();
  std::vector<std::unique_ptr<SequenceState>> seqs;
  std::vector<Sampler> samplers;
  samplers.reserve(3);
  std::vector<int32_t> cur;
  std::vector<float> logits(size_t(V) * 3);
  for (int s = 0; s < 3; ++s) {
    seqs.push_back(eng.new_sequence());
    SamplingParams sp = params[size_t(s)];
    sp.seed = 300 + uint64_t(s);
    samplers.emplace_back(sp, V);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 6 + 3 * s; ++i) prompt.push_back((i * 7919 + s * 104729) % V);
    eng.prefill(*seqs.back(), prompt, logits.data());
    cur.push_back(samplers.back().sample(logits.data()));
  }
  SequenceState* sq[3] = {seqs[0].get(), seqs[1].get(), seqs[2].get()};
  Sampler* sm[3] = {&samplers[0], &samplers[1], &samplers[2]};
  Runs out(3);
  for (int step = 0; step < steps; ++step) {
    for (int s = 0; s < 3; ++s) samplers[size_t(s)].accept(cur[size_t(s)]), out[size_t(s)].push_back(cur[size_t(s)]);
    const std::vector<int32_t> in = cur;
    if (device) {
      eng.decode_sample(sq, in, sm, cur.data(), {ban, kFlags});
    } else {
      eng.decode(sq, in, logits.data());
      cpu::ban_tokens(logits.data(), 3, V, ban.data(), int32_t(ban.size()), kFlags.data());
      for (int s = 0; s < 3; ++s) cur[size_t(s)] = samplers[size_t(s)].sample(logits.data() + size_t(s) * V);
    }
  }
  return out;
}

Runs run(Engine& eng, float temp, const std::vector<int32_t>& ban, bool device, int steps) {
  SamplingParams sp;
  sp.temperature = temp;
  return run(eng, {sp, sp, sp}, ban, device, steps);
}

// The fixture model with `cache` of its experts resident, and an engine over it (2 threads, 128 positions).
std::shared_ptr<const Model> load(const char* cache) {
  cuda::CudaOptions o;
  o.expert_cache = cache;
  o.adapt_every = 0;
  o.n_ctx = 128;
  return cuda::load_model_cuda(kModel, o);
}
EngineOptions engine_options(bool mixed) {
  EngineOptions eo;
  eo.n_ctx = 128;
  eo.n_threads = 2;
  eo.mixed_device_sampling = mixed;
  return eo;
}

std::string str(const std::vector<int32_t>& g) {
  std::string s;
  for (int32_t t : g) s += std::to_string(t) + " ";
  return s;
}

}  // namespace

TEST(SamplingBansGpu, DevicePicksWhatTheCpuSamplerPicksWithBannedIdsAtMinusInfinity) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const char* cache : {"100%", "25%"}) {
    std::shared_ptr<const Model> model = load(cache);
    ASSERT_TRUE(model->samples_on_device());
    Engine eng(model, engine_options(false));
    // The banned ids: the first 4 distinct picks after the prompt's of the flagged sequences, unbanned.
    const Runs free = run(eng, 0.0f, {}, true, 12);
    std::vector<int32_t> ban;
    for (int s : {1, 2})
      for (size_t i = 1; i < free[size_t(s)].size(); ++i)
        if (ban.size() < 4 && std::find(ban.begin(), ban.end(), free[size_t(s)][i]) == ban.end())
          ban.push_back(free[size_t(s)][i]);
    ASSERT_FALSE(ban.empty());
    for (const float temp : {0.0f, 0.8f}) {
      const Runs want = run(eng, temp, ban, false, 12), got = run(eng, temp, ban, true, 12);
      std::printf("[ gpu bans %4s T=%.1f ] seq 1: %s\n", cache, temp, str(got[1]).c_str());
      EXPECT_EQ(got, want) << cache << " temperature " << temp;
      for (int s : {1, 2})
        for (size_t i = 1; i < got[size_t(s)].size(); ++i)
          EXPECT_EQ(std::count(ban.begin(), ban.end(), got[size_t(s)][i]), 0) << cache << " seq " << s << " step " << i;
      if (temp == 0.0f) {
        EXPECT_EQ(got[0], free[0]) << "the unflagged sequence is not banned";
        EXPECT_TRUE(got[1] != free[1] || got[2] != free[2]) << "the bans changed nothing";
      }
    }
  }
}

TEST(SamplingBansGpu, MixedRulesPickWhatEachCpuSamplerPicks) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  std::vector<SamplingParams> params(3);
  params[0].temperature = 0.0f;
  params[1].temperature = 0.8f;  // top_k 40, top_p 0.95, min_p 0.05: the defaults
  params[2].temperature = 1.2f;
  params[2].top_k = 0;
  params[2].top_p = 1.0f;
  params[2].min_p = 0.0f;
  const std::vector<int32_t> ban = {3, 17};
  for (const char* cache : {"100%", "25%"}) {
    Engine eng(load(cache), engine_options(true));
    ASSERT_TRUE(eng.options().mixed_device_sampling);
    const Runs want = run(eng, params, ban, false, 16), got = run(eng, params, ban, true, 16);
    std::printf("[ gpu mixed rules %4s ] seq 2: %s\n", cache, str(got[2]).c_str());
    EXPECT_EQ(got, want) << cache;
  }
}
