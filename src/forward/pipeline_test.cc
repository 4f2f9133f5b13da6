// Split equivalence on models written to disk by the model maker (tools/model_maker.h) and
// loaded through safetensors like any Hub folder: a random 30-layer Llama (BF16 weights, so
// the 2-byte embedding path runs) and a small random GPT-2 (Conv1D layout, fused c_attn,
// LayerNorm with bias, learned positions, gelu_new).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "daisy/forward.h"
#include "daisy/generator.h"
#include "daisy/kernels.h"
#include "daisy/model.h"
#include "model_maker.h"
#include "test_models.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A model folder made once per test suite, removed at the end.
struct MadeModel {
  std::string dir;
  std::unique_ptr<ModelSource> source;
  std::unique_ptr<ModelInfo> info;

  static std::unique_ptr<MadeModel> Make(const std::string& preset) {
    auto m = std::make_unique<MadeModel>();
    m->dir = (fs::path(::testing::TempDir()) / ("daisy_forward_" + preset + "_" + std::to_string(getpid()))).string();
    modelmaker::MakeOptions o;
    o.seed = 7;
    const Status st = modelmaker::MakeModel(modelmaker::PresetShape(preset), m->dir, o);
    EXPECT_TRUE(st.ok()) << st.ToString();
    auto src = OpenLocalFolder(m->dir);
    EXPECT_TRUE(src.ok()) << src.status().ToString();
    if (!src.ok()) return nullptr;
    auto info = LoadModelInfo(**src);
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    if (!info.ok()) return nullptr;
    m->source = std::move(*src);
    m->info = std::make_unique<ModelInfo>(std::move(*info));
    return m;
  }
  ~MadeModel() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
  LocalPipeline Pipeline(std::vector<int> split, int ctx = 256) const {
    auto p = LocalPipeline::Load(*source, *info, split, ctx);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return std::move(p).value();
  }
};

struct Trace {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits;
  bool operator==(const Trace& o) const {
    if (ids != o.ids || logits.size() != o.logits.size()) return false;
    for (size_t i = 0; i < logits.size(); ++i)
      if (!SameBits(logits[i], o.logits[i])) return false;
    return true;
  }
};

Trace Greedy(HeadStage& head, std::span<const int32_t> prompt, int n) {
  Trace t;
  auto ids = testing::GreedyDecode(head, prompt, n, &t.logits);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  if (ids.ok()) t.ids = *ids;
  return t;
}

// A middle stage that skips its last layer (mutation 1).
class DroppingStage final : public StageLink {
 public:
  DroppingStage(const StageWeights& w, int ctx, StageLink* next)
      : w_(w), kv_(w.spec(), w.first(), w.end(), ctx), next_(next) {}
  Result<HiddenStates> Run(HiddenStates h) override {
    DAISY_RETURN_IF_ERROR(RunLayers(w_, w_.first(), w_.end() - 1, h, kv_));
    return next_ ? next_->Run(std::move(h)) : Result<HiddenStates>(std::move(h));
  }

 private:
  const StageWeights& w_;
  KvCache kv_;
  StageLink* next_;
};

class Random30 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = MadeModel::Make("tiny-llama-30").release(); }
  static void TearDownTestSuite() { delete model_; }
  static MadeModel* model_;
};
MadeModel* Random30::model_ = nullptr;

TEST_F(Random30, SplitsEqualUnsplit) {
  ASSERT_NE(model_, nullptr);
  ASSERT_EQ(model_->info->spec.n_layers, 30);
  const std::vector<int32_t> prompt = {1, 17, 300, 45, 9, 128, 77};
  LocalPipeline whole = model_->Pipeline({30});
  const Trace want = Greedy(whole.head(), prompt, 24);
  for (std::vector<int> split : {std::vector<int>{10, 10, 10}, {1, 14, 15}, {0, 15, 15}, {5, 5, 5, 5, 5, 5}}) {
    LocalPipeline p = model_->Pipeline(split);
    size_t layer_bytes = 0;
    for (int i = 0; i < p.n_stages(); ++i) {
      // Each stage holds its own range and nothing else; only stage 0 has the head.
      const StageWeights& w = p.weights(i);
      EXPECT_EQ(w.end() - w.first(), split[static_cast<size_t>(i)]);
      EXPECT_EQ(w.has_head(), i == 0);
      layer_bytes += w.Bytes() - (w.has_head() ? w.head().Bytes() : 0);
    }
    EXPECT_EQ(layer_bytes, whole.weights(0).Bytes() - whole.weights(0).head().Bytes());
    EXPECT_TRUE(want == Greedy(p.head(), prompt, 24)) << ::testing::PrintToString(split);
  }
}

TEST_F(Random30, MutationsMakeTheComparisonFail) {
  ASSERT_NE(model_, nullptr);
  const std::vector<int32_t> prompt = {1, 17, 300, 45, 9, 128, 77};
  LocalPipeline whole = model_->Pipeline({30});
  const Trace want = Greedy(whole.head(), prompt, 24);
  auto w0 = StageWeights::Load(*model_->source, *model_->info, 0, 10, true);
  auto w1 = StageWeights::Load(*model_->source, *model_->info, 10, 20, false);
  auto w2 = StageWeights::Load(*model_->source, *model_->info, 20, 30, false);
  ASSERT_TRUE(w0.ok() && w1.ok() && w2.ok());
  {
    LocalStage last(*w2, 256, nullptr);
    LocalStage mid(*w1, 256, &last);
    HeadStage head(*w0, 256, &mid);
    EXPECT_TRUE(want == Greedy(head, prompt, 24)) << "the honest hand-built chain";
  }
  {
    LocalStage last(*w2, 256, nullptr);
    DroppingStage mid(*w1, 256, &last);
    HeadStage head(*w0, 256, &mid);
    EXPECT_FALSE(want == Greedy(head, prompt, 24)) << "a dropped layer went unnoticed";
  }
  {
    LocalStage mid(*w1, 256, nullptr);
    LocalStage last(*w2, 256, &mid);
    HeadStage head(*w0, 256, &last);
    EXPECT_FALSE(want == Greedy(head, prompt, 24)) << "stages out of order went unnoticed";
  }
}

TEST_F(Random30, KvCacheAndChunkingAreExact) {
  ASSERT_NE(model_, nullptr);
  LocalPipeline cached = model_->Pipeline({10, 20});
  LocalPipeline fresh = model_->Pipeline({30});
  std::vector<int32_t> seq = {1, 5, 99};
  std::vector<std::vector<float>> steps;
  auto gen = testing::GreedyDecode(cached.head(), seq, 30, &steps);
  ASSERT_TRUE(gen.ok());
  for (size_t i = 0; i < steps.size(); ++i) {
    auto full = fresh.head().Forward(seq, 0);
    ASSERT_TRUE(full.ok());
    ASSERT_TRUE(SameBits(*full, steps[i])) << "step " << i;
    seq.push_back((*gen)[i]);
  }
  // Prefill in chunks of 16 through the generator equals one shot.
  GenerateOptions o;
  o.max_tokens = 10;
  std::vector<int32_t> prompt(50);
  for (int i = 0; i < 50; ++i) prompt[static_cast<size_t>(i)] = (i * 37 + 3) % 512;
  std::vector<std::vector<float>> a, b;
  auto ra = Generator(fresh.head()).Generate(prompt, o, [&](int32_t, std::span<const float> l) {
    a.emplace_back(l.begin(), l.end());
  });
  o.prefill_chunk = 16;
  auto rb = Generator(cached.head()).Generate(prompt, o, [&](int32_t, std::span<const float> l) {
    b.emplace_back(l.begin(), l.end());
  });
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(ra->ids, rb->ids);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(SameBits(a[i], b[i])) << i;
}

TEST_F(Random30, WeightsAreAboutOneBytePerParameter) {
  ASSERT_NE(model_, nullptr);
  auto w = StageWeights::Load(*model_->source, *model_->info, 3, 9, false);
  ASSERT_TRUE(w.ok());
  uint64_t params = 0;
  for (int l = 3; l < 9; ++l)
    for (const auto& name : LayerTensorNames(model_->info->spec, l))
      params += model_->info->index.Find(name)->Elements();
  // int8 plus one f32 scale per 64-wide row (1/16 byte per parameter) and f32 norms.
  EXPECT_LE(static_cast<double>(w->Bytes()), 1.15 * static_cast<double>(params));
  // The head keeps the BF16 embedding at 2 bytes for exact lookups, beside the int8 copy.
  auto h = StageWeights::Load(*model_->source, *model_->info, 0, 0, true);
  ASSERT_TRUE(h.ok());
  const ModelSpec& s = model_->info->spec;
  EXPECT_EQ(h->head().embed.Bytes(), 2u * static_cast<size_t>(s.vocab) * static_cast<size_t>(s.hidden));
}

class Gpt2Small : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = MadeModel::Make("gpt2-small-test").release(); }
  static void TearDownTestSuite() { delete model_; }
  static MadeModel* model_;
};
MadeModel* Gpt2Small::model_ = nullptr;

TEST_F(Gpt2Small, RunsWithKvCacheEqualToRecompute) {
  ASSERT_NE(model_, nullptr);
  const ModelSpec& s = model_->info->spec;
  ASSERT_EQ(s.family, Family::kGpt2);
  LocalPipeline cached = model_->Pipeline({s.n_layers});
  LocalPipeline fresh = model_->Pipeline({s.n_layers});
  std::vector<int32_t> seq = {s.vocab - 1, 40, 41, 300};
  std::vector<std::vector<float>> steps;
  auto gen = testing::GreedyDecode(cached.head(), seq, 40, &steps);
  ASSERT_TRUE(gen.ok()) << gen.status().ToString();
  for (size_t i = 0; i < steps.size(); ++i) {
    auto full = fresh.head().Forward(seq, 0);
    ASSERT_TRUE(full.ok());
    ASSERT_TRUE(SameBits(*full, steps[i])) << "step " << i;
    seq.push_back((*gen)[i]);
  }
}

TEST_F(Gpt2Small, SplitsEqualUnsplit) {
  ASSERT_NE(model_, nullptr);
  const ModelSpec& s = model_->info->spec;
  ASSERT_EQ(s.n_layers, 4);
  const std::vector<int32_t> prompt = {s.vocab - 1, 10, 200, 33, 7};
  LocalPipeline whole = model_->Pipeline({4});
  const Trace want = Greedy(whole.head(), prompt, 30);
  for (std::vector<int> split : {std::vector<int>{1, 2, 1}, {0, 4}, {2, 2}, {0, 1, 1, 1, 1}}) {
    LocalPipeline p = model_->Pipeline(split);
    EXPECT_TRUE(want == Greedy(p.head(), prompt, 30)) << ::testing::PrintToString(split);
  }
  // The learned positions end at n_positions: the context is capped there.
  EXPECT_EQ(DefaultContext(s), s.max_positions);
}

TEST_F(Gpt2Small, EveryBackendEqualsScalar) {
  ASSERT_NE(model_, nullptr);
  const std::vector<int32_t> prompt = {model_->info->spec.vocab - 1, 10, 200, 33, 7, 8, 9, 10, 11};
  const kernels::Backend before = kernels::ActiveBackend();
  ASSERT_TRUE(kernels::SetBackend(kernels::Backend::kScalar).ok());
  LocalPipeline p = model_->Pipeline({4});
  const Trace want = Greedy(p.head(), prompt, 20);
  int compared = 0;
  for (const auto& st : kernels::BackendReport()) {
    if (st.backend == kernels::Backend::kScalar || !st.supported || !st.gate_passed) continue;
    ASSERT_TRUE(kernels::SetBackend(st.backend).ok());
    EXPECT_TRUE(want == Greedy(p.head(), prompt, 20)) << kernels::BackendName(st.backend);
    ++compared;
  }
  ASSERT_TRUE(kernels::SetBackend(before).ok());
  if (compared == 0) GTEST_SKIP() << "no SIMD backend is supported on this CPU";
}

}  // namespace
}  // namespace daisy
