// Verify proves bits, not ids: a ring in this process (rendezvous and one node on 127.0.0.1)
// whose node flips the lowest mantissa bit of every hop's output. The flips are too small to
// move the argmax, so the ids equal the single-device ids, and Verify must still refuse.
#include <gtest/gtest.h>

#include <string>

#include "daisy/head.h"
#include "test_ring.h"

namespace daisy {
namespace {

TEST(VerifyTest, ARiggedRingWhoseIdsStayTheSameIsAMismatch) {
  test_ring::InProcessRing ring;
  // One node: it is the last stage, so its flips come straight back to the head.
  ASSERT_EQ(ring.Start({{"node-rigged", /*flip_every=*/1}}), "");
  auto s = HeadSession::Start(ring.HeadOptions("verifying-head"));
  ASSERT_TRUE(s.ok()) << s.status().message();
  HeadSession& session = **s;
  ASSERT_TRUE(session.Load(test_ring::StoriesModel(), 256).ok());
  TurnRequest r;
  r.prompt_ids = *session.tokenizer()->Encode("Once upon a time", true);
  r.generate.max_tokens = 40;
  r.verify = true;
  // The same turn on the head alone: the single-device ids.
  TurnRequest alone = r;
  alone.stages = 1;
  alone.verify = false;
  alone.conversation = "alone";
  auto single = session.Generate(alone);
  ASSERT_TRUE(single.ok()) << single.status().message();
  ASSERT_EQ(single->plan.size(), 1u);

  auto rigged = session.Generate(r);
  ASSERT_TRUE(rigged.ok()) << rigged.status().message();
  ASSERT_EQ(rigged->plan.size(), 2u);
  EXPECT_EQ(rigged->ids, single->ids) << "the flips were meant to leave the ids alone";
  ASSERT_TRUE(rigged->verified.has_value());
  EXPECT_FALSE(*rigged->verified) << rigged->verify_message;
  // The node's first hop is the prompt (one chunk, whose last row it leaves alone: it flips
  // row 0); its second, the first decode step, returns a flipped row for the token after it.
  const int n = static_cast<int>(rigged->prompt_ids.size());
  ASSERT_GT(n, 1);
  EXPECT_EQ(rigged->mismatch_position, n + 1) << rigged->verify_message;
  EXPECT_EQ(rigged->mismatch.rfind("ids equal", 0), 0u) << rigged->mismatch;
  EXPECT_EQ(rigged->verify_message.rfind("MISMATCH: position " + std::to_string(n + 1) + " (ids equal, ", 0), 0u)
      << rigged->verify_message;
  std::printf("%s\n", rigged->verify_message.c_str());
}

}  // namespace
}  // namespace daisy
