// RFC 6455 for serve's link server: SHA-1 (FIPS 180-4) for the accept key (libsodium has no
// SHA-1 and no OpenSSL is linked; it is a few lines), base64 (libsodium's), the upgrade
// request, and frames.
#include "websocket.h"

#include <sodium.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "daisy/net.h"

namespace daisy::net::ws {

namespace {

uint32_t Rotl(uint32_t x, int n) {
  return (x << n) | (x >> (32 - n));
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// True when the comma-separated header value holds `token` (case-insensitive).
bool HasToken(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    const size_t comma = value.find(',');
    const std::string_view item = Trim(value.substr(0, comma));
    if (Lower(item) == token) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace

std::array<uint8_t, 20> Sha1(std::span<const uint8_t> data) {
  uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
  // The message, a 1 bit, zeros to 56 mod 64, and the length in bits (big-endian).
  std::vector<uint8_t> m(data.begin(), data.end());
  const uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  m.push_back(0x80);
  while (m.size() % 64 != 56) m.push_back(0);
  for (int i = 7; i >= 0; --i) m.push_back(static_cast<uint8_t>(bits >> (8 * i)));
  for (size_t block = 0; block < m.size(); block += 64) {
    uint32_t w[80];
    for (int t = 0; t < 16; ++t)
      w[t] = static_cast<uint32_t>(m[block + 4 * t]) << 24 | static_cast<uint32_t>(m[block + 4 * t + 1]) << 16 |
             static_cast<uint32_t>(m[block + 4 * t + 2]) << 8 | m[block + 4 * t + 3];
    for (int t = 16; t < 80; ++t) w[t] = Rotl(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int t = 0; t < 80; ++t) {
      uint32_t f = 0, k = 0;
      if (t < 20) {
        f = (b & c) | (~b & d);
        k = 0x5A827999;
      } else if (t < 40) {
        f = b ^ c ^ d;
        k = 0x6ED9EBA1;
      } else if (t < 60) {
        f = (b & c) | (b & d) | (c & d);
        k = 0x8F1BBCDC;
      } else {
        f = b ^ c ^ d;
        k = 0xCA62C1D6;
      }
      const uint32_t temp = Rotl(a, 5) + f + e + k + w[t];
      e = d;
      d = c;
      c = Rotl(b, 30);
      b = a;
      a = temp;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
  }
  std::array<uint8_t, 20> out{};
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(h[i] >> (24 - 8 * j));
  return out;
}

std::string Base64(std::span<const uint8_t> data) {
  std::string out(sodium_base64_ENCODED_LEN(data.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(out.data(), out.size(), data.data(), data.size(), sodium_base64_VARIANT_ORIGINAL);
  out.resize(out.size() - 1);  // the terminating NUL
  return out;
}

std::optional<std::vector<uint8_t>> Base64Decode(std::string_view text) {
  std::vector<uint8_t> out(text.size() / 4 * 3 + 3);
  size_t n = 0;
  const char* end = nullptr;
  if (sodium_base642bin(out.data(), out.size(), text.data(), text.size(), nullptr, &n, &end,
                        sodium_base64_VARIANT_ORIGINAL) != 0 ||
      end != text.data() + text.size())
    return std::nullopt;
  out.resize(n);
  if (Base64(out) != text) return std::nullopt;  // only the canonical form (padding bits zero)
  return out;
}

Parsed ParseUpgrade(std::string_view head) {
  Parsed p;
  const size_t line_end = head.find("\r\n");
  const std::string_view request_line = head.substr(0, line_end);
  const size_t sp1 = request_line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : request_line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) {
    p.refusal = {400, "the request line is not METHOD TARGET VERSION"};
    return p;
  }
  const std::string_view method = request_line.substr(0, sp1);
  const std::string_view target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = request_line.substr(sp2 + 1);
  std::string upgrade, connection, ws_version, key, protocols;
  std::string_view rest = line_end == std::string_view::npos ? "" : head.substr(line_end + 2);
  while (!rest.empty()) {
    const size_t end = rest.find("\r\n");
    const std::string_view line = rest.substr(0, end);
    rest = end == std::string_view::npos ? "" : rest.substr(end + 2);
    if (line.empty()) break;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      p.refusal = {400, "a header line without a colon"};
      return p;
    }
    const std::string name = Lower(Trim(line.substr(0, colon)));
    const std::string_view value = Trim(line.substr(colon + 1));
    // A header given twice counts as one comma-separated list (RFC 9110, 5.3).
    auto add = [&](std::string& to) {
      if (!to.empty()) to.push_back(',');
      to.append(value);
    };
    if (name == "upgrade") add(upgrade);
    if (name == "connection") add(connection);
    if (name == "sec-websocket-version") add(ws_version);
    if (name == "sec-websocket-key") add(key);
    if (name == "sec-websocket-protocol") add(protocols);
  }
  if (!HasToken(upgrade, "websocket")) {
    p.refusal = {426, "this address is the browser tab's WebSocket link: it takes only a WebSocket upgrade"};
    return p;
  }
  if (method != "GET" || version != "HTTP/1.1") {
    p.refusal = {400, "a WebSocket upgrade must be GET ... HTTP/1.1"};
    return p;
  }
  if (!HasToken(connection, "upgrade")) {
    p.refusal = {400, "a WebSocket upgrade without \"Connection: Upgrade\""};
    return p;
  }
  if (ws_version != "13") {
    p.refusal = {400, "only WebSocket version 13 is spoken here, not '" + ws_version.substr(0, 16) + "'"};
    return p;
  }
  const auto nonce = Base64Decode(key);
  if (!nonce || nonce->size() != 16) {
    p.refusal = {400, "Sec-WebSocket-Key is not 16 bytes in base64"};
    return p;
  }
  UpgradeRequest r;
  r.target = std::string(target);
  r.accept = WebSocketAccept(key);
  if (HasToken(protocols, "dcl1")) r.protocol = "dcl1";
  p.upgrade = std::move(r);
  return p;
}

std::string SwitchingProtocols(const UpgradeRequest& request) {
  std::string s =
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
      request.accept + "\r\n";
  if (!request.protocol.empty()) s += "Sec-WebSocket-Protocol: " + request.protocol + "\r\n";
  return s + "\r\n";
}

std::string RefusalResponse(const HttpRefusal& refusal) {
  const std::string body = refusal.reason + "\n";
  const char* status = refusal.status == 426   ? "426 Upgrade Required"
                       : refusal.status == 404 ? "404 Not Found"
                                               : "400 Bad Request";
  return std::string("HTTP/1.1 ") + status +
         "\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nConnection: close\r\n"
         "Content-Type: text/plain; charset=utf-8\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::vector<uint8_t> ServerFrame(Opcode opcode, std::span<const uint8_t> payload) {
  std::vector<uint8_t> f;
  f.reserve(payload.size() + 10);
  f.push_back(static_cast<uint8_t>(0x80 | static_cast<uint8_t>(opcode)));
  const uint64_t n = payload.size();
  if (n < 126) {
    f.push_back(static_cast<uint8_t>(n));
  } else if (n <= 0xFFFF) {
    f.push_back(126);
    f.push_back(static_cast<uint8_t>(n >> 8));
    f.push_back(static_cast<uint8_t>(n));
  } else {
    f.push_back(127);
    for (int i = 7; i >= 0; --i) f.push_back(static_cast<uint8_t>(n >> (8 * i)));
  }
  f.insert(f.end(), payload.begin(), payload.end());
  return f;
}

std::vector<uint8_t> ClosePayload(uint16_t code, std::string_view reason) {
  if (reason.size() > 123) {
    // Cut on a character boundary (a reason is UTF-8): not before a continuation byte.
    size_t n = 123;
    while (n > 0 && (static_cast<uint8_t>(reason[n]) & 0xC0) == 0x80) --n;
    reason = reason.substr(0, n);
  }
  std::vector<uint8_t> p(2 + reason.size());
  p[0] = static_cast<uint8_t>(code >> 8);
  p[1] = static_cast<uint8_t>(code);
  std::memcpy(p.data() + 2, reason.data(), reason.size());
  return p;
}

std::optional<Event> FrameReader::Error(uint16_t code, std::string why) {
  failed_ = true;
  Event e;
  e.kind = Event::Kind::kError;
  e.code = code;
  e.reason = std::move(why);
  return e;
}

void FrameReader::Feed(std::span<const uint8_t> bytes) {
  if (failed_) return;
  if (at_ > 0 && at_ * 2 >= buffer_.size()) {
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(at_));
    at_ = 0;
  }
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
}

std::optional<Event> FrameReader::Next() {
  while (!failed_) {
    const uint8_t* p = buffer_.data() + at_;
    const size_t avail = buffer_.size() - at_;
    if (avail < 2) return std::nullopt;
    const bool fin = p[0] & 0x80;
    const auto op = static_cast<Opcode>(p[0] & 0x0F);
    const bool masked = p[1] & 0x80;
    if (p[0] & 0x70) return Error(1002, "a frame with reserved bits set (no extension was agreed)");
    if (op != Opcode::kContinuation && op != Opcode::kText && op != Opcode::kBinary && op != Opcode::kClose &&
        op != Opcode::kPing && op != Opcode::kPong)
      return Error(1002, "a frame with the unknown opcode " + std::to_string(p[0] & 0x0F));
    if (masked != expect_masked_)
      return Error(1002, expect_masked_ ? "a client frame that is not masked" : "a masked server frame");
    size_t header = 2;
    uint64_t len = p[1] & 0x7F;
    if (len == 126) {
      if (avail < 4) return std::nullopt;
      len = static_cast<uint64_t>(p[2]) << 8 | p[3];
      header = 4;
    } else if (len == 127) {
      if (avail < 10) return std::nullopt;
      if (p[2] & 0x80) return Error(1002, "a frame length with its top bit set");
      len = 0;
      for (int i = 0; i < 8; ++i) len = len << 8 | p[2 + i];
      header = 10;
    }
    const bool control = static_cast<uint8_t>(op) >= 8;
    if (control && (!fin || len > 125)) return Error(1002, "a control frame fragmented or over 125 bytes");
    if (op == Opcode::kContinuation && !in_message_)
      return Error(1002, "a continuation frame outside a fragmented message");
    if ((op == Opcode::kText || op == Opcode::kBinary) && in_message_)
      return Error(1002, "a new message inside a fragmented one");
    if (!control && len > max_message_ - (in_message_ ? message_.size() : 0))
      return Error(1009, "a message over " + std::to_string(max_message_) + " bytes");
    const size_t mask_at = header;
    if (masked) header += 4;
    if (avail < header || avail - header < len) return std::nullopt;
    std::vector<uint8_t> payload(p + header, p + header + len);
    if (masked)
      for (size_t i = 0; i < payload.size(); ++i) payload[i] ^= p[mask_at + i % 4];
    at_ += header + len;
    if (control) {
      Event e;
      e.payload = std::move(payload);
      if (op == Opcode::kPing) {
        e.kind = Event::Kind::kPing;
      } else if (op == Opcode::kPong) {
        e.kind = Event::Kind::kPong;
      } else {
        e.kind = Event::Kind::kClose;
        if (e.payload.size() == 1) return Error(1002, "a close frame with a 1-byte payload");
        e.code = e.payload.empty() ? 1005 : static_cast<uint16_t>(e.payload[0] << 8 | e.payload[1]);
        if (e.payload.size() > 2) e.reason.assign(e.payload.begin() + 2, e.payload.end());
      }
      return e;
    }
    if (op != Opcode::kContinuation) {
      message_opcode_ = op;
      message_.clear();
    }
    message_.insert(message_.end(), payload.begin(), payload.end());
    in_message_ = !fin;
    if (fin) {
      Event e;
      e.kind = message_opcode_ == Opcode::kText ? Event::Kind::kText : Event::Kind::kBinary;
      e.payload = std::move(message_);
      message_.clear();
      return e;
    }
  }
  return std::nullopt;
}

}  // namespace daisy::net::ws

namespace daisy::net {

std::string WebSocketAccept(std::string_view key) {
  // RFC 6455, 1.3: the key and this GUID.
  const std::string joined = std::string(key) + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  return ws::Base64(ws::Sha1(std::span(reinterpret_cast<const uint8_t*>(joined.data()), joined.size())));
}

}  // namespace daisy::net
