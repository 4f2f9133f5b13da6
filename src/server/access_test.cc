// Who may use which endpoint of serve (issue 12): the decision alone, on made-up requests
// and client addresses (a device on the LAN needs no LAN here).
#include "access.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace daisy::srv {
namespace {

const std::string kSecret(64, 'a');

AccessPolicy Policy(const std::string& api_key = "") {
  AccessPolicy p;
  p.admin_secret = kSecret;
  p.api_key = api_key;
  return p;
}

// What the UI sends: same-origin, JSON, the cookie, from this machine.
AccessRequest UiPost(const std::string& path) {
  AccessRequest r;
  r.method = "POST";
  r.path = path;
  r.host = "127.0.0.1:8788";
  r.origin = "http://127.0.0.1:8788";
  r.content_type = "application/json";
  r.cookie = "other=1; daisy_admin_8788=" + kSecret;
  r.client = "127.0.0.1";
  return r;
}

std::string CodeOf(const std::optional<ApiError>& e) {
  return e ? e->code : "allowed";
}

TEST(ServeAccess, TheUiWithTheSecretIsAllowedFromAnyAddress) {
  for (const char* path : {"/api/approve", "/api/load", "/api/generate"}) {
    EXPECT_EQ(CodeOf(CheckAccess(Policy(), UiPost(path))), "allowed") << path;
    AccessRequest r = UiPost(path);
    r.client = "192.168.1.77";  // the host's phone, with the URL it was given
    r.host = "192.168.1.10:8788";
    r.origin = "http://192.168.1.10:8788";
    EXPECT_EQ(CodeOf(CheckAccess(Policy(), r)), "allowed") << path;
  }
  AccessRequest events = UiPost("/api/events");
  events.method = "GET";
  events.origin.reset();  // same-origin GETs carry none
  events.content_type.clear();
  EXPECT_EQ(CodeOf(CheckAccess(Policy(), events)), "allowed");
}

TEST(ServeAccess, ARequestWithoutTheSecretIsRefused) {
  for (const char* path : {"/api/approve", "/api/load", "/api/generate", "/api/state", "/api/events"}) {
    for (const std::string& cookie : std::vector<std::string>{
             "", "daisy_admin=wrong", "daisy_admin_8788=" + kSecret + "x", "x_daisy_admin=" + kSecret}) {
      AccessRequest r = UiPost(path);
      r.cookie = cookie;
      auto e = CheckAccess(Policy(), r);
      ASSERT_TRUE(e) << path << " with '" << cookie << "'";
      EXPECT_EQ(e->status, 401);
      EXPECT_EQ(e->code, "admin_secret_required");
      EXPECT_EQ(e->message.find(kSecret), std::string::npos);
    }
  }
  // The page itself: the cookie, or a token for the route to check.
  AccessRequest page = UiPost("/");
  page.method = "GET";
  page.cookie.clear();
  EXPECT_EQ(CodeOf(CheckAccess(Policy(), page)), "admin_secret_required");
  page.token = "anything";
  EXPECT_EQ(CodeOf(CheckAccess(Policy(), page)), "allowed");
}

// What a page of another site can make a browser send: a form POST (form encoding or
// text/plain, with the page's Origin). Each lock alone refuses it.
TEST(ServeAccess, ACrossOriginFormPostIsRefused) {
  AccessRequest r = UiPost("/api/approve");
  r.origin = "http://evil.example";
  r.content_type = "application/x-www-form-urlencoded";
  EXPECT_EQ(CheckAccess(Policy(), r)->status, 415);
  r.content_type = "text/plain";  // the form enctype that can carry a JSON-looking body
  EXPECT_EQ(CodeOf(CheckAccess(Policy(), r)), "unsupported_media_type");
  r.content_type = "application/json";
  EXPECT_EQ(CodeOf(CheckAccess(Policy(), r)), "cross_origin");
  // Another port of the same host is another origin (and the same site for cookies).
  r.origin = "http://127.0.0.1:9999";
  EXPECT_EQ(CodeOf(CheckAccess(Policy(), r)), "cross_origin");
  r.origin = "null";  // a sandboxed frame or a file: page
  EXPECT_EQ(CodeOf(CheckAccess(Policy(), r)), "cross_origin");
  r.origin = "HTTP://127.0.0.1:8788";  // the same origin, however cased
  EXPECT_EQ(CodeOf(CheckAccess(Policy(), r)), "allowed");
  // The OpenAI API too: no key needed on loopback, but no cross-site posts either.
  AccessRequest api = UiPost("/v1/completions");
  api.cookie.clear();
  api.origin = "http://evil.example";
  EXPECT_EQ(CodeOf(CheckAccess(Policy(), api)), "cross_origin");
  api.origin.reset();
  api.content_type = "text/plain";
  EXPECT_EQ(CodeOf(CheckAccess(Policy(), api)), "unsupported_media_type");
  api.content_type = "application/json; charset=utf-8";
  EXPECT_EQ(CodeOf(CheckAccess(Policy(), api)), "allowed");
}

// DNS rebinding: evil.example now resolves to this server; the browser says Host: evil.example.
TEST(ServeAccess, AForgedHostIsRefused) {
  for (const char* host :
       {"evil.example:8788", "evil.example", "127.0.0.1.evil.example:8788", "", "[::1", "a:b:c", "127.0.0.1:88x"}) {
    AccessRequest r = UiPost("/api/approve");
    r.host = host;
    r.origin = "http://" + std::string(host);
    EXPECT_EQ(CodeOf(CheckAccess(Policy(), r)), "host_not_allowed") << host;
    AccessRequest api = UiPost("/v1/models");
    api.method = "GET";
    api.host = host;
    api.origin.reset();
    EXPECT_EQ(CodeOf(CheckAccess(Policy(), api)), "host_not_allowed") << host;
  }
  AccessRequest none = UiPost("/api/state");
  none.host.reset();
  EXPECT_EQ(CodeOf(CheckAccess(Policy(), none)), "host_not_allowed");
  for (const char* host : {"localhost:8788", "LOCALHOST", "[::1]:8788", "10.1.2.3", "192.168.1.10:8788"}) {
    AccessRequest r = UiPost("/api/approve");
    r.host = host;
    r.origin = "http://" + std::string(host);
    EXPECT_EQ(CodeOf(CheckAccess(Policy(), r)), "allowed") << host;
  }
  // A name the host allowed (serve --host NAME or --allow-host NAME).
  AccessPolicy p = Policy();
  p.allowed_hosts = {"Daisy.lan"};
  AccessRequest r = UiPost("/api/approve");
  r.host = "daisy.lan:8788";
  r.origin = "http://daisy.lan:8788";
  EXPECT_EQ(CodeOf(CheckAccess(p, r)), "allowed");
}

// serve --host 192.168.1.10: a request from another address. Without the secret the UI
// refuses it; without --api-key the OpenAI API answers only this machine.
TEST(ServeAccess, ARequestFromAnotherAddressIsRefused) {
  for (const char* from : {"192.168.1.77", "127.0.0.2", "::ffff:192.168.1.77", "fe80::1", ""}) {
    AccessRequest r = UiPost("/api/approve");
    r.host = "192.168.1.10:8788";
    r.origin = "http://192.168.1.10:8788";
    r.cookie.clear();
    r.client = from;
    EXPECT_EQ(CodeOf(CheckAccess(Policy(), r)), "admin_secret_required") << from;
    for (const char* path : {"/v1/completions", "/v1/chat/completions", "/apply-template"}) {
      AccessRequest api = r;
      api.path = path;
      api.origin.reset();
      api.authorization = "Bearer unused";
      auto e = CheckAccess(Policy(), api);
      ASSERT_TRUE(e) << from << " " << path;
      EXPECT_EQ(e->status, 403);
      EXPECT_EQ(e->code, "api_loopback_only");
    }
    AccessRequest models = r;
    models.method = "GET";
    models.path = "/v1/models";
    EXPECT_EQ(CodeOf(CheckAccess(Policy(), models)), "api_loopback_only") << from;
  }
  for (const char* here : {"127.0.0.1", "::1", "::ffff:127.0.0.1"}) {
    AccessRequest api = UiPost("/v1/completions");
    api.client = here;
    api.origin.reset();
    EXPECT_EQ(CodeOf(CheckAccess(Policy(), api)), "allowed") << here;
  }
  // With --api-key: the key, from anywhere, and only the key (loopback included).
  const std::string key = "sk-test-key";
  AccessRequest api = UiPost("/v1/completions");
  api.origin.reset();
  api.client = "192.168.1.77";
  api.authorization = "Bearer " + key;
  EXPECT_EQ(CodeOf(CheckAccess(Policy(key), api)), "allowed");
  for (const std::string& auth : std::vector<std::string>{"", "Bearer sk-test-kez", "Basic " + key, key}) {
    for (const char* from : {"192.168.1.77", "127.0.0.1"}) {
      api.authorization = auth;
      api.client = from;
      auto e = CheckAccess(Policy(key), api);
      ASSERT_TRUE(e) << auth << " from " << from;
      EXPECT_EQ(e->status, 401);
      EXPECT_EQ(e->code, "invalid_api_key");
      EXPECT_EQ(e->message.find(key), std::string::npos);
    }
  }
}

TEST(ServeAccess, TheJoinEndpointsStayOpenToDevices) {
  for (const char* from : {"192.168.1.77", "127.0.0.1"}) {
    AccessRequest join;
    join.method = "POST";
    join.path = "/api/join";
    join.host = "192.168.1.10:8788";
    join.content_type = "application/json";
    join.client = from;
    EXPECT_EQ(CodeOf(CheckAccess(Policy(), join)), "allowed");
    AccessRequest key = join;
    key.method = "GET";
    key.path = "/api/key";
    key.content_type.clear();
    key.host = "daisy-host.example:8788";  // devices may join by a name
    EXPECT_EQ(CodeOf(CheckAccess(Policy(), key)), "allowed");
  }
}

TEST(ServeAccess, SecretsAndCookies) {
  const std::string a = NewSecret(), b = NewSecret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_TRUE(SecretEquals(a, a));
  EXPECT_FALSE(SecretEquals(a, b));
  EXPECT_FALSE(SecretEquals(a, a.substr(1)));
  const std::string c = AdminCookie("127.0.0.1:8788", a);
  EXPECT_EQ(c, "daisy_admin_8788=" + a + "; Path=/; HttpOnly; SameSite=Strict");
  EXPECT_EQ(AdminCookie("[::1]", a).rfind("daisy_admin=", 0), 0u);
  EXPECT_TRUE(IsLoopbackListen("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackListen("127.0.0.2"));
  EXPECT_TRUE(IsLoopbackListen("localhost"));
  EXPECT_TRUE(IsLoopbackListen("::1"));
  EXPECT_FALSE(IsLoopbackListen("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackListen("192.168.1.10"));
  EXPECT_FALSE(IsLoopbackListen("::"));
}

}  // namespace
}  // namespace daisy::srv
