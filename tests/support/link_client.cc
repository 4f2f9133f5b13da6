// LinkClient: the tab's side of the link, natively, for tests (see link_client.h).
#include "link_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>

namespace daisy::testlink {

namespace {

using Clock = std::chrono::steady_clock;

int MsLeft(Clock::time_point deadline) {
  return static_cast<int>(
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Result<std::unique_ptr<LinkClient>> LinkClient::Open(const std::string& host, int port, LinkClientOptions options) {
  if (sodium_init() < 0) return Internal("libsodium failed to start");
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable("cannot make a socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    ::close(fd);
    return InvalidArgument("link client: '" + host + "' is not an IPv4 address");
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return Unavailable("link client: cannot connect to " + host + ":" + std::to_string(port));
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
  std::unique_ptr<LinkClient> c(new LinkClient(fd, std::move(options)));

  uint8_t nonce[16];
  randombytes_buf(nonce, sizeof nonce);
  char key[sodium_base64_ENCODED_LEN(16, sodium_base64_VARIANT_ORIGINAL)];
  sodium_bin2base64(key, sizeof key, nonce, sizeof nonce, sodium_base64_VARIANT_ORIGINAL);
  const std::string hp = host + ":" + std::to_string(port);
  const std::string request = "GET " + c->options_.path + " HTTP/1.1\r\nHost: " + hp +
                              "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " + key +
                              "\r\nSec-WebSocket-Version: 13\r\nOrigin: http://" + hp + "\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size()))
    return Unavailable("link client: cannot send the upgrade request");
  const auto deadline = Clock::now() + std::chrono::milliseconds(c->options_.timeout_ms);
  std::string head;
  size_t end = std::string::npos;
  while ((end = std::string(c->in_.begin(), c->in_.end()).find("\r\n\r\n")) == std::string::npos) {
    if (MsLeft(deadline) == 0) return Unavailable("link client: no answer to the upgrade");
    DAISY_RETURN_IF_ERROR(c->ReadMore(MsLeft(deadline)));
  }
  head.assign(c->in_.begin(), c->in_.begin() + static_cast<std::ptrdiff_t>(end));
  c->in_.erase(c->in_.begin(), c->in_.begin() + static_cast<std::ptrdiff_t>(end + 4));
  if (head.rfind("HTTP/1.1 101", 0) != 0)
    return Unavailable("link client: the upgrade was answered '" + head.substr(0, head.find("\r\n")) + "'");
  const std::string lower = Lower(head);
  const size_t at = lower.find("\r\nsec-websocket-accept:");
  if (at == std::string::npos) return Unavailable("link client: the 101 answer has no Sec-WebSocket-Accept");
  size_t v = at + std::strlen("\r\nsec-websocket-accept:");
  while (v < head.size() && head[v] == ' ') ++v;
  const std::string accept = head.substr(v, head.find("\r\n", v) - v);
  if (accept != net::WebSocketAccept(key))
    return Unavailable("link client: Sec-WebSocket-Accept '" + accept + "' is not the one for the key sent");
  return c;
}

Result<std::unique_ptr<LinkClient>> LinkClient::Connect(const std::string& host, int port, const net::KeyPair& keys,
                                                        const std::string& rendezvous_key, LinkClientOptions options) {
  DAISY_ASSIGN_OR_RETURN(auto c, Open(host, port, std::move(options)));
  DAISY_RETURN_IF_ERROR(c->Handshake(keys, rendezvous_key));
  return c;
}

LinkClient::~LinkClient() {
  if (fd_ >= 0) ::close(fd_);
}

Status LinkClient::ReadMore(int timeout_ms) {
  if (closed_) return Unavailable("the link is closed");
  pollfd pfd{fd_, POLLIN, 0};
  if (::poll(&pfd, 1, timeout_ms) <= 0) return Status::Ok();
  uint8_t buf[65536];
  const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
  if (n == 0) {
    closed_ = true;
    return Unavailable("serve closed the connection" +
                       (close_code_ ? " after close " + std::to_string(close_code_) + " (" + close_reason_ + ")"
                                    : std::string(" without a close frame")));
  }
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return Status::Ok();
    closed_ = true;
    return Unavailable(std::string("the connection broke: ") + std::strerror(errno));
  }
  in_.insert(in_.end(), buf, buf + n);
  return Status::Ok();
}

Status LinkClient::WriteFrame(uint8_t opcode, std::span<const uint8_t> payload) {
  if (closed_) return Unavailable("the link is closed");
  std::vector<uint8_t> f = {static_cast<uint8_t>(0x80 | opcode)};
  const uint64_t n = payload.size();
  if (n < 126) {
    f.push_back(static_cast<uint8_t>(0x80 | n));
  } else if (n < 65536) {
    f.insert(f.end(), {0xFE, static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)});
  } else {
    f.push_back(0xFF);
    for (int i = 7; i >= 0; --i) f.push_back(static_cast<uint8_t>(n >> (8 * i)));
  }
  uint8_t mask[4];
  randombytes_buf(mask, sizeof mask);
  f.insert(f.end(), mask, mask + 4);
  const size_t at = f.size();
  f.insert(f.end(), payload.begin(), payload.end());
  for (size_t i = 0; i < n; ++i) f[at + i] ^= mask[i % 4];
  size_t sent = 0;
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  while (sent < f.size()) {
    const ssize_t w = ::send(fd_, f.data() + sent, f.size() - sent, MSG_NOSIGNAL);
    if (w > 0) {
      sent += static_cast<size_t>(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EINTR) && MsLeft(deadline) > 0) {
      pollfd pfd{fd_, POLLOUT, 0};
      ::poll(&pfd, 1, 50);
    } else {
      return Unavailable("link client: cannot send a frame");
    }
  }
  return Status::Ok();
}

Result<std::optional<LinkClient::Frame>> LinkClient::ReadMessage(int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    // One whole frame in in_? Server frames are unmasked and, from serve, never fragmented.
    if (in_.size() >= 2) {
      const uint8_t b0 = in_[0], b1 = in_[1];
      if (b1 & 0x80) return DataLoss("link client: serve sent a masked frame");
      if (!(b0 & 0x80)) return DataLoss("link client: serve sent a fragment (this client reads whole frames only)");
      size_t header = 2;
      uint64_t len = b1 & 0x7F;
      bool whole = true;
      if (len == 126) {
        whole = in_.size() >= 4;
        if (whole) len = static_cast<uint64_t>(in_[2]) << 8 | in_[3];
        header = 4;
      } else if (len == 127) {
        whole = in_.size() >= 10;
        if (whole) {
          len = 0;
          for (int i = 0; i < 8; ++i) len = len << 8 | in_[2 + i];
        }
        header = 10;
      }
      if (whole && in_.size() >= header + len) {
        Frame f{static_cast<uint8_t>(b0 & 0x0F),
                std::vector<uint8_t>(in_.begin() + static_cast<std::ptrdiff_t>(header),
                                     in_.begin() + static_cast<std::ptrdiff_t>(header + len))};
        in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(header + len));
        if (f.opcode == 0x9) {  // ping
          ++pings_seen_;
          if (options_.answer_pings) DAISY_RETURN_IF_ERROR(WriteFrame(0xA, f.payload));
          continue;
        }
        if (f.opcode == 0xA) continue;  // pong
        if (f.opcode == 0x8) {          // close: note why, answer, drop the connection
          close_code_ = f.payload.size() >= 2 ? (f.payload[0] << 8 | f.payload[1]) : 1005;
          close_reason_ = f.payload.size() > 2 ? std::string(f.payload.begin() + 2, f.payload.end()) : "";
          (void)WriteFrame(0x8, std::span(f.payload).first(std::min<size_t>(2, f.payload.size())));
          ::shutdown(fd_, SHUT_WR);  // serve waits for the close to be done, not for this object to go
          closed_ = true;
          return Unavailable("serve closed the link: " + std::to_string(close_code_) + " (" + close_reason_ + ")");
        }
        return std::optional<Frame>(std::move(f));
      }
    }
    const int left = MsLeft(deadline);
    if (left == 0) return std::optional<Frame>();
    DAISY_RETURN_IF_ERROR(ReadMore(std::min(left, 200)));
  }
}

Status LinkClient::Handshake(const net::KeyPair& keys, const std::string& rendezvous_key) {
  DAISY_ASSIGN_OR_RETURN(auto hello, ReadMessage(options_.timeout_ms));
  if (!hello) return Unavailable("link client: serve sent no challenge");
  constexpr size_t kHelloBytes = 4 + 1 + wire::kPublicKeyChars + net::kLinkChallengeBytes;
  const auto& h = hello->payload;
  if (hello->opcode != 0x2 || h.size() != kHelloBytes || std::memcmp(h.data(), net::kLinkMagic.data(), 4) != 0 ||
      h[4] != net::kLinkVersion)
    return DataLoss("link client: serve's first message is not DCL1, version 1, a key and a challenge");
  const std::string shown(reinterpret_cast<const char*>(h.data()) + 5, wire::kPublicKeyChars);
  if (shown != rendezvous_key)
    return PermissionDenied("link client: serve shows the key " + net::Fingerprint(shown) + ", not " +
                            net::Fingerprint(rendezvous_key));
  rendezvous_key_ = rendezvous_key;
  boxes_ = std::make_unique<net::PeerBoxes>(keys);
  id_ = net::KeyId(keys.public_key);
  std::vector<uint8_t> inner(h.end() - static_cast<std::ptrdiff_t>(net::kLinkChallengeBytes), h.end());
  std::vector<uint8_t> mine(net::kLinkChallengeBytes);
  randombytes_buf(mine.data(), mine.size());
  if (options_.wrong_challenge) inner[0] ^= 0x01;
  inner.insert(inner.end(), mine.begin(), mine.end());
  DAISY_ASSIGN_OR_RETURN(wire::Relay env, boxes_->Seal(rendezvous_key, inner));
  if (options_.flip_box_byte) env.box[env.box.size() / 2] ^= 0x01;
  std::vector<uint8_t> answer(net::kLinkMagic.begin(), net::kLinkMagic.end());
  answer.push_back(net::kLinkVersion);
  answer.insert(answer.end(), keys.public_key.begin(), keys.public_key.end());
  const auto encoded = wire::Encode(wire::Message(env));
  answer.insert(answer.end(), encoded.begin(), encoded.end());
  DAISY_RETURN_IF_ERROR(SendRaw(answer));
  DAISY_ASSIGN_OR_RETURN(auto reply, ReadMessage(options_.timeout_ms));
  if (!reply) return Unavailable("link client: serve did not answer the handshake");
  auto m = wire::Decode(reply->payload);
  const auto* back = m.ok() ? std::get_if<wire::Relay>(&*m) : nullptr;
  if (!back) return DataLoss("link client: serve's answer to the handshake is not an envelope");
  DAISY_ASSIGN_OR_RETURN(auto echoed, boxes_->Open(rendezvous_key, *back));
  if (echoed != mine) return PermissionDenied("link client: serve's answer does not carry this tab's challenge");
  return Status::Ok();
}

Result<std::vector<uint8_t>> LinkClient::SealForServe(std::span<const uint8_t> frame) {
  if (!boxes_) return FailedPrecondition("link client: no handshake yet");
  DAISY_ASSIGN_OR_RETURN(wire::Relay env, boxes_->Seal(rendezvous_key_, frame));
  return wire::Encode(wire::Message(env));
}

Status LinkClient::SendRaw(std::span<const uint8_t> payload, bool text) {
  if (!text) last_sent_.assign(payload.begin(), payload.end());
  return WriteFrame(text ? 0x1 : 0x2, payload);
}

Status LinkClient::Send(const wire::Message& message) {
  DAISY_ASSIGN_OR_RETURN(auto bytes, SealForServe(wire::Encode(message)));
  return SendRaw(bytes);
}

Status LinkClient::SendEnvelope(const std::string& member_public, const wire::Message& message) {
  if (!boxes_) return FailedPrecondition("link client: no handshake yet");
  DAISY_ASSIGN_OR_RETURN(wire::Relay env, boxes_->Seal(member_public, wire::Encode(message)));
  return Send(wire::Message(env));
}

Result<std::optional<wire::Message>> LinkClient::Receive(int timeout_ms) {
  if (!boxes_) return FailedPrecondition("link client: no handshake yet");
  DAISY_ASSIGN_OR_RETURN(auto f, ReadMessage(timeout_ms));
  if (!f) return std::optional<wire::Message>();
  if (f->opcode != 0x2) return DataLoss("link client: serve sent a text message");
  DAISY_ASSIGN_OR_RETURN(wire::Message outer, wire::Decode(f->payload));
  const auto* env = std::get_if<wire::Relay>(&outer);
  if (!env) return DataLoss("link client: serve sent a message that is not an envelope");
  DAISY_ASSIGN_OR_RETURN(auto inner, boxes_->Open(rendezvous_key_, *env));
  DAISY_ASSIGN_OR_RETURN(wire::Message m, wire::Decode(inner));
  return std::optional<wire::Message>(std::move(m));
}

Result<std::optional<std::vector<uint8_t>>> LinkClient::ReceiveRaw(int timeout_ms) {
  DAISY_ASSIGN_OR_RETURN(auto f, ReadMessage(timeout_ms));
  if (!f) return std::optional<std::vector<uint8_t>>();
  return std::optional<std::vector<uint8_t>>(std::move(f->payload));
}

Result<wire::Message> LinkClient::OpenEnvelope(const std::string& member_public, const wire::Relay& envelope) {
  if (!boxes_) return FailedPrecondition("link client: no handshake yet");
  DAISY_ASSIGN_OR_RETURN(auto inner, boxes_->Open(member_public, envelope));
  return wire::Decode(inner);
}

void LinkClient::Close(uint16_t code, const std::string& reason) {
  if (fd_ < 0) return;
  std::vector<uint8_t> p = {static_cast<uint8_t>(code >> 8), static_cast<uint8_t>(code)};
  p.insert(p.end(), reason.begin(), reason.end());
  (void)WriteFrame(0x8, p);
  ::shutdown(fd_, SHUT_WR);
  // serve answers with its close; wait for it briefly so the close is clean.
  (void)ReadMessage(1000);
  ::close(fd_);
  fd_ = -1;
  closed_ = true;
}

}  // namespace daisy::testlink
