// LinkServer: one thread per browser tab's WebSocket. The thread reads the upgrade, runs
// the DCL1 handshake, then opens the tab's envelopes and seals what goes down, pings, and
// closes the link with a code that says why (docs/WIRE.md, "link").
#include "link.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "daisy/log.h"
#include "websocket.h"

namespace daisy::net {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kPollMs = 200;                   // how often a blocked thread looks at the stop flag
constexpr size_t kMaxRequestHead = 8192;       // an upgrade request is a few hundred bytes
constexpr size_t kMaxQueuedBytes = 64u << 20;  // frames for a tab it has not taken yet
constexpr int kSpareThreads = 8;               // connections over max_links told 1013, not just dropped
constexpr double kCloseGraceS = 1.0;           // after our close frame, how long the tab may take to close
// Before its handshake a link is anyone's: it may send no more than the handshake needs
// (about 170 bytes), so unproven connections cannot make serve hold large messages.
constexpr size_t kMaxHandshakeMessage = 1024;

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string Secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", s);
  return b;
}

// Frames for one link from other threads, and a pipe that wakes the link's thread.
struct Inbox {
  std::mutex mu;
  std::deque<std::vector<uint8_t>> frames;
  size_t bytes = 0;
  bool closed = false;
  std::atomic<bool> replaced{false};  // a newer link of the same key is up
  int wake[2] = {-1, -1};

  ~Inbox() {
    for (int fd : wake)
      if (fd >= 0) ::close(fd);
  }
  void Wake() {
    const char b = 1;
    (void)!::write(wake[1], &b, 1);  // a full pipe already says "work"
  }
  bool Push(std::vector<uint8_t> frame) {
    {
      std::lock_guard<std::mutex> lock(mu);
      // One frame always fits an empty queue: a large activation is not refused for its size alone.
      if (closed || (!frames.empty() && bytes + frame.size() > kMaxQueuedBytes)) return false;
      bytes += frame.size();
      frames.push_back(std::move(frame));
    }
    Wake();
    return true;
  }
  std::deque<std::vector<uint8_t>> Take() {
    char buf[256];
    while (::read(wake[0], buf, sizeof buf) > 0) {
    }
    std::lock_guard<std::mutex> lock(mu);
    bytes = 0;
    return std::exchange(frames, {});
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
    frames.clear();
  }
};

}  // namespace

struct LinkServer::Impl {
  KeyPair keys;
  std::string my_id;
  Hooks hooks;
  Options options;
  int listen_fd = -1;
  int port = 0;
  std::atomic<bool> stop{false};
  std::thread accept_thread;
  mutable std::mutex mu;
  std::condition_variable idle;
  int threads = 0;   // connection threads running
  int admitted = 0;  // links past the upgrade
  struct Current {
    uint64_t id = 0;
    std::shared_ptr<Inbox> inbox;
  };
  std::map<std::string, Current> by_key;  // the link that is up for each key
  uint64_t next_id = 1;
  // Refusals, logged at most once a second (a page that waits for approval retries).
  int refusals_unlogged = 0;
  Clock::time_point last_log{};

  ~Impl() {
    if (listen_fd >= 0) ::close(listen_fd);
  }

  void NoteRefusal(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    ++refusals_unlogged;
    if (Clock::now() - last_log < std::chrono::seconds(1)) return;
    last_log = Clock::now();
    LogInfo("link: refused " + std::to_string(refusals_unlogged) + " link(s) (latest: " + why + ")");
    refusals_unlogged = 0;
  }

  void Serve(int fd);
  void AcceptLoop();
};

namespace {

// One tab's link, on its own thread.
class Link {
 public:
  Link(LinkServer::Impl& server, int fd, uint64_t id)
      : s_(server), fd_(fd), id_(id), reader_(kMaxHandshakeMessage), boxes_(server.keys) {}

  // Runs the link from the 101 answer until it ends. `early`: bytes read past the request head.
  void Run(std::span<const uint8_t> early);

 private:
  void Queue(ws::Opcode op, std::span<const uint8_t> payload) {
    if (out_.empty()) last_progress_ = Clock::now();
    out_.push_back(ws::ServerFrame(op, payload));
  }
  // Sends what the socket takes now; false when the connection broke.
  bool Flush();
  // Sends a close frame (after the frame being sent, if any), waits a moment for the tab's
  // close, and ends the link. `reason` goes to the tab (at most 123 bytes), `detail` only to
  // the log.
  void CloseWith(LinkClose code, const std::string& reason, const std::string& detail = "");
  void Handshake(const std::vector<uint8_t>& m);
  void Envelope(const std::vector<uint8_t>& m);
  void SealDown(std::deque<std::vector<uint8_t>> frames);
  bool Ended() const { return !why_.empty(); }

  LinkServer::Impl& s_;
  int fd_;
  uint64_t id_;
  ws::FrameReader reader_;
  PeerBoxes boxes_;
  std::array<uint8_t, kLinkChallengeBytes> challenge_{};
  std::string tab_key_;  // once the handshake is done
  std::shared_ptr<Inbox> inbox_;
  std::deque<std::vector<uint8_t>> out_;
  size_t out_at_ = 0;  // bytes of out_.front() already sent
  Clock::time_point last_progress_;
  std::string why_;  // why the link ended ("" while it runs)
};

bool Link::Flush() {
  while (!out_.empty()) {
    const auto& f = out_.front();
    const ssize_t n = ::send(fd_, f.data() + out_at_, f.size() - out_at_, MSG_NOSIGNAL);
    if (n > 0) {
      last_progress_ = Clock::now();
      out_at_ += static_cast<size_t>(n);
      if (out_at_ == f.size()) {
        out_.pop_front();
        out_at_ = 0;
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    return false;
  }
  return true;
}

void Link::CloseWith(LinkClose code, const std::string& reason, const std::string& detail) {
  why_ = "closed it with " + std::to_string(LinkCloseCode(code)) + " (" + reason +
         (detail.empty() ? "" : ": " + detail) + ")";
  // A frame half sent must be finished; nothing after it matters any more.
  if (out_at_ > 0)
    out_.resize(1);
  else
    out_.clear();
  Queue(ws::Opcode::kClose, ws::ClosePayload(LinkCloseCode(code), reason));
  const auto end = Clock::now() + Seconds(kCloseGraceS);
  while (!out_.empty() && Clock::now() < end) {
    if (!Flush()) return;
    pollfd pfd{fd_, POLLOUT, 0};
    if (!out_.empty()) ::poll(&pfd, 1, 50);
  }
  ::shutdown(fd_, SHUT_WR);
  // The tab answers with its own close and closes; anything else it sends is dropped.
  char buf[4096];
  while (Clock::now() < end) {
    pollfd pfd{fd_, POLLIN, 0};
    if (::poll(&pfd, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
  }
}

void Link::Handshake(const std::vector<uint8_t>& m) {
  constexpr size_t kHead = 4 + 1 + wire::kPublicKeyChars;
  if (m.size() < kHead || std::memcmp(m.data(), kLinkMagic.data(), 4) != 0 || m[4] != kLinkVersion)
    return CloseWith(LinkClose::kBadHandshake, "the answer to the challenge does not start with DCL1, version 1");
  const std::string key(reinterpret_cast<const char*>(m.data()) + 5, wire::kPublicKeyChars);
  if (!IsPublicKey(key)) return CloseWith(LinkClose::kBadHandshake, "the tab's key is not 40 characters of Z85");
  auto decoded = wire::Decode(std::span(m).subspan(kHead));
  const auto* env = decoded.ok() ? std::get_if<wire::Relay>(&*decoded) : nullptr;
  if (!env) return CloseWith(LinkClose::kBadHandshake, "the answer to the challenge holds no relay envelope");
  auto inner = boxes_.Open(key, *env);
  if (!inner.ok())
    return CloseWith(LinkClose::kBadHandshake, "the answer to the challenge does not open", inner.status().message());
  if (inner->size() != 2 * kLinkChallengeBytes ||
      std::memcmp(inner->data(), challenge_.data(), kLinkChallengeBytes) != 0)
    return CloseWith(LinkClose::kBadHandshake, "the answer does not carry the challenge serve sent");
  // Only now, to the key's proven holder, does serve say whether it is approved.
  if (!s_.hooks.approved(key))
    return CloseWith(LinkClose::kNotApproved, "the key " + Fingerprint(key) +
                                                  " is not approved in any room: ask to join (POST /api/join) "
                                                  "and wait for the host to approve it");
  auto reply = boxes_.Seal(key, std::span(*inner).subspan(kLinkChallengeBytes));
  if (!reply.ok()) return CloseWith(LinkClose::kBadHandshake, reply.status().message());
  Queue(ws::Opcode::kBinary, wire::Encode(wire::Message(*reply)));
  tab_key_ = key;
  reader_.set_max_message(kLinkMaxMessage);
  std::shared_ptr<Inbox> older;
  {
    std::lock_guard<std::mutex> lock(s_.mu);
    auto& current = s_.by_key[key];
    older = current.inbox;
    current = {id_, inbox_};
  }
  if (older) {
    older->replaced.store(true);
    older->Wake();
  }
  LogInfo("link: tab " + Fingerprint(key) + " is linked");
  std::shared_ptr<Inbox> inbox = inbox_;
  s_.hooks.up(key, id_, [inbox](std::vector<uint8_t> frame) { return inbox->Push(std::move(frame)); });
}

void Link::Envelope(const std::vector<uint8_t>& m) {
  auto decoded = wire::Decode(m);
  const auto* env = decoded.ok() ? std::get_if<wire::Relay>(&*decoded) : nullptr;
  if (!env) return CloseWith(LinkClose::kRefusedEnvelope, "a message that is not a relay envelope");
  if (env->from != KeyId(tab_key_) || env->to != s_.my_id)
    return CloseWith(LinkClose::kRefusedEnvelope, "an envelope not from this tab's key to serve's");
  auto inner = boxes_.Open(tab_key_, *env);
  // PeerBoxes says which it was: a counter already opened, one too old, or a box that does
  // not open (changed on the way, or sealed with another key).
  if (!inner.ok()) return CloseWith(LinkClose::kRefusedEnvelope, inner.status().message());
  s_.hooks.frame(tab_key_, std::move(*inner));
}

void Link::SealDown(std::deque<std::vector<uint8_t>> frames) {
  for (auto& f : frames) {
    auto env = boxes_.Seal(tab_key_, f);
    if (!env.ok()) return CloseWith(LinkClose::kGoingAway, "Bug: cannot seal for the tab: " + env.status().message());
    Queue(ws::Opcode::kBinary, wire::Encode(wire::Message(*env)));
  }
}

void Link::Run(std::span<const uint8_t> early) {
  inbox_ = std::make_shared<Inbox>();
  if (::pipe2(inbox_->wake, O_NONBLOCK | O_CLOEXEC) != 0)
    return CloseWith(LinkClose::kTryLater, "serve cannot make a pipe for the link");
  randombytes_buf(challenge_.data(), challenge_.size());
  std::vector<uint8_t> hello(kLinkMagic.begin(), kLinkMagic.end());
  hello.push_back(kLinkVersion);
  hello.insert(hello.end(), s_.keys.public_key.begin(), s_.keys.public_key.end());
  hello.insert(hello.end(), challenge_.begin(), challenge_.end());
  Queue(ws::Opcode::kBinary, hello);
  reader_.Feed(early);

  const auto start = Clock::now();
  auto last_pong = start, next_ping = start + Seconds(s_.options.ping_s);
  const auto handshake_by = start + Seconds(s_.options.handshake_s);
  uint64_t pings = 0;
  std::vector<uint8_t> buf(64 * 1024);
  while (!Ended()) {
    // Events first: bytes read earlier may hold whole messages.
    while (!Ended()) {
      auto ev = reader_.Next();
      if (!ev) break;
      switch (ev->kind) {
        case ws::Event::Kind::kError:
          CloseWith(static_cast<LinkClose>(ev->code), ev->reason);
          break;
        case ws::Event::Kind::kPing:
          Queue(ws::Opcode::kPong, ev->payload);
          break;
        case ws::Event::Kind::kPong:
          last_pong = Clock::now();
          break;
        case ws::Event::Kind::kText:
          CloseWith(LinkClose::kUnsupportedData, "the link carries binary messages only");
          break;
        case ws::Event::Kind::kClose: {
          // Echo the tab's code when it may be sent back (1005 and 1006 may not).
          const uint16_t code = ev->code == 1005 || ev->code == 1006 ? 1000 : ev->code;
          why_ = "the tab closed it (" + std::to_string(ev->code) + (ev->reason.empty() ? "" : ", " + ev->reason) + ")";
          if (out_at_ > 0)
            out_.resize(1);
          else
            out_.clear();
          Queue(ws::Opcode::kClose, ws::ClosePayload(code, ""));
          const auto end = Clock::now() + Seconds(kCloseGraceS);
          while (!out_.empty() && Clock::now() < end && Flush()) {
            pollfd pfd{fd_, POLLOUT, 0};
            if (!out_.empty()) ::poll(&pfd, 1, 50);
          }
          break;
        }
        case ws::Event::Kind::kBinary:
          if (tab_key_.empty())
            Handshake(ev->payload);
          else
            Envelope(ev->payload);
          break;
      }
    }
    if (Ended()) break;
    const auto now = Clock::now();
    if (s_.stop.load()) {
      CloseWith(LinkClose::kGoingAway, "serve is stopping");
      break;
    }
    if (inbox_->replaced.load()) {
      CloseWith(LinkClose::kReplaced, "this key opened a newer link");
      break;
    }
    if (tab_key_.empty() && now > handshake_by) {
      CloseWith(LinkClose::kTooSlow, "no answer to the challenge within " + Secs(s_.options.handshake_s) + " s");
      break;
    }
    if (now - last_pong > Seconds(s_.options.timeout_s)) {
      CloseWith(LinkClose::kTooSlow, "no pong for " + Secs(s_.options.timeout_s) + " s");
      break;
    }
    if (!out_.empty() && now - last_progress_ > Seconds(s_.options.timeout_s)) {
      why_ = "it took nothing serve sent for " + Secs(s_.options.timeout_s) + " s";
      break;  // a close frame could not get through either
    }
    if (now >= next_ping) {
      ++pings;
      std::array<uint8_t, 8> p{};
      for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(pings >> (8 * i));
      Queue(ws::Opcode::kPing, p);
      next_ping = now + Seconds(s_.options.ping_s);
    }
    if (!Flush()) {
      why_ = "the connection broke";
      break;
    }
    pollfd pfds[2] = {{fd_, static_cast<short>(POLLIN | (out_.empty() ? 0 : POLLOUT)), 0},
                      {inbox_->wake[0], POLLIN, 0}};
    const auto until_ping = std::chrono::duration_cast<std::chrono::milliseconds>(next_ping - now).count();
    const int r = ::poll(pfds, 2, static_cast<int>(std::clamp<int64_t>(until_ping, 1, kPollMs)));
    if (r < 0 && errno != EINTR) {
      why_ = "poll failed";
      break;
    }
    if (pfds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
      if (n == 0) {
        why_ = "the connection closed";
        break;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        why_ = "the connection broke";
        break;
      }
      if (n > 0) reader_.Feed(std::span(buf.data(), static_cast<size_t>(n)));
    }
    if ((pfds[1].revents & POLLIN) && !tab_key_.empty()) SealDown(inbox_->Take());
  }
  inbox_->Close();
  const std::string said = (why_.rfind("closed it", 0) == 0 ? "serve " : "") + why_;
  if (tab_key_.empty()) {
    s_.NoteRefusal("a link that never finished its handshake: " + said);
    return;
  }
  bool superseded = false;
  {
    std::lock_guard<std::mutex> lock(s_.mu);
    auto it = s_.by_key.find(tab_key_);
    superseded = it == s_.by_key.end() || it->second.id != id_;
    if (!superseded) s_.by_key.erase(it);
  }
  LogInfo("link: tab " + Fingerprint(tab_key_) + " is gone: " + said);
  s_.hooks.down(tab_key_, id_, superseded);
}

}  // namespace

void LinkServer::Impl::Serve(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto write_all = [&](const std::string& s) {
    const auto end = Clock::now() + Seconds(kCloseGraceS);
    size_t at = 0;
    while (at < s.size() && Clock::now() < end) {
      const ssize_t n = ::send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
      if (n > 0) {
        at += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        pollfd pfd{fd, POLLOUT, 0};
        ::poll(&pfd, 1, 50);
      } else {
        return false;
      }
    }
    return at == s.size();
  };
  // The request head, up to its blank line; a client may send its first frame at once.
  std::string got;
  size_t head_end = std::string::npos;
  const auto deadline = Clock::now() + Seconds(options.handshake_s);
  char buf[4096];
  while (head_end == std::string::npos && !stop.load() && Clock::now() < deadline && got.size() <= kMaxRequestHead) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, kPollMs) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
    if (n > 0) got.append(buf, static_cast<size_t>(n));
    head_end = got.find("\r\n\r\n");
  }
  if (head_end == std::string::npos || head_end > kMaxRequestHead) {
    if (got.size() > kMaxRequestHead) write_all(ws::RefusalResponse({400, "the request head is over 8 KiB"}));
    ::close(fd);
    return;
  }
  ws::Parsed parsed = ws::ParseUpgrade(std::string_view(got).substr(0, head_end + 4));
  if (parsed.upgrade) {
    const std::string& target = parsed.upgrade->target;
    if (target.substr(0, target.find('?')) != kLinkPath) {
      parsed.refusal = {404, "the only WebSocket here is " + std::string(kLinkPath)};
      parsed.upgrade.reset();
    }
  }
  if (!parsed.upgrade) {
    write_all(ws::RefusalResponse(parsed.refusal));
    ::shutdown(fd, SHUT_WR);
    ::close(fd);
    return;
  }
  if (!write_all(ws::SwitchingProtocols(*parsed.upgrade))) {
    ::close(fd);
    return;
  }
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (admitted < options.max_links) {
      ++admitted;
      id = next_id++;
    }
  }
  if (id == 0) {
    const std::string why =
        "serve holds " + std::to_string(options.max_links) + " links, the most it takes; try again later";
    const auto frame = ws::ServerFrame(ws::Opcode::kClose, ws::ClosePayload(1013, why));
    write_all(std::string(frame.begin(), frame.end()));
    NoteRefusal(why);
    ::shutdown(fd, SHUT_WR);
    ::close(fd);
    return;
  }
  const auto* early = reinterpret_cast<const uint8_t*>(got.data()) + head_end + 4;
  Link link(*this, fd, id);
  link.Run(std::span(early, got.size() - head_end - 4));
  ::close(fd);
  std::lock_guard<std::mutex> lock(mu);
  --admitted;
}

void LinkServer::Impl::AcceptLoop() {
  while (!stop.load()) {
    pollfd pfd{listen_fd, POLLIN, 0};
    if (::poll(&pfd, 1, kPollMs) <= 0) continue;
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu);
    if (threads >= options.max_links + kSpareThreads) {
      ::close(fd);  // past even the connections told "try later": PortMux's limits come first anyway
      continue;
    }
    ++threads;
    // Detached: the destructor waits for threads == 0 before the Impl goes.
    std::thread([this, fd] {
      Serve(fd);
      std::lock_guard<std::mutex> lock(mu);
      --threads;
      idle.notify_all();
    }).detach();
  }
}

LinkServer::LinkServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

LinkServer::~LinkServer() {
  impl_->stop.store(true);
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->idle.wait(lock, [&] { return impl_->threads == 0; });
}

Result<std::unique_ptr<LinkServer>> LinkServer::Start(const KeyPair& keys, Hooks hooks, Options options) {
  if (sodium_init() < 0) return Internal("libsodium failed to start");
  auto impl = std::make_unique<Impl>();
  impl->keys = keys;
  impl->my_id = KeyId(keys.public_key);
  impl->hooks = std::move(hooks);
  impl->options = options;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable("link server: cannot make a socket");
  impl->listen_fd = fd;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 64) != 0)
    return Unavailable(std::string("link server: cannot listen on 127.0.0.1: ") + std::strerror(errno));
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  impl->port = ntohs(a.sin_port);
  Impl* raw = impl.get();
  impl->accept_thread = std::thread([raw] { raw->AcceptLoop(); });
  return std::unique_ptr<LinkServer>(new LinkServer(std::move(impl)));
}

int LinkServer::port() const {
  return impl_->port;
}

int LinkServer::links() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->admitted;
}

}  // namespace daisy::net
