// daisychain demo: a rendezvous, three local node processes and a head on the bundled
// model, all on this machine: the plan, the story, tok/s and ring hops, and VERIFIED.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "daisy/head.h"
#include "daisy/log.h"
#include "daisy/net.h"
#include "daisy/server.h"
#include "ring_common.h"

namespace daisy::cli {
namespace {

namespace fs = std::filesystem;

struct DemoFlags {
  std::string model;
  std::string prompt = "Once upon a time";
  int nodes = 3;
  GenFlags gen;
  bool keep = false;
};

// The bundled model: $DAISY_MODELS/stories260K, ./models/stories260K, or next to the binary.
std::string FindBundledModel() {
  std::vector<fs::path> candidates;
  if (const char* m = std::getenv("DAISY_MODELS")) candidates.push_back(fs::path(m) / "stories260K");
  candidates.push_back(fs::current_path() / "models/stories260K");
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path() / "../../../models/stories260K");
  for (const auto& c : candidates)
    if (fs::exists(c / "config.json", ec)) return fs::canonical(c, ec).string();
  return "";
}

pid_t SpawnNode(const std::string& join, const std::string& server_key, const std::string& home,
                const std::string& name, const std::string& models_dir, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::setenv("DAISY_HOME", home.c_str(), 1);
  ::unsetenv("DAISY_CACHE_DIR");
  FILE* out = std::freopen(log.c_str(), "w", stdout);
  if (out) ::dup2(::fileno(stdout), STDERR_FILENO);
  // A local model is opened by the nodes only if it lies under a folder they allow.
  if (models_dir.empty())
    ::execl("/proc/self/exe", "daisychain", "node", "--join", join.c_str(), "--server-key", server_key.c_str(),
            "--name", name.c_str(), static_cast<char*>(nullptr));
  else
    ::execl("/proc/self/exe", "daisychain", "node", "--join", join.c_str(), "--server-key", server_key.c_str(),
            "--name", name.c_str(), "--models-dir", models_dir.c_str(), static_cast<char*>(nullptr));
  std::_Exit(127);
}

int RunDemo(const DemoFlags& f) {
  const std::string model = f.model.empty() ? FindBundledModel() : f.model;
  if (model.empty()) return ReportError("cannot find the bundled model models/stories260K; pass --model");
  char tmpl[] = "/tmp/daisychain-demo-XXXXXX";
  if (!::mkdtemp(tmpl)) return ReportError("cannot make a temporary folder");
  const fs::path tmp = tmpl;
  SetLogLevel(LogLevel::kWarning);

  // The room as serve runs it, on one port: the rendezvous (ZeroMQ, CURVE) and its join
  // endpoints (HTTP) behind the port mux. Every device here is ours, so every key that asks
  // is approved; the links are encrypted and authenticated all the same.
  net::RendezvousOptions ro;
  ro.port = 0;
  ro.auto_approve = true;
  auto rv = net::Rendezvous::Start(ro);
  if (!rv.ok()) return ReportError(rv.status().message());
  JoinServerOptions jo;
  jo.rendezvous = rv->get();
  auto join_server = JoinServer::Start(jo);
  if (!join_server.ok()) return ReportError(join_server.status().message());
  net::PortMuxOptions mo;
  mo.port = 0;
  mo.zmq_port = std::stoi((*rv)->address().substr((*rv)->address().rfind(':') + 1));
  mo.http_port = (*join_server)->port();
  mo.relay_port = (*rv)->relay_port();
  mo.link_port = (*rv)->link_port();  // browser tabs: GET /api/link
  auto mux = net::PortMux::Start(mo);
  if (!mux.ok()) return ReportError(mux.status().message());
  const std::string join = "127.0.0.1:" + std::to_string((*mux)->port());
  const std::string server_fpr = net::Fingerprint((*rv)->public_key());
  std::printf("DaisyChain demo: a rendezvous on %s, %d node processes and this head, on %s\n\n", join.c_str(), f.nodes,
              model.c_str());
  std::fflush(stdout);

  std::error_code ec;
  const std::string models_dir = fs::is_directory(model, ec) ? model : "";
  std::vector<pid_t> pids;
  for (int i = 0; i < f.nodes; ++i) {
    const std::string name = "node-" + std::to_string(i + 1);
    const fs::path home = tmp / name;
    fs::create_directories(home);
    pids.push_back(SpawnNode(join, server_fpr, home.string(), name, models_dir, (tmp / (name + ".log")).string()));
  }
  ::setenv("DAISY_HOME", (tmp / "head").c_str(), 1);

  HeadOptions o;
  o.session.rendezvous = "tcp://" + join;
  o.session.admission = (*rv)->LocalAdmission(/*trusted=*/true);
  o.session.name = "head";
  o.model = model;
  o.session.hub.cache_dir = (tmp / "head/cache").string();
  o.prompt = f.prompt;
  o.generate = ToGenerateOptions(f.gen);
  o.session.lookahead = o.generate.lookahead;
  o.ctx = f.gen.ctx;
  o.session.stages = f.nodes + 1;
  o.verify = true;
  bool story_started = false;
  o.on_status = [&](std::string_view line) {
    if (story_started) {  // the story is on the line above: finish it first
      std::printf("\n\n");
      story_started = false;
    }
    std::printf("  %.*s\n", static_cast<int>(line.size()), line.data());
    std::fflush(stdout);
  };
  o.on_text = [&](std::string_view t) {
    if (!story_started) {
      std::printf("\n%s", f.prompt.c_str());
      story_started = true;
    }
    std::fwrite(t.data(), 1, t.size(), stdout);
    std::fflush(stdout);
  };
  std::printf("plan (who holds which layers, MB each downloads):\n");
  auto report = RunHead(o);

  for (pid_t p : pids) ::kill(p, SIGTERM);
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  if (!report.ok()) {
    std::fprintf(stderr, "node logs are in %s\n", tmp.c_str());
    return ReportError(report.status().message());
  }
  PrintHeadReport(*report, false, true);
  if (!f.keep) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
  return report->verified.value_or(false) ? 0 : 3;
}

}  // namespace

DAISY_REGISTER_COMMAND(demo, 90, [](CLI::App& app) -> std::function<int()> {
  auto f = std::make_shared<DemoFlags>();
  auto* sub =
      app.add_subcommand("demo",
                         "Everything on this machine: a rendezvous, local nodes and a head on the bundled "
                         "model; prints the plan, a story and VERIFIED (ids and bits), or MISMATCH and exit code 3");
  sub->add_option("--model", f->model, "Model folder or Hub repo (default: the bundled stories260K)");
  sub->add_option("--prompt", f->prompt, "The prompt (default: Once upon a time)");
  sub->add_option("--nodes", f->nodes, "Local node processes (default 3)")->check(CLI::Range(1, 16));
  AddGenFlags(sub, f->gen);
  sub->add_flag("--keep", f->keep, "Keep the temporary folder with the node logs");
  return [f] { return RunDemo(*f); };
});

}  // namespace daisy::cli
