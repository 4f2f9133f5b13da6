// daisychain serve: the room's rendezvous, and a compute device unless --no-compute.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>
#include <memory>
#include <thread>

#include "cli_common.h"
#include "commands.h"
#include "daisy/log.h"
#include "daisy/net.h"
#include "daisy/node.h"
#include "ring_common.h"

namespace daisy::cli {
namespace {

struct ServeFlags {
  int port = 8788;
  std::string host = "127.0.0.1";
  std::string room = "default";
  std::string name;
  bool auto_approve = false;
  bool no_compute = false;
};

int RunServe(const ServeFlags& f) {
  InstallStopSignals();
  net::RendezvousOptions ro;
  ro.host = f.host;
  ro.port = f.port;
  ro.auto_approve = f.auto_approve;
  auto rv = net::Rendezvous::Start(ro);
  if (!rv.ok()) return ReportError(rv.status().message());
  const std::string hp = f.host + ":" + (*rv)->address().substr((*rv)->address().rfind(':') + 1);
  std::fprintf(stderr, "rendezvous on %s, room '%s'\n", hp.c_str(), f.room.c_str());
  std::fprintf(stderr, "devices join with:  daisychain node --join %s --room %s\n", hp.c_str(), f.room.c_str());
  std::fprintf(stderr, "a head runs with:   daisychain run --join %s --room %s --model SRC --prompt TEXT\n", hp.c_str(), f.room.c_str());
  if (f.auto_approve)
    std::fprintf(stderr, "WARNING: --auto-approve is ON: every device that reaches this port is admitted to the room\n");
  else
    std::fprintf(stderr, "type 'approve ID' here to admit a device that asks to join\n");
  std::fflush(stderr);

  std::thread compute;
  if (!f.no_compute) {
    compute = std::thread([&] {
      NodeOptions o;
      o.role = "serve";
      o.rendezvous = (*rv)->address();
      o.room = f.room;
      o.name = f.name.empty() ? "" : f.name;
      o.bind_host = f.host;
      o.hub.cache_dir = DeviceCacheDir();
      o.print_tokens = false;
      o.stop = &StopRequested();
      Status st = RunNode(o);
      if (!st.ok()) LogError("serve: the compute device stopped: " + st.message());
    });
  }
  // Approvals typed on this terminal. A detached reader: stdin may never close.
  if (::isatty(STDIN_FILENO)) {
    std::thread([rvp = rv->get()] {
      std::string line;
      while (std::getline(std::cin, line)) {
        if (line.rfind("approve ", 0) == 0) {
          Status st = rvp->Approve(line.substr(8));
          if (!st.ok()) std::fprintf(stderr, "%s\n", st.message().c_str());
        } else if (!line.empty()) {
          std::fprintf(stderr, "commands: approve ID\n");
        }
      }
    }).detach();
  }
  while (!StopRequested().load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (compute.joinable()) compute.join();
  std::fprintf(stderr, "serve: stopped\n");
  return 0;
}

}  // namespace

DAISY_REGISTER_COMMAND(serve, 60, [](CLI::App& app) -> std::function<int()> {
  auto f = std::make_shared<ServeFlags>();
  auto* sub = app.add_subcommand("serve", "Run the room's rendezvous (and a compute device) until Ctrl-C");
  sub->add_option("--port", f->port, "Port devices join at (default 8788)")->check(CLI::Range(1, 65535));
  sub->add_option("--host", f->host, "Address to listen on (default 127.0.0.1)");
  sub->add_option("--room", f->room, "Room code (default: default)");
  sub->add_option("--name", f->name, "Name of this device (default: the host name)");
  sub->add_flag("--auto-approve", f->auto_approve, "Admit every device without asking (demos and tests)");
  sub->add_flag("--no-compute", f->no_compute, "Only the rendezvous: hold no layers here");
  return [f] { return RunServe(*f); };
});

}  // namespace daisy::cli
