// Internal: the httplib server of `serve` (and of the demo's join server) with the limits
// that keep slow or idle clients from taking the server down (docs/HTTP.md, "Limits").
//
// httplib serves a connection on one thread of its task queue for as long as the
// connection lasts, and its read timeout applies to each read alone: a client that sends a
// header line every few seconds, or an event stream that never ends, holds that thread
// forever, and a fixed pool of them is soon gone. Here each connection gets a thread of its
// own (up to a cap, so a flood cannot exhaust the process), and the request line and
// headers, then the body, must arrive within deadlines that count from their first byte.
#pragma once

#include <httplib.h>

#include <cstddef>
#include <functional>

namespace daisy::srv {

struct ConnectionLimits {
  // Connections served at once (each holds one thread while open); more wait for a slot.
  // Well above what the port mux lets in (256), so the mux's caps bind first.
  size_t max_threads = 512;
  size_t warm_threads = 8;       // threads kept while idle
  double header_timeout_s = 10;  // request line and headers, from their first byte
  double body_timeout_s = 30;    // the body, from the end of the headers
};

// Thread-safe as httplib::Server. It owns the pre-routing handler (the body deadline
// starts there): callers must not set their own.
class GuardedHttpServer : public httplib::Server {
 public:
  explicit GuardedHttpServer(const ConnectionLimits& limits);

  // After bind_to_port: httplib listens with a backlog of 5, so a burst of connections
  // (a reconnecting UI, or a flood) has the kernel drop SYNs and clients wait a second or
  // more to retry. 128 is what the port mux uses.
  void WidenBacklog(int backlog = 128);

  // Looks at each request once its headers are in, before its body is read: returns true
  // when it wrote a refusal into the response, which is sent as is; the connection is then
  // closed (its body is never read). Set before listening.
  using Guard = std::function<bool(const httplib::Request&, httplib::Response&)>;
  void SetGuard(Guard guard) { guard_ = std::move(guard); }

 private:
  // Replaces httplib's per-connection loop: keep-alive, deadlines, then process_request.
  bool process_and_close_socket(socket_t sock) override;

  ConnectionLimits limits_;
  Guard guard_;
};

}  // namespace daisy::srv
