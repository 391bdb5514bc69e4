// The CUDA qwen3next backend (issue 10's GPU path) vs the llama.cpp-made references of every
// tiny-qwen3next fixture, with the rules of the CPU test (tests/test_qwen3next.cpp):
//   exact GPU mode vs *.f32ref.slg: mean KL <= 1e-5, top-1 100%, 24-token greedy continuation identical;
//   fast GPU mode vs *.f32ref.slg: mean KL <= 1.5x llama.cpp's own KL (fixture README table), for whole-
//   prompt passes and for decode-sized ones (token by token and chunks of 7: int8-activation products,
//   q8 MoE for the routed and the shared expert, fused GDN ops) at 100/25/0% of the experts resident;
//   expert cache at 0%, 25%, 100% of the experts (and 25% adapting every step), exact: greedy tokens
//   identical to each other, to the reference and to the CPU exact path;
//   prefill in one batch, in chunks of 7 and token by token: the same exact-mode logits at every position;
//   two sequences in one decode batch = each alone (the recurrent state is per sequence); a sequence reset
//   and reused gives what a new one gives (the device state is zeroed); the legacy fused ssm_in (exact) and
//   an MTP block (loaded, not run) give the logits of the plain file; a bad file is a clear error; decode
//   passes replayed as CUDA graphs give the logits of direct launches; a prefill that streams non-resident
//   experts into staging slots stays within the fast bound.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "../slg.h"
#include "decode_test_util.h"
#include "common/error.h"
#include "cuda/backend.h"
#include "cuda/device.h"
#include "cuda/graph.h"
#include "engine/engine.h"
#include "gguf/writer.h"
#include "quant/dequant.h"

using namespace strata;
using namespace strata::test;

namespace {

const std::string kModels = std::string(STRATA_FIXTURES_DIR) + "/models/";
const std::string kBase = kModels + "tiny-qwen3next-N-";

// llama.cpp's own quantized kernels vs exact math, mean KL (fixtures README).
const std::map<std::string, double> kLlamaKl = {{"Q4_K_M", 7.44e-02}, {"IQ2_XS", 1.80e-01}};

struct Result {
  std::vector<float> logits;  // [n_prompt][n_vocab]
  double mean_kl = 0, max_kl = 0;
  std::vector<double> kl;  // [n_prompt] each position's KL
  int top1 = 0;
  std::vector<int32_t> gen;
  ExpertCacheReport prefill, decode;  // expert-cache statistics of each phase
};

// Prefill the reference prompt (all logits) in batches of n_batch, then n_gen greedy tokens, on `model`.
Result evaluate(std::shared_ptr<const Model> model, const Slg& ref, MatmulMode mode, int n_batch = 512,
                int n_gen = -1) {
  EXPECT_EQ(uint32_t(model->n_vocab()), ref.n_vocab);
  if (n_gen < 0) n_gen = int(ref.n_gen);
  EngineOptions opt;
  opt.n_ctx = 128;
  opt.n_batch = n_batch;
  opt.n_threads = 2;
  opt.mode = mode;
  Engine eng(model, opt);
  auto seq = eng.new_sequence();
  const size_t V = ref.n_vocab;
  Result r;
  r.logits.resize(ref.n_prompt * V);
  model->reset_cache_stats();
  eng.prefill(*seq, ref.prompt, r.logits.data(), true);
  r.prefill = model->cache_report();
  for (uint32_t p = 0; p < ref.n_prompt; ++p) {
    const double kl = kl_div(&ref.logits[p * V], &r.logits[p * V], V);
    r.mean_kl += kl / ref.n_prompt;
    r.max_kl = std::max(r.max_kl, kl);
    r.kl.push_back(kl);
    r.top1 += argmax(&ref.logits[p * V], V) == argmax(&r.logits[p * V], V);
  }
  model->reset_cache_stats();
  std::vector<float> last(r.logits.end() - std::ptrdiff_t(V), r.logits.end());
  for (int i = 0; i < n_gen; ++i) {
    const int32_t t = argmax(last.data(), V);
    r.gen.push_back(t);
    SequenceState* s = seq.get();
    eng.decode({&s, 1}, {&t, 1}, last.data());
  }
  r.decode = model->cache_report();
  return r;
}

std::shared_ptr<const Model> load_gpu(const std::string& path, bool exact, const std::string& cache, int adapt_every) {
  cuda::CudaOptions o;
  o.exact = exact;
  o.expert_cache = cache;
  o.adapt_every = adapt_every;
  o.n_ctx = 128;
  o.n_batch = 512;
  return cuda::load_model_cuda(path, o);
}

std::string gen_str(const std::vector<int32_t>& g) {
  std::string s;
  for (int32_t t : g) s += std::to_string(t) + " ";
  return s;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

bool have_gpu() { return cuda::device_count() > 0; }

class Qwen3NextGpu : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  }
};

TEST_P(Qwen3NextGpu, ExactMatchesF32Reference) {
  const Slg ref = read_slg(kBase + GetParam() + ".f32ref.slg");
  auto model = load_gpu(kBase + GetParam() + ".gguf", true, "100%", 0);
  EXPECT_EQ(model->backend_name(), "cuda:0");
  const Result r = evaluate(model, ref, MatmulMode::Exact);
  std::printf("[ gpu qwen3next exact %-6s ] mean KL %.3e, max KL %.3e, top-1 %d/%u, decode hit rate %.3f\n",
              GetParam().c_str(), r.mean_kl, r.max_kl, r.top1, ref.n_prompt, r.decode.hit_rate());
  EXPECT_LE(r.mean_kl, 1e-5);
  EXPECT_EQ(r.top1, int(ref.n_prompt));
  EXPECT_EQ(r.gen, ref.gen) << "gpu: " << gen_str(r.gen) << "\nref: " << gen_str(ref.gen);
}

TEST_P(Qwen3NextGpu, FastWithinLlamaCppKl) {
  const Slg ref = read_slg(kBase + GetParam() + ".f32ref.slg");
  const double bound = 1.5 * kLlamaKl.at(GetParam());
  // Prefill in one batch (the cuBLAS and grouped-MoE paths from 32 tokens) and in chunks of 7 (the
  // decode kernels).
  for (int nb : {512, 7}) {
    auto model = load_gpu(kBase + GetParam() + ".gguf", false, "100%", 0);
    const Result r = evaluate(model, ref, MatmulMode::Fast, nb, 0);
    std::printf("[ gpu qwen3next fast %-6s batch %3d ] mean KL %.3e (bound %.3e = 1.5x llama.cpp), top-1 %d/%u\n",
                GetParam().c_str(), nb, r.mean_kl, bound, r.top1, ref.n_prompt);
    EXPECT_LE(r.mean_kl, bound) << "batch " << nb;
  }
}

// The fast mode's decode path on KL-checked logits: the prompt token by token (one-token passes: the
// stacked projections in one product each, CUDA graphs when every expert is resident) and in chunks of 7
// (one product per part), so every pass is decode-sized (< 32 tokens: int8-activation products, the
// routed and the shared expert through the q8 MoE kernels where the types have them, the fused GDN
// launches), with every expert resident, a quarter of them (the CPU pool's partial added after the GPU's
// adds into x) and none. Same bound as the whole-prompt fast test: 1.5x llama.cpp's own KL.
TEST_P(Qwen3NextGpu, FastDecodeSizedPassesWithinLlamaCppKl) {
  const Slg ref = read_slg(kBase + GetParam() + ".f32ref.slg");
  const double bound = 1.5 * kLlamaKl.at(GetParam());
  for (const char* cache : {"100%", "25%", "0%"}) {
    for (int nb : {1, 7}) {
      auto model = load_gpu(kBase + GetParam() + ".gguf", false, cache, 0);
      const Result r = evaluate(model, ref, MatmulMode::Fast, nb, 0);
      std::printf("[ gpu qwen3next fast decode-sized %-6s %4s batch %d ] mean KL %.3e (bound %.3e), max KL %.3e, "
                  "top-1 %d/%u, graphs %lld/%lld forwards, %.1f op calls per forward\n",
                  GetParam().c_str(), cache, nb, r.mean_kl, bound, r.max_kl, r.top1, ref.n_prompt,
                  (long long)r.prefill.graph_forwards, (long long)r.prefill.forwards,
                  r.prefill.forwards ? double(r.prefill.op_calls) / double(r.prefill.forwards) : 0.0);
      std::printf("  %s\n", kl_shape(r.kl).str().c_str());
      SCOPED_TRACE(std::string("expert cache ") + cache + ", batch " + std::to_string(nb));
      EXPECT_LE(r.mean_kl, bound);
      EXPECT_EQ(r.prefill.forwards, (int64_t(ref.n_prompt) + nb - 1) / nb);
    }
  }
}

// The same sequence at several expert-cache sizes (exact mode): the CPU pool and the slots must give the
// same tokens as the CPU engine and as each other.
TEST_P(Qwen3NextGpu, ExpertCacheSizesAgree) {
  const Slg ref = read_slg(kBase + GetParam() + ".f32ref.slg");
  const Result cpu = evaluate(load_model(kBase + GetParam() + ".gguf"), ref, MatmulMode::Exact);
  EXPECT_EQ(cpu.gen, ref.gen) << "cpu: " << gen_str(cpu.gen) << "\nref: " << gen_str(ref.gen);
  struct Config {
    const char* cache;
    int adapt_every;
  };
  for (const Config c : {Config{"0%", 0}, Config{"25%", 0}, Config{"100%", 0}, Config{"25%", 1}}) {
    auto model = load_gpu(kBase + GetParam() + ".gguf", true, c.cache, c.adapt_every);
    const Result r = evaluate(model, ref, MatmulMode::Exact);
    const ExpertCacheReport& d = r.decode;
    std::printf("[ gpu qwen3next cache %-6s %4s adapt %d ] mean KL %.3e, top-1 %d/%u, max |logit - cpu| %.3e, "
                "slots %d/%d, prefill hit %.3f, decode hit %.3f (%lld/%lld), swaps %lld, h2d %.1f KiB d2h %.1f KiB\n",
                GetParam().c_str(), c.cache, c.adapt_every, r.mean_kl, r.top1, ref.n_prompt,
                max_abs_diff(r.logits, cpu.logits), d.slots_used, d.n_slots, r.prefill.hit_rate(), d.hit_rate(),
                (long long)d.hits, (long long)(d.hits + d.misses), (long long)(r.prefill.swaps + d.swaps),
                d.bytes_h2d / 1024.0, d.bytes_d2h / 1024.0);
    SCOPED_TRACE(std::string("expert cache ") + c.cache + (c.adapt_every ? " adapting" : ""));
    EXPECT_LE(r.mean_kl, 1e-5);
    EXPECT_EQ(r.top1, int(ref.n_prompt));
    EXPECT_EQ(r.gen, cpu.gen) << "gpu: " << gen_str(r.gen) << "\ncpu: " << gen_str(cpu.gen);
    EXPECT_EQ(r.gen, ref.gen) << "gpu: " << gen_str(r.gen) << "\nref: " << gen_str(ref.gen);
    ASSERT_TRUE(d.present);
    const int n_layer = model->hparams().n_layer, n_expert = model->hparams().n_expert;
    EXPECT_EQ(d.n_experts_total, n_layer * n_expert);
    EXPECT_EQ(d.hits + d.misses, int64_t(ref.n_gen) * n_layer * model->hparams().n_expert_used);
    const std::string cache = c.cache;
    if (cache == "100%") {
      EXPECT_EQ(d.n_slots, d.n_experts_total);
      EXPECT_EQ(d.misses, 0);
      EXPECT_DOUBLE_EQ(r.prefill.hit_rate(), 1.0);
    } else if (cache == "0%") {
      EXPECT_EQ(d.n_slots, 0);
      EXPECT_EQ(d.hits, 0);
    } else {
      EXPECT_GT(d.hits, 0);
      EXPECT_GT(d.misses, 0);
    }
    if (c.adapt_every > 0) {
      EXPECT_GT(r.prefill.swaps + d.swaps, 0) << "adaptation every step never swapped";
    }
  }
}

// One batch, chunks of 7 and token by token (the delta rule over each pass's run of tokens, the state
// carried across passes on the device) give the same exact-mode logits at every position; with all
// experts resident and with a quarter (the CPU pool in every pass).
TEST_P(Qwen3NextGpu, PrefillSplitsAgree) {
  const Slg ref = read_slg(kBase + GetParam() + ".f32ref.slg");
  const size_t V = ref.n_vocab;
  for (const char* cache : {"100%", "25%"}) {
    auto model = load_gpu(kBase + GetParam() + ".gguf", true, cache, 0);
    const Result one = evaluate(model, ref, MatmulMode::Exact, 512, 0);
    for (int nb : {7, 1}) {
      const Result split = evaluate(model, ref, MatmulMode::Exact, nb, 0);
      const double diff = max_abs_diff(split.logits, one.logits);
      int same_top1 = 0;
      for (size_t p = 0; p < ref.n_prompt; ++p)
        same_top1 += argmax(&split.logits[p * V], V) == argmax(&one.logits[p * V], V);
      std::printf("[ gpu qwen3next prefill %-6s cache %4s, batch %d vs one batch ] max |logit diff| %.3e, "
                  "same top-1 %d/%u, mean KL vs ref %.3e\n",
                  GetParam().c_str(), cache, nb, diff, same_top1, ref.n_prompt, split.mean_kl);
      EXPECT_EQ(same_top1, int(ref.n_prompt)) << "cache " << cache << " batch " << nb;
      EXPECT_LE(diff, 1e-3) << "cache " << cache << " batch " << nb;
      EXPECT_LE(split.mean_kl, 1e-5) << "cache " << cache << " batch " << nb;
    }
  }
}

// Prefill streaming (as Qwen3MoeGpuStreaming.StreamedPrefillWithinLlamaCppKl): the prompt in one 48-token
// pass at 0% and 25% resident, fast mode. With staging slots (auto) the non-resident experts with enough
// pairs are copied to the GPU and run there: within the fixture KL bound, experts were streamed, and the
// mean KL is no higher than without streaming (the streamed pairs leave the CPU pool's Q8_K activations
// for the GPU's f32-activation kernels; first H200 run: Q4_K_M 1.13e-2 streamed vs 3.55e-2 / 2.45e-2 at
// 0% / 25%); with stream_slots 0 nothing is streamed. Exact mode's streamed prefill is covered by
// ExpertCacheSizesAgree (tokens identical to the CPU's).
TEST_P(Qwen3NextGpu, StreamedPrefillMatches) {
  const Slg ref = read_slg(kBase + GetParam() + ".f32ref.slg");
  const double bound = 1.5 * kLlamaKl.at(GetParam());
  for (const char* cache : {"0%", "25%"}) {
    Result runs[2];
    for (const int stream_slots : {-1, 0}) {
      cuda::CudaOptions o;
      o.expert_cache = cache;
      o.adapt_every = 0;
      o.n_ctx = 128;
      o.n_batch = 512;
      o.stream_slots = stream_slots;
      std::shared_ptr<const Model> model = cuda::load_model_cuda(kBase + GetParam() + ".gguf", o);
      const Result r = evaluate(model, ref, MatmulMode::Fast, 512, 4);
      std::printf("[ gpu qwen3next streaming %-6s %3s slots %2d ] mean KL %.3e (bound %.3e), top-1 %d/%u, prefill "
                  "streamed %lld, hits %lld, misses %lld\n",
                  GetParam().c_str(), cache, stream_slots, r.mean_kl, bound, r.top1, ref.n_prompt,
                  (long long)r.prefill.streamed, (long long)r.prefill.hits, (long long)r.prefill.misses);
      SCOPED_TRACE(std::string(cache) + " stream slots " + std::to_string(stream_slots));
      EXPECT_LE(r.mean_kl, bound);
      if (stream_slots == 0)
        EXPECT_EQ(r.prefill.streamed, 0);
      else
        EXPECT_GT(r.prefill.streamed, 0);
      EXPECT_EQ(r.decode.streamed, 0);  // one-token passes do not stream (qwen3next: no decode streaming)
      runs[stream_slots == 0] = r;
    }
    EXPECT_LE(runs[0].mean_kl, runs[1].mean_kl) << cache << ": streamed vs unstreamed mean KL";
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Qwen3NextGpu, ::testing::Values("Q4_K_M", "IQ2_XS"));

// Two sequences decoded in one batch give what each gives alone (each token's GDN run reads and writes
// its own sequence's device state, its attention its own KV); a sequence reset and reused gives what a
// fresh one gives (its device state is zeroed at position 0).
TEST(Qwen3NextGpuState, SequencesAreIndependentAndResetClearsState) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  const Slg ref = read_slg(kBase + "Q4_K_M.f32ref.slg");
  auto model = load_gpu(kBase + "Q4_K_M.gguf", true, "25%", 0);
  EngineOptions o;
  o.n_ctx = 64;
  o.n_batch = 16;
  o.n_threads = 2;
  o.mode = MatmulMode::Exact;
  Engine e(model, o);
  const size_t V = ref.n_vocab;
  const std::vector<int32_t> pa(ref.prompt.begin(), ref.prompt.begin() + 20);
  const std::vector<int32_t> pb(ref.prompt.begin() + 20, ref.prompt.begin() + 31);
  auto a = e.new_sequence(), b = e.new_sequence(), a1 = e.new_sequence(), b1 = e.new_sequence();
  std::vector<float> la(V), lb(V), both(2 * V);
  e.prefill(*a, pa, la.data());
  e.prefill(*b, pb, lb.data());
  e.prefill(*a1, pa, nullptr);
  e.prefill(*b1, pb, nullptr);
  double max_diff = 0;
  for (int step = 0; step < 4; ++step) {
    const int32_t ta = argmax(la.data(), V), tb = argmax(lb.data(), V);
    SequenceState* sa[1] = {a1.get()};
    SequenceState* sb[1] = {b1.get()};
    e.decode(sa, std::span<const int32_t>(&ta, 1), la.data());
    e.decode(sb, std::span<const int32_t>(&tb, 1), lb.data());
    SequenceState* ab[2] = {a.get(), b.get()};
    const int32_t tt[2] = {ta, tb};
    e.decode(ab, tt, both.data());
    for (size_t i = 0; i < V; ++i) {
      max_diff = std::max(max_diff, double(std::fabs(both[i] - la[i])));
      max_diff = std::max(max_diff, double(std::fabs(both[V + i] - lb[i])));
    }
  }
  std::printf("[ gpu qwen3next batch ] two sequences in one decode vs alone: max |logit diff| %.3e\n", max_diff);
  EXPECT_LE(max_diff, 1e-4);
  // The GDN layers hold device state: the sequence says so (the server then never rewinds it).
  EXPECT_THROW(a->truncate(3), Error);
  // Reset a (it holds 24 tokens of state) and prefill pb into it: the logits of b's first prefill.
  std::vector<float> again(V), fresh(V);
  a->truncate(0);
  e.prefill(*a, pb, again.data());
  auto c = e.new_sequence();
  e.prefill(*c, pb, fresh.data());
  double reset_diff = 0;
  for (size_t i = 0; i < V; ++i) reset_diff = std::max(reset_diff, double(std::fabs(again[i] - fresh[i])));
  std::printf("[ gpu qwen3next reset ] reused sequence vs fresh: max |logit diff| %.3e\n", reset_diff);
  EXPECT_LE(reset_diff, 1e-5);
  EXPECT_GT(a->memory_bytes(), 0u);
}

// CUDA graphs: a model that replays decode passes as graphs and one that launches every kernel give
// bit-identical logits over 4 decode steps of one sequence, then 3 steps of two sequences in one batch,
// with both attention kernels; the graph model replayed every decode pass and captured once per batch
// shape and set of sequences (n = 1 for sequence a, n = 2 for a and b: 2 captures).
TEST(Qwen3NextGpuGraphs, GraphsOnAndOffGiveIdenticalLogits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  if (!cuda::graphs_enabled_by_env()) GTEST_SKIP() << "STRATA_CUDA_GRAPHS=0 in the environment";
  const Slg ref = read_slg(kBase + "Q4_K_M.f32ref.slg");
  for (const cpu::AttnMath attn : {cpu::AttnMath::GgmlF16, cpu::AttnMath::F32}) {
    auto run = [&](bool graphs, ExpertCacheReport& rep) {
      cuda::CudaOptions o = small_cuda_options("100%", false);
      o.cuda_graphs = graphs;
      return decode_one_then_two(cuda::load_model_cuda(kBase + "Q4_K_M.gguf", o),
                                 small_engine_options(MatmulMode::Fast, attn), ref, 4, 3, &rep);
    };
    ExpertCacheReport r_on, r_off;
    const std::vector<float> on = run(true, r_on), off = run(false, r_off);
    ASSERT_EQ(on.size(), off.size());
    const size_t n_diff = bit_differences(on, off);
    double max_diff = 0;
    for (size_t i = 0; i < on.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(on[i] - off[i])));
    std::printf("[ gpu qwen3next graphs ] attn %s: %zu of %zu logits differ (max |diff| %.3e); graph on: %lld of "
                "%lld passes replayed, %lld captured, %.1f launcher calls/pass; off: %lld replayed, %.1f "
                "launcher calls/pass\n",
                attn == cpu::AttnMath::F32 ? "f32" : "ggml-f16", n_diff, on.size(), max_diff,
                (long long)r_on.graph_forwards, (long long)r_on.forwards, (long long)r_on.graph_captures,
                double(r_on.op_calls) / double(std::max<int64_t>(r_on.forwards, 1)), (long long)r_off.graph_forwards,
                double(r_off.op_calls) / double(std::max<int64_t>(r_off.forwards, 1)));
    EXPECT_EQ(n_diff, 0u);
    EXPECT_TRUE(r_on.graphs_enabled);
    EXPECT_FALSE(r_off.graphs_enabled);
    EXPECT_EQ(r_on.forwards, 7);
    EXPECT_EQ(r_on.graph_forwards, 7);
    EXPECT_EQ(r_on.graph_captures, 2);
    EXPECT_EQ(r_off.graph_forwards, 0);
    EXPECT_EQ(r_on.hits + r_on.misses, r_off.hits + r_off.misses);  // the routing reached the host
    EXPECT_EQ(r_on.misses, 0);
  }
}

// With the CPU pool (25% of the experts resident) no pass replays the whole-pass graph of compute_resident;
// every decode pass runs gated instead (one graph whose layers the host releases; docs/gpu.md).
TEST(Qwen3NextGpuGraphs, NoGraphWithTheCpuPool) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  if (!cuda::graphs_enabled_by_env()) GTEST_SKIP() << "STRATA_CUDA_GRAPHS=0 in the environment";
  const Slg ref = read_slg(kBase + "Q4_K_M.f32ref.slg");
  const Result r = evaluate(load_gpu(kBase + "Q4_K_M.gguf", false, "25%", 0), ref, MatmulMode::Fast, 64);
  std::printf("[ gpu qwen3next graphs ] 25%% resident decode: %lld of %lld passes replayed a graph, %lld gated, "
              "%lld pairs on the CPU pool\n",
              (long long)r.decode.graph_forwards, (long long)r.decode.forwards, (long long)r.decode.gated_forwards,
              (long long)r.decode.misses);
  EXPECT_GT(r.decode.forwards, 0);
  EXPECT_EQ(r.decode.graph_forwards, 0);
  EXPECT_EQ(r.decode.gated_forwards, r.decode.forwards);
  EXPECT_GT(r.decode.misses, 0);
}

// Gated CPU-pool passes give the bits of the direct ones (decode_test_util.h says what is run).
TEST(Qwen3NextGpuGraphs, GatedPassesGiveTheDirectPassesBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  if (!cuda::graphs_enabled_by_env()) GTEST_SKIP() << "STRATA_CUDA_GRAPHS=0 in the environment";
  expect_gated_passes_give_the_same_bits(kBase + "Q4_K_M.gguf", read_slg(kBase + "Q4_K_M.f32ref.slg"), 5, 3,
                                         "qwen3next");
}

// ---- files derived from the fixture with the GGUF writer ----

// The fixture with one MTP block appended (its projections and a copy of layer 3's tensors), as in
// tests/test_qwen3next.cpp.
std::string write_with_mtp() {
  const gguf::File src = gguf::File::open(kBase + "Q4_K_M.gguf");
  gguf::Writer w;
  for (const auto& kv : src.metadata())
    if (kv.key != "general.alignment") w.set_value(kv.key, kv.value);
  w.set_value("qwen3next.block_count", gguf::make_value<uint32_t>(5));
  w.set_value("qwen3next.nextn_predict_layers", gguf::make_value<uint32_t>(1));
  for (const auto& t : src.tensors())
    w.add_tensor_view(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims), t.data, t.nbytes);
  const uint64_t E = 256;
  std::vector<std::vector<float>> keep;
  keep.reserve(4);
  auto add_f32 = [&](const std::string& n, std::vector<uint64_t> dims, float val) {
    uint64_t cnt = 1;
    for (auto d : dims) cnt *= d;
    keep.emplace_back(cnt, val);
    w.add_tensor_view(n, GgmlType::F32, dims, reinterpret_cast<const uint8_t*>(keep.back().data()), cnt * 4);
  };
  add_f32("blk.4.nextn.eh_proj.weight", {2 * E, E}, 0.01f);
  add_f32("blk.4.nextn.enorm.weight", {E}, 1.0f);
  add_f32("blk.4.nextn.hnorm.weight", {E}, 1.0f);
  for (const auto& t : src.tensors()) {
    if (t.name.rfind("blk.3.", 0) != 0) continue;
    w.add_tensor_view("blk.4." + t.name.substr(6), t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims), t.data,
                      t.nbytes);
  }
  const std::string path = (std::filesystem::temp_directory_path() / "strata_q3n_gpu_mtp.gguf").string();
  w.write(path);
  return path;
}

// The fixture with each GDN layer's attn_qkv + attn_gate re-packed as the legacy fused ssm_in (f32, rows
// grouped per key head), as in tests/test_qwen3next.cpp.
std::string write_legacy_ssm_in() {
  const gguf::File src = gguf::File::open(kBase + "Q4_K_M.gguf");
  const int64_t E = 256, D = 64, Hk = 2, Hv = 4, r = Hv / Hk, Kd = Hk * D, Vd = Hv * D;
  gguf::Writer w;
  for (const auto& kv : src.metadata())
    if (kv.key != "general.alignment") w.set_value(kv.key, kv.value);
  auto dequant_rows = [&](const gguf::TensorInfo& t) {
    std::vector<float> out(t.n_elements());
    const uint64_t rb = t.nbytes / t.n_rows();
    for (uint64_t i = 0; i < t.n_rows(); ++i)
      dequantize_row(t.type, t.data + i * rb, out.data() + i * t.ne[0], int64_t(t.ne[0]));
    return out;
  };
  std::vector<std::vector<float>> keep;
  keep.reserve(8);
  for (const auto& t : src.tensors()) {
    const bool qkv = t.name.find(".attn_qkv.") != std::string::npos;
    if (t.name.find(".attn_gate.") != std::string::npos) continue;
    if (!qkv) {
      w.add_tensor_view(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims), t.data, t.nbytes);
      continue;
    }
    const std::string p = t.name.substr(0, t.name.find("attn_qkv"));
    const std::vector<float> a = dequant_rows(t), z = dequant_rows(src.tensor(p + "attn_gate.weight"));
    std::vector<float>& m = keep.emplace_back();
    auto rows = [&](const std::vector<float>& from, int64_t r0, int64_t n) {
      m.insert(m.end(), from.begin() + r0 * E, from.begin() + (r0 + n) * E);
    };
    for (int64_t j = 0; j < Hk; ++j) {
      rows(a, j * D, D);                   // q_j
      rows(a, Kd + j * D, D);              // k_j
      rows(a, 2 * Kd + j * r * D, r * D);  // v of heads j*r..
      rows(z, j * r * D, r * D);           // z of heads j*r..
    }
    w.add_tensor_view(p + "ssm_in.weight", GgmlType::F32, {uint64_t(E), uint64_t(2 * Kd + 2 * Vd)},
                      reinterpret_cast<const uint8_t*>(m.data()), m.size() * 4);
  }
  const std::string path = (std::filesystem::temp_directory_path() / "strata_q3n_gpu_legacy.gguf").string();
  w.write(path);
  return path;
}

TEST(Qwen3NextGpuFiles, MtpBlockLoadsAndLeavesTheDecoderAlone) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  const Slg ref = read_slg(kBase + "Q4_K_M.f32ref.slg");
  const std::string path = write_with_mtp();
  const Result a = evaluate(load_gpu(path, true, "50%", 0), ref, MatmulMode::Exact, 16, 4);
  const Result b = evaluate(load_gpu(kBase + "Q4_K_M.gguf", true, "50%", 0), ref, MatmulMode::Exact, 16, 4);
  std::filesystem::remove(path);
  const double diff = max_abs_diff(a.logits, b.logits);
  std::printf("[ gpu qwen3next mtp ] with vs without the MTP block: max |logit diff| %.3e\n", diff);
  EXPECT_LE(diff, 1e-6);
  EXPECT_EQ(a.gen, b.gen);
}

TEST(Qwen3NextGpuFiles, LegacySsmInEqualsAttnQkv) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  const Slg ref = read_slg(kBase + "Q4_K_M.f32ref.slg");
  const std::string path = write_legacy_ssm_in();
  // exact mode: the GPU gets the same f32 values either way, the rows permuted at load
  const Result a = evaluate(load_gpu(path, true, "100%", 0), ref, MatmulMode::Exact, 16, 0);
  const Result b = evaluate(load_gpu(kBase + "Q4_K_M.gguf", true, "100%", 0), ref, MatmulMode::Exact, 16, 0);
  const double diff = max_abs_diff(a.logits, b.logits);
  std::printf("[ gpu qwen3next legacy ssm_in ] vs attn_qkv: max |logit diff| %.3e\n", diff);
  EXPECT_LE(diff, 1e-4);
  std::filesystem::remove(path);
}

TEST(Qwen3NextGpuFiles, BadFileIsAClearError) {
  // Checked before any GPU work: the same message as the CPU model, with or without a GPU.
  const gguf::File src = gguf::File::open(kBase + "Q4_K_M.gguf");
  gguf::Writer w;
  for (const auto& kv : src.metadata())
    if (kv.key != "general.alignment") w.set_value(kv.key, kv.value);
  for (const auto& t : src.tensors())
    if (t.name != "blk.1.ssm_a")
      w.add_tensor_view(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims), t.data, t.nbytes);
  const std::string path = (std::filesystem::temp_directory_path() / "strata_q3n_gpu_no_ssm_a.gguf").string();
  w.write(path);
  try {
    load_gpu(path, true, "100%", 0);
    ADD_FAILURE() << "loaded without error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("blk.1.ssm_a"), std::string::npos) << msg;
    EXPECT_NE(msg.find("layer 1 is a Gated DeltaNet layer"), std::string::npos) << msg;
  }
  std::filesystem::remove(path);
}

}  // namespace
