// PortMux with real sockets on 127.0.0.1: HTTP requests and ZeroMQ joins share one port.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "daisy/net.h"

namespace daisy::net {
namespace {

using namespace std::chrono_literals;

wire::Hello HelloFor(const std::string& id) {
  return wire::Hello{wire::kProtocolVersion, wire::kCapCompute, 100.0, 42, 1u << 30, "scalar", id, "dev-" + id};
}

int PortOf(const std::string& tcp_address) {
  return std::stoi(tcp_address.substr(tcp_address.rfind(':') + 1));
}

// An HTTP server on 127.0.0.1 (any port) with a small and a large answer.
class HttpBackend {
 public:
  HttpBackend() {
    big_.resize(3 << 20);
    for (size_t i = 0; i < big_.size(); ++i) big_[i] = static_cast<char>('a' + i % 26);
    server_.Get("/hello",
                [](const httplib::Request&, httplib::Response& res) { res.set_content("hello", "text/plain"); });
    server_.Get("/big",
                [this](const httplib::Request&, httplib::Response& res) { res.set_content(big_, "text/plain"); });
    // The loopback port the server sees: the mux's side of the relayed connection.
    server_.Get("/port", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(std::to_string(req.remote_port), "text/plain");
    });
    server_.Post("/echo",
                 [](const httplib::Request& req, httplib::Response& res) { res.set_content(req.body, "text/plain"); });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(5ms);
  }
  ~HttpBackend() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  const std::string& big() const { return big_; }

 private:
  httplib::Server server_;
  std::string big_;
  int port_ = 0;
  std::thread thread_;
};

struct Fixture {
  std::unique_ptr<Rendezvous> rv;
  std::unique_ptr<HttpBackend> http;
  std::unique_ptr<PortMux> mux;
};

Fixture Start(int max_connections = 256, const std::function<void(PortMuxOptions&)>& tweak = {}) {
  Fixture f;
  RendezvousOptions ro;
  ro.port = 0;
  ro.auto_approve = true;
  auto rv = Rendezvous::Start(ro);
  EXPECT_TRUE(rv.ok()) << rv.status().message();
  f.rv = std::move(*rv);
  f.http = std::make_unique<HttpBackend>();
  PortMuxOptions mo;
  mo.port = 0;
  mo.zmq_port = PortOf(f.rv->address());
  mo.http_port = f.http->port();
  mo.max_connections = max_connections;
  if (tweak) tweak(mo);
  auto mux = PortMux::Start(mo);
  EXPECT_TRUE(mux.ok()) << mux.status().message();
  f.mux = std::move(*mux);
  return f;
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

TEST(PortMux, HttpRequestsReachTheHttpServer) {
  Fixture f = Start();
  httplib::Client cli("127.0.0.1", f.mux->port());
  auto r = cli.Get("/hello");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "hello");
  // A large answer and a large upload come through intact (relay buffers wrap many times).
  auto big = cli.Get("/big");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->body, f.http->big());
  auto echo = cli.Post("/echo", f.http->big(), "text/plain");
  ASSERT_TRUE(echo);
  EXPECT_EQ(echo->body, f.http->big());
}

TEST(PortMux, ZeroMqJoinsReachTheRendezvousWhichAnswersTheDeviceDirectly) {
  Fixture f = Start();
  auto dev = Endpoint::Bind("127.0.0.1", 0);
  ASSERT_TRUE(dev.ok());
  const std::string via_mux = "tcp://127.0.0.1:" + std::to_string(f.mux->port());
  // Approved first; then its CURVE handshake passes through the mux like any bytes.
  ASSERT_TRUE(f.rv->RequestJoin({"room", (*dev)->public_key(), "dev", "127.0.0.1"})->approved);
  (*dev)->SetPeerKey(via_mux, f.rv->public_key());
  (*dev)->Allow(f.rv->public_key());
  const std::string id = KeyId((*dev)->public_key());
  ASSERT_TRUE((*dev)->Send(via_mux, wire::Message(wire::Join{"room", (*dev)->address(), HelloFor(id)})).ok());
  std::optional<wire::Peers> peers;
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (!peers && std::chrono::steady_clock::now() < end) {
    auto fr = (*dev)->Receive(100);
    if (!fr.ok() || !fr->has_value()) continue;
    auto m = wire::Decode(**fr);
    if (m.ok() && std::holds_alternative<wire::Peers>(*m)) peers = std::get<wire::Peers>(*m);
  }
  ASSERT_TRUE(peers.has_value()) << "the join never reached the rendezvous through the mux";
  ASSERT_EQ(peers->peers.size(), 1u);
  EXPECT_EQ(peers->peers[0].hello.device_id, id);
  ASSERT_EQ(f.rv->Members().size(), 1u);
  // HTTP on the same port still works while the ZeroMQ connection stays open.
  httplib::Client cli("127.0.0.1", f.mux->port());
  auto r = cli.Get("/hello");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "hello");
}

TEST(PortMux, TellsWhoIsReallyBehindARelayedConnection) {
  Fixture f = Start();
  httplib::Client cli("127.0.0.1", f.mux->port());
  cli.set_keep_alive(true);
  auto r = cli.Get("/port");
  ASSERT_TRUE(r);
  const int seen = std::stoi(r->body);
  EXPECT_EQ(f.mux->SourceOf(seen), "127.0.0.1");  // the client's own address, not the mux's
  EXPECT_EQ(f.mux->SourceOf(1), "");
  cli.stop();
  EXPECT_TRUE(WaitFor([&] { return f.mux->SourceOf(seen).empty(); }, 3000ms));
}

TEST(PortMux, ConnectionsBeyondTheCapAreClosedAndClosedOnesAreReleased) {
  Fixture f = Start(/*max_connections=*/2);
  int a = net::ConnectLoopback(f.mux->port()), b = net::ConnectLoopback(f.mux->port());
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_TRUE(WaitFor([&] { return f.mux->connections() == 2; }, 2000ms));
  int c = net::ConnectLoopback(f.mux->port());
  ASSERT_GE(c, 0);
  pollfd pfd{c, POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 2000), 1) << "the connection over the cap was left open";
  char byte;
  EXPECT_EQ(::recv(c, &byte, 1, 0), 0);
  ::close(c);
  ::close(a);
  ::close(b);
  EXPECT_TRUE(WaitFor([&] { return f.mux->connections() == 0; }, 3000ms)) << f.mux->connections();
  // A request after the others left is served.
  httplib::Client cli("127.0.0.1", f.mux->port());
  auto r = cli.Get("/hello");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "hello");
}

// Sends `bytes` on a new connection to the mux and keeps it open; -1 if it cannot connect.
int ConnectAndSend(int port, const std::string& bytes) {
  int fd = net::ConnectLoopback(port);
  if (fd >= 0 && !bytes.empty() &&
      ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Issue 11, item 7: connections that send one byte that is neither HTTP nor ZeroMQ (or
// nothing, or half a method name) used to keep their slot forever, until every later
// connection was refused. Each must be closed within the identify timeout, and the port
// must still serve HTTP afterwards.
TEST(PortMux, ConnectionsThatDoNotIdentifyThemselvesAreClosed) {
  Fixture f = Start(256, [](PortMuxOptions& o) { o.identify_timeout_s = 1; });
  const std::vector<std::string> junk = {std::string(1, '\x16'), "Z", std::string(1, '\0'), "GETX",
                                         std::string("\xFF") + "junkjunk!"};  // 0xFF, but no ZMTP signature
  std::vector<int> fds;
  for (int i = 0; i < 30; ++i) fds.push_back(ConnectAndSend(f.mux->port(), junk[i % junk.size()]));
  for (int i = 0; i < 20; ++i) fds.push_back(ConnectAndSend(f.mux->port(), ""));   // silent
  for (int i = 0; i < 4; ++i) fds.push_back(ConnectAndSend(f.mux->port(), "GE"));  // never finishes
  for (int fd : fds) ASSERT_GE(fd, 0);
  EXPECT_TRUE(WaitFor([&] { return f.mux->connections() == 0; }, 10000ms))
      << f.mux->connections() << " unidentified connections are still held";
  // Each one was closed by the mux: EOF (or a reset), never left hanging.
  for (int fd : fds) {
    pollfd pfd{fd, POLLIN, 0};
    EXPECT_EQ(::poll(&pfd, 1, 2000), 1);
    char buf[256];
    EXPECT_LE(::recv(fd, buf, sizeof buf, MSG_DONTWAIT), 0);
    ::close(fd);
  }
  httplib::Client cli("127.0.0.1", f.mux->port());
  auto r = cli.Get("/hello");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->body, "hello");
}

// A client that got its answer and never closes its side is closed after the linger, so
// it cannot keep a slot once the server is done with it.
TEST(PortMux, AClientThatNeverClosesIsClosedAfterTheServerIsDone) {
  Fixture f = Start(256, [](PortMuxOptions& o) { o.linger_after_server_closed_s = 1; });
  int fd = ConnectAndSend(f.mux->port(), "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  ASSERT_GE(fd, 0);
  std::string got;
  char buf[1024];
  for (int i = 0; i < 100; ++i) {  // the whole answer (then EOF: the server closed)
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_NE(got.find("hello"), std::string::npos) << got;
  EXPECT_TRUE(WaitFor([&] { return f.mux->connections() == 0; }, 10000ms)) << "the mux still holds the connection";
  ::close(fd);
}

// Issue 11, item 7: one address cannot take every slot. Below the total cap, the
// connection past the per-source cap is closed at once.
TEST(PortMux, TheCapIsPerSourceAddressToo) {
  Fixture f = Start(256, [](PortMuxOptions& o) {
    o.max_connections_per_source = 8;
    o.identify_timeout_s = 30;  // the 8 silent ones stay while the test looks
  });
  std::vector<int> fds;
  for (int i = 0; i < 8; ++i) fds.push_back(net::ConnectLoopback(f.mux->port()));
  for (int fd : fds) ASSERT_GE(fd, 0);
  ASSERT_TRUE(WaitFor([&] { return f.mux->connections() == 8; }, 3000ms)) << f.mux->connections();
  int extra = net::ConnectLoopback(f.mux->port());
  ASSERT_GE(extra, 0);
  pollfd pfd{extra, POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 3000), 1) << "the 9th connection from one address was left open";
  char byte;
  EXPECT_LE(::recv(extra, &byte, 1, MSG_DONTWAIT), 0);
  ::close(extra);
  EXPECT_EQ(f.mux->connections(), 8);
  // A slot freed is a slot again.
  ::close(fds.back());
  fds.pop_back();
  ASSERT_TRUE(WaitFor([&] { return f.mux->connections() == 7; }, 3000ms)) << f.mux->connections();
  httplib::Client cli("127.0.0.1", f.mux->port());
  auto r = cli.Get("/hello");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->body, "hello");
  for (int fd : fds) ::close(fd);
}

TEST(PortMux, RefusesAPortInUse) {
  Fixture f = Start();
  PortMuxOptions mo;
  mo.port = f.mux->port();
  mo.zmq_port = 1;
  mo.http_port = 1;
  auto again = PortMux::Start(mo);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find(std::to_string(f.mux->port())), std::string::npos)
      << again.status().message();
}

}  // namespace
}  // namespace daisy::net
