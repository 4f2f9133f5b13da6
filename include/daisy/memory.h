// Memory budgets: sizes as people write them, what the OS says is available, and the
// process's peak resident set (thread-safe, no state); and large-page memory for weights and
// KV caches (thread-safe, one locked set of regions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/status.h"

namespace daisy {

// "512M", "4G", "1.5GiB", "3500MB", "4096" (bytes). K, M, G, T and KiB, MiB, GiB, TiB are
// powers of 1024; KB, MB, GB, TB powers of 1000; case-insensitive, a space before the
// unit allowed. Refuses anything else (empty, zero, negative, an unknown unit, more than
// 2^60 bytes) with an error that names the text.
Result<uint64_t> ParseMemorySize(std::string_view text);
// "3.50 GiB", "512.0 MiB", "900 B": for messages.
std::string FormatBytes(uint64_t bytes);
// MemAvailable of /proc/meminfo; 0 where it cannot be read.
uint64_t AvailableMemoryBytes();
// VmHWM of /proc/self/status: the peak resident set of this process so far (since the last
// ResetPeakRss); ProcessPeakRssBytes() where there is no /proc.
uint64_t PeakRssBytes();
// getrusage's ru_maxrss: the peak over the process's whole life (no reset).
uint64_t ProcessPeakRssBytes();
// Starts the peak over from the current resident set (Linux: "5" to /proc/self/clear_refs),
// so a later PeakRssBytes() measures one phase. False where the kernel does not allow it.
bool ResetPeakRss();

// Long-lived large buffers (model weights, the bandwidth probe): memory the kernel may back
// with 2 MiB pages (Linux: madvise MADV_HUGEPAGE before the first touch), because a decode
// streams every weight once per token and, with 4 KiB pages, a page walk every 4 KiB holds
// the stream back (docs/KERNELS.md "Weight memory": a one-core GEMV 19-25 against 25-29
// GB/s). Blocks from 64 KiB up share 64 MiB regions (a model's matrices are mostly below
// 2 MiB, too small for a large page of their own), taken in order and never reused; a
// region is returned when its last block is freed, and a freed block's whole pages are given
// back at once. Blocks above 32 MiB get a region of their own; blocks below 64 KiB come
// from operator new. Elsewhere than Linux, every block comes from operator new. 64-byte aligned;
// thread-safe; throws std::bad_alloc like operator new.
void* AllocateLargePages(size_t bytes);
void FreeLargePages(void* p, size_t bytes);
struct LargePageStats {
  size_t regions = 0;       // regions mapped now
  size_t region_bytes = 0;  // their size
  size_t live_blocks = 0;   // blocks allocated in them and not yet freed
};
LargePageStats GetLargePageStats();
// AnonHugePages of /proc/self/smaps_rollup: how much of this process's memory the kernel
// backs with large pages now; 0 where it cannot be read.
uint64_t HugePageBytes();

// A std::allocator for such buffers (stateless: any two are equal).
template <class T>
struct LargePageAllocator {
  using value_type = T;
  LargePageAllocator() = default;
  template <class U>
  explicit LargePageAllocator(const LargePageAllocator<U>& /*other*/) {}
  T* allocate(size_t n) { return static_cast<T*>(AllocateLargePages(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { FreeLargePages(p, n * sizeof(T)); }
  friend bool operator==(const LargePageAllocator& /*a*/, const LargePageAllocator& /*b*/) { return true; }
};
// int8 values in large-page memory: weights, KV caches.
using LargePageBytes = std::vector<int8_t, LargePageAllocator<int8_t>>;

}  // namespace daisy
