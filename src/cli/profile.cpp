// `strata profile -m MODEL -f TEXT [--ctx N] [--json OUT]`: runs the text through the model and
// counts which experts the router picks in every MoE layer (src/moe/expert_usage.h): per layer the
// counts, the entropy of the choice and the share of selections served by the top 25% of experts.
// --json writes the reloadable usage file the GPU expert cache reads.
#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/text_input.h"
#include "moe/expert_usage.h"

namespace strata::cli {
namespace {

int run_profile(const EngineFlags& ef, const std::string& path, const std::string& json_out,
                bool counts) {
  std::shared_ptr<const Model> model = load_model_for(ef);
  const HParams& hp = model->hparams();
  STRATA_REQUIRE(hp.arch == "qwen3moe" || hp.arch == "qwen3next",
                 "profile: {} is a {} model; expert usage is counted for qwen3moe and qwen3next", ef.model, hp.arch);
  const std::vector<int32_t> ids = tokenize_file(*model, path);
  const int32_t ctx = ef.n_ctx > 0 ? ef.n_ctx : std::min<int32_t>(512, hp.n_ctx_train);
  moe::ExpertUsage usage(model->routed_layers(), hp.n_expert, hp.n_expert_used);
  EngineOptions o = ef.options(ctx);
  o.usage = &usage;
  Engine eng(model, o);
  auto seq = eng.new_sequence();
  // the text in chunks of ctx tokens, each from an empty context (the tail chunk may be shorter)
  for (size_t b = 0; b < ids.size(); b += size_t(ctx)) {
    seq->reset();
    const size_t n = std::min(ids.size() - b, size_t(ctx));
    eng.prefill(*seq, std::span<const int32_t>(ids).subspan(b, n), nullptr);
  }
  std::printf("%zu tokens, %d layers, %d experts (%d used per token)\n", ids.size(), usage.n_layer(),
              hp.n_expert, hp.n_expert_used);
  std::printf("layer  entropy(bits)  /max   top25%%  unused  most used\n");
  double sum_top = 0, sum_norm = 0;
  for (int l = 0; l < usage.n_layer(); ++l) {
    const moe::LayerUsageStats s = usage.layer_stats(l);
    sum_top += s.top25_share;
    sum_norm += s.entropy_norm;
    std::printf("%5d  %13.3f  %5.3f  %6.1f%%  %6d  ", l, s.entropy_bits, s.entropy_norm,
                100.0 * s.top25_share, s.n_unused);
    for (size_t i = 0; i < s.ranking.size() && i < 4; ++i)
      std::printf("%s%d(%.1f%%)", i ? " " : "", s.ranking[i],
                  s.selections ? 100.0 * double(usage.count(l, s.ranking[i])) / double(s.selections) : 0.0);
    std::printf("\n");
    if (counts) {
      std::printf("       counts:");
      for (int e = 0; e < hp.n_expert; ++e) std::printf(" %lld", static_cast<long long>(usage.count(l, e)));
      std::printf("\n");
    }
  }
  std::printf("mean   entropy/max %.3f, top 25%% of experts serve %.1f%% (uniform: %.1f%%)\n",
              sum_norm / usage.n_layer(), 100.0 * sum_top / usage.n_layer(),
              100.0 * double((hp.n_expert + 3) / 4) / double(hp.n_expert));
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    STRATA_REQUIRE(f, "cannot open {} for writing", json_out);
    f << usage.to_json() << "\n";
    f.close();
    STRATA_REQUIRE(f, "writing {} failed", json_out);
    std::printf("wrote %s\n", json_out.c_str());
  }
  return 0;
}

const CommandRegistrar reg(
    "profile", "Per-layer expert usage of a MoE model on a text (counts, entropy, top-25% share)",
    [](CLI::App& app) -> std::function<int()> {
      auto ef = std::make_shared<EngineFlags>();
      auto file = std::make_shared<std::string>();
      auto json = std::make_shared<std::string>();
      auto counts = std::make_shared<bool>(false);
      ef->add(app, 512);
      app.add_option("-f,--file", *file, "text file")->required();
      app.add_option("--json", *json, "write the usage (reloadable JSON) to this file");
      app.add_flag("--counts", *counts, "print every expert's count");
      return [=] { return run_profile(*ef, *file, *json, *counts); };
    });

}  // namespace
}  // namespace strata::cli
