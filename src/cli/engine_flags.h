#pragma once
// Flags shared by the subcommands that run a model (run, eval, bench, perplexity, profile, serve): model
// path, context, batch, threads, exact mode, KV type, the backend (cpu or cuda) and its GPU flags; and the
// sampling flags of run. load_model_for() (cli/backend.cpp) loads the model on the chosen backend. Header-only: each subcommand file
// includes it and adds the flags to its own CLI11 app.
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "common/error.h"
#include "engine/engine.h"
#include "engine/sampling.h"

namespace strata::cli {

struct EngineFlags {
  std::string model;
  int32_t n_ctx = 0;  // 0: the subcommand picks (run: 4096 or the model's; eval: what it needs)
  int32_t n_batch = 512;
  int n_threads = 0;
  bool exact = false;
  std::string kv_type = "f32";
  std::string attn = "auto";
  // backend
  std::string backend = "cpu";
  int gpu = 0;
  std::string expert_cache = "auto";
  double vram_budget_gib = 0;
  int64_t vram_reserve_mib = 1024;
  std::string expert_profile;
  int adapt_every = 32;
  int stream_slots = -1;
  std::string decode_stream = "off";
  std::string prefill_stream = "fixed";
  std::string decode_direct = "0.375";
  int32_t ctx_hint = 4096;  // the subcommand's default context (sizes --expert-cache auto)
  int kv_sequences = 1;     // sequences the subcommand keeps at once (serve: --parallel)

  void add(CLI::App& app, int32_t default_ctx_hint = 4096) {
    ctx_hint = default_ctx_hint > 0 ? default_ctx_hint : 4096;
    app.add_option("-m,--model", model, "GGUF model file")->required();
    app.add_option("--ctx", n_ctx, "context size in tokens (KV cache allocated up front)")
        ->default_str(std::to_string(default_ctx_hint));
    app.add_option("--batch", n_batch, "tokens per forward pass during prefill")->capture_default_str();
    app.add_option("-t,--threads", n_threads, "CPU threads (0: all cores)")->capture_default_str();
    app.add_flag("--exact", exact, "exact f32 math: weights dequantized to f32, f32 activations");
    app.add_option("--kv-type", kv_type, "KV cache type: f32 or f16")->capture_default_str();
    app.add_option("--attn", attn,
                   "attention arithmetic: ggml (llama.cpp's flash attention: f16 K/V/accumulator, "
                   "what the references use), f32, or auto (ggml on the CPU and with --exact; f32 on the "
                   "GPU otherwise, where the ggml emulation walks positions one by one and is slow)")
        ->capture_default_str();
    app.add_option("--backend", backend, "cpu, or cuda (GPU with an expert cache; the CPU runs the experts "
                   "that are not resident)")
        ->capture_default_str();
    app.add_option("--gpu", gpu, "GPU ordinal for --backend cuda")->capture_default_str();
    app.add_option("--expert-cache", expert_cache,
                   "GPU expert-cache slots: N, N% of all experts, or auto (what fits in --vram-budget after "
                   "dense weights, KV, workspace and --vram-reserve-mib)")
        ->capture_default_str();
    app.add_option("--vram-budget", vram_budget_gib, "GiB of GPU memory strata may use (0: all free memory)")
        ->capture_default_str();
    app.add_option("--vram-reserve-mib", vram_reserve_mib, "MiB of GPU memory --expert-cache auto leaves free")
        ->capture_default_str();
    app.add_option("--expert-profile", expert_profile,
                   "expert-usage JSON from `strata profile`: which experts start resident (default: spread evenly)");
    app.add_option("--adapt-every", adapt_every,
                   "forward passes between expert-cache adaptations (hot experts replace cold ones; 0: off)")
        ->capture_default_str();
    app.add_option("--stream-slots", stream_slots,
                   "GPU staging slots for streaming non-resident experts into prefill passes (-1: one layer's "
                   "experts when some are not resident; 0: off; see docs/expert_cache.md)");
    app.add_option("--decode-stream", decode_stream,
                   "decode passes with staging slots: the share of a layer's non-resident experts copied to the "
                   "GPU while the CPU pool runs the rest: off, auto (balance the measured copy and CPU costs; "
                   "helps where the CPU pool leaves host memory bandwidth unused), or a share in [0, 1]")
        ->capture_default_str();
    app.add_option("--decode-direct", decode_direct,
                   "decode passes with non-resident experts: the share of each token's non-resident experts the GPU "
                   "reads straight from pinned host memory over PCIe while the CPU pool runs the rest: off or a "
                   "share in [0, 1] (see docs/expert_cache.md)")
        ->capture_default_str();
    app.add_option("--prefill-stream", prefill_stream,
                   "prefill passes with staging slots: which non-resident experts with enough pairs are copied to "
                   "the GPU: fixed (all, up to the staging slots) or auto (as many as balance the measured copy "
                   "time against the CPU pool's time for the rest; timing-dependent)")
        ->capture_default_str();
  }

  EngineOptions options(int32_t n_ctx_default) const {
    EngineOptions o;
    o.n_ctx = n_ctx > 0 ? n_ctx : n_ctx_default;
    STRATA_REQUIRE(n_ctx >= 0, "--ctx must be >= 1, got {}", n_ctx);
    o.n_batch = n_batch;
    o.n_threads = n_threads;
    STRATA_REQUIRE(n_threads >= 0, "--threads must be >= 0, got {}", n_threads);
    o.mode = exact ? MatmulMode::Exact : MatmulMode::Fast;
    if (kv_type == "f32")
      o.kv_type = KvType::F32;
    else if (kv_type == "f16")
      o.kv_type = KvType::F16;
    else
      fail("--kv-type must be f32 or f16, got '{}'", kv_type);
    if (attn == "auto")
      o.attn = backend == "cuda" && !exact ? cpu::AttnMath::F32 : cpu::AttnMath::GgmlF16;
    else if (attn == "ggml")
      o.attn = cpu::AttnMath::GgmlF16;
    else if (attn == "f32")
      o.attn = cpu::AttnMath::F32;
    else
      fail("--attn must be auto, ggml or f32, got '{}'", attn);
    return o;
  }
};

struct SamplingFlags {
  SamplingParams p;
  bool greedy = false;
  int64_t seed = -1;
  void add(CLI::App& app) {
    app.add_option("--temp", p.temperature, "temperature (<= 0: greedy)")->capture_default_str();
    app.add_flag("--greedy", greedy, "always pick the most likely token (same as --temp 0)");
    app.add_option("--top-k", p.top_k, "keep the k most likely tokens (0: off)")->capture_default_str();
    app.add_option("--top-p", p.top_p, "keep the smallest set reaching probability p (1: off)")
        ->capture_default_str();
    app.add_option("--min-p", p.min_p, "drop tokens below min-p x the best one's probability (0: off)")
        ->capture_default_str();
    app.add_option("--repeat-penalty", p.repeat_penalty, "penalty for repeated tokens (1: off)")
        ->capture_default_str();
    app.add_option("--repeat-last-n", p.repeat_last_n, "window of the penalties (-1: all, 0: off)")
        ->capture_default_str();
    app.add_option("--presence-penalty", p.presence_penalty, "subtracted once per repeated token")
        ->capture_default_str();
    app.add_option("--frequency-penalty", p.frequency_penalty, "subtracted per repetition")
        ->capture_default_str();
    app.add_option("-s,--seed", seed, "random seed (-1: from the clock)")->capture_default_str();
  }
  SamplingParams params() const {
    SamplingParams q = p;
    if (greedy) q.temperature = 0.0f;
    q.seed = seed >= 0 ? static_cast<uint64_t>(seed)
                       : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    q.validate();
    return q;
  }
};

// Loads ef.model on ef.backend (cli/backend.cpp): cpu -> load_model; cuda -> the CUDA backend, or a
// clear error when strata was built without CUDA.
std::shared_ptr<const Model> load_model_for(const EngineFlags& ef);

// "expert cache: decode hit rate 87.5% (...), slots 96/192 used, moved h2d 1.2 GiB d2h 3.4 MiB" on stderr
// when the model has an expert cache (nothing on the CPU backend). `what` names the phase.
void print_cache_report(const ExpertCacheReport& r, const std::string& backend, const char* what);
inline void print_cache_report(const Model& m, const char* what) {
  print_cache_report(m.cache_report(), m.backend_name(), what);
}

// Peak resident memory of this process (VmHWM), bytes; 0 when unknown.
inline uint64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

}  // namespace strata::cli
