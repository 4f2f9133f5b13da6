// daisychain: the only main(). Parses arguments and composes modules; every subcommand is
// in its own cmd_*.cc (see commands.h).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <map>

#include "commands.h"
#include "daisy/log.h"

namespace daisy::cli {

std::vector<CommandEntry>& CommandRegistry() {
  static std::vector<CommandEntry> registry;
  return registry;
}

int ReportError(const std::string& message, int exit_code) {
  std::string line = Redact(message);
  std::fprintf(stderr, "error: %s\n", line.c_str());
  return exit_code;
}

}  // namespace daisy::cli

int main(int argc, char** argv) {
  using daisy::cli::CommandRegistry;
  CLI::App app{"daisychain: run one language model across several devices, bit-exactly"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "daisychain 0.1.0");
  auto entries = CommandRegistry();
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.order < b.order; });
  std::map<CLI::App*, std::function<int()>> runners;
  for (auto& e : entries) {
    auto run = e.setup(app);
    CLI::App* sub = app.get_subcommand(e.name);
    runners[sub] = std::move(run);
  }
  CLI11_PARSE(app, argc, argv);
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) return run();
  }
  return 2;
}
