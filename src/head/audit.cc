// The stage audit: digests, receipts and re-runs (audit.h).
#include "audit.h"

#include <sodium.h>

#include <chrono>

namespace daisy::head {

namespace {
using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

StageAudit::StageAudit(const AuditSetup& setup, HeadRoom& room, const Plan& plan, int32_t seq, uint32_t model_hash,
                       int hidden, double lap_timeout_s)
    : setup_(setup),
      room_(room),
      plan_(plan),
      seq_(seq),
      model_hash_(model_hash),
      hidden_(hidden),
      lap_timeout_s_(lap_timeout_s),
      shadows_(plan.stages.size()) {}

void StageAudit::Sent(int32_t position, std::span<const float> rows) {
  sent_digest_[position] = wire::RowsDigest(rows);
}

bool StageAudit::Take(const wire::Message& message) {
  const auto* d = std::get_if<wire::HopDigest>(&message);
  if (!d) return false;
  if (d->seq == seq_ && room_.FromStage(plan_, d->stage)) digests_[{d->stage, d->token_index}] = *d;
  return true;
}

// A digest not yet read is waited for a while; frames for others are put back.
Result<wire::HopDigest> StageAudit::Digest(int stage, int32_t token_index) {
  const auto start = Clock::now();
  while (Since(start) < 5.0) {
    auto it = digests_.find({stage, token_index});
    if (it != digests_.end()) return it->second;
    auto m = room_.Poll(20, hidden_);
    if (m && !Take(*m)) room_.Unread(std::move(*m), room_.last_sender());
  }
  failed_device_ = plan_.stages[static_cast<size_t>(stage)].device_id;
  return Unavailable("audit: " + Who(stage) + " sent no digest for its hop at position " + std::to_string(token_index));
}

std::string StageAudit::Who(int stage) const {
  const auto& s = plan_.stages[static_cast<size_t>(stage)];
  return "stage " + std::to_string(stage) + " (" + s.device_name + ", " + s.device_id.substr(0, 8) + ")";
}

Status StageAudit::Blame(int stage, int32_t position, const std::string& what) {
  failed_device_ = plan_.stages[static_cast<size_t>(stage)].device_id;
  if (!bad_position_ || position < *bad_position_) bad_position_ = position;
  return Unavailable("audit: " + Who(stage) + " " + what + "; it is excluded");
}

// The evidence cannot tell which of two neighbours lied: both are excluded, never the
// receiver alone.
Status StageAudit::BlameBoth(int sender, int receiver, int32_t position, const std::string& what) {
  failed_device_ = plan_.stages[static_cast<size_t>(receiver)].device_id;
  also_failed_ = plan_.stages[static_cast<size_t>(sender)].device_id;
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
Status StageAudit::CheckLink(int s, int32_t token_index, int rows, const wire::HopDigest& d) {
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
    return Blame(s - 1, token_index,
                 "gave the next stage a receipt for other rows than the ones it reported" + at +
                     " (it sent rows other than its honest output)");
  if (d.in_digest != r.digest)
    return BlameBoth(s - 1, s, token_index,
                     Who(s) + " reports receiving rows other than the ones " + Who(s - 1) + "'s receipt covers" + at);
  return Status::Ok();
}

// The receipt key this head shares with stage s.
Result<std::array<uint8_t, 32>> StageAudit::KeyFor(int s) {
  auto it = keys_.find(s);
  if (it != keys_.end()) return it->second;
  DAISY_ASSIGN_OR_RETURN(auto key,
                         net::AuditKey(*setup_.keys, room_.KeyOf(plan_.stages[static_cast<size_t>(s)].device_id)));
  keys_[s] = key;
  return key;
}

Status StageAudit::AfterLap(int32_t token_index, int rows, std::span<const float> returned) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int n = static_cast<int>(plan_.stages.size());
  for (int s = 1; s < n; ++s) {
    if (u(*setup_.rng) >= setup_.rate) continue;
    ++audited_;
    DAISY_ASSIGN_OR_RETURN(wire::HopDigest d, Digest(s, token_index));
    if (d.rows != rows) return Blame(s, token_index, "reported a hop of the wrong size");
    // Its input must be what the previous stage (or the head) sent.
    if (s == 1) {
      if (d.in_digest != sent_digest_[token_index])
        return Blame(
            s, token_index,
            "reports an input other than the one this head sent it at position " + std::to_string(token_index));
    } else {
      DAISY_RETURN_IF_ERROR(CheckLink(s, token_index, rows, d));
    }
    if (s == n - 1 && d.out_digest != wire::RowsDigest(returned))
      return Blame(s, token_index,
                   "reports an output other than the one that came back at position " + std::to_string(token_index));
    DAISY_RETURN_IF_ERROR(Rerun(s, token_index + rows));
  }
  return Status::Ok();
}

// Stage s's inputs [from, end), as it kept them.
Result<wire::AuditData> StageAudit::AskInputs(int s, int32_t from, int32_t end) {
  DAISY_RETURN_IF_ERROR(room_.member().Send(plan_.stages[static_cast<size_t>(s)].address,
                                            wire::Message(wire::AuditRequest{seq_, from, end}), 3000));
  const auto start = Clock::now();
  while (Since(start) < lap_timeout_s_) {
    auto m = room_.Poll(20, hidden_);
    if (!m) continue;
    if (auto* ad = std::get_if<wire::AuditData>(&*m);
        ad && ad->seq == seq_ && ad->stage == s && ad->from == from && room_.FromStage(plan_, s)) {
      return std::move(*ad);
    } else if (auto* e = std::get_if<wire::ErrorMsg>(&*m); e && e->code == wire::ErrorKind::kAudit) {
      return Blame(s, from, "did not answer the audit: " + e->message);
    } else if (!Take(*m)) {
      room_.Unread(std::move(*m), room_.last_sender());
    }
  }
  return Blame(s, from, "did not answer the audit within " + std::to_string(static_cast<int>(lap_timeout_s_)) + " s");
}

// Re-runs stage s on this device over its inputs [shadow, end) and compares every hop's
// output with the digest the stage committed to.
Status StageAudit::Rerun(int s, int32_t end) {
  Shadow& sh = shadows_[static_cast<size_t>(s)];
  if (sh.len >= end) return Status::Ok();
  const auto& st = plan_.stages[static_cast<size_t>(s)];
  auto& w = (*setup_.weights)[{st.first, st.end}];
  if (!w) {
    DAISY_ASSIGN_OR_RETURN(StageWeights loaded,
                           StageWeights::Load(*setup_.source, *setup_.info, st.first, st.end, false, {}));
    w = std::make_unique<StageWeights>(std::move(loaded));
  }
  if (!sh.kv) sh.kv = std::make_unique<KvCache>(setup_.info->spec, st.first, st.end, setup_.ctx);
  DAISY_ASSIGN_OR_RETURN(wire::AuditData data, AskInputs(s, sh.len, end));
  const size_t rows = static_cast<size_t>(end - sh.len);
  if (data.values.size() != rows * static_cast<size_t>(hidden_))
    return Blame(s, sh.len, "sent audit inputs of the wrong size");
  // The hops in [sh.len, end), in order, each input checked against its digest.
  std::vector<wire::HopDigest> hops;
  const size_t width = static_cast<size_t>(hidden_);
  for (int32_t p = sh.len; p < end;) {
    DAISY_ASSIGN_OR_RETURN(wire::HopDigest d, Digest(s, p));
    if (d.rows <= 0 || p + d.rows > end) return Blame(s, p, "reported hops that do not tile its positions");
    const auto rows_of = std::span<const float>(data.values)
                             .subspan(static_cast<size_t>(p - sh.len) * width, static_cast<size_t>(d.rows) * width);
    if (wire::RowsDigest(rows_of) != d.in_digest)
      return Blame(s, p, "sent audit inputs that differ from the ones it reported at position " + std::to_string(p));
    hops.push_back(d);
    p += d.rows;
  }
  HiddenStates h;
  h.hidden = hidden_;
  for (int32_t p = sh.len; p < end; ++p) h.positions.push_back(p);
  h.values = std::move(data.values);
  DAISY_RETURN_IF_ERROR(RunLayers(*w, st.first, st.end, h, *sh.kv));
  for (const auto& d : hops) {
    const auto out = std::span<const float>(h.values).subspan(static_cast<size_t>(d.token_index - sh.len) * width,
                                                              static_cast<size_t>(d.rows) * width);
    ++recomputed_;
    if (wire::RowsDigest(out) != d.out_digest)
      return Blame(
          s, d.token_index,
          "returned wrong bits for its hop at position " + std::to_string(d.token_index) + " (the re-run differs)");
  }
  sh.len = end;
  return Status::Ok();
}

}  // namespace daisy::head
