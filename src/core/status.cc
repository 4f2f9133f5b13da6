#include "daisy/status.h"

#include <cstdio>
#include <cstdlib>

namespace daisy {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kPermissionDenied:
      return "permission denied";
    case ErrorCode::kUnauthenticated:
      return "unauthenticated";
    case ErrorCode::kUnavailable:
      return "unavailable";
    case ErrorCode::kDataLoss:
      return "data loss";
    case ErrorCode::kUnimplemented:
      return "unsupported";
    case ErrorCode::kOutOfRange:
      return "out of range";
    case ErrorCode::kInternal:
      return "internal error";
    case ErrorCode::kAborted:
      return "aborted";
    case ErrorCode::kFailedPrecondition:
      return "failed_precondition";
    case ErrorCode::kResourceExhausted:
      return "resource exhausted";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return message_;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

void CheckFailed(const char* file, int line, const char* cond, std::string_view msg) {
  std::fprintf(stderr, "Bug: %.*s (check '%s' failed at %s:%d)\n", static_cast<int>(msg.size()), msg.data(), cond, file,
               line);
  std::abort();
}

}  // namespace daisy
