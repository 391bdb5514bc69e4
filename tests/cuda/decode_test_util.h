#pragma once
// Shared by the GPU model tests that compare two ways of running the same decode (graphs on / off, gated
// passes on / off): the same decode steps of one and of two sequences, every logit row kept.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "../slg.h"
#include "cpu/thread_pool.h"
#include "cuda/backend.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/synthetic.h"

namespace strata::test {

// Prefills ref.prompt[10, 41) into a sequence b and ref.prompt[0, 20) into a sequence a, then decodes
// `one` greedy steps of a alone and `two` steps of a and b in one batch (b continuing from ref.prompt[45]).
// Returns the logits of every decode step in order ([one + 2 * two][n_vocab]); *report = the model's
// expert-cache report of the decode steps.
inline std::vector<float> decode_one_then_two(std::shared_ptr<const Model> model, const EngineOptions& opt,
                                              const Slg& ref, int one, int two, ExpertCacheReport* report) {
  const size_t V = ref.n_vocab;
  const std::vector<int32_t> pa(ref.prompt.begin(), ref.prompt.begin() + 20);
  const std::vector<int32_t> pb(ref.prompt.begin() + 10, ref.prompt.begin() + 41);
  Engine eng(model, opt);
  auto sa = eng.new_sequence(), sb = eng.new_sequence();
  std::vector<float> lone(V), ltwo(2 * V), all;
  eng.prefill(*sb, pb, lone.data());
  eng.prefill(*sa, pa, lone.data());
  model->reset_cache_stats();
  int32_t ta = argmax(lone.data(), V), tb = ref.prompt[45];
  for (int i = 0; i < one; ++i) {
    SequenceState* s = sa.get();
    eng.decode({&s, 1}, {&ta, 1}, lone.data());
    all.insert(all.end(), lone.begin(), lone.end());
    ta = argmax(lone.data(), V);
  }
  for (int i = 0; i < two; ++i) {
    SequenceState* seqs[2] = {sa.get(), sb.get()};
    const int32_t toks[2] = {ta, tb};
    eng.decode({seqs, 2}, {toks, 2}, ltwo.data());
    all.insert(all.end(), ltwo.begin(), ltwo.end());
    ta = argmax(ltwo.data(), V);
    tb = argmax(ltwo.data() + V, V);
  }
  *report = model->cache_report();
  return all;
}

// The synthetic model of `spec` written to a temporary file named after `tag`. Returns its path; the caller
// removes it.
inline std::string write_synthetic(const SyntheticSpec& spec, const char* tag) {
  const std::string path = ::testing::TempDir() + "strata-" + tag + "-" + std::to_string(::getpid()) + ".gguf";
  ThreadPool pool(2);
  write_synthetic_model(spec, path, pool);
  return path;
}
constexpr uint32_t kSmallSyntheticVocab = 512;
// The small synthetic qwen3moe of the GPU model tests that need a format the fixtures lack: 2 layers, n_embd
// 256, expert FFN 256, 16 experts (2 a token; with 8, llama.cpp's rules would give k and v Q8_0), a vocabulary
// of kSmallSyntheticVocab, in `format` (a mkmodel scheme) from `seed`; write_small_synthetic writes it.
inline SyntheticSpec small_synthetic_spec(const char* format, uint64_t seed) {
  SyntheticSpec spec;
  spec.format = format;
  spec.n_layer = 2;
  spec.n_embd = 256;
  spec.n_ff_exp = 256;
  spec.n_expert = 16;
  spec.n_expert_used = 2;
  spec.n_vocab = kSmallSyntheticVocab;
  spec.seed = seed;
  return spec;
}
inline std::string write_small_synthetic(const char* format, uint64_t seed, const char* tag) {
  return write_synthetic(small_synthetic_spec(format, seed), tag);
}

// n token ids drawn from [0, vocab) by mt19937(seed).
inline std::vector<int32_t> random_prompt(size_t n, uint32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> prompt(n);
  for (auto& t : prompt) t = int32_t(rng() % vocab);
  return prompt;
}

// The number of values that differ in their bits between a and b (same size).
inline size_t bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n + (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

// The small model and engine settings of these comparisons: 64 positions, batches of 16, 2 threads.
inline cuda::CudaOptions small_cuda_options(const char* expert_cache, bool exact) {
  cuda::CudaOptions o;
  o.expert_cache = expert_cache;
  o.exact = exact;
  o.adapt_every = 0;
  o.n_ctx = 64;
  o.n_batch = 16;
  return o;
}
inline EngineOptions small_engine_options(MatmulMode mode, cpu::AttnMath attn = cpu::AttnMath::GgmlF16) {
  EngineOptions opt;
  opt.n_ctx = 64;
  opt.n_batch = 16;
  opt.n_threads = 2;
  opt.mode = mode;
  opt.attn = attn;
  return opt;
}

// A 64-position model on `path` (fast mode, `cache` resident, adaptation off): one prefill of `prompt`
// (every position's logits kept; batches of 64, so the grouped experts and the GEMMs from 32 tokens) and
// `steps` greedy one-token decode steps. Returns every logit row in order ([prompt.size() + steps][n_vocab]).
// attn: the engine's attention arithmetic (F32 is what the CLI gives the CUDA backend in fast mode; only
// with it does one-token decode prepare q and k inside the attention kernel).
inline std::vector<float> prefill_then_decode(const std::string& path, const char* cache,
                                              const std::vector<int32_t>& prompt, int steps,
                                              cpu::AttnMath attn = cpu::AttnMath::GgmlF16) {
  cuda::CudaOptions o = small_cuda_options(cache, /*exact=*/false);
  o.n_batch = 64;
  std::shared_ptr<const Model> model = cuda::load_model_cuda(path, o);
  EngineOptions opt = small_engine_options(MatmulMode::Fast, attn);
  opt.n_batch = 64;
  Engine eng(model, opt);
  auto seq = eng.new_sequence();
  const size_t V = size_t(model->n_vocab());
  std::vector<float> all(prompt.size() * V);
  eng.prefill(*seq, prompt, all.data(), true);
  std::vector<float> last(all.end() - std::ptrdiff_t(V), all.end());
  for (int i = 0; i < steps; ++i) {
    const int32_t t = argmax(last.data(), V);
    SequenceState* s = seq.get();
    eng.decode({&s, 1}, {&t, 1}, last.data());
    all.insert(all.end(), last.begin(), last.end());
  }
  return all;
}

// Gated CPU-pool passes (docs/gpu.md) run the same kernels in the same order as the passes they replace,
// so they give the same bits: decode of one sequence (`one` steps) and of two in one batch (`two`) of the
// model at `path`, at 0%, 25% and 50% of the experts resident, fast and exact; every decode pass gated
// with them on, none with them off; the routing reaches the host the same way. (With adaptation the
// residency changes when a copy is done, which depends on timing: the models' ExpertCacheSizesAgree cover
// gated passes with adaptation every pass against the CPU's tokens.)
inline void expect_gated_passes_give_the_same_bits(const std::string& path, const Slg& ref, int one, int two,
                                                   const char* label) {
  struct Case {
    const char* cache;
    bool exact;
  };
  for (const Case c : {Case{"0%", false}, Case{"25%", false}, Case{"50%", true}}) {
    SCOPED_TRACE(std::string("expert cache ") + c.cache + (c.exact ? " exact" : " fast"));
    auto run = [&](bool gated, ExpertCacheReport& rep) {
      cuda::CudaOptions o = small_cuda_options(c.cache, c.exact);
      o.gated_passes = gated;
      return decode_one_then_two(cuda::load_model_cuda(path, o),
                                 small_engine_options(c.exact ? MatmulMode::Exact : MatmulMode::Fast), ref, one, two,
                                 &rep);
    };
    ExpertCacheReport r_on, r_off;
    const std::vector<float> on = run(true, r_on), off = run(false, r_off);
    ASSERT_EQ(on.size(), off.size());
    const size_t n_diff = bit_differences(on, off);
    std::printf("[ %s gated ] %s resident%s: %zu of %zu logits differ; gated %lld of %lld passes (%lld captures), "
                "not gated %lld; host per pass %.0f us gated, %.0f us not\n",
                label, c.cache, c.exact ? " exact" : "", n_diff, on.size(), (long long)r_on.gated_forwards,
                (long long)r_on.forwards, (long long)r_on.graph_captures, (long long)r_off.gated_forwards,
                1e6 * r_on.host_s / double(r_on.forwards), 1e6 * r_off.host_s / double(r_off.forwards));
    EXPECT_EQ(n_diff, 0u);
    EXPECT_EQ(r_on.forwards, one + two);
    EXPECT_EQ(r_on.gated_forwards, one + two);
    EXPECT_EQ(r_off.gated_forwards, 0);
    EXPECT_EQ(r_on.hits, r_off.hits);
    EXPECT_EQ(r_on.misses, r_off.misses);
    EXPECT_EQ(r_on.direct, r_off.direct);  // direct reads (the default share) in both, none in the exact mode
    if (c.exact)
      EXPECT_EQ(r_on.direct, 0);
    else
      EXPECT_GT(r_on.direct, 0);
    EXPECT_GT(r_on.misses, 0);
    EXPECT_EQ(r_on.bytes_d2h, r_off.bytes_d2h);
  }
}

}  // namespace strata::test
