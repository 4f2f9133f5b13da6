#include "daisy/memory.h"

#include <sys/resource.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace daisy {

Result<uint64_t> ParseMemorySize(std::string_view text) {
  const std::string shown(text);
  auto refuse = [&](const std::string& why) {
    return InvalidArgument("memory size '" + shown + "': " + why + " (write e.g. 512M, 4G, 1.5GiB or 3500MB)");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number(text.substr(0, i));
  if (number.empty() || number == "." || number.find('.') != number.rfind('.'))
    return refuse("it does not start with a number");
  std::string unit;
  for (size_t k = i; k < text.size(); ++k) {
    if (text[k] == ' ' && unit.empty()) continue;
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[k])));
  }
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "k" || unit == "kib")
    scale = 0x1p10;
  else if (unit == "m" || unit == "mib")
    scale = 0x1p20;
  else if (unit == "g" || unit == "gib")
    scale = 0x1p30;
  else if (unit == "t" || unit == "tib")
    scale = 0x1p40;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "tb")
    scale = 1e12;
  else
    return refuse("unknown unit '" + unit + "'");
  const double bytes = std::strtod(number.c_str(), nullptr) * scale;
  if (!(bytes >= 1)) return refuse("it must be at least one byte");
  if (bytes > 0x1p60) return refuse("it is larger than 2^60 bytes");
  return static_cast<uint64_t>(std::floor(bytes));
}

std::string FormatBytes(uint64_t bytes) {
  char buf[48];
  const double b = static_cast<double>(bytes);
  if (bytes >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / 0x1p30);
  else if (bytes >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 0x1p20);
  else if (bytes >= (1ull << 10))
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 0x1p10);
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  return buf;
}

uint64_t AvailableMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

uint64_t PeakRssBytes() {
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) found = std::sscanf(line, "VmHWM: %llu kB", &kib) == 1;
    std::fclose(f);
    if (found) return static_cast<uint64_t>(kib) * 1024;
  }
  return ProcessPeakRssBytes();
}

uint64_t ProcessPeakRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

bool ResetPeakRss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace daisy
