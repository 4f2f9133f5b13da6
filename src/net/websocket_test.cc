// The link server's RFC 6455 pieces against published vectors: SHA-1 (FIPS 180-2's
// examples), base64 (RFC 4648, 10), the accept key and the frames of RFC 6455 (1.3, 5.7),
// and what a server must refuse.
#include "websocket.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "daisy/net.h"

namespace daisy::net::ws {
namespace {

std::string Hex(std::span<const uint8_t> b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (uint8_t v : b) {
    s += kDigits[v >> 4];
    s += kDigits[v & 15];
  }
  return s;
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

void Read(FrameReader& r, std::vector<Event>* events) {
  while (auto e = r.Next()) events->push_back(std::move(*e));
}

std::string Text(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

TEST(WebSocket, Sha1MatchesThePublishedExamples) {
  EXPECT_EQ(Hex(Sha1(Bytes(""))), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  EXPECT_EQ(Hex(Sha1(Bytes("abc"))), "a9993e364706816aba3e25717850c26c9cd0d89d");
  EXPECT_EQ(Hex(Sha1(Bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
  EXPECT_EQ(Hex(Sha1(Bytes(std::string(1000000, 'a')))), "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
  // 55, 56 and 64 bytes: the padding's edge cases (one block, two blocks).
  EXPECT_EQ(Hex(Sha1(Bytes(std::string(55, 'a')))), "c1c8bbdc22796e28c0e15163d20899b65621d65a");
  EXPECT_EQ(Hex(Sha1(Bytes(std::string(56, 'a')))), "c2db330f6083854c99d4b5bfb6e8f29f201be699");
  EXPECT_EQ(Hex(Sha1(Bytes(std::string(64, 'a')))), "0098ba824b5c16427bd7a1122a5a442a25ec644d");
}

TEST(WebSocket, Base64MatchesRfc4648AndRefusesWhatIsNotCanonical) {
  const std::pair<const char*, const char*> kVectors[] = {{"", ""},
                                                          {"f", "Zg=="},
                                                          {"fo", "Zm8="},
                                                          {"foo", "Zm9v"},
                                                          {"foob", "Zm9vYg=="},
                                                          {"fooba", "Zm9vYmE="},
                                                          {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, coded] : kVectors) {
    EXPECT_EQ(Base64(Bytes(plain)), coded);
    auto back = Base64Decode(coded);
    ASSERT_TRUE(back.has_value()) << coded;
    EXPECT_EQ(Text(*back), plain);
  }
  for (const char* bad : {"Zg=", "Zh==", "Zm9v!A==", "Zm 9v", "=Zm9"}) EXPECT_FALSE(Base64Decode(bad)) << bad;
}

TEST(WebSocket, TheAcceptKeyIsRfc6455s) {
  EXPECT_EQ(WebSocketAccept("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

TEST(WebSocket, ParsesTheRfcsUpgradeAndRefusesOthersWithAReason) {
  const std::string rfc =
      "GET /chat HTTP/1.1\r\nHost: server.example.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: http://example.com\r\n"
      "Sec-WebSocket-Protocol: chat, superchat\r\nSec-WebSocket-Version: 13\r\n\r\n";
  Parsed p = ParseUpgrade(rfc);
  ASSERT_TRUE(p.upgrade.has_value()) << p.refusal.reason;
  EXPECT_EQ(p.upgrade->target, "/chat");
  EXPECT_EQ(p.upgrade->accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
  EXPECT_EQ(p.upgrade->protocol, "") << "a subprotocol this server does not speak is not echoed";
  const std::string answer = SwitchingProtocols(*p.upgrade);
  EXPECT_EQ(answer.rfind("HTTP/1.1 101 Switching Protocols\r\n", 0), 0u);
  EXPECT_NE(answer.find("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"), std::string::npos);

  auto with = [&](const std::string& from, const std::string& to) {
    std::string r = rfc;
    r.replace(r.find(from), from.size(), to);
    return ParseUpgrade(r);
  };
  // Header names and tokens are case-insensitive; Connection may be a list.
  EXPECT_TRUE(with("Connection: Upgrade", "connection: keep-alive, UPGRADE").upgrade);
  EXPECT_EQ(with("chat, superchat", "chat, dcl1").upgrade->protocol, "dcl1");
  const Parsed plain = ParseUpgrade("GET /api/link HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_FALSE(plain.upgrade);
  EXPECT_EQ(plain.refusal.status, 426);
  EXPECT_NE(RefusalResponse(plain.refusal).find("426 Upgrade Required"), std::string::npos);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"Version: 13", "Version: 8"},
           {"dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZQ=="},  // 10 bytes, not 16
           {"Connection: Upgrade", "Connection: keep-alive"},
           {"GET /chat", "POST /chat"},
           {"HTTP/1.1\r\nHost", "HTTP/1.0\r\nHost"}}) {
    const Parsed bad = with(from, to);
    EXPECT_FALSE(bad.upgrade) << to;
    EXPECT_EQ(bad.refusal.status, 400) << to;
    EXPECT_FALSE(bad.refusal.reason.empty());
  }
}

// RFC 6455, 5.7.
TEST(WebSocket, ReadsTheRfcsExampleFrames) {
  {
    FrameReader r(1000);  // a masked "Hello", fed a byte at a time
    const std::vector<uint8_t> f = {0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58};
    std::vector<Event> ev;
    for (uint8_t b : f) {
      r.Feed(std::span(&b, 1));
      Read(r, &ev);
    }
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].kind, Event::Kind::kText);
    EXPECT_EQ(Text(ev[0].payload), "Hello");
  }
  {
    FrameReader r(1000, /*expect_masked=*/false);  // a fragmented unmasked "Hello" with a ping between
    std::vector<Event> ev;
    r.Feed(std::vector<uint8_t>{0x01, 0x03, 0x48, 0x65, 0x6c, 0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f});
    r.Feed(std::vector<uint8_t>{0x80, 0x02, 0x6c, 0x6f});
    Read(r, &ev);
    ASSERT_EQ(ev.size(), 2u);
    EXPECT_EQ(ev[0].kind, Event::Kind::kPing);
    EXPECT_EQ(Text(ev[0].payload), "Hello");
    EXPECT_EQ(ev[1].kind, Event::Kind::kText);
    EXPECT_EQ(Text(ev[1].payload), "Hello");
  }
  {
    FrameReader r(1000);  // a masked pong "Hello"
    std::vector<Event> ev;
    r.Feed(std::vector<uint8_t>{0x8a, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58});
    Read(r, &ev);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].kind, Event::Kind::kPong);
    EXPECT_EQ(Text(ev[0].payload), "Hello");
  }
  {
    FrameReader r(1 << 20, /*expect_masked=*/false);  // 256 and 65536 bytes: 16- and 64-bit lengths
    std::vector<uint8_t> f = {0x82, 0x7E, 0x01, 0x00};
    f.resize(4 + 256, 7);
    std::vector<uint8_t> g = {0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0};
    g.resize(10 + 65536, 9);
    r.Feed(f);
    r.Feed(g);
    std::vector<Event> ev;
    Read(r, &ev);
    ASSERT_EQ(ev.size(), 2u);
    EXPECT_EQ(ev[0].kind, Event::Kind::kBinary);
    EXPECT_EQ(ev[0].payload, std::vector<uint8_t>(256, 7));
    EXPECT_EQ(ev[1].payload, std::vector<uint8_t>(65536, 9));
    EXPECT_EQ(ServerFrame(Opcode::kBinary, ev[0].payload), f);
    EXPECT_EQ(ServerFrame(Opcode::kBinary, ev[1].payload), g);
  }
  EXPECT_EQ(ServerFrame(Opcode::kText, Bytes("Hello")),
            (std::vector<uint8_t>{0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f}));
}

TEST(WebSocket, ReadsCloseCodesAndReasons) {
  FrameReader r(1000, /*expect_masked=*/false);
  std::vector<uint8_t> f = {0x88, 0x00};
  const auto p = ClosePayload(net::LinkCloseCode(net::LinkClose::kNotApproved), "not approved");
  f.push_back(0x88);
  f.push_back(static_cast<uint8_t>(p.size()));
  f.insert(f.end(), p.begin(), p.end());
  r.Feed(f);
  std::vector<Event> ev;
  Read(r, &ev);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, Event::Kind::kClose);
  EXPECT_EQ(ev[0].code, 1005) << "no code given";
  EXPECT_EQ(ev[1].code, net::LinkCloseCode(net::LinkClose::kNotApproved));
  EXPECT_EQ(ev[1].reason, "not approved");
  // A reason is cut to fit a control frame, never inside a character.
  const std::string long_reason = std::string(122, 'x') + "\xc3\xa9" + "yz";
  const auto cut = ClosePayload(1000, long_reason);
  EXPECT_EQ(cut.size(), 2u + 122u);
}

// Each frame a server must refuse, with the code it closes with.
TEST(WebSocket, RefusesWhatAServerMustRefuse) {
  struct Case {
    const char* what;
    std::vector<uint8_t> bytes;
    uint16_t code;
    bool masked = true;
    size_t max = 100;
  };
  const std::vector<Case> cases = {
      {"unmasked client frame", {0x82, 0x01, 0x00}, 1002},
      {"masked server frame", {0x82, 0x81, 1, 2, 3, 4, 0}, 1002, false},
      {"reserved bit", {0xC2, 0x80, 1, 2, 3, 4}, 1002},
      {"unknown opcode", {0x83, 0x80, 1, 2, 3, 4}, 1002},
      {"continuation first", {0x80, 0x80, 1, 2, 3, 4}, 1002},
      {"message inside a message", {0x02, 0x80, 1, 2, 3, 4, 0x82, 0x80, 1, 2, 3, 4}, 1002},
      {"fragmented ping", {0x09, 0x80, 1, 2, 3, 4}, 1002},
      {"ping over 125 bytes", {0x89, 0xFE, 0x00, 0x7E}, 1002},
      {"length top bit", {0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0}, 1002},
      {"close with 1 byte", {0x88, 0x81, 1, 2, 3, 4, 5}, 1002},
      // Refused from the header: the 101 bytes are never waited for.
      {"message over the limit", {0x82, 0xE5, 1, 2, 3, 4}, 1009},
      {"fragments over the limit", {0x02, 0xB2, 1, 2, 3, 4}, 1009, true, 99},
  };
  for (const auto& c : cases) {
    FrameReader r(c.max, c.masked);
    std::vector<uint8_t> bytes = c.bytes;
    if (std::string(c.what) == "fragments over the limit") {
      bytes.resize(6 + 50, 0);
      for (uint8_t b : {0x80, 0xB2, 1, 2, 3, 4}) bytes.push_back(b);
    }
    r.Feed(bytes);
    std::vector<Event> ev;
    Read(r, &ev);
    ASSERT_FALSE(ev.empty()) << c.what;
    EXPECT_EQ(ev.back().kind, Event::Kind::kError) << c.what;
    EXPECT_EQ(ev.back().code, c.code) << c.what;
    EXPECT_FALSE(ev.back().reason.empty()) << c.what;
    r.Feed(std::vector<uint8_t>{0x82, 0x80, 1, 2, 3, 4});
    EXPECT_FALSE(r.Next().has_value()) << c.what << ": nothing is read after an error";
  }
}

}  // namespace
}  // namespace daisy::net::ws
