// Pipelined prefill (HeadStage::Prefill with several chunks in flight): many small chunks,
// with the head running ahead of the rest of the ring, give the same bits as one chunk —
// the logits, the final hidden row, and every stage's KV cache — split and unsplit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "daisy/forward.h"
#include "daisy/model.h"
#include "test_models.h"

namespace daisy {
namespace {

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The rest of the ring as a pipelined link sees it: Submit only queues, and a batch runs
// when it is collected, so the head embeds and runs its own layers on up to `in_flight`
// later chunks before the stages see an earlier one (as on the ring, where they overlap).
class DeferredLink final : public StageLink {
 public:
  explicit DeferredLink(StageLink& next) : next_(next) {}
  Result<HiddenStates> Run(HiddenStates hidden) override { return next_.Run(std::move(hidden)); }
  Status Submit(HiddenStates hidden) override {
    queued_.push_back(std::move(hidden));
    max_queued_ = std::max(max_queued_, queued_.size());
    return Status::Ok();
  }
  Result<HiddenStates> Collect() override {
    if (queued_.empty()) return Internal("Bug: Collect without a Submit");
    HiddenStates h = std::move(queued_.front());
    queued_.pop_front();
    return next_.Run(std::move(h));
  }
  size_t max_queued() const { return max_queued_; }

 private:
  StageLink& next_;
  std::deque<HiddenStates> queued_;
  size_t max_queued_ = 0;
};

using testing::SameCachePrefix;

TEST(PipelinedPrefill, ManySmallChunksInFlightEqualOneChunk) {
  auto src = OpenLocalFolder(std::string(std::getenv("DAISY_MODELS")) + "/stories260K");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  auto info = LoadModelInfo(**src);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  const ModelSpec& spec = info->spec;
  auto load = [&](int first, int end) {
    auto w = StageWeights::Load(**src, *info, first, end, first == 0);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return std::move(w).value();
  };
  const StageWeights whole = load(0, 5), w0 = load(0, 2), w1 = load(2, 4), w2 = load(4, 5);
  constexpr int kCtx = 256;
  std::vector<int32_t> prompt(200);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % 500) + 3;
  prompt[0] = 1;

  // One chunk on the whole model; one chunk through the split (the caches to compare with).
  HeadStage one(whole, kCtx, nullptr);
  auto want = one.Prefill(prompt, 0, 1);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  const std::vector<float> want_row(one.last_row().begin(), one.last_row().end());
  LocalStage ref_last(w2, kCtx, nullptr);
  LocalStage ref_mid(w1, kCtx, &ref_last);
  HeadStage ref(w0, kCtx, &ref_mid);
  ASSERT_TRUE(ref.Prefill(prompt, 0, 1).ok());

  for (int chunk : {1, 3, 7, 16, 33}) {
    for (int in_flight : {1, 2, 3, 5}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + ", in flight " + std::to_string(in_flight));
      // Unsplit: the head alone (no rest of the ring, so chunks run one after the other).
      HeadStage h(whole, kCtx, nullptr);
      auto got = h.Prefill(prompt, chunk, in_flight);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(SameBits(*got, *want));
      EXPECT_TRUE(SameBits(h.last_row(), want_row));
      // Split 2,2,1 with the head running ahead of the stages by up to in_flight chunks.
      LocalStage last(w2, kCtx, nullptr);
      LocalStage mid(w1, kCtx, &last);
      DeferredLink link(mid);
      HeadStage head(w0, kCtx, &link);
      auto split = head.Prefill(prompt, chunk, in_flight);
      ASSERT_TRUE(split.ok()) << split.status().ToString();
      EXPECT_TRUE(SameBits(*split, *want));
      EXPECT_TRUE(SameBits(head.last_row(), want_row));
      if (in_flight > 1) EXPECT_EQ(link.max_queued(), static_cast<size_t>(in_flight)) << "the chunks did not overlap";
      const int n = static_cast<int>(prompt.size());
      EXPECT_EQ(head.length(), n);
      EXPECT_EQ(mid.kv().length(), ref_mid.kv().length());
      EXPECT_EQ(last.kv().length(), ref_last.kv().length());
      EXPECT_TRUE(SameCachePrefix(mid.kv(), ref_mid.kv(), spec, n));
      EXPECT_TRUE(SameCachePrefix(last.kv(), ref_last.kv(), spec, n));
    }
  }
}

}  // namespace
}  // namespace daisy
