// The bundled stories260K (a real trained Llama) through the engine, loaded from its
// safetensors: agreement with the external f32 reference (logits, greedy ids), splits
// equal to the unsplit run, the KV cache equal to recomputation over 100 tokens, chunked
// prefill equal to one-shot, every backend equal to scalar, and the generation loop's
// finish reasons. The reference data is models/stories260K/reference (README there).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "daisy/forward.h"
#include "daisy/generator.h"
#include "daisy/kernels.h"
#include "daisy/model.h"
#include "test_models.h"

namespace daisy {
namespace {

// Mean KL(p_f32 || p_engine) bound: 2e-3 nats, as the issue asks. Measured: 7.3e-4 with
// two-term P and two-term narrow activations (docs/KERNELS.md); 1.475e-3 with only the
// two-term int8 keys (docs/KERNELS.md, "Attention and the KV cache"); 2.2e-3 with one
// int8 term per key (head_dim 8 makes a per-vector int8 key coarse, and K was the largest
// share of the attention rule's error); 1.36e-3 with f32 attention, close to the W8A8
// emulation's 1.4e-3 in reference/w8a8.json. A real attention bug (a missing V scale, a
// RoPE slip, a wrong residual scale) is orders larger; dropping the residual term fails it.
constexpr double kMaxMeanKl = 2e-3;

// The agreeing greedy prefix every prompt must reach (measured figures are printed).
constexpr int kMinGreedyAgreement = 20;  // measured: 61, 57, 113, 90, 58

std::string ModelDir() {
  return std::string(std::getenv("DAISY_MODELS")) + "/stories260K";  // set by tests/test_env.cc
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class Stories : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto src = OpenLocalFolder(ModelDir());
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
  static LocalPipeline Pipeline(std::vector<int> split, int ctx = 512) {
    auto p = LocalPipeline::Load(*source_, *info_, split, ctx);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return std::move(p).value();
  }
  static ModelSource* source_;
  static ModelInfo* info_;
};
ModelSource* Stories::source_ = nullptr;
ModelInfo* Stories::info_ = nullptr;

TEST_F(Stories, SpecIsTheBundledModel) {
  const ModelSpec& s = info_->spec;
  EXPECT_EQ(s.n_layers, 5);
  EXPECT_EQ(s.hidden, 64);
  EXPECT_EQ(s.n_kv_heads, 4);
  EXPECT_TRUE(s.tied_embeddings);
  LocalPipeline p = Pipeline({5});
  // 260,032 parameters: int8 matrices as two terms (a narrow model, model.h NarrowModel),
  // f32 norms, the exact f32 embedding kept for the lookup beside its int8 copy for the
  // tied LM head.
  ASSERT_TRUE(NarrowModel(s));
  const size_t bytes = p.WeightBytes();
  std::printf("stories260K resident weights: %zu bytes\n", bytes);
  EXPECT_LT(bytes, 260032u * 3);
}

// Teacher-forced logits of the 64-token sequence against the f32 numpy reference.
TEST_F(Stories, AgreesWithF32ReferenceLogits) {
  const nlohmann::json ref = ReadJson(ModelDir() + "/reference/logits.json");
  const std::vector<int32_t> ids = ref["token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 64u);
  const int V = info_->spec.vocab;
  std::vector<float> want(64 * static_cast<size_t>(V));
  {
    std::ifstream f(ModelDir() + "/reference/logits_f32.bin", std::ios::binary);
    ASSERT_TRUE(f.good());
    f.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 4));
    ASSERT_EQ(f.gcount(), static_cast<std::streamsize>(want.size() * 4));
  }
  LocalPipeline p = Pipeline({5});
  auto got = p.head().ForwardAll(ids, 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), want.size());
  int agree = 0;
  double kl_sum = 0, kl_max = 0;
  for (int i = 0; i < 64; ++i) {
    std::span<const float> a(&want[static_cast<size_t>(i) * V], static_cast<size_t>(V));
    std::span<const float> b(&(*got)[static_cast<size_t>(i) * V], static_cast<size_t>(V));
    agree += testing::Argmax(a) == testing::Argmax(b);
    // log-softmax in double (a measurement, not part of the engine)
    auto log_softmax = [](std::span<const float> x) {
      double m = x[0];
      for (float v : x) m = std::max(m, static_cast<double>(v));
      double s = 0;
      for (float v : x) s += std::exp(v - m);
      std::vector<double> out;
      for (float v : x) out.push_back(v - m - std::log(s));
      return out;
    };
    const auto la = log_softmax(a), lb = log_softmax(b);
    double kl = 0;
    for (int j = 0; j < V; ++j)
      kl += std::exp(la[static_cast<size_t>(j)]) * (la[static_cast<size_t>(j)] - lb[static_cast<size_t>(j)]);
    kl_sum += kl;
    kl_max = std::max(kl_max, kl);
  }
  const double top1 = agree / 64.0, kl_mean = kl_sum / 64;
  std::printf("stories260K vs f32 reference: top-1 agreement %d/64 (%.1f%%), mean KL %.3e nats, max KL %.3e\n", agree,
              100 * top1, kl_mean, kl_max);
  RecordProperty("top1_agreement", std::to_string(top1));
  RecordProperty("mean_kl", std::to_string(kl_mean));
  EXPECT_GE(top1, 0.98);
  EXPECT_LE(kl_mean, kMaxMeanKl);
}

// Greedy decoding against llama2.c run.c's f32 ids. int8 legitimately diverges after a few
// dozen tokens where the f32 top-2 logits are close (reference/w8a8.json), so this counts
// the agreeing prefix and asserts a floor per prompt.
TEST_F(Stories, GreedyAgreesWithReferencePrefix) {
  const nlohmann::json ref = ReadJson(ModelDir() + "/reference/greedy.json");
  LocalPipeline p = Pipeline({5});
  int total = 0;
  int min_agree = 1 << 30;
  for (const auto& pr : ref["prompts"]) {
    const std::vector<int32_t> prompt = pr["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> cont = pr["continuation_ids"].get<std::vector<int32_t>>();
    const int n = static_cast<int>(cont.size());
    auto ids = testing::GreedyDecode(p.head(), prompt, n);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    int agree = 0;
    while (agree < n && (*ids)[static_cast<size_t>(agree)] == cont[static_cast<size_t>(agree)]) ++agree;
    std::printf("greedy \"%s\": %d of %d reference tokens agree before the first divergence\n",
                pr["prompt"].get<std::string>().c_str(), agree, n);
    total += agree;
    min_agree = std::min(min_agree, agree);
  }
  std::printf("greedy agreement: %d tokens over 5 prompts, at least %d each\n", total, min_agree);
  RecordProperty("greedy_agree_total", total);
  RecordProperty("greedy_agree_min", min_agree);
  EXPECT_GE(min_agree, kMinGreedyAgreement);
}

TEST_F(Stories, SplitsEqualUnsplitAndMutationsAreCaught) {
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};  // "Once upon a time"-like ids
  LocalPipeline whole = Pipeline({5});
  std::vector<std::vector<float>> want_logits;
  auto want = testing::GreedyDecode(whole.head(), prompt, 60, &want_logits);
  ASSERT_TRUE(want.ok());
  EXPECT_GT(std::set<int32_t>(want->begin(), want->end()).size(), 10u);
  auto same = [&](HeadStage& head) {
    std::vector<std::vector<float>> logits;
    auto ids = testing::GreedyDecode(head, prompt, 60, &logits);
    if (!ids.ok() || *ids != *want) return false;
    for (size_t i = 0; i < logits.size(); ++i)
      if (!SameBits(logits[i], want_logits[i])) return false;
    return true;
  };
  for (std::vector<int> split : {std::vector<int>{2, 2, 1}, {0, 1, 4}, {0, 2, 3}, {1, 1, 1, 1, 1}, {0, 5}}) {
    LocalPipeline p = Pipeline(split);
    for (int i = 0; i < p.n_stages(); ++i) {
      EXPECT_EQ(p.weights(i).has_head(), i == 0);
      EXPECT_EQ(p.weights(i).end() - p.weights(i).first(), split[static_cast<size_t>(i)]);
    }
    EXPECT_TRUE(same(p.head())) << "split " << ::testing::PrintToString(split);
  }
  // Mutations: a middle stage that drops its last layer; two stages out of order.
  auto w0 = StageWeights::Load(*source_, *info_, 0, 2, true);
  auto w1 = StageWeights::Load(*source_, *info_, 2, 4, false);
  auto w2 = StageWeights::Load(*source_, *info_, 4, 5, false);
  ASSERT_TRUE(w0.ok() && w1.ok() && w2.ok());
  struct Dropping final : StageLink {
    const StageWeights& w;
    KvCache kv;
    StageLink* next;
    Dropping(const StageWeights& w_, StageLink* n) : w(w_), kv(w_.spec(), w_.first(), w_.end(), 512), next(n) {}
    Result<HiddenStates> Run(HiddenStates h) override {
      DAISY_RETURN_IF_ERROR(RunLayers(w, w.first(), w.end() - 1, h, kv));
      return next->Run(std::move(h));
    }
  };
  {
    LocalStage last(*w2, 512, nullptr);
    LocalStage mid(*w1, 512, &last);
    HeadStage head(*w0, 512, &mid);
    EXPECT_TRUE(same(head)) << "the honest hand-built chain";
  }
  {
    LocalStage last(*w2, 512, nullptr);
    Dropping mid(*w1, &last);
    HeadStage head(*w0, 512, &mid);
    EXPECT_FALSE(same(head)) << "a dropped layer went unnoticed";
  }
  {
    LocalStage mid(*w1, 512, nullptr);
    LocalStage last(*w2, 512, &mid);
    HeadStage head(*w0, 512, &last);
    EXPECT_FALSE(same(head)) << "stages out of order went unnoticed";
  }
}

TEST_F(Stories, KvCacheEqualsRecomputeOver100Tokens) {
  LocalPipeline cached = Pipeline({5});
  LocalPipeline fresh = Pipeline({2, 3});
  std::vector<int32_t> seq = {1, 403, 407, 261};
  std::vector<std::vector<float>> steps;
  auto gen = testing::GreedyDecode(cached.head(), seq, 100, &steps);
  ASSERT_TRUE(gen.ok());
  for (int i = 0; i < 100; ++i) {
    auto full = fresh.head().Forward(seq, 0);  // the whole window, recomputed from scratch
    ASSERT_TRUE(full.ok());
    ASSERT_TRUE(SameBits(*full, steps[static_cast<size_t>(i)])) << "decode step " << i;
    seq.push_back((*gen)[static_cast<size_t>(i)]);
  }
}

TEST_F(Stories, ChunkedPrefillEqualsOneShot) {
  const nlohmann::json ref = ReadJson(ModelDir() + "/reference/logits.json");
  const std::vector<int32_t> ids = ref["token_ids"].get<std::vector<int32_t>>();
  LocalPipeline a = Pipeline({5});
  LocalPipeline b = Pipeline({1, 4});
  auto one = a.head().ForwardAll(ids, 0);
  ASSERT_TRUE(one.ok());
  std::vector<float> chunked;
  for (size_t at = 0; at < ids.size(); at += 16) {
    auto l = b.head().ForwardAll(std::span<const int32_t>(ids).subspan(at, 16), static_cast<int>(at));
    ASSERT_TRUE(l.ok());
    chunked.insert(chunked.end(), l->begin(), l->end());
  }
  EXPECT_TRUE(SameBits(*one, chunked));
  // Through the generation loop: chunks of 16 vs one shot, same tokens and logits.
  std::vector<std::vector<float>> la, lb;
  GenerateOptions o;
  o.max_tokens = 30;
  auto ga = Generator(a.head()).Generate(
      ids, o, [&](int32_t, std::span<const float> l) { la.emplace_back(l.begin(), l.end()); });
  o.prefill_chunk = 16;
  auto gb = Generator(b.head()).Generate(
      ids, o, [&](int32_t, std::span<const float> l) { lb.emplace_back(l.begin(), l.end()); });
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_EQ(ga->ids, gb->ids);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) EXPECT_TRUE(SameBits(la[i], lb[i])) << i;
}

TEST_F(Stories, EveryBackendEqualsScalar) {
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  const kernels::Backend before = kernels::ActiveBackend();
  ASSERT_TRUE(kernels::SetBackend(kernels::Backend::kScalar).ok());
  std::vector<std::vector<float>> ref;
  LocalPipeline p = Pipeline({5});
  auto want = testing::GreedyDecode(p.head(), prompt, 40, &ref);
  ASSERT_TRUE(want.ok());
  int compared = 0;
  for (const auto& st : kernels::BackendReport()) {
    if (st.backend == kernels::Backend::kScalar || !st.supported || !st.gate_passed) continue;
    ASSERT_TRUE(kernels::SetBackend(st.backend).ok());
    std::vector<std::vector<float>> got;
    auto ids = testing::GreedyDecode(p.head(), prompt, 40, &got);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, *want) << kernels::BackendName(st.backend);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(SameBits(got[i], ref[i])) << kernels::BackendName(st.backend);
    ++compared;
  }
  ASSERT_TRUE(kernels::SetBackend(before).ok());
  std::printf("compared %d SIMD backend(s) with scalar\n", compared);
  if (compared == 0) GTEST_SKIP() << "no SIMD backend is supported on this CPU";
}

// The cross-ISA guarantee for the whole forward pass, not only the kernels: a 64-bit digest
// of the teacher-forced logits of the reference sequence and of a 60-token greedy run (ids
// and every logit bit) on every backend this CPU has, against one value computed by the
// x86-64 build. scripts/test-arm64.sh runs this test under qemu-aarch64 (NEON and scalar),
// so arm64 must give exactly x86's bits. Change kGolden only with a deliberate change of the
// arithmetic (docs/KERNELS.md), never to make one ISA pass.
TEST_F(Stories, LogitsMatchX86GoldenDigestOnEveryBackend) {
  constexpr uint64_t kGolden = 0x9ca58431df672941ULL;  // x86-64, scalar = AVX2 = AVX-512 VNNI
  const nlohmann::json ref = ReadJson(ModelDir() + "/reference/logits.json");
  const std::vector<int32_t> ids = ref["token_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  // FNV-1a over bytes: fixed, platform-independent, and needs no library in the cross build.
  auto fnv = [](uint64_t h, const void* data, size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
  };
  const kernels::Backend before = kernels::ActiveBackend();
  int checked = 0;
  for (const auto& st : kernels::BackendReport()) {
    if (!st.supported || !st.gate_passed) continue;
    ASSERT_TRUE(kernels::SetBackend(st.backend).ok());
    LocalPipeline p = Pipeline({5});
    uint64_t h = 0xcbf29ce484222325ULL;
    auto all = p.head().ForwardAll(ids, 0);
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    h = fnv(h, all->data(), all->size() * sizeof(float));
    LocalPipeline q = Pipeline({5});
    std::vector<std::vector<float>> logits;
    auto gen = testing::GreedyDecode(q.head(), prompt, 60, &logits);
    ASSERT_TRUE(gen.ok()) << gen.status().ToString();
    h = fnv(h, gen->data(), gen->size() * sizeof(int32_t));
    for (const auto& l : logits) h = fnv(h, l.data(), l.size() * sizeof(float));
    std::printf("stories260K digest on %s: 0x%016llx\n", std::string(kernels::BackendName(st.backend)).c_str(),
                static_cast<unsigned long long>(h));
    EXPECT_EQ(h, kGolden) << kernels::BackendName(st.backend) << " gives other bits than x86-64";
    ++checked;
  }
  ASSERT_TRUE(kernels::SetBackend(before).ok());
  EXPECT_GE(checked, 1);  // scalar at least
}

TEST_F(Stories, GeneratorFinishReasons) {
  LocalPipeline p = Pipeline({5}, 64);
  Generator gen(p.head());
  const std::vector<int32_t> prompt = {1, 403, 407, 261};
  GenerateOptions o;
  o.max_tokens = 12;
  auto r = gen.Generate(prompt, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->ids.size(), 12u);
  EXPECT_EQ(r->finish_reason, FinishReason::kLength);
  EXPECT_EQ(r->decode_steps, 11);
  // A stop id ends the turn and is not part of the ids.
  o.stop_ids = {r->ids[5]};
  auto s = gen.Generate(prompt, o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->finish_reason, FinishReason::kStop);
  EXPECT_EQ(s->stop_id, r->ids[5]);
  const auto first = std::find(r->ids.begin(), r->ids.end(), r->ids[5]);
  EXPECT_EQ(s->ids, std::vector<int32_t>(r->ids.begin(), first));
  // A full context ends with "length": 64 positions hold the prompt and 60 new tokens.
  o.stop_ids.clear();
  o.max_tokens = 1000;
  auto c = gen.Generate(prompt, o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->finish_reason, FinishReason::kLength);
  EXPECT_EQ(c->ids.size(), 60u);
  // Sampling is a function of (seed, position): the same seed replays the same tokens.
  o.max_tokens = 20;
  o.sampling.temperature = 1.0f;
  o.sampling.top_p = 0.9f;
  auto t1 = gen.Generate(prompt, o);
  auto t2 = gen.Generate(prompt, o);
  o.sampling.seed = 99;
  auto t3 = gen.Generate(prompt, o);
  ASSERT_TRUE(t1.ok() && t2.ok() && t3.ok());
  EXPECT_EQ(t1->ids, t2->ids);
  EXPECT_NE(t1->ids, t3->ids);
  // Refusals: an empty prompt, a prompt longer than the context, bad sampling settings.
  EXPECT_FALSE(gen.Generate({}, o).ok());
  EXPECT_FALSE(gen.Generate(std::vector<int32_t>(65, 5), o).ok());
  o.sampling.temperature = -1;
  EXPECT_FALSE(gen.Generate(prompt, o).ok());
}

}  // namespace
}  // namespace daisy
