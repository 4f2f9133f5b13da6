// Pieces shared by the ring commands (serve, node, run, demo).
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "daisy/head.h"

namespace CLI {
class App;
}

namespace daisy::cli {

// Set by SIGINT/SIGTERM once InstallStopSignals() ran.
std::atomic<bool>& StopRequested();
void InstallStopSignals();

// --max-memory SIZE on a ring command: `text` is what the user wrote ("" when absent).
void AddMaxMemoryFlag(CLI::App* app, std::string& text);
// --no-share-tokens on a head: its turns' text goes to no other device of the room.
void AddShareTokensFlag(CLI::App* app, bool& no_share);
// The parsed budget, unset when the flag is absent; an error names the bad text.
Result<std::optional<uint64_t>> ParseMaxMemory(const std::string& text);

// Prints a finished head run: summary lines (text mode) or one JSON object.
void PrintHeadReport(const HeadReport& report, bool json, bool verify);

}  // namespace daisy::cli
