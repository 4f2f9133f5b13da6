// Device identity and the measurements a hello carries (who a device is, in any role).
#include <unistd.h>
#include <xxhash.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "daisy/kernels.h"
#include "daisy/ring.h"

namespace daisy {

namespace fs = std::filesystem;

std::string DeviceHome() {
  if (const char* h = std::getenv("DAISY_HOME"); h && *h) return h;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x) return std::string(x) + "/daisychain";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.config/daisychain";
  return ".daisychain";
}

std::string DeviceKeyPath(const std::string& home, const std::string& role) {
  return (fs::path(home) / "keys" / (role + ".key")).string();
}

Result<net::KeyPair> DeviceKeys(const std::string& home, const std::string& role) {
  for (char c : role)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'))
      return InvalidArgument("Bug: role '" + role + "' is not a plain name");
  return net::LoadOrCreateKeyPair(DeviceKeyPath(home, role));
}

Result<std::string> DeviceId(const std::string& home, const std::string& role) {
  DAISY_ASSIGN_OR_RETURN(net::KeyPair k, DeviceKeys(home, role));
  return net::KeyId(k.public_key);
}

std::string DeviceCacheDir() {
  if (const char* c = std::getenv("DAISY_CACHE_DIR"); c && *c) return c;
  if (const char* h = std::getenv("DAISY_HOME"); h && *h) return std::string(h) + "/cache";
  return "";  // the Hub client's default
}

uint64_t FreeMemoryBytes() {
  if (const char* f = std::getenv("DAISY_FREE_MEMORY"); f && *f) return std::strtoull(f, nullptr, 10);
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

uint64_t MemoryBudget(std::optional<uint64_t> max_memory) {
  return max_memory ? *max_memory : FreeMemoryBytes();
}

PlanModel PlanModelOf(const ModelInfo& info, int ctx) {
  const TensorInfo* embed = info.index.Find(NamesForHead(info.spec).embed);
  return PlanModelFromSpec(info.spec, ctx, embed ? static_cast<int>(DTypeSize(embed->dtype)) : 2);
}

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

namespace daisy {

namespace {
void Put(std::string& s, const std::string& key, const std::string& value) {
  s += key + "=" + value + ";";
}
}  // namespace

uint64_t SpecHash(const ModelSpec& p) {
  std::string s;
  Put(s, "family", std::string(FamilyName(p.family)));
  Put(s, "arch", p.architecture);
  for (auto [k, v] : {std::pair{"layers", p.n_layers},
                      {"hidden", p.hidden},
                      {"heads", p.n_heads},
                      {"kv", p.n_kv_heads},
                      {"head_dim", p.head_dim},
                      {"inter", p.intermediate},
                      {"vocab", p.vocab},
                      {"pos", p.max_positions},
                      {"norm", static_cast<int>(p.norm)},
                      {"act", static_cast<int>(p.activation)},
                      {"gated", p.gated_mlp},
                      {"learned", p.learned_positions},
                      {"tied", p.tied_embeddings},
                      {"fused", p.fused_qkv},
                      {"qkvb", p.qkv_bias},
                      {"ob", p.o_bias},
                      {"mlpb", p.mlp_bias},
                      {"layout", static_cast<int>(p.layout)},
                      {"swa", p.use_sliding_window},
                      {"sw", p.sliding_window},
                      {"mwl", p.max_window_layers},
                      {"rs", static_cast<int>(p.rope_scaling.type)}})
    Put(s, k, std::to_string(v));
  // Floating fields by their bits: equal specs hash equal on every machine.
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a/%a/%a/%a/%a", static_cast<double>(p.norm_eps), p.rope_theta, p.rope_scaling.factor,
                p.rope_scaling.low_freq_factor, p.rope_scaling.high_freq_factor);
  Put(s, "floats", buf);
  Put(s, "orig", std::to_string(p.rope_scaling.original_max_position_embeddings));
  Put(s, "prefix", p.tensor_prefix);
  return XXH64(s.data(), s.size(), 0x5350454355ull);  // agreement on the spec: an accident check, not evidence
}

uint32_t ModelHashOf(const ModelSource& source, const TensorIndex& index) {
  std::string digest;
  for (const auto& t : index.tensors()) {
    digest += t.name + "|" + t.file + "|" + std::string(DTypeName(t.dtype)) + "|" + std::to_string(t.offset) + "|";
    for (int64_t d : t.shape) digest += std::to_string(d) + ",";
    digest += ";";
  }
  return wire::ModelHash(source.ModelId(), source.Revision(), digest);
}

}  // namespace daisy
