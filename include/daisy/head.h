// A request's life on the head: join the room, plan over the devices there, assign each
// stage its layers (never weights), wait until every stage is ready, then prefill and
// decode with laps around the ring, broadcasting each token; replay once around a stage
// that drops; optionally verify against a single-device run.
//
// The head is a RoomMember (daisy/ring.h) like every node; its files: session.cc (room,
// model, previews), turn.cc (a turn phase by phase), link.cc (the ring as the forward
// pass's StageLink), audit.cc (the stage audit), verify.cc.
//
// HeadSession is the long-lived head of `serve`: it stays in the room, holds one model and
// keeps the KV of recent conversations on every stage (the prefix cache). RunHead is the
// one-shot head of `run`: a session for one turn.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/generator.h"
#include "daisy/hub.h"
#include "daisy/model.h"
#include "daisy/net.h"
#include "daisy/plan.h"
#include "daisy/status.h"
#include "daisy/tokenizer.h"
#include "daisy/turn_queue.h"
#include "daisy/wire.h"

namespace daisy {

// One stage's share of a turn, as the stage measured it.
struct StageLatency {
  int stage = 0;
  std::string device_id;
  std::string device_name;
  int64_t hops = 0;            // activations it ran
  double compute_seconds = 0;  // time inside its layers
};

struct HeadReport {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> ids;
  std::string text;
  std::string finish_reason;
  // The turn's plan (the replay's when there was one): each stage with its device, address,
  // layers, download and memory figures, and its peak RSS as it last reported it.
  std::vector<StageAssignment> plan;
  double ready_seconds = 0;  // from planning until every stage held its layers (loads included)
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double tokens_per_s = 0;                  // decode
  int64_t ring_hops = 0;                    // activation messages sent around the ring
  int64_t ring_positions = 0;               // positions (rows) that went around the ring
  int reused_positions = 0;                 // prompt positions taken from the prefix cache
  std::vector<StageLatency> stage_latency;  // per stage, head first
  int64_t laps = 0;
  double lap_seconds = 0;  // wall time inside laps (transport + remote compute)
  int drafted = 0;         // lookahead: drafted tokens scored in decode laps
  int accepted = 0;        // ... and kept (each one a lap saved)
  int replays = 0;
  int64_t audited_hops = 0;                 // (lap, stage) pairs drawn for the audit
  int64_t recomputed_hops = 0;              // hops re-run by the head and compared bit for bit
  std::vector<std::string> audit_failures;  // which stage, which hop
  // Verify: true only when the token ids and, at every step, the bits of the final hidden
  // row and the logits (BLAKE2b digests) equal a single-device run's.
  std::optional<bool> verified;
  std::string verify_message;  // the VERIFIED line or the first mismatch
  int verified_steps = 0;      // steps whose digests were compared
  // The first sequence position whose token differs in id, or was chosen from different
  // bits (the generated token at mismatch_position - prompt_ids.size()); unset when verified.
  std::optional<int> mismatch_position;
  std::string mismatch;  // "ids differ" | "ids equal, logits differ" | "ids equal, hidden row differs"
  // "whole model" (a second copy of the model on the head) or "stage by stage" (when the
  // whole model does not fit the head's budget: one slice of layers at a time).
  std::string verify_mode;
  double verify_seconds = 0;
  uint64_t verify_peak_rss_bytes = 0;  // the head's peak resident set during Verify; 0: unknown
};

struct SessionOptions {
  std::string rendezvous;  // "tcp://HOST:PORT"
  // How the host admits this head's key (see JoinOptions in node.h): --server-key FPR
  // checks the rendezvous's key; `admission` asks a rendezvous in this process directly.
  std::string server_key;
  std::optional<net::Admission> admission;
  std::string room = "default";
  std::string name;
  std::string role = "head";  // DeviceId role: one identity per role and home
  std::string bind_host = "127.0.0.1";
  // --max-memory: the head's budget for its own slice and for Verify; unset: MemAvailable
  // (or $DAISY_FREE_MEMORY).
  std::optional<uint64_t> max_memory;
  HubOptions hub;
  std::vector<std::string> exclude_devices;  // never planned (e.g. serve's own compute node)
  // Timeouts (docs/ARCHITECTURE.md, "Timeouts"). A member is dead when its heartbeats stop
  // (the rendezvous drops it after net::kDeadAfterSeconds), never for being slow.
  double lap_timeout_s = 60;                     // floor of the lap timeout, which scales with the plan's estimate
  double load_stall_s = 120;                     // a stage fetching its layers with no progress this long is given up
  double busy_wait_s = 600;                      // how long a turn waits for another head's turn to end
  double settle_s = net::kDeadAfterSeconds + 1;  // before a replay re-plans: dead members drop out
  int cache_slots = 4;                           // conversations whose KV each stage keeps
  // Lookahead drafting for every turn (GenerateOptions::lookahead; the request's own value
  // is not used): drafts per decode lap at most, 0 = off. Audited turns never draft.
  int lookahead = 0;
  std::optional<int> stages;             // split over exactly N devices (incl. the head)
  std::optional<std::vector<int>> plan;  // layers per stage, head first
  double wait_s = 30;                    // how long `stages` waits for devices
  bool join_at_start = true;             // false: join at the first turn (a bad model fails first)
  // Stage audit: this share of (lap, stage) pairs, drawn after the lap, is re-run on the
  // head from the stage's own inputs and compared bit for bit (docs/ARCHITECTURE.md).
  double audit_rate = 0;
  uint64_t audit_seed = 0;  // the draw's seed (0: from std::random_device)
  // Every device of the room (not only the turn's stages) is sent each turn's text as it is
  // generated (wire::Text); false (serve/run --no-share-tokens): nobody but this head sees it.
  bool share_tokens = true;
  // Tests only: the prefix cache keeps this many positions more than the prompt shares with
  // what it cached (a planted bug that Verify must catch). Never set outside tests.
  int test_keep_extra = 0;
};

// The one-shot head of `run` and `demo`: a session for one turn.
struct HeadOptions {
  SessionOptions session;  // room, identity, hub, split, audit, timeouts
  std::string model;       // SRC
  std::string prompt;
  GenerateOptions generate;  // stop ids are added from the model's config
  int ctx = 0;               // 0: DefaultContext(spec)
  bool verify = false;
  std::function<void(std::string_view)> on_text;    // streamed text as tokens arrive
  std::function<void(std::string_view)> on_status;  // plan, progress, re-plans (lines)
};

Result<HeadReport> RunHead(const HeadOptions& options);

// What Load read: config, tokenizer and headers only.
struct ModelView {
  std::string source;    // as given
  std::string model_id;  // repo id or local path id
  std::string revision;
  ModelSpec spec;
  uint64_t parameters = 0;
  uint64_t weight_bytes = 0;  // as stored
  int ctx = 0;
  std::string chat_template;  // "" when the model has none
};

// One stage's download, as reported by the stage.
struct StageProgress {
  int stage = 0;
  std::string device_id;
  std::string device_name;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};

struct TurnRequest {
  std::vector<int32_t> prompt_ids;  // tokenized by the caller (while it waited)
  GenerateOptions generate;         // the model's stop ids are added
  // Called before every run of this turn (first try, replay, verify) so stateful hooks
  // (JSON mode, stop strings) start fresh each time.
  std::function<void(GenerateOptions&)> fresh_hooks;
  bool verify = false;
  std::string conversation;   // prefix-cache key; "" = the slot with the longest prefix
  std::optional<int> stages;  // split over exactly N devices; unset: the session's
  // Each token as it is chosen, with the text it adds (may be empty while a character is
  // incomplete); at the end, id -1 carries any text still held back.
  std::function<void(int32_t id, std::string_view text)> on_token;
  std::function<void(std::string_view line)> on_status;
  std::function<void(const StageProgress&)> on_progress;
  // An audit found a corrupted hop: only the first `kept` streamed tokens stand; the
  // replay streams the rest again.
  std::function<void(size_t kept)> on_retract;
};

// The long-lived head. Thread-safe: turns run one at a time, in the order of their tickets
// in turns() (Load, Generate and ClearCache take one and wait for the turns before them,
// unless the caller passes a ticket it holds); the room is kept (heartbeats, peers)
// between turns.
class HeadSession {
 public:
  static Result<std::unique_ptr<HeadSession>> Start(const SessionOptions& options);
  ~HeadSession();
  HeadSession(const HeadSession&) = delete;
  HeadSession& operator=(const HeadSession&) = delete;

  const std::string& device_id() const;
  // The approved members of the room, as the rendezvous last said.
  std::vector<wire::Peer> Peers() const;
  // The line of turns on this head's ring. A caller that orders its own requests on it
  // (serve's server: positions, leaving the line) passes the ticket it holds below, so its
  // turn is not queued a second time.
  TurnQueue& turns();
  // Reads config, tokenizer and headers of SRC (no weights) and makes it the session's
  // model. ctx 0: DefaultContext. Waits for a running turn, or runs in `turn`.
  Result<ModelView> Load(const std::string& source, int ctx = 0);
  Result<ModelView> Load(const TurnQueue::Ticket& turn, const std::string& source, int ctx = 0);
  std::optional<ModelView> model() const;
  // The loaded tokenizer; nullptr before Load. Stays valid while the caller holds it.
  std::shared_ptr<const Tokenizer> tokenizer() const;
  // The plan a turn would use now, over the devices in the room.
  // A plan that cannot be made comes back with fits false and the reason in warning.
  Result<Plan> PreviewPlan(std::optional<int> stages = std::nullopt) const;
  // One turn: plan, assign, ready, prefill (reusing the longest cached prefix), decode,
  // done; replays once without a stage that fails; verifies when asked.
  Result<HeadReport> Generate(const TurnRequest& request);
  Result<HeadReport> Generate(const TurnQueue::Ticket& turn, const TurnRequest& request);
  // Forgets every cached conversation (here and, at the next turn, on the stages).
  void ClearCache();

 private:
  struct Impl;
  explicit HeadSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace daisy
