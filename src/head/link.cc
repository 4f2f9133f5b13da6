// The ring as the head's StageLink (link.h).
#include "link.h"

namespace daisy::head {

namespace {
double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

void NetLink::EnableAudit(const AuditSetup& setup) {
  audit_ = std::make_unique<StageAudit>(setup, room_, plan_, seq_, model_hash_, hidden_, lap_timeout_s_);
}

const std::string& NetLink::failed_device() const {
  return audit_ && !audit_->failed_device().empty() ? audit_->failed_device() : failed_device_;
}

const std::string& NetLink::also_failed() const {
  static const std::string kNone;
  return audit_ ? audit_->also_failed() : kNone;
}

Status NetLink::Submit(HiddenStates hidden) {
  if (audit_) audit_->Sent(hidden.positions.front(), hidden.values);
  DAISY_ASSIGN_OR_RETURN(OutgoingHop hop, EncodeHop(plan_, 0, seq_, model_hash_, hidden));
  Status sent = room_.member().Send(hop.address, wire::Message(std::move(hop.activation)), 3000);
  if (!sent.ok()) {
    failed_device_ = plan_.stages[1].device_id;
    return Unavailable("stage 1 (" + plan_.stages[1].device_id.substr(0, 8) + ") is unreachable: " + sent.message());
  }
  hops_ += static_cast<int64_t>(plan_.stages.size());
  positions_ += static_cast<int64_t>(hidden.positions.size());
  ++laps_;
  if (pending_.empty()) busy_since_ = Clock::now();
  pending_.push_back({std::move(hidden.positions), Clock::now()});
  return Status::Ok();
}

std::optional<Status> NetLink::RingBroken() {
  // A link to a stage that broke mid-turn (the receiver dropped the connection, as it does
  // when a frame fails authentication) lost what was in flight.
  for (const auto& addr : room_.member().endpoint().TakeDropped())
    for (size_t i = 1; i < plan_.stages.size(); ++i)
      if (plan_.stages[i].address == addr) {
        failed_device_ = plan_.stages[i].device_id;
        return Unavailable(
            "the link to stage " + std::to_string(i) + " (" + plan_.stages[i].device_id.substr(0, 8) +
            ") broke: the connection was dropped (a frame that fails authentication is refused by its receiver)");
      }
  for (size_t i = 1; i < plan_.stages.size(); ++i)
    if (room_.seen_peers() && !room_.Has(plan_.stages[i].device_id)) {
      failed_device_ = plan_.stages[i].device_id;
      return Unavailable("stage " + std::to_string(i) + " (" + plan_.stages[i].device_id.substr(0, 8) +
                         ") left the ring");
    }
  if (std::string r = room_.TakeRefusal(); !r.empty()) return Unavailable("a returning activation was refused: " + r);
  return std::nullopt;
}

// Blames the right device: a stage that could not reach the next one names the next.
Status NetLink::StageFailed(const wire::ErrorMsg& e) {
  const int i = room_.StageOfSender(plan_);
  if (i >= 1) {
    const size_t culprit = static_cast<size_t>(e.code == wire::ErrorKind::kNextUnreachable ? i + 1 : i);
    if (culprit < plan_.stages.size()) failed_device_ = plan_.stages[culprit].device_id;
  }
  return Unavailable("a stage failed: " + e.message);
}

Result<HiddenStates> NetLink::Collect() {
  if (pending_.empty()) return Internal("Bug: Collect without a Submit");
  const auto start = pending_.front().sent;
  const int32_t want = pending_.front().positions.front();
  while (Since(start) < lap_timeout_s_) {
    auto m = room_.Next(50, hidden_);
    if (m && audit_ && audit_->Take(*m)) continue;
    if (auto broken = RingBroken()) return *broken;
    if (!m) continue;
    if (auto* e = std::get_if<wire::ErrorMsg>(&*m)) return StageFailed(*e);
    auto* back = std::get_if<wire::Activation>(&*m);
    if (!back || back->seq != seq_ || back->next != wire::kNextReturn) continue;  // stale or not ours
    if (back->token_index != want) continue;
    // The return leg is the last stage's alone: another member cannot answer for it.
    if (room_.last_sender() != room_.KeyOf(plan_.stages.back().device_id)) continue;
    Pending done = std::move(pending_.front());
    pending_.pop_front();
    if (back->model_hash != model_hash_) return Unavailable("the returning activation carries another model's hash");
    auto rows = DecodeHop(*back, hidden_);
    if (!rows.ok() || rows->positions != done.positions)
      return Unavailable("the returning activation has the wrong size");
    if (pending_.empty()) lap_seconds_ += Since(busy_since_);  // overlapping laps count once
    if (audit_) DAISY_RETURN_IF_ERROR(audit_->AfterLap(want, rows->n_tokens(), rows->values));
    return std::move(*rows);
  }
  return Unavailable("a lap stalled: no activation came back within " +
                     std::to_string(static_cast<int>(lap_timeout_s_)) + " s");
}

}  // namespace daisy::head
