// Lookahead drafting (prompt lookup) in the generation loop: the draft lookup itself, and
// runs with drafts that must give exactly the ids, the per-step bits (final hidden row and
// logits) and the KV caches of a run without them, greedy and seeded, split and unsplit.
// Each run also asserts that drafts were accepted and rejected, so no test passes by never
// drafting.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "daisy/forward.h"
#include "daisy/generator.h"
#include "daisy/model.h"
#include "test_models.h"

namespace daisy {
namespace {

TEST(LookupDraft, FollowsTheMostRecentEarlierOccurrenceOfTheLongestSuffix) {
  const std::vector<int32_t> a = {1, 2, 3, 9, 1, 2};
  EXPECT_EQ(LookupDraft(a, 4), (std::vector<int32_t>{3, 9, 1, 2}));
  EXPECT_EQ(LookupDraft(a, 2), (std::vector<int32_t>{3, 9}));
  EXPECT_TRUE(LookupDraft(a, 0).empty());
  // Two earlier occurrences of {5, 6}: the later one is followed.
  const std::vector<int32_t> b = {5, 6, 7, 5, 6, 8, 5, 6};
  EXPECT_EQ(LookupDraft(b, 8), (std::vector<int32_t>{8, 5, 6}));
  // A longer suffix wins over a more recent shorter one: {4, 5, 6} occurred at 0.
  const std::vector<int32_t> c = {4, 5, 6, 1, 5, 6, 2, 4, 5, 6};
  EXPECT_EQ(LookupDraft(c, 2), (std::vector<int32_t>{1, 5}));
  // Nothing repeats (a single repeated id is not enough): no draft.
  EXPECT_TRUE(LookupDraft(std::vector<int32_t>{1, 2, 3, 4, 5}, 4).empty());
  EXPECT_TRUE(LookupDraft(std::vector<int32_t>{7, 1, 2, 7}, 4).empty());
  EXPECT_TRUE(LookupDraft(std::vector<int32_t>{}, 4).empty());
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Everything a run shows: ids, and per step the position, hidden row and logits.
struct Trace {
  GenerateResult result;
  std::vector<int> positions;
  std::vector<std::vector<float>> rows, logits, token_logits;
  int head_length = 0;
};

bool SameRun(const Trace& a, const Trace& b, std::string* why) {
  if (a.result.ids != b.result.ids) return *why = "ids differ", false;
  if (a.result.finish_reason != b.result.finish_reason) return *why = "finish reasons differ", false;
  if (a.result.decode_steps != b.result.decode_steps) return *why = "decode_steps differ", false;
  if (a.positions != b.positions) return *why = "step positions differ", false;
  if (a.head_length != b.head_length) return *why = "the head's cache length differs", false;
  for (size_t i = 0; i < a.rows.size(); ++i)
    if (!SameBits(a.rows[i], b.rows[i]) || !SameBits(a.logits[i], b.logits[i]))
      return *why = "step " + std::to_string(i) + " bits differ", false;
  if (a.token_logits.size() != b.token_logits.size()) return *why = "token counts differ", false;
  for (size_t i = 0; i < a.token_logits.size(); ++i)
    if (!SameBits(a.token_logits[i], b.token_logits[i]))
      return *why = "token " + std::to_string(i) + " logits differ", false;
  return true;
}

Trace Generate(HeadStage& head, std::span<const int32_t> prompt, GenerateOptions o) {
  Trace run;
  o.on_step = [&](int pos, std::span<const float> row, std::span<const float> logits) {
    run.positions.push_back(pos);
    run.rows.emplace_back(row.begin(), row.end());
    run.logits.emplace_back(logits.begin(), logits.end());
  };
  auto r = Generator(head).Generate(
      prompt, o, [&](int32_t, std::span<const float> l) { run.token_logits.emplace_back(l.begin(), l.end()); });
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (r.ok()) run.result = *r;
  run.head_length = head.length();
  return run;
}

using testing::SameCachePrefix;

class StoriesLookahead : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto src = OpenLocalFolder(std::string(std::getenv("DAISY_MODELS")) + "/stories260K");
    ASSERT_TRUE(src.ok()) << src.status().ToString();
    auto info = LoadModelInfo(**src);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    source_ = std::move(*src).release();
    info_ = new ModelInfo(std::move(*info));
  }
  static void TearDownTestSuite() {
    delete info_;
    delete source_;
  }
  static StageWeights Load(int first, int end) {
    auto w = StageWeights::Load(*source_, *info_, first, end, first == 0);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return std::move(w).value();
  }
  static inline ModelSource* source_ = nullptr;
  static inline ModelInfo* info_ = nullptr;
};

constexpr int kCtx = 512;

// "Lily and Tom. Lily and Tom. Lily and Tom. Lily and" in the bundled model's ids: a text
// that repeats, so its continuation does too (drafts are accepted and rejected).
const std::vector<int32_t> kPrompt = {1,   317, 269, 274, 287, 426, 317, 269, 274,
                                      287, 426, 317, 269, 274, 287, 426, 317, 269};

TEST_F(StoriesLookahead, SameIdsBitsAndCachesAsWithoutDrafts) {
  const StageWeights whole = Load(0, 5);
  const StageWeights w0 = Load(0, 2), w1 = Load(2, 4), w2 = Load(4, 5);
  struct Config {
    const char* name;
    float temperature;
    float top_p;
  };
  for (const Config& c : {Config{"greedy", 0.0f, 1.0f}, Config{"seeded", 0.7f, 0.9f}}) {
    GenerateOptions o;
    o.max_tokens = 160;
    o.sampling.temperature = c.temperature;
    o.sampling.top_p = c.top_p;
    o.sampling.seed = 7;
    o.prefill_chunk = 3;  // chunked prefill too: the cache must not care
    // The reference: the whole model, one position per step.
    HeadStage ref(whole, kCtx, nullptr);
    const Trace want = Generate(ref, kPrompt, o);
    ASSERT_GT(want.result.decode_steps, 100) << c.name;
    o.lookahead = kDefaultLookahead;
    int accepted = 0, drafted = 0;
    {
      HeadStage unsplit(whole, kCtx, nullptr);
      const Trace got = Generate(unsplit, kPrompt, o);
      std::string why;
      EXPECT_TRUE(SameRun(want, got, &why)) << c.name << " unsplit: " << why;
      accepted += got.result.accepted;
      drafted += got.result.drafted;
      EXPECT_LT(got.result.decode_laps, want.result.decode_laps) << c.name << ": accepted drafts save laps";
    }
    {
      LocalStage last(w2, kCtx, nullptr);
      LocalStage mid(w1, kCtx, &last);
      HeadStage head(w0, kCtx, &mid);
      const Trace got = Generate(head, kPrompt, o);
      std::string why;
      EXPECT_TRUE(SameRun(want, got, &why)) << c.name << " split 2,2,1: " << why;
      EXPECT_GT(got.result.accepted, 0) << c.name;
      EXPECT_GT(got.result.drafted, got.result.accepted) << c.name << ": some drafts must also be rejected";
      // Every stage's cache ends as without drafts: the same length and the same bytes.
      LocalStage rlast(w2, kCtx, nullptr);
      LocalStage rmid(w1, kCtx, &rlast);
      HeadStage rhead(w0, kCtx, &rmid);
      o.lookahead = 0;
      (void)Generate(rhead, kPrompt, o);
      o.lookahead = kDefaultLookahead;
      EXPECT_EQ(mid.kv().length(), want.head_length) << c.name;
      EXPECT_EQ(last.kv().length(), want.head_length) << c.name;
      EXPECT_TRUE(SameCachePrefix(mid.kv(), rmid.kv(), info_->spec, want.head_length)) << c.name;
      EXPECT_TRUE(SameCachePrefix(last.kv(), rlast.kv(), info_->spec, want.head_length)) << c.name;
      // The next turn continues from the cached prefix exactly as it would without drafts.
      std::vector<int32_t> next = kPrompt;
      next.insert(next.end(), got.result.ids.begin(), got.result.ids.begin() + got.result.decode_steps);
      next.push_back(403);
      GenerateOptions more = o;
      more.max_tokens = 20;
      more.first_position = head.length();
      const Trace a = Generate(head, next, more);
      more.lookahead = 0;
      more.first_position = rhead.length();
      const Trace b = Generate(rhead, next, more);
      EXPECT_TRUE(SameRun(a, b, &why)) << c.name << " second turn: " << why;
    }
    std::printf("%s: %d of %d drafts accepted (unsplit), %d laps without drafts\n", c.name, accepted, drafted,
                want.result.decode_laps);
    EXPECT_GT(accepted, 0) << c.name;
    EXPECT_GT(drafted, accepted) << c.name;
  }
}

// Stops land inside a lap's drafts: the budget, a stop id, stop_after and the context end the
// turn on the same token as without drafts, and the cache holds the same positions.
TEST_F(StoriesLookahead, EndsOnTheSameTokenAsWithoutDrafts) {
  const StageWeights whole = Load(0, 5);
  GenerateOptions base;
  base.max_tokens = 200;
  HeadStage probe(whole, kCtx, nullptr);
  const Trace full = Generate(probe, kPrompt, base);
  ASSERT_GT(full.result.ids.size(), 60u);
  // Cases: every budget from 1 to 60; a stop id from the middle of the text; stop_after; a
  // short context.
  std::vector<GenerateOptions> cases;
  for (int n = 1; n <= 60; ++n) {
    GenerateOptions o = base;
    o.max_tokens = n;
    cases.push_back(o);
  }
  {
    GenerateOptions o = base;
    o.stop_ids = {full.result.ids[45]};
    cases.push_back(o);
  }
  {
    GenerateOptions o = base;
    int seen = 0;
    o.stop_after = [seen](int32_t) mutable { return ++seen == 37; };
    cases.push_back(o);
  }
  int accepted = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    for (int ctx : {kCtx, 64}) {
      GenerateOptions o = cases[i];
      HeadStage a(whole, ctx, nullptr);
      const Trace want = Generate(a, kPrompt, o);
      o.lookahead = kDefaultLookahead;
      if (o.stop_after) {
        int seen = 0;
        o.stop_after = [seen](int32_t) mutable { return ++seen == 37; };
      }
      HeadStage b(whole, ctx, nullptr);
      const Trace got = Generate(b, kPrompt, o);
      std::string why;
      EXPECT_TRUE(SameRun(want, got, &why)) << "case " << i << ", ctx " << ctx << ": " << why;
      accepted += got.result.accepted;
    }
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace daisy
