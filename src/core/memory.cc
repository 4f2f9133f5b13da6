#include "daisy/memory.h"

#include <sys/resource.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <vector>

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

namespace {
// The "<key> N kB" line of a /proc file, in bytes; false where the file or the line is missing.
bool ProcKib(const char* path, const char* key, uint64_t* bytes) {
  std::FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char line[256];
  const size_t key_len = std::strlen(key);
  bool found = false;
  unsigned long long kib = 0;
  while (!found && std::fgets(line, sizeof line, f))
    found = std::strncmp(line, key, key_len) == 0 && std::sscanf(line + key_len, " %llu kB", &kib) == 1;
  std::fclose(f);
  if (found) *bytes = static_cast<uint64_t>(kib) * 1024;
  return found;
}
}  // namespace

uint64_t PeakRssBytes() {
  uint64_t bytes = 0;
  return ProcKib("/proc/self/status", "VmHWM:", &bytes) ? bytes : ProcessPeakRssBytes();
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

// Large-page regions where the OS has the advice; operator new elsewhere.
#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define DAISY_LARGE_PAGE_REGIONS 1
#endif

namespace {

constexpr size_t kAlign = 64;
#if DAISY_LARGE_PAGE_REGIONS
constexpr size_t kSmallBytes = size_t{64} << 10;   // below: operator new
constexpr size_t kRegionBytes = size_t{64} << 20;  // shared regions
constexpr size_t kLargePage = size_t{2} << 20;
constexpr size_t kPage = 4096;

size_t RoundUp(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

struct Region {
  char* base = nullptr;  // kLargePage-aligned
  size_t size = 0;
  size_t used = 0;  // blocks are taken in order; freed space is not reused
  size_t live = 0;
};

// The regions, under a lock: blocks are a model's matrices (hundreds), not a hot path. A
// region of its own is full from the start (used == size), so only shared regions have room.
struct Regions {
  std::mutex mu;
  std::vector<Region> all;

  // A kLargePage-aligned mapping of `size` bytes, advised for large pages before any touch.
  static char* Map(size_t size) {
    void* raw = mmap(nullptr, size + kLargePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = RoundUp(start, kLargePage);
    // Give back the unaligned head and tail of the over-sized mapping.
    if (aligned > start) munmap(raw, aligned - start);
    const uintptr_t end = start + size + kLargePage;
    if (end > aligned + size)
      munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));  // NOLINT(performance-no-int-to-ptr)
    void* p = reinterpret_cast<void*>(aligned);                                 // NOLINT(performance-no-int-to-ptr)
    madvise(p, size, MADV_HUGEPAGE);  // advice: a kernel without THP ignores it
    return static_cast<char*>(p);
  }

  void* Allocate(size_t bytes) {
    const std::lock_guard<std::mutex> lock(mu);
    if (bytes > kRegionBytes / 2) {  // a region of its own
      const size_t size = RoundUp(bytes, kLargePage);
      all.push_back(Region{Map(size), size, size, 1});
      return all.back().base;
    }
    const size_t need = RoundUp(bytes, kAlign);
    auto room = std::find_if(all.rbegin(), all.rend(), [need](const Region& r) { return r.size - r.used >= need; });
    Region& r = room != all.rend() ? *room : all.emplace_back(Region{Map(kRegionBytes), kRegionBytes, 0, 0});
    char* p = r.base + r.used;
    r.used += need;
    ++r.live;
    return p;
  }

  void Free(void* ptr, size_t bytes) {
    const std::lock_guard<std::mutex> lock(mu);
    char* p = static_cast<char*>(ptr);
    const auto r =
        std::find_if(all.begin(), all.end(), [p](const Region& g) { return p >= g.base && p < g.base + g.size; });
    if (r == all.end()) {
      // Not a block of these regions: a caller's bug that must not go on.
      std::fprintf(stderr, "Bug: FreeLargePages of %zu bytes at %p, which no large-page region holds\n", bytes, ptr);
      std::abort();
    }
    if (--r->live == 0) {
      munmap(r->base, r->size);
      all.erase(r);
      return;
    }
    // The block's whole pages go back now: the region lives on for its other blocks.
    const uintptr_t from = RoundUp(reinterpret_cast<uintptr_t>(p), kPage);
    const uintptr_t to = (reinterpret_cast<uintptr_t>(p) + bytes) / kPage * kPage;
    if (to > from) madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);  // NOLINT
  }
};

Regions& TheRegions() {
  static Regions* regions = new Regions;  // never destroyed: blocks may outlive static teardown
  return *regions;
}
#endif

}  // namespace

void* AllocateLargePages(size_t bytes) {
#if DAISY_LARGE_PAGE_REGIONS
  if (bytes >= kSmallBytes) return TheRegions().Allocate(bytes);
#endif
  return ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{kAlign});
}

void FreeLargePages(void* p, size_t bytes) {
  if (!p) return;
#if DAISY_LARGE_PAGE_REGIONS
  if (bytes >= kSmallBytes) {
    TheRegions().Free(p, bytes);
    return;
  }
#endif
  ::operator delete (p, std::align_val_t{kAlign});
}

LargePageStats GetLargePageStats() {
  LargePageStats s;
#if DAISY_LARGE_PAGE_REGIONS
  Regions& r = TheRegions();
  const std::lock_guard<std::mutex> lock(r.mu);
  for (const Region& g : r.all) {
    ++s.regions;
    s.region_bytes += g.size;
    s.live_blocks += g.live;
  }
#endif
  return s;
}

uint64_t HugePageBytes() {
  uint64_t bytes = 0;
  return ProcKib("/proc/self/smaps_rollup", "AnonHugePages:", &bytes) ? bytes : 0;
}

}  // namespace daisy
