// The room member: what a head and a node share of being in a room.
#include <cstdio>
#include <thread>
#include <utility>

#include "daisy/log.h"
#include "daisy/ring.h"

namespace daisy {

using Clock = std::chrono::steady_clock;

Result<std::unique_ptr<RoomMember>> RoomMember::Create(const Options& options) {
  std::unique_ptr<RoomMember> m(new RoomMember());
  m->o_ = options;
  DAISY_ASSIGN_OR_RETURN(m->keys_, DeviceKeys(DeviceHome(), options.role));
  const std::string id = net::KeyId(m->keys_.public_key);
  m->boxes_ = std::make_shared<net::PeerBoxes>(m->keys_);
  uint32_t capabilities = options.capabilities;
  if (options.no_listen) {
    // Nothing to bind: the relay link is made once the host has admitted this key.
    if (!options.advertise.empty()) return InvalidArgument("--no-listen and --advertise exclude each other");
    DAISY_ASSIGN_OR_RETURN(m->ep_, net::Endpoint::SendOnly(m->keys_));
    m->address_ = std::string(wire::kRelayScheme) + id;
    capabilities |= wire::kCapRelayed;
  } else {
    DAISY_ASSIGN_OR_RETURN(m->ep_, net::Endpoint::Bind(options.bind_host, options.port, m->keys_));
    if (!options.advertise.empty()) {
      DAISY_ASSIGN_OR_RETURN(m->address_, net::JoinAddress(options.advertise));
    } else {
      m->address_ = m->ep_->address();
    }
  }
  m->hello_ = MeasureHello(id, options.name, capabilities, options.budget);
  return m;
}

RoomMember::~RoomMember() {
  Leave();
}

JoinOptions RoomMember::Join() const {
  JoinOptions jo;
  jo.rendezvous = o_.rendezvous;
  jo.room = o_.room;
  jo.name = hello_.name;
  jo.server_fingerprint = o_.server_key;
  jo.home = DeviceHome();
  jo.admission = o_.admission;
  jo.stop = o_.stop;
  jo.unreachable_timeout_s = o_.unreachable_timeout_s;
  return jo;
}

// The host approves this device's key first (over HTTP, or in this process); only then does
// the rendezvous admit its ZeroMQ connection.
Status RoomMember::Admit() {
  if (admitted()) return Status::Ok();
  DAISY_ASSIGN_OR_RETURN(std::string key, AwaitAdmission(Join(), keys_));
  server_key_ = std::move(key);
  ep_->SetPeerKey(o_.rendezvous, server_key_);
  ep_->Allow(server_key_);
  if (o_.no_listen) DAISY_RETURN_IF_ERROR(ConnectRelay());
  return StartPulse();
}

Status RoomMember::ConnectRelay() {
  DAISY_RETURN_IF_ERROR(ep_->ConnectRelay(o_.rendezvous, server_key_));
  // The first frame waits for the link (ZMQ_IMMEDIATE): a serve without a relay, or one that
  // does not admit this key, never completes it.
  last_attach_ = Clock::now();
  const int wait_ms = static_cast<int>(o_.relay_connect_s * 1000);
  Status up = ep_->SendRelay(wire::Encode(wire::Message(wire::Heartbeat{0, id()})), wait_ms);
  if (!up.ok())
    return Unavailable("--no-listen: serve at " + o_.rendezvous.substr(6) + " admitted this device but its relay " +
                       "did not take the connection within " + std::to_string(wait_ms / 1000) +
                       " s (a serve without a relay, or something in front of it that blocks the relay)");
  return Status::Ok();
}

void RoomMember::AttachToRelay() {
  if (!ep_->relayed()) return;
  if (Clock::now() - last_attach_ < std::chrono::seconds(1)) return;
  last_attach_ = Clock::now();
  (void)ep_->SendRelay(wire::Encode(wire::Message(wire::Heartbeat{0, id()})), 200);
}

Status RoomMember::Send(const std::string& address, const wire::Message& message, int timeout_ms) {
  if (!wire::IsRelayAddress(address) && !o_.no_listen) return ep_->Send(address, message, timeout_ms);
  // Through the relay: boxed for the member at that address, whose key the room gives.
  std::string key;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& p : peers_)
      if (p.address == address) key = p.public_key;
  }
  if (key.empty())
    return FailedPrecondition("no member of the room has the address " + address + ": nothing to relay to");
  DAISY_ASSIGN_OR_RETURN(wire::Relay envelope, boxes_->Seal(key, wire::Encode(message)));
  const std::vector<uint8_t> frame = wire::Encode(wire::Message(std::move(envelope)));
  if (o_.no_listen) {
    AttachToRelay();
    return ep_->SendRelay(frame, timeout_ms);
  }
  return ep_->Send(o_.rendezvous, frame, timeout_ms);  // the rendezvous hands it to its relay
}

std::optional<std::pair<std::string, std::vector<uint8_t>>> RoomMember::Unbox(const wire::Relay& envelope) {
  const std::string key = KeyOf(envelope.from);
  if (key.empty()) {
    Dropped(server_key_, "a relayed frame from " + envelope.from + ", which is not in the room");
    return std::nullopt;
  }
  auto inner = boxes_->Open(key, envelope);
  if (!inner.ok()) {
    Dropped(key, inner.status().message());
    return std::nullopt;
  }
  return std::make_pair(key, std::move(*inner));
}

// Heartbeats and the join come from a thread of their own: loading a slice, a long prefill
// or a verify run never gets this device dropped from the room.
Status RoomMember::StartPulse() {
  net::PulseOptions po;
  po.rendezvous = o_.rendezvous;
  po.server_key = server_key_;
  po.keys = keys_;
  po.device_id = id();
  po.join_frame = wire::Encode(wire::Message(wire::Join{o_.room, address_, hello_}));
  DAISY_ASSIGN_OR_RETURN(pulse_, net::Pulse::Start(po));
  return Status::Ok();
}

bool RoomMember::RendezvousLost() const {
  return pulse_ && pulse_->SilentFor() > net::kRendezvousLostSeconds;
}

Status RoomMember::Readmit() {
  DAISY_ASSIGN_OR_RETURN(std::string again, AwaitAdmission(Join(), keys_));
  if (again != server_key_)
    return FailedPrecondition("the rendezvous at " + o_.rendezvous + " came back with another key");
  // A relay link refused while serve did not know this key yet is never retried: a new one.
  if (o_.no_listen) DAISY_RETURN_IF_ERROR(ConnectRelay());
  // Give the pulse a few beats to get through before judging it again.
  for (int i = 0; i < 30 && pulse_ && pulse_->SilentFor() > 1.5 && !(o_.stop && o_.stop->load()); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return Status::Ok();
}

void RoomMember::SendJoin(int timeout_ms) {
  (void)ep_->Send(o_.rendezvous, wire::Message(wire::Join{o_.room, address_, hello_}), timeout_ms);
}

void RoomMember::Leave() {
  if (!pulse_) return;
  pulse_.reset();                                                       // no join after the bye
  (void)ep_->Send(o_.rendezvous, wire::Message(wire::Bye{id()}), 300);  // leave the room now
}

Result<std::optional<Incoming>> RoomMember::Receive(int timeout_ms, int hidden,
                                                    const std::function<bool(const std::string&)>& expects) {
  AttachToRelay();
  DAISY_ASSIGN_OR_RETURN(auto frame, ep_->ReceiveFrame(timeout_ms));
  if (!frame) return std::optional<Incoming>();
  std::string sender = std::move(frame->sender_key);
  auto m = wire::Decode(frame->bytes, hidden);
  bool from_server = !server_key_.empty() && sender == server_key_;
  if (from_server && m.ok() && std::holds_alternative<wire::Relay>(*m)) {
    // Relayed by serve: the frame inside is from the member the envelope names, and only it
    // could have boxed it for this device.
    auto inner = Unbox(std::get<wire::Relay>(*m));
    if (!inner) return std::optional<Incoming>();
    sender = std::move(inner->first);
    m = wire::Decode(inner->second, hidden);
    from_server = false;
    if (m.ok() && std::holds_alternative<wire::Relay>(*m)) {
      Dropped(sender, "an envelope inside an envelope");
      return std::optional<Incoming>();
    }
  }
  if (!m.ok()) {
    if (!from_server && expects(sender)) return std::optional<Incoming>(Incoming{std::move(sender), m.status()});
    Dropped(sender, "a malformed frame (" + m.status().message() + ")");
    return std::optional<Incoming>();
  }
  // Peer lists come only from the rendezvous, and the rendezvous sends nothing else.
  if (std::holds_alternative<wire::Peers>(*m) != from_server) {
    Dropped(sender, std::string("a ") + (from_server ? "frame other than a peer list" : "peer list"));
    return std::optional<Incoming>();
  }
  if (auto* p = std::get_if<wire::Peers>(&*m)) {
    // Only the room's members (and the rendezvous) may reach this inbox from now on.
    net::ApplyPeerList(*ep_, server_key_, *p);
    std::lock_guard<std::mutex> lock(mu_);
    peers_ = p->peers;
    seen_peers_ = true;
  }
  return std::optional<Incoming>(Incoming{std::move(sender), std::move(*m)});
}

void RoomMember::Dropped(const std::string& sender, const std::string& what) {
  ++dropped_;
  if (Clock::now() - last_drop_log_ < std::chrono::seconds(1)) return;
  last_drop_log_ = Clock::now();
  LogWarning(o_.log_name + ": dropped " + what + " from " +
             (sender.empty() ? std::string("an unknown sender") : "key " + sender.substr(0, 8)) + " (" +
             std::to_string(dropped_) + " dropped so far)");
}

std::vector<wire::Peer> RoomMember::Peers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peers_;
}

std::string RoomMember::KeyOf(const std::string& device_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& p : peers_)
    if (p.hello.device_id == device_id) return p.public_key;
  return {};
}

bool RoomMember::Has(const std::string& device_id) const {
  return !KeyOf(device_id).empty();
}

bool RoomMember::seen_peers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_peers_;
}

}  // namespace daisy
