// The forward pass on small seeded models held in memory: the KV cache against full
// recomputation, chunked against one-shot prefill, splits against the unsplit run (with
// two mutations that must be caught), the sliding window, biases, RoPE scaling, non-finite
// refusal, and every SIMD backend against scalar. Everything compares bits.
#include "daisy/forward.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <numeric>
#include <set>

#include "daisy/kernels.h"
#include "test_models.h"

namespace daisy {
namespace {

using testing::Argmax;
using testing::GreedyDecode;
using testing::RandomTensors;
using testing::TinyGpt2Spec;
using testing::TinyLlamaSpec;

std::vector<int32_t> Prompt(const ModelSpec& s, int n, uint64_t seed) {
  testing::SplitMix rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(s.vocab));
  return ids;
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

LocalPipeline MustPipeline(const ModelSpec& s, const HostTensors& t, std::vector<int> split, int ctx = 256) {
  auto p = LocalPipeline::FromTensors(s, t, split, ctx);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

// Logits of every position of `ids`, computed one-shot or in chunks of `chunk`.
std::vector<float> AllLogits(HeadStage& head, std::span<const int32_t> ids, int chunk) {
  std::vector<float> all;
  for (size_t at = 0; at < ids.size(); at += static_cast<size_t>(chunk)) {
    const size_t n = std::min(static_cast<size_t>(chunk), ids.size() - at);
    auto l = head.ForwardAll(ids.subspan(at, n), static_cast<int>(at));
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (!l.ok()) return {};
    all.insert(all.end(), l->begin(), l->end());
  }
  return all;
}

// --- KV cache, chunking ---------------------------------------------------------------

void ExpectCacheEqualsRecompute(const ModelSpec& s, const HostTensors& t, int n_tokens) {
  LocalPipeline cached = MustPipeline(s, t, {s.n_layers});
  LocalPipeline fresh = MustPipeline(s, t, {s.n_layers});
  std::vector<int32_t> seq = Prompt(s, 5, 11);
  std::vector<std::vector<float>> steps;
  auto gen = GreedyDecode(cached.head(), seq, n_tokens, &steps);
  ASSERT_TRUE(gen.ok()) << gen.status().ToString();
  for (int i = 0; i < n_tokens; ++i) {
    // Full recomputation of the whole window, from position 0, in one batch.
    auto full = fresh.head().Forward(seq, 0);
    ASSERT_TRUE(full.ok()) << full.status().ToString();
    ASSERT_TRUE(SameBits(*full, steps[static_cast<size_t>(i)])) << "step " << i;
    seq.push_back((*gen)[static_cast<size_t>(i)]);
  }
}

TEST(Forward, LlamaKvCacheEqualsRecompute) {
  const ModelSpec s = TinyLlamaSpec(4);
  ExpectCacheEqualsRecompute(s, RandomTensors(s, 1), 40);
}

TEST(Forward, Gpt2KvCacheEqualsRecompute) {
  const ModelSpec s = TinyGpt2Spec(3);
  ExpectCacheEqualsRecompute(s, RandomTensors(s, 2), 40);
}

TEST(Forward, ChunkedPrefillEqualsOneShot) {
  for (const ModelSpec& s : {TinyLlamaSpec(3), TinyGpt2Spec(2)}) {
    const HostTensors t = RandomTensors(s, 3);
    const std::vector<int32_t> ids = Prompt(s, 70, 5);
    LocalPipeline a = MustPipeline(s, t, {s.n_layers});
    LocalPipeline b = MustPipeline(s, t, {s.n_layers});
    const std::vector<float> one = AllLogits(a.head(), ids, 70);
    for (int chunk : {1, 16, 33}) {
      EXPECT_TRUE(SameBits(one, AllLogits(b.head(), ids, chunk))) << FamilyName(s.family) << " chunk " << chunk;
    }
  }
}

// A long prefill runs attention's (KV head, query block) pieces across the kernels' pool,
// and a decode step seeing 64 keys or more splits its query heads into a lane per thread
// (AttendDecodeLanes); one thread runs them in order. Same bits: one-shot on 3 threads,
// one-shot on 1 thread and token by token on 1 and on 3 threads must agree (with and
// without a sliding window). On 3 threads the lanes of these models share KV heads in every
// way: 6 query heads on 2 KV heads (lanes of 2: the middle one takes the last query head of
// the first KV head and the first of the second), 8 on 2 (2 + 3 + 3), 3 on 1 (every lane
// shares the one KV head), 4 on 2 (1 + 1 + 2).
TEST(Forward, AttentionAcrossThreadsKeepsTheBits) {
  ModelSpec s = TinyLlamaSpec(2);
  s.max_positions = 512;
  ModelSpec windowed = s;
  windowed.model_type = "qwen2";
  windowed.use_sliding_window = true;
  windowed.sliding_window = 100;
  windowed.max_window_layers = 1;
  ModelSpec wide = s;
  wide.hidden = 256;
  wide.n_heads = 8;
  wide.head_dim = 32;
  ModelSpec deep = s;
  deep.hidden = 192, deep.n_heads = 3, deep.n_kv_heads = 1, deep.head_dim = 64;
  ModelSpec deep_wide = s;
  deep_wide.hidden = 288, deep_wide.n_heads = 4, deep_wide.n_kv_heads = 2, deep_wide.head_dim = 72;
  deep_wide.intermediate = 320;
  ASSERT_FALSE(NarrowModel(deep_wide));
  const int before = kernels::Threads();
  for (const ModelSpec& spec : {s, windowed, wide, deep, deep_wide}) {
    const HostTensors t = RandomTensors(spec, 21);
    const std::vector<int32_t> ids = Prompt(spec, 300, 22);  // ten query blocks of 32, the last partial
    kernels::SetThreads(3);
    LocalPipeline a = MustPipeline(spec, t, {spec.n_layers}, 512);
    const std::vector<float> pooled = AllLogits(a.head(), ids, 300);
    kernels::SetThreads(1);
    LocalPipeline b = MustPipeline(spec, t, {spec.n_layers}, 512);
    const std::vector<float> serial = AllLogits(b.head(), ids, 300);
    LocalPipeline c = MustPipeline(spec, t, {1, 1}, 512);
    const std::vector<float> stepwise = AllLogits(c.head(), ids, 1);
    kernels::SetThreads(3);
    LocalPipeline d = MustPipeline(spec, t, {spec.n_layers}, 512);
    const std::vector<float> stepwise_pooled = AllLogits(d.head(), ids, 1);
    ASSERT_EQ(pooled.size(), static_cast<size_t>(300) * spec.vocab);
    EXPECT_TRUE(SameBits(pooled, serial)) << spec.model_type << " hidden " << spec.hidden;
    EXPECT_TRUE(SameBits(pooled, stepwise)) << spec.model_type << " hidden " << spec.hidden;
    EXPECT_TRUE(SameBits(pooled, stepwise_pooled)) << spec.model_type << " hidden " << spec.hidden;
  }
  kernels::SetThreads(before);
}

// Wide models (rows over 256 values enter their products as one int8 term) on 3 threads:
// a 40-token prefill runs its norms, activations and residuals in row blocks across the
// pool, each quantizing its rows for the next product, then 4 single steps run on the
// caller. A 64-bit digest of every logit on every backend this CPU has, against one value
// computed before those steps were fused with the quantization (the session-13 forward): a
// fused step that quantized the wrong rows, or skipped a row, changes it. Change kGolden
// only with a deliberate change of the arithmetic (docs/KERNELS.md).
TEST(Forward, WideModelsKeepTheirGoldenDigest) {
  ModelSpec llama = TinyLlamaSpec(2);
  llama.hidden = 320, llama.n_heads = 5, llama.n_kv_heads = 1, llama.head_dim = 64, llama.intermediate = 640;
  ModelSpec gpt2 = TinyGpt2Spec(2);
  gpt2.hidden = 288, gpt2.n_heads = 4, gpt2.n_kv_heads = 4, gpt2.head_dim = 72, gpt2.intermediate = 1152;
  auto fnv = [](uint64_t h, const void* data, size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
  };
  const int threads = kernels::Threads();
  const kernels::Backend before = kernels::ActiveBackend();
  kernels::SetThreads(3);
  const uint64_t kGolden[2] = {0xeb4eb2a22be8afd6ULL, 0x1e9ff671dc329fb0ULL};  // x86-64, every backend
  int spec_index = 0;
  for (const ModelSpec& spec : {llama, gpt2}) {
    ASSERT_FALSE(NarrowModel(spec));
    const HostTensors t = RandomTensors(spec, 31);
    const std::vector<int32_t> ids = Prompt(spec, 44, 32);
    for (const auto& st : kernels::BackendReport()) {
      if (!st.supported || !st.gate_passed) continue;
      ASSERT_TRUE(kernels::SetBackend(st.backend).ok());
      LocalPipeline p = MustPipeline(spec, t, {spec.n_layers}, 128);
      std::vector<float> all = AllLogits(p.head(), std::span<const int32_t>(ids).subspan(0, 40), 40);
      for (int i = 40; i < 44; ++i) {
        auto step = p.head().ForwardAll(std::span<const int32_t>(ids).subspan(static_cast<size_t>(i), 1), i);
        ASSERT_TRUE(step.ok()) << step.status().ToString();
        all.insert(all.end(), step->begin(), step->end());
      }
      ASSERT_EQ(all.size(), 44 * static_cast<size_t>(spec.vocab));
      const uint64_t h = fnv(0xcbf29ce484222325ULL, all.data(), all.size() * sizeof(float));
      std::printf("%s digest on %s: 0x%016llx\n", spec.model_type.c_str(),
                  std::string(kernels::BackendName(st.backend)).c_str(), static_cast<unsigned long long>(h));
      EXPECT_EQ(h, kGolden[spec_index]) << spec.model_type << " on " << kernels::BackendName(st.backend);
    }
    ++spec_index;
  }
  ASSERT_TRUE(kernels::SetBackend(before).ok());
  kernels::SetThreads(threads);
}

TEST(Forward, RewindRecomputesTheSameBits) {
  const ModelSpec s = TinyLlamaSpec(2);
  LocalPipeline p = MustPipeline(s, RandomTensors(s, 4), {1, 1});
  const std::vector<int32_t> ids = Prompt(s, 20, 6);
  auto first = p.head().ForwardAll(ids, 0);
  ASSERT_TRUE(first.ok());
  // Going back to position 12 and replaying the tail gives the same last rows.
  auto tail = p.head().ForwardAll(std::span<const int32_t>(ids).subspan(12), 12);
  ASSERT_TRUE(tail.ok());
  EXPECT_TRUE(SameBits(std::span<const float>(*first).subspan(12 * static_cast<size_t>(s.vocab)), *tail));
  EXPECT_EQ(p.head().length(), 20);
}

TEST(Forward, KvCacheCopyIsIndependent) {
  const ModelSpec s = TinyLlamaSpec(2);
  const StageWeights w = std::move(StageWeights::FromTensors(s, RandomTensors(s, 7), 0, 2, true)).value();
  KvCache kv(s, 0, 2, 64);
  auto h = Embed(w, Prompt(s, 6, 1), 0);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(RunLayers(w, 0, 2, *h, kv).ok());
  KvCache copy = kv.Copy();
  EXPECT_EQ(copy.length(), 6);
  EXPECT_EQ(copy.layer(1).k, kv.layer(1).k);
  EXPECT_EQ(copy.layer(1).k_res, kv.layer(1).k_res);
  EXPECT_EQ(copy.layer(1).k_res_scale, kv.layer(1).k_res_scale);
  EXPECT_EQ(copy.layer(1).v_scale, kv.layer(1).v_scale);
  auto h2 = Embed(w, Prompt(s, 3, 2), 6);
  ASSERT_TRUE(RunLayers(w, 0, 2, *h2, kv).ok());
  EXPECT_EQ(kv.length(), 9);
  EXPECT_EQ(copy.length(), 6);
}

// Keys enter the cache as two int8 terms: the residual term quantizes what the first leaves
// over (at most half a step of k_scale per element), so its scale is at most k_scale / 254;
// a key with a nonzero residual has a nonzero second term. Bytes() counts both.
TEST(Forward, KeysEnterTheCacheAsTwoInt8Terms) {
  const ModelSpec s = TinyLlamaSpec(2);
  const StageWeights w = std::move(StageWeights::FromTensors(s, RandomTensors(s, 7), 0, 2, true)).value();
  const int ctx = 64, n = 10;
  KvCache kv(s, 0, 2, ctx);
  auto h = Embed(w, Prompt(s, n, 1), 0);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(RunLayers(w, 0, 2, *h, kv).ok());
  int with_residual = 0;
  for (int l = 0; l < 2; ++l) {
    const KvCache::Layer& c = kv.layer(l);
    for (int g = 0; g < s.n_kv_heads; ++g)
      for (int p = 0; p < n; ++p) {
        const size_t slot = static_cast<size_t>(g) * static_cast<size_t>(kv.slots()) + static_cast<size_t>(p);
        ASSERT_GT(c.k_scale[slot], 0.0f);
        EXPECT_LE(c.k_res_scale[slot], c.k_scale[slot] / 254.0f * 1.001f) << l << " " << g << " " << p;
        with_residual += c.k_res_scale[slot] > 0.0f;
      }
    // positions not yet written stay zero
    EXPECT_EQ(c.k_res_scale[static_cast<size_t>(n)], 0.0f);
  }
  EXPECT_GT(with_residual, n * s.n_kv_heads);  // most keys are not exact in one int8 term
  // A narrow model (this one) holds values as two terms too: k, k_res, v, v_res + four scales.
  // A value row takes head_dim bytes rounded up to a whole tile of 16 (ValueGroupStride / 4).
  ASSERT_TRUE(NarrowModel(s));
  ASSERT_EQ(kv.slots(), ctx);  // a whole number of tiles of 16
  EXPECT_FALSE(kv.layer(0).v_res.empty());
  const size_t hd = static_cast<size_t>(s.head_dim), value = (hd + 15) / 16 * 16;
  EXPECT_EQ(kv.ValueGroupStride(), 4 * value);
  EXPECT_EQ(kv.Bytes(), 2 * static_cast<size_t>(s.n_kv_heads) * ctx * (2 * hd + 2 * value + 4 * 4));
  EXPECT_EQ(kv.Bytes(), 2 * ctx * KvCache::PositionBytes(s));  // what bench counts per position read
  // A wider model keeps one value term: k, k_res, v + three scales.
  ModelSpec wide = s;
  wide.hidden = kNarrowHidden + 32;
  ASSERT_FALSE(NarrowModel(wide));
  KvCache wkv(wide, 0, 2, ctx);
  EXPECT_TRUE(wkv.layer(0).v_res.empty());
  EXPECT_EQ(wkv.Bytes(), 2 * static_cast<size_t>(s.n_kv_heads) * ctx * (2 * hd + value + 3 * 4));
  EXPECT_EQ(wkv.Bytes(), 2 * ctx * KvCache::PositionBytes(wide));
  // A context that is not a whole number of tiles is held in whole tiles.
  EXPECT_EQ(KvCache(s, 0, 1, 17).slots(), 32);
}

// --- splits ---------------------------------------------------------------------------

struct GreedyRun {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits;
};

GreedyRun Greedy(HeadStage& head, std::span<const int32_t> prompt, int n) {
  GreedyRun r;
  auto ids = GreedyDecode(head, prompt, n, &r.logits);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  if (ids.ok()) r.ids = *ids;
  return r;
}

bool SameRun(const GreedyRun& a, const GreedyRun& b) {
  if (a.ids != b.ids || a.logits.size() != b.logits.size()) return false;
  for (size_t i = 0; i < a.logits.size(); ++i)
    if (!SameBits(a.logits[i], b.logits[i])) return false;
  return true;
}

TEST(Forward, SplitsEqualUnsplit) {
  for (const ModelSpec& s : {TinyLlamaSpec(6), TinyGpt2Spec(6)}) {
    const HostTensors t = RandomTensors(s, 8);
    const std::vector<int32_t> prompt = Prompt(s, 9, 9);
    LocalPipeline whole = MustPipeline(s, t, {6});
    const GreedyRun want = Greedy(whole.head(), prompt, 30);
    // A lively run, not one token repeated, so equality says something.
    EXPECT_GT(std::set<int32_t>(want.ids.begin(), want.ids.end()).size(), 2u) << FamilyName(s.family);
    for (std::vector<int> split : {std::vector<int>{2, 2, 2}, {0, 3, 3}, {1, 4, 1}, {0, 1, 1, 1, 1, 1, 1}, {5, 1}}) {
      LocalPipeline p = MustPipeline(s, t, split);
      // Each stage holds only its own layers.
      for (int i = 1; i < p.n_stages(); ++i) EXPECT_FALSE(p.weights(i).has_head());
      EXPECT_TRUE(SameRun(want, Greedy(p.head(), prompt, 30))) << FamilyName(s.family) << " split of " << split.size();
    }
  }
}

// A stage that silently skips its last layer.
class DroppingStage final : public StageLink {
 public:
  DroppingStage(const StageWeights& w, int ctx) : w_(w), kv_(w.spec(), w.first(), w.end(), ctx) {}
  Result<HiddenStates> Run(HiddenStates h) override {
    DAISY_RETURN_IF_ERROR(RunLayers(w_, w_.first(), w_.end() - 1, h, kv_));
    return h;
  }

 private:
  const StageWeights& w_;
  KvCache kv_;
};

TEST(Forward, MutationsAreCaught) {
  const ModelSpec s = TinyLlamaSpec(6);
  const HostTensors t = RandomTensors(s, 10);
  const std::vector<int32_t> prompt = Prompt(s, 9, 12);
  LocalPipeline whole = MustPipeline(s, t, {6});
  const GreedyRun want = Greedy(whole.head(), prompt, 20);

  auto w0 = StageWeights::FromTensors(s, t, 0, 2, true);
  auto w1 = StageWeights::FromTensors(s, t, 2, 4, false);
  auto w2 = StageWeights::FromTensors(s, t, 4, 6, false);
  ASSERT_TRUE(w0.ok() && w1.ok() && w2.ok());
  {
    // The honest chain first, so a failure below is the mutation's doing.
    LocalStage last(*w2, 256, nullptr);
    LocalStage mid(*w1, 256, &last);
    HeadStage head(*w0, 256, &mid);
    EXPECT_TRUE(SameRun(want, Greedy(head, prompt, 20)));
  }
  {
    // Mutation 1: the middle stage drops a layer.
    LocalStage last(*w2, 256, nullptr);
    DroppingStage mid(*w1, 256);
    struct Chain final : StageLink {
      StageLink* a;
      StageLink* b;
      Result<HiddenStates> Run(HiddenStates h) override {
        DAISY_ASSIGN_OR_RETURN(HiddenStates x, a->Run(std::move(h)));
        return b->Run(std::move(x));
      }
    } chain;
    chain.a = &mid;
    chain.b = &last;
    HeadStage head(*w0, 256, &chain);
    EXPECT_FALSE(SameRun(want, Greedy(head, prompt, 20)));
  }
  {
    // Mutation 2: the two later stages applied out of order.
    LocalStage mid(*w1, 256, nullptr);
    LocalStage last(*w2, 256, &mid);
    HeadStage head(*w0, 256, &last);
    EXPECT_FALSE(SameRun(want, Greedy(head, prompt, 20)));
  }
}

TEST(Forward, StageRangesRefuseBadSplits) {
  EXPECT_FALSE(StageRanges(6, std::vector<int>{2, 2}).ok());
  EXPECT_FALSE(StageRanges(6, std::vector<int>{4, 4}).ok());
  EXPECT_FALSE(StageRanges(6, std::vector<int>{7, -1}).ok());
  EXPECT_FALSE(StageRanges(6, std::vector<int>{}).ok());
  auto r = StageRanges(6, std::vector<int>{0, 6});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0], std::make_pair(0, 0));
  EXPECT_EQ((*r)[1], std::make_pair(0, 6));
}

// --- architecture variants ------------------------------------------------------------

TEST(Forward, SlidingWindowLimitsAttentionAndStaysExact) {
  ModelSpec s = TinyLlamaSpec(3);
  s.model_type = "qwen2";
  s.use_sliding_window = true;
  s.sliding_window = 4;
  s.max_window_layers = 1;  // layers 1 and 2 use the window
  const HostTensors t = RandomTensors(s, 13);
  ModelSpec full = s;
  full.use_sliding_window = false;
  auto ws = StageWeights::FromTensors(s, t, 0, 3, true);
  ASSERT_TRUE(ws.ok());
  EXPECT_FALSE(ws->layer(0).sliding_window);
  EXPECT_TRUE(ws->layer(1).sliding_window);
  EXPECT_TRUE(ws->layer(2).sliding_window);

  const std::vector<int32_t> ids = Prompt(s, 40, 14);
  LocalPipeline win = MustPipeline(s, t, {3});
  LocalPipeline nowin = MustPipeline(full, t, {3});
  const std::vector<float> a = AllLogits(win.head(), ids, 40);
  const std::vector<float> b = AllLogits(nowin.head(), ids, 40);
  const size_t V = static_cast<size_t>(s.vocab);
  // Up to position 3 every key is inside the window: identical; later the window bites.
  EXPECT_TRUE(SameBits(std::span<const float>(a).subspan(0, 4 * V), std::span<const float>(b).subspan(0, 4 * V)));
  EXPECT_FALSE(SameBits(std::span<const float>(a).subspan(4 * V), std::span<const float>(b).subspan(4 * V)));
  // Chunked prefill and the cache stay exact with the window.
  LocalPipeline win2 = MustPipeline(s, t, {1, 2});
  EXPECT_TRUE(SameBits(a, AllLogits(win2.head(), ids, 3)));
  ExpectCacheEqualsRecompute(s, t, 20);
}

TEST(Forward, QkvBiasesAreApplied) {
  ModelSpec s = TinyLlamaSpec(2);
  s.qkv_bias = true;  // Qwen2
  HostTensors t = RandomTensors(s, 15);
  ExpectCacheEqualsRecompute(s, t, 10);
  LocalPipeline with = MustPipeline(s, t, {2});
  // Zeroing the biases changes the output: they are used.
  for (auto& [name, ht] : t)
    if (name.ends_with("_proj.bias")) std::fill(ht.values.begin(), ht.values.end(), 0.0f);
  LocalPipeline without = MustPipeline(s, t, {2});
  const std::vector<int32_t> ids = Prompt(s, 8, 16);
  EXPECT_FALSE(SameBits(AllLogits(with.head(), ids, 8), AllLogits(without.head(), ids, 8)));
  // A partial set of biases is refused, naming the missing tensor.
  t.erase("model.layers.1.self_attn.v_proj.bias");
  auto bad = StageWeights::FromTensors(s, t, 0, 2, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.layers.1.self_attn.v_proj.bias"), std::string::npos);
}

TEST(Forward, Llama3RopeScalingRuns) {
  ModelSpec s = TinyLlamaSpec(2);
  s.rope_theta = 500000.0;
  s.rope_scaling.type = RopeScalingType::kLlama3;
  s.rope_scaling.factor = 32.0;
  s.rope_scaling.original_max_position_embeddings = 64;
  const HostTensors t = RandomTensors(s, 17);
  ExpectCacheEqualsRecompute(s, t, 10);
  ModelSpec plain = s;
  plain.rope_scaling.type = RopeScalingType::kNone;
  LocalPipeline a = MustPipeline(s, t, {2});
  LocalPipeline b = MustPipeline(plain, t, {2});
  const std::vector<int32_t> ids = Prompt(s, 30, 18);
  EXPECT_FALSE(SameBits(AllLogits(a.head(), ids, 30), AllLogits(b.head(), ids, 30)));
}

TEST(Forward, UntiedHeadUsesLmHead) {
  ModelSpec s = TinyLlamaSpec(1);
  s.tied_embeddings = false;
  HostTensors t = RandomTensors(s, 19);
  ASSERT_TRUE(t.count("lm_head.weight"));
  auto w = StageWeights::FromTensors(s, t, 0, 1, true);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->head().lm_head.n, s.vocab);
  t.erase("lm_head.weight");
  EXPECT_FALSE(StageWeights::FromTensors(s, t, 0, 1, true).ok());
}

// --- weights --------------------------------------------------------------------------

TEST(Forward, StagesHoldOnlyTheirLayersAtAboutOneBytePerParameter) {
  ModelSpec wide = TinyLlamaSpec(4);
  wide.hidden = kNarrowHidden + 64;
  // int8 matrices + f32 scales and norms: a little over 1 byte per parameter, far from 4; a
  // narrow model's two terms (model.h NarrowModel): a little over 2.
  for (const ModelSpec& s : {wide, TinyLlamaSpec(4)}) {
    const HostTensors t = RandomTensors(s, 20);
    auto w = StageWeights::FromTensors(s, t, 1, 3, false);
    ASSERT_TRUE(w.ok());
    EXPECT_FALSE(w->has_head());
    EXPECT_EQ(w->first(), 1);
    EXPECT_EQ(w->end(), 3);
    uint64_t params = 0;
    for (int l = 1; l < 3; ++l)
      for (const auto& name : LayerTensorNames(s, l)) params += t.at(name).values.size();
    const double terms = NarrowModel(s) ? 2.0 : 1.0;
    EXPECT_GE(static_cast<double>(w->Bytes()), terms * static_cast<double>(params)) << s.hidden;
    EXPECT_LE(static_cast<double>(w->Bytes()), (terms + 0.25) * static_cast<double>(params)) << s.hidden;
  }
}

TEST(Forward, EmbeddingLookupIsExact) {
  const ModelSpec s = TinyLlamaSpec(1);
  const HostTensors t = RandomTensors(s, 21);
  auto w = StageWeights::FromTensors(s, t, 0, 0, true);
  ASSERT_TRUE(w.ok());
  const std::vector<int32_t> ids = {5, 0, 96};
  auto h = Embed(*w, ids, 0);
  ASSERT_TRUE(h.ok());
  const auto& e = t.at("model.embed_tokens.weight").values;
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(
        SameBits(h->Row(i), std::span<const float>(e).subspan(static_cast<size_t>(ids[i]) * s.hidden, s.hidden)));
  // BF16 and F16 sources are kept at 2 bytes and widen back exactly.
  std::vector<float> bf = {1.5f, -0.0078125f, 3.0f, 0.0f};
  EmbeddingTable tb = EmbeddingTable::FromF32(bf, 2, 2, DType::kBF16);
  EXPECT_EQ(tb.Bytes(), 8u);
  std::vector<float> row(2);
  tb.Row(1, row.data());
  EXPECT_EQ(row, (std::vector<float>{3.0f, 0.0f}));
  std::vector<float> h16 = {0.5f, 6.103515625e-05f, 5.960464477539063e-08f, -65504.0f};  // incl. subnormal
  EmbeddingTable th = EmbeddingTable::FromF32(h16, 1, 4, DType::kF16);
  EXPECT_EQ(th.Bytes(), 8u);
  row.resize(4);
  th.Row(0, row.data());
  EXPECT_EQ(row, h16);
  // A value that is not a bf16 value keeps the table at f32 (never rounded).
  std::vector<float> odd = {1.0f + 1.0f / 1024.0f / 1024.0f, 1.0f};
  EmbeddingTable to = EmbeddingTable::FromF32(odd, 1, 2, DType::kBF16);
  EXPECT_EQ(to.Bytes(), 8u);
  to.Row(0, row.data());
  EXPECT_EQ(row[0], odd[0]);
  // Filled from the file's bytes block by block (the streaming load): the same rows.
  const std::vector<uint8_t> raw16 = {0x00, 0x38, 0x00, 0x04, 0x01, 0x00, 0xff, 0xfb};  // the F16 row above
  EmbeddingTable fh = EmbeddingTable::Allocate(2, 4, DType::kF16);
  EXPECT_EQ(fh.Bytes(), 16u);
  fh.SetRows(1, 1, raw16);
  fh.Row(1, row.data());
  EXPECT_EQ(row, h16);
  const std::vector<uint8_t> rawbf = {0xc0, 0x3f, 0x00, 0xbc};  // bf16 1.5, -0.0078125
  EmbeddingTable fb = EmbeddingTable::Allocate(1, 2, DType::kBF16);
  fb.SetRows(0, 1, rawbf);
  row.resize(2);
  fb.Row(0, row.data());
  EXPECT_EQ(row, (std::vector<float>{1.5f, -0.0078125f}));
  EmbeddingTable ff = EmbeddingTable::Allocate(1, 2, DType::kF32);
  ff.SetRows(0, 1, {reinterpret_cast<const uint8_t*>(odd.data()), 8});
  EXPECT_EQ(ff.Bytes(), 8u);
  ff.Row(0, row.data());
  EXPECT_TRUE(SameBits(row, odd));
}

// --- refusals -------------------------------------------------------------------------

// Hidden states of positions [0, n), every value v.
HiddenStates Positions(const ModelSpec& s, int n, float v) {
  HiddenStates h;
  h.hidden = s.hidden;
  h.positions.resize(static_cast<size_t>(n));
  std::iota(h.positions.begin(), h.positions.end(), 0);
  h.values.assign(static_cast<size_t>(n) * static_cast<size_t>(s.hidden), v);
  return h;
}

TEST(Forward, NonFiniteActivationIsRefusedNamingLayerAndPosition) {
  const ModelSpec s = TinyLlamaSpec(3);
  auto w = StageWeights::FromTensors(s, RandomTensors(s, 22), 1, 3, false);
  ASSERT_TRUE(w.ok());
  KvCache kv(s, 1, 3, 64);
  HiddenStates h = Positions(s, 5, 0.5f);
  h.values[3 * static_cast<size_t>(s.hidden) + 7] = std::numeric_limits<float>::quiet_NaN();
  const Status st = RunLayers(*w, 1, 3, h, kv);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("layer 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("position 3"), std::string::npos) << st.message();
  EXPECT_EQ(kv.length(), 0);  // nothing was committed

  // A wide model's rows are normed and quantized in blocks of 16 across the pool: of two
  // bad rows in different blocks, the first in row order is named, whichever finished first.
  ModelSpec wide = TinyLlamaSpec(2);
  wide.hidden = 320, wide.n_heads = 5, wide.n_kv_heads = 1, wide.head_dim = 64, wide.intermediate = 640;
  auto ww = StageWeights::FromTensors(wide, RandomTensors(wide, 22), 0, 2, false);
  ASSERT_TRUE(ww.ok());
  const int threads = kernels::Threads();
  kernels::SetThreads(3);
  for (const int first_bad : {21, 37}) {
    KvCache wkv(wide, 0, 2, 64);
    HiddenStates wh = Positions(wide, 40, 0.5f);
    for (const int row : {first_bad, 38})
      wh.values[static_cast<size_t>(row) * static_cast<size_t>(wide.hidden) + 300] =
          std::numeric_limits<float>::infinity();
    const Status ws = RunLayers(*ww, 0, 2, wh, wkv);
    ASSERT_FALSE(ws.ok());
    EXPECT_NE(ws.message().find("layer 0, position " + std::to_string(first_bad) + ": non-finite attention input"),
              std::string::npos)
        << ws.message();
    EXPECT_EQ(wkv.length(), 0);
  }
  kernels::SetThreads(threads);

  // A link that hands back inf is refused at the head before the readout.
  struct Poison final : StageLink {
    Result<HiddenStates> Run(HiddenStates x) override {
      x.values[x.values.size() - 1] = std::numeric_limits<float>::infinity();
      return x;
    }
  } poison;
  auto hw = StageWeights::FromTensors(s, RandomTensors(s, 22), 0, 1, true);
  ASSERT_TRUE(hw.ok());
  HeadStage head(*hw, 64, &poison);
  auto l = head.Forward(std::vector<int32_t>{1, 2, 3}, 0);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("position 2"), std::string::npos) << l.status().message();
}

// A decode step past kDecodeSplitMinKeys keys on the pool runs each KV head's RoPE and cache writes inside its
// attention's dispatch (AttendDecodeLanes). A key that overflows there (layer 0's second KV head's key projection all
// 3e38: finite weights, an infinite key) is refused naming its layer and position, as on one thread; the other lanes,
// and the one that waits for that head, finish; nothing is committed to the cache.
TEST(Forward, ADecodeStepsNonFiniteKeyOnThePoolIsRefusedNamingLayerAndPosition) {
  const ModelSpec s = TinyLlamaSpec(2);
  ASSERT_EQ(s.n_kv_heads, 2);
  ASSERT_GE(70, kDecodeSplitMinKeys) << "the step at position 70 must take the split path";
  const HostTensors good = RandomTensors(s, 31);
  HostTensors bad = good;
  HostTensor& k = bad.at(NamesForLayer(s, 0).k);
  for (size_t i = static_cast<size_t>(s.head_dim) * static_cast<size_t>(s.hidden); i < k.values.size(); ++i)
    k.values[i] = 3e38f;
  auto wg = StageWeights::FromTensors(s, good, 0, 2, false);
  auto wb = StageWeights::FromTensors(s, bad, 0, 2, false);
  ASSERT_TRUE(wg.ok() && wb.ok());
  const int threads = kernels::Threads();
  for (const int t : {3, 1}) {
    kernels::SetThreads(t);
    KvCache kv(s, 0, 2, 128);
    HiddenStates h = Positions(s, 70, 0.25f);
    for (size_t i = 0; i < h.values.size(); ++i) h.values[i] += 0.01f * static_cast<float>(i % 13);
    ASSERT_TRUE(RunLayers(*wg, 0, 2, h, kv).ok());
    ASSERT_EQ(kv.length(), 70);
    HiddenStates step;
    step.hidden = s.hidden;
    step.positions = {70};
    step.values.assign(h.values.begin(), h.values.begin() + s.hidden);
    const Status st = RunLayers(*wb, 0, 2, step, kv);
    ASSERT_FALSE(st.ok()) << t << " threads";
    EXPECT_NE(st.message().find("layer 0, position 70: non-finite key; refused"), std::string::npos)
        << t << " threads: " << st.message();
    EXPECT_EQ(kv.length(), 70) << t << " threads";
  }
  kernels::SetThreads(threads);
}

TEST(Forward, BadInputsAreRefused) {
  const ModelSpec s = TinyLlamaSpec(2);
  LocalPipeline p = MustPipeline(s, RandomTensors(s, 23), {2}, 16);
  auto oov = p.head().Forward(std::vector<int32_t>{1, s.vocab}, 0);
  ASSERT_FALSE(oov.ok());
  EXPECT_NE(oov.status().message().find(std::to_string(s.vocab)), std::string::npos);
  EXPECT_FALSE(p.head().Forward(std::vector<int32_t>{-1}, 0).ok());
  // A gap in the positions, and running past the context.
  EXPECT_FALSE(p.head().Forward(std::vector<int32_t>{1, 2}, 3).ok());
  const std::vector<int32_t> many(17, 3);
  auto full = p.head().Forward(many, 0);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), ErrorCode::kOutOfRange);
  EXPECT_FALSE(CheckContext(s, 0).ok());
  EXPECT_FALSE(CheckContext(s, s.max_positions + 1).ok());
  EXPECT_EQ(DefaultContext(s), 512);
  // GPT-2's learned positions end at max_positions.
  const ModelSpec g = TinyGpt2Spec(1);
  auto gw = StageWeights::FromTensors(g, RandomTensors(g, 24), 0, 1, true);
  ASSERT_TRUE(gw.ok());
  EXPECT_FALSE(Embed(*gw, std::vector<int32_t>{1}, g.max_positions).ok());
  // A tensor of the wrong shape is refused by name.
  HostTensors t = RandomTensors(s, 25);
  t["model.layers.0.mlp.down_proj.weight"].shape = {s.intermediate, s.hidden};
  auto bad = StageWeights::FromTensors(s, t, 0, 1, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("down_proj"), std::string::npos);
}

// --- backends -------------------------------------------------------------------------

class ForwardBackend : public ::testing::TestWithParam<kernels::Backend> {};

std::vector<float> WholeRun(const ModelSpec& s, const HostTensors& t) {
  LocalPipeline p = MustPipeline(s, t, {s.n_layers});
  const std::vector<int32_t> ids = Prompt(s, 37, 26);
  std::vector<float> out = AllLogits(p.head(), ids, 37);
  GreedyRun r = Greedy(p.head(), ids, 12);
  for (const auto& l : r.logits) out.insert(out.end(), l.begin(), l.end());
  return out;
}

TEST_P(ForwardBackend, BitIdenticalToScalar) {
  const kernels::Backend b = GetParam();
  for (const auto& st : kernels::BackendReport()) {
    if (st.backend != b) continue;
    if (!st.supported) GTEST_SKIP() << kernels::BackendName(b) << " not supported here: " << st.reason;
    if (!st.gate_passed)
      GTEST_SKIP() << kernels::BackendName(b) << " failed its gate (kernels tests report it): " << st.reason;
  }
  const kernels::Backend before = kernels::ActiveBackend();
  for (const ModelSpec& s : {TinyLlamaSpec(3), TinyGpt2Spec(2)}) {
    const HostTensors t = RandomTensors(s, 27);
    ASSERT_TRUE(kernels::SetBackend(kernels::Backend::kScalar).ok());
    const std::vector<float> ref = WholeRun(s, t);
    const Status set = kernels::SetBackend(b);
    if (!set.ok()) {
      ASSERT_TRUE(kernels::SetBackend(before).ok());
      GTEST_SKIP() << kernels::BackendName(b) << ": " << set.ToString();
    }
    const std::vector<float> got = WholeRun(s, t);
    EXPECT_TRUE(SameBits(ref, got)) << FamilyName(s.family) << " on " << kernels::BackendName(b);
  }
  ASSERT_TRUE(kernels::SetBackend(before).ok());
}

INSTANTIATE_TEST_SUITE_P(All, ForwardBackend,
                         ::testing::Values(kernels::Backend::kAvx2, kernels::Backend::kAvx512Vnni,
                                           kernels::Backend::kNeon, kernels::Backend::kWasm),
                         [](const auto& info) { return std::string(kernels::BackendName(info.param)); });

}  // namespace
}  // namespace daisy
