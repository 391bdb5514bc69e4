// The CUDA qwen3moe backend vs the llama.cpp-made references of every tiny-qwen3moe fixture (issue 7),
// with the same rules as the CPU test (tests/test_qwen3moe_fixtures.cpp):
//   exact GPU mode vs *.f32ref.slg: mean KL <= 1e-5, top-1 100%, 24-token greedy continuation identical;
//   fast GPU mode vs *.f32ref.slg: mean KL <= 1.5x llama.cpp's own KL (fixture README table);
//   expert cache at 0%, 25%, 50%, 100% of the experts and at 25% with adaptation every step (exact):
//   greedy tokens identical to each other, to the reference and to the CPU exact path; logits within
//   the exact KL bound; hit rate 1 at 100%, 0 at 0%; adaptation swaps experts.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "../slg.h"
#include "decode_test_util.h"
#include "cuda/backend.h"
#include "cuda/device.h"
#include "cuda/graph.h"
#include "cuda/q8_kernels.cuh"
#include "engine/engine.h"
#include "engine/sampling.h"

using namespace strata;
using namespace strata::test;

namespace {

const std::string kModels = std::string(STRATA_FIXTURES_DIR) + "/models/";

// llama.cpp's own quantized kernels vs exact math, mean KL (fixtures README).
const std::map<std::string, double> kLlamaKl = {
    {"Q8_0", 3.49e-03},   {"Q4_K_M", 5.86e-03}, {"Q6_K", 3.22e-02}, {"Q2_K", 4.93e-03},
    {"IQ4_XS", 5.02e-03}, {"IQ2_XS", 1.16e-02}, {"IQ3_S", 8.21e-03}, {"IQ1_M", 9.52e-03}};

struct Result {
  double mean_kl = 0, max_kl = 0;  // over the prompt's positions
  std::vector<double> kl;          // [n_prompt] each position's KL
  int top1 = 0;
  std::vector<int32_t> gen;
  ExpertCacheReport prefill, decode;  // expert-cache statistics of each phase
};

// Prefill the reference prompt (all logits), then 24 greedy tokens, on `model`.
Result evaluate(std::shared_ptr<const Model> model, const Slg& ref, MatmulMode mode, int n_batch = 512) {
  EXPECT_EQ(uint32_t(model->n_vocab()), ref.n_vocab);
  EngineOptions opt;
  opt.n_ctx = 128;
  opt.n_batch = n_batch;
  opt.n_threads = 2;
  opt.mode = mode;
  Engine eng(model, opt);
  auto seq = eng.new_sequence();
  const size_t V = ref.n_vocab;
  std::vector<float> logits(ref.n_prompt * V);
  model->reset_cache_stats();
  eng.prefill(*seq, ref.prompt, logits.data(), true);
  Result r;
  r.prefill = model->cache_report();
  for (uint32_t p = 0; p < ref.n_prompt; ++p) {
    const double kl = kl_div(&ref.logits[p * V], &logits[p * V], V);
    r.mean_kl += kl;
    r.max_kl = std::max(r.max_kl, kl);
    r.kl.push_back(kl);
    r.top1 += argmax(&ref.logits[p * V], V) == argmax(&logits[p * V], V);
  }
  r.mean_kl /= ref.n_prompt;
  model->reset_cache_stats();
  std::vector<float> last(logits.end() - std::ptrdiff_t(V), logits.end());
  for (uint32_t i = 0; i < ref.n_gen; ++i) {
    const int32_t t = argmax(last.data(), V);
    r.gen.push_back(t);
    SequenceState* s = seq.get();
    eng.decode({&s, 1}, {&t, 1}, last.data());
  }
  r.decode = model->cache_report();
  return r;
}

std::shared_ptr<const Model> load_gpu(const std::string& type, bool exact, const std::string& cache,
                                      int adapt_every) {
  cuda::CudaOptions o;
  o.exact = exact;
  o.expert_cache = cache;
  o.adapt_every = adapt_every;
  o.n_ctx = 128;
  o.n_batch = 512;
  return cuda::load_model_cuda(kModels + "tiny-qwen3moe-A-" + type + ".gguf", o);
}

std::string gen_str(const std::vector<int32_t>& g) {
  std::string s;
  for (int32_t t : g) s += std::to_string(t) + " ";
  return s;
}

// The decode-path KL criteria of the fast tests below (one-token and 7-token passes), against llama.cpp's own
// kernels on the same fixtures.
//
// Why not each case's mean against 1.5x llama.cpp's mean on its own: the mean over 48 positions is decided by
// routing flips. When a perturbation (any: int8 or Q8_K activations, f16 KV) moves a layer's top-k at one
// position, that position's KL is ~0.1-0.5 and carries most of the mean (IQ3_S at 25% resident: one position
// of 0.48 of a 1.1e-2 mean, the median 3e-4). Which cases flip changes with every rounding detail: the
// f32-activation path failed Q2_K at 0% (1.02x) where the int8 path failed IQ3_S at 25% (1.01x), both by one
// position (bench/results/2026-11-29-gpu-session4-h200.md); the low-bit int8 kernels put IQ4_XS's one-token
// mean at 2.4x its bound by 3 positions (81% of the sum) with its median at 0.6x llama.cpp's
// (bench/results/2026-12-05-gpu-session35-h100.md). llama.cpp's own logits flip as well (Q6_K: one position
// of KL 1.02, IQ2_XS and IQ1_M three each). So, with llama.cpp's per-position KL from the fixture
// (.logits.slg against .f32ref.slg):
//  - each case: median KL <= 1.5x llama.cpp's median (a broken format, kernel or cache size moves every
//    position, flips do not move the median);
//  - over the cases: the mean of KL / bound <= 1 (bound = 1.5x llama.cpp's mean KL: a systematic excess fails);
//  - over the cases: positions over 0.05 (flips) no more than llama.cpp's own on the same files.
class DecodeKlCriteria {
 public:
  explicit DecodeKlCriteria(std::string name) : name_(std::move(name)) {}

  void add(const std::string& type, const std::string& what, const Result& r) {
    const KlShape& l = llama(type);
    const KlShape s = kl_shape(r.kl);
    const double bound = 1.5 * kLlamaKl.at(type);
    std::printf("[ %s %-6s %s ] %s; bound %.3e (%.2fx), llama.cpp median %.2e, %d flips\n", name_.c_str(),
                type.c_str(), what.c_str(), s.str().c_str(), bound, s.mean / bound, l.median, l.big);
    std::fflush(stdout);
    EXPECT_LE(s.median, 1.5 * l.median) << name_ << " " << type << " " << what << ": median KL, llama.cpp's "
                                        << l.median;
    ratio_sum_ += s.mean / bound;
    ++cases_;
    flips_ += s.big;
    llama_flips_ += l.big;
  }

  // The totals over the cases added (call once, after the last add).
  void finish() {
    ASSERT_GT(cases_, 0);
    std::printf("[ %s, all ] %d cases: mean of KL / bound %.3f; positions > %.2f %d (llama.cpp's on the same "
                "files %d)\n", name_.c_str(), cases_, ratio_sum_ / cases_, kFlipKl, flips_, llama_flips_);
    EXPECT_LE(ratio_sum_ / cases_, 1.0) << name_;
    EXPECT_LE(flips_, llama_flips_) << name_ << ": flips";
  }

  // llama.cpp's per-position KL on type's fixture (its mean is the README's, kLlamaKl).
  static const KlShape& llama(const std::string& type) {
    static std::map<std::string, KlShape> cache;
    auto it = cache.find(type);
    if (it == cache.end()) {
      const std::string base = kModels + "tiny-qwen3moe-A-" + type;
      it = cache.emplace(type, kl_shape(position_kl(read_slg(base + ".f32ref.slg"), read_slg(base + ".logits.slg"))))
               .first;
    }
    return it->second;
  }

 private:
  std::string name_;
  double ratio_sum_ = 0;
  int cases_ = 0, flips_ = 0, llama_flips_ = 0;
};

class Qwen3MoeGpu : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  }
};

TEST_P(Qwen3MoeGpu, ExactMatchesF32Reference) {
  const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + GetParam() + ".f32ref.slg");
  auto model = load_gpu(GetParam(), true, "100%", 0);
  EXPECT_EQ(model->backend_name(), "cuda:0");
  const Result r = evaluate(model, ref, MatmulMode::Exact);
  std::printf("[ gpu exact %-6s ] mean KL %.3e, top-1 %d/%u, decode hit rate %.3f\n", GetParam().c_str(),
              r.mean_kl, r.top1, ref.n_prompt, r.decode.hit_rate());
  EXPECT_LE(r.mean_kl, 1e-5);
  EXPECT_EQ(r.top1, int(ref.n_prompt));
  EXPECT_EQ(r.gen, ref.gen) << "gpu: " << gen_str(r.gen) << "\nref: " << gen_str(ref.gen);
}

TEST_P(Qwen3MoeGpu, FastWithinLlamaCppKl) {
  const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + GetParam() + ".f32ref.slg");
  auto model = load_gpu(GetParam(), false, "100%", 0);
  const Result r = evaluate(model, ref, MatmulMode::Fast);
  const double bound = 1.5 * kLlamaKl.at(GetParam());
  std::printf("[ gpu fast  %-6s ] mean KL %.3e (bound %.3e = 1.5x llama.cpp), top-1 %d/%u\n", GetParam().c_str(),
              r.mean_kl, bound, r.top1, ref.n_prompt);
  EXPECT_LE(r.mean_kl, bound);
}

// The fast mode's decode path on KL-checked logits: the prompt in chunks of 7 tokens, so every pass is
// decode-sized (int8-activation products where the types have them, attn_prep, the stacked q|k|v product
// or three), with every expert resident (passes of <= 8 tokens replay CUDA graphs), with a quarter of them
// (the GPU experts add into x, then the CPU pool's partial) and with none, for every fixture format; the
// criteria of DecodeKlCriteria over the 24 cases.
TEST(Qwen3MoeGpuAll, FastDecodeSizedPassesWithinLlamaCppKl) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  DecodeKlCriteria kl("gpu fast chunked");
  for (const auto& [type, llama_kl] : kLlamaKl) {
    const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + type + ".f32ref.slg");
    for (const char* cache : {"100%", "25%", "0%"}) {
      const Result r = evaluate(load_gpu(type, false, cache, 0), ref, MatmulMode::Fast, 7);
      std::printf("[ gpu fast chunked %-6s %4s ] top-1 %d/%u, prefill graphs %lld/%lld\n", type.c_str(), cache,
                  r.top1, ref.n_prompt, (long long)r.prefill.graph_forwards, (long long)r.prefill.forwards);
      kl.add(type, std::string(cache) + " resident", r);
    }
  }
  kl.finish();
}

// The folded router (q8_kernels.cuh): one-token passes in the fast mode, every expert resident, so every
// pass takes wo_router and the routing gate_up; the prompt one token a pass. Each format with the fold and
// without it (set before loading: the fold is built at load); DecodeKlCriteria's criteria for each. The fold
// must change the logits (so it ran) of every format whose wo has an int8-activation kernel.
TEST(Qwen3MoeGpuAll, FastOneTokenPassesFoldedRouterWithinLlamaCppKl) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  DecodeKlCriteria crit[2] = {DecodeKlCriteria("gpu fast one-token not folded"),
                              DecodeKlCriteria("gpu fast one-token folded")};
  int changed = 0;
  for (const auto& [type, llama_kl] : kLlamaKl) {
    const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + type + ".f32ref.slg");
    double kl[2];
    for (int on = 0; on < 2; ++on) {
      cuda::q8::set_folded_router(on == 1);
      const Result r = evaluate(load_gpu(type, false, "100%", 0), ref, MatmulMode::Fast, 1);
      kl[on] = r.mean_kl;
      crit[on].add(type, "100% resident", r);
    }
    cuda::q8::set_folded_router(true);
    changed += kl[0] != kl[1];
  }
  crit[0].finish();
  crit[1].finish();
  std::printf("[ gpu fast one-token, all ] %d formats' logits changed by the fold\n", changed);
  EXPECT_GE(changed, 3) << "the fold changed too few formats' logits: did it run?";
}

// norm_matvec's early norm (q8_kernels.cuh norm_matvec_early, on by default): one-token passes with it on
// and off, every expert resident; with it on, DecodeKlCriteria's criteria. It must change the logits of at
// least one format (so it ran: it serves the formats whose q, k and v share a type with an int8-activation
// kernel).
TEST(Qwen3MoeGpuAll, FastOneTokenPassesEarlyNormWithinLlamaCppKl) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const bool was = cuda::q8::norm_matvec_early();
  DecodeKlCriteria crit("gpu fast one-token early norm");
  int changed = 0;
  for (const auto& [type, llama_kl] : kLlamaKl) {
    const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + type + ".f32ref.slg");
    double kl[2];
    for (int on = 0; on < 2; ++on) {
      cuda::q8::set_norm_matvec_early(on == 1);
      const Result r = evaluate(load_gpu(type, false, "100%", 0), ref, MatmulMode::Fast, 1);
      kl[on] = r.mean_kl;
      if (on) crit.add(type, "100% resident", r);
    }
    changed += kl[0] != kl[1];
  }
  cuda::q8::set_norm_matvec_early(was);
  crit.finish();
  std::printf("[ gpu fast one-token, all ] early norm: %d formats changed by it\n", changed);
  EXPECT_GE(changed, 1) << "the early norm changed no format's logits: did it run?";
}

// The low-bit formats' int8 kernels (Q2_K, Q3_K, IQ4_XS, IQ4_NL and the IQ2 / IQ3 / IQ1 formats;
// q8::set_low_bit, on by default): one-token passes with them on and off, every expert resident; with them on,
// DecodeKlCriteria's criteria, and also with the folded router off (which also takes gate_up's plain kernel
// instead of the routed one). They must change the logits of the Q2_K, IQ4_XS, IQ2_XS, IQ3_S and IQ1_M files
// (so they ran) and of no file without a low-bit tensor.
TEST(Qwen3MoeGpuAll, FastOneTokenPassesLowBitWithinLlamaCppKl) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const bool was = cuda::q8::low_bit_enabled(), fold_was = cuda::q8::folded_router_enabled();
  DecodeKlCriteria on_crit("gpu fast one-token low-bit"), nofold_crit("gpu fast one-token low-bit, no fold");
  for (const auto& [type, llama_kl] : kLlamaKl) {
    const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + type + ".f32ref.slg");
    double kl[2];
    for (int on = 0; on < 2; ++on) {
      cuda::q8::set_low_bit(on == 1);
      const Result r = evaluate(load_gpu(type, false, "100%", 0), ref, MatmulMode::Fast, 1);
      kl[on] = r.mean_kl;
      if (on) on_crit.add(type, "100% resident", r);
      else std::printf("[ gpu fast one-token f32 activations %-6s ] %s\n", type.c_str(), kl_shape(r.kl).str().c_str());
    }
    if (type == "Q2_K" || type == "IQ4_XS" || type == "IQ2_XS" || type == "IQ3_S" || type == "IQ1_M") {
      EXPECT_NE(kl[0], kl[1]) << type << ": did the low-bit kernels run?";
    }
    if (type == "Q8_0" || type == "Q6_K") {
      EXPECT_EQ(kl[0], kl[1]) << type << " has no low-bit tensor";
    }
    cuda::q8::set_low_bit(true);
    cuda::q8::set_folded_router(false);
    nofold_crit.add(type, "100% resident", evaluate(load_gpu(type, false, "100%", 0), ref, MatmulMode::Fast, 1));
    cuda::q8::set_folded_router(fold_was);
  }
  cuda::q8::set_low_bit(was);
  on_crit.finish();
  nofold_crit.finish();
}

// The same sequence at several expert-cache sizes (exact mode): the CPU pool and the slots must give
// the same tokens as the CPU engine and as each other.
TEST_P(Qwen3MoeGpu, ExpertCacheSizesAgree) {
  const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + GetParam() + ".f32ref.slg");
  const Result cpu = evaluate(load_model(kModels + "tiny-qwen3moe-A-" + GetParam() + ".gguf"), ref,
                              MatmulMode::Exact);
  struct Config {
    const char* cache;
    int adapt_every;
  };
  for (const Config c : {Config{"0%", 0}, Config{"25%", 0}, Config{"50%", 0}, Config{"100%", 0}, Config{"25%", 1}}) {
    auto model = load_gpu(GetParam(), true, c.cache, c.adapt_every);
    const Result r = evaluate(model, ref, MatmulMode::Exact);
    const ExpertCacheReport& d = r.decode;
    std::printf("[ gpu cache %-6s %4s adapt %d ] mean KL %.3e, top-1 %d/%u, slots %d/%d, prefill hit %.3f, "
                "decode hit %.3f (%lld/%lld), swaps %lld, h2d %.1f KiB d2h %.1f KiB\n",
                GetParam().c_str(), c.cache, c.adapt_every, r.mean_kl, r.top1, ref.n_prompt, d.slots_used,
                d.n_slots, r.prefill.hit_rate(), d.hit_rate(), (long long)d.hits, (long long)(d.hits + d.misses),
                (long long)(r.prefill.swaps + d.swaps), d.bytes_h2d / 1024.0, d.bytes_d2h / 1024.0);
    SCOPED_TRACE(std::string("expert cache ") + c.cache + (c.adapt_every ? " adapting" : ""));
    EXPECT_LE(r.mean_kl, 1e-5);
    EXPECT_EQ(r.top1, int(ref.n_prompt));
    EXPECT_EQ(r.gen, cpu.gen) << "gpu: " << gen_str(r.gen) << "\ncpu: " << gen_str(cpu.gen);
    EXPECT_EQ(r.gen, ref.gen) << "gpu: " << gen_str(r.gen) << "\nref: " << gen_str(ref.gen);
    ASSERT_TRUE(d.present);
    EXPECT_EQ(d.n_experts_total, model->hparams().n_layer * model->hparams().n_expert);
    EXPECT_EQ(d.hits + d.misses, int64_t(ref.n_gen) * model->hparams().n_layer * model->hparams().n_expert_used);
    const std::string cache = c.cache;
    if (cache == "100%") {
      EXPECT_EQ(d.n_slots, d.n_experts_total);
      EXPECT_EQ(d.misses, 0);
      EXPECT_DOUBLE_EQ(d.hit_rate(), 1.0);
      EXPECT_DOUBLE_EQ(r.prefill.hit_rate(), 1.0);
    } else if (cache == "0%") {
      EXPECT_EQ(d.n_slots, 0);
      EXPECT_EQ(d.hits, 0);
      EXPECT_DOUBLE_EQ(d.hit_rate(), 0.0);
    } else {
      EXPECT_GT(d.hits, 0);
      EXPECT_GT(d.misses, 0);
    }
    if (c.adapt_every > 0) {
      EXPECT_GT(r.prefill.swaps + d.swaps, 0) << "adaptation every step never swapped";
    }
  }
}

// Prefill in chunks of 7 with a quarter of the experts resident: many forward passes, each mixing the
// slots and the CPU pool, positions continuing across passes.
TEST_P(Qwen3MoeGpu, ChunkedPrefillWithCpuPoolMatches) {
  const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + GetParam() + ".f32ref.slg");
  const Result r = evaluate(load_gpu(GetParam(), true, "25%", 0), ref, MatmulMode::Exact, 7);
  std::printf("[ gpu chunked %-6s ] mean KL %.3e, top-1 %d/%u, prefill hit rate %.3f\n", GetParam().c_str(),
              r.mean_kl, r.top1, ref.n_prompt, r.prefill.hit_rate());
  EXPECT_LE(r.mean_kl, 1e-5);
  EXPECT_EQ(r.gen, ref.gen) << "gpu: " << gen_str(r.gen) << "\nref: " << gen_str(ref.gen);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, Qwen3MoeGpu,
                         ::testing::Values("Q8_0", "Q4_K_M", "Q6_K", "Q2_K", "IQ4_XS", "IQ2_XS", "IQ3_S",
                                           "IQ1_M"));

// Continuous batching: one decode pass over two sequences at different positions (each token reads
// its own sequence's device KV through its KvRef) gives the logits of decoding each alone.
TEST(Qwen3MoeGpuBatch, TwoSequencesInOneDecodeMatchSeparateDecodes) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-Q8_0.f32ref.slg");
  auto model = load_gpu("Q8_0", true, "50%", 0);
  EngineOptions opt;
  opt.n_ctx = 64;
  opt.n_batch = 16;
  opt.n_threads = 2;
  opt.mode = MatmulMode::Exact;
  Engine eng(model, opt);
  const size_t V = ref.n_vocab;
  const std::vector<int32_t> pa(ref.prompt.begin(), ref.prompt.begin() + 20);
  const std::vector<int32_t> pb(ref.prompt.begin() + 10, ref.prompt.begin() + 41);
  const int32_t ta = ref.prompt[45], tb = ref.prompt[46];
  std::vector<float> scratch(V), alone_a(V), alone_b(V), both(2 * V);
  auto decode_alone = [&](const std::vector<int32_t>& p, int32_t t, std::vector<float>& out) {
    auto s = eng.new_sequence();
    eng.prefill(*s, p, scratch.data());
    SequenceState* sp = s.get();
    eng.decode({&sp, 1}, {&t, 1}, out.data());
  };
  decode_alone(pa, ta, alone_a);
  decode_alone(pb, tb, alone_b);
  auto sa = eng.new_sequence(), sb = eng.new_sequence();
  eng.prefill(*sa, pa, scratch.data());
  eng.prefill(*sb, pb, scratch.data());
  SequenceState* seqs[2] = {sa.get(), sb.get()};
  const int32_t toks[2] = {ta, tb};
  eng.decode({seqs, 2}, {toks, 2}, both.data());
  double max_a = 0, max_b = 0;
  for (size_t i = 0; i < V; ++i) {
    max_a = std::max(max_a, double(std::abs(both[i] - alone_a[i])));
    max_b = std::max(max_b, double(std::abs(both[V + i] - alone_b[i])));
  }
  const double kl_a = kl_div(alone_a.data(), both.data(), V), kl_b = kl_div(alone_b.data(), both.data() + V, V);
  std::printf("[ gpu batch ] seq A: max |diff| %.3e KL %.3e; seq B: max |diff| %.3e KL %.3e\n", max_a, kl_a,
              max_b, kl_b);
  EXPECT_LE(kl_a, 1e-6);
  EXPECT_LE(kl_b, 1e-6);
  EXPECT_EQ(argmax(alone_a.data(), V), argmax(both.data(), V));
  EXPECT_EQ(argmax(alone_b.data(), V), argmax(both.data() + V, V));
}

// CUDA graphs: a model that replays decode passes as graphs and one that launches every kernel give
// bit-identical logits over 4 decode steps of one sequence, then 3 steps of two sequences in one batch,
// with both attention kernels; the graph model really replayed (every decode pass, 2 captures: n = 1, 2).
// At 50% resident (the CPU pool) the passes replay per-layer segment graphs instead: also bit-identical.
TEST(Qwen3MoeGpuGraphs, GraphsOnAndOffGiveIdenticalLogits) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  if (!cuda::graphs_enabled_by_env()) GTEST_SKIP() << "STRATA_CUDA_GRAPHS=0 in the environment";
  const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-Q8_0.f32ref.slg");
  for (const char* cache : {"100%", "50%"})
  for (const cpu::AttnMath attn : {cpu::AttnMath::GgmlF16, cpu::AttnMath::F32}) {
    SCOPED_TRACE(std::string("expert cache ") + cache);
    const bool pool = std::string(cache) != "100%";
    auto run = [&](bool graphs, ExpertCacheReport& rep) {
      cuda::CudaOptions o = small_cuda_options(cache, false);
      o.cuda_graphs = graphs;
      return decode_one_then_two(cuda::load_model_cuda(kModels + "tiny-qwen3moe-A-Q8_0.gguf", o),
                                 small_engine_options(MatmulMode::Fast, attn), ref, 4, 3, &rep);
    };
    ExpertCacheReport r_on, r_off;
    const std::vector<float> on = run(true, r_on), off = run(false, r_off);
    ASSERT_EQ(on.size(), off.size());
    const size_t n_diff = bit_differences(on, off);
    double max_diff = 0;
    for (size_t i = 0; i < on.size(); ++i) max_diff = std::max(max_diff, double(std::abs(on[i] - off[i])));
    std::printf("[ graphs ] %s resident, attn %s: %zu of %zu logits differ (max |diff| %.3e); graph on: %lld of %lld "
                "passes replayed, %lld captured, %.1f launcher calls/pass; off: %lld replayed, %.1f launcher calls/pass\n",
                cache, attn == cpu::AttnMath::F32 ? "f32" : "ggml-f16", n_diff, on.size(), max_diff,
                (long long)r_on.graph_forwards, (long long)r_on.forwards, (long long)r_on.graph_captures,
                double(r_on.op_calls) / double(std::max<int64_t>(r_on.forwards, 1)), (long long)r_off.graph_forwards,
                double(r_off.op_calls) / double(std::max<int64_t>(r_off.forwards, 1)));
    EXPECT_EQ(n_diff, 0u);
    EXPECT_TRUE(r_on.graphs_enabled);
    EXPECT_FALSE(r_off.graphs_enabled);
    EXPECT_EQ(r_on.forwards, 7);
    EXPECT_EQ(r_off.forwards, 7);
    EXPECT_EQ(r_off.graph_forwards, 0);
    EXPECT_EQ(r_off.graph_captures, 0);
    EXPECT_EQ(r_on.hits + r_on.misses, r_off.hits + r_off.misses);  // the routing reached the host
    if (!pool) {
      EXPECT_EQ(r_on.graph_forwards, 7);
      EXPECT_EQ(r_on.graph_captures, 2);
      EXPECT_EQ(r_on.misses, 0);
    } else {  // no whole-pass graph; segments captured (per layer and part, n = 1 and 2) and replayed
      EXPECT_EQ(r_on.graph_forwards, 0);
      EXPECT_GT(r_on.graph_captures, 0);
      EXPECT_LT(r_on.op_calls, r_off.op_calls);
      EXPECT_GT(r_on.misses, 0);
    }
  }
}

// The attention span (cuda/host/attn_span.h): decode logits depend on the positions, not on the context
// the model and engine were made for. One sequence, fast mode with F32 attention, graphs on: 41 prompt
// tokens, then 30 greedy steps (positions 41..70, so spans 64 then 128), in a 128-position context and in a
// 4096-position one: bit-identical logits. With the whole-pass graphs, one capture per span (2), each
// replayed. Before the span, a 4096 context split every step over 64 blocks and merged them: other bits.
TEST(Qwen3MoeGpuGraphs, DecodeLogitsDoNotDependOnTheContextSize) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-Q8_0.f32ref.slg");
  const size_t V = ref.n_vocab;
  constexpr int kSteps = 30;
  auto run = [&](int n_ctx, ExpertCacheReport& rep) {
    cuda::CudaOptions o = small_cuda_options("100%", false);
    o.n_ctx = n_ctx;
    EngineOptions opt = small_engine_options(MatmulMode::Fast, cpu::AttnMath::F32);
    opt.n_ctx = n_ctx;
    std::shared_ptr<const Model> model = cuda::load_model_cuda(kModels + "tiny-qwen3moe-A-Q8_0.gguf", o);
    Engine eng(model, opt);
    auto seq = eng.new_sequence();
    std::vector<float> last(V), all;
    eng.prefill(*seq, std::vector<int32_t>(ref.prompt.begin(), ref.prompt.begin() + 41), last.data());
    model->reset_cache_stats();
    for (int i = 0; i < kSteps; ++i) {
      const int32_t t = argmax(last.data(), V);
      SequenceState* sp = seq.get();
      eng.decode({&sp, 1}, {&t, 1}, last.data());
      all.insert(all.end(), last.begin(), last.end());
    }
    rep = model->cache_report();
    return all;
  };
  ExpertCacheReport r_small, r_big;
  const std::vector<float> small = run(128, r_small), big = run(4096, r_big);
  const size_t n_diff = bit_differences(small, big);
  std::printf("[ attention span ] context 128 vs 4096: %zu of %zu logits differ; captures %lld / %lld, replayed "
              "%lld / %lld of %d passes\n", n_diff, small.size(), (long long)r_small.graph_captures,
              (long long)r_big.graph_captures, (long long)r_small.graph_forwards, (long long)r_big.graph_forwards,
              kSteps);
  EXPECT_EQ(n_diff, 0u);
  if (cuda::graphs_enabled_by_env()) {
    EXPECT_EQ(r_small.graph_forwards, kSteps);
    EXPECT_EQ(r_big.graph_forwards, kSteps);
    EXPECT_EQ(r_small.graph_captures, 2);  // spans 64 and 128
    EXPECT_EQ(r_big.graph_captures, 2);
  }
}

// Gated CPU-pool passes give the segmented passes' bits (decode_test_util.h says what is run).
TEST(Qwen3MoeGpuGated, GatedPassesGiveTheSegmentedPassesBits) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  if (!cuda::graphs_enabled_by_env()) GTEST_SKIP() << "STRATA_CUDA_GRAPHS=0 in the environment";
  const std::string base = kModels + "tiny-qwen3moe-A-Q4_K_M";
  expect_gated_passes_give_the_same_bits(base + ".gguf", read_slg(base + ".f32ref.slg"), 6, 4, "qwen3moe");
}

// With the CPU pool (50% of the experts resident) no pass may replay the whole-pass graph of
// compute_resident (it has no hand-offs with the host); every decode pass runs gated instead.
TEST(Qwen3MoeGpuGraphs, NoGraphWithTheCpuPool) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  if (!cuda::graphs_enabled_by_env()) GTEST_SKIP() << "STRATA_CUDA_GRAPHS=0 in the environment";
  const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-Q8_0.f32ref.slg");
  auto model = load_gpu("Q8_0", false, "50%", 0);
  const Result r = evaluate(model, ref, MatmulMode::Fast, 64);
  std::printf("[ graphs ] 50%% resident decode: %lld of %lld passes replayed a graph, %lld gated, %lld pairs on "
              "the CPU pool\n",
              (long long)r.decode.graph_forwards, (long long)r.decode.forwards, (long long)r.decode.gated_forwards,
              (long long)r.decode.misses);
  EXPECT_GT(r.decode.forwards, 0);
  EXPECT_EQ(r.decode.graph_forwards, 0);
  EXPECT_EQ(r.decode.gated_forwards, r.decode.forwards);
  EXPECT_GT(r.decode.misses, 0);
}

}  // namespace

// Sampling on the GPU (Engine::decode_sample, the CUDA backend's ForwardOptions::sampling) against the
// CPU Sampler on the same model's logits: the same seeds give the same tokens, greedy and random, with
// every expert resident and with a quarter (CPU-pool passes). Two sequences decode in one batch, so the
// per-row draws and picks are checked too. The draw is rounded to float for the device: a pick can only
// differ where the draw falls within ~1e-7 of a boundary of the cumulative probabilities.
TEST(Qwen3MoeGpuSampling, DeviceSamplingPicksWhatTheCpuSamplerPicks) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-Q4_K_M.f32ref.slg");
  for (const char* cache : {"100%", "25%"}) {
    for (const float temp : {0.0f, 0.8f, 1.5f}) {
      auto model = load_gpu("Q4_K_M", false, cache, 0);
      ASSERT_TRUE(model->samples_on_device());
      EngineOptions opt;
      opt.n_ctx = 128;
      opt.n_threads = 2;
      Engine eng(model, opt);
      SamplingParams sp;
      sp.temperature = temp;
      std::vector<std::vector<int32_t>> runs[2];
      for (int mode = 0; mode < 2; ++mode) {  // 0: logits to the CPU Sampler, 1: decode_sample
        std::vector<std::unique_ptr<SequenceState>> seqs;
        std::vector<Sampler> samplers;
        std::vector<int32_t> cur;
        std::vector<float> logits(ref.n_vocab);
        for (int s = 0; s < 2; ++s) {
          seqs.push_back(eng.new_sequence());
          sp.seed = 100 + uint64_t(s);
          samplers.emplace_back(sp, int32_t(ref.n_vocab));
          const std::vector<int32_t> prompt(ref.prompt.begin(), ref.prompt.begin() + 8 + 4 * s);
          eng.prefill(*seqs.back(), prompt, logits.data());
          cur.push_back(samplers.back().sample(logits.data()));
        }
        runs[mode].resize(2);
        std::vector<SequenceState*> sp_seqs = {seqs[0].get(), seqs[1].get()};
        std::vector<Sampler*> sp_samp = {&samplers[0], &samplers[1]};
        std::vector<float> both(2 * ref.n_vocab);
        for (int step = 0; step < 24; ++step) {
          for (int s = 0; s < 2; ++s) samplers[size_t(s)].accept(cur[size_t(s)]), runs[mode][size_t(s)].push_back(cur[size_t(s)]);
          const std::vector<int32_t> in = cur;
          if (mode == 0) {
            eng.decode(sp_seqs, in, both.data());
            for (int s = 0; s < 2; ++s) cur[size_t(s)] = samplers[size_t(s)].sample(both.data() + size_t(s) * ref.n_vocab);
          } else {
            eng.decode_sample(sp_seqs, in, sp_samp, cur.data());
          }
        }
      }
      std::printf("[ gpu sampling %4s T=%.1f ] seq 0: %s\n", cache, temp, gen_str(runs[1][0]).c_str());
      EXPECT_EQ(runs[0][0], runs[1][0]) << cache << " temperature " << temp;
      EXPECT_EQ(runs[0][1], runs[1][1]) << cache << " temperature " << temp;
    }
  }
}

// Prefill streaming: the fixture prompt in one 48-token pass (>= 32 tokens: non-resident experts with
// enough pairs are copied into staging slots and run on the GPU), at 0% and 25% resident, fast mode:
// within the fixture KL bound, experts were streamed, and with streaming off (stream_slots 0) the same
// bound holds and nothing is streamed. Exact mode is covered by ExpertCacheSizesAgree (its prefill streams).
TEST(Qwen3MoeGpuStreaming, StreamedPrefillWithinLlamaCppKl) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const std::string type : {"Q4_K_M", "IQ2_XS", "Q8_0"}) {
    const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + type + ".f32ref.slg");
    const double bound = 1.5 * kLlamaKl.at(type);
    for (const char* cache : {"0%", "25%"}) {
      for (const int stream_slots : {-1, 0}) {
        cuda::CudaOptions o;
        o.expert_cache = cache;
        o.adapt_every = 0;
        o.n_ctx = 128;
        o.stream_slots = stream_slots;
        o.decode_stream = "off";  // decode streaming: Qwen3MoeGpuStreaming.DecodeStreaming*
        std::shared_ptr<const Model> model = cuda::load_model_cuda(kModels + "tiny-qwen3moe-A-" + type + ".gguf", o);
        const Result r = evaluate(model, ref, MatmulMode::Fast);
        std::printf("[ gpu streaming %-6s %3s slots %2d ] mean KL %.3e (bound %.3e), prefill streamed %lld, hits %lld, "
                    "misses %lld\n",
                    type.c_str(), cache, stream_slots, r.mean_kl, bound, (long long)r.prefill.streamed,
                    (long long)r.prefill.hits, (long long)r.prefill.misses);
        EXPECT_LE(r.mean_kl, bound) << type << " " << cache << " stream slots " << stream_slots;
        if (stream_slots == 0)
          EXPECT_EQ(r.prefill.streamed, 0);
        else
          EXPECT_GT(r.prefill.streamed, 0) << type << " " << cache;
        EXPECT_EQ(r.decode.streamed, 0);  // decode streaming off
      }
    }
  }
}

// --prefill-stream auto: the first prefill streams every candidate (no CPU timing yet), later ones the
// busiest of them as far as the measured costs balance (moe/stream_plan.h). Five prefills of the fixture
// prompt on one model, 0% and 25% resident: every one within the KL bound, none streaming more than the
// first, and all of them together more than nothing.
TEST(Qwen3MoeGpuStreaming, AutoPrefillSplitWithinLlamaCppKl) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const std::string type : {"Q4_K_M", "IQ2_XS"}) {
    const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + type + ".f32ref.slg");
    const double bound = 1.5 * kLlamaKl.at(type);
    for (const char* cache : {"0%", "25%"}) {
      cuda::CudaOptions o;
      o.expert_cache = cache;
      o.adapt_every = 0;
      o.n_ctx = 128;
      o.prefill_stream = "auto";
      std::shared_ptr<const Model> model = cuda::load_model_cuda(kModels + "tiny-qwen3moe-A-" + type + ".gguf", o);
      int64_t first = -1;
      for (int rep = 0; rep < 5; ++rep) {
        const Result r = evaluate(model, ref, MatmulMode::Fast);
        std::printf("[ gpu prefill stream auto %-6s %3s pass %d ] mean KL %.3e (bound %.3e), streamed %lld\n",
                    type.c_str(), cache, rep, r.mean_kl, bound, (long long)r.prefill.streamed);
        SCOPED_TRACE(type + " " + cache + " pass " + std::to_string(rep));
        EXPECT_LE(r.mean_kl, bound);
        if (rep == 0) {
          first = r.prefill.streamed;
          EXPECT_GT(first, 0);
        }
        EXPECT_LE(r.prefill.streamed, first);
      }
    }
  }
  cuda::CudaOptions bad;
  bad.prefill_stream = "balance";
  EXPECT_THROW(cuda::load_model_cuda(kModels + "tiny-qwen3moe-A-Q4_K_M.gguf", bad), Error);
}

// Decode streaming: a decode pass copies a share of each layer's non-resident experts into staging slots
// and runs them on the GPU while the CPU pool runs the rest. Exact mode at 0% and 25% resident, shares
// off / half / all / auto: the fixture's greedy tokens and prompt logits as the f32 reference, and the
// copies counted (all: one per miss, the CPU pool idle; half: round(m / 2) of each layer's m).
TEST(Qwen3MoeGpuStreaming, DecodeStreamingKeepsExactTokens) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const std::string type : {"Q4_K_M", "IQ2_XS"}) {
    const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + type + ".f32ref.slg");
    for (const char* cache : {"0%", "25%"}) {
      for (const char* share : {"off", "0.5", "1", "auto"}) {
        cuda::CudaOptions o;
        o.exact = true;
        o.expert_cache = cache;
        o.adapt_every = 0;
        o.n_ctx = 128;
        o.decode_stream = share;
        std::shared_ptr<const Model> model = cuda::load_model_cuda(kModels + "tiny-qwen3moe-A-" + type + ".gguf", o);
        const Result r = evaluate(model, ref, MatmulMode::Exact);
        const ExpertCacheReport& d = r.decode;
        std::printf("[ gpu decode streaming %-6s %3s %-4s ] mean KL %.3e, decode misses %lld, streamed %lld\n",
                    type.c_str(), cache, share, r.mean_kl, (long long)d.misses, (long long)d.streamed);
        SCOPED_TRACE(type + " " + cache + " decode stream " + share);
        EXPECT_LE(r.mean_kl, 1e-5);
        EXPECT_EQ(r.gen, ref.gen) << "gpu: " << gen_str(r.gen) << "\nref: " << gen_str(ref.gen);
        ASSERT_GT(d.misses, 0);
        const std::string sh = share;
        if (sh == "off") {
          EXPECT_EQ(d.streamed, 0);
        } else if (sh == "1") {
          EXPECT_EQ(d.streamed, d.misses);  // one token a pass: each miss is its own expert
        }
        if (sh == "0.5") {
          EXPECT_GE(d.streamed, d.misses / 2 - int64_t(ref.n_gen) * model->hparams().n_layer);
          EXPECT_LE(d.streamed, d.misses / 2 + int64_t(ref.n_gen) * model->hparams().n_layer);
          EXPECT_GT(d.streamed, 0);
        }
      }
    }
  }
}

// Direct reads (moe/direct_rule.h) on KL-checked logits: the prompt in chunks of 7 (decode-sized passes,
// gated) at 0% and 25% resident, with every miss read by the GPU over PCIe (share 1: the CPU pool gets
// nothing) and with half of them, within 1.5x llama.cpp's KL for two formats; and the report counts them.
TEST(Qwen3MoeGpuDirect, DirectReadsWithinLlamaCppKl) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const std::string type : {"Q4_K_M", "Q8_0"}) {
    const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + type + ".f32ref.slg");
    const double bound = 1.5 * kLlamaKl.at(type);
    for (const char* cache : {"0%", "25%"})
      for (const char* share : {"1", "0.5"}) {
        cuda::CudaOptions o;
        o.expert_cache = cache;
        o.adapt_every = 0;
        o.n_ctx = 128;
        o.decode_direct = share;
        const Result r = evaluate(cuda::load_model_cuda(kModels + "tiny-qwen3moe-A-" + type + ".gguf", o), ref,
                                  MatmulMode::Fast, 7);
        const ExpertCacheReport& d = r.decode;
        std::printf("[ gpu direct fast %-6s %3s share %s ] mean KL %.3e (bound %.3e), decode misses %lld, direct "
                    "%lld, gated %lld/%lld\n", type.c_str(), cache, share, r.mean_kl, bound, (long long)d.misses,
                    (long long)d.direct, (long long)d.gated_forwards, (long long)d.forwards);
        EXPECT_LE(r.mean_kl, bound) << type << " " << cache << " share " << share;
        EXPECT_GT(r.prefill.direct, 0);
        if (std::string(share) == "1")
          EXPECT_EQ(d.direct, d.misses);
        else
          EXPECT_LT(d.direct, d.misses);
        EXPECT_GT(d.direct, 0);
      }
  }
}

// The fast path with decode streaming on KL-checked logits: the prompt in chunks of 7 (decode-sized
// passes) with every miss copied, at 0% and 25% resident, within 1.5x llama.cpp's KL for two formats.
TEST(Qwen3MoeGpuStreaming, DecodeStreamingFastWithinLlamaCppKl) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const std::string type : {"Q4_K_M", "Q8_0"}) {
    const Slg ref = read_slg(kModels + "tiny-qwen3moe-A-" + type + ".f32ref.slg");
    const double bound = 1.5 * kLlamaKl.at(type);
    for (const char* cache : {"0%", "25%"}) {
      cuda::CudaOptions o;
      o.expert_cache = cache;
      o.adapt_every = 0;
      o.n_ctx = 128;
      o.decode_stream = "1";
      const Result r = evaluate(cuda::load_model_cuda(kModels + "tiny-qwen3moe-A-" + type + ".gguf", o), ref,
                                MatmulMode::Fast, 7);
      std::printf("[ gpu decode streaming fast %-6s %3s ] mean KL %.3e (bound %.3e), prefill streamed %lld\n",
                  type.c_str(), cache, r.mean_kl, bound, (long long)r.prefill.streamed);
      EXPECT_LE(r.mean_kl, bound) << type << " " << cache;
      EXPECT_GT(r.prefill.streamed, 0) << type << " " << cache;
    }
  }
}
