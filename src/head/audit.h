// The stage audit (docs/ARCHITECTURE.md, "The stage audit"): after a lap, a drawn share of
// (lap, stage) pairs is checked: the chain of digests and receipts from stage to stage, and
// a re-run of the audited stage's layers on the head from the stage's own inputs, bit for
// bit. A stage that lied is named; when the evidence cannot tell which of two neighbours
// lied, both are.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "daisy/forward.h"
#include "daisy/ring.h"
#include "room.h"

namespace daisy::head {

// What a turn's stage audit needs: the head re-runs audited stages' layers itself.
struct AuditSetup {
  double rate = 0;                 // share of (lap, stage) pairs audited
  std::mt19937_64* rng = nullptr;  // the head's draw, after the fact
  ModelSource* source = nullptr;
  const ModelInfo* info = nullptr;
  int ctx = 0;
  // Audited stages' weights, fetched on first need and kept, by layer range.
  std::map<std::pair<int, int>, std::unique_ptr<StageWeights>>* weights = nullptr;
  const net::KeyPair* keys = nullptr;  // this head's: the receipt keys are derived from it
};

class StageAudit {
 public:
  StageAudit(const AuditSetup& setup, HeadRoom& room, const Plan& plan, int32_t seq, uint32_t model_hash, int hidden,
             double lap_timeout_s);

  // What the head sent stage 1 for the lap starting at `position`.
  void Sent(int32_t position, std::span<const float> rows);
  // A frame the link read: a digest of this turn from the stage that made it is recorded
  // (true); anything else is not the audit's (false).
  bool Take(const wire::Message& message);
  // After the lap of positions [token_index, token_index + rows): draws which stages to
  // audit, checks the chain of digests, and re-runs each audited stage up to this lap.
  Status AfterLap(int32_t token_index, int rows, std::span<const float> returned);

  int64_t audited() const { return audited_; }
  int64_t recomputed() const { return recomputed_; }
  // The first position whose hop was found wrong: tokens after it are not trusted.
  std::optional<int32_t> bad_position() const { return bad_position_; }
  const std::string& failed_device() const { return failed_device_; }
  // The other side of a dispute the evidence could not settle.
  const std::string& also_failed() const { return also_failed_; }

 private:
  Result<wire::HopDigest> Digest(int stage, int32_t token_index);
  std::string Who(int stage) const;
  Status Blame(int stage, int32_t position, const std::string& what);
  Status BlameBoth(int sender, int receiver, int32_t position, const std::string& what);
  Status CheckLink(int s, int32_t token_index, int rows, const wire::HopDigest& d);
  Result<std::array<uint8_t, 32>> KeyFor(int s);
  Status Rerun(int s, int32_t end);
  Result<wire::AuditData> AskInputs(int s, int32_t from, int32_t end);

  struct Shadow {
    std::unique_ptr<KvCache> kv;  // the audited stage's cache, rebuilt here
    int32_t len = 0;              // positions re-run so far
  };
  AuditSetup setup_;
  HeadRoom& room_;
  const Plan& plan_;
  int32_t seq_;
  uint32_t model_hash_;
  int hidden_;
  double lap_timeout_s_;
  std::vector<Shadow> shadows_;
  std::map<std::pair<int, int32_t>, wire::HopDigest> digests_;  // (stage, first position)
  std::map<int32_t, wire::Digest> sent_digest_;                 // what the head sent, by position
  std::map<int, std::array<uint8_t, 32>> keys_;                 // receipt keys, by stage
  std::string failed_device_;
  std::string also_failed_;
  int64_t audited_ = 0;
  int64_t recomputed_ = 0;
  std::optional<int32_t> bad_position_;
};

}  // namespace daisy::head
