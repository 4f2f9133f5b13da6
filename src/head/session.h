// HeadSession's state and the phases of a turn, shared by session.cc (the room, the model,
// previews), turn.cc (a turn, phase by phase) and verify.cc. Internal to the head module.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daisy/forward.h"
#include "daisy/head.h"
#include "daisy/plan.h"
#include "daisy/ring.h"
#include "daisy/tokenizer.h"
#include "daisy/turn_queue.h"
#include "link.h"
#include "room.h"
#include "text_cast.h"
#include "verify.h"

namespace daisy {

namespace head {

using Clock = std::chrono::steady_clock;
// How many leading ids a and b share (the prefix cache keeps that many positions).
inline size_t CommonPrefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

inline double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The prefix cache on the head: one HeadStage (with its KV) per conversation, and what
// its cache holds.
struct HeadSlot {
  uint64_t key = 0;
  std::unique_ptr<HeadStage> stage;
  std::vector<int32_t> ids;  // the ids at positions [0, ids.size()) of every stage's cache
  std::string plan_sig;      // the plan those caches were filled under
  uint64_t last_used = 0;
};

// One attempt of a turn, as its phases hand it on.
struct TurnState {
  const TurnRequest& request;
  HeadReport& report;
  HeadSlot& slot;
  std::vector<int32_t>& emitted;  // ids already streamed: a replay does not stream them again
  int attempt = 0;
  Plan plan;        // head first; addresses and download sizes filled
  std::string sig;  // the plan's signature (the prefix cache keeps only under it)
  int keep = 0;     // prompt positions every cache keeps
  uint64_t keep_tag = 0;
  bool audit = false;
  std::map<int, int32_t> ready;  // stage -> positions it kept
  Clock::time_point started;

  void Say(const std::string& line) const {
    if (request.on_status) request.on_status(line);
  }
};

// AwaitReady's clocks: when each stage last gave a sign of life, when its assignment was
// last sent, and whether the ring is busy with another head's turn.
struct ReadyWait {
  Clock::time_point start;
  std::map<int, Clock::time_point> last_sign;
  std::map<int, Clock::time_point> resent;
  Clock::time_point last_busy;
  std::optional<Clock::time_point> busy_since;
};

}  // namespace head

struct HeadSession::Impl {
  SessionOptions o;
  std::unique_ptr<RoomMember> member;  // keys, inbox, hello, heartbeats, the room's list
  std::unique_ptr<head::HeadRoom> room;

  // One turn at a time owns the inbox, in the order of its tickets (a server orders its
  // requests on this queue too); the idle thread keeps the room between turns.
  TurnQueue turns;
  std::atomic<bool> stopping{false};
  std::thread idle;

  // The model (guarded by state_mu for readers; replaced only while holding a turn too).
  mutable std::mutex state_mu;
  std::unique_ptr<ModelSource> source;
  std::shared_ptr<const ModelInfo> info;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::optional<ModelView> view;
  int ctx = 0;
  uint32_t model_hash = 0;
  uint64_t spec_hash = 0;

  // Turn state (only while holding a turn).
  std::unique_ptr<StageWeights> head_weights;
  std::unique_ptr<LocalPipeline> verify_pipeline;
  std::vector<head::HeadSlot> slots;
  uint64_t use_clock = 0;
  uint32_t turn = 0;
  std::set<std::string> suspects;    // devices that failed an attempt: not planned again this turn
  bool excluded_by_verdict = false;  // the attempt failed on an audit's verdict (no one died)
  bool joined = false;
  std::mt19937_64 audit_rng;
  std::map<std::pair<int, int>, std::unique_ptr<StageWeights>> audit_weights;
  std::vector<head::StepDigest> ring_steps;   // the last finished turn's step digests, for Verify
  std::unique_ptr<head::TextCast> text_cast;  // the turn's text to the room; null: --no-share-tokens

  ~Impl();
  const std::string& id() const { return member->id(); }
  const wire::Hello& hello() const { return member->hello(); }

  // ---- session.cc: the room, the model, previews ----
  void IdleLoop();
  // Takes the ring, after every ticket taken before: the idle thread steps aside.
  TurnQueue::Ticket TakeTurn() { return turns.Take(); }
  // A turn the caller says it holds must be one of this head's queue.
  Status CheckHeld(const TurnQueue::Ticket* held) const;
  Status JoinRoom();
  Status WaitForDevices(int want, const std::function<void(const std::string&)>& say);
  // `held`: the caller's turn; nullptr: one is taken here.
  Result<ModelView> Load(const std::string& src, int want_ctx, const TurnQueue::Ticket* held);
  // The plan over the devices in the room now; the head first. A verified turn keeps room
  // on the head for a stage-by-stage Verify.
  Result<Plan> PlanNow(int attempt, std::optional<int> stages_wanted, bool verify = false) const;
  Result<Plan> PreviewPlan(std::optional<int> stages_wanted) const;
  double LapTimeout(double est_seconds_per_token, int positions_in_flight) const;
  head::HeadSlot& SlotFor(const TurnRequest& r);
  head::HeadSlot& NewSlot(uint64_t key);
  uint64_t HeldNow() const;

  // ---- turn.cc: a turn, phase by phase ----
  Result<HeadReport> Generate(const TurnRequest& r, const TurnQueue::Ticket* held);
  // `r` with its text also going to every device of the room (text_cast) as it streams: the
  // stream begins at the first token (`begun`); the text held back to the end goes to `tail`.
  TurnRequest SharedWithTheRoom(const TurnRequest& r, std::string& tail, bool& begun);
  Status Turn(head::TurnState& t, GenerateOptions gen);
  Status PlanTurn(head::TurnState& t);
  wire::Assignment AssignmentFor(const head::TurnState& t, size_t stage) const;
  Status Assign(head::TurnState& t);
  Status LoadHeadSlice(head::TurnState& t);
  Status AwaitReady(head::TurnState& t);
  void ResendAssignments(const head::TurnState& t, head::ReadyWait& w);
  Status GiveUpIfStuck(const head::TurnState& t, const head::ReadyWait& w);
  Status OnWhileWaiting(head::TurnState& t, head::ReadyWait& w, const wire::Message& m);
  Status RunLaps(head::TurnState& t, GenerateOptions gen);
  Status LapsFailed(head::TurnState& t, const head::NetLink& link, Status failure);
  void Finish(head::TurnState& t, const GenerateResult& result, const head::NetLink& link, double wall);

  // ---- verify.cc ----
  Status Verify(HeadReport& report, const GenerateOptions& gen, const std::function<void(const std::string&)>& say);
  Status VerifyWhole(HeadReport& report, const GenerateOptions& gen);
  Status VerifyByStages(HeadReport& report, const GenerateOptions& gen,
                        const std::function<void(const std::string&)>& say);
};

}  // namespace daisy
