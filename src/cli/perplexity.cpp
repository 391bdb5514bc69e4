// `strata perplexity -m MODEL -f TEXT [--ctx N] [--chunks N] [--json]`: perplexity of a text file
// under the model (chunking and scoring: src/engine/perplexity.h).
#include <cmath>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/text_input.h"
#include "engine/perplexity.h"

namespace strata::cli {
namespace {

int run_perplexity(const EngineFlags& ef, const std::string& path, int64_t max_chunks, bool json) {
  std::shared_ptr<const Model> model = load_model_for(ef);
  const std::vector<int32_t> ids = tokenize_file(*model, path);
  const int32_t ctx = ef.n_ctx > 0 ? ef.n_ctx : std::min<int32_t>(512, model->hparams().n_ctx_train);
  EngineOptions o = ef.options(ctx);
  Engine eng(model, o);
  const PerplexityResult r = perplexity(eng, ids, ctx, max_chunks);
  if (json) {
    nlohmann::json j = {{"model", ef.model},       {"file", path},          {"tokens", ids.size()},
                        {"ctx", r.n_ctx},          {"chunks", r.n_chunks},  {"scored", r.n_scored},
                        {"nll_sum", r.nll_sum},    {"ppl", r.ppl()},        {"stderr_nll", r.stderr_nll()},
                        {"chunk_nll", r.chunk_nll}};
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }
  std::printf("%zu tokens, %lld chunks of %d, %lld positions scored\n", ids.size(),
              static_cast<long long>(r.n_chunks), r.n_ctx, static_cast<long long>(r.n_scored));
  double run = 0;
  for (size_t c = 0; c < r.chunk_nll.size(); ++c) {
    run += r.chunk_nll[c];
    std::printf("[%zu]%.4f%s", c + 1, std::exp(run / double((c + 1) * size_t(r.n_ctx - 1))),
                (c + 1) % 8 == 0 || c + 1 == r.chunk_nll.size() ? "\n" : ",");
  }
  const double se = r.stderr_nll() * r.ppl();
  std::printf("PPL = %.4f +/- %.4f (mean NLL %.5f nats)\n", r.ppl(), se,
              r.nll_sum / double(r.n_scored));
  return 0;
}

const CommandRegistrar reg(
    "perplexity", "Perplexity of a text file (non-overlapping chunks of --ctx tokens)",
    [](CLI::App& app) -> std::function<int()> {
      auto ef = std::make_shared<EngineFlags>();
      auto file = std::make_shared<std::string>();
      auto chunks = std::make_shared<int64_t>(0);
      auto json = std::make_shared<bool>(false);
      ef->add(app, 512);
      app.add_option("-f,--file", *file, "text file")->required();
      app.add_option("--chunks", *chunks, "evaluate at most N chunks (0: all)")->capture_default_str();
      app.add_flag("--json", *json, "print the result as JSON (with each chunk's NLL)");
      return [=] { return run_perplexity(*ef, *file, *chunks, *json); };
    });

}  // namespace
}  // namespace strata::cli
