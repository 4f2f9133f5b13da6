// RelayCore: serve's relay for members that accept no connections (node --no-listen).
//
// Up: a relayed member's DEALER reaches the ROUTER here through PortMux's SOCKS5 path; a
// browser tab's link (LinkServer) and any other member hand envelopes over (Forward).
// Down: to a relayed member on its ROUTER connection or its tab's link (AttachLink), to any
// other member at its inbox through an outbox of the rendezvous's key (which every member's
// inbox admits). The relay decodes an envelope's two device ids and nothing inside its box.
#include "relay.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "daisy/log.h"
#include "internal.h"

namespace daisy::net {

namespace {
using Clock = std::chrono::steady_clock;
constexpr int kDownTimeoutMs = 1000;  // a member's inbox that takes longer is reported unreachable
constexpr int kMaxBatch = 256;        // frames read from the ROUTER before the queue is looked at
}  // namespace

struct RelayCore::Impl {
  KeyPair keys;
  Resolve resolve;
  OnAttach on_attach;
  RelayObserver observer;
  ZapDomain zap;
  zmq::socket_t router{Context(), zmq::socket_type::router};
  std::unique_ptr<Endpoint> out;  // outboxes to members' inboxes
  int port = 0;
  int wake[2] = {-1, -1};  // a pipe: the queue has work
  struct Item {
    // kDeliver: a frame of the rendezvous for a relayed member; kEnvelope: an envelope to route;
    // kAttach/kDetach: a member's other kind of link comes or goes.
    enum class Kind { kEnvelope, kDeliver, kAttach, kDetach } kind = Kind::kEnvelope;
    std::string who;  // the device id; kEnvelope: the key that sent it
    std::vector<uint8_t> frame;
    uint64_t link = 0;
    LinkSink sink;
  };
  struct OtherLink {
    uint64_t id = 0;
    LinkSink sink;
  };
  std::mutex mu;
  std::deque<Item> queue;
  std::map<std::string, std::string> links;      // device id -> ROUTER routing id (relay thread only)
  std::map<std::string, OtherLink> other_links;  // device id -> a tab's link (relay thread only)
  std::atomic<int64_t> n_forwarded{0}, n_refused{0};
  std::atomic<bool> stop{false};
  std::thread thread;
  int64_t refused_unlogged = 0;
  Clock::time_point last_log{};

  ~Impl() {
    for (int fd : wake)
      if (fd >= 0) ::close(fd);
  }

  void Refuse(const std::string& why) {
    n_refused.fetch_add(1);
    ++refused_unlogged;
    if (Clock::now() - last_log < std::chrono::seconds(1)) return;
    last_log = Clock::now();
    LogWarning("relay: refused " + std::to_string(refused_unlogged) + " frame(s) (latest: " + why + ")");
    refused_unlogged = 0;
  }

  void Push(Item item) {
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(item));
    }
    const char b = 1;
    (void)!::write(wake[1], &b, 1);  // a full pipe already says "work"
  }

  bool SendDown(const std::string& device_id, const std::vector<uint8_t>& frame) {
    auto other = other_links.find(device_id);
    if (other != other_links.end()) return other->second.sink(frame);
    auto link = links.find(device_id);
    if (link == links.end()) return false;
    try {
      if (router.send(zmq::buffer(link->second), zmq::send_flags::sndmore | zmq::send_flags::dontwait) &&
          router.send(zmq::const_buffer(frame.data(), frame.size()), zmq::send_flags::dontwait))
        return true;
    } catch (const zmq::error_t&) {
      // EHOSTUNREACH (ROUTER_MANDATORY): the connection is gone.
    }
    links.erase(link);
    return false;
  }

  // An envelope from `sender_key`, to be passed on. Its `from` must be that key's id.
  void Route(const std::string& sender_key, const std::vector<uint8_t>& frame) {
    auto m = wire::Decode(frame);
    const auto* env = m.ok() ? std::get_if<wire::Relay>(&*m) : nullptr;
    if (!env) {
      Refuse("a frame that is not a relay envelope from " + Fingerprint(sender_key));
      return;
    }
    if (env->from != KeyId(sender_key)) {
      Refuse("an envelope from " + Fingerprint(sender_key) + " claiming to be from " + env->from);
      return;
    }
    if (observer) observer(frame);
    auto target = resolve(sender_key, env->to);
    if (!target) {
      Refuse("an envelope for " + env->to + ", which is not a member of the sender's room");
      return;
    }
    if (target->relayed) {
      if (!SendDown(env->to, frame)) {
        Refuse("an envelope for " + env->to + ", which is not connected to the relay");
        return;
      }
    } else {
      out->SetPeerKey(target->address, target->public_key);
      Status st = out->Send(target->address, frame, kDownTimeoutMs);
      if (!st.ok()) {
        Refuse("an envelope for " + env->to + ": " + st.message());
        return;
      }
    }
    n_forwarded.fetch_add(1);
  }

  // A frame up a relayed member's link: its heartbeat (who it is) or an envelope.
  void FromLink(const std::string& routing_id, const std::string& sender_key, const std::vector<uint8_t>& frame) {
    if (frame.size() >= 4) {
      int32_t tag = 0;
      for (int i = 3; i >= 0; --i) tag = static_cast<int32_t>(static_cast<uint32_t>(tag) << 8 | frame[i]);
      if (tag == static_cast<int32_t>(wire::Tag::kHeartbeat)) {
        auto m = wire::Decode(frame);
        const auto* hb = m.ok() ? std::get_if<wire::Heartbeat>(&*m) : nullptr;
        if (!hb || hb->device_id != KeyId(sender_key)) {
          Refuse("a heartbeat on a relay link that does not name its own key's id");
          return;
        }
        auto it = links.find(hb->device_id);
        if (it != links.end() && it->second == routing_id) return;  // the same link saying it again
        if (it == links.end()) LogInfo("relay: device " + Fingerprint(sender_key) + " is connected to the relay");
        links[hb->device_id] = routing_id;
        other_links.erase(hb->device_id);  // the newest link of a device is the one that counts
        // A new link (or a reconnected one) has missed what was sent before: its room's list.
        if (on_attach) on_attach(hb->device_id);
        return;
      }
    }
    Route(sender_key, frame);
  }

  void ReadRouter() {
    for (int i = 0; i < kMaxBatch; ++i) {
      zmq::message_t id, body;
      if (!router.recv(id, zmq::recv_flags::dontwait)) return;
      if (!id.more() || !router.recv(body, zmq::recv_flags::dontwait)) continue;
      while (body.more()) {  // a DEALER of ours sends one part; drop the rest of anything else
        zmq::message_t extra;
        if (!router.recv(extra, zmq::recv_flags::dontwait)) break;
        body = std::move(extra);
        Refuse("a multi-part message on a relay link");
      }
      const char* user = body.gets("User-Id");
      const auto* p = static_cast<const uint8_t*>(body.data());
      FromLink(id.to_string(), user ? user : "", std::vector<uint8_t>(p, p + body.size()));
    }
  }

  void DrainQueue() {
    char buf[256];
    while (::read(wake[0], buf, sizeof buf) > 0) {
    }
    std::deque<Item> items;
    {
      std::lock_guard<std::mutex> lock(mu);
      items.swap(queue);
    }
    for (Item& item : items) {
      switch (item.kind) {
        case Item::Kind::kEnvelope:
          Route(item.who, item.frame);
          break;
        case Item::Kind::kDeliver:
          if (!SendDown(item.who, item.frame))
            LogDebug("relay: " + item.who + " is not connected yet; its peer list waits for it to attach");
          break;
        case Item::Kind::kAttach:
          links.erase(item.who);
          other_links[item.who] = OtherLink{item.link, std::move(item.sink)};
          break;
        case Item::Kind::kDetach: {
          auto it = other_links.find(item.who);
          if (it != other_links.end() && it->second.id == item.link) other_links.erase(it);
          break;
        }
      }
    }
  }

  void Loop() {
    while (!stop.load()) {
      zmq::pollitem_t items[2] = {{router.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake[0], ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(200));
        if (items[0].revents & ZMQ_POLLIN) ReadRouter();
        if (items[1].revents & ZMQ_POLLIN) DrainQueue();
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) LogWarning(std::string("relay: ") + e.what());
      }
    }
  }
};

RelayCore::RelayCore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RelayCore::~RelayCore() {
  impl_->stop.store(true);
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::unique_ptr<RelayCore>> RelayCore::Start(const KeyPair& keys, Resolve resolve, OnAttach on_attach,
                                                    RelayObserver observer) {
  auto impl = std::make_unique<Impl>();
  impl->keys = keys;
  impl->resolve = std::move(resolve);
  impl->on_attach = std::move(on_attach);
  impl->observer = std::move(observer);
  if (::pipe2(impl->wake, O_NONBLOCK | O_CLOEXEC) != 0) return Unavailable("relay: cannot make its wake-up pipe");
  DAISY_ASSIGN_OR_RETURN(impl->out, Endpoint::SendOnly(keys));
  try {
    zmq::socket_t& r = impl->router;
    r.set(zmq::sockopt::curve_server, 1);
    r.set(zmq::sockopt::curve_secretkey, keys.secret_key);
    r.set(zmq::sockopt::zap_domain, impl->zap.name());
    r.set(zmq::sockopt::linger, 0);
    r.set(zmq::sockopt::router_mandatory, 1);  // a send to a link that is gone fails, not vanishes
    r.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(wire::kMaxFrameBytes));
    r.set(zmq::sockopt::sndhwm, 1000);
    r.set(zmq::sockopt::rcvhwm, 10000);
    r.set(zmq::sockopt::heartbeat_ivl, 2000);  // a relayed member that vanishes is disconnected
    r.set(zmq::sockopt::heartbeat_timeout, 10000);
    r.bind("tcp://127.0.0.1:*");
    const std::string bound = r.get(zmq::sockopt::last_endpoint);
    impl->port = std::stoi(bound.substr(bound.rfind(':') + 1));
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("relay: cannot listen on 127.0.0.1: ") + e.what());
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Loop(); });
  return std::unique_ptr<RelayCore>(new RelayCore(std::move(impl)));
}

int RelayCore::port() const {
  return impl_->port;
}

void RelayCore::SetAllowed(const std::vector<std::string>& public_keys) {
  impl_->zap.SetAllowed(public_keys);
}

void RelayCore::Forward(std::string sender_key, std::vector<uint8_t> frame) {
  impl_->Push(Impl::Item{Impl::Item::Kind::kEnvelope, std::move(sender_key), std::move(frame), 0, nullptr});
}

void RelayCore::Deliver(std::string device_id, std::vector<uint8_t> frame) {
  impl_->Push(Impl::Item{Impl::Item::Kind::kDeliver, std::move(device_id), std::move(frame), 0, nullptr});
}

void RelayCore::AttachLink(std::string device_id, uint64_t link, LinkSink sink) {
  impl_->Push(Impl::Item{Impl::Item::Kind::kAttach, std::move(device_id), {}, link, std::move(sink)});
}

void RelayCore::DetachLink(std::string device_id, uint64_t link) {
  impl_->Push(Impl::Item{Impl::Item::Kind::kDetach, std::move(device_id), {}, link, nullptr});
}

int64_t RelayCore::forwarded() const {
  return impl_->n_forwarded.load();
}
int64_t RelayCore::refused() const {
  return impl_->n_refused.load();
}

}  // namespace daisy::net
