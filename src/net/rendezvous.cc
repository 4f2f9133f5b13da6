// The rendezvous: rooms, approval by key, peer lists and liveness. It decodes only join,
// heartbeat and bye frames; anything else sent to it is dropped unread.
//
// Admission: a device asks to join a room with its public key (RequestJoin: over HTTP, or
// in this process); the host approves it (or auto_approve, a pre-approved fingerprint, or
// serve's own devices). Only then does the inbox's ZAP allow-list take the key, and only a
// join for a room the key was approved in makes it a member.
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "daisy/log.h"
#include "daisy/net.h"
#include "link.h"
#include "relay.h"

namespace daisy::net {

namespace {
using Clock = std::chrono::steady_clock;

struct Member {
  MemberInfo info;
  Clock::time_point last_seen;
};

struct PendingEntry {
  PendingJoin join;
  Clock::time_point asked;  // the last time the device asked
};

// New join requests a source may still make: a burst, refilled over time.
struct Bucket {
  double tokens = 0;
  Clock::time_point at;
};

bool ValidRoom(const std::string& room) {
  if (room.empty() || room.size() > 64) return false;
  for (char c : room)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  return true;
}

std::string CleanName(const std::string& name) {
  std::string out;
  for (char c : name.substr(0, 64)) out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  return out;
}
}  // namespace

struct Rendezvous::Impl {
  RendezvousOptions options;
  std::unique_ptr<Endpoint> endpoint;
  std::string address;
  mutable std::mutex mu;
  std::map<std::string, Member> members;                               // by device id
  std::map<std::string, std::map<std::string, std::string>> approved;  // room -> key -> name
  std::map<std::string, std::set<std::string>> preapproved;            // room -> fingerprint (16 hex)
  std::map<std::string, PendingEntry> pending;                         // by key
  std::map<std::string, Bucket> buckets;                               // by source address
  std::vector<std::string> dirty_rooms;                                // rooms whose peer list must be re-sent
  std::atomic<bool> stop{false};
  std::thread thread;
  std::unique_ptr<RelayCore> relay;        // null without options.relay
  std::unique_ptr<LinkServer> links;       // browser tabs; null without options.link
  std::map<std::string, uint64_t> linked;  // key -> its tab's link that is up (under mu): its heartbeat

  void MarkDirty(const std::string& room) { dirty_rooms.push_back(room); }

  // Under mu: the inbox admits every key approved for some room.
  void UpdateAllowList() {
    std::vector<std::string> keys;
    for (const auto& [room, ks] : approved)
      for (const auto& [k, name] : ks) keys.push_back(k);
    endpoint->SetAllowed(keys);
    if (relay) relay->SetAllowed(keys);
  }

  // The member `to_id`, when it and the member with key `from_key` share a room (takes mu).
  std::optional<RelayCore::Target> Resolve(const std::string& from_key, const std::string& to_id) {
    std::lock_guard<std::mutex> lock(mu);
    auto from = members.find(KeyId(from_key));
    auto to = members.find(to_id);
    if (from == members.end() || to == members.end() || from->second.info.public_key != from_key ||
        from->second.info.room != to->second.info.room)
      return std::nullopt;
    return RelayCore::Target{to->second.info.address, to->second.info.public_key,
                             wire::IsRelayAddress(to->second.info.address)};
  }

  // A frame of the rendezvous for a member: at its inbox, or down its relay link.
  void SendTo(const std::string& address, const std::string& device_id, const wire::Message& m) {
    if (wire::IsRelayAddress(address)) {
      if (relay) relay->Deliver(device_id, wire::Encode(m));
      return;
    }
    Status st = endpoint->Send(address, m, 500);
    if (!st.ok()) LogDebug("rendezvous: " + st.message());
  }

  // Under mu.
  void ApproveLocked(const std::string& room, const std::string& key, const std::string& name) {
    approved[room][key] = name;
    pending.erase(key);
    UpdateAllowList();
  }

  bool IsApproved(const std::string& room, const std::string& key) const {
    auto r = approved.find(room);
    return r != approved.end() && r->second.count(key) > 0;
  }

  Result<JoinAnswer> RequestJoin(const JoinRequest& q) {
    if (!IsPublicKey(q.public_key))
      return InvalidArgument("public_key is not a CURVE public key (40 characters of Z85)");
    if (!ValidRoom(q.room)) return InvalidArgument("room must be 1 to 64 printable characters");
    const std::string name = CleanName(q.name);
    const std::string fpr = Fingerprint(q.public_key);
    std::lock_guard<std::mutex> lock(mu);
    if (IsApproved(q.room, q.public_key)) return JoinAnswer{true, fpr};
    auto pre = preapproved.find(q.room);
    if (options.auto_approve || (pre != preapproved.end() && pre->second.count(KeyId(q.public_key)))) {
      ApproveLocked(q.room, q.public_key, name);
      LogInfo("rendezvous: approved " + name + " (" + fpr + ") for room '" + q.room + "'" +
              (options.auto_approve ? " (--auto-approve)" : " (--approve)"));
      return JoinAnswer{true, fpr};
    }
    const auto now = Clock::now();
    auto it = pending.find(q.public_key);
    if (it != pending.end() && it->second.join.room == q.room) {
      it->second.asked = now;  // asking again: not a new request
      return JoinAnswer{false, fpr};
    }
    // A new request: limited per source address, and in number.
    for (auto p = pending.begin(); p != pending.end();) {
      if (std::chrono::duration<double>(now - p->second.asked).count() > options.pending_expire_s)
        p = pending.erase(p);
      else
        ++p;
    }
    Bucket& b = buckets[q.source];
    if (b.at == Clock::time_point{}) b.tokens = options.join_burst;
    b.tokens = std::min<double>(options.join_burst,
                                b.tokens + options.join_per_s * std::chrono::duration<double>(now - b.at).count());
    b.at = now;
    if (b.tokens < 1)
      return ResourceExhausted("too many join requests from " +
                               (q.source.empty() ? std::string("this address") : q.source) + "; try again in a minute");
    if (it == pending.end() && static_cast<int>(pending.size()) >= options.max_pending)
      return ResourceExhausted("too many devices are waiting for approval (" + std::to_string(options.max_pending) +
                               "); try again later");
    b.tokens -= 1;
    pending[q.public_key] =
        PendingEntry{PendingJoin{q.room, q.public_key, fpr, KeyId(q.public_key), name, q.source}, now};
    LogInfo("rendezvous: device " + name + " (" + fpr + ") asks to join room '" + q.room + "'" +
            (q.source.empty() ? "" : " from " + q.source) + ": type 'approve " + fpr + "' to admit it");
    return JoinAnswer{false, fpr};
  }

  // Sends every member of `room` the members of `room`.
  void Broadcast(const std::string& room) {
    wire::Peers peers;
    peers.room = room;
    std::vector<std::pair<std::string, std::string>> to;  // address, device id
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [id, m] : members)
        if (m.info.room == room && m.info.approved) {
          peers.peers.push_back(wire::Peer{m.info.address, m.info.hello, m.info.public_key});
          to.emplace_back(m.info.address, id);
        }
    }
    const wire::Message message(peers);
    for (const auto& [addr, id] : to) SendTo(addr, id, message);
  }

  // A frame from `key`: at the inbox (this thread), or the inner frame of a tab's link
  // (`from_link`, on the link's thread: such a member is relayed, so nothing here touches the
  // endpoint for it).
  void Handle(const std::string& key, std::span<const uint8_t> bytes, bool from_link) {
    auto msg = wire::Decode(bytes);
    if (!msg.ok()) {
      LogWarning("rendezvous: dropped a frame: " + msg.status().message());
      return;
    }
    const auto now = Clock::now();
    if (auto* j = std::get_if<wire::Join>(&*msg)) {
      std::lock_guard<std::mutex> lock(mu);
      // Only a key approved for this room joins it, under the id its key gives: a device
      // approved in another room, or one claiming another's id, gets nothing back.
      if (!IsApproved(j->room, key)) {
        LogWarning("rendezvous: ignored a join to room '" + j->room + "' from key " + Fingerprint(key) +
                   ", which is not approved for that room");
        return;
      }
      if (j->hello.device_id != KeyId(key)) {
        LogWarning("rendezvous: ignored a join from key " + Fingerprint(key) + " claiming device id '" +
                   j->hello.device_id + "'");
        return;
      }
      const bool relayed = wire::IsRelayAddress(j->address);
      if (from_link && !relayed) {
        LogWarning("rendezvous: ignored a join from " + Fingerprint(key) + " at " + j->address +
                   " over a tab's link: a tab is reached only through its link, as relay://<its device id>");
        return;
      }
      if (j->hello.protocol_version != wire::kProtocolVersion) {
        LogWarning("rendezvous: refused " + j->hello.name + ": protocol version " +
                   std::to_string(j->hello.protocol_version) + ", this build speaks " +
                   std::to_string(wire::kProtocolVersion));
        if (!relayed) endpoint->SetPeerKey(j->address, key);
        SendTo(j->address, j->hello.device_id,
               wire::Message(wire::ErrorMsg{wire::ErrorKind::kProtocol, "protocol version mismatch"}));
        return;
      }
      // A relayed member is relay://ITS-OWN-ID and says so in its hello; only such a member
      // is reached through the relay, and no member can take another's relay address.
      if (relayed != ((j->hello.capabilities & wire::kCapRelayed) != 0) ||
          (relayed && j->address != std::string(wire::kRelayScheme) + j->hello.device_id)) {
        LogWarning("rendezvous: ignored a join from " + Fingerprint(key) + " at " + j->address +
                   ": a relay address must be relay://<its own device id>, with the relayed capability, and only then");
        return;
      }
      if (relayed && !relay) {
        LogWarning("rendezvous: refused " + j->hello.name + " (" + Fingerprint(key) +
                   "): it accepts no connections and this rendezvous has no relay");
        return;
      }
      auto it = members.find(j->hello.device_id);
      if (it != members.end() && it->second.info.room == j->room && it->second.info.address == j->address) {
        // A member repeating its join (members do, every few seconds, so one dropped by
        // mistake comes back): only a sign of life.
        it->second.last_seen = now;
        return;
      }
      const bool is_new = it == members.end();
      if (!is_new && it->second.info.room != j->room) MarkDirty(it->second.info.room);
      if (!relayed) endpoint->SetPeerKey(j->address, key);
      members[j->hello.device_id] = Member{{j->room, j->address, j->hello, true, key}, now};
      if (is_new)
        LogInfo("rendezvous: device " + j->hello.name + " (" + Fingerprint(key) + ") joined room '" + j->room + "'");
      MarkDirty(j->room);
    } else if (auto* h = std::get_if<wire::Heartbeat>(&*msg)) {
      std::lock_guard<std::mutex> lock(mu);
      auto it = members.find(h->device_id);
      if (it != members.end() && it->second.info.public_key == key) it->second.last_seen = now;
    } else if (auto* b = std::get_if<wire::Bye>(&*msg)) {
      std::lock_guard<std::mutex> lock(mu);
      auto it = members.find(b->device_id);
      const bool relayed = it != members.end() && wire::IsRelayAddress(it->second.info.address);
      if (it != members.end() && it->second.info.public_key == key && (relayed || !from_link)) {
        LogInfo("rendezvous: device " + it->second.info.hello.name + " (" + Fingerprint(key) + ") left");
        MarkDirty(it->second.info.room);
        if (!relayed) endpoint->Forget(it->second.info.address);
        members.erase(it);
      }
    } else if (std::holds_alternative<wire::Relay>(*msg) && relay) {
      // An envelope for a relayed member: the relay checks its sender and passes it on.
      relay->Forward(key, std::vector<uint8_t>(bytes.begin(), bytes.end()));
    } else {
      // Ring traffic never comes here; whatever did is dropped without being looked at.
      LogWarning("rendezvous: dropped a frame that is not join, heartbeat, bye or a relay envelope");
    }
  }

  // A tab's link finished its handshake: its frames go down the link, and its open link
  // keeps it in its room (no heartbeats needed). A newer link of a member gets the list again.
  void LinkUp(const std::string& key, uint64_t link, LinkSink sink) {
    relay->AttachLink(KeyId(key), link, std::move(sink));  // before the list below is queued
    std::lock_guard<std::mutex> lock(mu);
    linked[key] = link;
    auto it = members.find(KeyId(key));
    if (it != members.end() && it->second.info.public_key == key) {
      it->second.last_seen = Clock::now();
      MarkDirty(it->second.info.room);
    }
  }

  // A tab's link ended: unless a newer link of its key took over, its member leaves at
  // once, as if it had said bye (the head re-plans without it).
  void LinkDown(const std::string& key, uint64_t link, bool superseded) {
    relay->DetachLink(KeyId(key), link);
    if (superseded) return;
    std::lock_guard<std::mutex> lock(mu);
    auto l = linked.find(key);
    if (l == linked.end() || l->second != link) return;
    linked.erase(l);
    auto it = members.find(KeyId(key));
    if (it != members.end() && it->second.info.public_key == key && wire::IsRelayAddress(it->second.info.address)) {
      LogInfo("rendezvous: device " + it->second.info.hello.name + " (" + Fingerprint(key) + ") left: its link closed");
      MarkDirty(it->second.info.room);
      members.erase(it);
    }
  }

  // An inner frame up a tab's link: a member envelope goes straight to the relay (no decode
  // here: it may be a large activation), the rest is handled as at the inbox.
  void LinkFrame(const std::string& key, std::vector<uint8_t> frame) {
    if (frame.size() >= 4) {
      uint32_t tag = 0;
      for (int i = 3; i >= 0; --i) tag = tag << 8 | frame[i];
      if (static_cast<int32_t>(tag) == static_cast<int32_t>(wire::Tag::kRelay)) {
        relay->Forward(key, std::move(frame));
        return;
      }
    }
    Handle(key, frame, /*from_link=*/true);
  }

  void ExpireDead() {
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = members.begin(); it != members.end();) {
      if (linked.count(it->second.info.public_key)) it->second.last_seen = now;  // its open link is its heartbeat
      if (std::chrono::duration<double>(now - it->second.last_seen).count() > options.dead_after_s) {
        LogWarning("rendezvous: lost device " + it->second.info.hello.name + " (" +
                   Fingerprint(it->second.info.public_key) + "): no heartbeat for " +
                   std::to_string(static_cast<int>(options.dead_after_s)) + " s");
        MarkDirty(it->second.info.room);
        endpoint->Forget(it->second.info.address);
        it = members.erase(it);
      } else {
        ++it;
      }
    }
  }

  void Loop() {
    auto last_expire = Clock::now();
    while (!stop.load()) {
      auto frame = endpoint->ReceiveFrame(100);
      if (frame.ok() && frame->has_value()) Handle((*frame)->sender_key, (*frame)->bytes, /*from_link=*/false);
      if (Clock::now() - last_expire > std::chrono::milliseconds(250)) {
        ExpireDead();
        last_expire = Clock::now();
      }
      std::vector<std::string> rooms;
      {
        std::lock_guard<std::mutex> lock(mu);
        rooms.swap(dirty_rooms);
      }
      std::sort(rooms.begin(), rooms.end());
      rooms.erase(std::unique(rooms.begin(), rooms.end()), rooms.end());
      for (const auto& r : rooms) Broadcast(r);
    }
  }
};

Rendezvous::Rendezvous(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Rendezvous::~Rendezvous() {
  impl_->stop.store(true);
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->links.reset();  // its threads hand frames to the relay and the members
  impl_->relay.reset();  // its thread asks Resolve, which needs the members
}

Result<std::unique_ptr<Rendezvous>> Rendezvous::Start(const RendezvousOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (impl->options.keys.public_key.empty()) impl->options.keys = NewKeyPair();
  DAISY_ASSIGN_OR_RETURN(impl->endpoint, Endpoint::Bind(options.host, options.port, impl->options.keys));
  impl->address = impl->endpoint->address();
  Impl* raw = impl.get();
  if (options.relay) {
    DAISY_ASSIGN_OR_RETURN(impl->relay,
                           RelayCore::Start(
                               impl->options.keys,
                               [raw](const std::string& from, const std::string& to) { return raw->Resolve(from, to); },
                               [raw](const std::string& device_id) {
                                 std::lock_guard<std::mutex> lock(raw->mu);
                                 auto it = raw->members.find(device_id);
                                 if (it != raw->members.end()) raw->MarkDirty(it->second.info.room);
                               },
                               options.relay_observer));
  }
  if (options.relay && options.link) {
    LinkServer::Hooks hooks;
    hooks.approved = [raw](const std::string& key) {
      std::lock_guard<std::mutex> lock(raw->mu);
      for (const auto& [room, keys] : raw->approved)
        if (keys.count(key)) return true;
      return false;
    };
    hooks.up = [raw](const std::string& key, uint64_t link, LinkSink sink) { raw->LinkUp(key, link, std::move(sink)); };
    hooks.down = [raw](const std::string& key, uint64_t link, bool superseded) {
      raw->LinkDown(key, link, superseded);
    };
    hooks.frame = [raw](const std::string& key, std::vector<uint8_t> frame) { raw->LinkFrame(key, std::move(frame)); };
    LinkServer::Options lo;
    lo.max_links = options.max_links;
    lo.ping_s = options.link_ping_s;
    lo.timeout_s = options.link_timeout_s;
    lo.handshake_s = options.link_handshake_s;
    DAISY_ASSIGN_OR_RETURN(impl->links, LinkServer::Start(impl->options.keys, std::move(hooks), lo));
  }
  impl->thread = std::thread([raw] { raw->Loop(); });
  return std::unique_ptr<Rendezvous>(new Rendezvous(std::move(impl)));
}

const std::string& Rendezvous::address() const {
  return impl_->address;
}
const std::string& Rendezvous::public_key() const {
  return impl_->options.keys.public_key;
}

int Rendezvous::relay_port() const {
  return impl_->relay ? impl_->relay->port() : 0;
}
int64_t Rendezvous::relayed_frames() const {
  return impl_->relay ? impl_->relay->forwarded() : 0;
}
int64_t Rendezvous::relay_refusals() const {
  return impl_->relay ? impl_->relay->refused() : 0;
}
int Rendezvous::link_port() const {
  return impl_->links ? impl_->links->port() : 0;
}
int Rendezvous::links() const {
  return impl_->links ? impl_->links->links() : 0;
}

Result<JoinAnswer> Rendezvous::RequestJoin(const JoinRequest& request) {
  return impl_->RequestJoin(request);
}

void Rendezvous::Admit(const std::string& room, const std::string& public_key, const std::string& name) {
  if (!IsPublicKey(public_key)) return;
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->ApproveLocked(room, public_key, CleanName(name));
}

Status Rendezvous::PreApprove(const std::string& room, const std::string& fingerprint) {
  DAISY_ASSIGN_OR_RETURN(std::string f, NormalizeFingerprint(fingerprint));
  if (f.size() != 16)
    return InvalidArgument("--approve wants a whole fingerprint (16 hex digits like ab12-cd34-ef56-7890), got '" +
                           fingerprint + "'");
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->preapproved[room].insert(f);
  // A device already waiting with that fingerprint is admitted now.
  for (auto it = impl_->pending.begin(); it != impl_->pending.end();) {
    const PendingJoin j = it->second.join;
    ++it;
    if (j.room == room && j.device_id == f) impl_->ApproveLocked(room, j.public_key, j.name);
  }
  return Status::Ok();
}

Status Rendezvous::Approve(const std::string& prefix) {
  auto norm = NormalizeFingerprint(prefix);
  if (!norm.ok()) return NotFound("no device with fingerprint '" + prefix + "' is waiting");
  std::lock_guard<std::mutex> lock(impl_->mu);
  const PendingJoin* found = nullptr;
  for (const auto& [key, p] : impl_->pending) {
    if (p.join.device_id.rfind(*norm, 0) == 0) {
      if (found)
        return InvalidArgument("'" + prefix + "' matches more than one waiting device; type more of its fingerprint");
      found = &p.join;
    }
  }
  if (!found) return NotFound("no device with fingerprint '" + prefix + "' is waiting");
  const PendingJoin j = *found;
  impl_->ApproveLocked(j.room, j.public_key, j.name);
  LogInfo("rendezvous: approved " + j.name + " (" + j.fingerprint + ") for room '" + j.room + "'");
  return Status::Ok();
}

std::vector<PendingJoin> Rendezvous::Pending() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<PendingJoin> out;
  const auto now = Clock::now();
  for (const auto& [key, p] : impl_->pending)
    if (std::chrono::duration<double>(now - p.asked).count() <= impl_->options.pending_expire_s) out.push_back(p.join);
  return out;
}

std::vector<MemberInfo> Rendezvous::Members() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<MemberInfo> out;
  for (const auto& [id, m] : impl_->members) out.push_back(m.info);
  return out;
}

Admission Rendezvous::LocalAdmission(bool trusted) {
  Rendezvous* self = this;
  return Admission{public_key(), [self, trusted](const JoinRequest& q) -> Result<JoinAnswer> {
                     if (!trusted) return self->RequestJoin(q);
                     self->Admit(q.room, q.public_key, q.name);
                     return JoinAnswer{true, Fingerprint(q.public_key)};
                   }};
}

}  // namespace daisy::net
