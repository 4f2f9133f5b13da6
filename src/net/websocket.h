// The server side of RFC 6455 (WebSocket), as serve's link for browser tabs needs it: the
// upgrade request, SHA-1 and base64 for its accept key, and frames. Pure functions on
// bytes, no sockets, so each piece is tested alone. Internal to net.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace daisy::net::ws {

// FIPS 180-4 SHA-1 (only for Sec-WebSocket-Accept, where the RFC fixes it: no security rests on it).
std::array<uint8_t, 20> Sha1(std::span<const uint8_t> data);
// RFC 4648 base64 with padding (libsodium's).
std::string Base64(std::span<const uint8_t> data);
// nullopt for anything that is not canonical padded base64.
std::optional<std::vector<uint8_t>> Base64Decode(std::string_view text);

// What an HTTP request head (up to and including the blank line) asks for.
struct UpgradeRequest {
  std::string target;    // the request target, "/api/link" or "/api/link?..."
  std::string accept;    // Sec-WebSocket-Accept for the answer
  std::string protocol;  // the subprotocol to echo ("dcl1" when offered), "" for none
};
// The answer to a request head that is not a valid WebSocket upgrade: an HTTP status with a
// sentence saying what was wrong.
struct HttpRefusal {
  int status = 400;
  std::string reason;  // plain English, for the response body
};
// Parses `head` ("GET /api/link HTTP/1.1\r\n...\r\n\r\n"). A request without "Upgrade:
// websocket" is 426 (Upgrade Required); a malformed upgrade (version not 13, a key that is
// not 16 bytes of base64, no "Connection: upgrade", not GET, not HTTP/1.1) is 400.
struct Parsed {
  std::optional<UpgradeRequest> upgrade;
  HttpRefusal refusal;
};
Parsed ParseUpgrade(std::string_view head);
// The 101 answer to an upgrade, and a complete HTTP answer for a refusal (Connection: close).
std::string SwitchingProtocols(const UpgradeRequest& request);
std::string RefusalResponse(const HttpRefusal& refusal);

enum class Opcode : uint8_t { kContinuation = 0, kText = 1, kBinary = 2, kClose = 8, kPing = 9, kPong = 10 };

// One unmasked frame (what a server sends), FIN set.
std::vector<uint8_t> ServerFrame(Opcode opcode, std::span<const uint8_t> payload);
// A close frame's payload: the code (big-endian) and the reason, cut to fit 125 bytes.
std::vector<uint8_t> ClosePayload(uint16_t code, std::string_view reason);

// What a stream of client frames says, one event at a time.
struct Event {
  enum class Kind { kBinary, kText, kPing, kPong, kClose, kError };
  Kind kind = Kind::kBinary;
  std::vector<uint8_t> payload;  // the whole message (fragments joined), or a control payload
  uint16_t code = 0;             // kClose: the peer's code (1005 when it gave none); kError: ours to close with
  std::string reason;            // kClose: the peer's reason; kError: what was wrong
};

// Reads client frames from a byte stream: fed what the socket gave, it hands out whole
// messages and control frames. It enforces what RFC 6455 asks of a server: every client
// frame masked, no reserved bits (no extension was agreed), control frames whole and at
// most 125 bytes, continuation only inside a fragmented message; and a message (all its
// fragments) of at most `max_message` bytes, refused from its header before it is read.
// After an error it reads nothing more. Not thread-safe.
class FrameReader {
 public:
  explicit FrameReader(size_t max_message, bool expect_masked = true)
      : max_message_(max_message), expect_masked_(expect_masked) {}
  void Feed(std::span<const uint8_t> bytes);
  // A new limit for the messages that follow (a link takes only a small handshake first).
  void set_max_message(size_t max_message) { max_message_ = max_message; }
  std::optional<Event> Next();

 private:
  std::optional<Event> Error(uint16_t code, std::string why);
  size_t max_message_;
  bool expect_masked_;
  std::vector<uint8_t> buffer_;  // bytes not yet parsed
  size_t at_ = 0;                // parsed up to here
  bool in_message_ = false;      // a fragmented message is open
  Opcode message_opcode_ = Opcode::kBinary;
  std::vector<uint8_t> message_;
  bool failed_ = false;
};

}  // namespace daisy::net::ws
