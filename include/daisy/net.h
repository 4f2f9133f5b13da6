// The transport of the ring and the rendezvous (ZeroMQ). Moves opaque frames and knows no
// model: it never decodes an activation, a prompt or a token. No zmq type leaks out of this
// header (PIMPL).
//
// Every socket is CurveZMQ: frames are encrypted and both ends authenticated. An inbox
// admits only the public keys on its allow-list (one ZAP handler per process checks each
// handshake against the list of the socket it is for), and an outbox sends only to a peer
// whose public key it was told.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/seal.h"
#include "daisy/status.h"
#include "daisy/wire.h"

namespace daisy::net {

// "HOST:PORT" (what a user types after --join) -> "tcp://HOST:PORT"; refuses anything else.
Result<std::string> JoinAddress(const std::string& host_port);

// ---- keys ----

// KeyPair, KeyId, Fingerprint, IsPublicKey, AuditKey and PeerBoxes: daisy/seal.h.

// A fresh key pair (tests, and a rendezvous that was given none).
KeyPair NewKeyPair();
// The key pair kept in `path`, or a new one written there (mode 0600, created exclusively,
// folders made as needed). A key file that group or others may read, or that is malformed,
// is refused with a message naming the file: it is never silently replaced.
Result<KeyPair> LoadOrCreateKeyPair(const std::string& path);
// A fingerprint or a prefix of one as typed ("AB12-cd34", "ab12cd34"): lower case, dashes
// and spaces dropped. InvalidArgument when anything else is left or it is empty.
Result<std::string> NormalizeFingerprint(const std::string& typed);

// ---- the browser tab's link (docs/WIRE.md, "link") ----

// A browser tab reaches serve over one WebSocket at GET kLinkPath on serve's port (PortMux
// hands the upgrade to the rendezvous's link server). Every message is binary. serve sends
// kLinkMagic, kLinkVersion, its rendezvous key (Z85) and a challenge; the tab answers with
// the magic, the version, its key (Z85) and a relay envelope (tab -> rendezvous) holding that
// challenge and one of its own; serve answers with an envelope holding the tab's challenge.
// After that each message is one envelope between the tab's key and the rendezvous key
// (PeerBoxes), whose inner frame is a wire::Message: join, heartbeat, bye and member
// envelopes up; peer lists, errors and member envelopes down. The magic, version, challenge
// size, message limit and close codes (LinkClose) are daisy/seal.h's: the tab shares them.
inline constexpr std::string_view kLinkPath = "/api/link";
// serve pings each link this often; a link that answers no ping for kLinkTimeoutSeconds
// (or takes nothing serve sends for as long) is closed and its member dropped.
inline constexpr double kLinkPingSeconds = 2.0;
inline constexpr double kLinkTimeoutSeconds = 10.0;
// Sec-WebSocket-Accept for a Sec-WebSocket-Key: base64(SHA-1(key + RFC 6455's GUID)).
std::string WebSocketAccept(std::string_view key);

// One device's place on the network: an inbox every peer sends to (a bound PULL socket)
// and an outbox per peer it sends to (PUSH sockets, connected on first use). Stage-to-stage
// links are therefore direct. Not thread-safe: one thread owns an Endpoint.
//
// The inbox is a CURVE server that admits only the keys on its allow-list (empty at first:
// nobody); a frame from a key taken off the list later is dropped on receipt. Each outbox
// is a CURVE client that proves this endpoint's key and checks the peer's: a send to an
// address whose key is unknown is refused.
class Endpoint {
 public:
  // Binds the inbox on `host` (an address of this machine) at `port` (0: any free port),
  // with this device's key pair. The overload without keys makes a fresh pair (tests).
  static Result<std::unique_ptr<Endpoint>> Bind(const std::string& host, int port, const KeyPair& keys);
  static Result<std::unique_ptr<Endpoint>> Bind(const std::string& host, int port);
  // Outboxes only, no inbox (Pulse's, and a relayed member's until ConnectRelay). address()
  // is "".
  static Result<std::unique_ptr<Endpoint>> SendOnly(const KeyPair& keys);
  // A member that accepts no connections (node --no-listen): one outbound connection to
  // serve's relay (`serve`: "tcp://HOST:PORT" of serve's one port, reached as a SOCKS5
  // CONNECT to kRelayHost, which PortMux answers), a CURVE client that proves this key and
  // checks `relay_key` (the rendezvous's). Receive/ReceiveFrame then read the frames the
  // relay hands down, with sender_key = relay_key; SendRelay sends up. Called again, it
  // replaces the link (after a restarted serve refused it in the handshake).
  Status ConnectRelay(const std::string& serve, const std::string& relay_key);
  Status SendRelay(std::span<const uint8_t> frame, int timeout_ms);
  bool relayed() const;
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // "tcp://HOST:PORT" that peers send to.
  const std::string& address() const;
  const std::string& public_key() const;
  // The keys the inbox admits (replaces the list; thread-safe with the ZAP handler).
  void SetAllowed(const std::vector<std::string>& public_keys);
  void Allow(const std::string& public_key);
  bool Allowed(const std::string& public_key) const;
  // The key the peer at `address` must prove. A different key than before closes the old
  // outbox to that address.
  void SetPeerKey(const std::string& address, const std::string& public_key);
  // Queues one frame for `address`. Unavailable when it cannot be handed to a connected
  // and authenticated peer within timeout_ms (the peer is gone, was never there, or
  // refused this device's key); FailedPrecondition when no key is known for `address`.
  Status Send(const std::string& address, std::span<const uint8_t> frame, int timeout_ms = 3000);
  Status Send(const std::string& address, const wire::Message& message, int timeout_ms = 3000);
  // Waits up to timeout_ms for one frame; nullopt on timeout. Frames over
  // wire::kMaxFrameBytes are dropped by the socket before they are allocated.
  Result<std::optional<std::vector<uint8_t>>> Receive(int timeout_ms);
  // The same, with the public key the sender proved in its handshake.
  struct Frame {
    std::vector<uint8_t> bytes;
    std::string sender_key;
  };
  Result<std::optional<Frame>> ReceiveFrame(int timeout_ms);
  // Addresses whose outbox connection broke since the last call: the peer hung up or
  // dropped the connection (as a receiver does when a frame fails authentication), or the
  // handshake failed.
  std::vector<std::string> TakeDropped();
  // Closes the outbox to a peer that left.
  void Forget(const std::string& address);
  // Closes every outbox, and forgets every address, whose key is not in `public_keys`:
  // links to members that left stop reconnecting.
  void KeepOnly(const std::vector<std::string>& public_keys);
  // Outboxes open now (tests: links to departed members are closed).
  int outboxes() const;

 private:
  struct Impl;
  explicit Endpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A device's links after a peer list from the rendezvous: its inbox admits only the
// rendezvous and the members of its room, and its outboxes know each member's key.
void ApplyPeerList(Endpoint& endpoint, const std::string& rendezvous_key, const wire::Peers& peers);

// Liveness that does not depend on being idle: a thread of its own sends this device's
// heartbeat (and, every few beats, its join, so a member the rendezvous dropped comes back)
// over a socket of its own. Loading, converting, a long prefill or a slow disk on the
// device's other threads never delay it. Thread-safe.
struct PulseOptions {
  std::string rendezvous;  // "tcp://HOST:PORT"
  std::string server_key;  // the rendezvous's public key
  KeyPair keys;            // the device's key pair (the rendezvous knows the member by it)
  std::string device_id;
  std::vector<uint8_t> join_frame;  // an encoded wire::Join, resent every rejoin_s ("": none)
  double interval_s = 1.0;
  double rejoin_s = 5.0;
};
class Pulse {
 public:
  static Result<std::unique_ptr<Pulse>> Start(const PulseOptions& options);
  ~Pulse();  // stops the thread and says bye (the device leaves the room)
  Pulse(const Pulse&) = delete;
  Pulse& operator=(const Pulse&) = delete;
  // Seconds since a heartbeat was last handed to an authenticated connection to the
  // rendezvous; 0 before the first attempt. Grows while the rendezvous is down, restarted
  // (it no longer admits this key) or unreachable.
  double SilentFor() const;
  // Replaces the join frame (a new address or hello).
  void SetJoinFrame(std::vector<uint8_t> join_frame);

 private:
  struct Impl;
  explicit Pulse(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A rendezvous drops a member whose heartbeats stop for this long (RendezvousOptions).
inline constexpr double kDeadAfterSeconds = 4.0;
// A member whose heartbeats have not reached the rendezvous for this long takes it as lost
// (stopped, restarted or unreachable) and asks to be admitted again.
inline constexpr double kRendezvousLostSeconds = 6.0;

// The name a relayed member asks serve's port for in its SOCKS5 CONNECT: PortMux hands such
// a connection to the relay (and refuses any other target: it is no open proxy).
inline constexpr const char* kRelayHost = "daisy-relay";

// What the relay sees of a frame it forwards (tests: it must be only ciphertext).
using RelayObserver = std::function<void(std::span<const uint8_t> frame)>;

struct RendezvousOptions {
  std::string host = "127.0.0.1";
  int port = 8788;
  bool auto_approve = false;                // every key that asks to join is approved (demos and tests)
  double dead_after_s = kDeadAfterSeconds;  // a member silent this long is dropped (heartbeats: 1/s)
  KeyPair keys;                             // the rendezvous's key pair; empty: a fresh one
  int max_pending = 64;                     // join requests waiting for the host at once
  // New join requests (keys not seen before) per source address: a burst, then this rate.
  int join_burst = 16;
  double join_per_s = 0.2;
  double pending_expire_s = 60;  // a pending request nobody asks about this long is dropped
  // The relay for members that accept no connections: a CURVE ROUTER on 127.0.0.1 (the
  // rendezvous's key and allow-list) that PortMux's SOCKS5 path reaches (relay_port()).
  bool relay = true;
  RelayObserver relay_observer;  // tests: every frame the relay forwards, as it saw it
  // Browser tabs' links (a WebSocket server on 127.0.0.1, link_port(), that PortMux hands
  // GET /api/link): each link is a relayed member's connection and its heartbeat. Needs the relay.
  bool link = true;
  int max_links = 64;  // links open at once (in their handshake or up); more are closed with 1013
  double link_ping_s = kLinkPingSeconds;
  double link_timeout_s = kLinkTimeoutSeconds;  // no pong this long: closed (4008), the member dropped
  double link_handshake_s = 10;                 // the tab's answer to the challenge must come within this
};

struct MemberInfo {
  std::string room;
  std::string address;
  wire::Hello hello;
  bool approved = false;
  std::string public_key;
};

// A device asking the host to admit its key to a room (over HTTP POST /api/join, or in
// this process). `source` is the address it came from (rate limits).
struct JoinRequest {
  std::string room;
  std::string public_key;
  std::string name;
  std::string source;
};
struct JoinAnswer {
  bool approved = false;    // false: pending, ask again
  std::string fingerprint;  // the device's, as the host sees it
};
struct PendingJoin {
  std::string room;
  std::string public_key;
  std::string fingerprint;
  std::string device_id;  // KeyId(public_key)
  std::string name;
  std::string source;
};

// How a device learns the rendezvous's key and asks to be admitted. Devices reach a
// remote rendezvous over HTTP (node: AwaitAdmission); a rendezvous in the same process
// offers this directly (Rendezvous::LocalAdmission).
struct Admission {
  std::string server_key;
  std::function<Result<JoinAnswer>(const JoinRequest&)> ask;
};

// Groups devices into rooms, admits only keys the host approved for a room, tells every
// member the members of its room (with their public keys), and drops members whose
// heartbeats stop. Its inbox admits only approved keys (ZAP), and a join for a room the
// key was not approved in is ignored: an unapproved device receives nothing. It only ever
// decodes join, heartbeat and bye, and of a relay envelope only its two device ids: it
// never sees a weight, an activation, a prompt or a token in the clear.
//
// The relay (a thread of its own) forwards envelopes (wire::Relay) between members of one
// room when either accepts no connections: up from a relayed member on its ROUTER
// connection or from any member through the rendezvous's inbox, down to a relayed member on
// its connection or to a member's inbox. It forwards an envelope only when its `from` is
// the id of the key that sent it and both ends are members of one room; it also hands a
// relayed member its peer lists. A relayed member's connection says who it is with a
// heartbeat (wire::Heartbeat, its device id) on connecting and every second.
// Runs on its own threads; the methods are thread-safe.
class Rendezvous {
 public:
  static Result<std::unique_ptr<Rendezvous>> Start(const RendezvousOptions& options);
  ~Rendezvous();  // stops the thread
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  const std::string& address() const;
  const std::string& public_key() const;
  // The relay's loopback port (PortMuxOptions::relay_port); 0 without a relay.
  int relay_port() const;
  // Frames the relay forwarded, and those it refused (unknown or unattached recipient, a
  // sender that is not the envelope's `from`, another room).
  int64_t relayed_frames() const;
  int64_t relay_refusals() const;
  // The link server's loopback port (PortMuxOptions::link_port); 0 without links. And the
  // links open now (in their handshake or up).
  int link_port() const;
  int links() const;
  // A device asks to join: approved at once when the key is already approved for the
  // room, pre-approved by fingerprint, or auto_approve is on; otherwise pending until the
  // host approves it. InvalidArgument for a malformed key or room; ResourceExhausted when
  // the source asks too often or too many requests are pending.
  Result<JoinAnswer> RequestJoin(const JoinRequest& request);
  // Admits `public_key` to `room` without asking (serve's own devices).
  void Admit(const std::string& room, const std::string& public_key, const std::string& name);
  // A key with this fingerprint (normalized, 16 hex digits) that asks to join `room` is
  // approved (serve --approve).
  Status PreApprove(const std::string& room, const std::string& fingerprint);
  // Approves the pending request whose fingerprint (or device id) starts with `prefix`
  // (unique; dashes optional). NotFound otherwise.
  Status Approve(const std::string& prefix);
  std::vector<PendingJoin> Pending() const;
  std::vector<MemberInfo> Members() const;
  // Asking this rendezvous in-process; `trusted` admits at once (serve's own head and
  // compute device), otherwise as RequestJoin. Valid while the rendezvous lives.
  Admission LocalAdmission(bool trusted);

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
  // 127.0.0.1:relay_port takes a SOCKS5 CONNECT to kRelayHost (a relayed member's link to the
  // relay); 0: SOCKS5 is refused like any unknown protocol.
  int relay_port = 0;
  // 127.0.0.1:link_port takes HTTP connections whose request is GET kLinkPath (a browser tab's
  // WebSocket link, Rendezvous::link_port()); 0: they go to http_port like any other request.
  int link_port = 0;
  int max_connections = 256;  // connections beyond this are closed at once
  // From one client address: one host cannot take every slot (a browser opens about 6
  // connections, a device 1-2; 64 leaves room for a few dozen behind one NAT).
  int max_connections_per_source = 64;
  // A connection must show what it is (a ZMTP signature, or an HTTP method and a space)
  // within this; silent, partial or unrecognised connections are closed, so they cannot
  // hold slots. Both kinds of client send their first bytes at once.
  double identify_timeout_s = 5;
  // Once the server side has closed, how long the client may take to close its side
  // before the mux closes it (nothing more can reach the server anyway).
  double linger_after_server_closed_s = 5;
};

// One public port for two servers: each accepted connection is handed, by its first bytes,
// to the rendezvous (a ZMTP signature: 0xFF, 8 bytes, 0x7F) or to the HTTP server (a method
// name and a space), both listening on 127.0.0.1 only, or, after a SOCKS5 handshake (0x05)
// that asks for kRelayHost and nothing else, to the relay; anything else is closed. Bytes are
// relayed both ways until both sides have closed (a half-close is passed on; a client that
// keeps its side open after the server closed is closed after a grace); one thread per
// connection, at most max_connections and max_connections_per_source. The servers see
// every connection as coming from 127.0.0.1; SourceOf tells the HTTP server who is really
// behind a relayed connection. Runs on its own threads; the destructor closes the port and
// every relayed connection.
// A blocking TCP connection to 127.0.0.1:port (loopback answers at once or refuses): the
// file descriptor, or -1 when refused. The mux's own link to its back ends; tests use it too.
int ConnectLoopback(int port);

class PortMux {
 public:
  static Result<std::unique_ptr<PortMux>> Start(const PortMuxOptions& options);
  ~PortMux();
  PortMux(const PortMux&) = delete;
  PortMux& operator=(const PortMux&) = delete;

  int port() const;         // the public port (useful with port 0)
  int connections() const;  // connections being relayed now
  // The address of the client whose connection the mux relays from its loopback port
  // `local_port` (what the HTTP server sees as the remote port); "" when none.
  std::string SourceOf(int local_port) const;

 private:
  struct Impl;
  explicit PortMux(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace daisy::net
