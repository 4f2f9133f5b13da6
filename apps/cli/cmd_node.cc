// daisychain node: a device that takes a slice of the model.
#include <CLI/CLI.hpp>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "daisy/kernels.h"
#include "daisy/net.h"
#include "daisy/node.h"
#include "daisy/ring.h"
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
  bool no_listen = false;
  std::string server_key;
  bool no_cache = false;
  bool no_show_tokens = false;
  std::vector<std::string> models_dirs;
  std::string max_memory;
  int threads = 0;
  double discover_s = 5;
  // Set after parsing: whether --room and --host were given (a found room fills them otherwise).
  const CLI::Option* room_opt = nullptr;
  const CLI::Option* host_opt = nullptr;
};

// No --join: listen for serve's announcements on the LAN and take the only room (or the one
// --room names). The announced fingerprint becomes --server-key, so the key the HTTP join
// fetches must be the announced one; the host still approves this device as always.
Status Discover(NodeFlags& f) {
  const bool room_given = f.room_opt && f.room_opt->count() > 0;
  std::fprintf(stderr, "no --join: listening %.0f s for rooms announced on this network (UDP %s:%d)\n", f.discover_s,
               kDiscoveryGroup, kDiscoveryPort);
  auto found = ListenForRooms(f.discover_s, &StopRequested());
  if (!found.ok())
    return InvalidArgument(found.status().message() + "; pass --join HOST:PORT as `daisychain serve` prints it");
  for (const auto& a : *found)
    std::fprintf(stderr, "  found room '%s' at %s:%d, server key %s\n", a.room.c_str(), a.address.c_str(), a.port,
                 a.fingerprint.c_str());
  auto pick = ChooseRoom(*found, room_given ? f.room : "");
  if (!pick.ok()) return pick.status();
  if (!f.server_key.empty()) {
    auto want = net::NormalizeFingerprint(f.server_key);
    auto got = net::NormalizeFingerprint(pick->fingerprint);
    if (!want.ok()) return want.status();
    if (!got.ok() || got->rfind(*want, 0) != 0)
      return InvalidArgument("the room found announces server key " + pick->fingerprint + ", not --server-key " +
                             f.server_key);
  }
  f.join = pick->address + ":" + std::to_string(pick->port);
  f.room = pick->room;
  f.server_key = pick->fingerprint;
  // Peers on that network must reach this device's inbox: listen on the address this machine
  // reaches the server from, unless --host says otherwise.
  if (!(f.host_opt && f.host_opt->count() > 0)) {
    const std::string local = LocalAddressTowards(pick->address);
    if (!local.empty()) f.host = local;
  }
  std::fprintf(stderr, "joining room '%s' at %s (server key %s must match), inbox on %s\n", f.room.c_str(),
               f.join.c_str(), f.server_key.c_str(), f.host.c_str());
  return Status();
}

int RunNodeCommand(NodeFlags f) {
  InstallStopSignals();
  if (f.join.empty()) {
    Status st = Discover(f);
    if (!st.ok()) return ReportError(st.message(), 2);
  }

  auto addr = net::JoinAddress(f.join);
  if (!addr.ok()) return ReportError(addr.status().message(), 2);
  if (f.no_listen && (f.port != 0 || !f.advertise.empty()))
    return ReportError("--no-listen binds no port: --port and --advertise do not apply", 2);
  auto budget = ParseMaxMemory(f.max_memory);
  if (!budget.ok()) return ReportError(budget.status().message(), 2);
  if (f.threads > 0) kernels::SetThreads(f.threads);  // before the capacity the hello reports is measured
  NodeOptions o;
  o.max_memory = *budget;
  o.rendezvous = *addr;
  o.room = f.room;
  o.name = f.name;
  o.bind_host = f.host;
  o.port = f.port;
  o.advertise = f.advertise;
  o.no_listen = f.no_listen;
  o.server_key = f.server_key;
  o.hub.use_cache = !f.no_cache;
  o.hub.cache_dir = DeviceCacheDir();
  o.hub.progress = TerminalProgressBar("layers");
  o.stop = &StopRequested();
  o.models_dirs = f.models_dirs;
  o.print_tokens = !f.no_show_tokens;
  o.faults = ProcessNodeFaults();
  Status st = RunNode(o);
  if (!st.ok()) return ReportError(st.message());
  return 0;
}

}  // namespace

DAISY_REGISTER_COMMAND(node, 70, [](CLI::App& app) -> std::function<int()> {
  auto f = std::make_shared<NodeFlags>();
  auto* sub = app.add_subcommand("node", "Join a room as a device that holds a slice of the model (runs until Ctrl-C)");
  sub->add_option("--join", f->join,
                  "HOST:PORT of `daisychain serve`; without it, the room announced on this network (the only one, or "
                  "the one --room names)");
  f->room_opt = sub->add_option("--room", f->room, "Room code (default: default; without --join: the room to pick)");
  sub->add_option("--name", f->name, "Name shown to the others (default: the host name)");
  sub->add_option("--server-key", f->server_key,
                  "Fingerprint of the server's key, as `daisychain serve` prints it; without it the key is trusted on "
                  "first use and remembered in DAISY_HOME");
  f->host_opt = sub->add_option(
      "--host", f->host,
      "Address the other devices reach this one at (default 127.0.0.1; without --join: this machine's address "
      "towards the room found)");
  sub->add_option("--discover-seconds", f->discover_s,
                  "Without --join: how long to listen for rooms announced on this network (default 5)")
      ->check(CLI::Range(0.5, 600.0));
  sub->add_option("--port", f->port, "Port of this device's inbox (default: any free port)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--advertise", f->advertise,
                  "HOST:PORT the other devices are told to send to, when it differs from --host and --port (a relay "
                  "or port forward)");
  sub->add_flag("--no-listen", f->no_listen,
                "Bind no port (a device behind NAT or a firewall): keep one outbound connection to serve, which "
                "relays this device's hops, boxed end to end so serve sees only ciphertext. Every hop to and from "
                "it then crosses serve");
  sub->add_option("--models-dir", f->models_dirs,
                  "A local folder a head may have this device open models under (repeatable); without it, only Hub "
                  "repo ids. A path outside every such folder (symlinks and .. resolved) is refused, unread")
      ->allow_extra_args(false);
  sub->add_flag("--no-cache", f->no_cache, "Do not use the on-disk slice cache");
  sub->add_flag("--no-show-tokens", f->no_show_tokens,
                "Do not print the text of the room's turns (by default every turn a head of the room runs is shown "
                "here as it is generated, on stdout, whether or not this device holds layers of it)");
  AddMaxMemoryFlag(sub, f->max_memory);
  sub->add_option("--threads", f->threads, "Kernel threads (default: all cores)")->check(CLI::Range(1, 1024));
  return [f] { return RunNodeCommand(*f); };
});

}  // namespace daisy::cli
