// A minimal native client of serve's browser-tab link (DCL1 over a WebSocket; docs/WIRE.md,
// "link") for tests: what a tab's page and worker do, in one blocking object. Its WebSocket
// framing is written apart from serve's (client side: masked frames out, unmasked in; no
// fragments are sent) so a test of one against the other is not a test of one code twice.
// Not thread-safe: one thread owns a LinkClient.
//
//   auto link = LinkClient::Connect("127.0.0.1", port, tab_keys, rendezvous_public_key);
//   link->Send(wire::Message(join));                 // to serve: join, heartbeat, bye
//   link->SendEnvelope(member_public_key, message);  // to a member, boxed end to end
//   auto in = link->Receive(1000);                   // peers, errors, envelopes from members
//   if (auto* env = std::get_if<wire::Relay>(&**in)) link->OpenEnvelope(member_public_key, *env);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daisy/net.h"
#include "daisy/status.h"
#include "daisy/wire.h"

namespace daisy::testlink {

struct LinkClientOptions {
  int timeout_ms = 5000;         // the upgrade, and each step of the handshake
  bool answer_pings = true;      // false: a tab that stopped answering (liveness tests)
  bool wrong_challenge = false;  // the handshake carries another challenge than serve's
  bool flip_box_byte = false;    // one byte of the handshake envelope's box is flipped
  std::string path = std::string(net::kLinkPath);
};

class LinkClient {
 public:
  // A TCP connection to host:port and the WebSocket upgrade (the answer's
  // Sec-WebSocket-Accept is checked). The link is not up before Handshake.
  static Result<std::unique_ptr<LinkClient>> Open(const std::string& host, int port, LinkClientOptions options = {});
  // The DCL1 handshake as the tab whose key pair is `keys`; `rendezvous_key` is the key
  // serve must show (GET /api/key gives its fingerprint). Unavailable when serve closed
  // the link instead (close_code() says why).
  Status Handshake(const net::KeyPair& keys, const std::string& rendezvous_key);
  // Open, then Handshake.
  static Result<std::unique_ptr<LinkClient>> Connect(const std::string& host, int port, const net::KeyPair& keys,
                                                     const std::string& rendezvous_key, LinkClientOptions options = {});
  ~LinkClient();  // drops the connection (Close says goodbye first)
  LinkClient(const LinkClient&) = delete;
  LinkClient& operator=(const LinkClient&) = delete;

  // One inner frame to serve (join, heartbeat, bye), in an envelope to the rendezvous key.
  Status Send(const wire::Message& message);
  // `message` boxed for the member whose key is `member_public` (as PeerBoxes does), sent
  // through serve's relay inside an envelope to the rendezvous key.
  Status SendEnvelope(const std::string& member_public, const wire::Message& message);
  // The next inner frame from serve (pings are answered meanwhile, unless told not to):
  // peers, errors, and envelopes from members (open them with OpenEnvelope). nullopt after
  // timeout_ms; Unavailable once serve has closed the link (close_code() says why).
  Result<std::optional<wire::Message>> Receive(int timeout_ms);
  // The frame inside a member's envelope (checks ids, counter and box, as PeerBoxes does).
  Result<wire::Message> OpenEnvelope(const std::string& member_public, const wire::Relay& envelope);
  // A close frame with `code` and `reason`, then the connection is dropped.
  void Close(uint16_t code = 1000, const std::string& reason = "");

  // For refusal tests: the bytes of the next envelope to serve around `frame` (uses a
  // counter), one message sent as it is, and the payload of the last binary message sent.
  Result<std::vector<uint8_t>> SealForServe(std::span<const uint8_t> frame);
  Status SendRaw(std::span<const uint8_t> payload, bool text = false);
  const std::vector<uint8_t>& last_sent() const { return last_sent_; }
  // The next binary message as it came (before the handshake: serve's challenge); nullopt
  // after timeout_ms; Unavailable once serve has closed the link.
  Result<std::optional<std::vector<uint8_t>>> ReceiveRaw(int timeout_ms);

  void set_answer_pings(bool on) { options_.answer_pings = on; }
  int pings_seen() const { return pings_seen_; }
  int close_code() const { return close_code_; }  // 0 until serve closed the link
  const std::string& close_reason() const { return close_reason_; }
  const std::string& id() const { return id_; }  // the tab's device id, after Handshake

 private:
  struct Frame {
    uint8_t opcode = 0;
    std::vector<uint8_t> payload;
  };
  explicit LinkClient(int fd, LinkClientOptions options) : fd_(fd), options_(std::move(options)) {}
  Status WriteFrame(uint8_t opcode, std::span<const uint8_t> payload);
  // The next data message (binary or text), answering pings; nullopt at the deadline.
  Result<std::optional<Frame>> ReadMessage(int timeout_ms);
  Status ReadMore(int timeout_ms);

  int fd_ = -1;
  LinkClientOptions options_;
  std::vector<uint8_t> in_;  // bytes read, not yet parsed
  std::vector<uint8_t> last_sent_;
  std::unique_ptr<net::PeerBoxes> boxes_;
  std::string rendezvous_key_;
  std::string id_;
  int pings_seen_ = 0;
  int close_code_ = 0;
  std::string close_reason_;
  bool closed_ = false;
};

}  // namespace daisy::testlink
