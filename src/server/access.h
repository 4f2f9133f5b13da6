// Internal: who may use which endpoint of `serve` (docs/HTTP.md, "Access"). A pure
// decision on a request's method, path, headers and real client address, taken before
// the body is read; tested alone in access_test.cc with made-up addresses.
//
// - The join endpoints (GET /api/key, POST /api/join) are how strangers ask: open to all.
// - The host's UI (/, /index.html, /api/*) needs the admin secret, sent as the cookie that
//   GET /?token=SECRET sets (HttpOnly, SameSite=Strict).
// - The OpenAI-compatible API (/v1/*, /apply-template) needs "Authorization: Bearer KEY"
//   when serve has an API key; without one it answers clients on this machine only.
// - Every endpoint but the join ones checks Host (an IP literal, localhost or a name the
//   host allowed: against DNS rebinding) and Origin (absent, or this very origin: against
//   cross-site requests); every POST must be application/json (no cross-site form posts).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "api.h"

namespace daisy::srv {

struct AccessPolicy {
  std::string admin_secret;                // required; never empty
  std::string api_key;                     // "": the OpenAI API answers loopback clients only
  std::vector<std::string> allowed_hosts;  // Host names allowed besides IP literals and localhost
};

struct AccessRequest {
  std::string method;                 // "GET", "POST", ...
  std::string path;                   // without the query
  std::optional<std::string> host;    // the Host header
  std::optional<std::string> origin;  // the Origin header
  std::string content_type;
  std::string cookie;         // the Cookie header(s), joined with "; "
  std::string authorization;  // the Authorization header
  std::string token;          // GET /?token=...: the page route checks it and sets the cookie
  std::string client;         // the real client address (the port mux's, else the peer's)
};

enum class EndpointClass { kJoin, kPage, kAsset, kAdmin, kApi };
EndpointClass ClassOf(const std::string& path);

// nullopt: allowed. Otherwise the refusal to send (the message never holds a secret).
std::optional<ApiError> CheckAccess(const AccessPolicy& policy, const AccessRequest& req);

// True when the request carries the admin secret in a daisy_admin* cookie.
bool HasAdminCookie(const AccessPolicy& policy, const std::string& cookie_header);

// 127.0.0.1 and ::1 (also as ::ffff:127.0.0.1): the machine serve runs on. The rest of
// 127.0.0.0/8 is not counted, so that a test can play "another address" on loopback.
bool IsLoopbackClient(const std::string& address);

// An address serve is asked to listen on that only this machine reaches (127.0.0.0/8,
// ::1, localhost): anything else is served to the network and serve warns at start.
bool IsLoopbackListen(const std::string& host);

// Equal strings, compared in time that does not depend on where they differ.
bool SecretEquals(const std::string& a, const std::string& b);

// 32 random bytes from the OS, as 64 hex digits.
std::string NewSecret();

// The cookie that GET /?token=SECRET sets: named after the port of `host_header` (cookies
// ignore ports: two serves on one machine must not overwrite each other's).
std::string AdminCookie(const std::string& host_header, const std::string& secret);

}  // namespace daisy::srv
