#include <gtest/gtest.h>
#include <optional>
#include <xxhash.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "daisy/wire.h"

namespace daisy::wire {
namespace {

// A CURVE public key in Z85 (the ZeroMQ test vector's).
constexpr const char* kKey = "rq:^%7Gl8#i&GJdRjdR?VTnxbD*3A0g/VQxcqKx5";

Activation MakeActivation(int n_tokens, int hidden) {
  Activation a;
  a.seq = 3;
  a.token_index = 17;
  a.next = 2;
  a.model_hash = ModelHash("owner/name", "0123456789abcdef0123456789abcdef01234567", "index");
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int i = 0; i < n_tokens * hidden; ++i) a.values.push_back(nd(rng));
  if (a.values.size() > 5) a.values[5] = -0.0f;  // a signed zero the hash must keep apart from +0
  a.act_hash = ActHash(a.values);
  return a;
}

Assignment MakeAssignment() {
  Assignment a;
  a.turn = 9;
  a.model_id = "HuggingFaceTB/SmolLM2-135M";
  a.revision = "0123456789abcdef0123456789abcdef01234567";
  a.spec_hash = 0x1122334455667788ull;
  a.model_hash = 0xabcdef01u;
  a.ctx = 512;
  a.stages = {{"head", "tcp://127.0.0.1:5000", 0, 10}, {"b", "tcp://127.0.0.1:5001", 10, 20}, {"c", "tcp://host-c:5002", 20, 30}};
  a.your_stage = 1;
  return a;
}

Status DecodeStatus(const std::vector<uint8_t>& bytes, int hidden = 0) { return Decode(bytes, hidden).status(); }

void ExpectRefused(const std::vector<uint8_t>& bytes, const std::string& needle, int hidden = 0) {
  Status st = DecodeStatus(bytes, hidden);
  ASSERT_FALSE(st.ok()) << "accepted; wanted: " << needle;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

template <typename T>
T RoundTrip(const T& m, int hidden = 0) {
  auto bytes = Encode(Message(m));
  auto back = Decode(bytes, hidden);
  EXPECT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(std::holds_alternative<T>(*back));
  return std::get<T>(*back);
}

TEST(Wire, EveryMessageRoundTrips) {
  Hello h{kProtocolVersion, kCapCompute | kCapHead, 1234.5, 0xfeedfacecafebeefull, 8ull << 30, "avx512vnni", "peer-1", "laptop"};
  Hello h2 = RoundTrip(h);
  EXPECT_EQ(h2.gemms_per_s, 1234.5);
  EXPECT_EQ(h2.probe_hash, h.probe_hash);
  EXPECT_EQ(h2.name, "laptop");
  Assignment a = RoundTrip(MakeAssignment());
  EXPECT_EQ(a.stages.size(), 3u);
  EXPECT_EQ(a.stages[2].end, 30);
  EXPECT_EQ(a.your_stage, 1);
  EXPECT_EQ(a.model_id, "HuggingFaceTB/SmolLM2-135M");
  EXPECT_EQ(RoundTrip(Ready{2, 99}).bytes_held, 99u);
  EXPECT_EQ(RoundTrip(Ready{2, 99, 17}).kept, 17);
  EXPECT_EQ(RoundTrip(Ready{2, 99, 17, 123456789012ull}).peak_rss, 123456789012ull);
  Assignment with_cache = MakeAssignment();
  with_cache.cache_key = 0x1122334455667788ull;
  with_cache.keep = 12;
  with_cache.keep_tag = 0x99ull;
  Assignment wc = RoundTrip(with_cache);
  EXPECT_EQ(wc.cache_key, with_cache.cache_key);
  EXPECT_EQ(wc.keep, 12);
  EXPECT_EQ(wc.keep_tag, 0x99ull);
  Done dc = RoundTrip(Done{1, FinishReason::kStop, 40, 0xabcdefull});
  EXPECT_EQ(dc.cached, 40);
  EXPECT_EQ(dc.cache_tag, 0xabcdefull);
  Progress pr = RoundTrip(Progress{3, 1, 500, 1000});
  EXPECT_EQ(pr.bytes_done, 500u);
  EXPECT_EQ(pr.bytes_total, 1000u);
  StageStats ss = RoundTrip(StageStats{3, 2, 64, 0.125});
  EXPECT_EQ(ss.hops, 64);
  EXPECT_EQ(ss.compute_seconds, 0.125);
  EXPECT_EQ(RoundTrip(StageStats{3, 2, 64, 0.125, 5ull << 30}).peak_rss, 5ull << 30);
  Assignment audited = MakeAssignment();
  audited.audit = true;
  EXPECT_TRUE(RoundTrip(audited).audit);
  EXPECT_FALSE(RoundTrip(MakeAssignment()).audit);
  Digest in{}, out{}, mac{};
  in[0] = 1;
  out[31] = 2;
  mac[5] = 3;
  HopDigest hd = RoundTrip(HopDigest{4, 2, 17, 1, in, out, false, {}});
  EXPECT_EQ(hd.token_index, 17);
  EXPECT_EQ(hd.in_digest, in);
  EXPECT_EQ(hd.out_digest, out);
  EXPECT_FALSE(hd.has_receipt);
  const HopReceipt rc{4, 1, 17, 1, out, mac};
  HopDigest with = RoundTrip(HopDigest{4, 2, 17, 1, in, out, true, rc});
  ASSERT_TRUE(with.has_receipt);
  EXPECT_EQ(with.receipt.digest, out);
  EXPECT_EQ(with.receipt.mac, mac);
  EXPECT_EQ(with.receipt.stage, 1);
  HopReceipt back = RoundTrip(rc);
  EXPECT_EQ(back.mac, mac);
  EXPECT_EQ(back.token_index, 17);
  AuditRequest aq = RoundTrip(AuditRequest{4, 0, 18});
  EXPECT_EQ(aq.to, 18);
  AuditData ad = RoundTrip(AuditData{4, 2, 0, {1.0f, -0.0f, 3.5f, 4.0f}}, 2);
  ASSERT_EQ(ad.values.size(), 4u);
  EXPECT_TRUE(std::signbit(ad.values[1]));
  Activation act = MakeActivation(3, 16);
  Activation act2 = RoundTrip(act, 16);
  ASSERT_EQ(act2.values.size(), act.values.size());
  EXPECT_EQ(0, std::memcmp(act2.values.data(), act.values.data(), 4 * act.values.size()));
  EXPECT_TRUE(std::signbit(act2.values[5]));
  EXPECT_EQ(RoundTrip(Token{1, 5, 403}).token_id, 403);
  EXPECT_EQ(RoundTrip(Done{1, FinishReason::kLength}).reason, FinishReason::kLength);
  EXPECT_EQ(RoundTrip(Heartbeat{42, "peer-1"}).device_id, "peer-1");
  EXPECT_EQ(RoundTrip(ErrorMsg{7, "stage 2 lost"}).message, "stage 2 lost");
  EXPECT_EQ(RoundTrip(Bye{"peer-2"}).device_id, "peer-2");
  Join j = RoundTrip(Join{"room-1", "tcp://127.0.0.1:4444", h});
  EXPECT_EQ(j.hello.name, "laptop");
  EXPECT_EQ(j.address, "tcp://127.0.0.1:4444");
  Peers ps = RoundTrip(Peers{"room-1", {Peer{"tcp://127.0.0.1:4444", h, kKey}, Peer{"tcp://10.0.0.2:9", h, kKey}}});
  ASSERT_EQ(ps.peers.size(), 2u);
  EXPECT_EQ(ps.peers[1].address, "tcp://10.0.0.2:9");
  EXPECT_EQ(ps.peers[1].public_key, kKey);
}

TEST(Wire, RefusesPeersWithoutAWellFormedPublicKey) {
  Hello h{kProtocolVersion, kCapCompute, 1.0, 2, 3, "scalar", "id", "n"};
  ExpectRefused(Encode(Message(Peers{"r", {Peer{"tcp://127.0.0.1:1", h, ""}}})), "public_key");
  ExpectRefused(Encode(Message(Peers{"r", {Peer{"tcp://127.0.0.1:1", h, std::string(kKey).substr(1) + " "}}})), "public_key");
  ExpectRefused(Encode(Message(Peers{"r", {Peer{"tcp://127.0.0.1:1", h, std::string(kKey) + "x"}}})), "exceeds the cap");
}

TEST(Wire, RefusesImpossibleCacheAndProgressFields) {
  Assignment a = MakeAssignment();
  a.keep = a.ctx + 1;
  ExpectRefused(Encode(Message(a)), "keep");
  ExpectRefused(Encode(Message(Progress{1, 1, 2000, 1000})), "bytes_done exceeds bytes_total");
  ExpectRefused(Encode(Message(StageStats{1, 1, 3, -1.0})), "compute_seconds");
  ExpectRefused(Encode(Message(Done{1, FinishReason::kStop, -4, 0})), "negative cached");
  ExpectRefused(Encode(Message(AuditRequest{1, 5, 5})), "is empty");
  ExpectRefused(Encode(Message(HopDigest{1, 1, 0, 0, {}, {}, false, {}})), "no rows");
  ExpectRefused(Encode(Message(HopReceipt{1, 1, 0, 0, {}, {}})), "no rows");
  ExpectRefused(Encode(Message(AuditData{1, 1, 0, {1.0f, 2.0f, 3.0f}})), "whole number of rows", 2);
}

// The audit's digests are BLAKE2b-256: a one-ulp flip changes them, and the receipt MAC
// depends on its key and on every field (another member cannot make one for a stage).
TEST(Wire, AuditDigestsAreBlake2bAndReceiptMacsNeedTheKey) {
  const std::vector<float> rows = {0.5f, -1.25f, 3.0f, 0.0f};
  std::vector<float> flipped = rows;
  flipped[2] = std::bit_cast<float>(std::bit_cast<uint32_t>(flipped[2]) ^ 1u);
  EXPECT_NE(RowsDigest(rows), RowsDigest(flipped));
  EXPECT_EQ(RowsDigest(rows), RowsDigest(std::vector<float>(rows)));
  std::array<uint8_t, 32> key{}, other{};
  other[0] = 1;
  HopReceipt r{7, 2, 40, 1, RowsDigest(rows), {}};
  const Digest mac = ReceiptMac(key, 99, r);
  EXPECT_NE(mac, ReceiptMac(other, 99, r));  // the wrong key
  EXPECT_NE(mac, ReceiptMac(key, 98, r));    // another model
  HopReceipt moved = r;
  moved.token_index = 41;
  EXPECT_NE(mac, ReceiptMac(key, 99, moved));
  moved = r;
  moved.digest = RowsDigest(flipped);
  EXPECT_NE(mac, ReceiptMac(key, 99, moved));
}

// XXH64 (the audit's old digest, seed "AUDT") is not a cryptographic hash: with the
// accumulator of one lane known, the 8 bytes of the next stripe's lane that undo a change
// can be solved for. Forge a 64-float row that differs from an honest one but has its XXH64,
// and show the BLAKE2b digest tells them apart.
uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t InverseMod64(uint64_t a) {  // a odd: Newton's iteration doubles the good bits
  uint64_t x = a;
  for (int i = 0; i < 6; ++i) x *= 2 - a * x;
  return x;
}
std::optional<std::vector<float>> ForgeXxh64(const std::vector<float>& honest, uint64_t seed) {
  constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full;
  auto round = [&](uint64_t acc, uint64_t in) { return Rotl(acc + in * P2, 31) * P1; };
  const uint64_t init[4] = {seed + P1 + P2, seed + P2, seed, seed - P1};
  const size_t lanes = honest.size() / 2;  // 8-byte lanes; 4 per 32-byte stripe
  for (size_t stripe = 0; stripe + 1 < lanes / 4; ++stripe)
    for (int lane = 0; lane < 4; ++lane)
      for (int bit = 0; bit < 23; ++bit) {
        std::vector<float> f = honest;
        auto lane_of = [&](size_t st) {
          uint64_t v;
          std::memcpy(&v, &f[(st * 4 + static_cast<size_t>(lane)) * 2], 8);
          return v;
        };
        uint64_t acc = init[lane];
        for (size_t st = 0; st < stripe; ++st) acc = round(acc, lane_of(st));
        const uint64_t target = round(round(acc, lane_of(stripe)), lane_of(stripe + 1));
        f[(stripe * 4 + static_cast<size_t>(lane)) * 2] =
            std::bit_cast<float>(std::bit_cast<uint32_t>(f[(stripe * 4 + static_cast<size_t>(lane)) * 2]) ^ (1u << bit));
        const uint64_t changed = round(acc, lane_of(stripe));
        const uint64_t fix = (Rotl(target * InverseMod64(P1), 33) - changed) * InverseMod64(P2);
        std::memcpy(&f[((stripe + 1) * 4 + static_cast<size_t>(lane)) * 2], &fix, 8);
        const size_t at = ((stripe + 1) * 4 + static_cast<size_t>(lane)) * 2;
        if (std::isfinite(f[at]) && std::isfinite(f[at + 1])) return f;
      }
  return std::nullopt;
}

TEST(Wire, ARowForgedToCollideUnderXxh64HasAnotherBlake2bDigest) {
  std::vector<float> honest(64);
  for (size_t i = 0; i < honest.size(); ++i) honest[i] = 0.01f * static_cast<float>(i) - 0.3f;
  auto forged = ForgeXxh64(honest, 0x41554454u /* the old audit seed, "AUDT" */);
  ASSERT_TRUE(forged.has_value()) << "no finite forgery found";
  EXPECT_NE(*forged, honest);
  for (float v : *forged) EXPECT_TRUE(std::isfinite(v));
  // The forgery works against the old digest...
  EXPECT_EQ(XXH64(forged->data(), forged->size() * 4, 0x41554454u), XXH64(honest.data(), honest.size() * 4, 0x41554454u));
  // ...and not against the one the audit uses now.
  EXPECT_NE(RowsDigest(*forged), RowsDigest(honest));
}

TEST(Wire, RefusesAddressesThatAreNotTcpHostPort) {
  Hello h{kProtocolVersion, kCapCompute, 1.0, 2, 3, "scalar", "id", "n"};
  for (const char* a : {"ipc:///tmp/x", "tcp://", "tcp://host", "tcp://host:0", "tcp://host:70000", "tcp://ho st:1",
                        "tcp://host:1/x", "tcp://:5"}) {
    SCOPED_TRACE(a);
    ExpectRefused(Encode(Message(Join{"r", a, h})), "is not tcp://host:port");
  }
}

TEST(Wire, TheHeaderIsLittleEndianAsDocumented) {
  Activation a = MakeActivation(1, 4);
  auto b = Encode(Message(a));
  ASSERT_EQ(b.size(), 24u + 16u);
  EXPECT_EQ(b[0], 0xe9);  // -23 as i32 little-endian
  EXPECT_EQ(b[3], 0xff);
  EXPECT_EQ(b[4], 3);     // seq
  EXPECT_EQ(b[8], 17);    // token_index
  EXPECT_EQ(b[12], 2);    // next
  EXPECT_EQ(b[16], a.act_hash & 0xff);
}

TEST(Wire, RefusesAOneUlpFlipDeepInAnActivation) {
  Activation a = MakeActivation(4, 64);
  auto bytes = Encode(Message(a));
  const size_t deep = 24 + 4 * 200;
  bytes[deep] ^= 1;  // lowest mantissa bit of value 200: one ulp
  ExpectRefused(bytes, "act_hash mismatch", 64);
}

TEST(Wire, RefusesMinusZeroFlippedToPlusZero) {
  Activation a = MakeActivation(1, 16);
  auto bytes = Encode(Message(a));
  ASSERT_EQ(bytes[24 + 4 * 5 + 3], 0x80);
  bytes[24 + 4 * 5 + 3] = 0x00;  // -0.0f -> +0.0f: equal as numbers, not as bits
  ExpectRefused(bytes, "act_hash mismatch", 16);
}

TEST(Wire, RefusesNonFiniteActivations) {
  Activation a = MakeActivation(1, 8);
  a.values[3] = NAN;
  a.act_hash = ActHash(a.values);
  ExpectRefused(Encode(Message(a)), "non-finite value at index 3", 8);
}

TEST(Wire, RefusesTruncatedFramesAndLengthsLargerThanTheFrame) {
  auto bytes = Encode(Message(MakeAssignment()));
  for (size_t cut : {size_t{0}, size_t{2}, size_t{4}, size_t{10}, bytes.size() - 1}) {
    std::vector<uint8_t> t(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    Status st = DecodeStatus(t);
    EXPECT_FALSE(st.ok()) << cut;
    EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  }
  // The model_id length field claims more bytes than the frame holds.
  auto big = bytes;
  big[8] = 0x01;
  big[9] = 0x01;  // model_id (at byte 8, after the tag and turn) claims 257 bytes
  ExpectRefused(big, "truncated frame: model_id needs 257 bytes");
  big[9] = 0xff;  // 65535: over the cap, refused before any allocation
  ExpectRefused(big, "exceeds the cap");
  // An activation whose payload is not whole rows, and trailing bytes after a token.
  auto act = Encode(Message(MakeActivation(2, 8)));
  act.resize(act.size() - 4);
  ExpectRefused(act, "not a whole number of rows", 8);
  auto tok = Encode(Message(Token{1, 2, 3}));
  tok.push_back(0);
  ExpectRefused(tok, "trailing bytes");
  ExpectRefused({0x01, 0x02, 0x03, 0x04}, "unknown tag");
}

TEST(Wire, RefusesAPlanWithAGapAndACraftedRepoId) {
  Assignment gap = MakeAssignment();
  gap.stages[1].first = 11;
  ExpectRefused(Encode(Message(gap)), "gap or overlap at stage 1");
  Assignment start = MakeAssignment();
  start.stages[0].first = 1;
  ExpectRefused(Encode(Message(start)), "gap or overlap at stage 0");
  for (const char* id : {"../x", "a/b/c", "a/b?x=1", "a%2Fb", "/b/../etc", "a/", "/", "owner/na\nme", ""}) {
    Assignment crafted = MakeAssignment();
    crafted.model_id = id;
    SCOPED_TRACE(id);
    ExpectRefused(Encode(Message(crafted)), "model_id", 0);
  }
  Assignment stage = MakeAssignment();
  stage.your_stage = 3;
  ExpectRefused(Encode(Message(stage)), "your_stage 3");
}

TEST(Wire, ModelHashSeparatesModelsRevisionsAndIndexes) {
  const uint32_t base = ModelHash("a/b", "r1", "idx");
  EXPECT_NE(base, ModelHash("a/c", "r1", "idx"));
  EXPECT_NE(base, ModelHash("a/b", "r2", "idx"));
  EXPECT_NE(base, ModelHash("a/b", "r1", "idy"));
  EXPECT_NE(ModelHash("ab", "c", ""), ModelHash("a", "bc", ""));
  EXPECT_EQ(base, ModelHash("a/b", "r1", "idx"));
}

// Seeded random mutations of valid frames: the decoder must return (ok or an error), never
// crash or read out of bounds (this test also runs under ASan+UBSan).
TEST(Wire, MutatedFramesNeverCrashTheDecoder) {
  std::vector<std::vector<uint8_t>> seeds = {
      Encode(Message(HopReceipt{1, 1, 2, 1, {}, {}})),
      Encode(Message(MakeAssignment())), Encode(Message(MakeActivation(2, 8))),
      Encode(Message(Hello{kProtocolVersion, 1, 1.0, 2, 3, "scalar", "id", "n"})), Encode(Message(ErrorMsg{1, "x"})),
      Encode(Message(Done{1, FinishReason::kStop})), Encode(Message(Progress{1, 1, 2, 3})),
      Encode(Message(StageStats{1, 1, 2, 0.5})), Encode(Message(HopDigest{1, 1, 2, 1, {}, {}, true, HopReceipt{1, 0, 2, 1, {}, {}}})),
      Encode(Message(AuditRequest{1, 0, 4})), Encode(Message(AuditData{1, 1, 0, {1.0f, 2.0f}})),
      Encode(Message(Peers{"r", {Peer{"tcp://127.0.0.1:4444", Hello{kProtocolVersion, 1, 1.0, 2, 3, "s", "i", "n"}, kKey}}}))};
  std::mt19937_64 rng(1234);
  int accepted = 0;
  for (int iter = 0; iter < 100000; ++iter) {
    auto f = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 3) {
        case 0: if (!f.empty()) f[rng() % f.size()] = static_cast<uint8_t>(rng()); break;
        case 1: f.resize(rng() % (f.size() + 1)); break;
        case 2: f.insert(f.begin() + static_cast<std::ptrdiff_t>(rng() % (f.size() + 1)), static_cast<uint8_t>(rng())); break;
      }
    }
    if (Decode(f, (iter & 1) ? 8 : 0).ok()) ++accepted;
  }
  EXPECT_LT(accepted, 100000);
}

}  // namespace
}  // namespace daisy::wire
