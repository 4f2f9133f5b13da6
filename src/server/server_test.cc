// The Server of `serve` in this process, on 127.0.0.1, under abuse (issue 11): event
// streams and slow clients must not starve the API; a FIFO in a model folder must not hang
// a load. Raw sockets play the abusive clients; every wait is bounded.
#include "daisy/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "daisy/head.h"
#include "daisy/net.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const std::string kSecret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

int LocalPort(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

bool SendAll(int fd, const std::string& s) {
  return ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
}

struct Answer {
  int status = -1;  // -1: no status line within the time allowed
  std::string body;
};

// Reads a response's head, then its body when it has a Content-Length (an event stream
// has none: its head is enough). Gives up after `limit`.
Answer ReadAnswer(int fd, std::chrono::milliseconds limit) {
  Answer a;
  std::string got;
  const auto end = Clock::now() + limit;
  size_t head_end = std::string::npos, want = 0;
  while (Clock::now() < end) {
    if (head_end != std::string::npos && got.size() >= head_end + 4 + want) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
    if (head_end == std::string::npos && (head_end = got.find("\r\n\r\n")) != std::string::npos) {
      const size_t cl = got.find("Content-Length: ");
      if (cl == std::string::npos || cl > head_end) break;
      want = std::stoul(got.substr(cl + 16));
    }
  }
  if (head_end == std::string::npos || got.rfind("HTTP/1.1 ", 0) != 0) return a;
  a.status = std::stoi(got.substr(9, 3));
  a.body = got.substr(head_end + 4);
  return a;
}

// True when the server closes `fd` (EOF or reset) within `limit`; what it sent is dropped.
bool ClosedByServer(int fd, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    if (::recv(fd, buf, sizeof buf, 0) <= 0) return true;
  }
  return false;
}

// A rendezvous, a head session and the Server on 127.0.0.1, in this process. The server
// takes client addresses from `sources` (by the client's port), as behind the port mux.
class ServerAbuse : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/daisy_server_abuse_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    home_ = tmpl;
    ::setenv("DAISY_HOME", home_.c_str(), 1);
    net::RendezvousOptions ro;
    ro.port = 0;
    auto rv = net::Rendezvous::Start(ro);
    ASSERT_TRUE(rv.ok()) << rv.status().message();
    rv_ = std::move(*rv);
    SessionOptions so;
    so.rendezvous = rv_->address();
    so.admission = rv_->LocalAdmission(/*trusted=*/true);
    so.role = "serve-head";
    so.hub.cache_dir = (home_ / "cache").string();
    so.hub.allow_token_prompt = false;
    auto session = HeadSession::Start(so);
    ASSERT_TRUE(session.ok()) << session.status().message();
    session_ = std::move(*session);
    ServerOptions sv;
    sv.rendezvous = rv_.get();
    sv.session = session_.get();
    sv.hub = so.hub;
    sv.header_timeout_s = 1;  // short, so the test sees slow clients closed
    sv.body_timeout_s = 1;
    sv.admin_secret = kSecret;
    sv.source_of = [this](int port) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sources_.find(port);
      return it == sources_.end() ? std::string() : it->second;
    };
    auto server = Server::Start(sv);
    ASSERT_TRUE(server.ok()) << server.status().message();
    server_ = std::move(*server);
    limits_ = sv;
  }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
    server_.reset();
    session_.reset();
    rv_.reset();
    std::error_code ec;
    fs::remove_all(home_, ec);
  }

  // A connection whose requests the server takes as coming from `source` ("": 127.0.0.1).
  int Open(const std::string& source = "") {
    int fd = net::ConnectLoopback(server_->port());
    if (fd < 0) return -1;
    fds_.push_back(fd);
    if (!source.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      sources_[LocalPort(fd)] = source;
    }
    return fd;
  }
  // Opens GET /api/events from `source` and reads its answer; the connection stays open.
  Answer OpenEvents(const std::string& source, int* fd_out = nullptr) {
    int fd = Open(source);
    if (fd < 0 ||
        !SendAll(fd, "GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: daisy_admin=" + kSecret + "\r\n\r\n"))
      return {};
    if (fd_out) *fd_out = fd;
    return ReadAnswer(fd, 5000ms);
  }
  void Close(int fd) {
    ::close(fd);
    fds_.erase(std::find(fds_.begin(), fds_.end(), fd));
  }
  // A client of the host: it holds the admin cookie (what GET /?token=SECRET sets).
  httplib::Client Client() {
    httplib::Client cli("127.0.0.1", server_->port());
    cli.set_connection_timeout(10, 0);  // a bound against a hang, not a timing
    cli.set_read_timeout(10, 0);
    cli.set_default_headers({{"Cookie", "daisy_admin=" + kSecret}});
    return cli;
  }

  fs::path home_;
  std::unique_ptr<net::Rendezvous> rv_;
  std::unique_ptr<HeadSession> session_;
  std::unique_ptr<Server> server_;
  ServerOptions limits_;
  std::mutex mu_;
  std::map<int, std::string> sources_;
  std::vector<int> fds_;
};

// Issue 11, item 6: 64 event streams (64 tabs) and 64 connections stuck in their headers
// used to take every thread of the server: the API and /api/join stopped answering.
TEST_F(ServerAbuse, EventStreamsAndSlowClientsDoNotStarveTheApi) {
  const int per_client = limits_.max_event_streams_per_client, total = limits_.max_event_streams;
  ASSERT_EQ(total % per_client, 0);
  // As many streams as the server takes in all, from total/per_client addresses.
  std::vector<int> streams;
  for (int i = 0; i < total; ++i) {
    int fd = -1;
    Answer a = OpenEvents("10.0.0." + std::to_string(i / per_client), &fd);
    ASSERT_EQ(a.status, 200) << "stream " << i << ": " << a.body;
    streams.push_back(fd);
  }
  // One more from an address that has its share: 429, saying so.
  Answer more = OpenEvents("10.0.0.0");
  EXPECT_EQ(more.status, 429) << more.body;
  EXPECT_NE(more.body.find("too many event streams from 10.0.0.0"), std::string::npos) << more.body;
  // One from a new address past the total: 503, saying so.
  for (const char* who : {"10.0.1.1", "10.0.1.2", "", ""}) {
    Answer full = OpenEvents(who);
    EXPECT_EQ(full.status, 503) << full.body;
    EXPECT_NE(full.body.find("too many event streams are open"), std::string::npos) << full.body;
  }
  // 64 clients that send part of a request and then nothing more.
  std::vector<int> slow;
  for (int i = 0; i < 64; ++i) {
    int fd = Open();
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, "GET /v1/models HTTP/1.1\r\nX-Slow: 1\r\n"));
    slow.push_back(fd);
  }
  // The API and the join endpoint answer all the same.
  auto cli = Client();
  auto models = cli.Get("/v1/models");
  ASSERT_TRUE(models) << "GET /v1/models: " << httplib::to_string(models.error());
  EXPECT_EQ(models->status, 200);
  const Json join = {{"room", "default"}, {"public_key", net::NewKeyPair().public_key}, {"name", "newcomer"}};
  auto joined = Client().Post("/api/join", join.dump(), "application/json");
  ASSERT_TRUE(joined) << "POST /api/join: " << httplib::to_string(joined.error());
  EXPECT_EQ(joined->status, 200) << joined->body;
  EXPECT_EQ(Json::parse(joined->body, nullptr, false).value("status", ""), "pending") << joined->body;
  // Headers have a deadline: the slow ones are closed, and so is one that keeps sending a
  // byte at a time (each read alone is quick; the request as a whole is not).
  for (int fd : slow) EXPECT_TRUE(ClosedByServer(fd, 10000ms)) << "a client stuck in its headers was kept";
  int drip = Open();
  ASSERT_TRUE(SendAll(drip, "GET /v1/models HTTP/1.1\r\n"));
  bool closed = false;
  for (int i = 0; i < 100 && !closed; ++i) {  // 10 s at most
    closed = !SendAll(drip, "X") || ClosedByServer(drip, 100ms);
  }
  EXPECT_TRUE(closed) << "a client sending its headers a byte at a time was kept";
  // So has the body: one promised and never sent is cut off too.
  int body = Open();
  ASSERT_TRUE(
      SendAll(body, "POST /api/join HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"));
  EXPECT_TRUE(ClosedByServer(body, 10000ms)) << "a client that never finished its body was kept";
  // A stream that ends gives its place back.
  Close(streams[0]);
  bool again = false;
  for (int i = 0; i < 50 && !again; ++i) {  // the server notices at its next write (2 s)
    int fd = -1;
    Answer a = OpenEvents("10.0.0.0", &fd);
    again = a.status == 200;
    if (!again) {
      if (fd >= 0) Close(fd);
      std::this_thread::sleep_for(200ms);
    }
  }
  EXPECT_TRUE(again) << "a closed event stream kept its place";
}

// Issue 11, item 10: a FIFO named like a model file used to block the load in open()
// forever, with the server busy and every request waiting. Now it is refused at once,
// naming the file, and the server answers the next request.
TEST_F(ServerAbuse, AFifoInAModelFolderIsRefusedByLoad) {
  const fs::path model = home_ / "model";
  fs::copy(std::string(std::getenv("DAISY_MODELS")) + "/stories260K", model, fs::copy_options::recursive);
  fs::remove(model / "model.safetensors");
  const std::string fifo = (model / "model.safetensors").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto cli = Client();
  auto r = cli.Post("/api/load", Json{{"model", model.string()}}.dump(), "application/json");
  if (!r) {
    int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // release the blocked load
    if (w >= 0) ::close(w);
    FAIL() << "POST /api/load of a folder with a FIFO did not answer: " << httplib::to_string(r.error());
  }
  EXPECT_EQ(r->status, 400) << r->body;
  const std::string message = Json::parse(r->body, nullptr, false)["error"].value("message", "");
  EXPECT_NE(message.find("model.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("not a regular file"), std::string::npos) << message;
  auto models = Client().Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  auto state = Client().Get("/api/state");
  ASSERT_TRUE(state);
  EXPECT_EQ(Json::parse(state->body, nullptr, false).value("busy", true), false) << state->body;
}

// Issue 12: the host's controls belong to the host. A device asks to join; then a
// cross-origin form POST, requests without the secret, a request from another address and
// one with a forged Host all try to approve it (or to use the host's ring); every one is
// refused and the device stays pending, until the host approves it with the secret.
TEST_F(ServerAbuse, OnlyTheHostApprovesAndStrangersAreRefused) {
  const Json join = {{"room", "default"}, {"public_key", net::NewKeyPair().public_key}, {"name", "intruder"}};
  auto asked = Client().Post("/api/join", join.dump(), "application/json");
  ASSERT_TRUE(asked);
  ASSERT_EQ(asked->status, 200) << asked->body;
  const std::string fpr = Json::parse(asked->body)["fingerprint"];
  auto still_pending = [&] {
    auto again = Client().Post("/api/join", join.dump(), "application/json");  // the device asking again
    return again && again->status == 200 && Json::parse(again->body)["status"] == "pending";
  };
  const std::string port = std::to_string(server_->port());
  const std::string body = Json{{"id", fpr}}.dump();
  // One raw request from `source` ("": 127.0.0.1); its status, or -1.
  auto raw = [&](const std::string& source, const std::string& head, const std::string& content) {
    int fd = Open(source);
    if (fd < 0) return -1;
    SendAll(fd, head + "Content-Length: " + std::to_string(content.size()) + "\r\n\r\n" + content);
    Answer a = ReadAnswer(fd, 5000ms);
    Close(fd);
    return a.status;
  };
  const std::string cookie = "Cookie: daisy_admin=" + kSecret + "\r\n";
  // A page of another site posts a form (even were the cookie sent along, as SameSite=Lax would).
  EXPECT_EQ(raw("",
                "POST /api/approve HTTP/1.1\r\nHost: 127.0.0.1:" + port +
                    "\r\nOrigin: http://evil.example\r\nContent-Type: application/x-www-form-urlencoded\r\n" + cookie,
                "id=" + fpr),
            415);
  EXPECT_EQ(raw("",
                "POST /api/approve HTTP/1.1\r\nHost: 127.0.0.1:" + port +
                    "\r\nOrigin: http://evil.example\r\nContent-Type: text/plain\r\n" + cookie,
                body),
            415);
  EXPECT_EQ(raw("",
                "POST /api/approve HTTP/1.1\r\nHost: 127.0.0.1:" + port +
                    "\r\nOrigin: http://evil.example\r\nContent-Type: application/json\r\n" + cookie,
                body),
            403);
  // Without the secret: from here, and from another address (serve --host on a LAN).
  for (const char* from : {"", "192.168.1.77"}) {
    EXPECT_EQ(
        raw(from, "POST /api/approve HTTP/1.1\r\nHost: 127.0.0.1:" + port + "\r\nContent-Type: application/json\r\n",
            body),
        401)
        << from;
    EXPECT_EQ(raw(from,
                  "POST /api/approve HTTP/1.1\r\nHost: 127.0.0.1:" + port +
                      "\r\nContent-Type: application/json\r\nCookie: daisy_admin=" + std::string(64, '0') + "\r\n",
                  body),
              401)
        << from;
    EXPECT_EQ(raw(from, "GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:" + port + "\r\n", ""), 401) << from;
    EXPECT_EQ(raw(from, "GET / HTTP/1.1\r\nHost: 127.0.0.1:" + port + "\r\n", ""), 401) << from;
    EXPECT_EQ(raw(from, "GET /?token=" + std::string(64, '0') + " HTTP/1.1\r\nHost: 127.0.0.1:" + port + "\r\n", ""),
              403)
        << from;
  }
  // /api/load says nothing about the host's folders to a stranger: one answer for a folder
  // that exists and one that does not.
  for (const std::string& path : {home_.string(), std::string("/no/such/folder")})
    EXPECT_EQ(raw("192.168.1.77",
                  "POST /api/load HTTP/1.1\r\nHost: 127.0.0.1:" + port + "\r\nContent-Type: application/json\r\n",
                  Json{{"model", path}}.dump()),
              401)
        << path;
  // The OpenAI API (no --api-key): this machine only.
  EXPECT_EQ(raw("192.168.1.77",
                "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:" + port +
                    "\r\nContent-Type: application/json\r\nAuthorization: Bearer unused\r\n",
                R"({"prompt": "x"})"),
            403);
  EXPECT_EQ(raw("192.168.1.77", "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:" + port + "\r\n", ""), 403);
  // DNS rebinding: evil.example resolves here; the browser names it in Host.
  EXPECT_EQ(raw("",
                "POST /api/approve HTTP/1.1\r\nHost: evil.example:" + port + "\r\nContent-Type: application/json\r\n" +
                    cookie,
                body),
            403);
  EXPECT_EQ(raw("", "GET /v1/models HTTP/1.1\r\nHost: evil.example:" + port + "\r\n", ""), 403);
  // Nobody got the device in.
  EXPECT_TRUE(still_pending()) << "a refused request approved the device";
  // The host can: the cookie set by the token URL, then Approve.
  auto page = Client().Get("/?token=" + kSecret);
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Set-Cookie"),
            "daisy_admin_" + port + "=" + kSecret + "; Path=/; HttpOnly; SameSite=Strict");
  httplib::Client host("127.0.0.1", server_->port());
  host.set_read_timeout(10, 0);
  host.set_default_headers(
      {{"Cookie", page->get_header_value("Set-Cookie").substr(0, page->get_header_value("Set-Cookie").find(';'))},
       {"Origin", "http://127.0.0.1:" + port}});
  auto approved = host.Post("/api/approve", body, "application/json");
  ASSERT_TRUE(approved);
  EXPECT_EQ(approved->status, 200) << approved->body;
  EXPECT_FALSE(still_pending()) << "the host's approval did not take";
}

}  // namespace
}  // namespace daisy
