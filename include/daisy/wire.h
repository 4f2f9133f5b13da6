// The ring's messages as bytes (docs/WIRE.md has the diagrams). A codec on byte spans: no
// sockets, no allocation driven by an unchecked length. Explicit little-endian, no packed
// structs, every length capped before allocation, every field validated; a malformed frame
// returns an error naming what was wrong and never crashes. Pure functions; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "daisy/status.h"

namespace daisy::wire {

// Sentinel tags continue the original numbering; a tag keeps its number forever.
enum class Tag : int32_t {
  kHello = -20,
  kAssignment = -21,
  kReady = -22,
  kActivation = -23,
  kToken = -24,
  kDone = -25,
  kHeartbeat = -26,
  kError = -27,
  kBye = -28,
  kJoin = -29,
  kPeers = -30,
  kProgress = -31,
  kStageStats = -32,
  kHopDigest = -33,
  kAuditRequest = -34,
  kAuditData = -35,
  kHopReceipt = -36,
  kText = -37,
  kRelay = -38,
};

// 6: the token stream as text to every device of the room (text), instead of token ids
// to the turn's stages; relayed members (address relay://ID, capability kCapRelayed) and
// the relay envelope (a member of version 5 could neither parse such an address nor reach
// such a member); a narrow model's arithmetic changed (two-term weights, queries and
// values, model.h NarrowModel). 5: peak RSS in ready and stage_stats; the forward's numerics changed (two-term P,
// two-term narrow activations): members of different arithmetic would disagree on every
// activation, so they must not share a ring. 4: BLAKE2b audit digests, hop receipts.
inline constexpr uint16_t kProtocolVersion = 6;
inline constexpr size_t kMaxString = 1024;  // any string field
inline constexpr size_t kMaxStages = 256;
inline constexpr size_t kMaxFrameBytes = 256u << 20;  // an activation of a long prefill chunk fits
// Activation `next` field: the index of the stage to run, or RETURN (the head's return leg).
inline constexpr int32_t kNextReturn = -1;

// Capability bits of a hello.
enum Capability : uint32_t {
  kCapCompute = 1u << 0,  // can hold layers
  kCapHead = 1u << 1,     // can act as head
  // Accepts no connections (node --no-listen): its address is relay://DEVICE_ID and every
  // frame to or from it goes through serve's relay, boxed end to end (Relay below).
  kCapRelayed = 1u << 2,
};
// The address of a relayed member: kRelayScheme + its device id (16 hex digits).
inline constexpr std::string_view kRelayScheme = "relay://";
// True for relay://ID with ID 16 lower-case hex digits.
bool IsRelayAddress(std::string_view address);

struct Hello {
  static constexpr Tag kTag = Tag::kHello;
  uint16_t protocol_version = kProtocolVersion;
  uint32_t capabilities = kCapCompute;
  double gemms_per_s = 0;
  uint64_t probe_hash = 0;
  uint64_t free_memory = 0;
  std::string backend;
  std::string device_id;
  std::string name;
  bool operator==(const Hello&) const = default;
};

struct StageEntry {
  std::string device_id;
  std::string address;  // the stage's inbox ("tcp://host:port", direct) or relay://ID (through serve)
  int32_t first = 0;
  int32_t end = 0;
  bool operator==(const StageEntry&) const = default;
};

struct Assignment {
  static constexpr Tag kTag = Tag::kAssignment;
  uint32_t turn = 0;               // which planning round this belongs to
  std::string model_id;            // "owner/name" or a local path id
  std::string revision;            // pinned commit
  uint64_t spec_hash = 0;          // hash of the normalized ModelSpec the head derived
  uint32_t model_hash = 0;         // what activations of this model carry
  int32_t ctx = 0;                 // context length of the KV caches
  std::vector<StageEntry> stages;  // the whole plan, head first (never weights)
  int32_t your_stage = 0;
  // Prefix cache: the stage keeps one KV cache per cache_key (a conversation). It keeps the
  // first `keep` positions of that cache only when the cache's tag (set by the last done
  // of that conversation) equals keep_tag; otherwise it starts empty. Ready says which.
  uint64_t cache_key = 0;
  int32_t keep = 0;
  uint64_t keep_tag = 0;
  // Stage audit: the stage keeps this turn's inputs and sends a hop_digest per hop.
  bool audit = false;
  bool operator==(const Assignment&) const = default;
};
// The RETURN leg goes to stages[0].address with next = kNextReturn.

struct Ready {
  static constexpr Tag kTag = Tag::kReady;
  int32_t stage = 0;
  uint64_t bytes_held = 0;
  int32_t kept = 0;       // positions of the assignment's cache it kept (0 or keep)
  uint64_t peak_rss = 0;  // the device's peak resident set so far (VmHWM), bytes; 0: unknown
  bool operator==(const Ready&) const = default;
};

// Header [i32 tag][i32 seq][i32 token_index][i32 next][u32 act_hash][u32 model_hash], then
// n_tokens x hidden f32 values. token_index is the position of the first row.
struct Activation {
  static constexpr Tag kTag = Tag::kActivation;
  int32_t seq = 0;
  int32_t token_index = 0;
  int32_t next = 0;
  uint32_t act_hash = 0;    // ActHash(values): "did the payload arrive intact"
  uint32_t model_hash = 0;  // "is this the model I hold a slice of"
  std::vector<float> values;
  bool operator==(const Activation&) const = default;
};

struct Token {
  static constexpr Tag kTag = Tag::kToken;
  int32_t seq = 0;
  int32_t position = 0;
  int32_t token_id = 0;
  bool operator==(const Token&) const = default;
};

// Head -> every device of the room (not only the turn's stages): the turn's text as it is
// generated, so a member that holds no layers (or no tokenizer) shows it too. One stream per
// request of the head; a replay continues it. Pieces are the head's own decoded text.
enum class TextKind : uint8_t {
  kBegin = 0,    // a turn starts (index 0, token_id -1, no text)
  kPiece = 1,    // token number `index` of the turn (0 first), id `token_id`, adds `text` (may be "")
  kRetract = 2,  // the audit withdrew tokens: only the first `index` stand (their text kept)
  kEnd = 3,      // the turn is done: `index` tokens in all; `text` is what the head held back till now
  kFailed = 4,   // the turn ended with an error after `index` tokens
};
inline constexpr size_t kMaxTextPiece = kMaxString;  // longer text goes in several pieces of one index
struct Text {
  static constexpr Tag kTag = Tag::kText;
  uint32_t stream = 0;  // the head's count of its turns
  TextKind kind = TextKind::kPiece;
  int32_t index = 0;
  int32_t token_id = -1;  // a piece's token; -1 otherwise
  std::string text;
  bool operator==(const Text&) const = default;
};

enum class FinishReason : uint8_t { kStop = 0, kLength = 1, kCancelled = 2, kError = 3 };
struct Done {
  static constexpr Tag kTag = Tag::kDone;
  int32_t seq = 0;
  FinishReason reason = FinishReason::kStop;
  // The turn's cache now holds `cached` positions whose ids hash to cache_tag: the stage
  // files it under the assignment's cache_key for the conversation's next turn.
  int32_t cached = 0;
  uint64_t cache_tag = 0;
  bool operator==(const Done&) const = default;
};
// Stage -> head while it fetches its layers (a few per second at most).
struct Progress {
  static constexpr Tag kTag = Tag::kProgress;
  uint32_t turn = 0;
  int32_t stage = 0;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  bool operator==(const Progress&) const = default;
};
// A BLAKE2b-256 digest (RowsDigest) or MAC (ReceiptMac): evidence, not an accident check.
using Digest = std::array<uint8_t, 32>;

// Sender -> next stage, just before the activation it describes, in an audited turn: the
// digest of the rows the sender really sends, MACed with the key the sender shares with the
// head (net::AuditKey). The receiver cannot forge it; it checks the digest against what it
// received and forwards the receipt to the head in its HopDigest.
struct HopReceipt {
  static constexpr Tag kTag = Tag::kHopReceipt;
  int32_t seq = 0;
  int32_t stage = 0;        // the sender
  int32_t token_index = 0;  // first position of the hop
  int32_t rows = 0;
  Digest digest{};  // RowsDigest of the rows sent
  Digest mac{};     // ReceiptMac(key of (sender, head), model_hash, fields, digest)
  bool operator==(const HopReceipt&) const = default;
};

// Stage -> head after each hop of an audited turn: what it received and what it sent,
// committed before it can know whether this hop will be audited (RowsDigest of the f32
// bytes), with the receipt its sender gave for its input (stage 1's input comes from the
// head, which needs none: `has_receipt` is 0 there).
struct HopDigest {
  static constexpr Tag kTag = Tag::kHopDigest;
  int32_t seq = 0;
  int32_t stage = 0;
  int32_t token_index = 0;  // first position of the hop
  int32_t rows = 0;
  Digest in_digest{};
  Digest out_digest{};
  bool has_receipt = false;
  HopReceipt receipt;  // the sender's, as received
  bool operator==(const HopDigest&) const = default;
};
// Head -> stage: "send me the inputs of your hops at positions [from, to) of this turn".
struct AuditRequest {
  static constexpr Tag kTag = Tag::kAuditRequest;
  int32_t seq = 0;
  int32_t from = 0;
  int32_t to = 0;
  bool operator==(const AuditRequest&) const = default;
};
// Stage -> head: those inputs, rows of hidden f32 values (checked against the digests).
struct AuditData {
  static constexpr Tag kTag = Tag::kAuditData;
  int32_t seq = 0;
  int32_t stage = 0;
  int32_t from = 0;
  std::vector<float> values;
  bool operator==(const AuditData&) const = default;
};
// Stage -> head after done: its share of the turn.
struct StageStats {
  static constexpr Tag kTag = Tag::kStageStats;
  int32_t seq = 0;
  int32_t stage = 0;
  int64_t hops = 0;
  double compute_seconds = 0;
  uint64_t peak_rss = 0;  // the device's peak resident set through the turn (VmHWM), bytes; 0: unknown
  bool operator==(const StageStats&) const = default;
};

struct Heartbeat {
  static constexpr Tag kTag = Tag::kHeartbeat;
  uint64_t millis = 0;
  std::string device_id;
  bool operator==(const Heartbeat&) const = default;
};

// What an ErrorMsg reports. The head acts on busy, assignment, audit and next-unreachable;
// the others are reported as they are. A code keeps its number forever (kProtocol above
// all: it is the one error a member of another protocol version receives). Every member of
// a ring speaks the same protocol version (the rendezvous refuses others), so a code this
// build does not know is a malformed frame: a new code goes at the end, with a new protocol
// version.
enum class ErrorKind : uint16_t {
  kProtocol = 1,         // the rendezvous: protocol version mismatch
  kFrame = 2,            // a frame from the head or upstream did not decode
  kAssignment = 3,       // the assignment was refused (the reason follows)
  kHop = 4,              // a hop was refused or failed on this stage
  kBusy = 5,             // serving another head's turn: ask again later
  kAudit = 6,            // an audit request could not be answered
  kNextUnreachable = 7,  // the hop ran, but the next stage could not be reached
};

struct ErrorMsg {
  static constexpr Tag kTag = Tag::kError;
  ErrorKind code = ErrorKind::kHop;  // there is no code 0 on the wire
  std::string message;
  bool operator==(const ErrorMsg&) const = default;
};

struct Bye {
  static constexpr Tag kTag = Tag::kBye;
  std::string device_id;
  bool operator==(const Bye&) const = default;
};

// Device -> rendezvous: "put me in this room". Carries the hello (capacity, probe, ...)
// and the device's inbox address; never a prompt, a token or an activation.
struct Join {
  static constexpr Tag kTag = Tag::kJoin;
  std::string room;
  std::string address;
  Hello hello;
  bool operator==(const Join&) const = default;
};

// Rendezvous -> device: the approved members of its room, each with the CURVE public key
// it proved to the rendezvous (Z85, 40 characters): the only key its inbox and outbox
// links are trusted with.
struct Peer {
  std::string address;
  Hello hello;
  std::string public_key;
  bool operator==(const Peer&) const = default;
};
inline constexpr size_t kPublicKeyChars = 40;
struct Peers {
  static constexpr Tag kTag = Tag::kPeers;
  std::string room;
  std::vector<Peer> peers;
  bool operator==(const Peers&) const = default;
};
inline constexpr size_t kMaxPeers = 256;

// A frame between two members, at least one of them relayed, on its way through serve's
// relay. serve terminates the CurveZMQ link on each side, so the frame inside is boxed
// between the true sender and the true recipient (net::PeerBoxes: crypto_box with the key
// of their two long-term X25519 keys, the CURVE keys). The relay reads only `to` and
// `from`; `box` is ciphertext and its MAC.
struct Relay {
  static constexpr Tag kTag = Tag::kRelay;
  std::string to;            // the recipient's device id
  std::string from;          // the sender's device id (the relay checks it against the sender's key)
  uint64_t counter = 0;      // the nonce's counter: strictly increasing per sender and recipient
  std::vector<uint8_t> box;  // crypto_box_easy of the inner frame (MAC first, >= 16 bytes)
  bool operator==(const Relay&) const = default;
};
inline constexpr size_t kBoxMacBytes = 16;

// Each message and part compares field by field (==). Floats compare as numbers (-0 == +0):
// where the bits matter, compare the payload bytes.
using Message = std::variant<Hello, Assignment, Ready, Activation, Token, Done, Heartbeat, ErrorMsg, Bye, Join, Peers,
                             Progress, StageStats, HopDigest, AuditRequest, AuditData, HopReceipt, Text, Relay>;

std::vector<uint8_t> Encode(const Message& message);
// Decodes one whole frame. `hidden` is the activation row width the receiver expects (0:
// accept any whole number of floats). Never throws, never reads outside `frame`.
Result<Message> Decode(std::span<const uint8_t> frame, int hidden = 0);

// XXH32 of the f32 payload bytes (little-endian): catches a one-ulp flip and -0 vs +0.
uint32_t ActHash(std::span<const float> values);
// BLAKE2b-256 of f32 values' little-endian bytes: the digests the stage audit and Verify
// take as evidence (a stage cannot find other rows with the same digest).
Digest RowsDigest(std::span<const float> values);
// BLAKE2b-256 keyed with `key` (32 bytes, shared by one stage and the head) over the
// receipt's fields and model_hash: only that stage (or the head) can make it.
Digest ReceiptMac(std::span<const uint8_t, 32> key, uint32_t model_hash, const HopReceipt& receipt);
// Identifies a model load: repo id, pinned commit and the tensor index (names, dtypes,
// shapes, offsets) hashed together.
uint32_t ModelHash(std::string_view model_id, std::string_view revision, std::string_view tensor_index_digest);

std::string_view TagName(int32_t tag);

}  // namespace daisy::wire
