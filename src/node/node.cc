// The ring member loop: join, hello, assignment, fetch own layers, ready, serve hops.
#include "daisy/node.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "daisy/forward.h"
#include "daisy/log.h"
#include "daisy/memory.h"
#include "daisy/model.h"
#include "daisy/net.h"
#include "daisy/plan.h"
#include "daisy/ring.h"
#include "text_view.h"

namespace daisy {

namespace {

using Clock = std::chrono::steady_clock;

// What a node holds for one assignment.
struct Slice {
  std::string model_id, revision;
  uint32_t model_hash = 0;
  uint64_t spec_hash = 0;
  int first = 0, end = 0, ctx = 0;
  std::unique_ptr<ModelSource> source;
  std::unique_ptr<ModelInfo> info;
  std::unique_ptr<StageWeights> weights;
};

// One conversation's KV on this stage (the prefix cache).
struct CacheSlot {
  uint64_t key = 0;
  std::unique_ptr<KvCache> kv;
  std::optional<uint64_t> tag;  // hash of the ids in kv, as the head's last done said
  uint64_t last_used = 0;
};

class Node {
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
      ForgetHeadIfGone();
      auto in = member_->Receive(100, slice_.weights ? slice_.info->spec.hidden : 0, [&](const std::string& sender) {
        return (!head_key_.empty() && sender == head_key_) || (!upstream_key_.empty() && sender == upstream_key_);
      });
      if (!in.ok()) return in.status();
      if (!in->has_value()) continue;
      Handle(**in);
    }
    member_->Leave();
    return Status::Ok();
  }

 private:
  // Who may send what: the rendezvous its peer lists; a head (the key the room lists for
  // the device an assignment names as stage 0) its assignment; the head of the turn its
  // tokens, done, audit requests and errors; the stage before this one the activations.
  // Anything else, and garbage from anyone but those two, is dropped without a word to
  // the head: a member of the room that floods or sends junk disturbs nothing.
  void Handle(Incoming& in) {
    const std::string& sender = in.sender;
    last_sender_ = sender;
    const bool from_head = !head_key_.empty() && sender == head_key_;
    const bool from_upstream = !upstream_key_.empty() && sender == upstream_key_;
    if (!in.message.ok()) {  // only the head's or upstream's get here (Receive's `expects`)
      BreakTextLine();
      LogWarning("node: refused a frame: " + in.message.status().message());
      (void)member_->Send(head_address_,
                          wire::Message(wire::ErrorMsg{wire::ErrorKind::kFrame,
                                                       name_ + " refused a frame: " + in.message.status().message()}),
                          500);
      return;
    }
    wire::Message& msg = *in.message;
    bool allowed = false;
    std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, wire::Peers>) {
            allowed = true;  // Receive took it from the rendezvous alone
          } else if constexpr (std::is_same_v<T, wire::Assignment>) {
            allowed = !m.stages.empty() && member_->KeyOf(m.stages[0].device_id) == sender;
          } else if constexpr (std::is_same_v<T, wire::Activation> || std::is_same_v<T, wire::HopReceipt>) {
            allowed = from_upstream;
          } else if constexpr (std::is_same_v<T, wire::Text>) {
            // The room's turns: from any head of the room (the rendezvous lists only approved
            // members), whether or not this device holds layers of the turn.
            allowed = from_head || IsHead(sender);
          } else if constexpr (std::is_same_v<T, wire::Token> || std::is_same_v<T, wire::Done> ||
                               std::is_same_v<T, wire::AuditRequest> || std::is_same_v<T, wire::ErrorMsg>) {
            allowed = from_head;
          }
        },
        msg);
    if (!allowed) return member_->Dropped(sender, "a " + std::string(MessageName(msg)) + " it has no business sending");
    std::visit([&](auto& m) { On(m); }, msg);
  }

  bool IsHead(const std::string& key) const {
    for (const auto& p : member_->Peers())
      if (p.public_key == key) return (p.hello.capabilities & wire::kCapHead) != 0;
    return false;
  }
  // Before a line on this device's log: the room's text in progress ends its line first.
  void BreakTextLine() { view_.BreakLine(); }

  void On(wire::Peers& p) {
    // RoomMember applied the list: only the room's members may reach this inbox now.
    if (!joined_) {
      BreakTextLine();
      std::fprintf(stderr, "node %s: in room '%s' with %zu device(s)\n", name_.c_str(), p.room.c_str(), p.peers.size());
    }
    joined_ = true;
    bool head_here = head_id_.empty();
    for (const auto& peer : p.peers) head_here = head_here || peer.hello.device_id == head_id_;
    if (head_here) {
      head_missing_since_.reset();
    } else {
      // Lists from the rendezvous and frames from a head travel on different connections, so
      // a list from before a head (re)joined can arrive after its assignment. The head is
      // taken as gone only when no later list brings it back (ForgetHeadIfGone), and until then its
      // frames are still admitted.
      if (!head_missing_since_) head_missing_since_ = Clock::now();
      member_->endpoint().Allow(head_key_);
      member_->endpoint().SetPeerKey(head_address_, head_key_);
    }
  }

  // The head of the assigned turn has been missing from the room's lists for a while: it
  // left (or was dropped). The ring is free for the next head; the layers stay.
  void ForgetHeadIfGone() {
    if (!head_missing_since_ || Clock::now() - *head_missing_since_ < std::chrono::seconds(3)) return;
    head_missing_since_.reset();
    BreakTextLine();
    std::fprintf(stderr, "node %s: the head left; keeping my layers for the next turn\n", name_.c_str());
    busy_head_.clear();
    head_id_.clear();
    head_address_.clear();
    head_key_.clear();
    upstream_key_.clear();
    seq_ = -1;
  }

  void On(wire::Assignment& a) {
    // One turn owns the ring: another head's assignment waits until this turn is done.
    if (!busy_head_.empty() && busy_head_ != a.stages[0].device_id) {
      (void)member_->Send(
          a.stages[0].address,
          wire::Message(wire::ErrorMsg{wire::ErrorKind::kBusy, "busy: " + name_ + " is serving another head's turn"}),
          1000);
      return;
    }
    // The sender becomes this device's head only once its assignment is accepted.
    const std::string old_id = std::exchange(head_id_, a.stages[0].device_id);
    const std::string old_address = std::exchange(head_address_, a.stages[0].address);
    const std::string old_key =
        std::exchange(head_key_, member_->KeyOf(head_id_));  // Handle checked the sender holds it
    Status st = Assign(a);
    if (!st.ok()) {
      BreakTextLine();
      std::fprintf(stderr, "node %s: assignment refused: %s\n", name_.c_str(), Redact(st.message()).c_str());
      (void)member_->Send(
          a.stages[0].address,
          wire::Message(wire::ErrorMsg{wire::ErrorKind::kAssignment, name_ + ": " + Redact(st.message())}), 1000);
      head_id_ = old_id;
      head_address_ = old_address;
      head_key_ = old_key;
      return;
    }
    busy_head_ = head_id_;
    // The addresses the plan gives (the head's, the next stage's) with the keys the room
    // lists for those devices: a head that rejoined at a new address is reachable even
    // before the peer list that shows it arrives. CURVE still proves who listens there.
    for (const auto& st : a.stages)
      if (auto k = member_->KeyOf(st.device_id); !k.empty()) member_->endpoint().SetPeerKey(st.address, k);
    Status sent = member_->Send(
        head_address_, wire::Message(wire::Ready{a.your_stage, slice_.weights->Bytes(), kept_, PeakRssBytes()}), 2000);
    if (!sent.ok()) {
      BreakTextLine();
      LogWarning("node " + name_ + ": could not tell the head it is ready: " + sent.message());
    }
  }

  // The assignment's cache: the conversation's slot, its first `keep` positions kept only
  // when its tag is the one the head expects.
  void SelectCache(const wire::Assignment& a) {
    const ModelSpec& spec = slice_.info->spec;
    CacheSlot* slot = nullptr;
    for (auto& s : slots_)
      if (s.key == a.cache_key) slot = &s;
    if (!slot) {
      // A new conversation's cache: the least recently used ones make room, for the slot
      // count and for the memory budget (the plan counted one cache at this context; the
      // caches kept for other conversations must fit beside it, or they go).
      const uint64_t need = PlanModelOf(*slice_.info, a.ctx).Need(slice_.end - slice_.first, false);
      auto kept_bytes = [&] {
        uint64_t b = 0;
        for (const auto& s : slots_) b += s.kv->Bytes();
        return b;
      };
      while (!slots_.empty() && (static_cast<int>(slots_.size()) >= std::max(1, o_.cache_slots) ||
                                 need + kept_bytes() > member_->hello().free_memory)) {
        auto lru = std::min_element(slots_.begin(), slots_.end(),
                                    [](const CacheSlot& x, const CacheSlot& y) { return x.last_used < y.last_used; });
        slots_.erase(lru);
      }
      slots_.push_back(
          CacheSlot{a.cache_key, std::make_unique<KvCache>(spec, slice_.first, slice_.end, a.ctx), std::nullopt, 0});
      slot = &slots_.back();
    }
    slot->last_used = ++use_clock_;
    kept_ = (slot->tag && *slot->tag == a.keep_tag && slot->kv->length() >= a.keep) ? a.keep : 0;
    slot->kv->Truncate(kept_);
    slot->tag.reset();  // the cache changes from here; done files the new tag
    kv_ = slot->kv.get();
    cache_key_ = a.cache_key;
  }

  Status Assign(const wire::Assignment& a) {
    // The plan must cover the model exactly once with the head first (checked again once
    // the layer count is known), and the model id must be a repo id or a local path.
    Plan plan = PlanFromWire(a.stages);
    if (a.stages[static_cast<size_t>(a.your_stage)].device_id != member_->id())
      return InvalidArgument("the assignment's stage " + std::to_string(a.your_stage) + " is not this device");
    const bool same_model = slice_.info && slice_.model_id == a.model_id && slice_.revision == a.revision;
    if (!same_model) {
      slice_ = Slice{};
      slots_.clear();
      kv_ = nullptr;
      HubOptions hub = o_.hub;
      std::string src = a.model_id;
      if (src[0] != '/') {
        DAISY_ASSIGN_OR_RETURN(HubRef ref, ParseHubRef(a.model_id + "@" + a.revision));
        src = ref.repo + "@" + ref.revision;
      } else {
        // A head may name any path: open only what this device's user allowed.
        DAISY_RETURN_IF_ERROR(AllowedModelFolder(src, o_.models_dirs).status());
      }
      DAISY_ASSIGN_OR_RETURN(slice_.source, OpenModelSource(src, hub));
      DAISY_ASSIGN_OR_RETURN(ModelInfo info, LoadModelInfo(*slice_.source));
      slice_.info = std::make_unique<ModelInfo>(std::move(info));
      slice_.model_id = a.model_id;
      slice_.revision = a.revision;
      slice_.spec_hash = SpecHash(slice_.info->spec);
      slice_.model_hash = ModelHashOf(*slice_.source, slice_.info->index);
    }
    const ModelSpec& spec = slice_.info->spec;
    DAISY_RETURN_IF_ERROR(ValidateAssignment(plan, spec.n_layers, a.stages[0].device_id));
    if (slice_.spec_hash != a.spec_hash)
      return InvalidArgument("the head's model spec differs from the one this device derived from " + a.model_id);
    if (slice_.model_hash != a.model_hash)
      return InvalidArgument("model_hash mismatch: the head and this device read different files for " + a.model_id);
    DAISY_RETURN_IF_ERROR(CheckContext(spec, a.ctx));
    const auto& me = a.stages[static_cast<size_t>(a.your_stage)];
    if (!slice_.weights || slice_.first != me.first || slice_.end != me.end) {
      slice_.weights.reset();
      slots_.clear();
      kv_ = nullptr;
      // Refuse what this device cannot hold before fetching a byte of it (the head planned
      // with the budget from this device's hello, so this is a plan made elsewhere, or
      // older, or a budget lowered since).
      const uint64_t need = PlanModelOf(*slice_.info, a.ctx).Need(me.end - me.first, false);
      if (need > member_->hello().free_memory)
        return ResourceExhausted("layers [" + std::to_string(me.first) + ", " + std::to_string(me.end) + ") of " +
                                 a.model_id + " at context " + std::to_string(a.ctx) + " need " + FormatBytes(need) +
                                 " (int8 weights, KV cache and working memory) but this device's memory budget is " +
                                 FormatBytes(member_->hello().free_memory) + ": refused before any download");
      BreakTextLine();
      std::fprintf(stderr, "node %s: fetching layers [%d, %d) of %s\n", name_.c_str(), me.first, me.end,
                   a.model_id.c_str());
      auto started = Clock::now();
      auto last_progress = Clock::now() - std::chrono::seconds(1);
      ProgressFn progress = [&](const TransferProgress& p) {
        // Tell the head how far it is (the pulse keeps the heartbeats going meanwhile).
        if (Clock::now() - last_progress > std::chrono::milliseconds(250) || p.bytes_done == p.bytes_total) {
          last_progress = Clock::now();
          (void)member_->Send(
              head_address_,
              wire::Message(wire::Progress{a.turn, a.your_stage, std::min(p.bytes_done, p.bytes_total), p.bytes_total}),
              200);
        }
        if (Clock::now() - started > std::chrono::seconds(2) && p.bytes_total > 0) {
          std::fprintf(stderr, "\rnode %s: %5.1f%% of %.1f MB", name_.c_str(),
                       100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total),
                       static_cast<double>(p.bytes_total) / 1e6);
          started = Clock::now() - std::chrono::seconds(1);
        }
      };
      DAISY_ASSIGN_OR_RETURN(StageWeights w,
                             StageWeights::Load(*slice_.source, *slice_.info, me.first, me.end, false, progress));
      slice_.weights = std::make_unique<StageWeights>(std::move(w));
      slice_.first = me.first;
      slice_.end = me.end;
      BreakTextLine();
      std::fprintf(stderr, "node %s: holding layers [%d, %d): %.2f MB resident\n", name_.c_str(), me.first, me.end,
                   static_cast<double>(slice_.weights->Bytes()) / 1e6);
    }
    if (slice_.ctx != a.ctx) {
      slots_.clear();
      kv_ = nullptr;
      slice_.ctx = a.ctx;
    }
    SelectCache(a);
    // Activations come only from the stage before this one (the head, for stage 1).
    upstream_key_ = member_->KeyOf(a.stages[static_cast<size_t>(a.your_stage) - 1].device_id);
    stage_ = a.your_stage;
    plan_ = std::move(plan);
    seq_ = static_cast<int32_t>(a.turn);
    audit_ = a.audit;
    receipts_.clear();
    if (audit_) {
      DAISY_ASSIGN_OR_RETURN(audit_key_, net::AuditKey(member_->keys(), member_->KeyOf(a.stages[0].device_id)));
    }
    inputs_.clear();
    inputs_from_ = kept_;
    hops_ = 0;
    compute_seconds_ = 0;
    return Status::Ok();
  }

  void On(wire::Activation& a) {
    auto refuse = [&](const std::string& why, wire::ErrorKind code = wire::ErrorKind::kHop) {
      BreakTextLine();
      LogWarning("node " + name_ + ": refused a hop: " + why);
      if (!head_address_.empty())
        (void)member_->Send(head_address_, wire::Message(wire::ErrorMsg{code, name_ + " refused a hop: " + why}), 300);
    };
    if (!slice_.weights) return refuse("no layers assigned");
    if (a.model_hash != slice_.model_hash)
      return refuse("model_hash mismatch: this device holds a slice of another model");
    if (a.next != stage_)
      return refuse("the hop is for stage " + std::to_string(a.next) + ", this device is stage " +
                    std::to_string(stage_));
    if (a.seq != seq_ || !kv_) {
      // A late hop of an earlier turn (a stage that was stopped and resumed, a replayed
      // turn): not this turn's business, so the head of this turn is not told.
      BreakTextLine();
      LogInfo("node " + name_ + ": dropped a hop of turn " + std::to_string(a.seq) + ", not of the turn assigned");
      return;
    }
    const int hidden = slice_.info->spec.hidden;
    auto decoded = DecodeHop(a, hidden);
    if (!decoded.ok()) return refuse(decoded.status().message());
    HiddenStates h = std::move(*decoded);
    const int n = h.n_tokens();
    wire::Digest in_digest{};
    if (audit_) {
      // Keep this turn's inputs for an audit, in position order (a rewind drops the rest).
      const size_t at = static_cast<size_t>(std::max(0, a.token_index - inputs_from_)) * static_cast<size_t>(hidden);
      if (a.token_index < inputs_from_) return refuse("a hop before the turn's first position");
      if (at > inputs_.size()) return refuse("a hop leaves a gap in the turn's positions");
      inputs_.resize(at);
      inputs_.insert(inputs_.end(), h.values.begin(), h.values.end());
      in_digest = wire::RowsDigest(h.values);
    }
    const auto started = Clock::now();
    Status st = RunLayers(*slice_.weights, slice_.first, slice_.end, h, *kv_);
    if (!st.ok()) return refuse(st.message());
    compute_seconds_ += std::chrono::duration<double>(Clock::now() - started).count();
    ++hops_;
    if (o_.faults) o_.faults->OnHopOutput(h.values);  // tests only: a slow or lying stage
    const auto hop = Route(plan_, stage_);
    if (!hop.ok()) return refuse(hop.status().message());
    if (audit_ && !head_address_.empty()) {
      // The report to the head: what came in (with the sender's receipt for it) and what goes out.
      wire::HopDigest d{a.seq, stage_, a.token_index, n, in_digest, wire::RowsDigest(h.values), false, {}};
      if (stage_ >= 2) {
        auto r = receipts_.find(a.token_index);
        if (r != receipts_.end() && r->second.seq == a.seq && r->second.rows == n) {
          d.has_receipt = true;
          d.receipt = r->second;
        }
        receipts_.erase(receipts_.begin(), receipts_.upper_bound(a.token_index));
      }
      (void)member_->Send(head_address_, wire::Message(d), 500);
      if (o_.faults) o_.faults->AfterReport(h.values);  // tests only: a liar with an honest digest
      if (!hop->to_return) {
        // The receipt for what really goes out, MACed for the head: the next stage checks it
        // against the rows it receives and forwards it in its own report.
        wire::HopReceipt rc{a.seq, stage_, a.token_index, n, wire::RowsDigest(h.values), {}};
        rc.mac = wire::ReceiptMac(audit_key_, slice_.model_hash, rc);
        (void)member_->Send(plan_.stages[static_cast<size_t>(hop->stage)].address, wire::Message(rc), 500);
      }
      if (o_.faults) o_.faults->AfterReceipt(h.values);  // tests only: ... and an honest-looking receipt
    }
    // Encoded last: the payload hash covers what really goes out.
    auto out = EncodeHop(plan_, stage_, a.seq, slice_.model_hash, h);
    if (!out.ok()) return refuse(out.status().message());
    Status sent = member_->Send(out->address, wire::Message(std::move(out->activation)), 1500);
    if (!sent.ok()) refuse("could not pass the activation on: " + sent.message(), wire::ErrorKind::kNextUnreachable);
  }

  // Token ids (protocol 5 and before); the text comes as wire::Text now.
  void On(wire::Token&) {}
  void On(wire::Text& t) {
    std::string head_id, head_name = "a head";
    for (const auto& p : member_->Peers())
      if (p.public_key == last_sender_) {
        head_id = p.hello.device_id;
        head_name = p.hello.name;
      }
    if (o_.on_text) o_.on_text(head_id, head_name, t);
    if (o_.print_tokens) view_.On(last_sender_, "head '" + head_name + "' (" + net::Fingerprint(last_sender_) + ")", t);
  }

  void On(wire::Done& d) {
    busy_head_.clear();  // the turn is over: the next head may have the ring
    if (d.seq == seq_ && kv_) {
      // Positions past the turn's last fed id held drafts the head rejected (lookahead): the
      // cache keeps exactly what done says it holds, as a turn without drafts leaves it.
      if (kv_->length() > d.cached) kv_->Truncate(d.cached);
      // File the conversation's tag so its next turn can keep this prefix.
      for (auto& s : slots_)
        if (s.key == cache_key_ && s.kv.get() == kv_ && kv_->length() == d.cached) s.tag = d.cache_tag;
      if (!head_address_.empty())
        (void)member_->Send(head_address_,
                            wire::Message(wire::StageStats{d.seq, stage_, hops_, compute_seconds_, PeakRssBytes()}),
                            500);
    }
  }
  void On(wire::ErrorMsg& e) {
    BreakTextLine();
    LogWarning("node " + name_ + ": the head says: " + e.message);
  }
  void On(wire::Bye&) {}
  void On(wire::Heartbeat&) {}
  void On(wire::Hello&) {}
  void On(wire::Ready&) {}
  void On(wire::Join&) {}
  void On(wire::AuditRequest& q) {
    auto refuse = [&](const std::string& why) {
      (void)member_->Send(
          head_address_,
          wire::Message(wire::ErrorMsg{wire::ErrorKind::kAudit, name_ + " cannot answer an audit: " + why}), 500);
    };
    if (!audit_ || q.seq != seq_ || !slice_.info) return refuse("no audited turn " + std::to_string(q.seq));
    const int hidden = slice_.info->spec.hidden;
    const int64_t have = static_cast<int64_t>(inputs_.size() / static_cast<size_t>(hidden));
    if (q.from < inputs_from_ || q.to > inputs_from_ + have)
      return refuse("positions [" + std::to_string(q.from) + ", " + std::to_string(q.to) +
                    ") were not served in this turn");
    wire::AuditData d;
    d.seq = q.seq;
    d.stage = stage_;
    d.from = q.from;
    d.values.assign(inputs_.begin() + static_cast<std::ptrdiff_t>(q.from - inputs_from_) * hidden,
                    inputs_.begin() + static_cast<std::ptrdiff_t>(q.to - inputs_from_) * hidden);
    (void)member_->Send(head_address_, wire::Message(d), 3000);
  }
  void On(wire::HopDigest&) {}
  void On(wire::HopReceipt& r) {
    if (!audit_ || r.seq != seq_ || r.stage != stage_ - 1) return;
    if (receipts_.size() >= 4096) receipts_.erase(receipts_.begin());  // bounded: a flood costs nothing
    receipts_[r.token_index] = r;
  }
  void On(wire::AuditData&) {}
  void On(wire::Progress&) {}
  void On(wire::StageStats&) {}
  void On(wire::Relay&) {}  // RoomMember opened every envelope; one inside another is dropped there

  const NodeOptions& o_;
  std::unique_ptr<RoomMember> member_;  // keys, inbox, hello, heartbeats, the room's list
  std::string name_;                    // this device's name, as its hello gives it
  std::string head_key_;                // the key of the head whose turn this is
  std::string upstream_key_;            // the key of the stage that sends this one its activations
  bool joined_ = false;
  std::optional<Clock::time_point> head_missing_since_;  // the turn's head is not in the last list
  std::string head_id_, head_address_;
  std::string busy_head_;  // the head whose turn this device serves, until its done
  Slice slice_;
  int stage_ = -1;
  Plan plan_;         // the assigned turn's plan, as its assignment gave it
  int32_t seq_ = -1;  // the turn assigned
  std::vector<CacheSlot> slots_;
  uint64_t use_clock_ = 0;
  KvCache* kv_ = nullptr;  // the assigned turn's cache (a slot's)
  uint64_t cache_key_ = 0;
  int32_t kept_ = 0;
  int64_t hops_ = 0;
  double compute_seconds_ = 0;
  bool audit_ = false;                            // this turn is audited: keep inputs, send digests and receipts
  std::array<uint8_t, 32> audit_key_{};           // shared with the turn's head (net::AuditKey)
  std::map<int32_t, wire::HopReceipt> receipts_;  // upstream's receipts, by first position
  std::vector<float> inputs_;                     // the turn's hop inputs, rows from position inputs_from_
  int32_t inputs_from_ = 0;
  std::string last_sender_;  // the key that sent the frame being handled
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
