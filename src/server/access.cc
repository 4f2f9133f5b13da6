// Who may use which endpoint (access.h): Host, Origin, content type, then the secret.
#include "access.h"

#include <arpa/inet.h>
#include <sys/random.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <random>

namespace daisy::srv {

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

bool IsV4(const std::string& s) {
  in_addr a{};
  return ::inet_pton(AF_INET, s.c_str(), &a) == 1;
}
bool IsV6(const std::string& s) {
  in6_addr a{};
  return ::inet_pton(AF_INET6, s.c_str(), &a) == 1;
}

// The name part of a Host header ("" when malformed): "a.b:8788" -> "a.b", "[::1]:1" -> "::1".
std::string HostName(const std::string& host) {
  std::string name, port;
  bool has_port = false;
  if (!host.empty() && host[0] == '[') {
    const size_t close = host.find(']');
    if (close == std::string::npos) return "";
    name = host.substr(1, close - 1);
    const std::string rest = host.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return "";
      port = rest.substr(1);
      has_port = true;
    }
    if (!IsV6(name)) return "";
  } else {
    if (std::count(host.begin(), host.end(), ':') > 1) return "";  // a bare IPv6 address is no Host
    const size_t colon = host.find(':');
    name = host.substr(0, colon);
    if (colon != std::string::npos) {
      port = host.substr(colon + 1);
      has_port = true;
    }
  }
  if (has_port &&
      (port.empty() || !std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); })))
    return "";
  return Lower(name);
}

ApiError Refuse(int status, std::string code, std::string message, std::string type = "invalid_request_error") {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  return e;
}

}  // namespace

EndpointClass ClassOf(const std::string& path) {
  if (path == "/api/key" || path == "/api/join") return EndpointClass::kJoin;
  if (path == "/" || path == "/index.html") return EndpointClass::kPage;
  if (path.rfind("/api/", 0) == 0) return EndpointClass::kAdmin;
  if (path.rfind("/v1/", 0) == 0 || path == "/v1" || path == "/apply-template") return EndpointClass::kApi;
  return EndpointClass::kAsset;  // the UI's script and style, and unknown paths (404)
}

bool SecretEquals(const std::string& a, const std::string& b) {
  // Lengths are no secret (every secret serve makes is 64 hex digits).
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool HasAdminCookie(const AccessPolicy& policy, const std::string& cookie_header) {
  if (policy.admin_secret.empty()) return false;
  size_t at = 0;
  bool found = false;
  while (at <= cookie_header.size()) {
    size_t end = cookie_header.find(';', at);
    if (end == std::string::npos) end = cookie_header.size();
    const std::string pair = Trim(cookie_header.substr(at, end - at));
    const size_t eq = pair.find('=');
    if (eq != std::string::npos && pair.rfind("daisy_admin", 0) == 0 && eq >= 11) {
      // Every cookie is compared: which one matched says nothing through timing.
      found = SecretEquals(pair.substr(eq + 1), policy.admin_secret) || found;
    }
    at = end + 1;
  }
  return found;
}

bool IsLoopbackClient(const std::string& address) {
  in_addr a4{};
  if (::inet_pton(AF_INET, address.c_str(), &a4) == 1) return ntohl(a4.s_addr) == INADDR_LOOPBACK;
  in6_addr a6{};
  if (::inet_pton(AF_INET6, address.c_str(), &a6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
  if (IN6_IS_ADDR_V4MAPPED(&a6)) {
    uint32_t v4;
    std::memcpy(&v4, &a6.s6_addr[12], 4);
    return ntohl(v4) == INADDR_LOOPBACK;
  }
  return false;
}

bool IsLoopbackListen(const std::string& host) {
  if (Lower(host) == "localhost") return true;
  in_addr a4{};
  if (::inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  return ::inet_pton(AF_INET6, host.c_str(), &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

std::string NewSecret() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got < sizeof bytes) {  // no getrandom (old kernel): the OS's random device all the same
    std::random_device rd;
    for (auto& b : bytes) b = static_cast<unsigned char>(rd());
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

std::string AdminCookie(const std::string& host_header, const std::string& secret) {
  std::string port;
  const size_t colon = host_header.rfind(':');
  if (colon != std::string::npos && host_header.find(']', colon) == std::string::npos)
    port = host_header.substr(colon + 1);
  if (!std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); })) port.clear();
  return "daisy_admin" + (port.empty() ? "" : "_" + port) + "=" + secret + "; Path=/; HttpOnly; SameSite=Strict";
}

std::optional<ApiError> CheckAccess(const AccessPolicy& policy, const AccessRequest& req) {
  const EndpointClass cls = ClassOf(req.path);
  // A POST's body is JSON everywhere: a cross-site HTML form can send only form encodings
  // and text/plain, and a cross-site fetch of application/json needs a CORS preflight,
  // which this server never grants.
  if (req.method == "POST") {
    const std::string type = Lower(Trim(req.content_type.substr(0, req.content_type.find(';'))));
    if (type != "application/json")
      return Refuse(415, "unsupported_media_type",
                    "the body must be JSON sent as Content-Type: application/json (got " +
                        (req.content_type.empty() ? std::string("none") : "'" + req.content_type.substr(0, 100) + "'") +
                        ")");
  }
  if (cls == EndpointClass::kJoin) return std::nullopt;  // how devices ask: approval stays the host's

  // DNS rebinding: a page of evil.example whose name now points here sends Host:
  // evil.example. Only names that cannot be rebound (IP literals, localhost) or that the
  // host named are served.
  const std::string name = req.host ? HostName(*req.host) : "";
  bool host_ok = !name.empty() && (IsV4(name) || IsV6(name) || name == "localhost");
  for (const auto& h : policy.allowed_hosts) host_ok = host_ok || (!name.empty() && Lower(h) == name);
  if (!host_ok)
    return Refuse(403, "host_not_allowed",
                  "the Host header " + (req.host ? "'" + req.host->substr(0, 100) + "'" : std::string("(none)")) +
                      " is not an address of this server: use its IP address or localhost, or start serve with "
                      "--allow-host NAME");
  // Cross-site requests: a browser names the page that sends them.
  if (req.origin && Lower(*req.origin) != "http://" + Lower(*req.host))
    return Refuse(403, "cross_origin",
                  "cross-origin request refused: Origin '" + req.origin->substr(0, 100) +
                      "' is not this server (the UI and the API answer only pages they served)");

  switch (cls) {
    case EndpointClass::kPage:
      // Without the cookie, GET /?token=SECRET is the way in (the route checks the token).
      if (HasAdminCookie(policy, req.cookie) || !req.token.empty()) return std::nullopt;
      return Refuse(401, "admin_secret_required",
                    "the web UI belongs to the host: open it with the URL that `daisychain serve` printed (it "
                    "ends with ?token=...)");
    case EndpointClass::kAdmin:
      if (HasAdminCookie(policy, req.cookie)) return std::nullopt;
      return Refuse(401, "admin_secret_required",
                    "this endpoint belongs to the host: it needs the admin secret (open the web UI with the URL "
                    "that `daisychain serve` printed, or send the cookie it sets)");
    case EndpointClass::kApi: {
      if (!policy.api_key.empty()) {
        const std::string& a = req.authorization;
        const bool bearer = a.size() > 7 && Lower(a.substr(0, 7)) == "bearer ";
        if (bearer && SecretEquals(Trim(a.substr(7)), policy.api_key)) return std::nullopt;
        return Refuse(401, "invalid_api_key",
                      "this API needs the key serve was given with --api-key, as \"Authorization: Bearer KEY\"");
      }
      if (IsLoopbackClient(req.client)) return std::nullopt;
      return Refuse(403, "api_loopback_only",
                    "the OpenAI-compatible API answers only on the machine serve runs on (this request came from " +
                        req.client + "); start serve with --api-key KEY to open it to other devices");
    }
    case EndpointClass::kJoin:
    case EndpointClass::kAsset:
      break;
  }
  return std::nullopt;
}

}  // namespace daisy::srv
