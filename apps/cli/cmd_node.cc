// daisychain node: a device that takes a slice of the model.
#include <CLI/CLI.hpp>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "daisy/kernels.h"
#include "daisy/net.h"
#include "daisy/node.h"
#include "faults.h"
#include "ring_common.h"

namespace daisy::cli {
namespace {

struct NodeFlags {
  std::string join;
  std::string room = "default";
  std::string name;
  std::string host = "127.0.0.1";
  int port = 0;
  std::string advertise;
  std::string server_key;
  bool no_cache = false;
  std::vector<std::string> models_dirs;
  std::string max_memory;
  int threads = 0;
};

int RunNodeCommand(const NodeFlags& f) {
  auto addr = net::JoinAddress(f.join);
  if (!addr.ok()) return ReportError(addr.status().message(), 2);
  auto budget = ParseMaxMemory(f.max_memory);
  if (!budget.ok()) return ReportError(budget.status().message(), 2);
  InstallStopSignals();
  if (f.threads > 0) kernels::SetThreads(f.threads);  // before the capacity the hello reports is measured
  NodeOptions o;
  o.max_memory = *budget;
  o.rendezvous = *addr;
  o.room = f.room;
  o.name = f.name;
  o.bind_host = f.host;
  o.port = f.port;
  o.advertise = f.advertise;
  o.server_key = f.server_key;
  o.hub.use_cache = !f.no_cache;
  o.hub.cache_dir = DeviceCacheDir();
  o.hub.progress = TerminalProgressBar("layers");
  o.stop = &StopRequested();
  o.models_dirs = f.models_dirs;
  o.faults = ProcessNodeFaults();
  Status st = RunNode(o);
  if (!st.ok()) return ReportError(st.message());
  return 0;
}

}  // namespace

DAISY_REGISTER_COMMAND(node, 70, [](CLI::App& app) -> std::function<int()> {
  auto f = std::make_shared<NodeFlags>();
  auto* sub = app.add_subcommand("node", "Join a room as a device that holds a slice of the model (runs until Ctrl-C)");
  sub->add_option("--join", f->join, "HOST:PORT of `daisychain serve`")->required();
  sub->add_option("--room", f->room, "Room code (default: default)");
  sub->add_option("--name", f->name, "Name shown to the others (default: the host name)");
  sub->add_option("--server-key", f->server_key,
                  "Fingerprint of the server's key, as `daisychain serve` prints it; without it the key is trusted on "
                  "first use and remembered in DAISY_HOME");
  sub->add_option("--host", f->host, "Address the other devices reach this one at (default 127.0.0.1)");
  sub->add_option("--port", f->port, "Port of this device's inbox (default: any free port)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--advertise", f->advertise,
                  "HOST:PORT the other devices are told to send to, when it differs from --host and --port (a relay "
                  "or port forward)");
  sub->add_option("--models-dir", f->models_dirs,
                  "A local folder a head may have this device open models under (repeatable); without it, only Hub "
                  "repo ids. A path outside every such folder (symlinks and .. resolved) is refused, unread")
      ->allow_extra_args(false);
  sub->add_flag("--no-cache", f->no_cache, "Do not use the on-disk slice cache");
  AddMaxMemoryFlag(sub, f->max_memory);
  sub->add_option("--threads", f->threads, "Kernel threads (default: all cores)")->check(CLI::Range(1, 1024));
  return [f] { return RunNodeCommand(*f); };
});

}  // namespace daisy::cli
