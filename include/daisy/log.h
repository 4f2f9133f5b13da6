// Logging with secret redaction. Every line goes through Redact(), which replaces each
// registered secret (the Hub token) by "[redacted]", so a token that slips into a message
// never reaches stderr or a captured log. Thread-safe.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace daisy {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kSilent = 4 };

// Registers a secret to be scrubbed from every log line and from RedactedMessage().
// Empty strings and strings shorter than 4 characters are ignored (they would match noise).
void RegisterSecret(std::string_view secret);
// Unregisters a secret that is gone (a token the user asked to forget): its copy here goes.
void ForgetSecret(std::string_view secret);
// Returns text with every registered secret replaced by "[redacted]".
std::string Redact(std::string_view text);

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Replaces the sink (default: stderr). The sink receives already-redacted lines without
// a trailing newline. Pass nullptr to restore stderr. Used by tests to capture output.
void SetLogSink(std::function<void(LogLevel, std::string_view)> sink);

void Log(LogLevel level, std::string_view message);
inline void LogDebug(std::string_view m) {
  Log(LogLevel::kDebug, m);
}
inline void LogInfo(std::string_view m) {
  Log(LogLevel::kInfo, m);
}
inline void LogWarning(std::string_view m) {
  Log(LogLevel::kWarning, m);
}
inline void LogError(std::string_view m) {
  Log(LogLevel::kError, m);
}

}  // namespace daisy
