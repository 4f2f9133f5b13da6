// daisychain run: a one-shot head from the terminal.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "daisy/head.h"
#include "daisy/kernels.h"
#include "daisy/log.h"
#include "daisy/net.h"
#include "daisy/node.h"
#include "daisy/ring.h"
#include "ring_common.h"

namespace daisy::cli {
namespace {

struct RunFlags {
  std::string join;
  std::string room = "default";
  std::string name;
  std::string host = "127.0.0.1";
  std::string model;
  std::string prompt;
  GenFlags gen;
  int stages = 0;
  int prefill_chunk = 0;
  std::string plan;
  bool verify = false;
  SessionOptions session;  // --audit, --audit-seed
  bool json = false;
  bool no_cache = false;
  bool no_share_tokens = false;
  std::string server_key;
  double lap_timeout = 60;
  std::string max_memory;
  int threads = 0;
};

Result<std::vector<int>> ParsePlan(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    try {
      size_t used = 0;
      int v = std::stoi(part, &used);
      if (used != part.size() || v < 0) throw std::invalid_argument(part);
      out.push_back(v);
    } catch (const std::exception&) {
      return InvalidArgument("--plan wants layer counts like 2,2,1; '" + part + "' is not a count");
    }
  }
  if (out.empty()) return InvalidArgument("--plan lists no stages");
  return out;
}

int RunRun(const RunFlags& f) {
  auto addr = net::JoinAddress(f.join);
  if (!addr.ok()) return ReportError(addr.status().message(), 2);
  if (f.threads > 0) kernels::SetThreads(f.threads);  // before the capacity the hello reports is measured
  HeadOptions o;
  SessionOptions& so = o.session;
  so = f.session;
  so.rendezvous = *addr;
  so.server_key = f.server_key;
  so.lap_timeout_s = f.lap_timeout;
  so.share_tokens = !f.no_share_tokens;
  auto budget = ParseMaxMemory(f.max_memory);
  if (!budget.ok()) return ReportError(budget.status().message(), 2);
  so.max_memory = *budget;
  so.room = f.room;
  so.name = f.name;
  so.bind_host = f.host;
  so.hub.use_cache = !f.no_cache;
  so.hub.cache_dir = DeviceCacheDir();
  so.hub.progress = TerminalProgressBar("layers");
  o.model = f.model;
  o.prompt = f.prompt;
  o.generate = ToGenerateOptions(f.gen);
  o.generate.prefill_chunk = f.prefill_chunk;
  so.lookahead = o.generate.lookahead;
  o.ctx = f.gen.ctx;
  if (f.stages > 0) so.stages = f.stages;
  if (!f.plan.empty()) {
    auto plan = ParsePlan(f.plan);
    if (!plan.ok()) return ReportError(plan.status().message(), 2);
    so.plan = *plan;
  }
  o.verify = f.verify;
  o.on_status = [](std::string_view line) {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  };
  if (!f.json) {
    std::printf("%s", f.prompt.c_str());
    o.on_text = [](std::string_view t) {
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fflush(stdout);
    };
  }
  auto report = RunHead(o);
  if (!report.ok()) return ReportError(report.status().message());
  PrintHeadReport(*report, f.json, f.verify);
  return f.verify && !report->verified.value_or(false) ? 3 : 0;
}

}  // namespace

DAISY_REGISTER_COMMAND(run, 80, [](CLI::App& app) -> std::function<int()> {
  auto f = std::make_shared<RunFlags>();
  auto* sub =
      app.add_subcommand("run", "Generate from the terminal as the head of a ring (plan, assign, stream, verify)");
  sub->add_option("--join", f->join, "HOST:PORT of `daisychain serve`")->required();
  sub->add_option("--model", f->model, "Local folder or Hub repo id owner/name[@revision]")->required();
  sub->add_option("--prompt", f->prompt, "The prompt text")->required();
  sub->add_option("--room", f->room, "Room code (default: default)");
  sub->add_option("--server-key", f->server_key,
                  "Fingerprint of the server's key, as `daisychain serve` prints it; without it the key is trusted on "
                  "first use and remembered in DAISY_HOME");
  sub->add_option("--lap-timeout", f->lap_timeout,
                  "Floor of the lap timeout in seconds (default 60); it grows with the plan's estimate for slow models "
                  "(docs/ARCHITECTURE.md)")
      ->check(CLI::Range(1.0, 3600.0));
  sub->add_option("--name", f->name, "Name of this device (default: the host name)");
  sub->add_option("--host", f->host, "Address the stages reach this device at (default 127.0.0.1)");
  AddGenFlags(sub, f->gen);
  sub->add_option("--stages", f->stages, "Split over exactly N devices including this one (waits up to 30 s for them)")
      ->check(CLI::Range(1, 256));
  sub->add_option("--plan", f->plan, "Layers per stage, this device first, e.g. 2,2,1");
  sub->add_option("--prefill-chunk", f->prefill_chunk,
                  "Prompt positions per chunk of the pipelined prefill (every stage works on its own chunk at once); "
                  "0 = the head's default (the same bits either way)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_flag(
      "--verify", f->verify,
      "Afterwards run the whole model here and compare the token ids and the bits of every step (final "
      "hidden row and logits, BLAKE2b); prints VERIFIED or MISMATCH with the first differing position, exit code 3 "
      "on a mismatch. When the whole model does not fit this device's --max-memory, the turn is re-run one slice "
      "of layers at a time instead (stage by stage), and it says so");
  AddMaxMemoryFlag(sub, f->max_memory);
  AddAuditFlags(sub, f->session);
  sub->add_flag("--json", f->json, "Print one JSON object at the end instead of streaming text");
  sub->add_flag("--no-cache", f->no_cache, "Do not use the on-disk download cache");
  AddShareTokensFlag(sub, f->no_share_tokens);
  sub->add_option("--threads", f->threads, "Kernel threads of this device (default: all cores)")
      ->check(CLI::Range(1, 1024));
  return [f] { return RunRun(*f); };
});

}  // namespace daisy::cli
