#include "front_door.h"

#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <span>

#include "assets.h"

namespace daisy::srv {

bool FrontDoor::Refuse(const httplib::Request& req, httplib::Response& res) const {
  AccessRequest a;
  a.method = req.method;
  a.path = req.path;
  if (req.has_header("Host")) a.host = req.get_header_value("Host");
  if (req.has_header("Origin")) a.origin = req.get_header_value("Origin");
  a.content_type = req.get_header_value("Content-Type");
  for (size_t i = 0, n = req.get_header_value_count("Cookie"); i < n; ++i)
    a.cookie += (i ? "; " : "") + req.get_header_value("Cookie", i);
  a.authorization = req.get_header_value("Authorization");
  a.token = req.get_param_value("token");
  a.client = ClientOf(req, source_of_);
  auto refusal = CheckAccess(policy_, a);
  if (!refusal) return false;
  if (refusal->status == 401 && ClassOf(req.path) == EndpointClass::kPage) {
    // A person at a browser: say in words how to get in.
    res.status = 401;
    res.set_content("<!doctype html><meta charset=\"utf-8\"><title>DaisyChain</title><p>" + refusal->message + "</p>\n",
                    "text/html; charset=utf-8");
    return true;
  }
  if (refusal->code == "invalid_api_key") res.set_header("WWW-Authenticate", "Bearer");
  SendError(res, *refusal);
  return true;
}

// GET / and /index.html: the UI for the holder of the admin cookie; GET /?token=SECRET
// sets that cookie. It answers with a page that moves on to / itself rather than a 303:
// a SameSite=Strict cookie is not sent on a redirect that a cross-site link started,
// while a navigation the page makes is same-site. The token leaves the address bar.
void FrontDoor::HandlePage(const std::string& path, const httplib::Request& req, httplib::Response& res) const {
  const std::string token = req.get_param_value("token");
  if (!token.empty()) {
    res.set_header("Cache-Control", "no-store");
    res.set_header("Referrer-Policy", "no-referrer");
    if (!SecretEquals(token, policy_.admin_secret)) {
      res.status = 403;
      res.set_content(
          "<!doctype html><meta charset=\"utf-8\"><title>DaisyChain</title><p>This is not the admin secret of "
          "this server: open the URL that `daisychain serve` printed at its start.</p>\n",
          "text/html; charset=utf-8");
      return;
    }
    res.set_header("Set-Cookie", AdminCookie(req.get_header_value("Host"), policy_.admin_secret));
    res.set_content(
        "<!doctype html><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"0; url=/\">"
        "<title>DaisyChain</title><p><a href=\"/\">Open the web UI</a></p>\n",
        "text/html; charset=utf-8");
    return;
  }
  ServeAsset(path, req, res);
}

namespace {

// An asset's validator: its bytes' FNV-1a hash, so a phone that reloads the join page is
// answered 304 rather than sent the browser node's module again.
std::string EtagOf(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (int shift = 60; shift >= 0; shift -= 4) out += kHex[(h >> shift) & 15];
  return out + "\"";
}

}  // namespace

void FrontDoor::ServeAsset(const std::string& path, const httplib::Request& req, httplib::Response& res) {
  const Asset* a = FindAsset(path);
  if (!a) {
    res.status = 404;
    return;
  }
  // Computed once per asset (a handful, fixed at build time).
  static std::mutex mu;
  static std::map<std::string_view, std::string> etags;
  std::string etag;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = etags.find(a->path);
    if (it == etags.end()) it = etags.emplace(a->path, EtagOf(a->bytes)).first;
    etag = it->second;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("ETag", etag);
  if (req.get_header_value("If-None-Match") == etag) {
    res.status = 304;
    return;
  }
  res.set_content(std::string(a->bytes), std::string(a->content_type).c_str());
}

void FrontDoor::AddRoutes(GuardedHttpServer& http) const {
  using Req = httplib::Request;
  using Res = httplib::Response;
  http.SetGuard([this](const Req& req, Res& res) { return Refuse(req, res); });
  for (const char* page : {"/", "/index.html"})
    http.Get(page, [this, page](const Req& req, Res& res) { HandlePage(page, req, res); });
  // Every other embedded file needs no secret: the UI's scripts and styles, the join page
  // (GET /join) and the browser node's worker and module, which devices load.
  for (std::span<const Asset> table : {WebAssets(), EngineAssets()}) {
    for (const Asset& a : table) {
      if (a.path == "/index.html") continue;
      const std::string path(a.path);
      http.Get(path, [path](const Req& req, Res& res) { ServeAsset(path, req, res); });
    }
  }
  http.Get("/join", [](const Req& req, Res& res) { ServeAsset("/join", req, res); });
  // Unknown paths and methods: the OpenAI error shape, not httplib's empty body.
  http.set_error_handler([](const Req& req, Res& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.status = res.status;
    e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
    e.message =
        res.status == 404 ? "no such endpoint: " + req.method + " " + req.path : "HTTP " + std::to_string(res.status);
    res.set_content(Dump(ErrorBody(e)), "application/json");
  });
  http.set_exception_handler([](const Req&, Res& res, const std::exception_ptr& ep) {
    std::string what = "unknown";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    ApiError e;
    e.status = 500;
    e.type = "server_error";
    e.message = "Bug: unexpected exception: " + what;
    SendError(res, e);
  });
}

}  // namespace daisy::srv
