// The head: plan, assign, ready, laps, tokens, done, replay, verify.
#include "daisy/head.h"

#include <sodium.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "daisy/forward.h"
#include "daisy/log.h"
#include "daisy/memory.h"
#include "daisy/model.h"
#include "daisy/net.h"
#include "daisy/node.h"
#include "daisy/plan.h"
#include "daisy/tokenizer.h"
#include "daisy/wire.h"

namespace daisy {

namespace {

using Clock = std::chrono::steady_clock;

// Prompt positions per prefill chunk on a ring: small enough that the stages overlap well,
// large enough that each chunk's products run as GEMMs (bench/ring_bench.sh measures it).
constexpr int kRingPrefillChunk = 16;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The head's view of the room, kept current while it waits.
class Room {
 public:
  explicit Room(net::Endpoint& ep) : ep_(ep) {}

  // Keeps the member list; other frames are returned to the caller. Peer lists come only
  // from the rendezvous, everything else only from the stages of the turn in progress:
  // frames from any other member are dropped unread (and never end a turn).
  std::optional<wire::Message> Poll(int timeout_ms, int hidden) {
    auto f = ep_.ReceiveFrame(timeout_ms);
    if (!f.ok() || !f->has_value()) return std::nullopt;
    last_sender_ = (*f)->sender_key;
    const bool from_server = last_sender_ == server_key_;
    const bool from_stage = stage_keys_.count(last_sender_) > 0;
    if (!from_server && !from_stage) {
      Dropped(last_sender_);
      return std::nullopt;
    }
    auto m = wire::Decode((*f)->bytes, hidden);
    if (!m.ok()) {
      LogWarning("head: refused a frame: " + m.status().message());
      if (from_stage) last_refusal_ = m.status().message();
      return std::nullopt;
    }
    if (std::holds_alternative<wire::Peers>(*m) != from_server) {
      Dropped(last_sender_);
      return std::nullopt;
    }
    if (auto* p = std::get_if<wire::Peers>(&*m)) {
      // Only the room's members (and the rendezvous) may reach the head's inbox.
      net::ApplyPeerList(ep_, server_key_, *p);
      std::lock_guard<std::mutex> lock(mu_);
      peers_ = p->peers;
      seen_peers_ = true;
      return std::nullopt;
    }
    return std::move(*m);
  }
  // The keys of the turn's stages (the room lists each member's key); empty between turns.
  void SetStageDevices(const std::vector<std::string>& device_ids) {
    std::lock_guard<std::mutex> lock(mu_);
    stage_keys_.clear();
    for (const auto& id : device_ids)
      for (const auto& p : peers_)
        if (p.hello.device_id == id) stage_keys_.insert(p.public_key);
  }
  std::string KeyOf(const std::string& device_id) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& p : peers_)
      if (p.hello.device_id == device_id) return p.public_key;
    return {};
  }
  // The key that sent the frame Poll returned last.
  const std::string& last_sender() const { return last_sender_; }
  bool Has(const std::string& device_id) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& p : peers_)
      if (p.hello.device_id == device_id) return true;
    return false;
  }
  // A copy: the session's other threads read it while a turn polls.
  std::vector<wire::Peer> peers() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peers_;
  }
  bool seen_peers() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_peers_;
  }
  std::string TakeRefusal() { return std::exchange(last_refusal_, ""); }
  void set_server_key(const std::string& key) { server_key_ = key; }

 private:
  net::Endpoint& ep_;
  std::string server_key_;
  mutable std::mutex mu_;
  std::vector<wire::Peer> peers_;
  bool seen_peers_ = false;
  std::string last_refusal_;
  std::set<std::string> stage_keys_;
  std::string last_sender_;
  int64_t dropped_ = 0;
  Clock::time_point last_drop_log_ = Clock::now() - std::chrono::seconds(10);

  // At most one line a second about dropped frames, however many arrive.
  void Dropped(const std::string& sender) {
    ++dropped_;
    if (Since(last_drop_log_) < 1.0) return;
    last_drop_log_ = Clock::now();
    LogWarning("head: dropped a frame from " + (sender.empty() ? std::string("an unknown sender") : "key " + sender.substr(0, 8)) +
               ", which is not a stage of this turn (" + std::to_string(dropped_) + " dropped so far)");
  }
};

// What a turn's stage audit needs: the head re-runs audited stages' layers itself.
struct AuditSetup {
  double rate = 0;                 // share of (lap, stage) pairs audited
  std::mt19937_64* rng = nullptr;  // the head's draw, after the fact
  ModelSource* source = nullptr;
  const ModelInfo* info = nullptr;
  int ctx = 0;
  // Audited stages' weights, fetched on first need and kept, by layer range.
  std::map<std::pair<int, int>, std::unique_ptr<StageWeights>>* weights = nullptr;
  std::vector<std::string> names;  // stage names for messages
  const net::KeyPair* keys = nullptr;  // this head's: the receipt keys are derived from it
};

// The rest of the ring as the head's forward pass sees it: one lap per call.
class NetLink final : public StageLink {
 public:
  NetLink(net::Endpoint& ep, Room& room, const std::vector<wire::StageEntry>& stages, int32_t seq, uint32_t model_hash,
          int hidden, double lap_timeout_s)
      : ep_(ep), room_(room), stages_(stages), seq_(seq), model_hash_(model_hash), hidden_(hidden), lap_timeout_s_(lap_timeout_s) {}

  Result<HiddenStates> Run(HiddenStates hidden) override {
    DAISY_RETURN_IF_ERROR(Submit(std::move(hidden)));
    return Collect();
  }

  void EnableAudit(AuditSetup setup) {
    audit_ = std::move(setup);
    shadows_.resize(stages_.size());
  }

  // Sends one batch into the ring (stage 1) without waiting for it.
  daisy::Status Submit(HiddenStates hidden) override {
    if (audit_.rate > 0) sent_digest_[hidden.positions.front()] = wire::RowsDigest(hidden.values);
    wire::Activation a;
    a.seq = seq_;
    a.token_index = hidden.positions.front();
    a.next = 1;
    a.model_hash = model_hash_;
    a.values = std::move(hidden.values);
    a.act_hash = wire::ActHash(a.values);
    hidden.values.clear();
    daisy::Status sent = ep_.Send(stages_[1].address, wire::Message(a), 3000);
    if (!sent.ok()) {
      failed_device_ = stages_[1].device_id;
      return Unavailable("stage 1 (" + stages_[1].device_id.substr(0, 8) + ") is unreachable: " + sent.message());
    }
    hops_ += static_cast<int64_t>(stages_.size());
    positions_ += static_cast<int64_t>(hidden.positions.size());
    ++laps_;
    if (pending_.empty()) busy_since_ = Clock::now();  // wall time with a batch in the ring
    pending_.push_back({std::move(hidden), Clock::now()});
    return daisy::Status::Ok();
  }

  // Waits for the oldest batch to come back on the RETURN leg.
  Result<HiddenStates> Collect() override {
    if (pending_.empty()) return Internal("Bug: Collect without a Submit");
    const auto start = pending_.front().sent;
    const int32_t want = pending_.front().hidden.positions.front();
    while (Since(start) < lap_timeout_s_) {
      auto m = Next(50);
      // A link to a stage that broke mid-turn (the receiver dropped the connection, as it
      // does when a frame fails authentication) lost what was in flight.
      for (const auto& addr : ep_.TakeDropped())
        for (size_t i = 1; i < stages_.size(); ++i)
          if (stages_[i].address == addr) {
            failed_device_ = stages_[i].device_id;
            return Unavailable("the link to stage " + std::to_string(i) + " (" + stages_[i].device_id.substr(0, 8) +
                               ") broke: the connection was dropped (a frame that fails authentication is refused by its receiver)");
          }
      for (size_t i = 1; i < stages_.size(); ++i)
        if (room_.seen_peers() && !room_.Has(stages_[i].device_id)) {
          failed_device_ = stages_[i].device_id;
          return Unavailable("stage " + std::to_string(i) + " (" + stages_[i].device_id.substr(0, 8) + ") left the ring");
        }
      if (std::string r = room_.TakeRefusal(); !r.empty()) return Unavailable("a returning activation was refused: " + r);
      if (!m) continue;
      if (auto* e = std::get_if<wire::ErrorMsg>(&*m)) {
        // Blame the right device: a stage that could not reach the next one names the next.
        for (size_t i = 1; i < stages_.size(); ++i)
          if (sender_ == room_.KeyOf(stages_[i].device_id)) {
            const size_t culprit = e->code == wire::kErrNextUnreachable ? i + 1 : i;
            if (culprit < stages_.size()) failed_device_ = stages_[culprit].device_id;
          }
        return Unavailable("a stage failed: " + e->message);
      }
      auto* back = std::get_if<wire::Activation>(&*m);
      if (!back || back->seq != seq_ || back->next != wire::kNextReturn) continue;  // stale or not ours
      if (back->token_index != want) continue;
      // The return leg is the last stage's alone: another member cannot answer for it.
      if (sender_ != room_.KeyOf(stages_.back().device_id)) continue;
      HiddenStates out = std::move(pending_.front().hidden);
      pending_.pop_front();
      if (back->model_hash != model_hash_) return Unavailable("the returning activation carries another model's hash");
      if (back->values.size() != static_cast<size_t>(out.n_tokens()) * static_cast<size_t>(hidden_))
        return Unavailable("the returning activation has the wrong size");
      out.values = std::move(back->values);
      if (pending_.empty()) lap_seconds_ += Since(busy_since_);  // overlapping laps count once
      if (audit_.rate > 0) DAISY_RETURN_IF_ERROR(AfterLap(want, out.n_tokens(), out.values));
      return out;
    }
    return Unavailable("a lap stalled: no activation came back within " + std::to_string(static_cast<int>(lap_timeout_s_)) + " s");
  }

  int64_t hops() const { return hops_; }
  int64_t positions() const { return positions_; }
  int64_t audited() const { return audited_; }
  int64_t recomputed() const { return recomputed_; }
  // The first position whose hop an audit found wrong: tokens after it are not trusted.
  std::optional<int32_t> bad_position() const { return bad_position_; }
  // The device that made the last lap fail, when it is known (and the other side of a dispute
  // the audit's evidence could not settle).
  const std::string& failed_device() const { return failed_device_; }
  const std::string& also_failed() const { return also_failed_; }
  int64_t laps() const { return laps_; }
  double lap_seconds() const { return lap_seconds_; }

 private:
  net::Endpoint& ep_;
  Room& room_;
  const std::vector<wire::StageEntry>& stages_;
  int32_t seq_;
  uint32_t model_hash_;
  int hidden_;
  double lap_timeout_s_;
  int64_t hops_ = 0;
  int64_t positions_ = 0;
  int64_t laps_ = 0;
  double lap_seconds_ = 0;
  std::string failed_device_;
  struct Pending {
    HiddenStates hidden;  // positions of the batch (values travel in the activation)
    Clock::time_point sent;
  };
  std::deque<Pending> pending_;
  Clock::time_point busy_since_;

  // ---- the stage audit ----
  // A frame taken while waiting for something else is kept for the next wait.
  std::optional<wire::Message> Next(int timeout_ms) {
    if (!stash_.empty()) {
      wire::Message m = std::move(stash_.front().first);
      sender_ = std::move(stash_.front().second);
      stash_.pop_front();
      return m;
    }
    auto m = room_.Poll(timeout_ms, hidden_);
    sender_ = room_.last_sender();
    if (m && audit_.rate > 0) {
      if (auto* d = std::get_if<wire::HopDigest>(&*m)) {
        if (d->seq == seq_ && FromStage(d->stage)) digests_[{d->stage, d->token_index}] = *d;
        return std::nullopt;
      }
    }
    return m;
  }

  Result<wire::HopDigest> Digest(int stage, int32_t token_index) {
    const auto start = Clock::now();
    while (Since(start) < 5.0) {
      auto it = digests_.find({stage, token_index});
      if (it != digests_.end()) return it->second;
      auto m = room_.Poll(20, hidden_);
      if (!m) continue;
      if (auto* d = std::get_if<wire::HopDigest>(&*m)) {
        if (d->seq == seq_ && FromStage(d->stage)) digests_[{d->stage, d->token_index}] = *d;
      } else {
        stash_.emplace_back(std::move(*m), room_.last_sender());
      }
    }
    failed_device_ = stages_[static_cast<size_t>(stage)].device_id;
    return Unavailable("audit: " + Who(stage) + " sent no digest for its hop at position " + std::to_string(token_index));
  }

  // Whether the frame Poll returned last came from stage s's own key: a stage's digests
  // and audit inputs cannot be forged by another member.
  bool FromStage(int s) const {
    return s >= 1 && static_cast<size_t>(s) < stages_.size() && room_.last_sender() == room_.KeyOf(stages_[static_cast<size_t>(s)].device_id);
  }

  std::string Who(int stage) const {
    return "stage " + std::to_string(stage) + " (" + audit_.names[static_cast<size_t>(stage)] + ", " +
           stages_[static_cast<size_t>(stage)].device_id.substr(0, 8) + ")";
  }

  daisy::Status Blame(int stage, int32_t position, const std::string& what) {
    failed_device_ = stages_[static_cast<size_t>(stage)].device_id;
    if (!bad_position_ || position < *bad_position_) bad_position_ = position;
    return Unavailable("audit: " + Who(stage) + " " + what + "; it is excluded");
  }
  // The evidence cannot tell which of two neighbours lied: both are excluded, never the
  // receiver alone.
  daisy::Status BlameBoth(int sender, int receiver, int32_t position, const std::string& what) {
    failed_device_ = stages_[static_cast<size_t>(receiver)].device_id;
    also_failed_ = stages_[static_cast<size_t>(sender)].device_id;
    if (!bad_position_ || position < *bad_position_) bad_position_ = position;
    return Unavailable("audit: " + what + "; the evidence cannot tell which of " + Who(sender) + " and " + Who(receiver) +
                       " lied, so both are excluded");
  }

  // The link from stage s-1 to stage s at one hop. Stage s-1 reported its output to this
  // head (over its own authenticated link) and gave stage s a receipt for what it really
  // sent, MACed with the key only it and this head hold; stage s forwards that receipt and
  // reports what it received. A receipt that differs from its maker's report convicts the
  // maker alone; a receiver that reports other rows than the receipt covers, or brings no
  // valid receipt, is one side of a dispute the digests cannot settle.
  daisy::Status CheckLink(int s, int32_t token_index, int rows, const wire::HopDigest& d) {
    DAISY_ASSIGN_OR_RETURN(wire::HopDigest prev, Digest(s - 1, token_index));
    const std::string at = " at position " + std::to_string(token_index);
    const wire::HopReceipt& r = d.receipt;
    bool valid = d.has_receipt && r.seq == seq_ && r.stage == s - 1 && r.token_index == token_index && r.rows == rows;
    if (valid) {
      DAISY_ASSIGN_OR_RETURN(auto key, KeyFor(s - 1));
      valid = sodium_memcmp(wire::ReceiptMac(key, model_hash_, r).data(), r.mac.data(), r.mac.size()) == 0;
    }
    if (!valid) return BlameBoth(s - 1, s, token_index, Who(s) + " brought no valid receipt from " + Who(s - 1) + at);
    if (r.digest != prev.out_digest)
      return Blame(s - 1, token_index, "gave the next stage a receipt for other rows than the ones it reported" + at + " (it sent rows other than its honest output)");
    if (d.in_digest != r.digest)
      return BlameBoth(s - 1, s, token_index, Who(s) + " reports receiving rows other than the ones " + Who(s - 1) + "'s receipt covers" + at);
    return daisy::Status::Ok();
  }

  // The receipt key this head shares with stage s.
  Result<std::array<uint8_t, 32>> KeyFor(int s) {
    auto it = audit_keys_.find(s);
    if (it != audit_keys_.end()) return it->second;
    DAISY_ASSIGN_OR_RETURN(auto key, net::AuditKey(*audit_.keys, room_.KeyOf(stages_[static_cast<size_t>(s)].device_id)));
    audit_keys_[s] = key;
    return key;
  }

  // After the lap of positions [token_index, token_index + rows): draw which stages to
  // audit, check the chain of digests, and re-run each audited stage up to this lap.
  daisy::Status AfterLap(int32_t token_index, int rows, std::span<const float> returned) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const int n = static_cast<int>(stages_.size());
    for (int s = 1; s < n; ++s) {
      if (u(*audit_.rng) >= audit_.rate) continue;
      ++audited_;
      DAISY_ASSIGN_OR_RETURN(wire::HopDigest d, Digest(s, token_index));
      if (d.rows != rows) return Blame(s, token_index, "reported a hop of the wrong size");
      // Its input must be what the previous stage (or the head) sent.
      if (s == 1) {
        if (d.in_digest != sent_digest_[token_index])
          return Blame(s, token_index, "reports an input other than the one this head sent it at position " + std::to_string(token_index));
      } else {
        DAISY_RETURN_IF_ERROR(CheckLink(s, token_index, rows, d));
      }
      if (s == n - 1 && d.out_digest != wire::RowsDigest(returned))
        return Blame(s, token_index, "reports an output other than the one that came back at position " + std::to_string(token_index));
      DAISY_RETURN_IF_ERROR(Rerun(s, token_index + rows));
    }
    return daisy::Status::Ok();
  }

  // Re-runs stage s on this device over its inputs [shadow, end) and compares every hop's
  // output with the digest the stage committed to.
  daisy::Status Rerun(int s, int32_t end) {
    Shadow& sh = shadows_[static_cast<size_t>(s)];
    if (sh.len >= end) return daisy::Status::Ok();
    const auto& st = stages_[static_cast<size_t>(s)];
    auto key = std::make_pair(st.first, st.end);
    auto& w = (*audit_.weights)[key];
    if (!w) {
      DAISY_ASSIGN_OR_RETURN(StageWeights loaded, StageWeights::Load(*audit_.source, *audit_.info, st.first, st.end, false, {}));
      w = std::make_unique<StageWeights>(std::move(loaded));
    }
    if (!sh.kv) sh.kv = std::make_unique<KvCache>(audit_.info->spec, st.first, st.end, audit_.ctx);
    // Its inputs, as it kept them.
    DAISY_RETURN_IF_ERROR(ep_.Send(st.address, wire::Message(wire::AuditRequest{seq_, sh.len, end}), 3000));
    std::optional<wire::AuditData> data;
    const auto start = Clock::now();
    while (!data && Since(start) < lap_timeout_s_) {
      auto m = room_.Poll(20, hidden_);
      if (!m) continue;
      if (auto* ad = std::get_if<wire::AuditData>(&*m); ad && ad->seq == seq_ && ad->stage == s && ad->from == sh.len && FromStage(s)) {
        data = std::move(*ad);
      } else if (auto* e = std::get_if<wire::ErrorMsg>(&*m); e && e->code == wire::kErrAudit) {
        return Blame(s, sh.len, "did not answer the audit: " + e->message);
      } else if (auto* d = std::get_if<wire::HopDigest>(&*m)) {
        if (d->seq == seq_ && FromStage(d->stage)) digests_[{d->stage, d->token_index}] = *d;
      } else {
        stash_.emplace_back(std::move(*m), room_.last_sender());
      }
    }
    if (!data) return Blame(s, sh.len, "did not answer the audit within " + std::to_string(static_cast<int>(lap_timeout_s_)) + " s");
    const size_t rows = static_cast<size_t>(end - sh.len);
    if (data->values.size() != rows * static_cast<size_t>(hidden_)) return Blame(s, sh.len, "sent audit inputs of the wrong size");
    // The hops in [sh.len, end), in order, each input checked against its digest.
    std::vector<wire::HopDigest> hops;
    for (int32_t p = sh.len; p < end;) {
      DAISY_ASSIGN_OR_RETURN(wire::HopDigest d, Digest(s, p));
      if (d.rows <= 0 || p + d.rows > end) return Blame(s, p, "reported hops that do not tile its positions");
      const auto rows_of = std::span<const float>(data->values).subspan(static_cast<size_t>(p - sh.len) * hidden_, static_cast<size_t>(d.rows) * hidden_);
      if (wire::RowsDigest(rows_of) != d.in_digest) return Blame(s, p, "sent audit inputs that differ from the ones it reported at position " + std::to_string(p));
      hops.push_back(d);
      p += d.rows;
    }
    HiddenStates h;
    h.hidden = hidden_;
    for (int32_t p = sh.len; p < end; ++p) h.positions.push_back(p);
    h.values = std::move(data->values);
    DAISY_RETURN_IF_ERROR(RunLayers(*w, st.first, st.end, h, *sh.kv));
    for (const auto& d : hops) {
      const auto out = std::span<const float>(h.values).subspan(static_cast<size_t>(d.token_index - sh.len) * hidden_, static_cast<size_t>(d.rows) * hidden_);
      ++recomputed_;
      if (wire::RowsDigest(out) != d.out_digest)
        return Blame(s, d.token_index, "returned wrong bits for its hop at position " + std::to_string(d.token_index) + " (the re-run differs)");
    }
    sh.len = end;
    return daisy::Status::Ok();
  }

  struct Shadow {
    std::unique_ptr<KvCache> kv;  // the audited stage's cache, rebuilt here
    int32_t len = 0;              // positions re-run so far
  };
  AuditSetup audit_;
  std::vector<Shadow> shadows_;
  std::map<std::pair<int, int32_t>, wire::HopDigest> digests_;  // (stage, first position)
  std::map<int32_t, wire::Digest> sent_digest_;                 // what the head sent, by position
  std::map<int, std::array<uint8_t, 32>> audit_keys_;           // receipt keys, by stage
  std::string also_failed_;  // the other side of a dispute the evidence could not settle
  std::deque<std::pair<wire::Message, std::string>> stash_;  // with the key that sent it
  std::string sender_;  // the key that sent what Next returned last
  int64_t audited_ = 0;
  int64_t recomputed_ = 0;
  std::optional<int32_t> bad_position_;
};

// The prefix cache on the head: one HeadStage (with its KV) per conversation, and what
// its cache holds.
struct HeadSlot {
  uint64_t key = 0;
  std::unique_ptr<HeadStage> stage;
  std::vector<int32_t> ids;  // the ids at positions [0, ids.size()) of every stage's cache
  std::string plan_sig;      // the plan those caches were filled under
  uint64_t last_used = 0;
};

// XXH64, not BLAKE2b: the tag guards against accidents (a stage's cache from another
// conversation); it is not evidence, which Verify's BLAKE2b step digests are.
uint64_t IdsTag(std::span<const int32_t> ids) {
  return XXH64(ids.data(), ids.size() * sizeof(int32_t), 0x50524546u /* "PREF" */);
}

size_t CommonPrefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// One step of a run as Verify compares it: BLAKE2b-256 of the final hidden row the token was
// read out from and of its logits, each as f32 bytes in memory (little-endian on every host
// the kernels support). Ids alone miss a lie small enough to keep the argmax.
struct StepDigest {
  wire::Digest row{};
  wire::Digest logits{};
};

// Adds digesting every step into `steps` to the options (after any hook already there).
void DigestSteps(GenerateOptions& g, std::vector<StepDigest>& steps) {
  g.on_step = [&steps, before = std::move(g.on_step)](int position, std::span<const float> row, std::span<const float> logits) {
    if (before) before(position, row, logits);
    steps.push_back({wire::RowsDigest(row), wire::RowsDigest(logits)});
  };
}

std::string IdText(std::span<const int32_t> ids, size_t k) {
  return k < ids.size() ? "id " + std::to_string(ids[k]) : std::string("the end of the turn");
}

// Verify's verdict: the distributed run (ids a, digests da) against the single-device run
// (ids b, digests db), step by step; the first step where the ids or the bits differ wins.
void Compare(HeadReport& report, std::span<const int32_t> a, std::span<const StepDigest> da, std::span<const int32_t> b,
             std::span<const StepDigest> db) {
  const size_t n_prompt = report.prompt_ids.size();
  const size_t steps = std::max({a.size(), b.size(), da.size(), db.size()});
  report.verified_steps = static_cast<int>(std::min(da.size(), db.size()));
  for (size_t k = 0; k < steps; ++k) {
    const bool ids_differ = (k < a.size()) != (k < b.size()) || (k < a.size() && a[k] != b[k]);
    const bool both = k < da.size() && k < db.size();
    const bool logits_differ = !both || da[k].logits != db[k].logits;
    const bool row_differ = !both || da[k].row != db[k].row;
    if (!ids_differ && !logits_differ && !row_differ) continue;
    const int position = static_cast<int>(n_prompt + k);
    report.verified = false;
    report.mismatch_position = position;
    report.verified_steps = static_cast<int>(k);
    const std::string where = "MISMATCH: position " + std::to_string(position);
    const std::string token = "generated token " + std::to_string(k);
    if (ids_differ) {
      report.mismatch = "ids differ";
      report.verify_message = where + " (ids differ): " + token + " is " + IdText(a, k) + " in the distributed run, " + IdText(b, k) +
                              " in the single-device run";
    } else if (logits_differ) {
      report.mismatch = "ids equal, logits differ";
      report.verify_message = where + " (ids equal, logits differ): " + token + " (" + IdText(a, k) +
                              " in both runs) was chosen from logits whose bits differ from the single-device run's";
    } else {
      report.mismatch = "ids equal, hidden row differs";
      report.verify_message = where + " (ids equal, hidden row differs): the final hidden row that chose " + token + " (" + IdText(a, k) +
                              " in both runs) differs in its bits from the single-device run's, though the logits agree";
    }
    return;
  }
  report.verified = true;
  report.verify_message = "VERIFIED: the distributed run and the single-device run produced identical token ids and identical bits "
                          "(BLAKE2b of the final hidden row and the logits) at all " + std::to_string(steps) + " steps.";
}

std::string PlanSignature(const std::vector<wire::StageEntry>& stages, int ctx) {
  std::string sig = std::to_string(ctx);
  for (const auto& s : stages) sig += "|" + s.device_id + ":" + s.address + ":" + std::to_string(s.first) + "-" + std::to_string(s.end);
  return sig;
}

}  // namespace

struct HeadSession::Impl {
  SessionOptions o;
  net::KeyPair keys;
  std::string server_key;  // the rendezvous's, once this head is admitted
  std::string id;
  std::unique_ptr<net::Endpoint> ep;
  std::unique_ptr<Room> room;
  std::unique_ptr<net::Pulse> pulse;  // heartbeats and re-joins, from a thread of their own
  wire::Hello hello;

  // One turn at a time owns the endpoint; the idle thread keeps the room between turns.
  std::mutex turn_mu;
  std::atomic<int> waiting{0};
  std::atomic<bool> stopping{false};
  std::thread idle;

  // The model (guarded by state_mu for readers; replaced only under turn_mu too).
  mutable std::mutex state_mu;
  std::unique_ptr<ModelSource> source;
  std::shared_ptr<const ModelInfo> info;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::optional<ModelView> view;
  int ctx = 0;
  uint32_t model_hash = 0;
  uint64_t spec_hash = 0;

  // Turn state (under turn_mu).
  std::unique_ptr<StageWeights> head_weights;
  std::unique_ptr<LocalPipeline> verify_pipeline;
  std::vector<HeadSlot> slots;
  uint64_t use_clock = 0;
  uint32_t turn = 0;
  std::set<std::string> suspects;  // devices that failed an attempt: not planned again this turn
  bool joined = false;
  std::mt19937_64 audit_rng;
  std::map<std::pair<int, int>, std::unique_ptr<StageWeights>> audit_weights;
  std::vector<StepDigest> ring_steps;  // the last finished turn's step digests, for Verify

  ~Impl() {
    stopping = true;
    if (idle.joinable()) idle.join();
    pulse.reset();  // no join after the bye
    if (ep) (void)ep->Send(o.rendezvous, wire::Message(wire::Bye{id}), 300);  // leave the room now
  }

  void IdleLoop() {
    while (!stopping.load()) {
      if (waiting.load() > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      std::unique_lock<std::mutex> lock(turn_mu);
      (void)room->Poll(50, 0);  // stale replies of a finished turn are dropped here
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  // Takes the ring: the idle thread steps aside.
  std::unique_lock<std::mutex> TakeTurn() {
    waiting.fetch_add(1);
    std::unique_lock<std::mutex> lock(turn_mu);
    waiting.fetch_sub(1);
    return lock;
  }

  // The host approves this head's key (over HTTP, or in this process) before the
  // rendezvous admits its ZeroMQ connection.
  Status Admit() {
    if (!server_key.empty()) return Status::Ok();
    JoinOptions jo;
    jo.rendezvous = o.rendezvous;
    jo.room = o.room;
    jo.name = hello.name;
    jo.server_fingerprint = o.server_key;
    jo.home = DeviceHome();
    jo.admission = o.admission;
    jo.unreachable_timeout_s = 10;
    DAISY_ASSIGN_OR_RETURN(server_key, AwaitAdmission(jo, keys));
    ep->SetPeerKey(o.rendezvous, server_key);
    ep->Allow(server_key);
    room->set_server_key(server_key);
    // Heartbeats from a thread of their own: loading the head's slice, a long prefill or a
    // verify run never gets the head dropped from the room.
    net::PulseOptions po;
    po.rendezvous = o.rendezvous;
    po.server_key = server_key;
    po.keys = keys;
    po.device_id = id;
    po.join_frame = wire::Encode(wire::Message(wire::Join{o.room, ep->address(), hello}));
    DAISY_ASSIGN_OR_RETURN(pulse, net::Pulse::Start(po));
    return Status::Ok();
  }

  Status JoinRoom() {
    DAISY_RETURN_IF_ERROR(Admit());
    const auto start = Clock::now();
    auto last_join = start;  // the pulse sent the first join
    while (Since(start) < 10) {
      if (Since(last_join) > 1.0) {  // sooner than the pulse's every 5 s, while joining
        (void)ep->Send(o.rendezvous, wire::Message(wire::Join{o.room, ep->address(), hello}), 500);
        last_join = Clock::now();
      }
      room->Poll(100, 0);
      if (room->Has(id)) break;
    }
    if (!room->Has(id))
      return Unavailable("no answer from the rendezvous at " + o.rendezvous +
                         " within 10 s (is `daisychain serve` running, and has the host approved this device?)");
    // Let the list settle: devices already in the room are all in the first answer.
    const auto settle = Clock::now();
    while (Since(settle) < 0.3) room->Poll(50, 0);
    joined = true;
    return Status::Ok();
  }

  Result<ModelView> Load(const std::string& src, int want_ctx) {
    DAISY_ASSIGN_OR_RETURN(std::unique_ptr<ModelSource> s, OpenModelSource(src, o.hub));
    DAISY_ASSIGN_OR_RETURN(ModelInfo mi, LoadModelInfo(*s));
    if (!mi.index.AllHeadersLoaded()) DAISY_RETURN_IF_ERROR(mi.index.LoadAllHeaders(*s));
    DAISY_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::Load(*s));
    const int c = want_ctx > 0 ? want_ctx : DefaultContext(mi.spec);
    DAISY_RETURN_IF_ERROR(CheckContext(mi.spec, c));
    ModelView v;
    v.source = src;
    v.model_id = s->ModelId();
    v.revision = s->Revision();
    v.spec = mi.spec;
    v.parameters = mi.index.ParameterCount();
    for (const auto& t : mi.index.tensors()) v.weight_bytes += t.bytes;
    v.ctx = c;
    auto lock = TakeTurn();
    std::lock_guard<std::mutex> state(state_mu);
    model_hash = ModelHashOf(*s, mi.index);
    spec_hash = SpecHash(mi.spec);
    ctx = c;
    source = std::move(s);
    info = std::make_shared<const ModelInfo>(std::move(mi));
    tokenizer = std::make_shared<const Tokenizer>(std::move(tok));
    view = v;
    slots.clear();
    head_weights.reset();
    verify_pipeline.reset();
    audit_weights.clear();
    return v;
  }

  struct Planned {
    Plan plan;
    PlanView view;
    std::vector<wire::StageEntry> stages;
  };

  static std::string StageName(const Planned& p, size_t i) {
    return p.view.stages[i].device_name + ", " + p.stages[i].device_id.substr(0, 8);
  }
  // The stage whose key sent the frame the room returned last; -1 for none.
  int StageOfSender(const std::vector<wire::StageEntry>& stages) const {
    for (size_t i = 1; i < stages.size(); ++i)
      if (room->last_sender() == room->KeyOf(stages[i].device_id)) return static_cast<int>(i);
    return -1;
  }
  // The lap timeout: kLapSlack times what the plan predicts for the most positions in flight
  // at once (one prefill chunk per stage), never below the floor o.lap_timeout_s.
  double LapTimeout(double est_seconds_per_token, int positions_in_flight) const {
    constexpr double kLapSlack = 20;
    const double predicted = std::isfinite(est_seconds_per_token) ? est_seconds_per_token * positions_in_flight : 0;
    return std::max(o.lap_timeout_s, kLapSlack * predicted);
  }

  // The plan over the devices in the room now; the head first.
  // A verified turn keeps room on the head for a stage-by-stage Verify (VerifyByStages).
  Result<Planned> PlanNow(int attempt, std::optional<int> stages_wanted, bool verify = false) const {
    std::shared_ptr<const ModelInfo> mi;
    int c = 0;
    {
      std::lock_guard<std::mutex> state(state_mu);
      mi = info;
      c = ctx;
    }
    if (!mi) return FailedPrecondition("no model is loaded");
    const ModelSpec& spec = mi->spec;
    std::vector<DeviceReport> devices = {{id, hello.name, hello.gemms_per_s, hello.free_memory, hello.probe_hash, hello.backend}};
    std::map<std::string, std::string> address_of;
    std::vector<std::string> notes;
    for (const auto& p : room->peers()) {
      address_of[p.hello.device_id] = p.address;
      if (p.hello.device_id == id || !(p.hello.capabilities & wire::kCapCompute)) continue;
      if (std::find(o.exclude_devices.begin(), o.exclude_devices.end(), p.hello.device_id) != o.exclude_devices.end()) continue;
      if (suspects.count(p.hello.device_id)) {
        notes.push_back("left out " + p.hello.name + ": it failed during the last attempt");
        continue;
      }
      devices.push_back({p.hello.device_id, p.hello.name, p.hello.gemms_per_s, p.hello.free_memory, p.hello.probe_hash, p.hello.backend});
    }
    PlanOptions po;
    std::optional<int> want = stages_wanted ? stages_wanted : o.stages;
    if (want && *want <= 0) want.reset();  // 0: automatic
    if (attempt == 0) {
      po.stages = want;
      if (!stages_wanted) po.layer_counts = o.plan;
    } else if (want || o.plan) {
      // Fewer stages if devices are gone.
      const int wanted = o.plan && !stages_wanted ? static_cast<int>(o.plan->size()) : *want;
      po.stages = std::min<int>(wanted, static_cast<int>(devices.size()));
    }
    const PlanModel pm = PlanModelOf(*mi, c);
    if (verify) {
      po.head_reserve_bytes =
          pm.layer_bytes + 2ull * static_cast<uint64_t>(c) * static_cast<uint64_t>(spec.hidden) * sizeof(float);
      po.head_reserve_per_layer = pm.layer_bytes - PlanModelOf(*mi, 0).layer_bytes;
    }
    DAISY_ASSIGN_OR_RETURN(Plan plan, MakePlan(pm, devices, po));
    Planned out;
    out.view.notes = notes;
    for (const auto& n : plan.notes) out.view.notes.push_back(n);
    for (const auto& s : plan.stages) {
      const bool is_head = s.device_id == id;
      const uint64_t bytes = TensorBytes(mi->index, StageTensorNames(spec, s.first, s.end, is_head));
      out.view.stages.push_back({s.device_id, s.device_name, s.first, s.end, bytes, s.need_bytes, s.budget_bytes, 0});
      out.view.hold_bytes.push_back(pm.layer_bytes * static_cast<uint64_t>(s.end - s.first) + (is_head ? pm.head_bytes : 0));
      out.stages.push_back({s.device_id, is_head ? ep->address() : address_of[s.device_id], s.first, s.end});
    }
    out.view.est_seconds_per_token = plan.est_seconds_per_token;
    out.plan = std::move(plan);
    return out;
  }

  Result<PlanView> PreviewPlan(std::optional<int> stages_wanted) const {
    auto p = PlanNow(0, stages_wanted);
    if (p.ok()) return p->view;
    if (p.status().code() == ErrorCode::kFailedPrecondition) return p.status();
    PlanView v;  // a plan that cannot be made: say why, so the user sees it before any download
    v.fits = false;
    v.warning = p.status().message();
    return v;
  }

  HeadSlot& SlotFor(const TurnRequest& r) {
    HeadSlot* best = nullptr;
    if (!r.conversation.empty()) {
      const uint64_t key = XXH64(r.conversation.data(), r.conversation.size(), 0x434f4e56u /* "CONV" */);
      for (auto& s : slots)
        if (s.key == key) best = &s;
      if (!best) best = &NewSlot(key);
    } else {
      // No conversation named: the slot whose ids share the longest prefix with the prompt.
      size_t best_len = 0;
      for (auto& s : slots) {
        const size_t l = CommonPrefix(s.ids, r.prompt_ids);
        if (l > best_len || (l == best_len && best && l > 0 && s.last_used > best->last_used)) {
          best = &s;
          best_len = l;
        }
      }
      if (!best || best_len == 0) best = &NewSlot(XXH64(r.prompt_ids.data(), std::min<size_t>(r.prompt_ids.size(), 16) * sizeof(int32_t), use_clock + 1));
    }
    best->last_used = ++use_clock;
    return *best;
  }

  HeadSlot& NewSlot(uint64_t key) {
    if (static_cast<int>(slots.size()) >= std::max(1, o.cache_slots)) {
      auto lru = std::min_element(slots.begin(), slots.end(), [](const HeadSlot& a, const HeadSlot& b) { return a.last_used < b.last_used; });
      slots.erase(lru);
    }
    slots.push_back(HeadSlot{key, nullptr, {}, "", 0});
    return slots.back();
  }

  Result<HeadReport> Generate(const TurnRequest& r) {
    auto lock = TakeTurn();
    if (!info) return FailedPrecondition("no model is loaded");
    if (r.prompt_ids.empty()) return InvalidArgument("the prompt has no tokens");
    auto say = [&](const std::string& line) {
      if (r.on_status) r.on_status(line);
    };
    if (!joined) DAISY_RETURN_IF_ERROR(JoinRoom());
    const std::optional<int> want = r.stages ? r.stages : o.stages;
    if (want && *want > 1) {
      const auto start = Clock::now();
      auto count = [&] {
        int n = 0;
        for (const auto& p : room->peers())
          if (p.hello.device_id == id || ((p.hello.capabilities & wire::kCapCompute) &&
                                          std::find(o.exclude_devices.begin(), o.exclude_devices.end(), p.hello.device_id) == o.exclude_devices.end()))
            ++n;
        return n;
      };
      if (count() < *want) say("waiting for " + std::to_string(*want) + " devices in room '" + o.room + "'");
      while (count() < *want && Since(start) < o.wait_s) room->Poll(100, 0);
      if (count() < *want)
        return Unavailable("a split over " + std::to_string(*want) + " devices: only " + std::to_string(count()) + " device(s) in room '" + o.room +
                           "' after " + std::to_string(static_cast<int>(o.wait_s)) + " s");
    }
    HeadReport report;
    report.prompt_ids = r.prompt_ids;
    GenerateOptions gen = r.generate;
    for (int eos : info->spec.eos_ids) gen.stop_ids.push_back(eos);
    gen.lookahead = o.lookahead;
    suspects.clear();
    HeadSlot& slot = SlotFor(r);
    std::vector<int32_t> emitted;  // ids already streamed: a replay does not stream them again
    std::string last_error;
    ring_steps.clear();
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (attempt > 0) {
        // A member that died is dropped by the rendezvous once its heartbeats have been
        // silent for net::kDeadAfterSeconds: wait that long (reading the room, and dropping
        // the failed attempt's late frames) so the new plan holds only members alive now.
        say("waiting " + std::to_string(static_cast<int>(o.settle_s)) + " s for the room to drop members that died");
        const auto settle = Clock::now();
        while (Since(settle) < o.settle_s) (void)room->Poll(50, 0);
        say("re-planning around the devices still in the room and replaying the turn from the start");
        ++report.replays;
      }
      GenerateOptions g = gen;
      if (r.fresh_hooks) r.fresh_hooks(g);
      Status turn_status = Turn(report, g, attempt, r, slot, emitted);
      if (turn_status.ok()) break;
      // Whatever the caches hold now is not a finished turn's: start this slot afresh.
      slot.ids.clear();
      slot.plan_sig.clear();
      if (turn_status.code() != ErrorCode::kUnavailable || attempt == 1) {
        if (attempt == 1) return Unavailable("the replay failed too: " + turn_status.message() + " (first failure: " + last_error + ")");
        return turn_status;
      }
      last_error = turn_status.message();
      say("the turn failed: " + last_error);
    }
    if (!report.plan.empty()) report.plan[0].peak_rss_bytes = PeakRssBytes();
    if (r.verify) {
      GenerateOptions g = gen;
      if (r.fresh_hooks) r.fresh_hooks(g);
      // Verify's own peak: the high-water mark starts over from what the head holds now.
      const bool reset = ResetPeakRss();
      const auto started = Clock::now();
      DAISY_RETURN_IF_ERROR(Verify(report, g, say));
      report.verify_seconds = Since(started);
      if (reset) report.verify_peak_rss_bytes = PeakRssBytes();
      if (!report.plan.empty()) report.plan[0].peak_rss_bytes = std::max(report.plan[0].peak_rss_bytes, PeakRssBytes());
    }
    return report;
  }

  Status Turn(HeadReport& report, GenerateOptions gen, int attempt, const TurnRequest& r, HeadSlot& slot, std::vector<int32_t>& emitted) {
    auto say = [&](const std::string& line) {
      if (r.on_status) r.on_status(line);
    };
    const ModelSpec& spec = info->spec;
    const auto turn_start = Clock::now();
    DAISY_ASSIGN_OR_RETURN(Planned planned, PlanNow(attempt, r.stages, r.verify));
    for (const auto& n : planned.view.notes) say("plan: " + n);
    report.plan = planned.view.stages;
    const auto& stages = planned.stages;
    for (size_t i = 0; i < stages.size(); ++i) {
      const auto& s = planned.view.stages[i];
      char line[256];
      std::snprintf(line, sizeof line, "stage %zu: %-24s layers [%2d, %2d)  %8.2f MB%s", i, s.device_name.c_str(), s.first, s.end,
                    static_cast<double>(s.download_bytes) / 1e6, i == 0 ? "  (head: embedding and LM head too)" : "");
      say(line);
    }
    if (planned.view.est_seconds_per_token > 0) {
      char line[96];
      std::snprintf(line, sizeof line, "estimated compute per token: %.2f ms", 1e3 * planned.view.est_seconds_per_token);
      say(line);
    }

    // The prefix this conversation's caches can keep: only under the same plan.
    const std::string sig = PlanSignature(stages, ctx);
    int keep = 0;
    // An audited turn starts from position 0: the auditor rebuilds each audited stage's cache.
    const bool audit = o.audit_rate > 0 && stages.size() > 1;
    if (attempt == 0 && !audit && slot.plan_sig == sig && slot.stage) {
      size_t common = CommonPrefix(slot.ids, r.prompt_ids);
      if (o.test_keep_extra > 0) common = std::min(common + static_cast<size_t>(o.test_keep_extra), slot.ids.size());  // tests only
      keep = static_cast<int>(std::min(common, r.prompt_ids.size() - 1));
    }
    const uint64_t keep_tag = IdsTag(slot.ids);

    // Only this turn's stages may answer the head from now on.
    {
      std::vector<std::string> ids;
      for (size_t i = 1; i < stages.size(); ++i) ids.push_back(stages[i].device_id);
      room->SetStageDevices(ids);
    }
    // Assign every other stage; each fetches its own layers itself.
    ++turn;
    std::map<int, int32_t> ready;  // stage -> positions it kept
    auto assignment_for = [&](size_t i) {
      wire::Assignment a;
      a.turn = turn;
      a.model_id = source->ModelId();
      a.revision = source->Revision();
      a.spec_hash = spec_hash;
      a.model_hash = model_hash;
      a.ctx = ctx;
      a.stages = stages;
      a.your_stage = static_cast<int32_t>(i);
      a.cache_key = slot.key;
      a.keep = keep;
      a.keep_tag = keep_tag;
      a.audit = audit;
      return a;
    };
    for (size_t i = 1; i < stages.size(); ++i) {
      Status sent = ep->Send(stages[i].address, wire::Message(assignment_for(i)), 3000);
      if (!sent.ok()) {
        suspects.insert(stages[i].device_id);
        return Unavailable("could not reach " + stages[i].device_id.substr(0, 8) + ": " + sent.message());
      }
    }
    // The head's own slice meanwhile.
    const auto& mine = planned.plan.stages[0];
    if (!head_weights || head_weights->first() != mine.first || head_weights->end() != mine.end) {
      // Every slot's HeadStage points at the old weights: the caches go with them.
      for (auto& s : slots) {
        s.stage.reset();
        s.ids.clear();
        s.plan_sig.clear();
      }
      head_weights.reset();
      auto last = Clock::now() - std::chrono::seconds(1);
      DAISY_ASSIGN_OR_RETURN(StageWeights w, StageWeights::Load(*source, *info, mine.first, mine.end, true, [&](const TransferProgress& p) {
        if (r.on_progress && (Since(last) > 0.25 || p.bytes_done >= p.bytes_total)) {
          last = Clock::now();
          r.on_progress({0, id, hello.name, std::min(p.bytes_done, p.bytes_total), p.bytes_total});
        }
      }));
      head_weights = std::make_unique<StageWeights>(std::move(w));
    }
    if (!slot.stage || slot.stage->ctx() != ctx) {
      slot.stage = std::make_unique<HeadStage>(*head_weights, ctx, nullptr);
      keep = 0;
    }
    if (stages.size() > 1) say("waiting for " + std::to_string(stages.size() - 1) + " stage(s) to fetch their layers");
    // Every wait ends: a stage that leaves the room (its heartbeats stopped) ends it at once;
    // one that is alive but reports no progress for load_stall_s, or stays busy with another
    // head's turn for busy_wait_s, ends it with its name.
    const auto wait_start = Clock::now();
    std::map<int, Clock::time_point> last_sign;  // stage -> its last progress (or the assignment)
    std::map<int, Clock::time_point> resent;  // stage -> when its assignment was last sent
    for (size_t i = 1; i < stages.size(); ++i) last_sign[static_cast<int>(i)] = resent[static_cast<int>(i)] = wait_start;
    auto last_busy = Clock::now() - std::chrono::seconds(10);  // our last "busy" answer
    std::optional<Clock::time_point> busy_since;  // since when the ring has been busy
    while (ready.size() + 1 < stages.size()) {
      if (busy_since && Since(last_busy) > 3.0) busy_since.reset();  // the other turn ended
      // A stage busy with another head's turn said so: ask again every second.
      if (busy_since && Since(last_busy) > 1.0) {
        last_busy = Clock::now();
        for (size_t i = 1; i < stages.size(); ++i)
          if (!ready.count(static_cast<int>(i))) (void)ep->Send(stages[i].address, wire::Message(assignment_for(i)), 1000);
      }
      // A stage not heard from at all may have dropped the assignment as from a stranger (its
      // list of the room was older than this head's join): send it again every 5 s.
      for (auto& [stage, at] : resent)
        if (last_sign.at(stage) == wait_start && Since(at) > 5.0) {  // never heard from
          at = Clock::now();
          (void)ep->Send(stages[static_cast<size_t>(stage)].address, wire::Message(assignment_for(static_cast<size_t>(stage))), 1000);
        }
      auto m = room->Poll(100, 0);
      for (size_t i = 1; i < stages.size(); ++i)
        if (!room->Has(stages[i].device_id)) {
          suspects.insert(stages[i].device_id);
          return Unavailable("stage " + std::to_string(i) + " (" + StageName(planned, i) + ") left before it was ready: its heartbeats stopped");
        }
      if (busy_since && Since(*busy_since) > o.busy_wait_s)
        return Unavailable("the ring stayed busy with another head's turn for " + std::to_string(static_cast<int>(o.busy_wait_s)) + " s; try again later");
      for (const auto& [stage, at] : last_sign)
        if (!ready.count(stage) && Since(at) > o.load_stall_s) {
          suspects.insert(stages[static_cast<size_t>(stage)].device_id);
          return Unavailable("stage " + std::to_string(stage) + " (" + StageName(planned, static_cast<size_t>(stage)) + ") reported no progress for " +
                             std::to_string(static_cast<int>(o.load_stall_s)) + " s while fetching its layers; giving up on it");
        }
      if (!m) continue;
      const int from = StageOfSender(stages);
      if (from >= 1) last_sign[from] = Clock::now();
      if (auto* rd = std::get_if<wire::Ready>(&*m)) {
        if (rd->stage >= 1 && static_cast<size_t>(rd->stage) < stages.size() && rd->stage == from) {
          ready[rd->stage] = rd->kept;
          report.plan[static_cast<size_t>(rd->stage)].peak_rss_bytes = rd->peak_rss;
        }
      } else if (auto* pg = std::get_if<wire::Progress>(&*m)) {
        if (pg->turn == turn && pg->stage >= 1 && static_cast<size_t>(pg->stage) < stages.size() && r.on_progress)
          r.on_progress({pg->stage, stages[static_cast<size_t>(pg->stage)].device_id, planned.view.stages[static_cast<size_t>(pg->stage)].device_name,
                         pg->bytes_done, pg->bytes_total});
      } else if (auto* e = std::get_if<wire::ErrorMsg>(&*m)) {
        if (e->code == wire::kErrBusy) {
          // Another head's turn holds the ring: wait for it, asking again every second.
          if (!busy_since) {
            say("waiting for the turn in progress (" + e->message + ")");
            busy_since = Clock::now();
          }
          last_busy = Clock::now();  // asked again a second after this answer
        } else if (e->code == wire::kErrAssignment) {
          return InvalidArgument("a stage refused its assignment: " + e->message);
        } else {
          // A late word about an earlier attempt's hop: not about this assignment.
          LogInfo("head: while waiting for ready, a stage said: " + e->message);
        }
      }
    }
    if (stages.size() > 1) say("all stages ready");
    report.ready_seconds = Since(turn_start);
    // Links that broke before the laps are not the laps' fault: a handshake refused while a
    // stage had not yet heard of this head was retried by Send, and the assignment got there.
    (void)ep->TakeDropped();
    // Every stage must hold the prefix: start where the shortest kept cache ends.
    for (const auto& [stage, kept] : ready) keep = std::min<int>(keep, kept);
    slot.stage->Truncate(keep);
    if (keep > 0) say("prefix cache: reusing " + std::to_string(keep) + " of " + std::to_string(r.prompt_ids.size()) + " prompt positions");

    // Pipelined prefill: chunks of kRingPrefillChunk positions, one per stage in the rest of
    // the ring plus one on its way, so every stage works on its own chunk while the head
    // embeds and runs the next; each stage still sees the chunks in position order.
    if (stages.size() > 1) {
      if (gen.prefill_chunk == 0) gen.prefill_chunk = kRingPrefillChunk;
      gen.prefill_in_flight = static_cast<int>(stages.size());
    }
    // A lap is given up only when it takes far longer than the plan predicts for the
    // positions in flight, and never sooner than the floor.
    const double lap_timeout = LapTimeout(planned.view.est_seconds_per_token,
                                          std::max(gen.prefill_chunk, 1) * std::max(gen.prefill_in_flight, 2));
    NetLink link(*ep, *room, stages, static_cast<int32_t>(turn), model_hash, spec.hidden, lap_timeout);
    if (audit) {
      AuditSetup a;
      a.rate = o.audit_rate;
      a.rng = &audit_rng;
      a.source = source.get();
      a.info = info.get();
      a.ctx = ctx;
      a.weights = &audit_weights;
      a.keys = &keys;
      for (const auto& sv : planned.view.stages) a.names.push_back(sv.device_name);
      link.EnableAudit(std::move(a));
    }
    slot.stage->set_link(stages.size() > 1 ? &link : nullptr);
    struct Unlink {
      HeadStage* s;
      ~Unlink() { s->set_link(nullptr); }
    } unlink{slot.stage.get()};
    Generator generator(*slot.stage);
    TextStream stream(*tokenizer, report.prompt_ids);
    std::vector<int32_t> ids;
    bool diverged = false;
    auto on_token = [&](int32_t tid, std::span<const float>) {
      ids.push_back(tid);
      const std::string piece = stream.Add(tid);
      if (ids.size() > emitted.size()) {
        emitted.push_back(tid);
        if (r.on_token) r.on_token(tid, piece);
      } else if (emitted[ids.size() - 1] != tid) {
        diverged = true;  // a replay must give the same ids; refuse to stream a different text
      }
      const int32_t pos = static_cast<int32_t>(report.prompt_ids.size() + ids.size() - 1);
      for (size_t i = 1; i < stages.size(); ++i)
        (void)ep->Send(stages[i].address, wire::Message(wire::Token{static_cast<int32_t>(turn), pos, tid}), 500);
    };
    gen.first_position = keep;
    // An audited turn re-runs hops from each stage's kept inputs in position order, which a
    // rewind over rejected drafts would break: it decodes one position per lap.
    if (audit) gen.lookahead = 0;
    // Only a verified turn digests its steps: two BLAKE2b passes over the logits per token
    // would otherwise sit in every token loop for nothing.
    std::vector<StepDigest> step_digests;
    if (r.verify) DigestSteps(gen, step_digests);
    const auto started = Clock::now();
    auto result = generator.Generate(report.prompt_ids, gen, on_token);
    const double wall = Since(started);
    report.audited_hops += link.audited();
    report.recomputed_hops += link.recomputed();
    if (!result.ok()) {  // Unavailable: a ring fault, replayed once without that device
      if (!link.failed_device().empty()) suspects.insert(link.failed_device());
      if (!link.also_failed().empty()) suspects.insert(link.also_failed());
      if (link.bad_position()) {
        // Tokens sampled from a corrupted position on are not trusted: the replay gives them anew.
        report.audit_failures.push_back(result.status().message());
        const int64_t trusted = std::max<int64_t>(0, *link.bad_position() - static_cast<int64_t>(report.prompt_ids.size()) + 1);
        if (static_cast<int64_t>(emitted.size()) > trusted) {
          say("audit: " + std::to_string(emitted.size() - static_cast<size_t>(trusted)) + " token(s) already shown came after the corrupted hop; the replay replaces them");
          emitted.resize(static_cast<size_t>(trusted));
          if (r.on_retract) r.on_retract(emitted.size());
        }
      }
      return result.status();
    }
    if (diverged) return DataLoss("the replay produced different token ids than the first attempt");
    ring_steps = std::move(step_digests);
    if (r.on_token) {
      const std::string tail = stream.Finish();
      if (!tail.empty()) r.on_token(-1, tail);
    } else {
      stream.Finish();
    }
    // What every stage's cache holds now: the prompt and the generated ids that were fed.
    std::vector<int32_t> fed = report.prompt_ids;
    fed.insert(fed.end(), result->ids.begin(), result->ids.begin() + std::min<size_t>(result->ids.size(), static_cast<size_t>(result->decode_steps)));
    const uint64_t tag = IdsTag(fed);
    const auto reason = result->finish_reason == FinishReason::kStop ? wire::FinishReason::kStop : wire::FinishReason::kLength;
    for (size_t i = 1; i < stages.size(); ++i)
      (void)ep->Send(stages[i].address, wire::Message(wire::Done{static_cast<int32_t>(turn), reason, static_cast<int32_t>(fed.size()), tag}), 500);
    if (slot.stage->length() == static_cast<int>(fed.size())) {
      slot.ids = std::move(fed);
      slot.plan_sig = sig;
    } else {
      slot.ids.clear();
      slot.plan_sig.clear();
    }
    report.ids = result->ids;
    report.text = stream.Completion();
    report.finish_reason = std::string(FinishReasonName(result->finish_reason));
    report.prefill_seconds = result->prefill_seconds;
    report.decode_seconds = result->decode_seconds;
    report.tokens_per_s = result->decode_seconds > 0 ? result->decode_steps / result->decode_seconds : 0;
    report.ring_hops = link.hops();
    report.ring_positions = link.positions();
    report.reused_positions = keep;
    report.laps = link.laps();
    report.drafted = result->drafted;
    report.accepted = result->accepted;
    report.lap_seconds = link.lap_seconds();
    // Each stage's share: the others say after done; the head's is what the laps did not take.
    report.stage_latency.clear();
    const int64_t steps = static_cast<int64_t>(result->decode_laps) + 1;
    report.stage_latency.push_back({0, id, hello.name, steps, std::max(0.0, wall - link.lap_seconds())});
    for (size_t i = 1; i < stages.size(); ++i)
      report.stage_latency.push_back({static_cast<int>(i), stages[i].device_id, planned.view.stages[i].device_name, 0, 0});
    size_t got = 0;
    const auto stats_start = Clock::now();
    while (got + 1 < stages.size() && Since(stats_start) < 0.5) {
      auto m = room->Poll(20, 0);
      if (!m) continue;
      if (auto* st = std::get_if<wire::StageStats>(&*m); st && st->seq == static_cast<int32_t>(turn) && st->stage >= 1 &&
                                                          static_cast<size_t>(st->stage) < stages.size()) {
        auto& l = report.stage_latency[static_cast<size_t>(st->stage)];
        if (l.hops == 0) ++got;
        l.hops = st->hops;
        l.compute_seconds = st->compute_seconds;
        auto& peak = report.plan[static_cast<size_t>(st->stage)].peak_rss_bytes;
        peak = std::max(peak, st->peak_rss);
      }
    }
    return Status::Ok();
  }

  // Bytes the head holds now beside any verify: its slice and the KV caches of its slots.
  uint64_t HeldNow() const {
    uint64_t held = head_weights ? head_weights->Bytes() : 0;
    for (const auto& s : slots)
      if (s.stage) held += s.stage->CacheBytes();
    return held;
  }

  template <typename Say>
  Status Verify(HeadReport& report, const GenerateOptions& gen, Say&& say) {
    const uint64_t budget = hello.free_memory;
    const uint64_t whole = PlanModelOf(*info, ctx).Need(info->spec.n_layers, true);
    if (verify_pipeline || whole + HeldNow() <= budget) {
      report.verify_mode = "whole model";
      say("verifying: running the whole model on this device");
      return VerifyWhole(report, gen);
    }
    report.verify_mode = "stage by stage";
    say("verifying stage by stage: the whole model (" + FormatBytes(whole) +
        ") does not fit this device's memory budget (" + FormatBytes(budget) + ", " + FormatBytes(HeldNow()) +
        " held now), so the turn is re-run one slice of layers at a time");
    return VerifyByStages(report, gen, say);
  }

  Status VerifyWhole(HeadReport& report, const GenerateOptions& gen) {
    if (!verify_pipeline) {
      const int all[] = {info->spec.n_layers};
      DAISY_ASSIGN_OR_RETURN(LocalPipeline local, LocalPipeline::Load(*source, *info, all, ctx));
      verify_pipeline = std::make_unique<LocalPipeline>(std::move(local));
    }
    Generator g(verify_pipeline->head());
    GenerateOptions single_gen = gen;
    std::vector<StepDigest> single_steps;
    DigestSteps(single_gen, single_steps);
    DAISY_ASSIGN_OR_RETURN(GenerateResult single, g.Generate(report.prompt_ids, single_gen));
    Compare(report, report.ids, ring_steps, single.ids, single_steps);
    return Status::Ok();
  }

  // The rest of the model for a Verify that never holds it: the hidden states after the last
  // layer of every position of the turn, computed beforehand slice by slice. The head's own
  // layers run live; a batch whose input rows are not the ones the slices were computed from
  // (the single-device run chose another token) ends the run as diverged.
  class ReplayLink final : public StageLink {
   public:
    ReplayLink(const std::vector<float>& in, const std::vector<float>& out, int hidden)
        : in_(in), out_(out), hidden_(hidden) {}
    Result<HiddenStates> Run(HiddenStates h) override {
      const size_t row = static_cast<size_t>(hidden_);
      const size_t at = static_cast<size_t>(h.positions.front()) * row;
      if (at + h.values.size() > in_.size() ||
          std::memcmp(in_.data() + at, h.values.data(), h.values.size() * sizeof(float)) != 0) {
        diverged_ = true;
        return DataLoss("the single-device run left the ring's token sequence at position " +
                        std::to_string(h.positions.front()));
      }
      std::copy(out_.begin() + static_cast<std::ptrdiff_t>(at),
                out_.begin() + static_cast<std::ptrdiff_t>(at + h.values.size()), h.values.begin());
      return h;
    }
    bool diverged() const { return diverged_; }

   private:
    const std::vector<float>& in_;
    const std::vector<float>& out_;
    int hidden_;
    bool diverged_ = false;
  };

  // Stage-by-stage Verify (the chunked, cached and one-shot passes give the same bits): the
  // turn's positions go through the head's layers, then through each later slice of layers,
  // fetched (from the disk cache when present), run over every position at once and freed,
  // keeping only the hidden states; then the single-device generator runs on the head with
  // those final rows and its steps are compared with the ring's.
  template <typename Say>
  Status VerifyByStages(HeadReport& report, const GenerateOptions& gen, Say&& say) {
    const ModelSpec& spec = info->spec;
    std::vector<int32_t> seq = report.prompt_ids;
    seq.insert(seq.end(), report.ids.begin(), report.ids.end());
    if (static_cast<int>(seq.size()) > ctx) seq.resize(static_cast<size_t>(ctx));
    const int n = static_cast<int>(seq.size());
    const uint64_t states = 2ull * static_cast<uint64_t>(n) * static_cast<uint64_t>(spec.hidden) * sizeof(float);
    // Slices: the ring's stages, each cut further until it fits beside what the head holds.
    const PlanModel pm = PlanModelOf(*info, n);
    // The head's layers get a second KV cache for the replayed run.
    const uint64_t head_kv = static_cast<uint64_t>(head_weights->end() - head_weights->first()) *
                             (PlanModelOf(*info, ctx).layer_bytes - PlanModelOf(*info, 0).layer_bytes);
    const uint64_t fixed = HeldNow() + head_kv + states + pm.working_bytes;
    const uint64_t budget = hello.free_memory;
    if (pm.layer_bytes > 0 && fixed + pm.layer_bytes > budget)
      return ResourceExhausted("stage-by-stage Verify needs " + FormatBytes(fixed + pm.layer_bytes) +
                               " for one layer beside what this device holds (" + FormatBytes(HeldNow()) +
                               ") and the turn's hidden states (" + FormatBytes(states) +
                               "), but its memory budget is " + FormatBytes(budget) + "; nothing was fetched");
    const int per_slice = pm.layer_bytes > 0
                              ? static_cast<int>(std::min<uint64_t>((budget - fixed) / pm.layer_bytes, spec.n_layers))
                              : spec.n_layers;
    std::vector<std::pair<int, int>> slices;
    for (size_t i = 1; i < report.plan.size(); ++i)
      for (int a = report.plan[i].first; a < report.plan[i].end; a += per_slice)
        slices.push_back({a, std::min(report.plan[i].end, a + per_slice)});
    const int head_end = head_weights->end();
    if (report.plan.empty() || report.plan[0].end != head_end) return Internal("Bug: Verify without the turn's plan");

    // The head's own layers over every position: the rows it sends to stage 1.
    DAISY_ASSIGN_OR_RETURN(HiddenStates h, Embed(*head_weights, seq, 0));
    {
      KvCache kv(spec, 0, head_end, n);
      DAISY_RETURN_IF_ERROR(RunLayers(*head_weights, 0, head_end, h, kv));
    }
    const std::vector<float> first_rows = h.values;
    for (size_t k = 0; k < slices.size(); ++k) {
      const auto [a, b] = slices[k];
      say("verifying: layers [" + std::to_string(a) + ", " + std::to_string(b) + ") (slice " + std::to_string(k + 1) +
          " of " + std::to_string(slices.size()) + ") over " + std::to_string(n) + " positions");
      DAISY_ASSIGN_OR_RETURN(StageWeights w, StageWeights::Load(*source, *info, a, b, false));
      KvCache kv(spec, a, b, n);
      DAISY_RETURN_IF_ERROR(RunLayers(w, a, b, h, kv));
    }  // each slice and its cache are freed before the next is fetched
    ReplayLink replay(first_rows, h.values, spec.hidden);
    HeadStage stage(*head_weights, ctx, &replay);
    Generator g(stage);
    GenerateOptions single_gen = gen;
    single_gen.prefill_chunk = 0;  // the whole prompt at once: the same bits as any chunking
    single_gen.prefill_in_flight = 1;
    single_gen.first_position = 0;
    std::vector<StepDigest> single_steps;
    DigestSteps(single_gen, single_steps);
    std::vector<int32_t> single_ids;
    auto single = g.Generate(report.prompt_ids, single_gen,
                             [&](int32_t id, std::span<const float>) { single_ids.push_back(id); });
    if (!single.ok() && !replay.diverged()) return single.status();
    Compare(report, report.ids, ring_steps, single_ids, single_steps);
    return Status::Ok();
  }
};

HeadSession::HeadSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HeadSession::~HeadSession() = default;

Result<std::unique_ptr<HeadSession>> HeadSession::Start(const SessionOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  DAISY_ASSIGN_OR_RETURN(impl->keys, DeviceKeys(DeviceHome(), options.role));
  impl->id = net::KeyId(impl->keys.public_key);
  DAISY_ASSIGN_OR_RETURN(impl->ep, net::Endpoint::Bind(options.bind_host, 0, impl->keys));
  impl->room = std::make_unique<Room>(*impl->ep);
  // The head serves no other head's hops, so it does not offer itself as compute.
  impl->hello = MeasureHello(impl->id, options.name, wire::kCapHead, MemoryBudget(options.max_memory));
  if (options.join_at_start) {
    auto lock = impl->TakeTurn();
    DAISY_RETURN_IF_ERROR(impl->JoinRoom());
  }
  impl->audit_rng.seed(options.audit_seed != 0 ? options.audit_seed : (static_cast<uint64_t>(std::random_device{}()) << 32 | std::random_device{}()));
  Impl* raw = impl.get();
  impl->idle = std::thread([raw] { raw->IdleLoop(); });
  return std::unique_ptr<HeadSession>(new HeadSession(std::move(impl)));
}

const std::string& HeadSession::device_id() const { return impl_->id; }
std::vector<wire::Peer> HeadSession::Peers() const { return impl_->room->peers(); }
Result<ModelView> HeadSession::Load(const std::string& source, int ctx) { return impl_->Load(source, ctx); }
std::optional<ModelView> HeadSession::model() const {
  std::lock_guard<std::mutex> state(impl_->state_mu);
  return impl_->view;
}
std::shared_ptr<const Tokenizer> HeadSession::tokenizer() const {
  std::lock_guard<std::mutex> state(impl_->state_mu);
  return impl_->tokenizer;
}
Result<PlanView> HeadSession::PreviewPlan(std::optional<int> stages) const { return impl_->PreviewPlan(stages); }
Result<HeadReport> HeadSession::Generate(const TurnRequest& request) { return impl_->Generate(request); }
void HeadSession::ClearCache() {
  auto lock = impl_->TakeTurn();
  impl_->slots.clear();
}


Result<HeadReport> RunHead(const HeadOptions& options) {
  SessionOptions so = options.session;
  so.cache_slots = 1;
  so.join_at_start = false;  // the model first: a bad SRC is refused before the room is joined
  DAISY_ASSIGN_OR_RETURN(std::unique_ptr<HeadSession> session, HeadSession::Start(so));
  DAISY_RETURN_IF_ERROR(session->Load(options.model, options.ctx).status());
  TurnRequest r;
  DAISY_ASSIGN_OR_RETURN(r.prompt_ids, session->tokenizer()->Encode(options.prompt, true));
  r.generate = options.generate;
  r.verify = options.verify;
  if (options.on_text) r.on_token = [&](int32_t, std::string_view text) { options.on_text(text); };
  r.on_status = options.on_status;
  r.on_retract = [&](size_t kept) {
    if (options.on_status)
      options.on_status("audit: the text above after generated token " + std::to_string(kept) + " came from a corrupted hop; the replay continues from there");
  };
  return session->Generate(r);
}

}  // namespace daisy
