// The long-lived head (HeadSession) over a real ring in this process: a rendezvous and two
// nodes on 127.0.0.1 sockets. The prefix cache must send fewer positions around the ring
// and give the same ids as a fresh run.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "daisy/forward.h"
#include "daisy/head.h"
#include "daisy/net.h"
#include "daisy/node.h"
#include "daisy/plan.h"
#include "daisy/source.h"
#include "test_ring.h"

namespace daisy {
namespace {

using test_ring::InProcessRing;
using test_ring::StoriesModel;

class SessionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ring_ = new InProcessRing;
    const std::string why = ring_->Start({{"node-a"}, {"node-b"}});
    ASSERT_EQ(why, "");
    auto s = HeadSession::Start(ring_->HeadOptions("test-head"));
    ASSERT_TRUE(s.ok()) << s.status().message();
    session_ = s->release();
    auto v = session_->Load(StoriesModel(), 256);
    ASSERT_TRUE(v.ok()) << v.status().message();
  }
  static void TearDownTestSuite() {
    delete session_;
    delete ring_;
  }

  static std::vector<int32_t> Encode(const std::string& text, bool bos = true) {
    auto ids = session_->tokenizer()->Encode(text, bos);
    EXPECT_TRUE(ids.ok());
    return *ids;
  }
  static HeadReport Turn(const std::vector<int32_t>& prompt, const std::string& conversation, int max_tokens = 24,
                         bool verify = false) {
    TurnRequest r;
    r.prompt_ids = prompt;
    r.conversation = conversation;
    r.generate.max_tokens = max_tokens;
    r.verify = verify;
    auto rep = session_->Generate(r);
    EXPECT_TRUE(rep.ok()) << rep.status().message();
    return rep.ok() ? *rep : HeadReport{};
  }

  static inline InProcessRing* ring_ = nullptr;
  static inline HeadSession* session_ = nullptr;
};

TEST_F(SessionTest, TheModelViewAndPlanComeFromHeadersOnly) {
  auto m = session_->model();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->spec.n_layers, 5);
  EXPECT_GT(m->parameters, 200000u);
  EXPECT_EQ(m->ctx, 256);
  auto plan = session_->PreviewPlan();
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->stages.size(), 3u);
  EXPECT_TRUE(plan->fits);
  EXPECT_EQ(plan->stages[0].device_id, session_->device_id());
  EXPECT_EQ(plan->stages[2].end, 5);
  EXPECT_GT(plan->stages[1].hold_bytes, 0u);
  // A split the room cannot give is a warning, not a crash.
  auto too_many = session_->PreviewPlan(9);
  ASSERT_TRUE(too_many.ok());
  EXPECT_FALSE(too_many->fits);
  EXPECT_FALSE(too_many->warning.empty());
}

TEST_F(SessionTest, ASecondTurnReusesThePrefixAndGivesTheFreshIds) {
  const auto p1 = Encode("Once upon a time, there was a little girl");
  HeadReport t1 = Turn(p1, "chat-1");
  ASSERT_EQ(t1.plan.size(), 3u);
  EXPECT_EQ(t1.reused_positions, 0);
  ASSERT_FALSE(t1.ids.empty());
  // The second turn: the whole first turn plus more text.
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), t1.ids.begin(), t1.ids.end());
  const auto more = Encode(" One day, she saw a big dog.", false);
  p2.insert(p2.end(), more.begin(), more.end());
  HeadReport t2 = Turn(p2, "chat-1", 24, /*verify=*/true);
  // Everything the first turn fed is kept (its last token was sampled, never fed).
  EXPECT_EQ(t2.reused_positions, static_cast<int>(p1.size() + t1.ids.size() - 1));
  ASSERT_TRUE(t2.verified.has_value());
  EXPECT_TRUE(*t2.verified) << t2.verify_message;
  // A fresh run of the same prompt under another conversation key: nothing reused.
  HeadReport fresh = Turn(p2, "chat-fresh");
  EXPECT_EQ(fresh.reused_positions, 0);
  EXPECT_EQ(fresh.ids, t2.ids);
  EXPECT_LT(t2.ring_positions, fresh.ring_positions);
  EXPECT_EQ(fresh.ring_positions - t2.ring_positions, t2.reused_positions);
  std::printf("positions through the ring: fresh %lld, with the prefix cache %lld (reused %d)\n",
              static_cast<long long>(fresh.ring_positions), static_cast<long long>(t2.ring_positions),
              t2.reused_positions);
}

TEST_F(SessionTest, TwoChatsDoNotEraseEachOther) {
  const auto a = Encode("The cat sat on the mat and");
  const auto b = Encode("Tom had a red ball. He");
  HeadReport a1 = Turn(a, "chat-a", 8);
  HeadReport b1 = Turn(b, "chat-b", 8);
  std::vector<int32_t> a2 = a;
  a2.insert(a2.end(), a1.ids.begin(), a1.ids.end());
  HeadReport a2r = Turn(a2, "chat-a", 8);
  EXPECT_EQ(a2r.reused_positions, static_cast<int>(a.size() + a1.ids.size() - 1));
  std::vector<int32_t> b2 = b;
  b2.insert(b2.end(), b1.ids.begin(), b1.ids.end());
  HeadReport b2r = Turn(b2, "chat-b", 8, /*verify=*/true);
  EXPECT_EQ(b2r.reused_positions, static_cast<int>(b.size() + b1.ids.size() - 1));
  EXPECT_TRUE(b2r.verified.value_or(false)) << b2r.verify_message;
}

// A node keeps other conversations' caches only where they fit its memory budget beside
// the one the plan counted: with room for one cache, a second conversation evicts the
// first, so the first's next turn reuses nothing (and its ids are still exact).
TEST(SessionBudgetTest, ANodeKeepsOnlyTheCachesItsBudgetHolds) {
  auto src = OpenLocalFolder(StoriesModel());
  ASSERT_TRUE(src.ok());
  auto info = LoadModelInfo(**src);
  ASSERT_TRUE(info.ok());
  constexpr int kCtx = 256;
  const PlanModel pm = PlanModelOf(*info, kCtx);
  const uint64_t kv2 = KvCache(info->spec, 0, 2, kCtx).Bytes();  // one conversation, 2 layers
  ASSERT_GT(kv2, 0u);
  InProcessRing ring;
  const uint64_t budget = pm.Need(2, false) + kv2 / 2;  // the plan's need, not a second cache
  ASSERT_EQ(ring.Start({{"node-a", 0, {}, budget}, {"node-b", 0, {}, budget}}), "");
  SessionOptions so = ring.HeadOptions("budget-head");
  so.plan = std::vector<int>{1, 2, 2};
  auto s = HeadSession::Start(so);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_TRUE((*s)->Load(StoriesModel(), kCtx).ok());
  auto turn = [&](const std::vector<int32_t>& prompt, const std::string& conversation) {
    TurnRequest r;
    r.prompt_ids = prompt;
    r.conversation = conversation;
    r.generate.max_tokens = 8;
    auto rep = (*s)->Generate(r);
    EXPECT_TRUE(rep.ok()) << rep.status().message();
    return rep.ok() ? *rep : HeadReport{};
  };
  auto a = *(*s)->tokenizer()->Encode("The cat sat on the mat and", true);
  auto b = *(*s)->tokenizer()->Encode("Tom had a red ball. He", true);
  HeadReport a1 = turn(a, "chat-a");
  ASSERT_EQ(a1.plan.size(), 3u);
  turn(b, "chat-b");
  a.insert(a.end(), a1.ids.begin(), a1.ids.end());
  HeadReport a2 = turn(a, "chat-a");
  EXPECT_EQ(a2.reused_positions, 0) << "a node kept two caches where its budget holds one";
  HeadReport fresh = turn(a, "chat-a-fresh");
  EXPECT_EQ(a2.ids, fresh.ids);
}

TEST_F(SessionTest, ADivergingPromptKeepsOnlyTheCommonPrefixAndStaysExact) {
  const auto p = Encode("Lily wanted to play outside in the park");
  HeadReport t1 = Turn(p, "chat-d", 12);
  // Same start, different ending: only the shared positions may be kept.
  const auto q = Encode("Lily wanted to eat a big red apple");
  size_t common = 0;
  while (common < p.size() && common < q.size() && p[common] == q[common]) ++common;
  ASSERT_GT(common, 1u);
  ASSERT_LT(common, q.size());
  HeadReport t2 = Turn(q, "chat-d", 12, /*verify=*/true);
  EXPECT_EQ(t2.reused_positions, static_cast<int>(common));
  EXPECT_TRUE(t2.verified.value_or(false)) << t2.verify_message;
  // Without a conversation key, the slot with the longest shared prefix is found.
  std::vector<int32_t> q2 = q;
  q2.insert(q2.end(), t2.ids.begin(), t2.ids.end());
  HeadReport t3 = Turn(q2, "", 6, /*verify=*/true);
  EXPECT_GT(t3.reused_positions, static_cast<int>(q.size()));
  EXPECT_TRUE(t3.verified.value_or(false)) << t3.verify_message;
}

// A prefix cache that keeps 3 positions too many (a planted bug, through the test-only seam)
// runs the new prompt over keys and values of the old one at those positions. Verify must
// say MISMATCH even where the ids come out the same: it compares the bits of every step.
TEST_F(SessionTest, AKeptPrefixOffByThreeIsCaught) {
  SessionOptions so = ring_->HeadOptions("off-by-3-head");
  so.role = "head-off-by-3";  // an identity of its own beside the suite's head
  so.test_keep_extra = 3;
  auto s = HeadSession::Start(so);
  ASSERT_TRUE(s.ok()) << s.status().message();
  HeadSession& off = **s;
  ASSERT_TRUE(off.Load(StoriesModel(), 256).ok());
  auto turn = [&](const std::vector<int32_t>& prompt, int max_tokens, bool verify) {
    TurnRequest r;
    r.prompt_ids = prompt;
    r.conversation = "chat-off-by-3";
    r.generate.max_tokens = max_tokens;
    r.verify = verify;
    auto rep = off.Generate(r);
    EXPECT_TRUE(rep.ok()) << rep.status().message();
    return rep.ok() ? *rep : HeadReport{};
  };
  const auto p = Encode("One day, a boy went to the store to buy milk");
  turn(p, 12, false);
  // Differs in one word: the 3 extra kept positions hold "boy went to" where "girl went to"
  // belongs, and the first token comes out the same (the next does not); only the bits tell.
  const auto q = Encode("One day, a girl went to the store to buy milk");
  size_t common = 0;
  while (common < p.size() && common < q.size() && p[common] == q[common]) ++common;
  ASSERT_LT(common + 3, q.size());
  HeadReport t2 = turn(q, 1, true);
  EXPECT_EQ(t2.reused_positions, static_cast<int>(common + 3)) << "the seam did not plant the bug";
  ASSERT_TRUE(t2.verified.has_value());
  EXPECT_FALSE(*t2.verified) << t2.verify_message;
  // The first step already reads the wrong keys: the first generated token's bits differ.
  EXPECT_EQ(t2.mismatch_position, static_cast<int>(q.size())) << t2.verify_message;
  EXPECT_EQ(
      t2.verify_message.rfind("MISMATCH: position " + std::to_string(q.size()) + " (ids equal, logits differ)", 0), 0u)
      << t2.verify_message;
  // The same prompt without the planted bug: the same ids, and VERIFIED.
  TurnRequest fresh;
  fresh.prompt_ids = q;
  fresh.generate.max_tokens = 1;
  fresh.conversation = "chat-off-by-3-fresh";
  fresh.verify = true;
  auto f = off.Generate(fresh);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->reused_positions, 0);
  EXPECT_TRUE(f->verified.value_or(false)) << f->verify_message;
  EXPECT_EQ(f->ids, t2.ids);
  std::printf("%s\n", t2.verify_message.c_str());
}

TEST_F(SessionTest, EveryStageReportsItsShareOfTheTurn) {
  HeadReport r = Turn(Encode("A small bird"), "chat-s", 10);
  ASSERT_EQ(r.stage_latency.size(), 3u);
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_GT(r.stage_latency[i].hops, 0) << "stage " << i;
    EXPECT_GT(r.stage_latency[i].compute_seconds, 0) << "stage " << i;
  }
}

}  // namespace
}  // namespace daisy
