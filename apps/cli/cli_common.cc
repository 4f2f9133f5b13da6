#include "cli_common.h"

namespace daisy::cli {

Result<std::unique_ptr<ModelSource>> OpenSourceForCli(const std::string& src, bool use_cache) {
  (void)use_cache;
  return OpenLocalFolder(src);
}

}  // namespace daisy::cli
