// GuardedHttpServer: a thread per connection (capped) and read deadlines per request.
#include "guarded_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <system_error>
#include <thread>

namespace daisy::srv {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSliceMs = 100;                               // how often a waiting connection looks at the server's stop
constexpr auto kIdleThreadLife = std::chrono::seconds(30);  // an idle thread beyond the warm ones ends

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// httplib's task queue: one thread per queued connection while fewer than `max` run;
// beyond that connections wait for a thread. Threads beyond `warm` end when idle.
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  ConnectionThreads(size_t max, size_t warm) : max_(std::max<size_t>(1, max)), warm_(std::min(warm, max_)) {}
  ~ConnectionThreads() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::list<std::thread> finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(fn));
      if (idle_ < jobs_.size() && threads_.size() < max_) {
        threads_.emplace_back();
        auto self = std::prev(threads_.end());
        try {
          // The new thread waits for mu_ before it looks at `self`, which is set by then.
          *self = std::thread([this, self] { Work(self); });
        } catch (const std::system_error&) {
          threads_.erase(self);  // no thread to be had now: the job waits for a running one
        }
      }
      finished.swap(finished_);
    }
    cv_.notify_one();
    for (auto& t : finished) t.join();  // ended on their own: joining does not wait
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (;;) {
      std::list<std::thread> all;
      {
        std::lock_guard<std::mutex> lock(mu_);
        all.splice(all.end(), threads_);
        all.splice(all.end(), finished_);
      }
      if (all.empty()) return;
      for (auto& t : all)
        if (t.joinable()) t.join();
    }
  }

 private:
  void Work(std::list<std::thread>::iterator self) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      const bool woke = cv_.wait_for(lock, kIdleThreadLife, [&] { return stopping_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) {
        if (stopping_) return;  // shutdown() joins it
        if (!woke && threads_.size() > warm_) {
          // Idle too long: hand this thread to the next enqueue or shutdown to join.
          finished_.splice(finished_.end(), threads_, self);
          return;
        }
        continue;
      }
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  const size_t max_;
  const size_t warm_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::list<std::thread> threads_;   // running (busy or idle)
  std::list<std::thread> finished_;  // ended by themselves, to be joined
  size_t idle_ = 0;
  bool stopping_ = false;
};

// A connection's socket as httplib's Stream, with a deadline on reads: the request being
// read must arrive by then, whatever pace the client sends at. Writes keep httplib's
// per-write timeout. Buffered like httplib's own stream (its line reader takes a byte at a
// time).
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(socket_t sock, time_t read_timeout_s, time_t write_timeout_s)
      : sock_(sock), read_timeout_ms_(ClampMs(read_timeout_s)), write_timeout_ms_(ClampMs(write_timeout_s)) {}

  void SetDeadline(Clock::time_point deadline) { deadline_ = deadline; }
  bool expired() const { return expired_; }
  bool buffered() const { return off_ < len_; }

  bool is_readable() const override { return buffered() || WaitFor(POLLIN, read_timeout_ms_, true); }
  bool is_writable() const override { return WaitFor(POLLOUT, write_timeout_ms_, false); }

  ssize_t read(char* ptr, size_t size) override {
    if (!buffered()) {
      if (!WaitFor(POLLIN, read_timeout_ms_, true)) return -1;
      ssize_t n;
      do {
        n = ::recv(sock_, buf_, sizeof buf_, 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      off_ = 0;
      len_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, len_ - off_);
    std::memcpy(ptr, buf_ + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&a), &len) == 0) Describe(a, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &len) == 0) Describe(a, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  static int ClampMs(time_t s) { return static_cast<int>(std::clamp<time_t>(s, 0, 3600) * 1000); }

  static void Describe(const sockaddr_storage& a, std::string& ip, int& port) {
    char host[INET6_ADDRSTRLEN] = {0};
    if (a.ss_family == AF_INET6) {
      const auto& a6 = reinterpret_cast<const sockaddr_in6&>(a);
      ::inet_ntop(AF_INET6, &a6.sin6_addr, host, sizeof host);
      port = ntohs(a6.sin6_port);
    } else {
      const auto& a4 = reinterpret_cast<const sockaddr_in&>(a);
      ::inet_ntop(AF_INET, &a4.sin_addr, host, sizeof host);
      port = ntohs(a4.sin_port);
    }
    ip = host;
  }

  // Waits up to `timeout_ms` for `events`; reads also end at the deadline (and say so).
  bool WaitFor(short events, int timeout_ms, bool reading) const {
    auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
    const bool by_deadline = reading && deadline_ <= until;
    if (by_deadline) until = deadline_;
    for (;;) {
      const auto now = Clock::now();
      if (now >= until) {
        if (by_deadline) expired_ = true;
        return false;
      }
      pollfd p{sock_, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(until - now).count()));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) return false;
    }
  }

  socket_t sock_;
  int read_timeout_ms_;
  int write_timeout_ms_;
  Clock::time_point deadline_ = Clock::time_point::max();
  mutable bool expired_ = false;
  char buf_[4096];
  size_t off_ = 0, len_ = 0;
};

// The stream of the request this thread is reading, for the pre-routing handler.
thread_local DeadlineStream* t_stream = nullptr;
// Set when the guard refused the request: its body is unread, so the connection ends.
thread_local bool t_refused = false;

}  // namespace

GuardedHttpServer::GuardedHttpServer(const ConnectionLimits& limits) : limits_(limits) {
  new_task_queue = [max = limits.max_threads, warm = limits.warm_threads] { return new ConnectionThreads(max, warm); };
  // Called once the headers are in, before the body is read: the body gets its own deadline.
  set_pre_routing_handler([this, body = limits.body_timeout_s](const httplib::Request& req, httplib::Response& res) {
    if (guard_ && guard_(req, res)) {
      t_refused = true;
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (t_stream) t_stream->SetDeadline(Clock::now() + Seconds(body));
    return httplib::Server::HandlerResponse::Unhandled;
  });
}

void GuardedHttpServer::WidenBacklog(int backlog) {
  const socket_t s = svr_sock_;
  if (s != INVALID_SOCKET) ::listen(s, backlog);  // listen() again only changes the backlog
}

bool GuardedHttpServer::process_and_close_socket(socket_t sock) {
  DeadlineStream strm(sock, read_timeout_sec_, write_timeout_sec_);
  bool ret = false;
  for (size_t left = std::max<size_t>(1, keep_alive_max_count_); left > 0; --left) {
    // Keep-alive: wait for the next request (or the first), looking at stop now and then.
    const auto idle_until = Clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
    bool ready = strm.buffered();
    while (!ready && svr_sock_ != INVALID_SOCKET && Clock::now() < idle_until) {
      pollfd p{sock, POLLIN, 0};
      const int r = ::poll(&p, 1, kSliceMs);
      if (r < 0 && errno != EINTR) break;
      ready = r > 0;
    }
    if (!ready || svr_sock_ == INVALID_SOCKET) break;
    // The request line and headers must all be in within header_timeout_s of now.
    strm.SetDeadline(Clock::now() + Seconds(limits_.header_timeout_s));
    bool connection_closed = false;
    t_stream = &strm;
    t_refused = false;
    ret = process_request(strm, /*close_connection=*/left == 1, connection_closed, nullptr);
    t_stream = nullptr;
    // A client that missed its deadline is done: it gets no second request. Nor does one
    // refused before its body was read (the bytes that follow are that body).
    if (!ret || connection_closed || strm.expired() || t_refused) break;
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace daisy::srv
