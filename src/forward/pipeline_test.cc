// Split equivalence on models written to disk by the model maker (tools/model_maker.h) and
// loaded through safetensors like any Hub folder: a random 30-layer Llama (BF16 weights, so
// the 2-byte embedding path runs) and a small random GPT-2 (Conv1D layout, fused c_attn,
// LayerNorm with bias, learned positions, gelu_new).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
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
    modelmaker::MakeOptions o;
    o.seed = 7;
    return Make(modelmaker::PresetShape(preset), o, preset);
  }
  static std::unique_ptr<MadeModel> Make(const modelmaker::ModelShape& shape, const modelmaker::MakeOptions& o,
                                         const std::string& tag) {
    auto m = std::make_unique<MadeModel>();
    m->dir = (fs::path(::testing::TempDir()) / ("daisy_forward_" + tag + "_" + std::to_string(getpid()))).string();
    const Status st = modelmaker::MakeModel(shape, m->dir, o);
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
  // int8 plus one f32 scale per 64-wide row (1/16 byte per parameter) and f32 norms, per
  // term: this 64-wide model is narrow (model.h NarrowModel), so its matrices hold two.
  ASSERT_TRUE(NarrowModel(model_->info->spec));
  EXPECT_GE(static_cast<double>(w->Bytes()), 2.0 * static_cast<double>(params));
  EXPECT_LE(static_cast<double>(w->Bytes()), 2.25 * static_cast<double>(params));
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

// --- Streaming load -------------------------------------------------------------------
// StageWeights::Load converts every block of rows as it arrives (docs/FORWARD.md,
// "Loading"). These models make tensors span many blocks: Qwen2's 151936-row vocabulary
// (tied embedding, q/k/v biases) in BF16 and F32, and a GPT-2 layer of width 768 whose
// Conv1D weights are quantized from their staged bytes in several row blocks.

using kernels::QuantizedMatrix;

modelmaker::ModelShape WideQwen(int hidden) {
  modelmaker::ModelShape s = modelmaker::PresetShape("qwen2.5-0.5b");
  s.hidden = hidden, s.intermediate = 2 * hidden, s.n_heads = 2, s.n_kv_heads = 1, s.head_dim = hidden / 2;
  return s;
}

modelmaker::ModelShape WideGpt2() {
  modelmaker::ModelShape s = modelmaker::PresetShape("gpt2-small-test");
  s.hidden = 768, s.intermediate = 3072, s.n_heads = 12, s.n_kv_heads = 12, s.head_dim = 64;
  return s;
}

class StreamingLoad : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    modelmaker::MakeOptions o;
    o.seed = 11;
    o.n_layers = 2;
    wide_bf16_ = MadeModel::Make(WideQwen(128), o, "wide_bf16").release();
    o.dtype = modelmaker::WeightDType::kF32;
    o.n_layers = 1;
    wide_f32_ = MadeModel::Make(WideQwen(64), o, "wide_f32").release();
    o.dtype = modelmaker::WeightDType::kBF16;
    gpt2_wide_ = MadeModel::Make(WideGpt2(), o, "gpt2_wide").release();
  }
  static void TearDownTestSuite() {
    delete wide_bf16_;
    delete wide_f32_;
    delete gpt2_wide_;
  }
  static MadeModel* wide_bf16_;
  static MadeModel* wide_f32_;
  static MadeModel* gpt2_wide_;
};
MadeModel* StreamingLoad::wide_bf16_ = nullptr;
MadeModel* StreamingLoad::wide_f32_ = nullptr;
MadeModel* StreamingLoad::gpt2_wide_ = nullptr;

bool SameMatrix(const QuantizedMatrix& a, const QuantizedMatrix& b) {
  return a.n == b.n && a.k == b.k && a.q == b.q && SameBits(a.scale, b.scale) && SameBits(a.bias, b.bias);
}

// What loading gave before it streamed: each whole tensor widened to f32 (FetchTensors),
// Conv1D transposed, QuantizeMatrix, parts stacked. The streamed weights must hold the
// same bits, and the embedding rows the file's exact values.
void ExpectSameAsWholeTensors(const MadeModel& m) {
  const ModelSpec& s = m.info->spec;
  auto w = StageWeights::Load(*m.source, *m.info, 0, s.n_layers, true);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  HostTensors all;
  ASSERT_TRUE(FetchTensors(*m.source, m.info->index, StageTensorNames(s, 0, s.n_layers, true),
                           [&](const TensorInfo& t, std::span<const float> v) {
                             all[t.name] = HostTensor{t.shape, {v.begin(), v.end()}};
                             return Status::Ok();
                           })
                  .ok());
  // Layer weights follow the family's layout; the embedding and LM head are (vocab, hidden).
  auto quant = [&](const std::string& name, bool layer = true) {
    const HostTensor& t = all.at(name);
    int64_t rows = t.shape[0], cols = t.shape[1];
    std::vector<float> v = t.values;
    if (layer && s.layout == WeightLayout::kInOut) {  // (in, out) -> (out, in)
      std::swap(rows, cols);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          v[static_cast<size_t>(r * cols + c)] = t.values[static_cast<size_t>(c * rows + r)];
    }
    auto q = kernels::QuantizeMatrix(v, static_cast<int>(rows), static_cast<int>(cols), {}, name);
    EXPECT_TRUE(q.ok()) << name;
    return q.ok() ? std::move(*q) : QuantizedMatrix{};
  };
  auto stack = [](std::vector<QuantizedMatrix> parts) {
    QuantizedMatrix out = std::move(parts[0]);
    for (size_t i = 1; i < parts.size(); ++i) {
      out.n += parts[i].n;
      out.q.insert(out.q.end(), parts[i].q.begin(), parts[i].q.end());
      out.scale.insert(out.scale.end(), parts[i].scale.begin(), parts[i].scale.end());
    }
    return out;
  };
  auto bias = [&](std::initializer_list<const std::string*> names) {
    std::vector<float> b;
    for (const std::string* n : names)
      if (!n->empty() && all.count(*n)) b.insert(b.end(), all.at(*n).values.begin(), all.at(*n).values.end());
    return b;
  };
  for (int l = 0; l < s.n_layers; ++l) {
    const LayerNames n = NamesForLayer(s, l);
    const LayerWeights& lw = w->layer(l);
    QuantizedMatrix qkv = s.fused_qkv ? quant(n.q) : stack({quant(n.q), quant(n.k), quant(n.v)});
    qkv.bias = bias({&n.q_bias, &n.k_bias, &n.v_bias});
    EXPECT_TRUE(SameMatrix(lw.qkv, qkv)) << "layer " << l << " qkv";
    QuantizedMatrix o = quant(n.o);
    o.bias = bias({&n.o_bias});
    EXPECT_TRUE(SameMatrix(lw.o, o)) << "layer " << l << " o";
    QuantizedMatrix gate_up = s.gated_mlp ? stack({quant(n.gate), quant(n.up)}) : quant(n.up);
    gate_up.bias = bias({&n.up_bias});
    EXPECT_TRUE(SameMatrix(lw.gate_up, gate_up)) << "layer " << l << " gate_up";
    QuantizedMatrix down = quant(n.down);
    down.bias = bias({&n.down_bias});
    EXPECT_TRUE(SameMatrix(lw.down, down)) << "layer " << l << " down";
    EXPECT_TRUE(SameBits(lw.attn_norm, all.at(n.attn_norm).values));
    EXPECT_TRUE(SameBits(lw.mlp_norm, all.at(n.mlp_norm).values));
  }
  const HeadNames h = NamesForHead(s);
  const HeadWeights& head = w->head();
  EXPECT_TRUE(SameMatrix(head.lm_head, quant(s.tied_embeddings ? h.embed : h.lm_head, false)));
  EXPECT_TRUE(SameBits(head.final_norm, all.at(h.final_norm).values));
  if (s.learned_positions) {
    EXPECT_TRUE(SameBits(head.positions, all.at(h.positions).values));
  }
  const std::vector<float>& table = all.at(h.embed).values;
  ASSERT_EQ(head.embed.rows(), s.vocab);
  std::vector<float> row(static_cast<size_t>(s.hidden));
  for (int r = 0; r < s.vocab; ++r) {
    head.embed.Row(r, row.data());
    ASSERT_TRUE(SameBits(row, std::span<const float>(table).subspan(static_cast<size_t>(r) * row.size(), row.size())))
        << "embedding row " << r;
  }
}

TEST_F(StreamingLoad, Bf16BitsEqualQuantizingWholeTensors) {
  ASSERT_NE(wide_bf16_, nullptr);
  ExpectSameAsWholeTensors(*wide_bf16_);
  // The embedding is held as the file's BF16 values: 2 bytes each, never widened.
  const ModelSpec& s = wide_bf16_->info->spec;
  auto h = StageWeights::Load(*wide_bf16_->source, *wide_bf16_->info, 0, 0, true);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->head().embed.Bytes(), 2u * static_cast<size_t>(s.vocab) * static_cast<size_t>(s.hidden));
}

TEST_F(StreamingLoad, F32BitsEqualQuantizingWholeTensors) {
  ASSERT_NE(wide_f32_, nullptr);
  ExpectSameAsWholeTensors(*wide_f32_);
}

TEST_F(StreamingLoad, Gpt2Conv1DBitsEqualQuantizingWholeTensors) {
  ASSERT_NE(gpt2_wide_, nullptr);
  ExpectSameAsWholeTensors(*gpt2_wide_);
}

// The ring reads load progress as liveness: Load must tick at least once per tensor, and
// many times while a big tensor (here the 151936-row embedding, 19 blocks) is converted,
// not once after it.
TEST_F(StreamingLoad, ProgressTicksPerTensorAndPerBlock) {
  ASSERT_NE(wide_bf16_, nullptr);
  const ModelSpec& s = wide_bf16_->info->spec;
  const std::vector<std::string> names = StageTensorNames(s, 0, s.n_layers, true);
  std::vector<uint64_t> ticks;
  uint64_t total = 0;
  auto w =
      StageWeights::Load(*wide_bf16_->source, *wide_bf16_->info, 0, s.n_layers, true, [&](const TransferProgress& p) {
        ticks.push_back(p.bytes_done);
        total = p.bytes_total;
      });
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(std::is_sorted(ticks.begin(), ticks.end()));
  ASSERT_FALSE(ticks.empty());
  EXPECT_EQ(ticks.back(), total);
  EXPECT_GE(ticks.size(), names.size());
  // Ticks while the embedding's bytes are consumed: at least one per block of rows.
  uint64_t first_offset = UINT64_MAX;
  for (const std::string& n : names) first_offset = std::min(first_offset, wide_bf16_->info->index.Find(n)->offset);
  const TensorInfo* e = wide_bf16_->info->index.Find(NamesForHead(s).embed);
  const uint64_t begin = e->offset - first_offset, end = begin + e->bytes;
  const int64_t rows_per_block = static_cast<int64_t>(kTensorBlockBytes / sizeof(float)) / s.hidden;
  const int64_t blocks = (s.vocab + rows_per_block - 1) / rows_per_block;
  ASSERT_GE(blocks, 10);
  const auto during = std::count_if(ticks.begin(), ticks.end(), [&](uint64_t t) { return t > begin && t <= end; });
  EXPECT_GE(during, blocks);
}

}  // namespace
}  // namespace daisy
