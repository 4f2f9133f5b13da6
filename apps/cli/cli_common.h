// Helpers shared by the subcommands: opening --model SRC, printing errors.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "daisy/generator.h"
#include "daisy/head.h"
#include "daisy/source.h"
#include "daisy/status.h"

namespace CLI {
class App;
}

namespace daisy::cli {

// Opens SRC: a local folder, or a Hub repo id "owner/name[@revision]" (HF_ENDPOINT,
// HF_TOKEN, the cache and a progress bar on a terminal). Every subcommand uses this.
Result<std::unique_ptr<ModelSource>> OpenSourceForCli(const std::string& src, bool use_cache = true);

// Generation flags shared by generate, run and demo.
struct GenFlags {
  int max_tokens = 60;
  float temperature = 0.0f;
  uint64_t seed = 1234;
  int top_k = 0;
  float top_p = 1.0f;
  int ctx = 0;
  std::vector<int> stop_ids;
  bool no_lookahead = false;
};
void AddGenFlags(CLI::App* sub, GenFlags& flags);
GenerateOptions ToGenerateOptions(const GenFlags& flags);

// --audit RATE and --audit-seed N (run and serve), into the session's options.
void AddAuditFlags(CLI::App* sub, SessionOptions& session);

}  // namespace daisy::cli
