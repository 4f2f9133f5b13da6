// The command registry of the daisychain binary. Each cmd_*.cc defines one subcommand and
// registers it with a static DAISY_REGISTER_COMMAND; main() builds the CLI11 app from the
// registry. Not thread-safe (used only during start-up).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace daisy::cli {

// Adds the subcommand to `app` and returns a function that runs it (after parsing) and
// returns the process exit code.
using CommandSetup = std::function<std::function<int()>(CLI::App& app)>;

struct CommandEntry {
  std::string name;
  int order;  // position in --help
  CommandSetup setup;
};

std::vector<CommandEntry>& CommandRegistry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, int order, CommandSetup setup) {
    CommandRegistry().push_back({std::move(name), order, std::move(setup)});
  }
};

// Prints "error: <message>" to stderr (redacted) and returns the exit code for the error.
int ReportError(const std::string& message, int exit_code = 1);

}  // namespace daisy::cli

#define DAISY_REGISTER_COMMAND(name, order, setup) \
  static ::daisy::cli::CommandRegistrar daisy_cmd_registrar_##name(#name, order, setup)
