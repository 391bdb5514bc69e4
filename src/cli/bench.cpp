// `strata bench`: prefill (pp) and decode (tg) speed of a model, llama-bench style, and memory.
//   pp N: evaluate N tokens from an empty context in --batch chunks;  tg N: generate N tokens one at
//   a time from an empty context. Token ids are fixed pseudo-random ids (the speed of an MoE model
//   depends on routing, so random ids route like real text rather than repeating one token).
//   --tg-mode: how a tg step ends. logits (default): the logits come back to the host (what llama.cpp's
//   driver in bench/llama does, picking there); pick: a greedy pick on the device, only the id comes back
//   (Engine::decode_sample); chain: Engine::generate, greedy picks on the device feeding the next step
//   there (what `strata run` does): the steps' tokens are then the picks, not random ids.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "engine/sampling.h"

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cpu/mem_bandwidth.h"
#include "model/decode_traffic.h"

namespace strata::cli {
namespace {

struct BenchArgs {
  int n_prompt = 512, n_gen = 128, reps = 1;
  int parallel = 1;  // sequences decoded together in tg (one token each a step, one forward pass)
  int warmup = 1;  // unmeasured passes first (as llama-bench): one-time costs (lazy GPU module loading,
                   // library handles, first touches) stay out of the numbers
  std::string tg_mode = "logits";  // logits | pick | chain (above)
  float tg_temp = 0.0f;  // pick, chain: 0 greedy; > 0 a draw at this temperature, with the filters below
  int tg_top_k = 40;     // (SamplingParams' defaults; top-k 0, top-p 1, min-p 0: a draw over the whole vocabulary,
  float tg_top_p = 0.95f;  //  what `strata serve` does for a request that names none of them)
  float tg_min_p = 0.05f;
  bool json = false;
  bool roofline = true;  // measure the memories' bandwidths after the runs and print the decode roofline
};

// The decode roofline of a run: the weight bytes a token reads, where they are read from, and the
// bandwidths measured in this process (bench/results explains the numbers).
struct Roofline {
  DecodeTraffic traffic;
  double hit_rate = 0;               // routed-expert reads served from GPU memory (tg's hit rate; CPU: 0)
  double gpu_bytes = 0, host_bytes = 0;
  double host_gbs = 0;               // host memory read, all threads
  bool direct = false;               // tg had direct reads: the GPU read part of the host bytes over PCIe
  Model::DeviceBandwidth device;     // GPU memory (d2d copy) and PCIe h2d; 0 on the CPU backend
  double tok_s = 0;                  // bytes / bandwidth, the two memories read at the same time
};

Roofline measure_roofline(const Model& model, const ExpertCacheReport& tg_cache, int n_threads) {
  Roofline r;
  r.traffic = decode_traffic(model.file(), model.hparams(), model.routed_layers());
  ThreadPool pool(n_threads);
  r.host_gbs = cpu::measure_host_read_gbs(pool);
  r.device = model.measure_device_bandwidth();
  const double routed = double(r.traffic.routed), rest = double(r.traffic.dense + r.traffic.embedding);
  if (tg_cache.present) {
    r.hit_rate = tg_cache.hit_rate();
    r.gpu_bytes = rest + routed * r.hit_rate;
    r.host_bytes = routed * (1 - r.hit_rate);
    // With direct reads (--decode-direct) the CPU pool and the GPU read host memory at the same time: at
    // best the host bytes come at the two rates added (an upper bound: they share the host's memory).
    r.direct = tg_cache.direct > 0;
    const double host_side_gbs = r.host_gbs + (r.direct ? r.device.h2d_gbs : 0.0);
    r.tok_s = roofline_tok_s(r.gpu_bytes, r.device.device_gbs, r.host_bytes, host_side_gbs);
  } else {
    r.host_bytes = rest + routed;
    r.tok_s = roofline_tok_s(r.host_bytes, r.host_gbs);
  }
  return r;
}

int run_bench(const EngineFlags& ef, const BenchArgs& a) {
  STRATA_REQUIRE(a.n_prompt >= 0 && a.n_gen >= 0 && a.reps >= 1 && a.warmup >= 0,
                 "-p and -n must be >= 0, --reps >= 1 and --warmup >= 0");
  STRATA_REQUIRE(a.parallel >= 1 && a.parallel <= 256, "--parallel must be in [1, 256], got {}", a.parallel);
  STRATA_REQUIRE(a.tg_mode == "logits" || a.tg_mode == "pick" || a.tg_mode == "chain",
                 "--tg-mode must be logits, pick or chain, got '{}'", a.tg_mode);
  STRATA_REQUIRE(std::isfinite(a.tg_temp) && a.tg_temp >= 0.0f && (a.tg_temp == 0.0f || a.tg_mode != "logits"),
                 "--tg-temp must be >= 0, and > 0 only with --tg-mode pick or chain (got {} with {})", a.tg_temp,
                 a.tg_mode);
  // (pick, chain: a sampler a sequence, greedy unless --tg-temp; its parameters checked before the load)
  SamplingParams sp;
  sp.temperature = a.tg_temp;
  sp.top_k = a.tg_top_k;
  sp.top_p = a.tg_top_p;
  sp.min_p = a.tg_min_p;
  sp.seed = 1;
  STRATA_REQUIRE(a.tg_top_k >= 0, "--tg-top-k must be >= 0 (0: off), got {}", a.tg_top_k);
  sp.validate();
  auto t_load0 = std::chrono::steady_clock::now();
  std::shared_ptr<const Model> model = load_model_for(ef);
  // (n_ctx also bounds n_batch: at least --parallel, so a tg step is one pass)
  Engine eng(model, ef.options(std::max({a.n_prompt, a.n_gen, a.parallel}) + 1));
  // --parallel sequences, all decoded together in tg; the first also takes pp.
  std::vector<std::unique_ptr<SequenceState>> owned;
  std::vector<SequenceState*> seqs;
  for (int i = 0; i < a.parallel; ++i) seqs.push_back(owned.emplace_back(eng.new_sequence()).get());
  SequenceState& seq = *seqs[0];
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load0).count();
  const size_t V = static_cast<size_t>(eng.n_vocab());
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
    seq.reset();
    const auto t0 = std::chrono::steady_clock::now();
    eng.prefill_logits(seq, prompt);  // (logits left where the engine reads them: no copy into ours)
    return seconds_since(t0);
  };
  // tg: n steps, each one token for every sequence (--parallel of them) in one forward pass.
  std::vector<int32_t> toks(seqs.size());
  std::vector<Sampler> pickers(seqs.size(), Sampler(sp, eng.n_vocab()));
  std::vector<Sampler*> samplers;
  for (auto& g : pickers) samplers.push_back(&g);
  std::vector<int32_t> picks(seqs.size());
  const auto run_tg = [&](int n) {
    for (auto* s : seqs) s->reset();
    for (auto& t : toks) t = rand_tok();
    const auto t0 = std::chrono::steady_clock::now();
    if (a.tg_mode == "chain") {
      const int steps = eng.generate(seqs, toks, samplers, n, [](int, std::span<const int32_t>) { return true; });
      STRATA_REQUIRE(steps == n, "bench: generate ran {} of {} steps", steps, n);
      return seconds_since(t0);
    }
    for (int i = 0; i < n; ++i) {
      if (a.tg_mode == "pick")
        eng.decode_sample(seqs, toks, samplers, picks.data());
      else
        eng.decode_logits(seqs, toks);
      for (auto& t : toks) t = rand_tok();
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
      tg_best = std::max(tg_best, double(a.n_gen) * a.parallel / run_tg(a.n_gen));
      tg_cache = model->cache_report();
    }
  }
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const auto& hp = model->hparams();
  const unsigned long long peak_rss = peak_rss_bytes();  // before the roofline's probe buffer
  // (The roofline is a single sequence's: a step of several reads shared weights once for all of them.)
  const bool with_roofline = a.roofline && a.n_gen > 0 && a.parallel == 1;
  const Roofline rl = with_roofline ? measure_roofline(*model, tg_cache, eng.options().n_threads) : Roofline{};
  if (a.json) {
    std::printf(
        "{\"model\": \"%s\", \"arch\": \"%s\", \"n_vocab\": %d, \"threads\": %d, \"exact\": %s, \"batch\": %d, "
        "\"pp\": %d, \"pp_tok_s\": %.3f, \"parallel\": %d, \"tg\": %d, \"tg_mode\": \"%s\", \"tg_temp\": %.3f, "
        "\"tg_tok_s\": %.3f, "
        "\"weights_bytes\": %zu, "
        "\"kv_bytes\": %zu, \"workspace_bytes\": %zu, \"peak_rss_bytes\": %llu, \"load_s\": %.3f, "
        "\"backend\": \"%s\", \"pp_hit_rate\": %s, \"tg_hit_rate\": %s, \"slots_used\": %d, \"n_slots\": %d, "
        "\"tg_bytes_h2d\": %llu, \"tg_bytes_d2h\": %llu, \"decode_bytes\": %llu, \"decode_bytes_routed\": %llu, "
        "\"host_read_gbs\": %.2f, \"device_gbs\": %.2f, \"h2d_gbs\": %.2f, \"tg_roofline_tok_s\": %.3f}\n",
        ef.model.c_str(), hp.arch.c_str(), eng.n_vocab(), eng.options().n_threads, ef.exact ? "true" : "false",
        eng.options().n_batch, a.n_prompt, pp_best, a.parallel, a.n_gen, a.tg_mode.c_str(), double(a.tg_temp), tg_best,
        model->weight_bytes(),
        seq.memory_bytes() * a.parallel, eng.workspace_bytes(), peak_rss, load_s,
        model->backend_name().c_str(), pp_cache.present ? std::to_string(pp_cache.hit_rate()).c_str() : "null",
        tg_cache.present ? std::to_string(tg_cache.hit_rate()).c_str() : "null", tg_cache.slots_used,
        tg_cache.n_slots, (unsigned long long)tg_cache.bytes_h2d, (unsigned long long)tg_cache.bytes_d2h,
        (unsigned long long)rl.traffic.total(), (unsigned long long)rl.traffic.routed, rl.host_gbs,
        rl.device.device_gbs, rl.device.h2d_gbs, rl.tok_s);
  } else {
    std::printf("model      %s (%s, %d layers, %d experts / %d used)\n", ef.model.c_str(),
                hp.arch.c_str(), hp.n_layer, hp.n_expert, hp.n_expert_used);
    std::printf("backend    %s\n", model->backend_name().c_str());
    std::printf("threads    %d   mode %s   batch %d   reps %d   warmup %d   tg-mode %s%s\n", eng.options().n_threads,
                ef.exact ? "exact" : "fast", eng.options().n_batch, a.reps, a.warmup, a.tg_mode.c_str(),
                a.tg_temp > 0.0f ? fmt::format(" (drawn at T {}, top-k {}, top-p {}, min-p {})", a.tg_temp, a.tg_top_k,
                                               a.tg_top_p, a.tg_min_p).c_str()
                                 : "");
    if (a.n_prompt > 0) std::printf("pp%-5d    %10.2f tok/s\n", a.n_prompt, pp_best);
    if (a.n_gen > 0 && a.parallel == 1) std::printf("tg%-5d    %10.2f tok/s\n", a.n_gen, tg_best);
    if (a.n_gen > 0 && a.parallel > 1)
      std::printf("tg%-5d    %10.2f tok/s in all, %d sequences (%.2f tok/s each)\n", a.n_gen, tg_best, a.parallel,
                  tg_best / a.parallel);
    if (pp_cache.present && a.n_prompt > 0) print_cache_report(pp_cache, model->backend_name(), "pp");
    if (tg_cache.present && a.n_gen > 0) print_cache_report(tg_cache, model->backend_name(), "tg");
    std::printf("memory     weights %.3f GiB (mapped), KV %.3f GiB, workspace %.3f GiB, peak RSS %.3f GiB\n",
                model->weight_bytes() / gib, seq.memory_bytes() * double(a.parallel) / gib, eng.workspace_bytes() / gib,
                peak_rss / gib);
    if (with_roofline) {
      const double mb = 1e6;
      std::printf("roofline   a decoded token reads %.1f MB of weights (dense %.1f, routed experts %.1f)\n",
                  rl.traffic.total() / mb, (rl.traffic.dense + rl.traffic.embedding) / mb, rl.traffic.routed / mb);
      if (tg_cache.present && rl.direct)
        std::printf("roofline   at the tg hit rate %.1f%%: %.1f MB from GPU memory (%.0f GB/s, d2d copy) + %.1f MB "
                    "from host memory (%.1f GB/s by the CPU + %.1f GB/s PCIe h2d: direct reads) -> %.1f tok/s\n",
                    100 * rl.hit_rate, rl.gpu_bytes / mb, rl.device.device_gbs, rl.host_bytes / mb, rl.host_gbs,
                    rl.device.h2d_gbs, rl.tok_s);
      else if (tg_cache.present)
        std::printf("roofline   at the tg hit rate %.1f%%: %.1f MB from GPU memory (%.0f GB/s, d2d copy) + %.1f MB "
                    "from host memory (%.1f GB/s) -> %.1f tok/s; PCIe h2d %.1f GB/s\n",
                    100 * rl.hit_rate, rl.gpu_bytes / mb, rl.device.device_gbs, rl.host_bytes / mb, rl.host_gbs,
                    rl.tok_s, rl.device.h2d_gbs);
      else
        std::printf("roofline   host memory %.1f GB/s (%d threads) -> %.1f tok/s\n", rl.host_gbs,
                    eng.options().n_threads, rl.tok_s);
      if (rl.tok_s > 0)
        std::printf("roofline   tg%d at %.1f%% of it\n", a.n_gen, 100 * tg_best / rl.tok_s);
    }
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
      app.add_option("--parallel", a->parallel,
                     "sequences decoded together in tg: each step one token for every one of them in one pass "
                     "(tok/s counts all their tokens)")
          ->capture_default_str();
      app.add_option("--tg-mode", a->tg_mode,
                     "how a tg step ends: logits (back to the host, as llama.cpp's driver), pick (a greedy pick on "
                     "the device), chain (device picks feeding the next step on the device, as strata run)")
          ->capture_default_str();
      app.add_option("--tg-temp", a->tg_temp,
                     "pick and chain: draw at this temperature (--tg-top-k, --tg-top-p, --tg-min-p; seed 1) instead "
                     "of the greedy pick; what a sampled decode step costs")
          ->capture_default_str();
      app.add_option("--tg-top-k", a->tg_top_k, "with --tg-temp: top-k (0: off)")->capture_default_str();
      app.add_option("--tg-top-p", a->tg_top_p, "with --tg-temp: top-p (1: off)")->capture_default_str();
      app.add_option("--tg-min-p", a->tg_min_p, "with --tg-temp: min-p (0: off)")->capture_default_str();
      app.add_option("-r,--reps", a->reps, "repetitions (best is reported)")->capture_default_str();
      app.add_option("--warmup", a->warmup, "unmeasured repetitions first (prefill and up to 4 decode steps)")
          ->capture_default_str();
      app.add_flag("--json", a->json, "one JSON line instead of the table");
      app.add_flag("--roofline,!--no-roofline", a->roofline,
                   "after the runs, measure host (and GPU) memory bandwidth and print the decode roofline: "
                   "weight bytes a token reads / bandwidth (on by default; about a second)");
      return [=] { return run_bench(*ef, *a); };
    });

}  // namespace
}  // namespace strata::cli
