// TestHub: a real HTTP server that behaves like the Hugging Face Hub for the parts the Hub
// client uses, on 127.0.0.1 at ephemeral ports, so tests never reach the internet.
//
// It serves ROOT/owner/name/<files> at /owner/name/resolve/<revision>/<file>, where the
// revision is "main" or the repo's fixed commit (CommitFor). Files larger than the redirect
// threshold are redirected (302) to a second server, like the Hub's CDN, which records
// whether a request carried an Authorization header. Ranges are served by pread, so a
// sparse multi-GB file costs nothing. Switches inject the failures the client must handle.
// Both servers answer browsers as the Hub does: CORS headers on every answer (any origin,
// the Content-Range, ETag, X-Repo-Commit, ... headers exposed) and OPTIONS preflights for
// Range and Authorization (recorded as method "OPTIONS").
// Thread-safe: switches and counters may be used while requests are in flight.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/status.h"

namespace daisy::testing {

struct TestHubRequest {
  std::string server;  // "hub" or "cdn"
  std::string method;
  std::string path;   // decoded, without the query
  std::string range;  // the Range header, "" if none
  int status = 0;
  bool had_auth = false;
};

class TestHub {
 public:
  // Starts both servers. port 0 picks a free port for the hub (the CDN always does).
  static Result<std::unique_ptr<TestHub>> Start(std::string root, int port = 0);
  ~TestHub();  // stops both servers and joins their threads
  TestHub(const TestHub&) = delete;
  TestHub& operator=(const TestHub&) = delete;

  std::string endpoint() const;      // "http://127.0.0.1:PORT"
  std::string cdn_endpoint() const;  // the redirect target
  int port() const;
  // The fixed 40-hex commit the hub reports for `repo` (a hash of its id).
  static std::string CommitFor(std::string_view repo);

  // Gated repos answer 401 (X-Error-Code: GatedRepo) without a token, 403 with another one.
  void Gate(const std::string& repo);
  void SetToken(const std::string& token);
  // Files strictly larger than this are redirected to the CDN server (default: never).
  void SetRedirectAbove(uint64_t bytes);
  // Requests for `from` are answered 307 with a relative Location into `to` (a renamed repo).
  void AddRename(const std::string& from, const std::string& to);
  // Answer ranged requests with 200 and the whole file.
  void SetIgnoreRanges(bool ignore);
  // The next n requests (either server) get `status` and no body.
  void FailNextRequests(int n, int status = 503);
  // The next response with a body (either server) is cut after `bytes` body bytes.
  void CutNextResponseAfter(uint64_t bytes);
  // The next response with a body (either server) pauses for `ms` milliseconds after
  // `bytes` body bytes, then goes on if the client is still there.
  void StallNextResponseAfter(uint64_t bytes, int ms);
  // Every response with a body sends at most this many bytes a second (0: unlimited), and
  // each of at least `min_length` body bytes waits `ms` before its first byte (0: none): a
  // slow server, for load-time tests.
  void SetBandwidthLimit(uint64_t bytes_per_s);
  void SetFirstByteDelay(int ms, uint64_t min_length = 0);

  int request_count() const;         // both servers, since the last ResetCounters()
  uint64_t body_bytes_sent() const;  // file bytes written (error and redirect bodies not counted)
  std::vector<TestHubRequest> requests() const;
  bool cdn_saw_authorization() const;
  void ResetCounters();

 private:
  struct Impl;
  explicit TestHub(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace daisy::testing
