// Internal: one HTTP exchange with libcurl, without following redirects, so the Hub client
// decides itself where the Authorization header may go. Not part of the public surface.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "daisy/status.h"

namespace daisy::hub {

// Response headers, names in lower case; a repeated header keeps its last value.
using Headers = std::map<std::string, std::string>;

// scheme://host:port with the default port filled in; what decides whether a redirect
// target is still the Hub (and may see the token).
struct Origin {
  std::string scheme;
  std::string host;
  std::string port;
  bool operator==(const Origin&) const = default;
};
Result<Origin> ParseOrigin(const std::string& url);
// The URL without its query and fragment (signed CDN URLs carry credentials there).
std::string UrlForMessage(const std::string& url);

// A libcurl share handle (connections, DNS, TLS sessions) so consecutive range requests
// reuse connections. Thread-safe; must outlive every request that uses it.
class ConnectionPool {
 public:
  ConnectionPool();
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;
  void* share() const { return share_; }

 private:
  struct Locks;
  std::unique_ptr<Locks> locks_;
  void* share_ = nullptr;
};

struct HopRequest {
  std::string url;
  bool head = false;
  std::optional<std::pair<uint64_t, uint64_t>> range;  // first and last byte, inclusive
  std::string bearer_token;                            // empty: no Authorization header
  double timeout_s = 60;
  const std::string* post_json = nullptr;  // set: a POST of this JSON body
  bool http_only = false;                  // refuse https (LAN services speak plain http)
};

struct HopResponse {
  bool transport_ok = false;    // false: connection failed, reset, timed out, cut short
  std::string transport_error;  // curl's message (never contains request headers)
  long status = 0;
  Headers headers;
  std::string redirect_url;  // absolute, resolved against the request URL ("" if none)
  uint64_t body_bytes = 0;   // bytes passed to on_body
  Status body_status;        // non-OK when on_start or on_body stopped the transfer
};

// Called once per exchange when the response head is complete, before any body byte (or
// after the exchange when the body is empty). Sets *deliver to pass the body to on_body;
// otherwise the body is discarded. A non-OK return stops the transfer.
using StartFn = std::function<Status(long status, const Headers& headers, bool* deliver)>;
using BodyFn = std::function<Status(std::span<const uint8_t> chunk)>;

HopResponse PerformHop(const ConnectionPool& pool, const HopRequest& request, const StartFn& on_start,
                       const BodyFn& on_body);

}  // namespace daisy::hub
