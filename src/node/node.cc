// The native ring member loop: join, hello, then the stage (daisy/stage.h) serves the
// assignments and hops that arrive over ZeroMQ.
#include "daisy/node.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "daisy/log.h"
#include "daisy/net.h"
#include "daisy/ring.h"
#include "daisy/stage.h"
#include "text_view.h"

namespace daisy {

namespace {

using Clock = std::chrono::steady_clock;

// The native member loop: a RoomMember (ZeroMQ, CURVE, heartbeats from their own thread)
// around the StageCore every member that holds layers runs (daisy/stage.h).
class Node : public StageHost {
 public:
  explicit Node(const NodeOptions& o) : o_(o) {
    if (o.faults) std::fprintf(stderr, "node: TEST FAULT INJECTION: %s\n", o.faults->Describe().c_str());
  }

  Status Run() {
    // A --models-dir that is not a folder is a mistake of this device's user: say so now,
    // not when a head first names a folder.
    for (const auto& d : o_.models_dirs) {
      std::error_code ec;
      if (!std::filesystem::is_directory(d, ec)) return InvalidArgument("--models-dir " + d + ": no such folder");
    }
    RoomMember::Options mo;
    mo.role = o_.role;
    mo.name = o_.name;
    mo.rendezvous = o_.rendezvous;
    mo.room = o_.room;
    mo.server_key = o_.server_key;
    mo.admission = o_.admission;
    mo.bind_host = o_.bind_host;
    mo.port = o_.port;
    mo.advertise = o_.advertise;
    mo.no_listen = o_.no_listen;
    mo.capabilities = wire::kCapCompute;
    mo.budget = MemoryBudget(o_.max_memory);
    mo.stop = o_.stop;
    DAISY_ASSIGN_OR_RETURN(member_, RoomMember::Create(mo));
    const wire::Hello& hello = member_->hello();
    name_ = hello.name;
    member_->set_log_name("node " + name_);
    StageOptions so;
    so.name = name_;
    so.device_id = member_->id();
    so.keys = member_->keys();
    so.budget = hello.free_memory;
    so.cache_slots = o_.cache_slots;
    so.faults = o_.faults;
    stage_ = std::make_unique<StageCore>(std::move(so), *this);
    std::fprintf(
        stderr, "node %s (key fingerprint %s): %s backend, %.0f GEMMs/s, %.1f GB free; joining room '%s' at %s\n",
        name_.c_str(), net::Fingerprint(member_->keys().public_key).c_str(), hello.backend.c_str(), hello.gemms_per_s,
        static_cast<double>(hello.free_memory) / 1e9, o_.room.c_str(), o_.rendezvous.c_str());
    if (Status admitted = member_->Admit(); !admitted.ok()) {
      return admitted.code() == ErrorCode::kAborted ? Status::Ok() : admitted;
    }
    if (member_->relayed())
      std::fprintf(stderr,
                   "node %s: no inbox (--no-listen): every hop to and from this device goes through serve at %s, "
                   "boxed end to end\n",
                   name_.c_str(), o_.rendezvous.substr(6).c_str());
    while (!(o_.stop && o_.stop->load())) {
      if (member_->RendezvousLost()) {
        // The rendezvous stopped taking heartbeats: it is gone, or it restarted and no longer
        // admits this key. Ask to be admitted again (same server key); the layers stay.
        BreakTextLine();
        std::fprintf(
            stderr,
            "node %s: lost the rendezvous at %s (no heartbeat got through for %.0f s); asking to be admitted again\n",
            name_.c_str(), o_.rendezvous.c_str(), net::kRendezvousLostSeconds);
        if (Status again = member_->Readmit(); !again.ok()) {
          if (again.code() == ErrorCode::kAborted) break;
          return again;
        }
        joined_ = false;
      }
      stage_->Tick();
      auto in =
          member_->Receive(100, stage_->hidden(), [&](const std::string& sender) { return stage_->Expects(sender); });
      if (!in.ok()) return in.status();
      if (!in->has_value()) continue;
      Incoming& frame = **in;
      // Only the head's or upstream's undecodable frames get here (Receive's `expects`).
      if (!frame.message.ok()) {
        stage_->Refused(frame.sender, frame.message.status());
        continue;
      }
      if (const auto* p = std::get_if<wire::Peers>(&*frame.message)) {
        // RoomMember applied the list: only the room's members may reach this inbox now.
        if (!joined_) {
          BreakTextLine();
          std::fprintf(stderr, "node %s: in room '%s' with %zu device(s)\n", name_.c_str(), p->room.c_str(),
                       p->peers.size());
        }
        joined_ = true;
      }
      stage_->Handle(frame.sender, *frame.message);
    }
    member_->Leave();
    return Status::Ok();
  }

  // ---- StageHost ----
  Status Send(const std::string& address, const wire::Message& message, int timeout_ms) override {
    return member_->Send(address, message, timeout_ms);
  }
  std::vector<wire::Peer> Peers() const override { return member_->Peers(); }
  std::string KeyOf(const std::string& device_id) const override { return member_->KeyOf(device_id); }
  void Dropped(const std::string& sender, const std::string& what) override { member_->Dropped(sender, what); }
  void Reach(const std::string& address, const std::string& key) override {
    if (key.empty()) return;
    member_->endpoint().Allow(key);
    if (!address.empty()) member_->endpoint().SetPeerKey(address, key);
  }
  Result<std::unique_ptr<ModelSource>> OpenModel(const std::string& model_id, const std::string& revision) override {
    std::string src = model_id;
    if (src[0] != '/') {
      DAISY_ASSIGN_OR_RETURN(HubRef ref, ParseHubRef(model_id + "@" + revision));
      src = ref.repo + "@" + ref.revision;
    } else {
      // A head may name any path: open only what this device's user allowed.
      DAISY_RETURN_IF_ERROR(AllowedModelFolder(src, o_.models_dirs).status());
    }
    return OpenModelSource(src, o_.hub);
  }
  void Log(StageLog level, const std::string& line) override {
    BreakTextLine();
    switch (level) {
      case StageLog::kSay:
        std::fprintf(stderr, "node %s: %s\n", name_.c_str(), line.c_str());
        break;
      case StageLog::kInfo:
        LogInfo("node " + name_ + ": " + line);
        break;
      case StageLog::kWarning:
        LogWarning("node " + name_ + ": " + line);
        break;
    }
  }
  void LoadStarted() override { load_started_ = Clock::now(); }
  void LoadProgress(const TransferProgress& p) override {
    // After two seconds, a percentage on the terminal, about once a second.
    if (Clock::now() - load_started_ > std::chrono::seconds(2) && p.bytes_total > 0) {
      std::fprintf(stderr, "\rnode %s: %5.1f%% of %.1f MB", name_.c_str(),
                   100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total),
                   static_cast<double>(p.bytes_total) / 1e6);
      load_started_ = Clock::now() - std::chrono::seconds(1);
    }
  }
  void OnText(const std::string& sender_key, const std::string& head_id, const std::string& head_name,
              const wire::Text& t) override {
    if (o_.on_text) o_.on_text(head_id, head_name, t);
    if (o_.print_tokens) view_.On(sender_key, "head '" + head_name + "' (" + net::Fingerprint(sender_key) + ")", t);
  }

 private:
  // Before a line on this device's log: the room's text in progress ends its line first.
  void BreakTextLine() { view_.BreakLine(); }

  const NodeOptions& o_;
  std::unique_ptr<RoomMember> member_;  // keys, inbox, hello, heartbeats, the room's list
  std::unique_ptr<StageCore> stage_;    // the slice, its caches and the turn's hops
  std::string name_;                    // this device's name, as its hello gives it
  bool joined_ = false;
  Clock::time_point load_started_ = Clock::now();
  // The room's turns on this device's terminal (stdout).
  node::TextView view_{[](std::string_view bytes) {
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    std::fflush(stdout);
  }};
};

}  // namespace

Result<std::string> AllowedModelFolder(const std::string& path, const std::vector<std::string>& allowed_dirs) {
  namespace fs = std::filesystem;
  // The allowed folder list stays on this device: the error (which goes to the head) names
  // only the path the head sent.
  const std::string refused = "refusing the local model folder " + path +
                              ": it is not under a folder this device allows (daisychain node --models-dir DIR); "
                              "only Hub repo ids otherwise";
  std::error_code ec;
  // Resolved before the check: "/allowed/../etc" and a symlink out of /allowed are where
  // they lead, not where their names say.
  const fs::path real = fs::canonical(path, ec);
  if (ec) return PermissionDenied(refused);
  for (const auto& d : allowed_dirs) {
    const fs::path dir = fs::canonical(d, ec);
    if (ec) continue;
    // Whole components: /models does not allow /models-other.
    if (std::mismatch(dir.begin(), dir.end(), real.begin(), real.end()).first == dir.end()) return real.string();
  }
  return PermissionDenied(refused);
}

Status RunNode(const NodeOptions& options) {
  Node node(options);
  return node.Run();
}

}  // namespace daisy
