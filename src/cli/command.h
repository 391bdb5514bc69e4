#pragma once
// Subcommand registry. Each src/cli/<name>.cpp defines one subcommand and registers it with a static
// CommandRegistrar; main.cpp knows none of them by name. (The CLI sources are linked straight into the
// executable, not a static library, so the registrars are never dropped by the linker.)
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace strata::cli {

// setup() adds options to `sub` and returns the action to run when the subcommand is chosen.
// The action returns the process exit code.
using CommandSetup = std::function<std::function<int()>(CLI::App& sub)>;

struct CommandInfo {
  std::string name;
  std::string description;
  CommandSetup setup;
};

std::vector<CommandInfo>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string description, CommandSetup setup) {
    command_registry().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

}  // namespace strata::cli
