// The tab's ring member: the link in, the StageCore, the link out, events for the page.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

#include "daisy/log.h"
#include "daisy/tab.h"

namespace daisy::tab {

using Json = nlohmann::json;

namespace {

std::string Hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

const char* TextKindName(wire::TextKind k) {
  switch (k) {
    case wire::TextKind::kBegin:
      return "begin";
    case wire::TextKind::kPiece:
      return "piece";
    case wire::TextKind::kRetract:
      return "retract";
    case wire::TextKind::kEnd:
      return "end";
    case wire::TextKind::kFailed:
      return "failed";
  }
  return "unknown";
}

}  // namespace

TabMember::TabMember(TabOptions options) : o_(std::move(options)), link_(o_.keys, o_.server_key), boxes_(o_.keys) {}

TabMember::~TabMember() = default;

Result<std::unique_ptr<TabMember>> TabMember::Create(TabOptions options) {
  if (!net::IsPublicKey(options.keys.public_key) || !net::IsPublicKey(options.keys.secret_key))
    return InvalidArgument("a tab needs a key pair (40 characters of Z85 each)");
  if (!options.open_model) return InvalidArgument("Bug: a tab without a way to open models");
  std::unique_ptr<TabMember> t(new TabMember(std::move(options)));
  const std::string id = net::KeyId(t->o_.keys.public_key);
  const std::string name = t->o_.name.empty() ? "browser-" + id.substr(0, 4) : t->o_.name;
  t->hello_ = MeasureHello(id, name, wire::kCapCompute | wire::kCapRelayed, t->o_.budget);
  t->address_ = std::string(wire::kRelayScheme) + id;
  StageOptions so;
  so.name = t->hello_.name;
  so.device_id = id;
  so.keys = t->o_.keys;
  so.budget = t->o_.budget;
  so.cache_slots = t->o_.cache_slots;
  so.faults = t->o_.faults;
  t->stage_ = std::make_unique<StageCore>(std::move(so), *t);
  t->Event(Json{{"event", "hello"},
                {"id", id},
                {"fingerprint", net::Fingerprint(t->o_.keys.public_key)},
                {"name", t->hello_.name},
                {"backend", t->hello_.backend},
                {"gemms_per_s", t->hello_.gemms_per_s},
                {"probe_hash", Hex64(t->hello_.probe_hash)},
                {"budget", t->hello_.free_memory}}
               .dump());
  t->StatusEvent("linking", "waiting for serve's link");
  return t;
}

Status TabMember::Receive(std::span<const uint8_t> message) {
  if (!link_.server_key().empty() && !link_.up()) {
    Status st = link_.Confirm(message);
    if (!st.ok()) {
      Event(Json{{"event", "error"}, {"message", st.message()}}.dump());
      return st;
    }
    StatusEvent("linked",
                "linked to serve (key " + net::Fingerprint(link_.server_key()) + "); joining room '" + o_.room + "'");
    joined_at_ = Clock::now();
    if (left_) return Status::Ok();  // hidden before the link was up: Rejoin joins
    return SendUp(wire::Message(wire::Join{o_.room, address_, hello_}));
  }
  if (!link_.up()) {
    auto answer = link_.Answer(message);
    if (!answer.ok()) {
      Event(Json{{"event", "error"}, {"message", answer.status().message()}}.dump());
      return answer.status();
    }
    outgoing_.push_back(std::move(*answer));
    return Status::Ok();
  }
  auto inner = link_.Open(message);
  if (!inner.ok()) {
    Event(Json{{"event", "error"}, {"message", "serve's link: " + inner.status().message()}}.dump());
    return inner.status();
  }
  // Out of the room (the screen is off): a peer list or a late envelope on its way when
  // the bye left is opened, so the link stays sound, and dropped.
  if (left_) return Status::Ok();
  OnInner(std::move(*inner));
  return Status::Ok();
}

void TabMember::OnInner(std::vector<uint8_t> inner) {
  auto m = wire::Decode(inner, stage_->hidden());
  if (!m.ok()) return Dropped(link_.server_key(), "a malformed frame (" + m.status().message() + ")");
  if (auto* env = std::get_if<wire::Relay>(&*m)) {
    // From a member through serve's relay: only the member the envelope names could have
    // boxed it for this tab.
    const std::string key = KeyOf(env->from);
    if (key.empty()) return Dropped(link_.server_key(), "a relayed frame from " + env->from + ", not in the room");
    auto frame = boxes_.Open(key, *env);
    if (!frame.ok()) return Dropped(key, frame.status().message());
    auto msg = wire::Decode(*frame, stage_->hidden());
    if (!msg.ok()) {
      if (stage_->Expects(key)) return stage_->Refused(key, msg.status());
      return Dropped(key, "a malformed frame (" + msg.status().message() + ")");
    }
    if (std::holds_alternative<wire::Relay>(*msg)) return Dropped(key, "an envelope inside an envelope");
    if (std::holds_alternative<wire::Peers>(*msg)) return Dropped(key, "a peer list");
    return stage_->Handle(key, *msg);
  }
  // From the rendezvous itself: its peer lists and errors, nothing else.
  if (auto* p = std::get_if<wire::Peers>(&*m)) {
    peers_ = p->peers;
    bool listed = false;
    for (const auto& peer : peers_) listed = listed || peer.hello.device_id == id();
    if (listed && !in_room_)
      StatusEvent("in_room",
                  "in room '" + p->room + "' with " + std::to_string(peers_.size()) + " device(s); waiting for a head");
    in_room_ = in_room_ || listed;
    Json members = Json::array();
    for (const auto& peer : peers_)
      members.push_back(Json{{"id", peer.hello.device_id},
                             {"name", peer.hello.name},
                             {"head", (peer.hello.capabilities & wire::kCapHead) != 0},
                             {"probe_hash", Hex64(peer.hello.probe_hash)}});
    Event(Json{{"event", "peers"}, {"room", p->room}, {"members", members}}.dump());
    return stage_->Handle(link_.server_key(), *m);
  }
  if (auto* e = std::get_if<wire::ErrorMsg>(&*m)) {
    Event(Json{{"event", "error"}, {"message", "serve says: " + e->message}}.dump());
    return;
  }
  Dropped(link_.server_key(), std::string("a ") + std::string(MessageName(*m)) + " from serve itself");
}

std::vector<std::vector<uint8_t>> TabMember::TakeOutgoing() {
  return std::exchange(outgoing_, {});
}

std::vector<std::string> TabMember::TakeEvents() {
  return std::exchange(events_, {});
}

void TabMember::Tick() {
  if (left_ || !link_.up()) return;
  stage_->Tick();
  // The join's answer is a peer list naming this tab; none within a few seconds (a serve
  // that restarted its room): ask again, as a native member's pulse does.
  if (!in_room_ && Clock::now() - joined_at_ > std::chrono::seconds(5)) {
    joined_at_ = Clock::now();
    (void)SendUp(wire::Message(wire::Join{o_.room, address_, hello_}));
  }
}

void TabMember::Leave() {
  if (left_) return;
  if (link_.up()) (void)SendUp(wire::Message(wire::Bye{id()}));
  left_ = true;
  in_room_ = false;
  StatusEvent("left", "left the room");
}

void TabMember::Rejoin() {
  if (!left_) return;
  left_ = false;
  joined_at_ = Clock::now();
  if (!link_.up()) return;  // the handshake's end sends the join
  StatusEvent("linked", "back: joining room '" + o_.room + "' again");
  (void)SendUp(wire::Message(wire::Join{o_.room, address_, hello_}));
}

Status TabMember::SendUp(const wire::Message& inner) {
  DAISY_ASSIGN_OR_RETURN(std::vector<uint8_t> message, link_.Seal(wire::Encode(inner)));
  // Bounded: a page that stopped sending has a closed link, and the tab is gone anyway.
  if (outgoing_.size() >= 4096) return ResourceExhausted("the link's outgoing queue is full");
  outgoing_.push_back(std::move(message));
  return Status::Ok();
}

Status TabMember::Send(const std::string& address, const wire::Message& message, int /*timeout_ms*/) {
  if (!link_.up()) return Unavailable("the link to serve is not up");
  // Every member is reached through serve's relay, boxed for its key (the room's list, or
  // what an assignment named).
  std::string key;
  for (const auto& p : peers_)
    if (p.address == address) key = p.public_key;
  for (const auto& [a, k] : reach_)
    if (key.empty() && a == address) key = k;
  if (key.empty())
    return FailedPrecondition("no member of the room has the address " + address + ": nothing to relay to");
  DAISY_ASSIGN_OR_RETURN(wire::Relay envelope, boxes_.Seal(key, wire::Encode(message)));
  return SendUp(wire::Message(std::move(envelope)));
}

std::string TabMember::KeyOf(const std::string& device_id) const {
  for (const auto& p : peers_)
    if (p.hello.device_id == device_id) return p.public_key;
  return {};
}

void TabMember::Dropped(const std::string& sender, const std::string& what) {
  ++dropped_;
  if (Clock::now() - last_drop_log_ < std::chrono::seconds(1)) return;
  last_drop_log_ = Clock::now();
  Log(StageLog::kWarning, "dropped " + what + " from " +
                              (sender.empty() ? std::string("an unknown sender") : "key " + sender.substr(0, 8)) +
                              " (" + std::to_string(dropped_) + " dropped so far)");
}

void TabMember::Reach(const std::string& address, const std::string& key) {
  if (address.empty() || key.empty()) return;
  for (auto& [a, k] : reach_)
    if (a == address) {
      k = key;
      return;
    }
  if (reach_.size() >= 64) reach_.erase(reach_.begin());  // bounded: plans name few stages
  reach_.emplace_back(address, key);
}

Result<std::unique_ptr<ModelSource>> TabMember::OpenModel(const std::string& model_id, const std::string& revision) {
  return o_.open_model(model_id, revision);
}

void TabMember::Log(StageLog level, const std::string& line) {
  const char* name = level == StageLog::kWarning ? "warning" : (level == StageLog::kInfo ? "info" : "say");
  Event(Json{{"event", "log"}, {"level", name}, {"line", Redact(line)}}.dump());
  if (stage_ && stage_->holds_layers() && line.rfind("holding layers", 0) == 0) {
    Event(Json{{"event", "slice"},
               {"model", stage_->model_id()},
               {"first", stage_->first_layer()},
               {"end", stage_->end_layer()},
               {"bytes", stage_->resident_bytes()}}
              .dump());
    StatusEvent("holding", line);
  }
}

void TabMember::LoadStarted() {
  last_progress_event_ = Clock::now() - std::chrono::seconds(1);
  StatusEvent("fetching", "fetching its layers");
}

void TabMember::LoadProgress(const TransferProgress& p) {
  // At most a few a second: the page redraws a bar, not a log.
  if (Clock::now() - last_progress_event_ < std::chrono::milliseconds(200) && p.bytes_done != p.bytes_total) return;
  last_progress_event_ = Clock::now();
  Event(Json{{"event", "progress"}, {"done", p.bytes_done}, {"total", p.bytes_total}}.dump());
}

void TabMember::OnText(const std::string& /*sender_key*/, const std::string& head_id, const std::string& head_name,
                       const wire::Text& t) {
  Event(Json{{"event", "text"},
             {"head_id", head_id},
             {"head_name", head_name},
             {"stream", t.stream},
             {"kind", TextKindName(t.kind)},
             {"index", t.index},
             {"token_id", t.token_id},
             {"text", t.text}}
            .dump(-1, ' ', false, Json::error_handler_t::replace));
}

void TabMember::Event(const std::string& json) {
  if (events_.size() >= 4096) events_.erase(events_.begin());  // bounded: a page that never reads loses the oldest
  events_.push_back(json);
}

void TabMember::StatusEvent(const std::string& state, const std::string& line) {
  Event(Json{{"event", "status"}, {"state", state}, {"line", line}}.dump());
}

}  // namespace daisy::tab
