// Keys and end-to-end boxes without a transport: a device's CURVE key pair as text, its id
// and fingerprint, the audit key, and the boxes of frames that cross serve's relay. Needs
// libsodium's API alone (real libsodium natively; src/crypt's subset in the browser build),
// never ZeroMQ: both the ZeroMQ transport (daisy/net.h, which re-exports this header) and the
// browser tab (daisy/tab.h) use it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/status.h"
#include "daisy/wire.h"

namespace daisy::net {

// A long-term CURVE key pair, both halves Z85 text (40 characters each). The secret half
// never leaves the device.
struct KeyPair {
  std::string public_key;
  std::string secret_key;
};

// ZeroMQ's Z85 (32 bytes <-> 40 characters), as zmq_z85_encode/decode write and read it.
std::string Z85Encode(std::span<const uint8_t, 32> raw);
// False for anything but 40 characters of the Z85 alphabet whose groups fit in 32 bits.
bool Z85Decode(const std::string& z85, std::array<uint8_t, 32>& raw);
// A fresh X25519 (crypto_box) key pair: the same kind of keys CURVE uses.
KeyPair NewBoxKeyPair();
// The pair of a secret key kept elsewhere (a browser's storage): its public half derived.
// InvalidArgument for a secret that is not 40 characters of Z85.
Result<KeyPair> KeyPairFromSecret(const std::string& secret_z85);

// The key a stage and the head share for the audit's receipts (wire::ReceiptMac): BLAKE2b
// of the X25519 agreement of one side's secret CURVE key with the other's public key, so
// each side derives it alone and no other member can.
Result<std::array<uint8_t, 32>> AuditKey(const KeyPair& mine, const std::string& other_public);
// True for 40 characters of Z85 that decode to 32 bytes.
bool IsPublicKey(const std::string& z85);
// What people compare: the first 8 bytes of BLAKE2b-256 of the 32-byte public key, as 16
// hex digits in groups of four ("ab12-cd34-ef56-7890"). "" for a malformed key.
std::string Fingerprint(const std::string& public_key);
// The same 16 hex digits without dashes: the device id of that key.
std::string KeyId(const std::string& public_key);

// ---- the browser tab's link (docs/WIRE.md, "link"): what both ends speak ----

// serve's link server (daisy/net.h) and the tab's LinkClient (daisy/tab.h, built without
// ZeroMQ) read these from here, so the two ends cannot drift apart.
inline constexpr std::string_view kLinkMagic = "DCL1";
inline constexpr uint8_t kLinkVersion = 1;
inline constexpr size_t kLinkChallengeBytes = 32;
// The largest message a link takes (an envelope around a whole frame); larger: close 1009.
inline constexpr size_t kLinkMaxMessage = wire::kMaxFrameBytes + 64;
// The WebSocket close codes of a link (1000-1013: RFC 6455's own).
enum class LinkClose : uint16_t {
  kNormal = 1000,
  kGoingAway = 1001,        // serve is stopping
  kProtocolError = 1002,    // a frame RFC 6455 does not allow (unmasked, reserved bits, ...)
  kUnsupportedData = 1003,  // a text message: the link is binary
  kTooBig = 1009,           // a message over kLinkMaxMessage
  kTryLater = 1013,         // serve holds as many links as it takes
  kBadHandshake = 4001,     // wrong magic/version/length, a box that does not open, a wrong challenge
  kRefusedEnvelope = 4002,  // a later envelope refused: wrong ids, a replay, tampered
  kNotApproved = 4003,      // the key is not approved in any room (the page asks POST /api/join)
  kReplaced = 4004,         // a newer link of the same key took over
  kTooSlow = 4008,          // no pong, no handshake in time, or nothing could be sent for too long
};
// The number a close frame (and the page's close event) carries.
constexpr uint16_t LinkCloseCode(LinkClose code) {
  return static_cast<uint16_t>(code);
}

// ---- end-to-end boxes for frames that cross the relay ----

// serve's relay terminates the CurveZMQ link on each side, so a frame between two members
// that goes through it is boxed between the true sender and the true recipient: libsodium's
// crypto_box (X25519, XSalsa20-Poly1305) with the key of their two long-term CURVE keys
// (crypto_box_beforenm, kept per peer) and a nonce of the sender's id, the recipient's id
// and a counter (8 + 8 + 8 bytes): both sides derive it, no nonce repeats under a key. The
// counter starts at the sender's clock in microseconds (a restarted sender goes on above
// its last run) and grows by one per box; a recipient opens each counter from a sender at
// most once, and none more than kReplayWindow below the highest it opened from that sender
// (a replay, or one too old to tell). Thread-safe: a head seals from its turn's thread and
// its text's, with one counter.
inline constexpr uint64_t kReplayWindow = 4096;
class PeerBoxes {
 public:
  explicit PeerBoxes(KeyPair mine);
  ~PeerBoxes();
  PeerBoxes(const PeerBoxes&) = delete;
  PeerBoxes& operator=(const PeerBoxes&) = delete;
  // The envelope carrying `frame` to the member whose CURVE key is `to_public`.
  Result<wire::Relay> Seal(const std::string& to_public, std::span<const uint8_t> frame);
  // The frame inside an envelope from the member whose CURVE key is `from_public` (the key
  // the room lists for envelope.from). Refuses a box that does not open (another sender, a
  // changed byte, another recipient) and a counter already opened or too old (see above).
  Result<std::vector<uint8_t>> Open(const std::string& from_public, const wire::Relay& envelope);
  // The counter the next Seal uses (the link's handshake starts its own counters here).
  uint64_t next_counter() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace daisy::net
