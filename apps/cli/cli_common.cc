#include "cli_common.h"

#include "daisy/hub.h"

namespace daisy::cli {

Result<std::unique_ptr<ModelSource>> OpenSourceForCli(const std::string& src, bool use_cache) {
  HubOptions options;  // endpoint, token and cache folder come from the environment
  options.use_cache = use_cache;
  options.progress = TerminalProgressBar("download");  // empty when stderr is not a terminal
  return OpenModelSource(src, options);
}

}  // namespace daisy::cli
