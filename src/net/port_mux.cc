// PortMux: one public TCP port in front of the rendezvous (ZeroMQ) and the HTTP server.
// The first bytes of a connection decide where it goes: a ZMTP greeting starts with a
// 10-byte signature (0xFF ... 0x7F), an HTTP request with a method name and a space; any
// other connection is closed. Everything after that is relayed unchanged. A relayed member
// (node --no-listen) reaches the relay through a SOCKS5 CONNECT to kRelayHost, which libzmq
// speaks before ZMTP (ZMQ_SOCKS_PROXY); the mux answers only that one target. A browser
// tab's link (GET /api/link, a WebSocket upgrade) goes to the link server, not the HTTP server.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>

#include "daisy/log.h"
#include "daisy/net.h"

namespace daisy::net {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kPollMs = 200;  // how often blocked threads look at the stop flag
constexpr size_t kRelayBuffer = 64 * 1024;

void SetNonBlocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

enum class Kind { kNeedMore, kZmtp, kHttp, kSocks, kLink, kOther };

constexpr size_t kIdentifyBytes = 10;  // enough for the ZMTP signature, "OPTIONS " and a SOCKS5 greeting

// What a connection is, from the bytes it sent so far (peeked, not taken).
Kind Identify(const unsigned char* p, size_t n) {
  if (n == 0) return Kind::kNeedMore;
  if (p[0] == 0x05) {
    // SOCKS5 greeting: version, n methods (1..), the methods; "no authentication" (0) must be one.
    if (n < 2) return Kind::kNeedMore;
    if (p[1] == 0 || p[1] > kIdentifyBytes - 2) return Kind::kOther;
    if (n < 2u + p[1]) return Kind::kNeedMore;
    for (size_t i = 0; i < p[1]; ++i)
      if (p[2 + i] == 0x00) return Kind::kSocks;
    return Kind::kOther;
  }
  if (p[0] == 0xFF) {
    // ZMTP 2/3 signature: 0xFF, 8 bytes of length padding, 0x7F (libzmq sends all 10 at once).
    if (n < 10) return Kind::kNeedMore;
    return p[9] == 0x7F ? Kind::kZmtp : Kind::kOther;
  }
  // The methods httplib parses; the space makes "GETX" junk, not HTTP.
  static constexpr std::string_view kMethods[] = {"GET ",     "HEAD ",  "POST ",    "PUT ",  "DELETE ",
                                                  "OPTIONS ", "PATCH ", "CONNECT ", "TRACE "};
  const std::string_view got(reinterpret_cast<const char*>(p), n);
  bool partial = false;
  for (std::string_view m : kMethods) {
    if (got.size() >= m.size() && got.substr(0, m.size()) == m) return Kind::kHttp;
    if (got.size() < m.size() && m.substr(0, got.size()) == got) partial = true;
  }
  return partial ? Kind::kNeedMore : Kind::kOther;
}

// A browser tab's link: "GET /api/link" then a space or a query. kLink, kHttp (anything
// else), or kNeedMore while the bytes so far could still be either.
Kind IdentifyLink(const unsigned char* p, size_t n) {
  const std::string prefix = "GET " + std::string(kLinkPath);
  const std::string_view got(reinterpret_cast<const char*>(p), n);
  const size_t k = std::min(got.size(), prefix.size());
  if (got.substr(0, k) != std::string_view(prefix).substr(0, k)) return Kind::kHttp;
  if (got.size() <= prefix.size()) return Kind::kNeedMore;
  const char next = got[prefix.size()];
  return next == ' ' || next == '?' ? Kind::kLink : Kind::kHttp;
}

constexpr auto kRefusalLogEvery = std::chrono::seconds(10);  // under a flood, one line per 10 s

}  // namespace

struct PortMux::Impl {
  PortMuxOptions options;
  int listen_fd = -1;
  int port = 0;
  std::atomic<bool> stop{false};
  std::thread accept_thread;
  mutable std::mutex mu;
  std::condition_variable idle;  // signalled when a connection thread ends
  int active = 0;
  std::map<std::string, int> per_source;  // client address -> connections open from it
  std::map<int, std::string> sources;     // loopback port of a relayed connection -> client address
  // Refusals and closed unidentified connections, logged at most every kRefusalLogEvery.
  int refused_unlogged = 0;
  int closed_unlogged = 0;
  Clock::time_point last_log{};

  // Logs what was refused or closed since the last line, at most every kRefusalLogEvery.
  void NoteRefusal(bool refused, const std::string& why) {  // under mu
    (refused ? refused_unlogged : closed_unlogged) += 1;
    const auto now = Clock::now();
    if (now - last_log < kRefusalLogEvery) return;
    last_log = now;
    std::string line = "port mux: ";
    if (refused_unlogged > 0) line += "refused " + std::to_string(refused_unlogged) + " connection(s)";
    if (refused_unlogged > 0 && closed_unlogged > 0) line += " and ";
    if (closed_unlogged > 0)
      line += "closed " + std::to_string(closed_unlogged) + " that were neither HTTP, ZeroMQ nor the relay in time";
    line += " (latest: " + why + ")";
    refused_unlogged = closed_unlogged = 0;
    LogWarning(line);
  }

  ~Impl() {
    if (listen_fd >= 0) ::close(listen_fd);
  }

  // Writes all of `n` bytes to a non-blocking socket; false when it fails or we stop.
  bool WriteAll(int fd, const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
      if (w > 0) {
        p += w;
        n -= static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        pollfd pfd{fd, POLLOUT, 0};
        ::poll(&pfd, 1, kPollMs);
        if (stop.load()) return false;
        continue;
      }
      return false;
    }
    return true;
  }

  // Relays bytes between client and server until both directions have ended (EOF passed
  // on as a half-close), an error, or stop. Once the server has closed, the client has
  // linger_after_server_closed_s to close too: nothing it sends can be delivered, and a
  // client that never closes would otherwise hold its slot forever.
  void Relay(int client, int server) {
    std::vector<char> buf(kRelayBuffer);
    bool client_open = true, server_open = true;  // still reading from each side
    Clock::time_point close_by = Clock::time_point::max();
    while (!stop.load() && (client_open || server_open)) {
      if (!server_open && Clock::now() >= close_by) return;
      // A side that ended is left out (fd -1): poll would report its hang-up forever.
      pollfd pfds[2] = {{client_open ? client : -1, POLLIN, 0}, {server_open ? server : -1, POLLIN, 0}};
      const int r = ::poll(pfds, 2, kPollMs);
      if (r < 0 && errno != EINTR) return;
      if (r <= 0) continue;
      for (int side = 0; side < 2; ++side) {
        const int from = side == 0 ? client : server, to = side == 0 ? server : client;
        bool& open = side == 0 ? client_open : server_open;
        if (!open || !(pfds[side].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::recv(from, buf.data(), buf.size(), 0);
        if (n > 0) {
          if (!WriteAll(to, buf.data(), static_cast<size_t>(n))) return;
        } else if (n == 0) {
          open = false;
          ::shutdown(to, SHUT_WR);
          if (side == 1)
            close_by = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(options.linger_after_server_closed_s));
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          return;  // reset: close both
        }
      }
    }
  }

  // Peeks at the client's first bytes until they say what it is, it closes, or
  // identify_timeout_s passes.
  Kind Await(int client) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options.identify_timeout_s));
    unsigned char head[kIdentifyBytes];
    ssize_t seen = 0;
    while (!stop.load() && Clock::now() < deadline) {
      pollfd pfd{client, POLLIN, 0};
      if (::poll(&pfd, 1, kPollMs) <= 0) continue;
      const ssize_t n = ::recv(client, head, sizeof head, MSG_PEEK);
      if (n == 0) return Kind::kOther;  // closed before saying anything useful
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        return Kind::kOther;
      }
      const Kind kind = Identify(head, static_cast<size_t>(n));
      if (kind != Kind::kNeedMore) return kind;
      // The bytes stay queued, so poll reports them at once: wait for more instead of spinning.
      if (n == seen) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      seen = n;
    }
    return Kind::kNeedMore;
  }

  // An HTTP connection: is it a browser tab's link (GET /api/link)? Peeks until the request
  // target says so; a client that stops mid-way is left to the HTTP server's own timeouts.
  Kind AwaitLink(int client) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options.identify_timeout_s));
    unsigned char head[32];
    ssize_t seen = 0;
    while (!stop.load() && Clock::now() < deadline) {
      const ssize_t n = ::recv(client, head, sizeof head, MSG_PEEK);
      if (n <= 0) return Kind::kHttp;
      const Kind kind = IdentifyLink(head, static_cast<size_t>(n));
      if (kind != Kind::kNeedMore) return kind;
      if (n == seen) {
        pollfd pfd{client, POLLIN, 0};
        ::poll(&pfd, 1, 20);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      seen = n;
    }
    return Kind::kHttp;
  }

  // Reads exactly n bytes by the deadline; false when the client closes, fails or is late.
  bool ReadExact(int fd, unsigned char* p, size_t n, Clock::time_point deadline) {
    while (n > 0) {
      if (stop.load() || Clock::now() >= deadline) return false;
      const ssize_t r = ::recv(fd, p, n, 0);
      if (r > 0) {
        p += r;
        n -= static_cast<size_t>(r);
      } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        return false;
      } else {
        pollfd pfd{fd, POLLIN, 0};
        ::poll(&pfd, 1, kPollMs);
      }
    }
    return true;
  }

  // The SOCKS5 handshake of a relayed member (RFC 1928, no authentication): only a CONNECT
  // by name to kRelayHost is granted, so the mux is no proxy to anywhere else. Returns the
  // refusal, "" when granted.
  std::string SocksHandshake(int client) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options.identify_timeout_s));
    unsigned char greeting[kIdentifyBytes];
    if (!ReadExact(client, greeting, 2, deadline) || !ReadExact(client, greeting + 2, greeting[1], deadline))
      return "a SOCKS5 greeting cut short";
    static constexpr unsigned char kNoAuth[] = {0x05, 0x00};
    if (!WriteAll(client, reinterpret_cast<const char*>(kNoAuth), sizeof kNoAuth)) return "the client left";
    unsigned char req[4];
    if (!ReadExact(client, req, 4, deadline)) return "a SOCKS5 request cut short";
    std::string host;
    if (req[0] == 0x05 && req[1] == 0x01 && req[3] == 0x03) {  // CONNECT to a domain name
      unsigned char len = 0;
      if (!ReadExact(client, &len, 1, deadline)) return "a SOCKS5 request cut short";
      host.resize(len);
      if (!ReadExact(client, reinterpret_cast<unsigned char*>(host.data()), len, deadline))
        return "a SOCKS5 request cut short";
      unsigned char port[2];
      if (!ReadExact(client, port, 2, deadline)) return "a SOCKS5 request cut short";
    }
    const bool granted = host == kRelayHost && options.relay_port > 0;
    // Reply: version, 0 granted / 2 not allowed by the rule set, reserved, IPv4 0.0.0.0:0.
    const unsigned char reply[] = {0x05, static_cast<unsigned char>(granted ? 0x00 : 0x02), 0, 0x01, 0, 0, 0, 0, 0, 0};
    if (!WriteAll(client, reinterpret_cast<const char*>(reply), sizeof reply)) return "the client left";
    if (granted) return "";
    return options.relay_port > 0 ? "a SOCKS5 request for a target other than the relay"
                                  : "a SOCKS5 request, and this server has no relay";
  }

  void Serve(int client, const std::string& source) {
    SetNonBlocking(client);
    SetNoDelay(client);
    Kind kind = Await(client);
    if (kind == Kind::kHttp && options.link_port > 0) kind = AwaitLink(client);
    if (kind == Kind::kSocks) {
      const std::string refused = SocksHandshake(client);
      if (refused.empty()) {
        const int backend = ConnectLoopback(options.relay_port);
        if (backend < 0) {
          LogWarning("port mux: cannot reach the internal relay at 127.0.0.1:" + std::to_string(options.relay_port));
        } else {
          SetNonBlocking(backend);
          SetNoDelay(backend);
          Relay(client, backend);
          ::close(backend);
        }
        ::close(client);
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        NoteRefusal(false, source + " sent " + refused);
      }
      ::close(client);
      return;
    }
    const bool have = kind == Kind::kZmtp || kind == Kind::kHttp || kind == Kind::kLink;
    if (!have && !stop.load()) {
      std::lock_guard<std::mutex> lock(mu);
      NoteRefusal(false, source + (kind == Kind::kNeedMore ? " said too little in time" : " sent something else"));
    }
    if (have) {
      const int target_port = kind == Kind::kZmtp   ? options.zmq_port
                              : kind == Kind::kLink ? options.link_port
                                                    : options.http_port;
      const int backend = ConnectLoopback(target_port);
      if (backend < 0) {
        const char* what = kind == Kind::kZmtp ? "rendezvous" : kind == Kind::kLink ? "link server" : "HTTP server";
        LogWarning("port mux: cannot reach the internal " + std::string(what) +
                   " at 127.0.0.1:" + std::to_string(target_port));
      } else {
        SetNonBlocking(backend);
        SetNoDelay(backend);
        sockaddr_in local{};
        socklen_t len = sizeof local;
        int local_port = 0;
        if (::getsockname(backend, reinterpret_cast<sockaddr*>(&local), &len) == 0) local_port = ntohs(local.sin_port);
        {
          std::lock_guard<std::mutex> lock(mu);
          sources[local_port] = source;
        }
        Relay(client, backend);
        {
          std::lock_guard<std::mutex> lock(mu);
          sources.erase(local_port);
        }
        ::close(backend);
      }
    }
    ::close(client);
  }

  void AcceptLoop(const std::shared_ptr<Impl>& self) {
    while (!stop.load()) {
      pollfd pfd{listen_fd, POLLIN, 0};
      if (::poll(&pfd, 1, kPollMs) <= 0) continue;
      sockaddr_storage peer{};
      socklen_t peer_len = sizeof peer;
      const int client = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_CLOEXEC);
      if (client < 0) continue;
      char host[INET6_ADDRSTRLEN] = {0};
      if (peer.ss_family == AF_INET6) {
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr, host, sizeof host);
      } else {
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&peer)->sin_addr, host, sizeof host);
      }
      std::string source = host;
      {
        std::lock_guard<std::mutex> lock(mu);
        int& from_source = per_source[source];
        std::string why;
        if (active >= options.max_connections)
          why = std::to_string(active) + " connections are open";
        else if (from_source >= options.max_connections_per_source)
          why = std::to_string(from_source) + " connections are open from " + source;
        if (!why.empty()) {
          if (from_source == 0) per_source.erase(source);
          ::close(client);
          NoteRefusal(true, why);
          continue;
        }
        ++active;
        ++from_source;
      }
      // Detached: the thread holds the Impl alive; the destructor waits for active == 0.
      std::thread([self, client, source] {
        self->Serve(client, source);
        std::lock_guard<std::mutex> lock(self->mu);
        --self->active;
        if (--self->per_source[source] <= 0) self->per_source.erase(source);
        self->idle.notify_all();
      }).detach();
    }
  }
};

PortMux::PortMux(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

PortMux::~PortMux() {
  impl_->stop.store(true);
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->idle.wait(lock, [&] { return impl_->active == 0; });
}

int PortMux::port() const {
  return impl_->port;
}

int PortMux::connections() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->active;
}

std::string PortMux::SourceOf(int local_port) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->sources.find(local_port);
  return it == impl_->sources.end() ? "" : it->second;
}

Result<std::unique_ptr<PortMux>> PortMux::Start(const PortMuxOptions& options) {
  if (options.zmq_port <= 0 || options.http_port <= 0) return InvalidArgument("Bug: PortMux needs both internal ports");
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  const std::string where = options.host + ":" + std::to_string(options.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(options.port);
  const int gai = ::getaddrinfo(options.host.empty() ? nullptr : options.host.c_str(), port_str.c_str(), &hints, &res);
  if (gai != 0) return InvalidArgument("cannot listen on " + where + ": " + ::gai_strerror(gai));
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      impl->listen_fd = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (impl->listen_fd < 0) return Unavailable("cannot listen on " + where + ": " + last_error);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
  impl->port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                           : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  impl->accept_thread = std::thread([self = impl.get(), impl] { self->AcceptLoop(impl); });
  return std::unique_ptr<PortMux>(new PortMux(std::move(impl)));
}

int ConnectLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace daisy::net
