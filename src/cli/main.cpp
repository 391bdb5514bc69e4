// `strata` entry point: builds the CLI11 app from the registered subcommands and runs one.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "common/error.h"

namespace strata::cli {
std::vector<CommandInfo>& command_registry() {
  static std::vector<CommandInfo> registry;
  return registry;
}
}  // namespace strata::cli

int main(int argc, char** argv) {
  using namespace strata::cli;
  CLI::App app{"strata: Mixture-of-Experts inference engine (GGUF, CPU + CUDA)"};
  app.set_version_flag("--version", STRATA_VERSION);
  app.require_subcommand(1);

  auto& reg = command_registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::function<int()> action;
  std::vector<std::pair<CLI::App*, std::function<int()>>> actions;
  for (auto& c : reg) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    actions.emplace_back(sub, c.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, act] : actions)
      if (sub->parsed()) return act();
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: internal error: %s\n", e.what());
    return 2;
  }
  return 1;
}
