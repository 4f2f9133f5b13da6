// The relay in one process, over real sockets on 127.0.0.1: a rendezvous with its relay
// behind a PortMux (serve's one port), a member that listens and one that does not
// (RoomMember with no_listen). What the relay sees of a relayed activation must be only
// ciphertext; what it refuses (a forged sender, a replay, a stranger) never arrives.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "daisy/ring.h"
#include "relay_fixture.h"

namespace daisy {
namespace {

using testrelay::ActivationOf;
using testrelay::Payload;

class RelayTest : public testrelay::RelayFixture {
 protected:
  void SetUp() override {
    RelayFixture::SetUp();
    StartRendezvous([](net::RendezvousOptions& o) { o.auto_approve = true; });
    StartMux(rv_->relay_port());
  }
  RoomMember::Options MemberOptions(const std::string& role, bool no_listen) const {
    RoomMember::Options o = RelayFixture::MemberOptions(role);
    o.no_listen = no_listen;
    return o;
  }
  RoomMember& Add(const std::string& role, bool no_listen) { return RelayFixture::Add(MemberOptions(role, no_listen)); }
  // Receives on every member until each has a peer list naming `n` members (bounded).
  void AwaitRoomOf(size_t n) {
    const auto end = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < end) {
      bool all = true;
      for (auto& m : members_) {
        (void)m->Receive(20, 0, [](const std::string&) { return false; });
        all = all && m->Peers().size() == n;
      }
      if (all) return;
    }
    FAIL() << "the members never saw a room of " << n;
  }
};

// The relay's own view of a relayed activation, both ways, is ciphertext: no 16 bytes of
// the payload appear in any frame it forwarded, and both members receive the exact bits.
TEST_F(RelayTest, TheRelaySeesOnlyCiphertextAndBothEndsGetTheExactBits) {
  RoomMember& head = Add("relay-head", false);
  RoomMember& hidden = Add("relay-hidden", true);
  ASSERT_TRUE(hidden.relayed());
  EXPECT_EQ(hidden.address(), "relay://" + hidden.id());
  EXPECT_TRUE(hidden.hello().capabilities & wire::kCapRelayed);
  AwaitRoomOf(2);

  const std::vector<float> down = Payload(1.5f), up = Payload(-7.25f);
  ASSERT_TRUE(head.Send(hidden.address(), wire::Message(ActivationOf(down)), 3000).ok());
  auto got = Next(hidden, 5000);
  ASSERT_TRUE(got && got->message.ok()) << "the relayed member got nothing";
  EXPECT_EQ(got->sender, head.keys().public_key) << "the true sender, not the relay";
  auto* act = std::get_if<wire::Activation>(&*got->message);
  ASSERT_NE(act, nullptr);
  ASSERT_EQ(act->values.size(), down.size());
  EXPECT_EQ(std::memcmp(act->values.data(), down.data(), down.size() * 4), 0);

  ASSERT_TRUE(hidden.Send(head.address(), wire::Message(ActivationOf(up)), 3000).ok());
  auto back = Next(head, 5000);
  ASSERT_TRUE(back && back->message.ok()) << "the listening member got nothing back";
  EXPECT_EQ(back->sender, hidden.keys().public_key);
  auto* act_back = std::get_if<wire::Activation>(&*back->message);
  ASSERT_NE(act_back, nullptr);
  EXPECT_EQ(std::memcmp(act_back->values.data(), up.data(), up.size() * 4), 0);

  const auto seen = Seen();
  ASSERT_GE(seen.size(), 2u) << "the relay forwarded nothing: the frames did not go through it";
  EXPECT_GE(rv_->relayed_frames(), 2);
  for (const auto* payload : {&down, &up}) testrelay::ExpectInNoFrame(seen, *payload, /*stride=*/16);
}

// The relay forwards an envelope only from the member its `from` names, only to a member of
// the sender's room; the recipient refuses a replay of a genuine one.
TEST_F(RelayTest, AForgedSenderAStrangerAndAReplayAreRefused) {
  RoomMember& head = Add("relay-head", false);
  RoomMember& hidden = Add("relay-hidden", true);
  RoomMember& other = Add("relay-other", false);
  AwaitRoomOf(3);

  // A genuine one, to have an envelope to replay.
  ASSERT_TRUE(head.Send(hidden.address(), wire::Message(ActivationOf(Payload(2.0f))), 3000).ok());
  ASSERT_TRUE(Next(hidden, 5000).has_value());
  const auto genuine = Seen().back();

  // `other` seals for `hidden` but names `head` as the sender: the relay refuses it.
  net::PeerBoxes boxes(other.keys());
  auto forged = boxes.Seal(hidden.keys().public_key, wire::Encode(wire::Message(ActivationOf(Payload(3.0f)))));
  ASSERT_TRUE(forged.ok());
  forged->from = head.id();
  const int64_t refused_before = rv_->relay_refusals();
  ASSERT_TRUE(other.endpoint().Send(other.options().rendezvous, wire::Message(*forged), 3000).ok());
  // An envelope to a device that is in no room.
  auto stranger = boxes.Seal(net::NewKeyPair().public_key, std::vector<uint8_t>{1, 2, 3});
  ASSERT_TRUE(stranger.ok());
  ASSERT_TRUE(other.endpoint().Send(other.options().rendezvous, wire::Message(*stranger), 3000).ok());
  // The genuine envelope again, from its true sender: the relay passes it, `hidden` refuses it.
  ASSERT_TRUE(head.endpoint().Send(head.options().rendezvous, genuine, 3000).ok());

  EXPECT_FALSE(Next(hidden, 1500).has_value()) << "a forged, stray or replayed frame arrived";
  const auto end = Clock::now() + std::chrono::seconds(3);
  while (rv_->relay_refusals() < refused_before + 2 && Clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(rv_->relay_refusals(), refused_before + 2) << "the forged sender and the stranger";
  // The ring still works after all that.
  ASSERT_TRUE(head.Send(hidden.address(), wire::Message(ActivationOf(Payload(4.0f))), 3000).ok());
  EXPECT_TRUE(Next(hidden, 5000).has_value());
}

// --no-listen against a serve whose port has no relay: a clear error, not a wait forever.
TEST_F(RelayTest, ARelayedMemberSaysSoWhenServeHasNoRelay) {
  StartMux(/*relay_port=*/0);  // SOCKS5 is refused like any unknown protocol
  RoomMember::Options o = MemberOptions("relay-hidden", true);
  o.relay_connect_s = 1;
  auto m = RoomMember::Create(o);
  ASSERT_TRUE(m.ok());
  const Status st = (*m)->Admit();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("its relay did not take the connection within 1 s"), std::string::npos) << st.message();
  // And a member may not use flags that need a port.
  o.advertise = "example.org:5000";
  EXPECT_FALSE(RoomMember::Create(o).ok());
}

}  // namespace
}  // namespace daisy
