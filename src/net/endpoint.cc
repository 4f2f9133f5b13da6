// Endpoint: a PULL inbox and PUSH outboxes, all CurveZMQ. ZMQ_IMMEDIATE keeps frames from
// queueing for a peer that is not connected (and authenticated), so a send to a dead stage
// fails instead of waiting forever.
//
// The ZAP handler: ZeroMQ asks the process's handler (a REP socket on
// inproc://zeromq.zap.01, one thread, started with the context) about every CURVE
// handshake on a server socket. Each inbox names its own ZAP domain, and the handler
// admits the client's key only when it is on that domain's allow-list.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "daisy/log.h"
#include "daisy/net.h"
#include "internal.h"

namespace daisy::net {

namespace {

// ZAP domain -> allow-list. Leaked on purpose, like the context: the ZAP thread may run
// until the process ends.
struct ZapRegistry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<AllowList>> domains;
  uint64_t next = 0;
};
ZapRegistry& Registry() {
  static ZapRegistry* r = new ZapRegistry();
  return *r;
}

std::shared_ptr<AllowList> FindDomain(const std::string& domain) {
  std::lock_guard<std::mutex> lock(Registry().mu);
  auto it = Registry().domains.find(domain);
  return it == Registry().domains.end() ? nullptr : it->second;
}

// Answers ZAP requests (RFC 27): version, request id, domain, address, routing id,
// mechanism, credentials -> version, request id, status, text, user id, metadata. The user
// id is the client's key in Z85, so every received frame tells who sent it.
void ZapLoop(zmq::socket_t* handler) {
  while (true) {
    std::vector<zmq::message_t> parts;
    try {
      while (true) {
        zmq::message_t part;
        if (!handler->recv(part)) break;
        const bool more = part.more();
        parts.push_back(std::move(part));
        if (!more) break;
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return;  // the context is going away
    }
    if (parts.size() < 6) continue;  // not a ZAP request; REP needs no answer to garbage
    const std::string version = parts[0].to_string();
    const std::string domain = parts[2].to_string();
    const std::string mechanism = parts[5].to_string();
    std::string code = "400", text = "key not admitted", user;
    if (version == "1.0" && mechanism == "CURVE" && parts.size() == 7 && parts[6].size() == 32) {
      char z85[41] = {0};
      zmq_z85_encode(z85, static_cast<const uint8_t*>(parts[6].data()), 32);
      auto list = FindDomain(domain);
      if (list && list->Has(z85)) {
        code = "200";
        text = "OK";
        user = z85;
      }
    }
    if (code != "200")
      LogDebug("zap: refused a " + mechanism + " handshake on " + domain + " from " + parts[3].to_string());
    try {
      handler->send(zmq::buffer(version), zmq::send_flags::sndmore);
      handler->send(parts[1], zmq::send_flags::sndmore);
      handler->send(zmq::buffer(code), zmq::send_flags::sndmore);
      handler->send(zmq::buffer(text), zmq::send_flags::sndmore);
      handler->send(zmq::buffer(user), zmq::send_flags::sndmore);
      handler->send(zmq::message_t(), zmq::send_flags::none);
    } catch (const zmq::error_t&) {
      return;
    }
  }
}

}  // namespace

ZapDomain::ZapDomain() : list_(std::make_shared<AllowList>()) {
  std::lock_guard<std::mutex> lock(Registry().mu);
  name_ = "daisy-" + std::to_string(Registry().next++);
  Registry().domains[name_] = list_;
}

ZapDomain::~ZapDomain() {
  std::lock_guard<std::mutex> lock(Registry().mu);
  Registry().domains.erase(name_);
}

void ZapDomain::SetAllowed(const std::vector<std::string>& public_keys) {
  std::lock_guard<std::mutex> lock(list_->mu);
  list_->keys.clear();
  for (const auto& k : public_keys)
    if (IsPublicKey(k)) list_->keys.insert(k);
}

// libzmq 4.3.4 aborts ("Bad file descriptor (src/epoll.cpp:113)") when a socket whose last
// SOCKS connect failed is closed: its connecter removes a descriptor it already closed. So a
// relay link is never closed but left open to the process's end (like the context); its I/O
// thread still hands over the last frames meanwhile.
namespace {
void KeepOpen(std::optional<zmq::socket_t>& socket) {
  if (socket) (void)new (std::nothrow) zmq::socket_t(std::move(*socket));
  socket.reset();
}
}  // namespace

zmq::context_t& Context() {
  // Lives for the process, with its ZAP handler bound before any socket can handshake (a
  // context without one would admit every key).
  static zmq::context_t* ctx = [] {
    auto* c = new zmq::context_t(1);
    auto* handler = new zmq::socket_t(*c, zmq::socket_type::rep);
    handler->set(zmq::sockopt::linger, 0);
    handler->bind("inproc://zeromq.zap.01");
    std::thread(ZapLoop, handler).detach();
    return c;
  }();
  return *ctx;
}

void ApplyPeerList(Endpoint& endpoint, const std::string& rendezvous_key, const wire::Peers& peers) {
  std::vector<std::string> allowed = {rendezvous_key};
  for (const auto& p : peers.peers) {
    allowed.push_back(p.public_key);
    endpoint.SetPeerKey(p.address, p.public_key);
  }
  endpoint.SetAllowed(allowed);
  endpoint.KeepOnly(allowed);  // links to members that left stop reconnecting
}

Result<std::string> JoinAddress(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == host_port.size())
    return InvalidArgument("--join wants HOST:PORT, got '" + host_port + "'");
  for (size_t i = 0; i < colon; ++i) {
    const char c = host_port[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-'))
      return InvalidArgument("--join host '" + host_port.substr(0, colon) + "' is not a host name or IPv4 address");
  }
  int port = 0;
  for (size_t i = colon + 1; i < host_port.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(host_port[i])) || port > 65535)
      return InvalidArgument("--join port '" + host_port.substr(colon + 1) + "' is not a number");
    port = port * 10 + (host_port[i] - '0');
  }
  if (port < 1 || port > 65535) return InvalidArgument("--join port must be in [1, 65535]");
  return "tcp://" + host_port;
}

struct Endpoint::Impl {
  KeyPair keys;
  zmq::socket_t inbox{Context(), zmq::socket_type::pull};
  std::string address;
  std::string domain;
  std::shared_ptr<AllowList> allowed = std::make_shared<AllowList>();
  struct Outbox {
    zmq::socket_t socket;
    zmq::socket_t monitor;  // PAIR: the outbox's connection events
    bool broken = false;    // a handshake failed: ZeroMQ never reconnects such a socket
  };
  std::map<std::string, Outbox> outboxes;
  std::map<std::string, std::string> peer_keys;  // address -> Z85
  std::vector<std::string> dropped;
  // A relayed member's one link to serve's relay (ConnectRelay), and the relay's key.
  std::optional<zmq::socket_t> relay;
  std::string relay_key;

  ~Impl() {
    std::lock_guard<std::mutex> lock(Registry().mu);
    Registry().domains.erase(domain);
  }

  Result<zmq::socket_t*> Out(const std::string& to) {
    auto it = outboxes.find(to);
    if (it != outboxes.end()) {
      Drain(to, it->second);
      if (!it->second.broken) return &it->second.socket;
      // Refused in the handshake (e.g. the peer did not admit this key yet): a fresh socket
      // tries again.
      zmq_socket_monitor(it->second.socket.handle(), nullptr, 0);
      outboxes.erase(it);
    }
    auto key = peer_keys.find(to);
    if (key == peer_keys.end())
      return FailedPrecondition("no public key is known for " + to +
                                ": this device sends only to peers the rendezvous named");
    zmq::socket_t s(Context(), zmq::socket_type::push);
    s.set(zmq::sockopt::linger, 200);
    s.set(zmq::sockopt::immediate, 1);
    s.set(zmq::sockopt::sndhwm, 1000);
    // ZMTP heartbeats: a peer that stops answering without closing its connection (a
    // stopped process, a lost Wi-Fi link) is disconnected, so sends to it fail. Answered by
    // ZeroMQ's I/O thread, never delayed by the peer's compute.
    s.set(zmq::sockopt::heartbeat_ivl, 2000);
    s.set(zmq::sockopt::heartbeat_timeout, 10000);
    // Reconnect attempts back off to one every 5 s (default: every 100 ms, forever).
    s.set(zmq::sockopt::reconnect_ivl_max, 5000);
    s.set(zmq::sockopt::curve_serverkey, key->second);
    s.set(zmq::sockopt::curve_publickey, keys.public_key);
    s.set(zmq::sockopt::curve_secretkey, keys.secret_key);
    // Connection events, to tell a lap that a link broke (e.g. a frame failed
    // authentication and the receiver dropped the connection).
    static std::atomic<uint64_t> n_monitors{0};
    const std::string mon = "inproc://daisy-monitor-" + std::to_string(n_monitors.fetch_add(1));
    zmq_socket_monitor(s.handle(), mon.c_str(),
                       ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    zmq::socket_t m(Context(), zmq::socket_type::pair);
    m.set(zmq::sockopt::linger, 0);
    m.connect(mon);
    s.connect(to);
    return &outboxes.emplace(to, Outbox{std::move(s), std::move(m)}).first->second.socket;
  }

  void Drain(const std::string& addr, Outbox& o) {
    while (true) {
      zmq::message_t event;
      if (!o.monitor.recv(event, zmq::recv_flags::dontwait)) break;
      zmq::message_t where;
      if (event.more()) (void)o.monitor.recv(where, zmq::recv_flags::dontwait);
      uint16_t id = 0;
      if (event.size() >= 2) std::memcpy(&id, event.data(), 2);
      if (id != ZMQ_EVENT_DISCONNECTED) o.broken = true;
      dropped.push_back(addr);
    }
  }
  void DrainMonitors() {
    for (auto& [addr, o] : outboxes) Drain(addr, o);
  }
};

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Endpoint::~Endpoint() {
  // The last frames (done, bye) may still sit in ZeroMQ's queues. Closing a socket with a
  // linger lets the I/O thread hand them to the kernel, which delivers them after the
  // process is gone; the short pause gives that thread the moment it needs.
  const bool sent_any = !impl_->outboxes.empty() || impl_->relay.has_value();
  for (auto& [addr, o] : impl_->outboxes) zmq_socket_monitor(o.socket.handle(), nullptr, 0);
  impl_->outboxes.clear();
  KeepOpen(impl_->relay);
  if (sent_any) std::this_thread::sleep_for(std::chrono::milliseconds(30));
}

Result<std::unique_ptr<Endpoint>> Endpoint::Bind(const std::string& host, int port) {
  return Bind(host, port, NewKeyPair());
}

Result<std::unique_ptr<Endpoint>> Endpoint::SendOnly(const KeyPair& keys) {
  if (!IsPublicKey(keys.public_key) || !IsPublicKey(keys.secret_key))
    return InvalidArgument("Bug: Endpoint::SendOnly without a key pair");
  auto impl = std::make_unique<Impl>();
  impl->keys = keys;  // the inbox stays unbound: nothing can reach it
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
}

Result<std::unique_ptr<Endpoint>> Endpoint::Bind(const std::string& host, int port, const KeyPair& keys) {
  if (!IsPublicKey(keys.public_key) || !IsPublicKey(keys.secret_key))
    return InvalidArgument("Bug: Endpoint::Bind without a key pair");
  auto impl = std::make_unique<Impl>();
  impl->keys = keys;
  {
    std::lock_guard<std::mutex> lock(Registry().mu);
    impl->domain = "daisy-" + std::to_string(Registry().next++);
    Registry().domains[impl->domain] = impl->allowed;
  }
  try {
    impl->inbox.set(zmq::sockopt::curve_server, 1);
    impl->inbox.set(zmq::sockopt::curve_secretkey, keys.secret_key);
    impl->inbox.set(zmq::sockopt::zap_domain, impl->domain);
    impl->inbox.set(zmq::sockopt::linger, 0);
    impl->inbox.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(wire::kMaxFrameBytes));
    impl->inbox.set(zmq::sockopt::rcvhwm, 10000);
    impl->inbox.bind("tcp://" + host + ":" + (port == 0 ? std::string("*") : std::to_string(port)));
    std::string bound = impl->inbox.get(zmq::sockopt::last_endpoint);  // tcp://IP:PORT
    const std::string bound_port = bound.substr(bound.rfind(':') + 1);
    impl->address = "tcp://" + host + ":" + bound_port;
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot listen on " + host + ":" + std::to_string(port) + ": " + e.what());
  }
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
}

const std::string& Endpoint::address() const {
  return impl_->address;
}
const std::string& Endpoint::public_key() const {
  return impl_->keys.public_key;
}

void Endpoint::SetAllowed(const std::vector<std::string>& public_keys) {
  std::lock_guard<std::mutex> lock(impl_->allowed->mu);
  impl_->allowed->keys.clear();
  for (const auto& k : public_keys)
    if (IsPublicKey(k)) impl_->allowed->keys.insert(k);
}

void Endpoint::Allow(const std::string& public_key) {
  if (!IsPublicKey(public_key)) return;
  std::lock_guard<std::mutex> lock(impl_->allowed->mu);
  impl_->allowed->keys.insert(public_key);
}

bool Endpoint::Allowed(const std::string& public_key) const {
  return impl_->allowed->Has(public_key);
}

void Endpoint::SetPeerKey(const std::string& address, const std::string& public_key) {
  if (!IsPublicKey(public_key)) return;
  auto it = impl_->peer_keys.find(address);
  if (it != impl_->peer_keys.end() && it->second == public_key) return;
  if (it != impl_->peer_keys.end()) Forget(address);  // another device at that address now
  impl_->peer_keys[address] = public_key;
}

std::vector<std::string> Endpoint::TakeDropped() {
  impl_->DrainMonitors();
  return std::exchange(impl_->dropped, {});
}

Status Endpoint::Send(const std::string& address, std::span<const uint8_t> frame, int timeout_ms) {
  // In slices: a socket whose handshake was refused meanwhile is replaced and tried again.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  try {
    while (true) {
      auto out = impl_->Out(address);
      if (!out.ok()) return out.status();
      zmq::socket_t& s = **out;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      s.set(zmq::sockopt::sndtimeo, static_cast<int>(std::clamp<int64_t>(left, 0, 250)));
      auto sent = s.send(zmq::const_buffer(frame.data(), frame.size()), zmq::send_flags::none);
      if (sent) return Status::Ok();
      if (std::chrono::steady_clock::now() >= deadline) {
        // A connection the receiver dropped (Out drained its monitor into `dropped`, which
        // TakeDropped hands to the ring) is a broken link, not an unknown peer: say so.
        if (std::find(impl_->dropped.begin(), impl_->dropped.end(), address) != impl_->dropped.end())
          return Unavailable("the link to " + address + " broke: the receiver dropped the connection (a frame that " +
                             "fails authentication is refused by its receiver), and it did not come back within " +
                             std::to_string(timeout_ms) + " ms");
        return Unavailable("could not reach " + address + " within " + std::to_string(timeout_ms) +
                           " ms (gone, or it does not admit this device's key)");
      }
    }
  } catch (const zmq::error_t& e) {
    return Unavailable("sending to " + address + ": " + e.what());
  }
}

Status Endpoint::Send(const std::string& address, const wire::Message& message, int timeout_ms) {
  const auto bytes = wire::Encode(message);
  return Send(address, bytes, timeout_ms);
}

Result<std::optional<Endpoint::Frame>> Endpoint::ReceiveFrame(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  try {
    while (true) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      zmq::pollitem_t items[2] = {{impl_->inbox.handle(), 0, ZMQ_POLLIN, 0},
                                  {impl_->relay ? impl_->relay->handle() : nullptr, 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, impl_->relay ? 2 : 1, std::max(left, std::chrono::milliseconds(0)));
      if (impl_->relay && (items[1].revents & ZMQ_POLLIN)) {
        // Down from the relay: the CURVE handshake proved the relay's key, so that is the
        // sender; the envelopes inside name (and box) their true senders.
        zmq::message_t msg;
        if (impl_->relay->recv(msg, zmq::recv_flags::dontwait)) {
          const auto* p = static_cast<const uint8_t*>(msg.data());
          return std::optional<Frame>(Frame{std::vector<uint8_t>(p, p + msg.size()), impl_->relay_key});
        }
      }
      if (!(items[0].revents & ZMQ_POLLIN)) {
        if (std::chrono::steady_clock::now() >= deadline) return std::optional<Frame>();
        continue;
      }
      zmq::message_t msg;
      auto got = impl_->inbox.recv(msg, zmq::recv_flags::dontwait);
      if (!got) return std::optional<Frame>();
      Frame f;
      const char* user = msg.gets("User-Id");
      f.sender_key = user ? user : "";
      // A key taken off the list keeps the connection it made while it was on it; its
      // frames stop here.
      if (!impl_->allowed->Has(f.sender_key)) {
        LogDebug("endpoint: dropped a frame from a key no longer admitted");
        if (std::chrono::steady_clock::now() >= deadline) return std::optional<Frame>();
        continue;
      }
      const auto* p = static_cast<const uint8_t*>(msg.data());
      f.bytes.assign(p, p + msg.size());
      return std::optional<Frame>(std::move(f));
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return std::optional<Frame>();
    return Unavailable(std::string("receiving: ") + e.what());
  }
}

Result<std::optional<std::vector<uint8_t>>> Endpoint::Receive(int timeout_ms) {
  DAISY_ASSIGN_OR_RETURN(std::optional<Frame> f, ReceiveFrame(timeout_ms));
  if (!f) return std::optional<std::vector<uint8_t>>();
  return std::optional<std::vector<uint8_t>>(std::move(f->bytes));
}

void Endpoint::KeepOnly(const std::vector<std::string>& public_keys) {
  const std::set<std::string> keep(public_keys.begin(), public_keys.end());
  for (auto it = impl_->peer_keys.begin(); it != impl_->peer_keys.end();) {
    if (keep.count(it->second)) {
      ++it;
      continue;
    }
    Forget(it->first);
    it = impl_->peer_keys.erase(it);
  }
}

Status Endpoint::ConnectRelay(const std::string& serve, const std::string& relay_key) {
  if (!serve.starts_with("tcp://")) return InvalidArgument("Bug: ConnectRelay wants tcp://HOST:PORT, got " + serve);
  if (!IsPublicKey(relay_key)) return InvalidArgument("Bug: ConnectRelay without the relay's key");
  KeepOpen(impl_->relay);  // a link refused in its handshake is never retried by ZeroMQ: a new one
  try {
    zmq::socket_t s(Context(), zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 200);
    s.set(zmq::sockopt::immediate, 1);
    s.set(zmq::sockopt::sndhwm, 1000);
    s.set(zmq::sockopt::rcvhwm, 10000);
    s.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(wire::kMaxFrameBytes));
    s.set(zmq::sockopt::heartbeat_ivl, 2000);  // as every outbox: a dead link is noticed
    s.set(zmq::sockopt::heartbeat_timeout, 10000);
    s.set(zmq::sockopt::reconnect_ivl_max, 5000);
    s.set(zmq::sockopt::curve_serverkey, relay_key);
    s.set(zmq::sockopt::curve_publickey, impl_->keys.public_key);
    s.set(zmq::sockopt::curve_secretkey, impl_->keys.secret_key);
    // serve's one port answers SOCKS5 for the relay (PortMux); libzmq speaks it before ZMTP
    // and sends the target name unresolved.
    s.set(zmq::sockopt::socks_proxy, serve.substr(6));
    s.connect(std::string("tcp://") + kRelayHost + ":1");
    impl_->relay = std::move(s);
    impl_->relay_key = relay_key;
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot open the link to the relay at " + serve + ": " + e.what());
  }
  return Status::Ok();
}

Status Endpoint::SendRelay(std::span<const uint8_t> frame, int timeout_ms) {
  if (!impl_->relay) return FailedPrecondition("Bug: SendRelay before ConnectRelay");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  try {
    while (true) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      impl_->relay->set(zmq::sockopt::sndtimeo, static_cast<int>(std::clamp<int64_t>(left, 0, 250)));
      if (impl_->relay->send(zmq::const_buffer(frame.data(), frame.size()), zmq::send_flags::none)) return Status::Ok();
      if (std::chrono::steady_clock::now() >= deadline)
        return Unavailable("could not reach the relay within " + std::to_string(timeout_ms) +
                           " ms (serve is gone or unreachable, or it does not admit this device's key)");
    }
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("sending to the relay: ") + e.what());
  }
}

bool Endpoint::relayed() const {
  return impl_->relay.has_value();
}

int Endpoint::outboxes() const {
  return static_cast<int>(impl_->outboxes.size());
}

void Endpoint::Forget(const std::string& address) {
  auto it = impl_->outboxes.find(address);
  if (it == impl_->outboxes.end()) return;
  zmq_socket_monitor(it->second.socket.handle(), nullptr, 0);
  impl_->outboxes.erase(it);
}

}  // namespace daisy::net
