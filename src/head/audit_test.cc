// The stage audit over a real ring in this process (rendezvous and two nodes on 127.0.0.1):
// a node rigged to flip one bit of some hops' output is caught, excluded, and the turn
// completes with the single-device ids.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "daisy/head.h"
#include "daisy/net.h"
#include "daisy/node.h"
#include "test_ring.h"

namespace daisy {
namespace {

class AuditTest : public ::testing::Test {
 protected:
  // A fresh room for each test: node-b flips the lowest bit of every `flip_every`-th hop.
  void StartRing(int flip_every) { ASSERT_EQ(ring_.Start({{"node-a"}, {"node-b", flip_every}}), ""); }
  void TearDown() override { ring_.Stop(); }

  // `status`: the head's status lines, when given.
  HeadReport Run(double rate, uint64_t seed, int max_tokens, const std::string& prompt,
                 std::vector<std::string>* status = nullptr, bool verify = true) {
    SessionOptions so = ring_.HeadOptions("auditing-head");
    so.audit_rate = rate;
    so.audit_seed = seed;
    auto s = HeadSession::Start(so);
    EXPECT_TRUE(s.ok()) << s.status().message();
    if (!s.ok()) return {};
    auto v = (*s)->Load(test_ring::StoriesModel(), 256);
    EXPECT_TRUE(v.ok()) << v.status().message();
    TurnRequest r;
    r.prompt_ids = *(*s)->tokenizer()->Encode(prompt, true);
    r.generate.max_tokens = max_tokens;
    r.verify = verify;
    r.on_status = [status](std::string_view line) {
      std::fprintf(stderr, "  head: %.*s\n", static_cast<int>(line.size()), line.data());
      if (status) status->emplace_back(line);
    };
    auto rep = (*s)->Generate(r);
    EXPECT_TRUE(rep.ok()) << rep.status().message();
    return rep.ok() ? *rep : HeadReport{};
  }

  test_ring::InProcessRing ring_;
  net::Rendezvous& rendezvous() { return ring_.rendezvous(); }
};

TEST_F(AuditTest, AnHonestRingPassesEveryAudit) {
  StartRing(0);
  HeadReport r = Run(1.0, 7, 30, "Once upon a time");
  EXPECT_TRUE(r.audit_failures.empty());
  EXPECT_EQ(r.replays, 0);
  EXPECT_GT(r.audited_hops, 0);
  EXPECT_GT(r.recomputed_hops, 0);
  EXPECT_TRUE(r.verified.value_or(false)) << r.verify_message;
}

TEST_F(AuditTest, FullAuditCatchesTheFirstRiggedHop) {
  StartRing(5);
  const std::string prompt = "Once upon a time";
  HeadReport r = Run(1.0, 7, 30, prompt);
  ASSERT_EQ(r.audit_failures.size(), 1u);
  // node-b's hops in this turn: the prompt in one chunk [0, n), then one per position n, n+1,
  // ...; its 5th hop, the first rigged one, is the one at position n + 3.
  const int n = static_cast<int>(r.prompt_ids.size());
  ASSERT_LT(n, 16);
  const std::string& why = r.audit_failures[0];
  EXPECT_NE(why.find("node-b"), std::string::npos) << why;
  EXPECT_NE(why.find("wrong bits for its hop at position " + std::to_string(n + 3) + " "), std::string::npos) << why;
  EXPECT_EQ(r.replays, 1);
  for (const auto& s : r.plan) EXPECT_NE(s.device_name, "node-b") << "the rigged stage is excluded from the replay";
  EXPECT_EQ(r.ids.size(), 30u);
  EXPECT_TRUE(r.verified.value_or(false)) << r.verify_message;
}

// A verdict names stages that answered, so its replay waits for no one: the settle wait
// (settle_s, for the room to drop members that died) is for replays after a fault. Read from
// the head's status lines, not the clock.
TEST_F(AuditTest, AReplayAfterAVerdictWaitsForNoOne) {
  StartRing(5);
  std::vector<std::string> status;
  HeadReport r = Run(1.0, 7, 12, "Once upon a time", &status, /*verify=*/false);
  ASSERT_EQ(r.audit_failures.size(), 1u);
  ASSERT_EQ(r.replays, 1);
  const auto said = [&status](const std::string& part) {
    return std::count_if(status.begin(), status.end(),
                         [&part](const std::string& l) { return l.find(part) != std::string::npos; });
  };
  EXPECT_EQ(said("re-planning around the devices still in the room"), 1);
  EXPECT_EQ(said("no wait for the room: the audit's verdict"), 1);
  EXPECT_EQ(said("for the room to drop members that died"), 0) << "the replay waited for dead members";
  EXPECT_EQ(r.ids.size(), 12u);
}

// A middle stage that sends corrupted rows while reporting the honest digest of its output
// (the attack that used to get the honest next stage excluded): its receipt to the next
// stage covers what it really sent, which contradicts its own report, so it alone is
// excluded; the honest stages stay and the replay is VERIFIED.
TEST_F(AuditTest, AMiddleStageThatLiesWithAnHonestDigestIsExcludedAlone) {
  test_ring::InProcessRing::NodeSpec liar{"node-b"};
  liar.flip_every = 3;
  liar.lie = test::TestNodeFaults::Lie::kAfterReport;
  ASSERT_EQ(ring_.Start({{"node-a"}, liar, {"node-c"}}, /*in_order=*/true), "");
  HeadReport r = Run(1.0, 7, 30, "Once upon a time");
  ASSERT_EQ(r.audit_failures.size(), 1u);
  const std::string& why = r.audit_failures[0];
  EXPECT_NE(why.find("node-b"), std::string::npos) << why;
  EXPECT_EQ(why.find("node-c"), std::string::npos) << "the honest receiver was blamed: " << why;
  EXPECT_EQ(r.replays, 1);
  std::vector<std::string> replay;
  for (const auto& s : r.plan) replay.push_back(s.device_name);
  EXPECT_EQ(std::count(replay.begin(), replay.end(), "node-b"), 0) << "the liar stayed";
  EXPECT_EQ(std::count(replay.begin(), replay.end(), "node-a"), 1) << "an honest stage was dropped";
  EXPECT_EQ(std::count(replay.begin(), replay.end(), "node-c"), 1) << "the honest receiver was dropped";
  EXPECT_TRUE(r.verified.value_or(false)) << r.verify_message;
}

// The same liar that also lies in its receipt (honest digest everywhere, corrupted rows):
// the next stage reports rows the receipt does not cover, and nothing can tell which of the
// two lied. Both are excluded, never the receiver alone, and the replay is VERIFIED.
TEST_F(AuditTest, WhenTheEvidenceCannotDecideBothNeighboursAreExcluded) {
  test_ring::InProcessRing::NodeSpec liar{"node-b"};
  liar.flip_every = 3;
  liar.lie = test::TestNodeFaults::Lie::kAfterReceipt;
  ASSERT_EQ(ring_.Start({{"node-a"}, liar, {"node-c"}}, /*in_order=*/true), "");
  HeadReport r = Run(1.0, 7, 30, "Once upon a time");
  ASSERT_EQ(r.audit_failures.size(), 1u);
  const std::string& why = r.audit_failures[0];
  EXPECT_NE(why.find("both are excluded"), std::string::npos) << why;
  std::vector<std::string> replay;
  for (const auto& s : r.plan) replay.push_back(s.device_name);
  EXPECT_EQ(std::count(replay.begin(), replay.end(), "node-b"), 0) << "the liar stayed";
  EXPECT_EQ(std::count(replay.begin(), replay.end(), "node-c"), 0);
  EXPECT_EQ(std::count(replay.begin(), replay.end(), "node-a"), 1) << "a stage outside the dispute was dropped";
  EXPECT_TRUE(r.verified.value_or(false)) << r.verify_message;
}

TEST_F(AuditTest, AFifthAuditCatchesItNineTimesInTen) {
  StartRing(10);  // one hop in ten is corrupted
  int caught = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    HeadReport r = Run(0.2, seed, 100, "Tim and Sue went to the park");
    ASSERT_TRUE(r.verified.has_value());
    EXPECT_TRUE(*r.verified) << "seed " << seed << ": " << r.verify_message;
    if (!r.audit_failures.empty()) {
      ++caught;
      EXPECT_NE(r.audit_failures[0].find("node-b"), std::string::npos) << r.audit_failures[0];
    }
  }
  std::printf("audit 0.2: the rigged stage was caught in %d of 10 seeded runs of 100 tokens\n", caught);
  EXPECT_GE(caught, 9);
}

// Hostile input from inside the room: an approved member (not a stage of the turn) floods
// every other member with garbage and with well-formed frames it has no business sending
// (fake errors, done, tokens, activations, assignments, peer lists). Each receiver drops
// them by sender key; the turn completes with no replay and the single-device ids.
TEST_F(AuditTest, AMemberThatFloodsGarbageDisturbsNothing) {
  StartRing(0);
  auto rogue = net::Endpoint::Bind("127.0.0.1", 0);
  ASSERT_TRUE(rogue.ok()) << rogue.status().message();
  net::Endpoint& ep = **rogue;
  rendezvous().Admit("default", ep.public_key(), "rogue");
  ep.SetPeerKey(rendezvous().address(), rendezvous().public_key());
  ep.Allow(rendezvous().public_key());
  wire::Hello h;
  h.capabilities = 0;  // never planned: it only talks
  h.device_id = net::KeyId(ep.public_key());
  h.name = "rogue";
  h.backend = "scalar";
  std::optional<wire::Peers> peers;
  for (int i = 0; i < 100 && !peers; ++i) {
    if (i % 10 == 0) {
      ASSERT_TRUE(ep.Send(rendezvous().address(), wire::Message(wire::Join{"default", ep.address(), h}), 1000).ok());
    }
    auto f = ep.Receive(100);
    if (!f.ok() || !f->has_value()) continue;
    if (auto m = wire::Decode(**f); m.ok() && std::holds_alternative<wire::Peers>(*m))
      peers = std::get<wire::Peers>(*m);
  }
  ASSERT_TRUE(peers.has_value()) << "the rogue was not let into the room";
  net::ApplyPeerList(ep, rendezvous().public_key(), *peers);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> sent{0};
  std::thread flood([&] {
    std::mt19937_64 rng(99);
    wire::Activation fake;
    fake.seq = 1;
    fake.next = 1;
    fake.values.assign(64, 0.5f);
    fake.act_hash = wire::ActHash(fake.values);
    wire::Assignment bogus;
    bogus.turn = 77;
    bogus.model_id = "owner/model";
    bogus.revision = "main";
    bogus.ctx = 16;
    bogus.stages = {{h.device_id, ep.address(), 0, 5}};
    auto last_beat = std::chrono::steady_clock::now();
    while (!stop.load()) {
      // The room grows (the head joins with the turn): keep the member list current.
      for (auto f = ep.Receive(0); f.ok() && f->has_value(); f = ep.Receive(0))
        if (auto m = wire::Decode(**f); m.ok() && std::holds_alternative<wire::Peers>(*m)) {
          peers = std::get<wire::Peers>(*m);
          net::ApplyPeerList(ep, rendezvous().public_key(), *peers);
        }
      if (std::chrono::steady_clock::now() - last_beat > std::chrono::milliseconds(500)) {
        (void)ep.Send(rendezvous().address(), wire::Message(wire::Heartbeat{0, h.device_id}), 200);
        last_beat = std::chrono::steady_clock::now();
      }
      std::vector<uint8_t> junk(1 + rng() % 200);
      for (auto& b : junk) b = static_cast<uint8_t>(rng());
      for (const auto& p : peers->peers) {
        if (p.hello.device_id == h.device_id) continue;
        const int32_t seq = static_cast<int32_t>(rng() % 8);
        fake.seq = seq;
        fake.token_index = static_cast<int32_t>(rng() % 8);
        const std::vector<wire::Message> frames = {
            wire::ErrorMsg{wire::ErrorKind::kFrame, "rogue says the turn failed"},
            wire::Done{seq, wire::FinishReason::kStop, 0, 0},
            wire::Token{seq, 3, 7},
            fake,
            bogus,
            *peers};
        if (ep.Send(p.address, junk, 50).ok()) ++sent;
        for (const auto& m : frames)
          if (ep.Send(p.address, m, 50).ok()) ++sent;
      }
    }
  });
  HeadReport r = Run(0, 1, 60, "Once upon a time");
  HeadReport again = Run(0, 1, 20, "The little dog");
  stop = true;
  flood.join();
  std::printf("the rogue sent %lld frames during two turns\n", static_cast<long long>(sent.load()));
  EXPECT_GT(sent.load(), 1000);
  EXPECT_EQ(r.replays, 0);
  EXPECT_EQ(r.ids.size(), 60u);
  EXPECT_TRUE(r.verified.value_or(false)) << r.verify_message;
  EXPECT_EQ(again.replays, 0);
  EXPECT_TRUE(again.verified.value_or(false)) << again.verify_message;
}

}  // namespace
}  // namespace daisy
