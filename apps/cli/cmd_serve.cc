// daisychain serve: the room's rendezvous, a long-lived head (HeadSession), the web UI and
// the OpenAI-compatible API, and a compute device unless --no-compute, all behind one port:
// the port mux hands ZeroMQ connections to the rendezvous and HTTP to the server.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "cli_common.h"
#include "commands.h"
#include "daisy/head.h"
#include "daisy/log.h"
#include "daisy/net.h"
#include "daisy/node.h"
#include "daisy/ring.h"
#include "daisy/server.h"
#include "faults.h"
#include "ring_common.h"

namespace daisy::cli {
namespace {

struct ServeFlags {
  int port = 8788;
  std::string host = "127.0.0.1";
  std::string room = "default";
  std::string name;
  std::string model;
  int ctx = 0;
  bool auto_approve = false;
  std::vector<std::string> approve;
  bool no_compute = false;
  bool no_lookahead = false;
  bool no_cache = false;
  bool no_announce = false;
  bool no_share_tokens = false;
  int stages = 0;
  std::string api_key;            // "": the OpenAI API answers this machine only
  std::string admin_secret_file;  // where to write the UI's admin secret ("" : nowhere)
  std::vector<std::string> allow_hosts;
  std::vector<std::string> models_dirs;
  SessionOptions session;  // --audit, --audit-seed
  std::string max_memory;
};

// The admin secret for scripts and tests (--admin-secret-file): owner-only, as a token file.
Status WriteSecretFile(const std::string& path, const std::string& secret) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return InvalidArgument("cannot write --admin-secret-file " + path + ": " + std::strerror(errno));
  ::fchmod(fd, 0600);  // an existing file keeps its mode through O_CREAT
  const std::string line = secret + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) return InvalidArgument("cannot write --admin-secret-file " + path);
  return Status();
}

int PortOf(const std::string& tcp_address) {
  return std::stoi(tcp_address.substr(tcp_address.rfind(':') + 1));
}

int RunServe(const ServeFlags& f) {
  auto budget = ParseMaxMemory(f.max_memory);
  if (!budget.ok()) return ReportError(budget.status().message(), 2);
  InstallStopSignals();
  // The rendezvous and the HTTP server listen on loopback only; the mux is the public port.
  // The rendezvous's key pair is this device's "rendezvous" identity: devices that joined
  // once remember its fingerprint, so it stays the same from run to run.
  auto rv_keys = DeviceKeys(DeviceHome(), "rendezvous");
  if (!rv_keys.ok()) return ReportError(rv_keys.status().message());
  net::RendezvousOptions ro;
  ro.host = "127.0.0.1";
  ro.port = 0;
  ro.auto_approve = f.auto_approve;
  ro.keys = *rv_keys;
  auto rv = net::Rendezvous::Start(ro);
  if (!rv.ok()) return ReportError(rv.status().message());
  for (const auto& fpr : f.approve) {
    Status st = (*rv)->PreApprove(f.room, fpr);
    if (!st.ok()) return ReportError(st.message(), 2);
  }
  const std::string server_fpr = net::Fingerprint((*rv)->public_key());

  HubOptions hub;
  hub.use_cache = !f.no_cache;
  hub.cache_dir = DeviceCacheDir();
  hub.allow_token_prompt = false;  // requests come over HTTP: no terminal to ask on
  // The head's loads (and the chat template's) also take a token the web UI gives after a
  // refusal, held in memory only; the compute device fetches with this machine's own
  // credentials, as any device does.
  HubOptions head_hub = hub;
  head_hub.runtime_token = std::make_shared<RuntimeToken>();

  // This process's own devices (its head and its compute device) are admitted without
  // asking, whatever --auto-approve says.
  const net::Admission own = (*rv)->LocalAdmission(/*trusted=*/true);
  SessionOptions so;
  so.rendezvous = (*rv)->address();
  so.room = f.room;
  so.name = f.name.empty() ? "" : f.name;
  so.role = "serve-head";
  so.bind_host = f.host;
  so.hub = head_hub;
  so.admission = own;
  so.audit_rate = f.session.audit_rate;
  so.audit_seed = f.session.audit_seed;
  so.max_memory = *budget;
  so.lookahead = f.no_lookahead ? 0 : kDefaultLookahead;
  so.share_tokens = !f.no_share_tokens;
  std::string compute_id;
  if (!f.no_compute) {
    // The compute device of this process is the head's own machine: the head holds layers
    // itself, so it never plans a second stage here.
    auto id = DeviceId(DeviceHome(), "serve");
    if (!id.ok()) return ReportError(id.status().message());
    compute_id = *id;
    so.exclude_devices.push_back(compute_id);
  }
  auto session = HeadSession::Start(so);
  if (!session.ok()) return ReportError("cannot start the head: " + session.status().message());

  const std::string public_hp = f.host + ":" + std::to_string(f.port);
  const std::string join_line =
      "daisychain node --join " + public_hp + " --room " + f.room + " --server-key " + server_fpr;
  ServerOptions sv;
  sv.default_stages = f.stages;
  sv.host = "127.0.0.1";
  sv.port = 0;
  sv.room = f.room;
  sv.join_line = join_line;
  sv.join_url = JoinPageUrl(f.host, f.port);
  sv.auto_approve = f.auto_approve;
  sv.rendezvous = rv->get();
  sv.session = session->get();
  sv.hub = head_hub;
  sv.compute_device_id = compute_id;
  sv.api_key = f.api_key;
  sv.allowed_hosts = f.allow_hosts;
  // A name given to --host is how browsers will reach this server: its Host header is ours.
  if (!f.host.empty() && f.host.find_first_not_of("0123456789.:[]") != std::string::npos)
    sv.allowed_hosts.push_back(f.host);
  // Join requests reach the server through the mux: it knows who is really asking.
  std::atomic<net::PortMux*> mux_now{nullptr};
  sv.source_of = [&mux_now](int remote_port) -> std::string {
    net::PortMux* m = mux_now.load();
    return m ? m->SourceOf(remote_port) : "";
  };
  auto server = Server::Start(sv);
  if (!server.ok()) return ReportError(server.status().message());
  const std::string& secret = (*server)->admin_secret();
  if (!f.admin_secret_file.empty()) {
    Status st = WriteSecretFile(f.admin_secret_file, secret);
    if (!st.ok()) return ReportError(st.message(), 2);
  }

  net::PortMuxOptions mo;
  mo.host = f.host;
  mo.port = f.port;
  mo.zmq_port = PortOf((*rv)->address());
  mo.http_port = (*server)->port();
  mo.relay_port = (*rv)->relay_port();
  mo.link_port = (*rv)->link_port();  // browser tabs: GET /api/link
  auto mux = net::PortMux::Start(mo);
  if (!mux.ok()) return ReportError(mux.status().message());
  mux_now.store(mux->get());

  // On a network address, tell the LAN where this room is (multicast, TTL 1): `daisychain
  // node` without --join finds it. Only the room, the port and the server key's fingerprint.
  std::unique_ptr<Announcer> announcer;
  if (!f.no_announce && !ListensOnLoopbackOnly(f.host)) {
    Announcement a;
    a.room = f.room;
    a.port = f.port;
    a.fingerprint = server_fpr;
    auto an = Announcer::Start(a, f.host);
    if (an.ok()) {
      announcer = std::move(*an);
      std::fprintf(stderr, "announcing room '%s' on this network (UDP %s:%d, TTL 1; --no-announce to stop)\n",
                   f.room.c_str(), kDiscoveryGroup, kDiscoveryPort);
    } else {
      std::fprintf(stderr, "not announcing the room on this network: %s\n", an.status().message().c_str());
    }
  }

  // The room's turns as this process's compute device receives them go to the UI; the server
  // goes before the compute device stops, so the device asks under a lock whether it is there.
  std::mutex shown_mu;
  Server* shown_on = server->get();
  std::thread compute;
  if (!f.no_compute) {
    compute = std::thread([&] {
      NodeOptions o;
      o.role = "serve";
      o.rendezvous = (*rv)->address();
      o.room = f.room;
      o.name = f.name;
      o.bind_host = f.host;
      o.hub = hub;
      o.admission = own;
      o.print_tokens = false;
      o.on_text = [&](const std::string& head_id, const std::string& head_name, const wire::Text& t) {
        static constexpr const char* kKinds[] = {"begin", "piece", "retract", "end", "failed"};
        std::lock_guard<std::mutex> lock(shown_mu);
        if (shown_on)
          shown_on->ShowRoomText({head_id, head_name, t.stream, kKinds[static_cast<size_t>(t.kind)], t.index, t.text});
      };
      o.stop = &StopRequested();
      o.max_memory = *budget;
      // Local folders other heads may name: --models-dir, and the --model folder this
      // serve was asked to load itself.
      o.models_dirs = f.models_dirs;
      std::error_code ec;
      if (!f.model.empty() && std::filesystem::is_directory(f.model, ec)) o.models_dirs.push_back(f.model);
      o.faults = ProcessNodeFaults();
      Status st = RunNode(o);
      if (!st.ok()) LogError("serve: the compute device stopped: " + st.message());
    });
  }

  // As Jupyter: the UI's URL carries the admin secret; whoever opens it is the host.
  std::fprintf(stderr, "web UI: http://%s/?token=%s\n", public_hp.c_str(), secret.c_str());
  std::fprintf(stderr, "  (this URL is the host's key to the UI: approvals, loads, turns; do not share it)\n");
  if (f.api_key.empty())
    std::fprintf(stderr,
                 "OpenAI-compatible API: http://%s/v1 (answers only on this machine: give --api-key KEY to open it "
                 "to other devices)\n",
                 public_hp.c_str());
  else
    std::fprintf(stderr, "OpenAI-compatible API: http://%s/v1 (needs \"Authorization: Bearer\" with the --api-key)\n",
                 public_hp.c_str());
  if (!ListensOnLoopbackOnly(f.host))
    std::fprintf(stderr,
                 "WARNING: --host %s serves this port to the network: every device that reaches it can ask to join; "
                 "the web UI answers only the admin secret above%s\n",
                 f.host.c_str(), f.api_key.empty() ? "" : ", the OpenAI API only the --api-key");
  std::fprintf(stderr, "rendezvous on %s, room '%s'\n", public_hp.c_str(), f.room.c_str());
  std::fprintf(stderr, "server key fingerprint: %s\n", server_fpr.c_str());
  std::fprintf(stderr, "devices join with:  %s\n", join_line.c_str());
  if (sv.join_url.empty())
    std::fprintf(stderr, "a browser joins at: http://%s/join (this machine only: --host ADDR lets phones reach it)\n",
                 public_hp.c_str());
  else
    std::fprintf(stderr, "a browser joins at: %s (the UI shows it as a QR code for phones)\n", sv.join_url.c_str());
  std::fprintf(stderr,
               "a head runs with:   daisychain run --join %s --room %s --server-key %s --model SRC --prompt TEXT\n",
               public_hp.c_str(), f.room.c_str(), server_fpr.c_str());
  if (f.auto_approve)
    std::fprintf(stderr,
                 "WARNING: --auto-approve is ON: every device that reaches this port is admitted to the room, "
                 "whatever its key\n");
  else
    std::fprintf(stderr,
                 "a device that asks to join shows its key fingerprint; approve it in the web UI, or type "
                 "'approve FINGERPRINT' here\n");
  for (const auto& fpr : f.approve) std::fprintf(stderr, "pre-approved: %s\n", fpr.c_str());
  std::fflush(stderr);

  int rc = 0;
  if (!f.model.empty()) {
    Status st = (*server)->Load(f.model, f.ctx);
    if (st.ok()) {
      std::fprintf(stderr, "model %s loaded: the API is ready\n", f.model.c_str());
    } else {
      rc = ReportError("cannot load --model " + f.model + ": " + st.message());
      StopRequested().store(true);
    }
    std::fflush(stderr);
  }

  // Approvals typed on this terminal. A detached reader: stdin may never close.
  if (::isatty(STDIN_FILENO)) {
    std::thread([rvp = rv->get()] {
      std::string line;
      while (std::getline(std::cin, line)) {
        if (line.rfind("approve ", 0) == 0) {
          Status st = rvp->Approve(line.substr(8));
          if (!st.ok()) std::fprintf(stderr, "%s\n", st.message().c_str());
        } else if (line == "pending") {
          for (const auto& p : rvp->Pending())
            std::fprintf(stderr, "  %s  %s  room '%s'  from %s\n", p.fingerprint.c_str(), p.name.c_str(),
                         p.room.c_str(), p.source.c_str());
        } else if (!line.empty()) {
          std::fprintf(stderr, "commands: approve FINGERPRINT (a unique prefix is enough), pending\n");
        }
      }
    }).detach();
  }
  while (!StopRequested().load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // Outside in: no new connections, streams ended (turns asked to stop), the head leaves,
  // the compute device leaves, then the rendezvous.
  announcer.reset();
  mux_now.store(nullptr);
  mux->reset();
  {
    std::lock_guard<std::mutex> lock(shown_mu);
    shown_on = nullptr;
  }
  server->reset();
  session->reset();
  if (compute.joinable()) compute.join();
  rv->reset();
  std::fprintf(stderr, "serve: stopped\n");
  return rc;
}

}  // namespace

DAISY_REGISTER_COMMAND(serve, 60, [](CLI::App& app) -> std::function<int()> {
  auto f = std::make_shared<ServeFlags>();
  auto* sub = app.add_subcommand("serve",
                                 "Run the room: rendezvous, head, web UI and OpenAI-compatible API on one port (and a "
                                 "compute device) until Ctrl-C");
  sub->add_option("--port", f->port, "Port of the web UI, the API and the rendezvous (default 8788)")
      ->check(CLI::Range(1, 65535));
  sub->add_option(
      "--host", f->host,
      "Address to listen on and that devices reach this one at (default 127.0.0.1; any other serves the port to the "
      "network, with a warning: the UI then answers only the admin secret, the API only --api-key)");
  sub->add_option("--room", f->room, "Room code (default: default)");
  sub->add_option("--name", f->name, "Name of this device (default: the host name)");
  sub->add_option("--model", f->model, "Load this model at start (local folder or Hub repo id owner/name[@revision])");
  sub->add_option("--ctx", f->ctx, "Context length for --model (default: the model's, at most 4096)")
      ->check(CLI::Range(0, 1 << 24));
  sub->add_flag("--auto-approve", f->auto_approve,
                "Admit every device that asks, whatever its key (demos and tests only)");
  sub->add_option("--approve", f->approve,
                  "Admit the device with this key fingerprint when it asks (repeatable; `daisychain id` on that device "
                  "prints it)");
  sub->add_option("--stages", f->stages,
                  "Split turns over exactly N devices (head included) unless a request says otherwise; 0: automatic")
      ->check(CLI::Range(0, 64));
  AddAuditFlags(sub, f->session);
  sub->add_option("--models-dir", f->models_dirs,
                  "A local folder under which this process's compute device may open the models other heads name "
                  "(repeatable; the --model folder is allowed too); otherwise only Hub repo ids")
      ->allow_extra_args(false);
  sub->add_flag("--no-announce", f->no_announce,
                "Do not announce the room on the local network (by default a --host other than loopback is announced "
                "by UDP multicast so `daisychain node` finds it without --join)");
  AddShareTokensFlag(sub, f->no_share_tokens);
  sub->add_flag("--no-compute", f->no_compute, "Start no compute device in this process besides the head itself");
  AddMaxMemoryFlag(sub, f->max_memory);  // the head's budget, and its compute device's
  sub->add_flag("--no-cache", f->no_cache, "Do not use the on-disk download cache");
  sub->add_flag(
      "--no-lookahead", f->no_lookahead,
      "Do not draft: by default each decode lap also scores the tokens that followed an earlier occurrence of "
      "the text's last few ids and keeps those equal to what is sampled (same ids either way)");
  sub->add_option("--api-key", f->api_key,
                  "Key the OpenAI-compatible API requires as \"Authorization: Bearer KEY\" (also $DAISY_API_KEY); "
                  "without one the API answers only on this machine")
      ->envname("DAISY_API_KEY");
  sub->add_option("--admin-secret-file", f->admin_secret_file,
                  "Also write the web UI's admin secret (made at start, printed in the UI's URL) to this file, mode "
                  "0600, for scripts");
  sub->add_option("--allow-host", f->allow_hosts,
                  "A host name browsers may reach this server by (repeatable; IP addresses, localhost and a name "
                  "given to --host are always allowed; other Host headers are refused against DNS rebinding)");
  return [f] { return RunServe(*f); };
});

}  // namespace daisy::cli
