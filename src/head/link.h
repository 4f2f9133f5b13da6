// The rest of the ring as the head's forward pass sees it: each Run (or Submit, then
// Collect) is one lap. Rows go out through the hop codec to where plan::Route sends them and
// come back on the RETURN leg from the last stage alone; a stage that leaves, breaks its link
// or stalls the lap ends the turn with its name (failed_device), for the replay to leave out.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "audit.h"
#include "daisy/forward.h"
#include "daisy/ring.h"
#include "room.h"

namespace daisy::head {

class NetLink final : public StageLink {
 public:
  NetLink(HeadRoom& room, const Plan& plan, int32_t seq, uint32_t model_hash, int hidden, double lap_timeout_s)
      : room_(room), plan_(plan), seq_(seq), model_hash_(model_hash), hidden_(hidden), lap_timeout_s_(lap_timeout_s) {}

  Result<HiddenStates> Run(HiddenStates hidden) override {
    DAISY_RETURN_IF_ERROR(Submit(std::move(hidden)));
    return Collect();
  }
  // Sends one batch into the ring without waiting for it.
  Status Submit(HiddenStates hidden) override;
  // Waits for the oldest batch to come back on the RETURN leg.
  Result<HiddenStates> Collect() override;

  void EnableAudit(const AuditSetup& setup);

  int64_t hops() const { return hops_; }
  int64_t positions() const { return positions_; }
  int64_t laps() const { return laps_; }
  double lap_seconds() const { return lap_seconds_; }  // wall time with a batch in the ring
  int64_t audited() const { return audit_ ? audit_->audited() : 0; }
  int64_t recomputed() const { return audit_ ? audit_->recomputed() : 0; }
  std::optional<int32_t> bad_position() const { return audit_ ? audit_->bad_position() : std::nullopt; }
  // The device that made the last lap fail, when known, and the other side of a dispute the
  // audit's evidence could not settle.
  const std::string& failed_device() const;
  const std::string& also_failed() const;

 private:
  using Clock = std::chrono::steady_clock;
  // Why the lap cannot finish, if a stage left, broke its link or refused what came back.
  std::optional<Status> RingBroken();
  Status StageFailed(const wire::ErrorMsg& e);

  HeadRoom& room_;
  const Plan& plan_;
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
    std::vector<int32_t> positions;  // of the batch (its rows travel in the activation)
    Clock::time_point sent;
  };
  std::deque<Pending> pending_;
  Clock::time_point busy_since_;
  std::unique_ptr<StageAudit> audit_;
};

}  // namespace daisy::head
