// llama.cpp baseline on the GPU: the prebuilt llama.cpp of the npm package node-llama-cpp 3.21.1
// (@node-llama-cpp/linux-x64-cuda: CUDA 13 libraries; the same llama.cpp commit, 80fb11a, that made the
// fixtures), driven through llama.h by this small program, so a device machine without node runs it. The
// protocol is bench/llama/llama_bench.mjs's (and `strata bench`'s): ppN = N pseudo-random tokens from an
// empty context in one batch (the last token's logits only); tgN = N tokens generated greedily one at a
// time from a one-token prompt (every step computes the logits and takes their argmax on the host, as any
// llama.cpp application does). Built by bench/llama/build-llama-decode against the header of that commit
// (scripts/llama-cuda-pack says where both come from).
//
// Usage: llama_decode MODEL.gguf --backends DIR [-p 512] [-n 128] [-r 3] [-t THREADS] [--ngl 999]
//                     [--cpu-moe-layers L] [--fa 0|1|-1]
//   --backends DIR        where libggml-cuda.so and libggml-cpu-*.so are (ggml loads its backends from it)
//   --cpu-moe-layers L    the expert tensors (ffn_{gate,up,down}_exps) of layers 0..L-1 stay in host memory
//                         and run on the CPU (llama.cpp's --n-cpu-moe L)
// Prints one line per repetition and a JSON line with the medians.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "llama_decode: %s\n", what);
  std::exit(2);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The same LCG as llama_bench.mjs (ids below the vocabulary size; they need not equal strata's).
struct Lcg {
  uint64_t s = 1234;
  llama_token next(int32_t vocab) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return llama_token((s >> 33) % uint64_t(vocab));
  }
};

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  const char* model_path = nullptr;
  const char* backends = nullptr;
  int pp = 512, tg = 128, reps = 3, ngl = 999, cpu_moe = 0, fa = -1;
  int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto num = [&](int& out) {
      if (i + 1 >= argc) die(("missing value after " + a).c_str());
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < -1 || v > 1000000) die(("bad value for " + a).c_str());
      out = int(v);
    };
    if (a == "-p") num(pp);
    else if (a == "-n") num(tg);
    else if (a == "-r") num(reps);
    else if (a == "-t") num(threads);
    else if (a == "--ngl") num(ngl);
    else if (a == "--cpu-moe-layers") num(cpu_moe);
    else if (a == "--fa") num(fa);
    else if (a == "--backends") {
      if (i + 1 >= argc) die("missing value after --backends");
      backends = argv[++i];
    } else if (!a.empty() && a[0] != '-' && !model_path) model_path = argv[i];
    else die(("unknown argument " + a).c_str());
  }
  if (!model_path || !backends || pp < 0 || tg < 0 || reps < 1 || threads < 1 || cpu_moe < 0)
    die("usage: llama_decode MODEL.gguf --backends DIR [-p N] [-n N] [-r N] [-t N] [--ngl N] "
        "[--cpu-moe-layers L] [--fa 0|1|-1]");

  llama_log_set(quiet_log, nullptr);
  ggml_backend_load_all_from_path(backends);
  llama_backend_init();

  // --cpu-moe-layers: one override a layer, the CPU's own buffer type (what --n-cpu-moe does).
  std::vector<std::string> patterns;
  std::vector<llama_model_tensor_buft_override> overrides;
  if (cpu_moe > 0) {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu) die("no CPU backend in --backends");
    for (int l = 0; l < cpu_moe; ++l) patterns.push_back("blk\\." + std::to_string(l) + "\\.ffn_(up|down|gate)_exps");
    for (const auto& p : patterns) overrides.push_back({p.c_str(), ggml_backend_dev_buffer_type(cpu)});
    overrides.push_back({nullptr, nullptr});
  }
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = ngl;
  if (!overrides.empty()) mp.tensor_buft_overrides = overrides.data();
  const double t_load = now_s();
  llama_model* model = llama_model_load_from_file(model_path, mp);
  if (!model) die("cannot load the model");
  std::fprintf(stderr, "loaded in %.1f s\n", now_s() - t_load);
  const int32_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(std::max(pp, tg) + 16);
  cp.n_batch = uint32_t(std::max(pp, 1));
  cp.n_ubatch = uint32_t(std::max(pp, 1));
  cp.n_seq_max = 1;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.flash_attn_type = fa < 0 ? LLAMA_FLASH_ATTN_TYPE_AUTO : fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                                                                  : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("cannot create the context");
  llama_memory_t mem = llama_get_memory(ctx);

  Lcg rng;
  auto argmax = [&]() {
    const float* logits = llama_get_logits_ith(ctx, -1);
    if (!logits) die("no logits");
    return llama_token(std::max_element(logits, logits + vocab) - logits);
  };
  auto run_pp = [&]() {
    llama_memory_clear(mem, true);
    std::vector<llama_token> toks(static_cast<size_t>(pp));
    for (auto& t : toks) t = rng.next(vocab);
    const double t0 = now_s();
    if (llama_decode(ctx, llama_batch_get_one(toks.data(), int32_t(toks.size()))) != 0) die("decode failed (pp)");
    argmax();
    llama_synchronize(ctx);
    return pp / (now_s() - t0);
  };
  auto run_tg = [&](int n) {
    llama_memory_clear(mem, true);
    llama_token tok = rng.next(vocab);
    const double t0 = now_s();
    for (int i = 0; i < n; ++i) {
      if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) die("decode failed (tg)");
      tok = argmax();
    }
    llama_synchronize(ctx);
    return n / (now_s() - t0);
  };
  // Warm-up (llama-bench's): one short run of each, not timed.
  if (pp > 0) run_pp();
  if (tg > 0) run_tg(std::min(tg, 8));
  std::vector<double> pps, tgs;
  for (int r = 0; r < reps; ++r) {
    if (pp > 0) pps.push_back(run_pp());
    if (tg > 0) tgs.push_back(run_tg(tg));
    std::printf("rep %d  pp%d %.2f tok/s  tg%d %.2f tok/s\n", r + 1, pp, pp > 0 ? pps.back() : 0.0, tg,
                tg > 0 ? tgs.back() : 0.0);
  }
  std::printf("{\"engine\": \"llama.cpp (node-llama-cpp 3.21.1 prebuilt, via llama.h)\", \"model\": \"%s\", "
              "\"ngl\": %d, \"cpu_moe_layers\": %d, \"threads\": %d, \"pp\": %d, \"pp_tok_s\": %.2f, \"tg\": %d, "
              "\"tg_tok_s\": %.2f, \"reps\": %d}\n",
              model_path, ngl, cpu_moe, threads, pp, median(pps), tg, median(tgs), reps);
  std::fflush(stdout);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
