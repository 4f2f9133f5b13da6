// daisychain id: this device's key fingerprint (what the host compares when it approves).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "daisy/net.h"
#include "daisy/node.h"
#include "daisy/ring.h"

namespace daisy::cli {
namespace {

struct IdFlags {
  std::string role = "node";
};

int RunId(const IdFlags& f) {
  const std::string home = DeviceHome();
  auto keys = DeviceKeys(home, f.role);
  if (!keys.ok()) return ReportError(keys.status().message());
  std::printf("%s\n", net::Fingerprint(keys->public_key).c_str());
  std::fprintf(stderr, "role %s, key pair in %s\n", f.role.c_str(), DeviceKeyPath(home, f.role).c_str());
  return 0;
}

}  // namespace

DAISY_REGISTER_COMMAND(id, 95, [](CLI::App& app) -> std::function<int()> {
  auto f = std::make_shared<IdFlags>();
  auto* sub = app.add_subcommand("id",
                                 "Print this device's key fingerprint (made on first use and kept in DAISY_HOME); the "
                                 "host approves a device by it");
  sub->add_option("--role", f->role,
                  "Which identity: node (default), head (run), serve, serve-head, rendezvous (the server key serve "
                  "prints)");
  return [f] { return RunId(*f); };
});

}  // namespace daisy::cli
