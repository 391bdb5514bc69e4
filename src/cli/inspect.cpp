// `strata inspect MODEL.gguf [--json]`: what a GGUF file holds (architecture, hyper-parameters,
// tokenizer, tensors, totals by type, expert bytes per layer). The file is fully validated first.
#include <cstdio>

#include "cli/command.h"
#include "gguf/gguf.h"
#include "gguf/summary.h"

namespace strata::cli {
namespace {

struct InspectOptions {
  std::string model;
  bool json = false;
};

CommandRegistrar reg_inspect(
    "inspect", "Show a GGUF file's architecture, hyper-parameters, tokenizer, tensors and expert sizes",
    [](CLI::App& sub) -> std::function<int()> {
      auto opt = std::make_shared<InspectOptions>();
      sub.add_option("model", opt->model, "GGUF file")->required();
      sub.add_flag("--json", opt->json, "Print one JSON document (stable field names, see README)");
      return [opt]() {
        const gguf::File f = gguf::File::open(opt->model);
        const nlohmann::json s = gguf::summarize(f);
        const std::string out = opt->json ? gguf::dump_json(s) + "\n" : gguf::render_text(s);
        std::fwrite(out.data(), 1, out.size(), stdout);
        return 0;
      };
    });

}  // namespace
}  // namespace strata::cli
