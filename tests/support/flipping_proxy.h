// A TCP relay for tests that flips one bit of the client's byte stream at a given offset
// of every connection: a frame tampered with in flight.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

namespace daisy::test {

// Relays 127.0.0.1:port() to 127.0.0.1:target_port; flips the lowest bit of byte `flip_at`
// (0: never) of what each client sends. Thread-safe; the destructor ends every relay.
class FlippingProxy {
 public:
  FlippingProxy(int target_port, size_t flip_at) : target_(target_port), flip_at_(flip_at) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 8);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Loop(); });
  }
  ~FlippingProxy() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  int flipped() const { return flipped_.load(); }

 private:
  void Loop() {
    std::vector<std::thread> conns;
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      conns.emplace_back([this, c] { Relay(c); });
    }
    for (auto& t : conns) t.join();
  }
  void Relay(int c) {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(target_));
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(c);
      ::close(s);
      return;
    }
    size_t upstream = 0;
    char buf[65536];
    while (!stop_) {
      pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
      if (::poll(p, 2, 100) <= 0) continue;
      bool done = false;
      for (int i = 0; i < 2 && !done; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::recv(p[i].fd, buf, sizeof buf, 0);
        if (n <= 0) {
          done = true;
          break;
        }
        if (i == 0 && flip_at_ > 0 && upstream <= flip_at_ && flip_at_ < upstream + static_cast<size_t>(n)) {
          buf[flip_at_ - upstream] ^= 0x01;
          ++flipped_;
        }
        if (i == 0) upstream += static_cast<size_t>(n);
        if (::send(i == 0 ? s : c, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) done = true;
      }
      if (done) break;
    }
    ::close(c);
    ::close(s);
  }
  int fd_ = -1, port_ = 0, target_ = 0;
  size_t flip_at_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> flipped_{0};
  std::thread thread_;
};

}  // namespace daisy::test
