// Child processes for multi-process tests: spawned with their own environment and log
// file, killed (SIGKILL) when the handle goes away, so a failing test leaves nothing behind.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace daisy::e2e {

class Proc {
 public:
  Proc() = default;
  // Runs `args` (args[0] is the program path) with `env` added to this environment.
  static Proc Spawn(const std::vector<std::string>& args, const std::vector<std::string>& env, const std::string& log) {
    Proc p;
    p.pid_ = ::fork();
    if (p.pid_ == 0) {
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
      }
      int null = ::open("/dev/null", O_RDONLY);
      if (null >= 0) ::dup2(null, STDIN_FILENO);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      std::_Exit(127);
    }
    return p;
  }
  Proc(Proc&& o) noexcept : pid_(o.pid_) { o.pid_ = -1; }
  Proc& operator=(Proc&& o) noexcept {
    Stop(SIGKILL);
    pid_ = o.pid_;
    o.pid_ = -1;
    return *this;
  }
  ~Proc() { Stop(SIGKILL); }
  pid_t pid() const { return pid_; }
  // Sends `sig` and reaps the child; returns its exit status (or -1).
  int Stop(int sig) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, sig);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // Waits up to timeout_s for the child to exit; returns its exit code, or -2 on timeout.
  int Wait(double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -2;
  }

 private:
  pid_t pid_ = -1;
};

// A TCP port that was free a moment ago on 127.0.0.1, taken from below the kernel's
// ephemeral range: a port from bind(0) can be handed out again to any socket bound to port 0
// or connecting out (the server's own internal listeners, a client polling it before it
// listens, which can even connect to itself) before the server binds it. CI once failed
// on exactly that: "cannot listen on 127.0.0.1:39609: Address already in use".
inline int FreePort() {
  int lo = 32768, hi = 60999;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768, hi = 60999;
    std::fclose(f);
  }
  // The gap below the range if there is room, else the one above it.
  int first = lo - 1 > 10000 ? std::max(1024, lo - 12000) : hi + 1;
  int last = lo - 1 > 10000 ? lo - 1 : 65535;
  if (last < first) first = 1024, last = 65535;
  static std::atomic<unsigned> calls{0};
  const unsigned span = static_cast<unsigned>(last - first + 1);
  unsigned at = (static_cast<unsigned>(::getpid()) * 2654435761u +
                 static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()) +
                 calls.fetch_add(1) * 7919u) %
                span;
  for (int tries = 0; tries < 500; ++tries, at = (at + 7919u) % span) {
    const int port = first + static_cast<int>(at);
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(s);
    if (free) return port;
  }
  // 0 would let a server listen on a port of the kernel's choosing, then nobody reaches it.
  throw std::runtime_error("FreePort: no free port between " + std::to_string(first) + " and " + std::to_string(last));
}

}  // namespace daisy::e2e
