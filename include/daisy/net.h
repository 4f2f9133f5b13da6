// The transport of the ring and the rendezvous (ZeroMQ). Moves opaque frames and knows no
// model: it never decodes an activation, a prompt or a token. No zmq type leaks out of this
// header (PIMPL).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daisy/status.h"
#include "daisy/wire.h"

namespace daisy::net {

// "HOST:PORT" (what a user types after --join) -> "tcp://HOST:PORT"; refuses anything else.
Result<std::string> JoinAddress(const std::string& host_port);

// One device's place on the network: an inbox every peer sends to (a bound PULL socket)
// and an outbox per peer it sends to (PUSH sockets, connected on first use). Stage-to-stage
// links are therefore direct. Not thread-safe: one thread owns an Endpoint.
class Endpoint {
 public:
  // Binds the inbox on `host` (an address of this machine) at `port` (0: any free port).
  static Result<std::unique_ptr<Endpoint>> Bind(const std::string& host, int port);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // "tcp://HOST:PORT" that peers send to.
  const std::string& address() const;
  // Queues one frame for `address`. Unavailable when it cannot be handed to a connected
  // peer within timeout_ms (the peer is gone or was never there).
  Status Send(const std::string& address, std::span<const uint8_t> frame, int timeout_ms = 3000);
  Status Send(const std::string& address, const wire::Message& message, int timeout_ms = 3000);
  // Waits up to timeout_ms for one frame; nullopt on timeout. Frames over
  // wire::kMaxFrameBytes are dropped by the socket before they are allocated.
  Result<std::optional<std::vector<uint8_t>>> Receive(int timeout_ms);
  // Closes the outbox to a peer that left.
  void Forget(const std::string& address);

 private:
  struct Impl;
  explicit Endpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct RendezvousOptions {
  std::string host = "127.0.0.1";
  int port = 8788;
  bool auto_approve = false;
  double dead_after_s = 4.0;  // a member silent this long is dropped (heartbeats: 1/s)
};

struct MemberInfo {
  std::string room;
  std::string address;
  wire::Hello hello;
  bool approved = false;
};

// Groups devices into rooms, lets the host approve each device, tells every approved
// member the approved members of its room, and drops members whose heartbeats stop. It
// only ever decodes join, heartbeat and bye: it never sees a weight, an activation, a
// prompt or a token. Runs on its own thread; the methods are thread-safe.
class Rendezvous {
 public:
  static Result<std::unique_ptr<Rendezvous>> Start(const RendezvousOptions& options);
  ~Rendezvous();  // stops the thread
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  const std::string& address() const;
  // Approves the device whose id starts with `id_prefix` (unique). NotFound otherwise.
  Status Approve(const std::string& id_prefix);
  std::vector<MemberInfo> Members() const;

 private:
  struct Impl;
  explicit Rendezvous(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct PortMuxOptions {
  std::string host = "127.0.0.1";  // the public address to listen on
  int port = 8788;                 // 0: any free port
  int zmq_port = 0;                // 127.0.0.1:zmq_port takes connections starting with 0xFF
  int http_port = 0;               // 127.0.0.1:http_port takes every other connection
  int max_connections = 256;       // connections beyond this are closed at once
  double first_byte_timeout_s = 30;  // a connection silent this long is closed
};

// One public port for two servers: each accepted connection is handed, by its first byte,
// to the rendezvous (ZMTP greetings start with 0xFF) or to the HTTP server (a request starts
// with a letter), both listening on 127.0.0.1 only. Bytes are relayed both ways until both
// sides have closed (a half-close is passed on); one thread per connection. The servers see
// every connection as coming from 127.0.0.1. Runs on its own threads; the destructor closes
// the port and every relayed connection.
class PortMux {
 public:
  static Result<std::unique_ptr<PortMux>> Start(const PortMuxOptions& options);
  ~PortMux();
  PortMux(const PortMux&) = delete;
  PortMux& operator=(const PortMux&) = delete;

  int port() const;         // the public port (useful with port 0)
  int connections() const;  // connections being relayed now

 private:
  struct Impl;
  explicit PortMux(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace daisy::net
