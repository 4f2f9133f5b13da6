// The message codec: explicit little-endian writes and bounds-checked reads.
#include "daisy/wire.h"

#include <sodium.h>
#include <xxhash.h>

#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>

namespace daisy::wire {

namespace {

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(v); }
  void U16(uint16_t v) { Le(v, 2); }
  void U32(uint32_t v) { Le(v, 4); }
  void I32(int32_t v) { Le(static_cast<uint32_t>(v), 4); }
  void U64(uint64_t v) { Le(v, 8); }
  void F64(double v) { Le(std::bit_cast<uint64_t>(v), 8); }
  void Str(std::string_view s) {
    // Encoding never truncates silently: callers keep strings within kMaxString.
    const size_t n = s.size() > kMaxString ? kMaxString : s.size();
    U16(static_cast<uint16_t>(n));
    out_.insert(out_.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
  }
  void Bytes(std::span<const uint8_t> v) { out_.insert(out_.end(), v.begin(), v.end()); }
  void F32s(std::span<const float> v) {
    for (float f : v) U32(std::bit_cast<uint32_t>(f));
  }
  std::vector<uint8_t> Take() { return std::move(out_); }

 private:
  void Le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  size_t left() const { return in_.size() - pos_; }

  uint64_t Le(int bytes, const char* field) {
    if (!Need(static_cast<size_t>(bytes), field)) return 0;
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | in_[pos_ + static_cast<size_t>(i)];
    pos_ += static_cast<size_t>(bytes);
    return v;
  }
  uint8_t U8(const char* f) { return static_cast<uint8_t>(Le(1, f)); }
  uint16_t U16(const char* f) { return static_cast<uint16_t>(Le(2, f)); }
  uint32_t U32(const char* f) { return static_cast<uint32_t>(Le(4, f)); }
  int32_t I32(const char* f) { return static_cast<int32_t>(U32(f)); }
  uint64_t U64(const char* f) { return Le(8, f); }
  Digest Bytes32(const char* f) {
    Digest d{};
    for (auto& b : d) b = U8(f);
    return d;
  }
  double F64(const char* f) { return std::bit_cast<double>(U64(f)); }
  std::string Str(const char* field, size_t cap = kMaxString) {
    const size_t n = U16(field);
    if (!ok()) return {};
    if (n > cap) return Fail(std::string(field) + " length " + std::to_string(n) + " exceeds the cap of " + std::to_string(cap)), std::string();
    if (!Need(n, field)) return {};
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  bool Need(size_t n, const char* field) {
    if (!ok()) return false;
    if (n > left()) {
      Fail(std::string("truncated frame: ") + field + " needs " + std::to_string(n) + " bytes, " + std::to_string(left()) + " left");
      return false;
    }
    return true;
  }
  void Fail(std::string e) {
    if (error_.empty()) error_ = std::move(e);
  }
  std::span<const uint8_t> Rest() { return in_.subspan(pos_); }
  // The next `bytes` (checked by the caller: a whole number of f32) as little-endian f32.
  std::vector<float> F32s(size_t bytes) {
    std::vector<float> v(bytes / 4);
    auto rest = Rest();
    for (size_t i = 0; i < v.size(); ++i) {
      const uint32_t b = static_cast<uint32_t>(rest[4 * i]) | static_cast<uint32_t>(rest[4 * i + 1]) << 8 |
                         static_cast<uint32_t>(rest[4 * i + 2]) << 16 | static_cast<uint32_t>(rest[4 * i + 3]) << 24;
      v[i] = std::bit_cast<float>(b);
    }
    pos_ += bytes;
    return v;
  }

 private:
  std::span<const uint8_t> in_;
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
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == id.size() || id.find('/', slash + 1) != std::string_view::npos)
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

// "tcp://host:port" with a plain host name or IPv4 address and a port in [1, 65535].
bool SafeAddress(std::string_view a) {
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

void WriteReceipt(Writer& w, const HopReceipt& m) {
  w.I32(m.seq);
  w.I32(m.stage);
  w.I32(m.token_index);
  w.I32(m.rows);
  w.Bytes(m.digest);
  w.Bytes(m.mac);
}

HopReceipt ReadReceipt(Reader& r) {
  HopReceipt m;
  m.seq = r.I32("receipt seq");
  m.stage = r.I32("receipt stage");
  m.token_index = r.I32("receipt token_index");
  m.rows = r.I32("receipt rows");
  m.digest = r.Bytes32("receipt digest");
  m.mac = r.Bytes32("receipt mac");
  if (r.ok() && (m.stage < 0 || m.token_index < 0 || m.rows <= 0)) r.Fail("receipt: negative stage or position, or no rows");
  return m;
}

void WriteHello(Writer& w, const Hello& m) {
  w.U16(m.protocol_version);
  w.U32(m.capabilities);
  w.F64(m.gemms_per_s);
  w.U64(m.probe_hash);
  w.U64(m.free_memory);
  w.Str(m.backend);
  w.Str(m.device_id);
  w.Str(m.name);
}

Hello ReadHello(Reader& r) {
  Hello m;
  m.protocol_version = r.U16("protocol_version");
  m.capabilities = r.U32("capabilities");
  m.gemms_per_s = r.F64("gemms_per_s");
  m.probe_hash = r.U64("probe_hash");
  m.free_memory = r.U64("free_memory");
  m.backend = r.Str("backend", 64);
  m.device_id = r.Str("device_id", 128);
  m.name = r.Str("name", 128);
  if (r.ok() && !(std::isfinite(m.gemms_per_s) && m.gemms_per_s >= 0)) r.Fail("gemms_per_s is not a finite non-negative number");
  if (r.ok() && m.device_id.empty()) r.Fail("device_id is empty");
  return m;
}

Status Bad(std::string_view what, const std::string& why) {
  return InvalidArgument("malformed " + std::string(what) + " message: " + why);
}

}  // namespace

std::string_view TagName(int32_t tag) {
  switch (static_cast<Tag>(tag)) {
    case Tag::kHello: return "hello";
    case Tag::kAssignment: return "assignment";
    case Tag::kReady: return "ready";
    case Tag::kActivation: return "activation";
    case Tag::kToken: return "token";
    case Tag::kDone: return "done";
    case Tag::kHeartbeat: return "heartbeat";
    case Tag::kError: return "error";
    case Tag::kBye: return "bye";
    case Tag::kJoin: return "join";
    case Tag::kPeers: return "peers";
    case Tag::kProgress: return "progress";
    case Tag::kStageStats: return "stage_stats";
    case Tag::kHopDigest: return "hop_digest";
    case Tag::kAuditRequest: return "audit_request";
    case Tag::kAuditData: return "audit_data";
    case Tag::kHopReceipt: return "hop_receipt";
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
static void InitSodium() { [[maybe_unused]] static const int once = sodium_init(); }

Digest RowsDigest(std::span<const float> values) {
  static_assert(std::endian::native == std::endian::little, "hash the little-endian bytes");
  InitSodium();
  Digest d{};
  crypto_generichash(d.data(), d.size(), reinterpret_cast<const unsigned char*>(values.data()), values.size() * sizeof(float), nullptr, 0);
  return d;
}

Digest ReceiptMac(std::span<const uint8_t, 32> key, uint32_t model_hash, const HopReceipt& r) {
  InitSodium();
  Writer w;  // the fields in their wire order: one encoding, no ambiguity
  w.U32(model_hash);
  w.I32(r.seq);
  w.I32(r.stage);
  w.I32(r.token_index);
  w.I32(r.rows);
  w.Bytes(r.digest);
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

std::vector<uint8_t> Encode(const Message& message) {
  Writer w;
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Hello>) {
          w.I32(static_cast<int32_t>(Tag::kHello));
          WriteHello(w, m);
        } else if constexpr (std::is_same_v<T, Assignment>) {
          w.I32(static_cast<int32_t>(Tag::kAssignment));
          w.U32(m.turn);
          w.Str(m.model_id);
          w.Str(m.revision);
          w.U64(m.spec_hash);
          w.U32(m.model_hash);
          w.I32(m.ctx);
          w.U32(static_cast<uint32_t>(m.stages.size()));
          for (const auto& s : m.stages) {
            w.Str(s.device_id);
            w.Str(s.address);
            w.I32(s.first);
            w.I32(s.end);
          }
          w.I32(m.your_stage);
          w.U64(m.cache_key);
          w.I32(m.keep);
          w.U64(m.keep_tag);
          w.U8(m.audit ? 1 : 0);
        } else if constexpr (std::is_same_v<T, Ready>) {
          w.I32(static_cast<int32_t>(Tag::kReady));
          w.I32(m.stage);
          w.U64(m.bytes_held);
          w.I32(m.kept);
          w.U64(m.peak_rss);
        } else if constexpr (std::is_same_v<T, Activation>) {
          w.I32(static_cast<int32_t>(Tag::kActivation));
          w.I32(m.seq);
          w.I32(m.token_index);
          w.I32(m.next);
          w.U32(m.act_hash);
          w.U32(m.model_hash);
          w.F32s(m.values);
        } else if constexpr (std::is_same_v<T, Token>) {
          w.I32(static_cast<int32_t>(Tag::kToken));
          w.I32(m.seq);
          w.I32(m.position);
          w.I32(m.token_id);
        } else if constexpr (std::is_same_v<T, Done>) {
          w.I32(static_cast<int32_t>(Tag::kDone));
          w.I32(m.seq);
          w.U8(static_cast<uint8_t>(m.reason));
          w.I32(m.cached);
          w.U64(m.cache_tag);
        } else if constexpr (std::is_same_v<T, Progress>) {
          w.I32(static_cast<int32_t>(Tag::kProgress));
          w.U32(m.turn);
          w.I32(m.stage);
          w.U64(m.bytes_done);
          w.U64(m.bytes_total);
        } else if constexpr (std::is_same_v<T, StageStats>) {
          w.I32(static_cast<int32_t>(Tag::kStageStats));
          w.I32(m.seq);
          w.I32(m.stage);
          w.U64(static_cast<uint64_t>(m.hops));
          w.F64(m.compute_seconds);
          w.U64(m.peak_rss);
        } else if constexpr (std::is_same_v<T, HopDigest>) {
          w.I32(static_cast<int32_t>(Tag::kHopDigest));
          w.I32(m.seq);
          w.I32(m.stage);
          w.I32(m.token_index);
          w.I32(m.rows);
          w.Bytes(m.in_digest);
          w.Bytes(m.out_digest);
          w.U8(m.has_receipt ? 1 : 0);
          if (m.has_receipt) WriteReceipt(w, m.receipt);
        } else if constexpr (std::is_same_v<T, HopReceipt>) {
          w.I32(static_cast<int32_t>(Tag::kHopReceipt));
          WriteReceipt(w, m);
        } else if constexpr (std::is_same_v<T, AuditRequest>) {
          w.I32(static_cast<int32_t>(Tag::kAuditRequest));
          w.I32(m.seq);
          w.I32(m.from);
          w.I32(m.to);
        } else if constexpr (std::is_same_v<T, AuditData>) {
          w.I32(static_cast<int32_t>(Tag::kAuditData));
          w.I32(m.seq);
          w.I32(m.stage);
          w.I32(m.from);
          w.F32s(m.values);
        } else if constexpr (std::is_same_v<T, Heartbeat>) {
          w.I32(static_cast<int32_t>(Tag::kHeartbeat));
          w.U64(m.millis);
          w.Str(m.device_id);
        } else if constexpr (std::is_same_v<T, ErrorMsg>) {
          w.I32(static_cast<int32_t>(Tag::kError));
          w.U16(m.code);
          w.Str(m.message);
        } else if constexpr (std::is_same_v<T, Bye>) {
          w.I32(static_cast<int32_t>(Tag::kBye));
          w.Str(m.device_id);
        } else if constexpr (std::is_same_v<T, Join>) {
          w.I32(static_cast<int32_t>(Tag::kJoin));
          w.Str(m.room);
          w.Str(m.address);
          WriteHello(w, m.hello);
        } else if constexpr (std::is_same_v<T, Peers>) {
          w.I32(static_cast<int32_t>(Tag::kPeers));
          w.Str(m.room);
          w.U32(static_cast<uint32_t>(m.peers.size()));
          for (const auto& p : m.peers) {
            w.Str(p.address);
            WriteHello(w, p.hello);
            w.Str(p.public_key);
          }
        }
      },
      message);
  return w.Take();
}

Result<Message> Decode(std::span<const uint8_t> frame, int hidden) {
  if (frame.size() > kMaxFrameBytes)
    return InvalidArgument("frame of " + std::to_string(frame.size()) + " bytes exceeds the cap of " + std::to_string(kMaxFrameBytes));
  Reader r(frame);
  const int32_t tag = r.I32("tag");
  if (!r.ok()) return InvalidArgument("malformed frame: " + r.error());
  const std::string_view name = TagName(tag);
  Message out;
  switch (static_cast<Tag>(tag)) {
    case Tag::kHello: {
      Hello m = ReadHello(r);
      out = std::move(m);
      break;
    }
    case Tag::kJoin: {
      Join m;
      m.room = r.Str("room", 64);
      m.address = r.Str("address", 256);
      m.hello = ReadHello(r);
      if (r.ok() && !SafeAddress(m.address)) r.Fail("address '" + m.address + "' is not tcp://host:port");
      out = std::move(m);
      break;
    }
    case Tag::kPeers: {
      Peers m;
      m.room = r.Str("room", 64);
      const uint32_t n = r.U32("peer count");
      if (r.ok() && n > kMaxPeers) r.Fail("peer count " + std::to_string(n) + " exceeds " + std::to_string(kMaxPeers));
      for (uint32_t i = 0; r.ok() && i < n; ++i) {
        Peer p;
        p.address = r.Str("peer address", 256);
        p.hello = ReadHello(r);
        p.public_key = r.Str("peer public_key", kPublicKeyChars);
        if (r.ok() && !SafeAddress(p.address)) r.Fail("peer address '" + p.address + "' is not tcp://host:port");
        if (r.ok() && !Z85Key(p.public_key)) r.Fail("peer public_key is not 40 characters of Z85");
        m.peers.push_back(std::move(p));
      }
      out = std::move(m);
      break;
    }
    case Tag::kAssignment: {
      Assignment m;
      m.turn = r.U32("turn");
      m.model_id = r.Str("model_id", 512);
      m.revision = r.Str("revision", 128);
      m.spec_hash = r.U64("spec_hash");
      m.model_hash = r.U32("model_hash");
      m.ctx = r.I32("ctx");
      const uint32_t n = r.U32("stage count");
      if (r.ok() && (n == 0 || n > kMaxStages)) r.Fail("stage count " + std::to_string(n) + " is outside [1, " + std::to_string(kMaxStages) + "]");
      for (uint32_t i = 0; r.ok() && i < n; ++i) {
        StageEntry s;
        s.device_id = r.Str("stage device_id", 128);
        s.address = r.Str("stage address", 256);
        if (r.ok() && !SafeAddress(s.address)) r.Fail("stage address '" + s.address + "' is not tcp://host:port");
        s.first = r.I32("stage first");
        s.end = r.I32("stage end");
        m.stages.push_back(std::move(s));
      }
      m.your_stage = r.I32("your_stage");
      m.cache_key = r.U64("cache_key");
      m.keep = r.I32("keep");
      m.keep_tag = r.U64("keep_tag");
      const uint8_t audit = r.U8("audit");
      if (r.ok() && audit > 1) r.Fail("audit flag " + std::to_string(audit) + " is not 0 or 1");
      m.audit = audit == 1;
      if (r.ok() && (m.keep < 0 || m.keep > m.ctx)) r.Fail("keep " + std::to_string(m.keep) + " is outside [0, ctx]");
      if (r.ok() && m.ctx <= 0) r.Fail("ctx must be positive");
      if (r.ok() && !SafeModelId(m.model_id)) r.Fail("model_id '" + m.model_id + "' is not a repo id (owner/name) or an absolute path");
      if (r.ok() && (m.your_stage < 0 || static_cast<size_t>(m.your_stage) >= m.stages.size()))
        r.Fail("your_stage " + std::to_string(m.your_stage) + " is not a stage of the plan");
      // Layer coverage itself is checked by plan::ValidateAssignment; here only the shape.
      int32_t expect = 0;
      for (size_t i = 0; r.ok() && i < m.stages.size(); ++i) {
        if (m.stages[i].first != expect || m.stages[i].end < m.stages[i].first)
          r.Fail("the plan has a gap or overlap at stage " + std::to_string(i) + " (layers [" +
                 std::to_string(m.stages[i].first) + ", " + std::to_string(m.stages[i].end) + "))");
        expect = m.stages[i].end;
      }
      out = std::move(m);
      break;
    }
    case Tag::kReady: {
      Ready m;
      m.stage = r.I32("stage");
      m.bytes_held = r.U64("bytes_held");
      m.kept = r.I32("kept");
      m.peak_rss = r.U64("peak_rss");
      if (r.ok() && m.stage < 0) r.Fail("negative stage");
      if (r.ok() && m.kept < 0) r.Fail("negative kept");
      out = m;
      break;
    }
    case Tag::kActivation: {
      Activation m;
      m.seq = r.I32("seq");
      m.token_index = r.I32("token_index");
      m.next = r.I32("next");
      m.act_hash = r.U32("act_hash");
      m.model_hash = r.U32("model_hash");
      if (!r.ok()) break;
      if (m.token_index < 0) r.Fail("negative token_index");
      if (r.ok() && m.next < kNextReturn) r.Fail("next " + std::to_string(m.next) + " is neither a stage nor RETURN");
      const size_t bytes = r.left();
      if (r.ok() && bytes % 4 != 0) r.Fail("payload of " + std::to_string(bytes) + " bytes is not a whole number of f32 values");
      if (r.ok() && bytes == 0) r.Fail("empty payload");
      if (r.ok() && hidden > 0 && (bytes / 4) % static_cast<size_t>(hidden) != 0)
        r.Fail("payload of " + std::to_string(bytes / 4) + " values is not a whole number of rows of " + std::to_string(hidden));
      if (!r.ok()) break;
      m.values = r.F32s(bytes);
      if (ActHash(m.values) != m.act_hash) {
        r.Fail("act_hash mismatch: the payload did not arrive intact");
        break;
      }
      for (size_t i = 0; i < m.values.size(); ++i)
        if (!std::isfinite(m.values[i])) {
          r.Fail("non-finite value at index " + std::to_string(i) + " of the payload");
          break;
        }
      out = std::move(m);
      break;
    }
    case Tag::kToken: {
      Token m;
      m.seq = r.I32("seq");
      m.position = r.I32("position");
      m.token_id = r.I32("token_id");
      if (r.ok() && (m.position < 0 || m.token_id < 0)) r.Fail("negative position or token id");
      out = m;
      break;
    }
    case Tag::kDone: {
      Done m;
      m.seq = r.I32("seq");
      const uint8_t reason = r.U8("finish_reason");
      if (r.ok() && reason > static_cast<uint8_t>(FinishReason::kError)) r.Fail("unknown finish_reason " + std::to_string(reason));
      m.reason = static_cast<FinishReason>(reason);
      m.cached = r.I32("cached");
      m.cache_tag = r.U64("cache_tag");
      if (r.ok() && m.cached < 0) r.Fail("negative cached");
      out = m;
      break;
    }
    case Tag::kProgress: {
      Progress m;
      m.turn = r.U32("turn");
      m.stage = r.I32("stage");
      m.bytes_done = r.U64("bytes_done");
      m.bytes_total = r.U64("bytes_total");
      if (r.ok() && m.stage < 0) r.Fail("negative stage");
      if (r.ok() && m.bytes_done > m.bytes_total) r.Fail("bytes_done exceeds bytes_total");
      out = m;
      break;
    }
    case Tag::kStageStats: {
      StageStats m;
      m.seq = r.I32("seq");
      m.stage = r.I32("stage");
      m.hops = static_cast<int64_t>(r.U64("hops"));
      m.compute_seconds = r.F64("compute_seconds");
      m.peak_rss = r.U64("peak_rss");
      if (r.ok() && (m.stage < 0 || m.hops < 0)) r.Fail("negative stage or hops");
      if (r.ok() && !(std::isfinite(m.compute_seconds) && m.compute_seconds >= 0)) r.Fail("compute_seconds is not a finite non-negative number");
      out = m;
      break;
    }
    case Tag::kHopDigest: {
      HopDigest m;
      m.seq = r.I32("seq");
      m.stage = r.I32("stage");
      m.token_index = r.I32("token_index");
      m.rows = r.I32("rows");
      m.in_digest = r.Bytes32("in_digest");
      m.out_digest = r.Bytes32("out_digest");
      const uint8_t has = r.U8("has_receipt");
      if (r.ok() && has > 1) r.Fail("has_receipt must be 0 or 1");
      m.has_receipt = has == 1;
      if (m.has_receipt) m.receipt = ReadReceipt(r);
      if (r.ok() && (m.stage < 0 || m.token_index < 0 || m.rows <= 0)) r.Fail("negative stage or position, or no rows");
      out = m;
      break;
    }
    case Tag::kHopReceipt: {
      out = ReadReceipt(r);
      break;
    }
    case Tag::kAuditRequest: {
      AuditRequest m;
      m.seq = r.I32("seq");
      m.from = r.I32("from");
      m.to = r.I32("to");
      if (r.ok() && (m.from < 0 || m.to <= m.from)) r.Fail("the range [" + std::to_string(m.from) + ", " + std::to_string(m.to) + ") is empty or negative");
      out = m;
      break;
    }
    case Tag::kAuditData: {
      AuditData m;
      m.seq = r.I32("seq");
      m.stage = r.I32("stage");
      m.from = r.I32("from");
      if (r.ok() && (m.stage < 0 || m.from < 0)) r.Fail("negative stage or position");
      if (!r.ok()) break;
      const size_t bytes = r.left();
      if (bytes % 4 != 0 || bytes == 0) {
        r.Fail("payload of " + std::to_string(bytes) + " bytes is not a positive whole number of f32 values");
        break;
      }
      if (hidden > 0 && (bytes / 4) % static_cast<size_t>(hidden) != 0) {
        r.Fail("payload is not a whole number of rows of " + std::to_string(hidden));
        break;
      }
      m.values = r.F32s(bytes);
      out = std::move(m);
      break;
    }
    case Tag::kHeartbeat: {
      Heartbeat m;
      m.millis = r.U64("millis");
      m.device_id = r.Str("device_id", 128);
      out = m;
      break;
    }
    case Tag::kError: {
      ErrorMsg m;
      m.code = r.U16("code");
      m.message = r.Str("message");
      out = std::move(m);
      break;
    }
    case Tag::kBye: {
      Bye m;
      m.device_id = r.Str("device_id", 128);
      out = std::move(m);
      break;
    }
    default:
      return InvalidArgument("malformed frame: unknown tag " + std::to_string(tag));
  }
  if (!r.ok()) return Bad(name, r.error());
  if (r.left() != 0) return Bad(name, std::to_string(r.left()) + " trailing bytes after the last field");
  return out;
}

}  // namespace daisy::wire
