// One stage of the ring: the per-stage logic the native node and the browser tab share.
#include "daisy/stage.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "daisy/log.h"
#include "daisy/memory.h"

namespace daisy {

StageCore::StageCore(StageOptions options, StageHost& host) : o_(std::move(options)), host_(host) {}

StageCore::~StageCore() = default;

uint64_t StageCore::resident_bytes() const {
  return slice_.weights ? slice_.weights->Bytes() : 0;
}

int StageCore::hidden() const {
  return slice_.weights ? slice_.info->spec.hidden : 0;
}

bool StageCore::Expects(const std::string& sender) const {
  return (!head_key_.empty() && sender == head_key_) || (!upstream_key_.empty() && sender == upstream_key_);
}

void StageCore::Refused(const std::string& /*sender*/, const Status& why) {
  Say(StageLog::kWarning, "refused a frame: " + why.message());
  (void)host_.Send(
      head_address_,
      wire::Message(wire::ErrorMsg{wire::ErrorKind::kFrame, o_.name + " refused a frame: " + why.message()}), 500);
}

// Who may send what: the rendezvous its peer lists; a head (the key the room lists for
// the device an assignment names as stage 0) its assignment; the head of the turn its
// tokens, done, audit requests and errors; the stage before this one the activations.
// Anything else is dropped without a word to the head: a member of the room that floods or
// sends junk disturbs nothing.
void StageCore::Handle(const std::string& sender, wire::Message& msg) {
  last_sender_ = sender;
  const bool from_head = !head_key_.empty() && sender == head_key_;
  const bool from_upstream = !upstream_key_.empty() && sender == upstream_key_;
  bool allowed = false;
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::Peers>) {
          allowed = true;  // the host took it from the rendezvous alone
        } else if constexpr (std::is_same_v<T, wire::Assignment>) {
          allowed = !m.stages.empty() && host_.KeyOf(m.stages[0].device_id) == sender;
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
  if (!allowed) return host_.Dropped(sender, "a " + std::string(MessageName(msg)) + " it has no business sending");
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::Peers> || std::is_same_v<T, wire::Assignment> ||
                      std::is_same_v<T, wire::Activation> || std::is_same_v<T, wire::Text> ||
                      std::is_same_v<T, wire::Done> || std::is_same_v<T, wire::ErrorMsg> ||
                      std::is_same_v<T, wire::AuditRequest> || std::is_same_v<T, wire::HopReceipt>) {
          On(m);
        }
        // Token ids (protocol 5 and before) carry nothing a stage needs; the text comes as
        // wire::Text now. Envelopes were opened by the host; one inside another is dropped there.
      },
      msg);
}

bool StageCore::IsHead(const std::string& key) const {
  for (const auto& p : host_.Peers())
    if (p.public_key == key) return (p.hello.capabilities & wire::kCapHead) != 0;
  return false;
}

void StageCore::On(const wire::Peers& p) {
  bool head_here = head_id_.empty();
  for (const auto& peer : p.peers) head_here = head_here || peer.hello.device_id == head_id_;
  if (head_here) {
    head_missing_since_.reset();
  } else {
    // Lists from the rendezvous and frames from a head travel on different connections, so
    // a list from before a head (re)joined can arrive after its assignment. The head is
    // taken as gone only when no later list brings it back (Tick), and until then its
    // frames are still admitted.
    if (!head_missing_since_) head_missing_since_ = Clock::now();
    host_.Reach(head_address_, head_key_);
  }
}

// The head of the assigned turn has been missing from the room's lists for a while: it
// left (or was dropped). The ring is free for the next head; the layers stay.
void StageCore::Tick() {
  if (!head_missing_since_ || Clock::now() - *head_missing_since_ < std::chrono::seconds(3)) return;
  head_missing_since_.reset();
  Say(StageLog::kSay, "the head left; keeping my layers for the next turn");
  busy_head_.clear();
  head_id_.clear();
  head_address_.clear();
  head_key_.clear();
  upstream_key_.clear();
  seq_ = -1;
}

void StageCore::On(const wire::Assignment& a) {
  // One turn owns the ring: another head's assignment waits until this turn is done.
  if (!busy_head_.empty() && busy_head_ != a.stages[0].device_id) {
    (void)host_.Send(
        a.stages[0].address,
        wire::Message(wire::ErrorMsg{wire::ErrorKind::kBusy, "busy: " + o_.name + " is serving another head's turn"}),
        1000);
    return;
  }
  // The sender becomes this device's head only once its assignment is accepted.
  const std::string old_id = std::exchange(head_id_, a.stages[0].device_id);
  const std::string old_address = std::exchange(head_address_, a.stages[0].address);
  const std::string old_key = std::exchange(head_key_, host_.KeyOf(head_id_));  // Handle checked the sender holds it
  Status st = Assign(a);
  if (!st.ok()) {
    Say(StageLog::kSay, "assignment refused: " + Redact(st.message()));
    (void)host_.Send(a.stages[0].address,
                     wire::Message(wire::ErrorMsg{wire::ErrorKind::kAssignment, o_.name + ": " + Redact(st.message())}),
                     1000);
    head_id_ = old_id;
    head_address_ = old_address;
    head_key_ = old_key;
    return;
  }
  busy_head_ = head_id_;
  // The addresses the plan gives (the head's, the next stage's) with the keys the room
  // lists for those devices: a head that rejoined at a new address is reachable even
  // before the peer list that shows it arrives. CURVE (or the relay's box) still proves
  // who listens there.
  for (const auto& s : a.stages)
    if (auto k = host_.KeyOf(s.device_id); !k.empty()) host_.Reach(s.address, k);
  Status sent = host_.Send(
      head_address_, wire::Message(wire::Ready{a.your_stage, slice_.weights->Bytes(), kept_, PeakRssBytes()}), 2000);
  if (!sent.ok()) Say(StageLog::kWarning, "could not tell the head it is ready: " + sent.message());
}

// The assignment's cache: the conversation's slot, its first `keep` positions kept only
// when its tag is the one the head expects.
void StageCore::SelectCache(const wire::Assignment& a) {
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
    while (!slots_.empty() &&
           (static_cast<int>(slots_.size()) >= std::max(1, o_.cache_slots) || need + kept_bytes() > o_.budget)) {
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

Status StageCore::Assign(const wire::Assignment& a) {
  // The plan must cover the model exactly once with the head first (checked again once
  // the layer count is known), and the model id must be a repo id or a local path.
  Plan plan = PlanFromWire(a.stages);
  if (a.stages[static_cast<size_t>(a.your_stage)].device_id != o_.device_id)
    return InvalidArgument("the assignment's stage " + std::to_string(a.your_stage) + " is not this device");
  const bool same_model = slice_.info && slice_.model_id == a.model_id && slice_.revision == a.revision;
  if (!same_model) {
    slice_ = Slice{};
    slots_.clear();
    kv_ = nullptr;
    if (a.model_id.empty()) return InvalidArgument("an assignment without a model id");
    DAISY_ASSIGN_OR_RETURN(slice_.source, host_.OpenModel(a.model_id, a.revision));
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
    if (need > o_.budget)
      return ResourceExhausted("layers [" + std::to_string(me.first) + ", " + std::to_string(me.end) + ") of " +
                               a.model_id + " at context " + std::to_string(a.ctx) + " need " + FormatBytes(need) +
                               " (int8 weights, KV cache and working memory) but this device's memory budget is " +
                               FormatBytes(o_.budget) + ": refused before any download");
    Say(StageLog::kSay,
        "fetching layers [" + std::to_string(me.first) + ", " + std::to_string(me.end) + ") of " + a.model_id);
    host_.LoadStarted();
    auto last_progress = Clock::now() - std::chrono::seconds(1);
    ProgressFn progress = [&](const TransferProgress& p) {
      // Tell the head how far it is (the member's liveness goes on meanwhile).
      if (Clock::now() - last_progress > std::chrono::milliseconds(250) || p.bytes_done == p.bytes_total) {
        last_progress = Clock::now();
        (void)host_.Send(
            head_address_,
            wire::Message(wire::Progress{a.turn, a.your_stage, std::min(p.bytes_done, p.bytes_total), p.bytes_total}),
            200);
      }
      host_.LoadProgress(p);
    };
    DAISY_ASSIGN_OR_RETURN(StageWeights w,
                           StageWeights::Load(*slice_.source, *slice_.info, me.first, me.end, false, progress));
    slice_.weights = std::make_unique<StageWeights>(std::move(w));
    slice_.first = me.first;
    slice_.end = me.end;
    char held[160];
    std::snprintf(held, sizeof held, "holding layers [%d, %d): %.2f MB resident", me.first, me.end,
                  static_cast<double>(slice_.weights->Bytes()) / 1e6);
    Say(StageLog::kSay, held);
  }
  if (slice_.ctx != a.ctx) {
    slots_.clear();
    kv_ = nullptr;
    slice_.ctx = a.ctx;
  }
  SelectCache(a);
  // Activations come only from the stage before this one (the head, for stage 1).
  upstream_key_ = host_.KeyOf(a.stages[static_cast<size_t>(a.your_stage) - 1].device_id);
  stage_ = a.your_stage;
  plan_ = std::move(plan);
  seq_ = static_cast<int32_t>(a.turn);
  audit_ = a.audit;
  receipts_.clear();
  if (audit_) {
    DAISY_ASSIGN_OR_RETURN(audit_key_, net::AuditKey(o_.keys, host_.KeyOf(a.stages[0].device_id)));
  }
  inputs_.clear();
  inputs_from_ = kept_;
  hops_ = 0;
  compute_seconds_ = 0;
  return Status::Ok();
}

void StageCore::On(wire::Activation& a) {
  auto refuse = [&](const std::string& why, wire::ErrorKind code = wire::ErrorKind::kHop) {
    Say(StageLog::kWarning, "refused a hop: " + why);
    if (!head_address_.empty())
      (void)host_.Send(head_address_, wire::Message(wire::ErrorMsg{code, o_.name + " refused a hop: " + why}), 300);
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
    Say(StageLog::kInfo, "dropped a hop of turn " + std::to_string(a.seq) + ", not of the turn assigned");
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
    (void)host_.Send(head_address_, wire::Message(d), 500);
    if (o_.faults) o_.faults->AfterReport(h.values);  // tests only: a liar with an honest digest
    if (!hop->to_return) {
      // The receipt for what really goes out, MACed for the head: the next stage checks it
      // against the rows it receives and forwards it in its own report.
      wire::HopReceipt rc{a.seq, stage_, a.token_index, n, wire::RowsDigest(h.values), {}};
      rc.mac = wire::ReceiptMac(audit_key_, slice_.model_hash, rc);
      (void)host_.Send(plan_.stages[static_cast<size_t>(hop->stage)].address, wire::Message(rc), 500);
    }
    if (o_.faults) o_.faults->AfterReceipt(h.values);  // tests only: ... and an honest-looking receipt
  }
  // Encoded last: the payload hash covers what really goes out.
  auto out = EncodeHop(plan_, stage_, a.seq, slice_.model_hash, h);
  if (!out.ok()) return refuse(out.status().message());
  Status sent = host_.Send(out->address, wire::Message(std::move(out->activation)), 1500);
  if (!sent.ok()) refuse("could not pass the activation on: " + sent.message(), wire::ErrorKind::kNextUnreachable);
}

void StageCore::On(const wire::Text& t) {
  std::string head_id, head_name = "a head";
  for (const auto& p : host_.Peers())
    if (p.public_key == last_sender_) {
      head_id = p.hello.device_id;
      head_name = p.hello.name;
    }
  host_.OnText(last_sender_, head_id, head_name, t);
}

void StageCore::On(const wire::Done& d) {
  busy_head_.clear();  // the turn is over: the next head may have the ring
  if (d.seq == seq_ && kv_) {
    // Positions past the turn's last fed id held drafts the head rejected (lookahead): the
    // cache keeps exactly what done says it holds, as a turn without drafts leaves it.
    if (kv_->length() > d.cached) kv_->Truncate(d.cached);
    // File the conversation's tag so its next turn can keep this prefix.
    for (auto& s : slots_)
      if (s.key == cache_key_ && s.kv.get() == kv_ && kv_->length() == d.cached) s.tag = d.cache_tag;
    if (!head_address_.empty())
      (void)host_.Send(head_address_,
                       wire::Message(wire::StageStats{d.seq, stage_, hops_, compute_seconds_, PeakRssBytes()}), 500);
  }
}

void StageCore::On(const wire::ErrorMsg& e) {
  Say(StageLog::kWarning, "the head says: " + e.message);
}

void StageCore::On(const wire::AuditRequest& q) {
  auto refuse = [&](const std::string& why) {
    (void)host_.Send(
        head_address_,
        wire::Message(wire::ErrorMsg{wire::ErrorKind::kAudit, o_.name + " cannot answer an audit: " + why}), 500);
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
  (void)host_.Send(head_address_, wire::Message(d), 3000);
}

void StageCore::On(const wire::HopReceipt& r) {
  if (!audit_ || r.seq != seq_ || r.stage != stage_ - 1) return;
  if (receipts_.size() >= 4096) receipts_.erase(receipts_.begin());  // bounded: a flood costs nothing
  receipts_[r.token_index] = r;
}

}  // namespace daisy
