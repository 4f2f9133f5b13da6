// The terminal progress bar: one line on stderr, redrawn with '\r' at most ten times a
// second, finished with a newline when the transfer completes.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "daisy/hub.h"

namespace daisy {
namespace {

std::string Megabytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / 1e6);
  return buf;
}

std::string Duration(double s) {
  if (!(s >= 0) || s > 359999) return "--:--";
  long t = std::lround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

}  // namespace

ProgressFn TerminalProgressBar(std::string label) {
  if (!::isatty(STDERR_FILENO)) return {};
  struct State {
    std::mutex mu;
    std::chrono::steady_clock::time_point last{};
    bool drawn = false;
  };
  auto state = std::make_shared<State>();
  return [state, label = std::move(label)](const TransferProgress& p) {
    constexpr uint64_t kMinBytes = 1u << 20;  // small files would only flicker
    if (p.bytes_total < kMinBytes) return;
    std::lock_guard<std::mutex> lock(state->mu);
    bool done = p.bytes_done >= p.bytes_total;
    auto now = std::chrono::steady_clock::now();
    if (!done && state->drawn && now - state->last < std::chrono::milliseconds(100)) return;
    state->last = now;
    state->drawn = !done;
    constexpr int kWidth = 30;
    double frac = static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total);
    int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    double rate = p.BytesPerSecond();
    double eta = rate > 0 ? static_cast<double>(p.bytes_total - p.bytes_done) / rate : -1;
    std::fprintf(stderr, "\r%s [%s] %3d%% %s/%s MB %s MB/s %s %s\033[K%s", label.c_str(), bar.c_str(),
                 static_cast<int>(frac * 100), Megabytes(p.bytes_done).c_str(), Megabytes(p.bytes_total).c_str(),
                 Megabytes(static_cast<uint64_t>(rate)).c_str(), done ? "in" : "ETA",
                 done ? Duration(p.seconds).c_str() : Duration(eta).c_str(), done ? "\n" : "");
    std::fflush(stderr);
  };
}

}  // namespace daisy
