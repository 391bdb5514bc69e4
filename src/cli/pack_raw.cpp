// `strata pack-raw -i manifest.json -o OUT.gguf`: builds the F16 qwen3moe GGUF from a training
// script's raw export (src/model/qwen3moe_pack.h; tools/train_demo/train.py writes it).
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/qwen3moe_pack.h"

namespace strata::cli {
namespace {

const CommandRegistrar reg(
    "pack-raw", "Build a qwen3moe F16 GGUF from a raw training export (manifest.json + blobs)",
    [](CLI::App& app) -> std::function<int()> {
      auto in = std::make_shared<std::string>();
      auto out = std::make_shared<std::string>();
      auto opt = std::make_shared<RawPackOptions>();
      app.add_option("-i,--manifest", *in, "manifest.json of the export")->required();
      app.add_option("-o,--output", *out, "GGUF file to write")->required();
      app.add_option("--name", opt->name, "general.name")->capture_default_str();
      app.add_option("--license", opt->license, "general.license");
      return [=] {
        const gguf::Writer w = pack_qwen3moe_raw(*in, *opt);
        w.write(*out);
        load_model(*out);  // the engine's loader re-checks every tensor
        std::printf("wrote %s (%zu tensors)\n", out->c_str(), w.n_tensors());
        return 0;
      };
    });

}  // namespace
}  // namespace strata::cli
