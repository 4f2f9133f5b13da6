// serve's browser-tab link in one process, over real sockets on 127.0.0.1: a rendezvous with
// its relay and link server behind a PortMux (serve's one port, with an HTTP server beside
// them), the native test client (tests/support/link_client.h) as the tab, and a native
// RoomMember as the rest of the ring. Approval, the handshake's refusals, a tab and a member
// exchanging boxed envelopes through the relay (which sees only ciphertext), liveness.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "daisy/net.h"
#include "daisy/ring.h"
#include "link_client.h"
#include "relay_fixture.h"

namespace daisy {
namespace {

using testlink::LinkClient;
using testlink::LinkClientOptions;
using testrelay::ActivationOf;
using testrelay::Payload;

constexpr const char* kRoom = "tabs";

wire::Join TabJoin(const std::string& id) {
  wire::Join j;
  j.room = kRoom;
  j.address = std::string(wire::kRelayScheme) + id;
  j.hello.capabilities = wire::kCapRelayed | wire::kCapCompute;
  j.hello.device_id = id;
  j.hello.name = "tab";
  j.hello.backend = "wasm";
  j.hello.free_memory = 1u << 30;
  return j;
}

class LinkTest : public testrelay::RelayFixture {
 protected:
  void SetUp() override {
    RelayFixture::SetUp();
    http_.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content("the UI", "text/plain"); });
    http_port_ = http_.bind_to_any_port("127.0.0.1");
    http_thread_ = std::thread([this] { http_.listen_after_bind(); });
    for (int i = 0; i < 400 && !http_.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  void TearDown() override {
    RelayFixture::TearDown();
    http_.stop();
    http_thread_.join();
  }
  // The rendezvous (links on, nothing approved unless asked) and the mux in front of it.
  void Start(const std::function<void(net::RendezvousOptions&)>& tweak = {}) {
    StartRendezvous(tweak);
    ASSERT_GT(rv_->link_port(), 0);
    StartMux(rv_->relay_port(), rv_->link_port(), http_port_);
  }
  int port() const { return mux_->port(); }
  // A tab's key pair, approved for kRoom as the host would (a request, then Approve).
  net::KeyPair ApprovedTab() {
    net::KeyPair k = net::NewKeyPair();
    auto asked = rv_->RequestJoin({kRoom, k.public_key, "tab", "127.0.0.1"});
    EXPECT_TRUE(asked.ok() && !asked->approved);
    EXPECT_TRUE(rv_->Approve(net::Fingerprint(k.public_key)).ok());
    return k;
  }
  std::unique_ptr<LinkClient> Link(const net::KeyPair& k, LinkClientOptions o = {}) {
    auto c = LinkClient::Connect("127.0.0.1", port(), k, rv_->public_key(), std::move(o));
    EXPECT_TRUE(c.ok()) << c.status().message();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // Joins kRoom over `link` and waits until its peer list holds `n` members, itself among them.
  void JoinAndAwait(LinkClient& link, size_t n) {
    ASSERT_TRUE(link.Send(wire::Message(TabJoin(link.id()))).ok());
    ASSERT_TRUE(AwaitPeers(link, n, link.id())) << "the tab never got a peer list of " << n << " holding itself";
  }
  static bool AwaitPeers(LinkClient& link, size_t n, const std::string& holding) {
    const auto end = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < end) {
      auto in = link.Receive(100);
      if (!in.ok()) return false;
      if (!in->has_value()) continue;
      const auto* peers = std::get_if<wire::Peers>(&**in);
      if (!peers || peers->peers.size() != n) continue;
      for (const auto& p : peers->peers)
        if (p.hello.device_id == holding && p.address == "relay://" + holding) return true;
    }
    return false;
  }
  RoomMember& AddMember() {
    RoomMember::Options o = MemberOptions("link-member");
    o.name = "member";
    o.log_name = "member";
    o.room = kRoom;
    return Add(o);
  }
  // Receives on `m` until its list has `n` members (bounded).
  static bool AwaitMemberSees(RoomMember& m, size_t n) {
    const auto end = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < end) {
      (void)m.Receive(20, 0, [](const std::string&) { return false; });
      if (m.Peers().size() == n) return true;
    }
    return false;
  }
  // Reads `link` until serve closes it (bounded); the close code, 0 if it never came.
  static int AwaitClose(LinkClient& link, int seconds = 15) {
    const auto end = Clock::now() + std::chrono::seconds(seconds);
    while (Clock::now() < end)
      if (!link.Receive(100).ok()) return link.close_code();
    return 0;
  }
  bool IsMember(const std::string& id) const {
    for (const auto& m : rv_->Members())
      if (KeyIdOf(m) == id) return true;
    return false;
  }
  static std::string KeyIdOf(const net::MemberInfo& m) { return net::KeyId(m.public_key); }
  // Waits (bounded) until `id` is no member.
  bool AwaitGone(const std::string& id, int seconds = 15) const {
    const auto end = Clock::now() + std::chrono::seconds(seconds);
    while (Clock::now() < end) {
      if (!IsMember(id)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  httplib::Server http_;
  int http_port_ = 0;
  std::thread http_thread_;
};

// A key nobody approved proves itself and is told 4003; once the host approves it (as for a
// native node), the same key's handshake completes.
TEST_F(LinkTest, AnUnapprovedKeyIsRefusedUntilTheHostApprovesIt) {
  Start();
  const net::KeyPair k = net::NewKeyPair();
  auto link = LinkClient::Open("127.0.0.1", port());
  ASSERT_TRUE(link.ok()) << link.status().message();
  const Status st = (*link)->Handshake(k, rv_->public_key());
  EXPECT_FALSE(st.ok());
  EXPECT_EQ((*link)->close_code(), net::LinkCloseCode(net::LinkClose::kNotApproved)) << st.message();
  EXPECT_NE((*link)->close_reason().find(net::Fingerprint(k.public_key)), std::string::npos) << (*link)->close_reason();

  auto asked = rv_->RequestJoin({kRoom, k.public_key, "tab", "127.0.0.1"});
  ASSERT_TRUE(asked.ok());
  EXPECT_FALSE(asked->approved);
  ASSERT_TRUE(rv_->Approve(net::Fingerprint(k.public_key)).ok());
  auto again = Link(k);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(rv_->links(), 1);
}

// The tab joins as relay://ID and sees itself in its room; a native member and the tab
// exchange activations both ways through the relay, with the exact bits, and the relay's
// view of both holds no 16 bytes of either payload.
TEST_F(LinkTest, ATabAndANativeMemberExchangeBoxedEnvelopesThroughTheRelay) {
  Start();
  auto link = Link(ApprovedTab());
  ASSERT_NE(link, nullptr);
  JoinAndAwait(*link, 1);
  RoomMember& member = AddMember();
  ASSERT_TRUE(AwaitMemberSees(member, 2));
  ASSERT_TRUE(AwaitPeers(*link, 2, link->id()));

  const std::vector<float> down = Payload(1.5f), up = Payload(-7.25f);
  ASSERT_TRUE(member.Send("relay://" + link->id(), wire::Message(ActivationOf(down)), 3000).ok());
  std::optional<wire::Message> got;
  const auto end = Clock::now() + std::chrono::seconds(10);
  while (!got && Clock::now() < end) {
    auto in = link->Receive(100);
    ASSERT_TRUE(in.ok()) << in.status().message();
    if (in->has_value() && std::holds_alternative<wire::Relay>(**in)) got = std::move(*in);
  }
  ASSERT_TRUE(got.has_value()) << "the tab got no envelope from the member";
  const auto& env = std::get<wire::Relay>(*got);
  EXPECT_EQ(env.from, member.id());
  auto opened = link->OpenEnvelope(member.keys().public_key, env);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  const auto* act = std::get_if<wire::Activation>(&*opened);
  ASSERT_NE(act, nullptr);
  ASSERT_EQ(act->values.size(), down.size());
  EXPECT_EQ(std::memcmp(act->values.data(), down.data(), down.size() * 4), 0);

  ASSERT_TRUE(link->SendEnvelope(member.keys().public_key, wire::Message(ActivationOf(up))).ok());
  // What the relay saw of both envelopes (it sees the one up before the member opens it).
  const auto seen_by = Clock::now() + std::chrono::seconds(10);
  while (Seen().size() < 2 && Clock::now() < seen_by) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto seen = Seen();
  ASSERT_GE(seen.size(), 2u) << "the relay forwarded nothing: the frames did not go through it";
  for (const auto* payload : {&down, &up}) testrelay::ExpectInNoFrame(seen, *payload, /*stride=*/4);
  auto back = Next(member, 5000);
  ASSERT_TRUE(back && back->message.ok()) << "the member got nothing from the tab";
  const auto peers = member.Peers();
  auto tab_key =
      std::find_if(peers.begin(), peers.end(), [&](const wire::Peer& p) { return p.hello.device_id == link->id(); });
  ASSERT_NE(tab_key, peers.end());
  EXPECT_EQ(back->sender, tab_key->public_key) << "the tab's key, not the relay's";
  const auto* act_back = std::get_if<wire::Activation>(&*back->message);
  ASSERT_NE(act_back, nullptr);
  ASSERT_EQ(act_back->values.size(), up.size());
  EXPECT_EQ(std::memcmp(act_back->values.data(), up.data(), up.size() * 4), 0);
}

// The handshake's refusals: another challenge than serve's, a box with one byte flipped.
TEST_F(LinkTest, AWrongChallengeOrABoxThatDoesNotOpenEndsTheHandshake) {
  Start();
  const net::KeyPair k = ApprovedTab();
  for (int fault = 0; fault < 2; ++fault) {
    LinkClientOptions o;
    o.wrong_challenge = fault == 0;
    o.flip_box_byte = fault == 1;
    auto link = LinkClient::Open("127.0.0.1", port(), o);
    ASSERT_TRUE(link.ok()) << link.status().message();
    EXPECT_FALSE((*link)->Handshake(k, rv_->public_key()).ok());
    EXPECT_EQ((*link)->close_code(), net::LinkCloseCode(net::LinkClose::kBadHandshake))
        << (fault == 0 ? "wrong challenge: " : "flipped box: ") << (*link)->close_reason();
  }
  EXPECT_TRUE(Link(k) != nullptr) << "the key itself is fine";
}

// After the handshake: a tampered envelope and a replayed one are 4002, a text message 1003;
// before it, a message larger than a handshake 1009.
TEST_F(LinkTest, ATamperedOrReplayedEnvelopeOrATextMessageClosesTheLink) {
  Start();
  const net::KeyPair k = ApprovedTab();
  {
    auto link = Link(k);
    ASSERT_NE(link, nullptr);
    auto bytes = link->SealForServe(wire::Encode(wire::Message(wire::Heartbeat{1, link->id()})));
    ASSERT_TRUE(bytes.ok());
    (*bytes)[bytes->size() - 3] ^= 0x01;  // inside the box
    ASSERT_TRUE(link->SendRaw(*bytes).ok());
    EXPECT_EQ(AwaitClose(*link), net::LinkCloseCode(net::LinkClose::kRefusedEnvelope))
        << "tampered: " << link->close_reason();
    // The reason is PeerBoxes's own: which refusal it was.
    EXPECT_NE(link->close_reason().find("does not open"), std::string::npos) << link->close_reason();
    EXPECT_EQ(link->close_reason().find("replay"), std::string::npos) << link->close_reason();
  }
  {
    auto link = Link(k);
    ASSERT_NE(link, nullptr);
    ASSERT_TRUE(link->Send(wire::Message(wire::Heartbeat{1, link->id()})).ok());
    const std::vector<uint8_t> again = link->last_sent();
    ASSERT_TRUE(link->SendRaw(again).ok());
    EXPECT_EQ(AwaitClose(*link), net::LinkCloseCode(net::LinkClose::kRefusedEnvelope))
        << "replayed: " << link->close_reason();
    EXPECT_NE(link->close_reason().find("already opened: a replay"), std::string::npos) << link->close_reason();
  }
  {
    // Before the handshake a link is anyone's: a message longer than a handshake is refused.
    auto link = LinkClient::Open("127.0.0.1", port());
    ASSERT_TRUE(link.ok()) << link.status().message();
    auto hello = (*link)->ReceiveRaw(5000);
    ASSERT_TRUE(hello.ok() && hello->has_value());
    EXPECT_EQ((*hello)->size(), 77u) << "DCL1, version, key, challenge";
    ASSERT_TRUE((*link)->SendRaw(std::vector<uint8_t>(2000, 0)).ok());
    Status st;
    for (int i = 0; i < 100 && st.ok(); ++i) st = (*link)->ReceiveRaw(100).status();
    EXPECT_EQ((*link)->close_code(), net::LinkCloseCode(net::LinkClose::kTooBig)) << st.message();
  }
  {
    auto link = Link(k);
    ASSERT_NE(link, nullptr);
    const std::string text = "hello";
    ASSERT_TRUE(link->SendRaw(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), true).ok());
    EXPECT_EQ(AwaitClose(*link), net::LinkCloseCode(net::LinkClose::kUnsupportedData))
        << "text: " << link->close_reason();
  }
}

// GET /api/link without an upgrade is answered 426 by the link server; every other request
// on the same port still reaches the HTTP server, /api/linkage included.
TEST_F(LinkTest, PlainHttpStillReachesTheHttpServerAndAPlainGetOfTheLinkIs426) {
  Start();
  httplib::Client http("127.0.0.1", port());
  auto plain = http.Get("/api/link");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 426);
  EXPECT_NE(plain->body.find("WebSocket"), std::string::npos) << plain->body;
  auto ui = http.Get("/");
  ASSERT_TRUE(ui);
  EXPECT_EQ(ui->status, 200);
  EXPECT_EQ(ui->body, "the UI");
  auto other = http.Get("/api/linkage");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404) << "the HTTP server's answer, not the link server's";
  LinkClientOptions o;
  o.path = "/api/link?v=1";  // a query is still the link
  auto link = LinkClient::Open("127.0.0.1", port(), o);
  ASSERT_TRUE(link.ok()) << link.status().message();
}

// Liveness is the link: while it is open the member needs no heartbeat; a tab that stops
// answering pings is closed (4008) and leaves the room; a link that just closes leaves at once.
TEST_F(LinkTest, TheLinkIsTheMembersHeartbeatAndItsEndDropsTheMember) {
  Start([](net::RendezvousOptions& o) {
    o.dead_after_s = 1.0;
    o.link_ping_s = 0.2;
    o.link_timeout_s = 1.5;
  });
  RoomMember& member = AddMember();
  auto link = Link(ApprovedTab());
  ASSERT_NE(link, nullptr);
  JoinAndAwait(*link, 2);
  ASSERT_TRUE(AwaitMemberSees(member, 2));
  // Three dead-member periods without a heartbeat: still in the room (the pings are answered).
  const auto stay_until = Clock::now() + std::chrono::seconds(3);
  while (Clock::now() < stay_until) ASSERT_TRUE(link->Receive(100).ok());
  EXPECT_TRUE(IsMember(link->id())) << "an open link must count as the member's heartbeat";
  EXPECT_GT(link->pings_seen(), 0);

  link->set_answer_pings(false);
  EXPECT_EQ(AwaitClose(*link), net::LinkCloseCode(net::LinkClose::kTooSlow)) << link->close_reason();
  EXPECT_TRUE(AwaitGone(link->id()));
  EXPECT_TRUE(AwaitMemberSees(member, 1)) << "the member's list still holds the silent tab";

  // A link whose socket just closes: the member leaves without waiting for any timeout.
  const net::KeyPair k2 = ApprovedTab();
  auto second = Link(k2);
  ASSERT_NE(second, nullptr);
  JoinAndAwait(*second, 2);
  const std::string id2 = second->id();
  second.reset();
  EXPECT_TRUE(AwaitGone(id2));
  EXPECT_TRUE(AwaitMemberSees(member, 1));
}

// A newer link of the same key replaces the older (4004) and the member stays; links are
// bounded, and one over the bound is told why (1013).
TEST_F(LinkTest, ANewerLinkReplacesTheOlderAndLinksAreBounded) {
  Start([](net::RendezvousOptions& o) { o.max_links = 2; });
  const net::KeyPair k = ApprovedTab();
  auto first = Link(k);
  ASSERT_NE(first, nullptr);
  JoinAndAwait(*first, 1);
  auto second = Link(k);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(AwaitClose(*first), net::LinkCloseCode(net::LinkClose::kReplaced)) << first->close_reason();
  ASSERT_TRUE(AwaitPeers(*second, 1, second->id())) << "the newer link gets the room's list again";
  EXPECT_TRUE(IsMember(second->id())) << "replacing a link is not leaving";

  const auto end = Clock::now() + std::chrono::seconds(5);
  while (rv_->links() != 1 && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(rv_->links(), 1) << "the replaced link is still counted";
  auto other = Link(ApprovedTab());
  ASSERT_NE(other, nullptr);
  auto third = LinkClient::Open("127.0.0.1", port());
  ASSERT_TRUE(third.ok()) << third.status().message();
  EXPECT_FALSE((*third)->Handshake(ApprovedTab(), rv_->public_key()).ok());
  EXPECT_EQ((*third)->close_code(), net::LinkCloseCode(net::LinkClose::kTryLater));
  EXPECT_NE((*third)->close_reason().find("2 links"), std::string::npos) << (*third)->close_reason();
}

}  // namespace
}  // namespace daisy
