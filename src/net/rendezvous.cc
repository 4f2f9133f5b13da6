// The rendezvous: rooms, approval, peer lists and liveness. It decodes only join,
// heartbeat and bye frames; anything else sent to it is dropped unread.
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "daisy/log.h"
#include "daisy/net.h"

namespace daisy::net {

namespace {
using Clock = std::chrono::steady_clock;

struct Member {
  MemberInfo info;
  Clock::time_point last_seen;
};

std::string Short(const std::string& id) { return id.substr(0, 8); }
}  // namespace

struct Rendezvous::Impl {
  RendezvousOptions options;
  std::unique_ptr<Endpoint> endpoint;
  std::string address;
  mutable std::mutex mu;
  std::map<std::string, Member> members;  // by device id
  std::vector<std::string> dirty_rooms;   // rooms whose peer list must be re-sent
  std::atomic<bool> stop{false};
  std::thread thread;

  void MarkDirty(const std::string& room) { dirty_rooms.push_back(room); }

  // Sends every approved member of `room` the approved members of `room`.
  void Broadcast(const std::string& room) {
    wire::Peers peers;
    peers.room = room;
    std::vector<std::string> to;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [id, m] : members)
        if (m.info.room == room && m.info.approved) {
          peers.peers.push_back(wire::Peer{m.info.address, m.info.hello});
          to.push_back(m.info.address);
        }
    }
    for (const auto& addr : to) {
      Status st = endpoint->Send(addr, wire::Message(peers), 500);
      if (!st.ok()) LogDebug("rendezvous: " + st.message());
    }
  }

  void Handle(const std::vector<uint8_t>& frame) {
    auto msg = wire::Decode(frame);
    if (!msg.ok()) {
      LogWarning("rendezvous: dropped a frame: " + msg.status().message());
      return;
    }
    const auto now = Clock::now();
    if (auto* j = std::get_if<wire::Join>(&*msg)) {
      if (j->hello.protocol_version != wire::kProtocolVersion) {
        LogWarning("rendezvous: refused " + j->hello.name + ": protocol version " + std::to_string(j->hello.protocol_version) +
                   ", this build speaks " + std::to_string(wire::kProtocolVersion));
        (void)endpoint->Send(j->address, wire::Message(wire::ErrorMsg{1, "protocol version mismatch"}), 500);
        return;
      }
      std::lock_guard<std::mutex> lock(mu);
      auto it = members.find(j->hello.device_id);
      if (it != members.end() && it->second.info.room == j->room && it->second.info.address == j->address) {
        // A member repeating its join (members do, every few seconds, so one dropped by
        // mistake comes back): only a sign of life.
        it->second.last_seen = now;
        return;
      }
      const bool known = it != members.end() && it->second.info.approved && it->second.info.room == j->room;
      Member m{{j->room, j->address, j->hello, options.auto_approve || known}, now};
      const bool is_new = it == members.end();
      members[j->hello.device_id] = m;
      if (is_new) {
        if (m.info.approved)
          LogInfo("rendezvous: device " + j->hello.name + " (" + Short(j->hello.device_id) + ") joined room '" + j->room + "'");
        else
          LogInfo("rendezvous: device " + j->hello.name + " (" + Short(j->hello.device_id) + ") asks to join room '" +
                  j->room + "': type 'approve " + Short(j->hello.device_id) + "' to admit it");
      }
      MarkDirty(j->room);
    } else if (auto* h = std::get_if<wire::Heartbeat>(&*msg)) {
      std::lock_guard<std::mutex> lock(mu);
      auto it = members.find(h->device_id);
      if (it != members.end()) it->second.last_seen = now;
    } else if (auto* b = std::get_if<wire::Bye>(&*msg)) {
      std::lock_guard<std::mutex> lock(mu);
      auto it = members.find(b->device_id);
      if (it != members.end()) {
        LogInfo("rendezvous: device " + it->second.info.hello.name + " (" + Short(b->device_id) + ") left");
        MarkDirty(it->second.info.room);
        endpoint->Forget(it->second.info.address);
        members.erase(it);
      }
    } else {
      // Ring traffic never comes here; whatever did is dropped without being looked at.
      LogWarning("rendezvous: dropped a frame that is not join, heartbeat or bye");
    }
  }

  void ExpireDead() {
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = members.begin(); it != members.end();) {
      if (std::chrono::duration<double>(now - it->second.last_seen).count() > options.dead_after_s) {
        LogWarning("rendezvous: lost device " + it->second.info.hello.name + " (" + Short(it->first) + "): no heartbeat for " +
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
      auto frame = endpoint->Receive(100);
      if (frame.ok() && frame->has_value()) Handle(**frame);
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
}

Result<std::unique_ptr<Rendezvous>> Rendezvous::Start(const RendezvousOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  DAISY_ASSIGN_OR_RETURN(impl->endpoint, Endpoint::Bind(options.host, options.port));
  impl->address = impl->endpoint->address();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Loop(); });
  return std::unique_ptr<Rendezvous>(new Rendezvous(std::move(impl)));
}

const std::string& Rendezvous::address() const { return impl_->address; }

Status Rendezvous::Approve(const std::string& id_prefix) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Member* found = nullptr;
  for (auto& [id, m] : impl_->members) {
    if (id.rfind(id_prefix, 0) == 0) {
      if (found) return InvalidArgument("'" + id_prefix + "' matches more than one device; type more of its id");
      found = &m;
    }
  }
  if (!found || id_prefix.empty()) return NotFound("no device with id '" + id_prefix + "' is waiting");
  found->info.approved = true;
  LogInfo("rendezvous: approved " + found->info.hello.name + " (" + Short(found->info.hello.device_id) + ")");
  impl_->MarkDirty(found->info.room);
  return Status::Ok();
}

std::vector<MemberInfo> Rendezvous::Members() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<MemberInfo> out;
  for (const auto& [id, m] : impl_->members) out.push_back(m.info);
  return out;
}

}  // namespace daisy::net
