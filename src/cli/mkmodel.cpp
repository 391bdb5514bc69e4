// `strata mkmodel`: write a random-weight model of any geometry and format (benchmarks, tests).
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "model/synthetic.h"
#include "quant/quant_mix.h"

namespace strata::cli {
namespace {

const CommandRegistrar reg(
    "mkmodel", "Write a random-weight qwen3moe or qwen3next GGUF of any geometry and format",
    [](CLI::App& app) -> std::function<int()> {
      auto s = std::make_shared<SyntheticSpec>();
      auto out = std::make_shared<std::string>();
      auto preset = std::make_shared<std::string>();
      auto threads = std::make_shared<int>(0);
      app.add_option("-o,--output", *out, "output GGUF path")->required();
      app.add_option("--preset", *preset, "start from a geometry: qwen3-30b-a3b, tiny, qwen3-next-80b-a3b or tiny-qwen3next (flags below override)");
      app.add_option("--format", s->format, "a quantization scheme (" + quant_scheme_names() + ") or F32, F16, BF16")
          ->capture_default_str();
      app.add_flag("--pure", s->pure, "every quantizable tensor in the scheme's base type (no per-tensor mix)");
      app.add_option("--layers", s->n_layer, "block count")->capture_default_str();
      app.add_option("--embd", s->n_embd, "embedding length")->capture_default_str();
      app.add_option("--heads", s->n_head, "query heads")->capture_default_str();
      app.add_option("--kv-heads", s->n_head_kv, "KV heads")->capture_default_str();
      app.add_option("--head-dim", s->head_dim, "head size")->capture_default_str();
      app.add_option("--experts", s->n_expert, "experts per layer")->capture_default_str();
      app.add_option("--experts-used", s->n_expert_used, "experts per token")->capture_default_str();
      app.add_option("--expert-ff", s->n_ff_exp, "expert FFN length")->capture_default_str();
      app.add_option("--vocab", s->n_vocab, "vocabulary size (synthetic vocabulary)")->capture_default_str();
      app.add_option("--vocab-from", s->vocab_from, "copy the tokenizer from this GGUF (sets the vocabulary size)");
      app.add_flag("--repeat-layers", s->repeat_layers,
                   "layers after the first copy its random weights (fast to write, same speed)");
      app.add_flag("--tied", s->tied, "no output.weight: tie the output to the token embedding");
      app.add_option("--seed", s->seed, "random seed")->capture_default_str();
      app.add_option("--arch", s->arch, "qwen3moe or qwen3next")->capture_default_str();
      app.add_option("--shared-ff", s->n_ff_shexp, "qwen3next: shared expert FFN length")->capture_default_str();
      app.add_option("--rope-dims", s->n_rot, "qwen3next: rotary dims per head (0: all)")->capture_default_str();
      app.add_option("--full-attn-interval", s->full_attention_interval, "qwen3next: every n-th layer attends")->capture_default_str();
      app.add_option("--ssm-state", s->ssm_state, "qwen3next: GDN head size")->capture_default_str();
      app.add_option("--ssm-k-heads", s->ssm_k_heads, "qwen3next: GDN key heads")->capture_default_str();
      app.add_option("--ssm-v-heads", s->ssm_v_heads, "qwen3next: GDN value heads")->capture_default_str();
      app.add_option("--ssm-conv", s->ssm_conv_kernel, "qwen3next: conv kernel")->capture_default_str();
      app.add_option("-t,--threads", *threads, "threads (0: all cores)")->capture_default_str();
      CLI::App* appp = &app;
      return [=] {
        CLI::App& app = *appp;
        SyntheticSpec spec = *s;
        if (!preset->empty()) {
          // Re-apply the flags the user gave on top of the preset.
          spec.apply_preset(*preset);
          auto given = [&](const char* name) { return app.count(name) > 0; };
          if (given("--layers")) spec.n_layer = s->n_layer;
          if (given("--embd")) spec.n_embd = s->n_embd;
          if (given("--heads")) spec.n_head = s->n_head;
          if (given("--kv-heads")) spec.n_head_kv = s->n_head_kv;
          if (given("--head-dim")) spec.head_dim = s->head_dim;
          if (given("--experts")) spec.n_expert = s->n_expert;
          if (given("--experts-used")) spec.n_expert_used = s->n_expert_used;
          if (given("--expert-ff")) spec.n_ff_exp = s->n_ff_exp;
          if (given("--vocab")) spec.n_vocab = s->n_vocab;
          if (given("--arch")) spec.arch = s->arch;
          if (given("--shared-ff")) spec.n_ff_shexp = s->n_ff_shexp;
          if (given("--rope-dims")) spec.n_rot = s->n_rot;
          if (given("--full-attn-interval")) spec.full_attention_interval = s->full_attention_interval;
          if (given("--ssm-state")) spec.ssm_state = s->ssm_state;
          if (given("--ssm-k-heads")) spec.ssm_k_heads = s->ssm_k_heads;
          if (given("--ssm-v-heads")) spec.ssm_v_heads = s->ssm_v_heads;
          if (given("--ssm-conv")) spec.ssm_conv_kernel = s->ssm_conv_kernel;
        }
        ThreadPool pool(*threads);
        auto t0 = std::chrono::steady_clock::now();
        write_synthetic_model(spec, *out, pool);
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "strata: wrote %s (%s, %u layers, %.2f B parameters) in %.1f s\n",
                     out->c_str(), spec.format.c_str(), spec.n_layer, spec.weight_count() / 1e9, sec);
        return 0;
      };
    });

}  // namespace
}  // namespace strata::cli
