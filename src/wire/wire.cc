// The message codec. Each message's fields are listed once, in wire order, by a Fields()
// function template (below), together with the checks that refuse a bad value. Encode runs
// it with a Writer, which appends little-endian bytes; Decode runs it with a Reader, which
// reads with bounds checks and caps and applies the checks. Order, widths, counts and
// optional parts therefore cannot differ between the two directions.
#include "daisy/wire.h"

#include <sodium.h>
#if defined(DAISY_XXHASH_INLINE)
#define XXH_INLINE_ALL  // the wasm build, which has no libxxhash
#endif
#include <xxhash.h>

#include <bit>
#include <cctype>
#include <cmath>
#include <concepts>
#include <cstring>
#include <type_traits>
#include <utility>

namespace daisy::wire {

namespace {

// Appends fields as little-endian bytes. Field names, caps and checks are the Reader's: the
// encoder writes what it is given (tests encode bad values to see the decoder refuse them).
class Writer {
 public:
  void U16(uint16_t v, const char*) { Le(v, 2); }
  void U32(uint32_t v, const char*) { Le(v, 4); }
  void I32(int32_t v, const char*) { Le(static_cast<uint32_t>(v), 4); }
  void U64(uint64_t v, const char*) { Le(v, 8); }
  void I64(int64_t v, const char*) { Le(static_cast<uint64_t>(v), 8); }  // two's complement, as u64
  void F64(double v, const char*) { Le(std::bit_cast<uint64_t>(v), 8); }
  void Bool(bool v, const char*) { out_.push_back(v ? 1 : 0); }
  template <class E>
  void Enum(E v, const char*, E /*lo*/, E /*hi*/) {
    Le(static_cast<uint64_t>(v), sizeof(E));
  }
  // A string longer than kMaxString is cut there (callers keep theirs shorter); the
  // per-field cap is the decoder's.
  void Str(std::string_view s, const char*, size_t /*cap*/) {
    const size_t n = s.size() > kMaxString ? kMaxString : s.size();
    U16(static_cast<uint16_t>(n), nullptr);
    out_.insert(out_.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
  }
  void Bytes(const Digest& d, const char*) { out_.insert(out_.end(), d.begin(), d.end()); }
  // [u32 count] then each element as `each` describes it.
  template <class T, class Each>
  void Vec(const std::vector<T>& v, const char*, size_t /*lo*/, size_t /*hi*/, Each each) {
    U32(static_cast<uint32_t>(v.size()), nullptr);
    for (const T& x : v) each(x);
  }
  // The rest of the frame: f32 values, row-major.
  void Rows(std::span<const float> v, const char*) {
    for (float f : v) U32(std::bit_cast<uint32_t>(f), nullptr);
  }
  // The rest of the frame: opaque bytes.
  void Tail(std::span<const uint8_t> v, const char*, size_t /*min*/) { out_.insert(out_.end(), v.begin(), v.end()); }
  // The encoder validates nothing. A condition that costs more than a comparison is passed
  // as a callable, which only the Reader calls.
  template <class Good, class Why>
  void Check(const Good&, const Why&) {}
  std::vector<uint8_t> Take() { return std::move(out_); }

 private:
  void Le(uint64_t v, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> out_;
};

// Reads fields in place, never past the frame, and refuses the frame on the first problem:
// a short frame, a length over its cap, a value a check rejects. After an error the reads
// leave fields as they are and the checks do nothing, so only the first error is reported.
class Reader {
 public:
  // `hidden`: the row width Rows() must see (0: any whole number of f32 values).
  Reader(std::span<const uint8_t> in, int hidden) : in_(in), hidden_(hidden) {}
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  size_t left() const { return in_.size() - pos_; }

  void U16(uint16_t& v, const char* f) { Read(v, f); }
  void U32(uint32_t& v, const char* f) { Read(v, f); }
  void I32(int32_t& v, const char* f) { Read(v, f); }
  void U64(uint64_t& v, const char* f) { Read(v, f); }
  void I64(int64_t& v, const char* f) { Read(v, f); }
  void F64(double& v, const char* f) {
    uint64_t bits = 0;
    if (Read(bits, f)) v = std::bit_cast<double>(bits);
  }
  void Bool(bool& v, const char* f) {
    uint8_t b = 0;
    if (!Read(b, f)) return;
    Check(b <= 1, [&] { return std::string(f) + " " + std::to_string(b) + " is not 0 or 1"; });
    v = b == 1;
  }
  // An enum of consecutive values [lo, hi]; any other number is refused.
  template <class E>
  void Enum(E& v, const char* f, E lo, E hi) {
    using U = std::underlying_type_t<E>;
    U raw = 0;
    if (!Read(raw, f)) return;
    Check(raw >= static_cast<U>(lo) && raw <= static_cast<U>(hi),
          [&] { return "unknown " + std::string(f) + " " + std::to_string(raw); });
    if (ok()) v = static_cast<E>(raw);
  }
  // [u16 length][bytes], the length checked against `cap` before anything is allocated.
  void Str(std::string& s, const char* f, size_t cap) {
    uint16_t n = 0;
    if (!Read(n, f)) return;
    if (n > cap) {
      Fail(std::string(f) + " length " + std::to_string(n) + " exceeds the cap of " + std::to_string(cap));
      return;
    }
    if (!Need(n, f)) return;
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
  }
  void Bytes(Digest& d, const char* f) {
    if (!Need(d.size(), f)) return;
    std::memcpy(d.data(), in_.data() + pos_, d.size());
    pos_ += d.size();
  }
  // [u32 count] in [lo, hi] (checked before any element is made), then each element.
  template <class T, class Each>
  void Vec(std::vector<T>& v, const char* f, size_t lo, size_t hi, Each each) {
    uint32_t n = 0;
    if (!Read(n, f)) return;
    Check(n >= lo && n <= hi, [&] {
      return std::string(f) + " " + std::to_string(n) + " is outside [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "]";
    });
    v.clear();
    for (uint32_t i = 0; ok() && i < n; ++i) each(v.emplace_back());
  }
  // The rest of the frame: a positive whole number of f32 values, whole rows of `hidden`.
  void Rows(std::vector<float>& v, const char* f) {
    if (!ok()) return;
    const size_t bytes = left();
    const std::string name(f);
    if (bytes % 4 != 0) {
      Fail(name + " of " + std::to_string(bytes) + " bytes is not a whole number of f32 values");
    } else if (bytes == 0) {
      Fail("empty " + name);
    } else if (hidden_ > 0 && (bytes / 4) % static_cast<size_t>(hidden_) != 0) {
      Fail(name + " of " + std::to_string(bytes / 4) + " values is not a whole number of rows of " +
           std::to_string(hidden_));
    } else {
      v.resize(bytes / 4);
      for (size_t i = 0; i < v.size(); ++i) v[i] = std::bit_cast<float>(Le<uint32_t>(in_.data() + pos_ + 4 * i));
      pos_ += bytes;
    }
  }
  // The rest of the frame as opaque bytes, at least `min` of them.
  void Tail(std::vector<uint8_t>& v, const char* f, size_t min) {
    if (!ok()) return;
    if (left() < min) {
      Fail(std::string(f) + " of " + std::to_string(left()) + " bytes is shorter than " + std::to_string(min));
      return;
    }
    v.assign(in_.begin() + static_cast<std::ptrdiff_t>(pos_), in_.end());
    pos_ = in_.size();
  }
  // Refuses the frame with `why` unless `good`. Each may be a value or a callable (called
  // only here, so the encoder does not pay for an expensive check).
  template <class Good, class Why>
  void Check(const Good& good, const Why& why) {
    if (!ok()) return;
    bool fine = false;
    if constexpr (std::is_invocable_v<const Good&>) {
      fine = good();
    } else {
      fine = good;
    }
    if (fine) return;
    if constexpr (std::is_invocable_v<const Why&>) {
      Fail(why());
    } else {
      Fail(why);
    }
  }

 private:
  template <class T>
  static T Le(const uint8_t* p) {
    std::make_unsigned_t<T> v = 0;
    for (size_t i = sizeof(T); i-- > 0;) v = static_cast<std::make_unsigned_t<T>>(v << 8 | p[i]);
    return static_cast<T>(v);
  }
  template <class T>
  bool Read(T& v, const char* f) {
    if (!Need(sizeof(T), f)) return false;
    v = Le<T>(in_.data() + pos_);
    pos_ += sizeof(T);
    return true;
  }
  bool Need(size_t n, const char* f) {
    if (!ok()) return false;
    if (n > left()) {
      Fail(std::string("truncated frame: ") + f + " needs " + std::to_string(n) + " bytes, " + std::to_string(left()) +
           " left");
      return false;
    }
    return true;
  }
  void Fail(std::string e) {
    if (error_.empty()) error_ = std::move(e);
  }
  std::span<const uint8_t> in_;
  int hidden_ = 0;
  size_t pos_ = 0;
  std::string error_;
};

// A model id is a Hub repo id (owner/name, [A-Za-z0-9._-]) or an absolute local path;
// nothing that could steer a fetch elsewhere (no "..", '?', '%', '#', '\\', controls).
bool SafeModelId(std::string_view id) {
  if (id.empty() || id.find("..") != std::string_view::npos) return false;
  for (char c : id) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == '?' || c == '%' || c == '#' || c == '\\' || c == '@') return false;
  }
  if (id[0] == '/') return id.size() > 1;
  const size_t slash = id.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == id.size() ||
      id.find('/', slash + 1) != std::string_view::npos)
    return false;
  for (char c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == '/')) return false;
  return true;
}

// A CURVE public key as Z85 text: 40 characters of the Z85 alphabet (32 bytes).
bool Z85Key(std::string_view k) {
  static constexpr std::string_view kZ85 =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (k.size() != kPublicKeyChars) return false;
  for (char c : k)
    if (kZ85.find(c) == std::string_view::npos) return false;
  return true;
}

// 16 lower-case hex digits: a device id (net::KeyId).
bool DeviceIdShape(std::string_view id) {
  if (id.size() != 16) return false;
  for (char c : id)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// "tcp://host:port" with a plain host name or IPv4 address and a port in [1, 65535], or a
// relayed member's relay://ID.
bool SafeAddress(std::string_view a) {
  if (IsRelayAddress(a)) return true;
  if (!a.starts_with("tcp://")) return false;
  a.remove_prefix(6);
  const size_t colon = a.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == a.size() || a.size() - colon > 6) return false;
  for (size_t i = 0; i < colon; ++i) {
    const char c = a[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-')) return false;
  }
  int port = 0;
  for (size_t i = colon + 1; i < a.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(a[i]))) return false;
    port = port * 10 + (a[i] - '0');
  }
  return port >= 1 && port <= 65535;
}

size_t FirstNonFinite(std::span<const float> values) {
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i])) return i;
  return values.size();
}

// The first stage that does not start where the previous one ended, or stages.size().
size_t PlanGapAt(const std::vector<StageEntry>& stages) {
  int32_t expect = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].first != expect || stages[i].end < stages[i].first) return i;
    expect = stages[i].end;
  }
  return stages.size();
}

// Each message carries its tag (M::kTag): Encode writes it, Decode picks the message by it.
template <class M>
constexpr int32_t kTag = static_cast<int32_t>(M::kTag);

// A tag keeps its number forever (docs/WIRE.md): members of other builds read it. Changing
// one of these is a protocol break, not a refactoring.
static_assert(kTag<Hello> == -20);
static_assert(kTag<Assignment> == -21);
static_assert(kTag<Ready> == -22);
static_assert(kTag<Activation> == -23);
static_assert(kTag<Token> == -24);
static_assert(kTag<Done> == -25);
static_assert(kTag<Heartbeat> == -26);
static_assert(kTag<ErrorMsg> == -27);
static_assert(kTag<Bye> == -28);
static_assert(kTag<Join> == -29);
static_assert(kTag<Peers> == -30);
static_assert(kTag<Progress> == -31);
static_assert(kTag<StageStats> == -32);
static_assert(kTag<HopDigest> == -33);
static_assert(kTag<AuditRequest> == -34);
static_assert(kTag<AuditData> == -35);
static_assert(kTag<HopReceipt> == -36);
static_assert(kTag<Text> == -37);
static_assert(kTag<Relay> == -38);

template <size_t... I>
constexpr bool TagsAreUnique(std::index_sequence<I...>) {
  constexpr int32_t kTags[] = {kTag<std::variant_alternative_t<I, Message>>...};
  for (size_t i = 0; i < sizeof...(I); ++i)
    for (size_t j = i + 1; j < sizeof...(I); ++j)
      if (kTags[i] == kTags[j]) return false;
  return true;
}
static_assert(TagsAreUnique(std::make_index_sequence<std::variant_size_v<Message>>()),
              "two messages share a tag: Decode could not tell them apart");

// Error codes and finish reasons are numbers on the wire too.
static_assert(static_cast<uint16_t>(ErrorKind::kProtocol) == 1 && static_cast<uint16_t>(ErrorKind::kFrame) == 2 &&
              static_cast<uint16_t>(ErrorKind::kAssignment) == 3 && static_cast<uint16_t>(ErrorKind::kHop) == 4 &&
              static_cast<uint16_t>(ErrorKind::kBusy) == 5 && static_cast<uint16_t>(ErrorKind::kAudit) == 6 &&
              static_cast<uint16_t>(ErrorKind::kNextUnreachable) == 7);
static_assert(static_cast<uint8_t>(TextKind::kBegin) == 0 && static_cast<uint8_t>(TextKind::kPiece) == 1 &&
              static_cast<uint8_t>(TextKind::kRetract) == 2 && static_cast<uint8_t>(TextKind::kEnd) == 3 &&
              static_cast<uint8_t>(TextKind::kFailed) == 4);
static_assert(static_cast<uint8_t>(FinishReason::kStop) == 0 && static_cast<uint8_t>(FinishReason::kLength) == 1 &&
              static_cast<uint8_t>(FinishReason::kCancelled) == 2 && static_cast<uint8_t>(FinishReason::kError) == 3);

// ---- The messages: each field once, in wire order, then the checks that refuse a bad value.
// `V` is Writer or Reader; `m` is const for the Writer. A nested part is described by its own
// Fields, declared before its users.

// Is<M>: the message type M, const (encoding) or not (decoding).
template <class T, class M>
concept Is = std::same_as<std::remove_const_t<T>, M>;

template <class V>
void Fields(V& v, Is<HopReceipt> auto& m) {
  v.I32(m.seq, "receipt seq");
  v.I32(m.stage, "receipt stage");
  v.I32(m.token_index, "receipt token_index");
  v.I32(m.rows, "receipt rows");
  v.Bytes(m.digest, "receipt digest");
  v.Bytes(m.mac, "receipt mac");
  v.Check(m.stage >= 0 && m.token_index >= 0 && m.rows > 0, "receipt: negative stage or position, or no rows");
}

template <class V>
void Fields(V& v, Is<Hello> auto& m) {
  v.U16(m.protocol_version, "protocol_version");
  v.U32(m.capabilities, "capabilities");
  v.F64(m.gemms_per_s, "gemms_per_s");
  v.U64(m.probe_hash, "probe_hash");
  v.U64(m.free_memory, "free_memory");
  v.Str(m.backend, "backend", 64);
  v.Str(m.device_id, "device_id", 128);
  v.Str(m.name, "name", 128);
  v.Check(std::isfinite(m.gemms_per_s) && m.gemms_per_s >= 0, "gemms_per_s is not a finite non-negative number");
  v.Check(!m.device_id.empty(), "device_id is empty");
}

template <class V>
void Fields(V& v, Is<StageEntry> auto& m) {
  v.Str(m.device_id, "stage device_id", 128);
  v.Str(m.address, "stage address", 256);
  v.Check([&] { return SafeAddress(m.address); },
          [&] { return "stage address '" + m.address + "' is not tcp://host:port or relay://ID"; });
  v.I32(m.first, "stage first");
  v.I32(m.end, "stage end");
}

template <class V>
void Fields(V& v, Is<Assignment> auto& m) {
  v.U32(m.turn, "turn");
  v.Str(m.model_id, "model_id", 512);
  v.Str(m.revision, "revision", 128);
  v.U64(m.spec_hash, "spec_hash");
  v.U32(m.model_hash, "model_hash");
  v.I32(m.ctx, "ctx");
  v.Vec(m.stages, "stage count", 1, kMaxStages, [&](auto& s) { Fields(v, s); });
  v.I32(m.your_stage, "your_stage");
  v.U64(m.cache_key, "cache_key");
  v.I32(m.keep, "keep");
  v.U64(m.keep_tag, "keep_tag");
  v.Bool(m.audit, "audit");
  v.Check(m.keep >= 0 && m.keep <= m.ctx, [&] { return "keep " + std::to_string(m.keep) + " is outside [0, ctx]"; });
  v.Check(m.ctx > 0, "ctx must be positive");
  v.Check([&] { return SafeModelId(m.model_id); },
          [&] { return "model_id '" + m.model_id + "' is not a repo id (owner/name) or an absolute path"; });
  v.Check(m.your_stage >= 0 && static_cast<size_t>(m.your_stage) < m.stages.size(),
          [&] { return "your_stage " + std::to_string(m.your_stage) + " is not a stage of the plan"; });
  // Layer coverage itself is checked by plan::ValidateAssignment; here only the shape.
  v.Check([&] { return PlanGapAt(m.stages) == m.stages.size(); },
          [&] {
            const size_t i = PlanGapAt(m.stages);
            return "the plan has a gap or overlap at stage " + std::to_string(i) + " (layers [" +
                   std::to_string(m.stages[i].first) + ", " + std::to_string(m.stages[i].end) + "))";
          });
}

template <class V>
void Fields(V& v, Is<Ready> auto& m) {
  v.I32(m.stage, "stage");
  v.U64(m.bytes_held, "bytes_held");
  v.I32(m.kept, "kept");
  v.U64(m.peak_rss, "peak_rss");
  v.Check(m.stage >= 0, "negative stage");
  v.Check(m.kept >= 0, "negative kept");
}

template <class V>
void Fields(V& v, Is<Activation> auto& m) {
  v.I32(m.seq, "seq");
  v.I32(m.token_index, "token_index");
  v.I32(m.next, "next");
  v.U32(m.act_hash, "act_hash");
  v.U32(m.model_hash, "model_hash");
  v.Check(m.token_index >= 0, "negative token_index");
  v.Check(m.next >= kNextReturn, [&] { return "next " + std::to_string(m.next) + " is neither a stage nor RETURN"; });
  v.Rows(m.values, "payload");
  v.Check([&] { return ActHash(m.values) == m.act_hash; }, "act_hash mismatch: the payload did not arrive intact");
  v.Check([&] { return FirstNonFinite(m.values) == m.values.size(); },
          [&] { return "non-finite value at index " + std::to_string(FirstNonFinite(m.values)) + " of the payload"; });
}

template <class V>
void Fields(V& v, Is<Token> auto& m) {
  v.I32(m.seq, "seq");
  v.I32(m.position, "position");
  v.I32(m.token_id, "token_id");
  v.Check(m.position >= 0 && m.token_id >= 0, "negative position or token id");
}

template <class V>
void Fields(V& v, Is<Text> auto& m) {
  v.U32(m.stream, "stream");
  v.Enum(m.kind, "kind", TextKind::kBegin, TextKind::kFailed);
  v.I32(m.index, "index");
  v.I32(m.token_id, "token_id");
  v.Str(m.text, "text", kMaxTextPiece);
  v.Check(m.index >= 0 && m.token_id >= -1, "negative index or token id");
  v.Check(m.kind == TextKind::kPiece || m.token_id == -1, "a token id outside a piece");
}

template <class V>
void Fields(V& v, Is<Done> auto& m) {
  v.I32(m.seq, "seq");
  v.Enum(m.reason, "finish_reason", FinishReason::kStop, FinishReason::kError);
  v.I32(m.cached, "cached");
  v.U64(m.cache_tag, "cache_tag");
  v.Check(m.cached >= 0, "negative cached");
}

template <class V>
void Fields(V& v, Is<Progress> auto& m) {
  v.U32(m.turn, "turn");
  v.I32(m.stage, "stage");
  v.U64(m.bytes_done, "bytes_done");
  v.U64(m.bytes_total, "bytes_total");
  v.Check(m.stage >= 0, "negative stage");
  v.Check(m.bytes_done <= m.bytes_total, "bytes_done exceeds bytes_total");
}

template <class V>
void Fields(V& v, Is<StageStats> auto& m) {
  v.I32(m.seq, "seq");
  v.I32(m.stage, "stage");
  v.I64(m.hops, "hops");
  v.F64(m.compute_seconds, "compute_seconds");
  v.U64(m.peak_rss, "peak_rss");
  v.Check(m.stage >= 0 && m.hops >= 0, "negative stage or hops");
  v.Check(std::isfinite(m.compute_seconds) && m.compute_seconds >= 0,
          "compute_seconds is not a finite non-negative number");
}

template <class V>
void Fields(V& v, Is<HopDigest> auto& m) {
  v.I32(m.seq, "seq");
  v.I32(m.stage, "stage");
  v.I32(m.token_index, "token_index");
  v.I32(m.rows, "rows");
  v.Bytes(m.in_digest, "in_digest");
  v.Bytes(m.out_digest, "out_digest");
  v.Bool(m.has_receipt, "has_receipt");
  if (m.has_receipt) Fields(v, m.receipt);  // present only when the flag says so
  v.Check(m.stage >= 0 && m.token_index >= 0 && m.rows > 0, "negative stage or position, or no rows");
}

template <class V>
void Fields(V& v, Is<AuditRequest> auto& m) {
  v.I32(m.seq, "seq");
  v.I32(m.from, "from");
  v.I32(m.to, "to");
  v.Check(m.from >= 0 && m.to > m.from, [&] {
    return "the range [" + std::to_string(m.from) + ", " + std::to_string(m.to) + ") is empty or negative";
  });
}

template <class V>
void Fields(V& v, Is<AuditData> auto& m) {
  v.I32(m.seq, "seq");
  v.I32(m.stage, "stage");
  v.I32(m.from, "from");
  v.Check(m.stage >= 0 && m.from >= 0, "negative stage or position");
  v.Rows(m.values, "payload");
}

template <class V>
void Fields(V& v, Is<Heartbeat> auto& m) {
  v.U64(m.millis, "millis");
  v.Str(m.device_id, "device_id", 128);
}

template <class V>
void Fields(V& v, Is<ErrorMsg> auto& m) {
  v.Enum(m.code, "code", ErrorKind::kProtocol, ErrorKind::kNextUnreachable);
  v.Str(m.message, "message", kMaxString);
}

template <class V>
void Fields(V& v, Is<Bye> auto& m) {
  v.Str(m.device_id, "device_id", 128);
}

template <class V>
void Fields(V& v, Is<Join> auto& m) {
  v.Str(m.room, "room", 64);
  v.Str(m.address, "address", 256);
  Fields(v, m.hello);
  v.Check([&] { return SafeAddress(m.address); },
          [&] { return "address '" + m.address + "' is not tcp://host:port or relay://ID"; });
}

template <class V>
void Fields(V& v, Is<Peer> auto& m) {
  v.Str(m.address, "peer address", 256);
  Fields(v, m.hello);
  v.Str(m.public_key, "peer public_key", kPublicKeyChars);
  v.Check([&] { return SafeAddress(m.address); },
          [&] { return "peer address '" + m.address + "' is not tcp://host:port or relay://ID"; });
  v.Check([&] { return Z85Key(m.public_key); }, "peer public_key is not 40 characters of Z85");
}

template <class V>
void Fields(V& v, Is<Peers> auto& m) {
  v.Str(m.room, "room", 64);
  v.Vec(m.peers, "peer count", 0, kMaxPeers, [&](auto& p) { Fields(v, p); });
}

template <class V>
void Fields(V& v, Is<Relay> auto& m) {
  v.Str(m.to, "to", 16);
  v.Str(m.from, "from", 16);
  v.U64(m.counter, "counter");
  v.Tail(m.box, "box", kBoxMacBytes);
  v.Check([&] { return DeviceIdShape(m.to) && DeviceIdShape(m.from); },
          "to and from must be device ids (16 hex digits)");
  v.Check(m.to != m.from, "to and from are the same device");
}

// Reads the message whose tag is `tag` into `out`; false when no message has that tag.
template <size_t... I>
bool ReadMessage(int32_t tag, Reader& r, Message& out, std::index_sequence<I...>) {
  auto read = [&]<size_t K>(std::integral_constant<size_t, K>) {
    if (tag != kTag<std::variant_alternative_t<K, Message>>) return false;
    Fields(r, out.emplace<K>());
    return true;
  };
  return (read(std::integral_constant<size_t, I>{}) || ...);
}

Status Bad(std::string_view what, const std::string& why) {
  return InvalidArgument("malformed " + std::string(what) + " message: " + why);
}

}  // namespace

std::string_view TagName(int32_t tag) {
  switch (static_cast<Tag>(tag)) {
    case Tag::kHello:
      return "hello";
    case Tag::kAssignment:
      return "assignment";
    case Tag::kReady:
      return "ready";
    case Tag::kActivation:
      return "activation";
    case Tag::kToken:
      return "token";
    case Tag::kDone:
      return "done";
    case Tag::kHeartbeat:
      return "heartbeat";
    case Tag::kError:
      return "error";
    case Tag::kBye:
      return "bye";
    case Tag::kJoin:
      return "join";
    case Tag::kPeers:
      return "peers";
    case Tag::kProgress:
      return "progress";
    case Tag::kStageStats:
      return "stage_stats";
    case Tag::kHopDigest:
      return "hop_digest";
    case Tag::kAuditRequest:
      return "audit_request";
    case Tag::kAuditData:
      return "audit_data";
    case Tag::kHopReceipt:
      return "hop_receipt";
    case Tag::kText:
      return "text";
    case Tag::kRelay:
      return "relay";
  }
  return "unknown";
}

// XXH32: "did the payload arrive intact" guards against accidents; CURVE already
// authenticates every frame, and the audit's evidence is RowsDigest (BLAKE2b).
uint32_t ActHash(std::span<const float> values) {
  static_assert(std::endian::native == std::endian::little, "hash the little-endian bytes");
  return XXH32(values.data(), values.size() * sizeof(float), 0x44414953u /* "DAIS" */);
}

// libsodium wants sodium_init() once before use (it also picks the fastest BLAKE2b; the
// digests are the same either way). Thread-safe and cheap after the first call.
static void InitSodium() {
  [[maybe_unused]] static const int kSodiumReady = sodium_init();
}

Digest RowsDigest(std::span<const float> values) {
  static_assert(std::endian::native == std::endian::little, "hash the little-endian bytes");
  InitSodium();
  Digest d{};
  crypto_generichash(d.data(), d.size(), reinterpret_cast<const unsigned char*>(values.data()),
                     values.size() * sizeof(float), nullptr, 0);
  return d;
}

Digest ReceiptMac(std::span<const uint8_t, 32> key, uint32_t model_hash, const HopReceipt& r) {
  InitSodium();
  Writer w;  // the fields in their wire order: one encoding, no ambiguity
  w.U32(model_hash, "model_hash");
  w.I32(r.seq, "seq");
  w.I32(r.stage, "stage");
  w.I32(r.token_index, "token_index");
  w.I32(r.rows, "rows");
  w.Bytes(r.digest, "digest");
  const std::vector<uint8_t> msg = w.Take();
  Digest mac{};
  crypto_generichash(mac.data(), mac.size(), msg.data(), msg.size(), key.data(), key.size());
  return mac;
}

uint32_t ModelHash(std::string_view model_id, std::string_view revision, std::string_view tensor_index_digest) {
  XXH32_state_t* st = XXH32_createState();
  XXH32_reset(st, 0x4d4f444cu /* "MODL" */);
  // Lengths first, so ("ab","c") and ("a","bc") differ.
  for (std::string_view part : {model_id, revision, tensor_index_digest}) {
    uint64_t n = part.size();
    XXH32_update(st, &n, sizeof n);
    XXH32_update(st, part.data(), part.size());
  }
  uint32_t h = XXH32_digest(st);
  XXH32_freeState(st);
  return h;
}

bool IsRelayAddress(std::string_view address) {
  return address.starts_with(kRelayScheme) && DeviceIdShape(address.substr(kRelayScheme.size()));
}

std::vector<uint8_t> Encode(const Message& message) {
  Writer w;
  std::visit(
      [&](const auto& m) {
        w.I32(kTag<std::decay_t<decltype(m)>>, "tag");
        Fields(w, m);
      },
      message);
  return w.Take();
}

Result<Message> Decode(std::span<const uint8_t> frame, int hidden) {
  if (frame.size() > kMaxFrameBytes)
    return InvalidArgument("frame of " + std::to_string(frame.size()) + " bytes exceeds the cap of " +
                           std::to_string(kMaxFrameBytes));
  Reader r(frame, hidden);
  int32_t tag = 0;
  r.I32(tag, "tag");
  if (!r.ok()) return InvalidArgument("malformed frame: " + r.error());
  Message out;
  if (!ReadMessage(tag, r, out, std::make_index_sequence<std::variant_size_v<Message>>()))
    return InvalidArgument("malformed frame: unknown tag " + std::to_string(tag));
  if (!r.ok()) return Bad(TagName(tag), r.error());
  if (r.left() != 0) return Bad(TagName(tag), std::to_string(r.left()) + " trailing bytes after the last field");
  return out;
}

}  // namespace daisy::wire
