// libFuzzer: config.json -> ModelSpec, then generation_config.json facts. Input: the config,
// optionally followed by "\n--\n" and a generation config.
#include <cstdint>
#include <string_view>

#include "daisy/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find("\n--\n");
  auto spec = daisy::SpecFromConfig(in.substr(0, cut));
  if (spec.ok() && cut != std::string_view::npos) (void)daisy::ApplyGenerationConfig(*spec, in.substr(cut + 4));
  return 0;
}
