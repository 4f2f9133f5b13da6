// One stage of the ring, apart from any transport: the slice a device holds, its KV cache
// slots and their tags, an activation run through the stage's layers and passed on, the
// audit's digests, receipts and answers, busy for another head's turn, the head gone. The
// native node (daisy/node.h, over ZeroMQ) and the browser tab (daisy/tab.h, over serve's
// WebSocket link) both run this one StageCore; each gives it a StageHost for sending and
// for the room's list. Also the hop codec and the plan's wire form, and the hashes every
// member of a ring must agree on. Needs no socket, thread or HTTP client.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/forward.h"
#include "daisy/model.h"
#include "daisy/plan.h"
#include "daisy/seal.h"
#include "daisy/source.h"
#include "daisy/status.h"
#include "daisy/wire.h"

namespace daisy {

// ---- what every member of a ring agrees on (stage/model_hash.cc) ----

// What the plan counts for this model at context ctx (PlanModelFromSpec with the embedding
// at the width of its file, when that header is read; BF16 width otherwise).
PlanModel PlanModelOf(const ModelInfo& info, int ctx);
// What every device of a ring must agree on before it runs a hop: the normalized spec
// (XXH64 of its fields) and the model load (wire::ModelHash of repo id, pinned commit and a
// digest of the tensor index: names, dtypes, shapes and offsets).
uint64_t SpecHash(const ModelSpec& spec);
uint32_t ModelHashOf(const ModelSource& source, const TensorIndex& index);

// The hello of this device: capacity measured through the live kernel, probe, backend, and
// `budget` as its free memory (what the plan may give it). An empty name: the host name
// and the id's first four digits.
wire::Hello MeasureHello(const std::string& device_id, const std::string& name, uint32_t capabilities, uint64_t budget);

// ---- the hop codec and the plan's wire form (stage/hop.cc) ----

// The plan as an assignment carries it (device, address, layers per stage) and back: the
// one conversion between the plan and the wire.
std::vector<wire::StageEntry> WireStages(const Plan& plan);
Plan PlanFromWire(const std::vector<wire::StageEntry>& stages);

// One hop on its way: where it goes and what goes there.
struct OutgoingHop {
  std::string address;
  wire::Activation activation;
};
// The rows `from_stage` passes on, for turn `seq` (their values are taken out of `hidden`;
// the positions stay): the next stage is plan::Route's (the
// head's RETURN address at the end of a lap); the payload hash is taken here, last.
Result<OutgoingHop> EncodeHop(const Plan& plan, int from_stage, int32_t seq, uint32_t model_hash, HiddenStates& hidden);
// The rows an activation carries, at its positions [token_index, token_index + rows).
// Takes the values out of `activation`; refuses a payload that is not a whole number of rows
// of width `hidden`.
Result<HiddenStates> DecodeHop(wire::Activation& activation, int hidden);
// The stage an activation must be for at the receiver: wire::kNextReturn for the head.
int32_t WireNext(const Hop& hop);
// A message's name as the wire calls it ("activation", "assignment", ...), for log lines.
std::string_view MessageName(const wire::Message& message);

// ---- one stage (stage/stage.cc) ----

// Fault injection, for tests only: hooks that make a device lie or lag on purpose. The
// product never sets one (NodeOptions::faults stays null in the daisychain binary); tests
// set it in-process, and the test-only daisychain_faulty binary installs one from its
// environment. Called on the stage's own thread only.
class NodeFaults {
 public:
  virtual ~NodeFaults() = default;
  // Printed once at start, so a rigged device is never mistaken for an honest one.
  virtual std::string Describe() const = 0;
  // A hop's output after its layers ran, before its hash is taken and it is sent on.
  virtual void OnHopOutput(std::vector<float>& values) = 0;
  // In an audited turn: after the hop's digest went to the head, and after its receipt went
  // to the next stage (a liar that reports honestly and sends something else). Default: no-op.
  virtual void AfterReport(std::vector<float>& /*values*/) {}
  virtual void AfterReceipt(std::vector<float>& /*values*/) {}
};

enum class StageLog { kSay, kInfo, kWarning };

// What a stage needs from the member it runs in. Called on the stage's thread only.
class StageHost {
 public:
  virtual ~StageHost() = default;
  // To the member at `address` (boxed through serve's relay when either end is relayed).
  virtual Status Send(const std::string& address, const wire::Message& message, int timeout_ms) = 0;
  // The room's members as the rendezvous last listed them.
  virtual std::vector<wire::Peer> Peers() const = 0;
  // The key the room lists for `device_id`; "" when it is not in the room.
  virtual std::string KeyOf(const std::string& device_id) const = 0;
  // A frame the stage refused to act on (the host's log, rate-limited there).
  virtual void Dropped(const std::string& sender, const std::string& what) = 0;
  // The member at `address` is `key`, even before a peer list says so (a head that rejoined
  // at a new address), and that key's frames are admitted.
  virtual void Reach(const std::string& address, const std::string& key) = 0;
  // The model a head names: a Hub repo id at a pinned revision, or a local folder (an
  // absolute path) that this device must allow first.
  virtual Result<std::unique_ptr<ModelSource>> OpenModel(const std::string& model_id, const std::string& revision) = 0;
  // A line for the person at this device, without the device's name (the host adds it).
  virtual void Log(StageLog level, const std::string& line) = 0;
  // A slice's fetch begins (after the "fetching layers" line), and its bytes so far (a
  // terminal's progress line, a page's bar).
  virtual void LoadStarted() {}
  virtual void LoadProgress(const TransferProgress& /*progress*/) {}
  // The room's turn text from a head (any head of the room, whether or not this device
  // holds layers of the turn): the sending key, its device id and name ("" / "a head" when
  // the room's list does not have it).
  virtual void OnText(const std::string& /*sender_key*/, const std::string& /*head_id*/,
                      const std::string& /*head_name*/, const wire::Text& /*text*/) {}
};

struct StageOptions {
  std::string name;              // this device's name, for messages to the head
  std::string device_id;         // net::KeyId of keys.public_key
  net::KeyPair keys;             // for the audit key shared with a head
  uint64_t budget = 0;           // the memory budget the hello reported: an assignment needing more is refused
  int cache_slots = 4;           // conversations whose KV this device keeps (prefix cache)
  NodeFaults* faults = nullptr;  // tests only; not owned
};

// A stage's whole life between a head's assignment and its done: who may send what, the
// slice (fetched through StageHost::OpenModel, kept across turns of the same model and
// layers), one KV cache per conversation (the least recently used go for the slot count and
// the memory budget), a hop's rows run through the layers and passed on (plan::Route), the
// audited turn's inputs, digests and receipts, busy for another head until done, and a
// head that left the room forgotten. Not thread-safe: one thread owns a StageCore.
class StageCore {
 public:
  StageCore(StageOptions options, StageHost& host);
  ~StageCore();
  StageCore(const StageCore&) = delete;
  StageCore& operator=(const StageCore&) = delete;

  // One decoded frame from `sender` (a member's key). A peer list must come from the
  // rendezvous alone (the host checks that); anything else a sender has no business
  // sending is dropped through StageHost::Dropped.
  void Handle(const std::string& sender, wire::Message& message);
  // A frame from `sender` that did not decode (only an expected sender's: Expects).
  void Refused(const std::string& sender, const Status& why);
  // Whether a frame from `sender` that does not decode is reported to the head rather than
  // dropped: the head's and the stage upstream's.
  bool Expects(const std::string& sender) const;
  // The activation row width to decode with (0 before a slice is held).
  int hidden() const;
  // Time passes: a head missing from the room's lists for a while is forgotten.
  void Tick();

  // For status lines: the layers held ([first, end), 0/0 for none), the turn's stage.
  bool holds_layers() const { return slice_.weights != nullptr; }
  int first_layer() const { return slice_.first; }
  int end_layer() const { return slice_.end; }
  uint64_t resident_bytes() const;
  const std::string& model_id() const { return slice_.model_id; }
  int stage() const { return stage_; }
  int64_t hops() const { return hops_; }
  const std::string& head_id() const { return head_id_; }

 private:
  using Clock = std::chrono::steady_clock;
  // What a stage holds for one assignment.
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

  bool IsHead(const std::string& key) const;
  void Say(StageLog level, const std::string& line) { host_.Log(level, line); }
  void On(const wire::Peers& p);
  void On(const wire::Assignment& a);
  void SelectCache(const wire::Assignment& a);
  Status Assign(const wire::Assignment& a);
  void On(wire::Activation& a);
  void On(const wire::Text& t);
  void On(const wire::Done& d);
  void On(const wire::ErrorMsg& e);
  void On(const wire::AuditRequest& q);
  void On(const wire::HopReceipt& r);

  StageOptions o_;
  StageHost& host_;
  std::string head_key_;                                 // the key of the head whose turn this is
  std::string upstream_key_;                             // the key of the stage that sends this one its activations
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
};

}  // namespace daisy
