// Helpers shared by the subcommands: opening --model SRC, printing errors.
#pragma once

#include <memory>
#include <string>

#include "daisy/source.h"
#include "daisy/status.h"

namespace daisy::cli {

// Opens SRC: a local folder, or a Hub repo id "owner/name[@revision]" (HF_ENDPOINT,
// HF_TOKEN, the cache and a progress bar on a terminal). Every subcommand uses this.
Result<std::unique_ptr<ModelSource>> OpenSourceForCli(const std::string& src, bool use_cache = true);

}  // namespace daisy::cli
