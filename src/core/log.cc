#include "daisy/log.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <vector>

namespace daisy {
namespace {

struct LogState {
  std::mutex mu;
  std::vector<std::string> secrets;
  LogLevel level = LogLevel::kInfo;
  std::function<void(LogLevel, std::string_view)> sink;
};

LogState& State() {
  static LogState* state = new LogState();  // never destroyed: logging may run at exit
  return *state;
}

std::string RedactLocked(const LogState& st, std::string_view text) {
  std::string out(text);
  for (const std::string& s : st.secrets) {
    size_t pos = 0;
    while ((pos = out.find(s, pos)) != std::string::npos) {
      out.replace(pos, s.size(), "[redacted]");
      pos += 10;
    }
  }
  return out;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
    case LogLevel::kSilent:
      return "";
  }
  return "";
}

}  // namespace

void RegisterSecret(std::string_view secret) {
  if (secret.size() < 4) return;
  LogState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  for (const std::string& s : st.secrets)
    if (s == secret) return;
  st.secrets.emplace_back(secret);
}

void ForgetSecret(std::string_view secret) {
  LogState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  for (auto it = st.secrets.begin(); it != st.secrets.end(); ++it)
    if (*it == secret) {
      std::fill(it->begin(), it->end(), '\0');
      st.secrets.erase(it);
      return;
    }
}

std::string Redact(std::string_view text) {
  LogState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  return RedactLocked(st, text);
}

void SetLogLevel(LogLevel level) {
  LogState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  st.level = level;
}

LogLevel GetLogLevel() {
  LogState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.level;
}

void SetLogSink(std::function<void(LogLevel, std::string_view)> sink) {
  LogState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  st.sink = std::move(sink);
}

void Log(LogLevel level, std::string_view message) {
  LogState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  if (level < st.level || level == LogLevel::kSilent) return;
  std::string line = RedactLocked(st, message);
  if (st.sink) {
    st.sink(level, line);
    return;
  }
  std::fprintf(stderr, "[%s] %s\n", LevelName(level), line.c_str());
}

}  // namespace daisy
