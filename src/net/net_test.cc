#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "daisy/net.h"

namespace daisy::net {
namespace {

wire::Hello HelloFor(const std::string& id) {
  return wire::Hello{wire::kProtocolVersion, wire::kCapCompute, 100.0, 42, 1u << 30, "scalar", id, "dev-" + id};
}

// Receives until a frame decodes to T or the deadline passes.
template <typename T>
std::optional<T> Await(Endpoint& ep, int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    auto f = ep.Receive(50);
    if (!f.ok() || !f->has_value()) continue;
    auto m = wire::Decode(**f);
    if (m.ok() && std::holds_alternative<T>(*m)) return std::get<T>(*m);
  }
  return std::nullopt;
}

TEST(JoinAddress, AcceptsHostPortAndRefusesTheRest) {
  EXPECT_EQ(*JoinAddress("127.0.0.1:8788"), "tcp://127.0.0.1:8788");
  EXPECT_EQ(*JoinAddress("my-laptop.local:1"), "tcp://my-laptop.local:1");
  for (const char* bad : {"8788", ":8788", "host:", "host:0", "host:99999", "ho st:1", "tcp://h:1", "h:1/x"})
    EXPECT_FALSE(JoinAddress(bad).ok()) << bad;
}

TEST(Endpoint, FramesTravelDirectlyBetweenTwoEndpoints) {
  auto a = Endpoint::Bind("127.0.0.1", 0);
  auto b = Endpoint::Bind("127.0.0.1", 0);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Send((*b)->address(), wire::Message(wire::Token{1, 2, 3})).ok());
  auto t = Await<wire::Token>(**b, 2000);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->token_id, 3);
}

TEST(Endpoint, SendingToNobodyFailsQuicklyInsteadOfHanging) {
  auto a = Endpoint::Bind("127.0.0.1", 0);
  ASSERT_TRUE(a.ok());
  const auto start = std::chrono::steady_clock::now();
  Status st = (*a)->Send("tcp://127.0.0.1:1", wire::Message(wire::Bye{"x"}), 300);
  EXPECT_EQ(st.code(), ErrorCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST(Endpoint, OversizedFramesAreDroppedBeforeAllocation) {
  auto a = Endpoint::Bind("127.0.0.1", 0);
  auto b = Endpoint::Bind("127.0.0.1", 0);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<uint8_t> huge(wire::kMaxFrameBytes + 1, 0);
  (void)(*a)->Send((*b)->address(), huge, 1000);
  // The oversized frame kills that connection; a fresh sender still gets through, and
  // nothing over the cap ever comes out of the inbox.
  auto c = Endpoint::Bind("127.0.0.1", 0);
  ASSERT_TRUE((*c)->Send((*b)->address(), wire::Message(wire::Token{1, 1, 7})).ok());
  bool got_token = false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < end) {
    auto f = (*b)->Receive(50);
    ASSERT_TRUE(f.ok());
    if (!f->has_value()) continue;
    ASSERT_LE((*f)->size(), wire::kMaxFrameBytes) << "an oversized frame reached the inbox";
    auto m = wire::Decode(**f);
    if (m.ok() && std::holds_alternative<wire::Token>(*m)) got_token = std::get<wire::Token>(*m).token_id == 7;
  }
  EXPECT_TRUE(got_token);
}

TEST(Rendezvous, ApprovedMembersOfARoomLearnEachOtherAndTheDeadAreDropped) {
  RendezvousOptions o;
  o.port = 0;
  o.auto_approve = true;
  o.dead_after_s = 1.0;
  auto rv = Rendezvous::Start(o);
  ASSERT_TRUE(rv.ok()) << rv.status().message();
  auto a = Endpoint::Bind("127.0.0.1", 0);
  auto b = Endpoint::Bind("127.0.0.1", 0);
  auto other = Endpoint::Bind("127.0.0.1", 0);
  ASSERT_TRUE((*a)->Send((*rv)->address(), wire::Message(wire::Join{"r1", (*a)->address(), HelloFor("aaaa")})).ok());
  ASSERT_TRUE((*b)->Send((*rv)->address(), wire::Message(wire::Join{"r1", (*b)->address(), HelloFor("bbbb")})).ok());
  ASSERT_TRUE((*other)->Send((*rv)->address(), wire::Message(wire::Join{"r2", (*other)->address(), HelloFor("cccc")})).ok());
  std::optional<wire::Peers> peers;
  for (int i = 0; i < 5 && (!peers || peers->peers.size() < 2); ++i) peers = Await<wire::Peers>(**a, 1000);
  ASSERT_TRUE(peers.has_value());
  ASSERT_EQ(peers->peers.size(), 2u);  // room r2 is not visible
  EXPECT_EQ(peers->room, "r1");
  // b stops sending heartbeats; a keeps going and learns that b is gone.
  std::optional<wire::Peers> after;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < end) {
    (void)(*a)->Send((*rv)->address(), wire::Message(wire::Heartbeat{0, "aaaa"}));
    auto p = Await<wire::Peers>(**a, 300);
    if (p && p->peers.size() == 1) {
      after = p;
      break;
    }
  }
  ASSERT_TRUE(after.has_value()) << "b was never dropped";
  EXPECT_EQ(after->peers[0].hello.device_id, "aaaa");
}

TEST(Rendezvous, AnUnapprovedDeviceReceivesNothingUntilTheHostApproves) {
  RendezvousOptions o;
  o.port = 0;
  o.auto_approve = false;
  auto rv = Rendezvous::Start(o);
  ASSERT_TRUE(rv.ok());
  auto a = Endpoint::Bind("127.0.0.1", 0);
  ASSERT_TRUE((*a)->Send((*rv)->address(), wire::Message(wire::Join{"r", (*a)->address(), HelloFor("abcd1234")})).ok());
  EXPECT_FALSE(Await<wire::Peers>(**a, 700).has_value());
  EXPECT_FALSE((*rv)->Approve("zzz").ok());
  ASSERT_TRUE((*rv)->Approve("abcd").ok());
  auto p = Await<wire::Peers>(**a, 2000);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->peers.size(), 1u);
}

}  // namespace
}  // namespace daisy::net
