// The Hugging Face Hub as a ModelSource: each file of a repo is read by HTTP byte ranges
// ({endpoint}/{owner}/{name}/resolve/{revision}/{file}), the revision is pinned to one commit
// by the first request, and fetched ranges are kept in an on-disk cache keyed by commit.
// See docs/HUB.md for the URL scheme, retries, cache layout and the token rules.
//
// Thread-safety: a Hub ModelSource and every ByteSource opened from it may be used from
// several threads at once (each request has its own curl handle; the pinned commit, the
// token and the connection pool are shared under locks). The progress callback is called
// from whichever thread is reading, one call at a time.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "daisy/source.h"
#include "daisy/status.h"

namespace daisy {

// A Hugging Face token given while the program runs (serve's web UI asks for one after a
// load was refused for want of it), held in memory only: never written, never logged (it is
// registered for redaction at once). A source opened with it asks it before every request,
// so a token set after a refusal, or forgotten, counts from the next request. Thread-safe.
class RuntimeToken {
 public:
  // InvalidArgument (not naming the token) unless 4 to 1024 printable characters without
  // spaces, as an HTTP header needs.
  Status Set(std::string_view token);
  // Overwrites the held copy and drops it; the redaction forgets it too.
  void Forget();
  bool has() const;
  std::optional<std::string> Get() const;
  ~RuntimeToken() { Forget(); }

 private:
  mutable std::mutex mu_;
  std::string token_;
};

struct HubOptions {
  std::string endpoint;              // empty: $HF_ENDPOINT or https://huggingface.co
  std::optional<std::string> token;  // empty: $HF_TOKEN, the token file, or a prompt
  // When set and holding a token, that token is sent instead of the ones above.
  std::shared_ptr<RuntimeToken> runtime_token;
  bool allow_token_prompt = true;  // no-echo prompt on a terminal after a 401
  bool use_cache = true;
  std::string cache_dir;           // empty: $DAISY_CACHE_DIR, $XDG_CACHE_HOME/daisychain,
                                   // or ~/.cache/daisychain
  ProgressFn progress;             // ranged reads report bytes done/total; may be empty
  int max_attempts = 5;            // tries per request for transient failures
  double initial_backoff_s = 0.5;  // doubles after each failed try
  double timeout_s = 60;           // a request making no progress this long fails
};

// The Hub base URL `options` reach: options.endpoint, else $HF_ENDPOINT, else
// https://huggingface.co, without a trailing '/' (serve tells browser tabs, which fetch
// their own layers). InvalidArgument when it is not an http(s) URL without a query.
Result<std::string> HubEndpoint(const HubOptions& options);

// "owner/name": two parts of [A-Za-z0-9._-], each 1..96 characters, not starting or ending
// with '.' or '-', no ".." or "--". Checked before any id goes into a URL.
Status ValidateRepoId(std::string_view repo);
// A branch, tag or commit: [A-Za-z0-9._-] and '/' between non-empty parts (refs/pr/1),
// at most 128 characters, no "..", no part starting with '.' or '-'.
Status ValidateRevision(std::string_view rev);

struct HubRef {
  std::string repo;      // "owner/name"
  std::string revision;  // "main" when SRC names none
};
// Parses and validates "owner/name[@revision]".
Result<HubRef> ParseHubRef(std::string_view src);

// SRC is a local folder when it exists as a directory or starts with '/', './' or '../';
// otherwise it is a Hub ref "owner/name[@revision]".
Result<std::unique_ptr<ModelSource>> OpenModelSource(const std::string& src, const HubOptions& options);
// Cheap: sends no request. The revision is pinned to a commit by the first request (or by
// Revision(), which sends one HEAD request if nothing has been read yet).
Result<std::unique_ptr<ModelSource>> OpenHubRepo(const HubRef& ref, const HubOptions& options);

// A small exchange with a service on the LAN, through the Hub client's HTTP code (one
// libcurl wrapper): plain http only, no redirects followed, 10 s at most, answers up to
// 1 MiB. Used to join a room (GET /api/key, POST /api/join). Unavailable: no connection.
struct LanAnswer {
  long status = 0;
  std::string body;
};
namespace hub {
Result<LanAnswer> LanExchange(const std::string& url, const std::string* post_json);
}  // namespace hub

// A progress bar on stderr (one line redrawn with '\r', at most ~10 times a second) for
// transfers of 1 MiB or more. Returns an empty function when stderr is not a terminal.
ProgressFn TerminalProgressBar(std::string label);

}  // namespace daisy
