// Memory budgets: sizes as people write them, what the OS says is available, and the
// process's peak resident set. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

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

}  // namespace daisy
