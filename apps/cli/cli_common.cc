#include "cli_common.h"

#include <CLI/CLI.hpp>

#include "daisy/hub.h"

namespace daisy::cli {

Result<std::unique_ptr<ModelSource>> OpenSourceForCli(const std::string& src, bool use_cache) {
  HubOptions options;  // endpoint, token and cache folder come from the environment
  options.use_cache = use_cache;
  options.progress = TerminalProgressBar("download");  // empty when stderr is not a terminal
  return OpenModelSource(src, options);
}

void AddAuditFlags(CLI::App* sub, SessionOptions& session) {
  sub->add_option(
         "--audit", session.audit_rate,
         "Re-run this share of hops (0..1, drawn after each lap) on this device from the stage's own inputs and "
         "compare the bits; a stage caught is excluded and the turn replayed (docs/AUDIT.md)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--audit-seed", session.audit_seed, "Seed of the audit draw (default: random)");
}

void AddGenFlags(CLI::App* sub, GenFlags& f) {
  sub->add_option("-n,--max-tokens", f.max_tokens, "Tokens to generate at most (default 60)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--temperature", f.temperature, "Sampling temperature; 0 = greedy (default 0)");
  sub->add_option("--seed", f.seed, "Sampling seed; the draw at each position depends only on it (default 1234)");
  sub->add_option("--top-k", f.top_k, "Keep the k most likely tokens; 0 = off");
  sub->add_option("--top-p", f.top_p, "Nucleus sampling mass; 1 = off");
  sub->add_option("--ctx", f.ctx, "Context length (default: the model's, at most 4096)");
  sub->add_option("--stop-id", f.stop_ids,
                  "Extra token id that ends generation (repeatable); the model's eos ids always do");
  sub->add_flag(
      "--no-lookahead", f.no_lookahead,
      "Do not draft: by default each decode step also scores the tokens that followed an earlier occurrence of "
      "the text's last few ids and keeps those equal to what is sampled (same ids either way)");
}

GenerateOptions ToGenerateOptions(const GenFlags& f) {
  GenerateOptions g;
  g.max_tokens = f.max_tokens;
  g.sampling.temperature = f.temperature;
  g.sampling.seed = f.seed;
  g.sampling.top_k = f.top_k;
  g.sampling.top_p = f.top_p;
  for (int id : f.stop_ids) g.stop_ids.push_back(id);
  g.lookahead = f.no_lookahead ? 0 : kDefaultLookahead;
  return g;
}

}  // namespace daisy::cli
