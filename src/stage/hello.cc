// The hello a device sends: its capacity measured through the live kernel, its probe, its
// backend and its memory budget (any member: a node, a head, a browser tab).
#include <unistd.h>

#include "daisy/kernels.h"
#include "daisy/stage.h"

namespace daisy {

wire::Hello MeasureHello(const std::string& device_id, const std::string& name, uint32_t capabilities,
                         uint64_t budget) {
  wire::Hello h;
  h.capabilities = capabilities;
  h.gemms_per_s = kernels::MeasureCapacityGemmsPerSecond();
  h.probe_hash = kernels::ProbeHash();
  h.free_memory = budget;
  h.backend = kernels::BackendChoiceSummary();  // one backend, or the choice per product shape
  h.device_id = device_id;
  if (!name.empty()) {
    h.name = name.substr(0, 64);
  } else {
    char host[256] = {0};
    ::gethostname(host, sizeof host - 1);
    h.name = std::string(host).substr(0, 48) + "-" + device_id.substr(0, 4);
  }
  return h;
}

}  // namespace daisy
