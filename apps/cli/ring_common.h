// Pieces shared by the ring commands (serve, node, run, demo).
#pragma once

#include <atomic>
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

// Prints a finished head run: summary lines (text mode) or one JSON object.
void PrintHeadReport(const HeadReport& report, bool json, bool verify);

}  // namespace daisy::cli
