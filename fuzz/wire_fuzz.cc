// libFuzzer: the wire decoder. The first byte picks the activation row width the receiver
// expects (0 = any); a frame that decodes must encode back to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "daisy/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int hidden = data[0] % 17;
  const std::span<const uint8_t> frame(data + 1, size - 1);
  auto m = daisy::wire::Decode(frame, hidden);
  if (m.ok()) {
    // Every accepted frame is canonical: re-encoding gives the same bytes.
    const auto again = daisy::wire::Encode(*m);
    if (again.size() != frame.size() || !std::equal(again.begin(), again.end(), frame.begin())) std::abort();
  }
  return 0;
}
