// The stage audit over a real ring in this process (rendezvous and two nodes on 127.0.0.1):
// a node rigged to flip one bit of some hops' output is caught, excluded, and the turn
// completes with the single-device ids.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "daisy/head.h"
#include "daisy/net.h"
#include "daisy/node.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;

std::string Stories() { return std::string(std::getenv("DAISY_MODELS")) + "/stories260K"; }

class AuditTest : public ::testing::Test {
 protected:
  // A fresh room for each test: node-b flips the lowest bit of every `flip_every`-th hop.
  void StartRing(int flip_every) {
    char tmpl[] = "/tmp/daisy_audit_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    home_ = tmpl;
    ::setenv("DAISY_HOME", home_.c_str(), 1);
    net::RendezvousOptions ro;
    ro.port = 0;
    ro.auto_approve = true;
    auto rv = net::Rendezvous::Start(ro);
    ASSERT_TRUE(rv.ok()) << rv.status().message();
    rendezvous_ = std::move(*rv);
    for (const char* role : {"node-a", "node-b"}) {
      const int flip = std::string(role) == "node-b" ? flip_every : 0;
      nodes_.emplace_back([this, role, flip] {
        NodeOptions o;
        o.role = role;
        o.name = role;
        o.rendezvous = rendezvous_->address();
        o.admission = rendezvous_->LocalAdmission(/*trusted=*/false);  // auto_approve: approved at once
        o.print_tokens = false;
        o.stop = &stop_;
        o.test_flip_every = flip;
        o.hub.cache_dir = (home_ / role).string();
        Status st = RunNode(o);
        if (!st.ok()) std::fprintf(stderr, "node %s: %s\n", role, st.message().c_str());
      });
    }
  }
  void TearDown() override {
    stop_ = true;
    for (auto& t : nodes_) t.join();
    rendezvous_.reset();
    std::error_code ec;
    fs::remove_all(home_, ec);
  }

  HeadReport Run(double rate, uint64_t seed, int max_tokens, const std::string& prompt) {
    SessionOptions so;
    so.rendezvous = rendezvous_->address();
    so.admission = rendezvous_->LocalAdmission(/*trusted=*/false);
    so.name = "auditing-head";
    so.stages = 3;
    so.wait_s = 20;
    so.audit_rate = rate;
    so.audit_seed = seed;
    auto s = HeadSession::Start(so);
    EXPECT_TRUE(s.ok()) << s.status().message();
    if (!s.ok()) return {};
    auto v = (*s)->Load(Stories(), 256);
    EXPECT_TRUE(v.ok()) << v.status().message();
    TurnRequest r;
    r.prompt_ids = *(*s)->tokenizer()->Encode(prompt, true);
    r.generate.max_tokens = max_tokens;
    r.verify = true;
    r.on_status = [](std::string_view line) { std::fprintf(stderr, "  head: %.*s\n", static_cast<int>(line.size()), line.data()); };
    auto rep = (*s)->Generate(r);
    EXPECT_TRUE(rep.ok()) << rep.status().message();
    return rep.ok() ? *rep : HeadReport{};
  }

  fs::path home_;
  std::unique_ptr<net::Rendezvous> rendezvous_;
  std::vector<std::thread> nodes_;
  std::atomic<bool> stop_{false};
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

}  // namespace
}  // namespace daisy
