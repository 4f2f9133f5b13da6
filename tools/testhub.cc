// testhub: runs TestHub (tests/support/test_hub.h) from the command line, for tests that
// start several processes. Prints the hub's port on the first line of stdout, then serves
// until SIGINT or SIGTERM.
//
//   testhub --root DIR [--port N] [--gate owner/name]... [--token T] [--redirect-above BYTES]
//           [--ignore-ranges] [--bandwidth BYTES_PER_S] [--first-byte-delay MS]
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "test_hub.h"

namespace {

int Usage(const char* why) {
  std::fprintf(stderr,
               "testhub: %s\nusage: testhub --root DIR [--port N] [--gate owner/name]... [--token T] "
               "[--redirect-above BYTES] [--ignore-ranges] [--bandwidth BYTES_PER_S] [--first-byte-delay MS]\n",
               why);
  return 2;
}

bool ParseNumber(const std::string& s, unsigned long long* out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::strtoull(s.c_str(), nullptr, 10);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string root, token;
  unsigned long long port = 0, redirect_above = 0, bandwidth = 0, first_byte_delay = 0;
  bool redirect = false, ignore_ranges = false;
  std::vector<std::string> gated;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (arg == "--help" || arg == "-h") {
      Usage("serves a folder of repos (DIR/owner/name/files) like the Hugging Face Hub");
      return 0;
    } else if (arg == "--root") {
      if (!value(&root)) return Usage("--root needs a folder");
    } else if (arg == "--port") {
      if (!value(&v) || !ParseNumber(v, &port) || port > 65535) return Usage("--port needs a port number");
    } else if (arg == "--gate") {
      if (!value(&v)) return Usage("--gate needs owner/name");
      gated.push_back(v);
    } else if (arg == "--token") {
      if (!value(&token)) return Usage("--token needs a value");
    } else if (arg == "--redirect-above") {
      if (!value(&v) || !ParseNumber(v, &redirect_above)) return Usage("--redirect-above needs a byte count");
      redirect = true;
    } else if (arg == "--ignore-ranges") {
      ignore_ranges = true;
    } else if (arg == "--bandwidth") {
      if (!value(&v) || !ParseNumber(v, &bandwidth)) return Usage("--bandwidth needs bytes per second");
    } else if (arg == "--first-byte-delay") {
      if (!value(&v) || !ParseNumber(v, &first_byte_delay) || first_byte_delay > 600000)
        return Usage("--first-byte-delay needs milliseconds");
    } else {
      return Usage(("unknown argument " + arg).c_str());
    }
  }
  if (root.empty()) return Usage("--root is required");
  if (!gated.empty() && token.empty()) return Usage("--gate needs --token (the token that opens the gate)");

  // Block the stop signals before any server thread starts, so only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  auto hub = daisy::testing::TestHub::Start(root, static_cast<int>(port));
  if (!hub.ok()) {
    std::fprintf(stderr, "testhub: %s\n", hub.status().ToString().c_str());
    return 1;
  }
  for (const auto& repo : gated) (*hub)->Gate(repo);
  if (!token.empty()) (*hub)->SetToken(token);
  if (redirect) (*hub)->SetRedirectAbove(redirect_above);
  (*hub)->SetIgnoreRanges(ignore_ranges);
  (*hub)->SetBandwidthLimit(bandwidth);
  (*hub)->SetFirstByteDelay(static_cast<int>(first_byte_delay));

  std::printf("%d\n", (*hub)->port());
  std::fflush(stdout);
  std::fprintf(stderr, "testhub: serving %s at %s (redirect target %s)\n", root.c_str(), (*hub)->endpoint().c_str(),
               (*hub)->cdn_endpoint().c_str());
  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "testhub: stopping (%d requests served)\n", (*hub)->request_count());
  return 0;
}
