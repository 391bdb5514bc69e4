// `strata bench`: prefill (pp) and decode (tg) speed of a model, llama-bench style, and memory.
//   pp N: evaluate N tokens from an empty context in --batch chunks;  tg N: generate N tokens one at
//   a time from an empty context. Token ids are fixed pseudo-random ids (the speed of an MoE model
//   depends on routing, so random ids route like real text rather than repeating one token).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "cli/engine_flags.h"

namespace strata::cli {
namespace {

struct BenchArgs {
  int n_prompt = 512, n_gen = 128, reps = 1;
  int warmup = 1;  // unmeasured passes first (as llama-bench): one-time costs (lazy GPU module loading,
                   // library handles, first touches) stay out of the numbers
  bool json = false;
};

int run_bench(const EngineFlags& ef, const BenchArgs& a) {
  STRATA_REQUIRE(a.n_prompt >= 0 && a.n_gen >= 0 && a.reps >= 1 && a.warmup >= 0,
                 "-p and -n must be >= 0, --reps >= 1 and --warmup >= 0");
  auto t_load0 = std::chrono::steady_clock::now();
  std::shared_ptr<const Model> model = load_model_for(ef);
  Engine eng(model, ef.options(std::max(a.n_prompt, a.n_gen) + 1));
  auto seq = eng.new_sequence();
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load0).count();
  const size_t V = static_cast<size_t>(eng.n_vocab());
  std::vector<float> logits(V);
  Rng rng(1234);
  auto rand_tok = [&] { return static_cast<int32_t>(rng.next() % V); };
  std::vector<int32_t> prompt(static_cast<size_t>(a.n_prompt));
  // One prefill of n_prompt fresh random tokens, and n one-token decode steps, from an empty context;
  // each returns its seconds.
  const auto seconds_since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const auto run_pp = [&] {
    for (auto& t : prompt) t = rand_tok();
    seq->reset();
    const auto t0 = std::chrono::steady_clock::now();
    eng.prefill(*seq, prompt, logits.data());
    return seconds_since(t0);
  };
  const auto run_tg = [&](int n) {
    seq->reset();
    SequenceState* sp = seq.get();
    int32_t tok = rand_tok();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      eng.decode({&sp, 1}, {&tok, 1}, logits.data());
      tok = rand_tok();
    }
    return seconds_since(t0);
  };
  // Warm-up: the same prefill and a few decode steps, not measured.
  for (int w = 0; w < a.warmup; ++w) {
    if (a.n_prompt > 0) run_pp();
    run_tg(std::min(a.n_gen, 4));
  }
  double pp_best = 0, tg_best = 0;
  ExpertCacheReport pp_cache, tg_cache;  // of the last repetition of each phase
  for (int r = 0; r < a.reps; ++r) {
    if (a.n_prompt > 0) {
      model->reset_cache_stats();
      pp_best = std::max(pp_best, a.n_prompt / run_pp());
      pp_cache = model->cache_report();
    }
    if (a.n_gen > 0) {
      model->reset_cache_stats();
      tg_best = std::max(tg_best, a.n_gen / run_tg(a.n_gen));
      tg_cache = model->cache_report();
    }
  }
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const auto& hp = model->hparams();
  if (a.json) {
    std::printf(
        "{\"model\": \"%s\", \"arch\": \"%s\", \"n_vocab\": %d, \"threads\": %d, \"exact\": %s, \"batch\": %d, "
        "\"pp\": %d, \"pp_tok_s\": %.3f, \"tg\": %d, \"tg_tok_s\": %.3f, \"weights_bytes\": %zu, "
        "\"kv_bytes\": %zu, \"workspace_bytes\": %zu, \"peak_rss_bytes\": %llu, \"load_s\": %.3f, "
        "\"backend\": \"%s\", \"pp_hit_rate\": %s, \"tg_hit_rate\": %s, \"slots_used\": %d, \"n_slots\": %d, "
        "\"tg_bytes_h2d\": %llu, \"tg_bytes_d2h\": %llu}\n",
        ef.model.c_str(), hp.arch.c_str(), eng.n_vocab(), eng.options().n_threads, ef.exact ? "true" : "false",
        eng.options().n_batch, a.n_prompt, pp_best, a.n_gen, tg_best, model->weight_bytes(),
        seq->memory_bytes(), eng.workspace_bytes(), (unsigned long long)peak_rss_bytes(), load_s,
        model->backend_name().c_str(), pp_cache.present ? std::to_string(pp_cache.hit_rate()).c_str() : "null",
        tg_cache.present ? std::to_string(tg_cache.hit_rate()).c_str() : "null", tg_cache.slots_used,
        tg_cache.n_slots, (unsigned long long)tg_cache.bytes_h2d, (unsigned long long)tg_cache.bytes_d2h);
  } else {
    std::printf("model      %s (%s, %d layers, %d experts / %d used)\n", ef.model.c_str(),
                hp.arch.c_str(), hp.n_layer, hp.n_expert, hp.n_expert_used);
    std::printf("backend    %s\n", model->backend_name().c_str());
    std::printf("threads    %d   mode %s   batch %d   reps %d   warmup %d\n", eng.options().n_threads,
                ef.exact ? "exact" : "fast", eng.options().n_batch, a.reps, a.warmup);
    if (a.n_prompt > 0) std::printf("pp%-5d    %10.2f tok/s\n", a.n_prompt, pp_best);
    if (a.n_gen > 0) std::printf("tg%-5d    %10.2f tok/s\n", a.n_gen, tg_best);
    if (pp_cache.present && a.n_prompt > 0) print_cache_report(pp_cache, model->backend_name(), "pp");
    if (tg_cache.present && a.n_gen > 0) print_cache_report(tg_cache, model->backend_name(), "tg");
    std::printf("memory     weights %.3f GiB (mapped), KV %.3f GiB, workspace %.3f GiB, peak RSS %.3f GiB\n",
                model->weight_bytes() / gib, seq->memory_bytes() / gib, eng.workspace_bytes() / gib,
                peak_rss_bytes() / gib);
  }
  return 0;
}

const CommandRegistrar reg(
    "bench", "Prefill and decode speed (pp512 / tg128 style) and memory of a model",
    [](CLI::App& app) -> std::function<int()> {
      auto ef = std::make_shared<EngineFlags>();
      auto a = std::make_shared<BenchArgs>();
      ef->add(app, 0);
      app.add_option("-p,--n-prompt", a->n_prompt, "prompt tokens to prefill (pp)")->capture_default_str();
      app.add_option("-n,--n-gen", a->n_gen, "tokens to decode one at a time (tg)")->capture_default_str();
      app.add_option("-r,--reps", a->reps, "repetitions (best is reported)")->capture_default_str();
      app.add_option("--warmup", a->warmup, "unmeasured repetitions first (prefill and up to 4 decode steps)")
          ->capture_default_str();
      app.add_flag("--json", a->json, "one JSON line instead of the table");
      return [=] { return run_bench(*ef, *a); };
    });

}  // namespace
}  // namespace strata::cli
