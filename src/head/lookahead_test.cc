// Lookahead drafting over a real ring in this process (a rendezvous and two nodes on
// 127.0.0.1 sockets): the ids equal a single-device run without drafts, greedy and seeded;
// Verify (which digests every step's final hidden row and logits) agrees; drafts were
// accepted and rejected; and the stages' caches end as without drafts, so the next turn of
// the conversation reuses everything the first one fed.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "daisy/forward.h"
#include "daisy/generator.h"
#include "daisy/head.h"
#include "daisy/model.h"
#include "test_ring.h"

namespace daisy {
namespace {

using test_ring::InProcessRing;
using test_ring::StoriesModel;

class LookaheadRingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ring_ = new InProcessRing;
    ASSERT_EQ(ring_->Start({{"node-a"}, {"node-b"}}), "");
    SessionOptions so = ring_->HeadOptions("lookahead-head");
    so.lookahead = kDefaultLookahead;
    auto s = HeadSession::Start(so);
    ASSERT_TRUE(s.ok()) << s.status().message();
    session_ = s->release();
    ASSERT_TRUE(session_->Load(StoriesModel(), kCtx).ok());
    auto src = OpenLocalFolder(StoriesModel());
    ASSERT_TRUE(src.ok());
    auto info = LoadModelInfo(**src);
    ASSERT_TRUE(info.ok());
    spec_ = new ModelSpec(info->spec);
    auto p = LocalPipeline::Load(**src, *info, std::vector<int>{info->spec.n_layers}, kCtx);
    ASSERT_TRUE(p.ok()) << p.status().message();
    single_ = new LocalPipeline(std::move(*p));
  }
  static void TearDownTestSuite() {
    delete single_;
    delete spec_;
    delete session_;
    delete ring_;
  }

  // The single-device run without drafts: what every ring turn must give.
  static GenerateResult Single(const std::vector<int32_t>& prompt, GenerateOptions o, int stop_after = 0) {
    for (int eos : spec_->eos_ids) o.stop_ids.push_back(eos);
    if (stop_after > 0) o.stop_after = [n = 0, stop_after](int32_t) mutable { return ++n == stop_after; };
    auto r = Generator(single_->head()).Generate(prompt, o);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : GenerateResult{};
  }

  static constexpr int kCtx = 256;
  static inline InProcessRing* ring_ = nullptr;
  static inline HeadSession* session_ = nullptr;
  static inline LocalPipeline* single_ = nullptr;
  static inline ModelSpec* spec_ = nullptr;
};

TEST_F(LookaheadRingTest, IdsBitsAndCachesEqualARunWithoutDrafts) {
  auto encode = [](const std::string& text, bool bos) {
    auto ids = session_->tokenizer()->Encode(text, bos);
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  };
  // A text that repeats, so its continuation does too: drafts are accepted and rejected.
  const std::vector<int32_t> prompt = encode("Lily and Tom. Lily and Tom. Lily and Tom. Lily and", true);
  for (float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE(temperature == 0 ? "greedy" : "seeded");
    GenerateOptions o;
    o.max_tokens = 100;
    o.sampling.temperature = temperature;
    o.sampling.seed = 11;
    // Where to stop the first turn: after drafts were accepted and rejected, inside a lap with
    // drafts fed after the stopping token, so the stages hold rejected positions when the turn
    // ends (found on this device first).
    int stop_at = 0;
    for (int n = 30; n <= 90 && stop_at == 0; ++n) {
      GenerateOptions d = o;
      d.lookahead = kDefaultLookahead;
      const GenerateResult g = Single(prompt, d, n);
      if (g.rolled_back > 0 && g.accepted > 0 && g.drafted > g.accepted && static_cast<int>(g.ids.size()) == n)
        stop_at = n;
    }
    ASSERT_GT(stop_at, 0) << "no stop inside a lap with drafts after it";
    const GenerateResult want = Single(prompt, o, stop_at);

    TurnRequest r;
    r.prompt_ids = prompt;
    r.generate = o;
    r.conversation = "lookahead-" + std::to_string(temperature);
    r.verify = true;
    r.fresh_hooks = [stop_at](GenerateOptions& g) {
      g.stop_after = [n = 0, stop_at](int32_t) mutable { return ++n == stop_at; };
    };
    auto t1 = session_->Generate(r);
    ASSERT_TRUE(t1.ok()) << t1.status().message();
    EXPECT_EQ(t1->ids, want.ids);
    EXPECT_TRUE(t1->verified.value_or(false)) << t1->verify_message;
    EXPECT_GT(t1->accepted, 0) << "no draft was accepted: the test would pass without drafting";
    EXPECT_GT(t1->drafted, t1->accepted) << "no draft was rejected";
    EXPECT_LT(t1->laps, t1->ring_positions) << "drafts ride in multi-position laps";
    std::printf("%s: %d of %d drafts accepted, %lld laps for %zu tokens\n", temperature == 0 ? "greedy" : "seeded",
                t1->accepted, t1->drafted, static_cast<long long>(t1->laps), t1->ids.size());

    // The next turn of the conversation: everything the first one fed is reused, which every
    // stage allows only when its cache holds exactly what done said (rejected drafts gone).
    std::vector<int32_t> p2 = prompt;
    p2.insert(p2.end(), t1->ids.begin(), t1->ids.end());
    const auto more = encode(" One day, she saw a big dog.", false);
    p2.insert(p2.end(), more.begin(), more.end());
    TurnRequest r2 = r;
    r2.prompt_ids = p2;
    r2.fresh_hooks = nullptr;
    r2.generate.max_tokens = 40;
    auto t2 = session_->Generate(r2);
    ASSERT_TRUE(t2.ok()) << t2.status().message();
    EXPECT_EQ(t2->reused_positions, static_cast<int>(prompt.size() + t1->ids.size() - 1));
    EXPECT_TRUE(t2->verified.value_or(false)) << t2->verify_message;
    GenerateOptions o2 = o;
    o2.max_tokens = 40;
    EXPECT_EQ(t2->ids, Single(p2, o2).ids);
  }
}

// Pipelined prefill on the ring: a prompt of over 120 positions goes in chunks of 16 with
// one per stage in flight; the bits of every step equal those of the single-device run
// Verify makes, which prefills it in one chunk, and the ids equal a run without drafts.
TEST_F(LookaheadRingTest, PipelinedPrefillOfALongPromptEqualsOneChunk) {
  std::string text;
  for (int i = 0; i < 12; ++i) text += "Tom had a red ball and a little dog. ";
  auto ids = session_->tokenizer()->Encode(text, true);
  ASSERT_TRUE(ids.ok());
  ASSERT_GT(ids->size(), 120u);
  TurnRequest r;
  r.prompt_ids = *ids;
  r.generate.max_tokens = 20;
  r.conversation = "long-prompt";
  r.verify = true;
  auto t = session_->Generate(r);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(t->verified.value_or(false)) << t->verify_message;
  GenerateOptions o;
  o.max_tokens = 20;
  EXPECT_EQ(t->ids, Single(*ids, o).ids);
}

}  // namespace
}  // namespace daisy
