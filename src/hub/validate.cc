// Repo id and revision validation: everything that goes into a Hub URL is checked here
// first, so a crafted SRC can never change the path or the query of a request.
#include <filesystem>

#include "daisy/hub.h"

namespace daisy {
namespace {

constexpr size_t kMaxRepoPart = 96;
constexpr size_t kMaxRevision = 128;

bool IsIdChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

// One path part of a repo id or a revision: non-empty, bounded, [A-Za-z0-9._-].
Status ValidatePart(std::string_view part, std::string_view what, std::string_view whole, size_t max_len) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument("invalid " + std::string(what) + " '" + std::string(whole) + "': " + std::string(why));
  };
  if (part.empty()) return bad("empty part");
  if (part.size() > max_len) return bad("a part is longer than " + std::to_string(max_len) + " characters");
  for (char c : part)
    if (!IsIdChar(c)) return bad("only letters, digits, '.', '_' and '-' are allowed");
  if (part.front() == '.' || part.front() == '-') return bad("a part may not start with '.' or '-'");
  if (part.find("..") != std::string_view::npos) return bad("'..' is not allowed");
  return Status::Ok();
}

}  // namespace

Status ValidateRepoId(std::string_view repo) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument("invalid repo id '" + std::string(repo) + "': " + std::string(why));
  };
  if (repo.size() > 2 * kMaxRepoPart + 1) return bad("too long");
  size_t slash = repo.find('/');
  if (slash == std::string_view::npos) return bad("expected owner/name");
  if (repo.find('/', slash + 1) != std::string_view::npos) return bad("expected exactly one '/' (owner/name)");
  for (std::string_view part : {repo.substr(0, slash), repo.substr(slash + 1)}) {
    DAISY_RETURN_IF_ERROR(ValidatePart(part, "repo id", repo, kMaxRepoPart));
    // The Hub itself forbids these; refusing them keeps ids unambiguous in cache paths.
    if (part.back() == '.' || part.back() == '-') return bad("a part may not end with '.' or '-'");
    if (part.find("--") != std::string_view::npos) return bad("'--' is not allowed");
  }
  return Status::Ok();
}

Status ValidateRevision(std::string_view rev) {
  if (rev.size() > kMaxRevision)
    return InvalidArgument("invalid revision: longer than " + std::to_string(kMaxRevision) + " characters");
  // '/' separates non-empty parts (refs/pr/1); each part is checked like a repo id part, so
  // no part can be "." or "..". The URL builder percent-encodes the '/'.
  size_t start = 0;
  while (true) {
    size_t slash = rev.find('/', start);
    std::string_view part = rev.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    DAISY_RETURN_IF_ERROR(ValidatePart(part, "revision", rev, kMaxRevision));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return Status::Ok();
}

Result<HubRef> ParseHubRef(std::string_view src) {
  HubRef ref;
  size_t at = src.find('@');
  ref.repo = std::string(src.substr(0, at));
  ref.revision = at == std::string_view::npos ? "main" : std::string(src.substr(at + 1));
  DAISY_RETURN_IF_ERROR(ValidateRepoId(ref.repo));
  DAISY_RETURN_IF_ERROR(ValidateRevision(ref.revision));
  return ref;
}

Result<std::unique_ptr<ModelSource>> OpenModelSource(const std::string& src, const HubOptions& options) {
  std::error_code ec;
  bool looks_local =
      src.starts_with("/") || src.starts_with("./") || src.starts_with("../") || src == "." || src == "..";
  if (looks_local || std::filesystem::is_directory(src, ec)) return OpenLocalFolder(src);
  auto ref = ParseHubRef(src);
  if (!ref.ok())
    return ref.status().WithContext("'" + src +
                                    "' is neither a local folder nor a Hub repo id (owner/name[@revision])");
  return OpenHubRepo(*ref, options);
}

}  // namespace daisy
