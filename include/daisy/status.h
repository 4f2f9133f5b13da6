// Status and Result<T>: the error policy of the project (see docs/ARCHITECTURE.md).
// Expected failures (bad input, HTTP errors, a peer hanging up) travel as Status with a
// message that names what was wrong; programmer errors go through DAISY_CHECK ("Bug: ...").
// Library code never calls exit(). Value types; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace daisy {

enum class ErrorCode : uint8_t {
  kOk = 0,
  kInvalidArgument,   // user input or a file is malformed
  kNotFound,          // repo, revision, file or tensor does not exist
  kPermissionDenied,  // credentials present but not allowed (HTTP 403)
  kUnauthenticated,   // credentials needed (HTTP 401)
  kUnavailable,       // transient: 5xx, timeout, reset; retrying may help
  kDataLoss,          // bytes arrived but are not what was promised
  kUnimplemented,     // recognised but refused (unsupported dtype, architecture, ...)
  kOutOfRange,
  kInternal,
  kAborted,
  kFailedPrecondition,  // the system is not in a state for this yet (e.g. no model loaded)
  kResourceExhausted,   // a limit was reached (too many requests); later may succeed
};

std::string_view ErrorCodeName(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "not found: config.json in owner/name" style.
  std::string ToString() const;
  // Returns a copy whose message is "context: message".
  Status WithContext(std::string_view context) const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {ErrorCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) {
  return {ErrorCode::kNotFound, std::move(m)};
}
inline Status PermissionDenied(std::string m) {
  return {ErrorCode::kPermissionDenied, std::move(m)};
}
inline Status Unauthenticated(std::string m) {
  return {ErrorCode::kUnauthenticated, std::move(m)};
}
inline Status Unavailable(std::string m) {
  return {ErrorCode::kUnavailable, std::move(m)};
}
inline Status DataLoss(std::string m) {
  return {ErrorCode::kDataLoss, std::move(m)};
}
inline Status Unimplemented(std::string m) {
  return {ErrorCode::kUnimplemented, std::move(m)};
}
inline Status OutOfRange(std::string m) {
  return {ErrorCode::kOutOfRange, std::move(m)};
}
inline Status Internal(std::string m) {
  return {ErrorCode::kInternal, std::move(m)};
}
inline Status Aborted(std::string m) {
  return {ErrorCode::kAborted, std::move(m)};
}
inline Status FailedPrecondition(std::string m) {
  return {ErrorCode::kFailedPrecondition, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {ErrorCode::kResourceExhausted, std::move(m)};
}

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) v_ = Status(ErrorCode::kInternal, "Bug: Result built from OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, std::string_view msg);

}  // namespace daisy

// Always-on check for programmer errors. Never use it on peer- or user-controlled values.
#define DAISY_CHECK(cond, msg)                                           \
  do {                                                                   \
    if (!(cond)) ::daisy::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

#define DAISY_CONCAT_INNER(a, b) a##b
#define DAISY_CONCAT(a, b) DAISY_CONCAT_INNER(a, b)

#define DAISY_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::daisy::Status daisy_status_ = (expr);        \
    if (!daisy_status_.ok()) return daisy_status_; \
  } while (0)

// tmp and lhs are declarations ("auto x"), which parentheses would break.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DAISY_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)

#define DAISY_ASSIGN_OR_RETURN(lhs, expr) DAISY_ASSIGN_OR_RETURN_IMPL(DAISY_CONCAT(daisy_result_, __LINE__), lhs, expr)
