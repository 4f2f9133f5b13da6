// Device identity: where a device keeps its keys and settings, and its memory budget.
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

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

}  // namespace daisy
