// Pieces shared by the ring commands (serve, node, run, demo).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "daisy/generator.h"
#include "daisy/head.h"

namespace CLI {
class App;
}

namespace daisy::cli {

// Set by SIGINT/SIGTERM once InstallStopSignals() ran.
std::atomic<bool>& StopRequested();
void InstallStopSignals();

// Generation flags of a head command.
struct GenFlags {
  int max_tokens = 60;
  float temperature = 0.0f;
  uint64_t seed = 1234;
  int top_k = 0;
  float top_p = 1.0f;
  int ctx = 0;
  std::vector<int> stop_ids;
};
void AddGenFlags(CLI::App* sub, GenFlags& flags);
GenerateOptions ToGenerateOptions(const GenFlags& flags);

// Prints a finished head run: summary lines (text mode) or one JSON object.
void PrintHeadReport(const HeadReport& report, bool json, bool verify);

}  // namespace daisy::cli
