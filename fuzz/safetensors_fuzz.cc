// libFuzzer: the safetensors header parser. Input: a whole file's first bytes (the 8-byte
// little-endian header length, then the JSON header).
#include <cstdint>
#include <cstring>
#include <string_view>

#include "daisy/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  const std::string_view rest(reinterpret_cast<const char*>(data + 8), size - 8);
  const std::string_view json = rest.substr(0, n < rest.size() ? static_cast<size_t>(n) : rest.size());
  // The file is as long as the input, plus a data section the header may point into.
  auto h = daisy::ParseSafetensorsHeader("fuzz.safetensors", json, n, size + 4096);
  if (h.ok()) {
    for (const auto& t : h->tensors) (void)t.Elements();
  }
  return 0;
}
