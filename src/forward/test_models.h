// Test support: small model specs and seeded random weights in memory (HostTensors), so
// forward tests need no files. Header-only; used by src/forward/*_test.cc only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "daisy/forward.h"
#include "daisy/model.h"

namespace daisy::testing {

// splitmix64: a seeded, platform-independent stream of uniform values.
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-a, a).
  float Uniform(float a) { return static_cast<float>((static_cast<double>(Next() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * a); }

 private:
  uint64_t s_;
};

inline ModelSpec TinyLlamaSpec(int n_layers) {
  ModelSpec s;
  s.family = Family::kLlama;
  s.architecture = "LlamaForCausalLM";
  s.model_type = "llama";
  s.n_layers = n_layers;
  s.hidden = 48;
  s.n_heads = 6;
  s.n_kv_heads = 2;
  s.head_dim = 8;
  s.intermediate = 80;
  s.vocab = 97;
  s.max_positions = 512;
  s.norm_eps = 1e-5f;
  s.rope_theta = 10000.0;
  s.tied_embeddings = true;
  s.eos_ids = {2};
  return s;
}

inline ModelSpec TinyGpt2Spec(int n_layers) {
  ModelSpec s;
  s.family = Family::kGpt2;
  s.architecture = "GPT2LMHeadModel";
  s.model_type = "gpt2";
  s.n_layers = n_layers;
  s.hidden = 32;
  s.n_heads = 4;
  s.n_kv_heads = 4;
  s.head_dim = 8;
  s.intermediate = 128;
  s.vocab = 89;
  s.max_positions = 256;
  s.norm = NormType::kLayerNorm;
  s.activation = Activation::kGeluNew;
  s.gated_mlp = false;
  s.learned_positions = true;
  s.tied_embeddings = true;
  s.fused_qkv = true;
  s.qkv_bias = s.o_bias = s.mlp_bias = true;
  s.layout = WeightLayout::kInOut;
  s.tensor_prefix = "transformer.";
  return s;
}

// Every tensor of the model with seeded values: norms near 1, biases small, matrices with
// a spread that keeps activations in a lively range.
inline HostTensors RandomTensors(const ModelSpec& s, uint64_t seed) {
  SplitMix rng(seed);
  HostTensors t;
  const int64_t H = s.hidden, hd = s.head_dim, I = s.intermediate, V = s.vocab;
  const int64_t q = s.n_heads * hd, kv = s.n_kv_heads * hd;
  const bool conv = s.layout == WeightLayout::kInOut;
  auto put = [&](const std::string& name, std::vector<int64_t> shape, float spread, float center) {
    if (name.empty()) return;
    HostTensor ht;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    ht.shape = std::move(shape);
    ht.values.resize(static_cast<size_t>(n));
    for (float& v : ht.values) v = center + rng.Uniform(spread);
    t[name] = std::move(ht);
  };
  // y = W x with W (out, in); Conv1D files store (in, out).
  auto mat = [&](const std::string& name, int64_t out, int64_t in) {
    put(name, conv ? std::vector<int64_t>{in, out} : std::vector<int64_t>{out, in},
        2.0f / std::sqrt(static_cast<float>(in)), 0.0f);
  };
  const HeadNames h = NamesForHead(s);
  put(h.embed, {V, H}, 1.0f, 0.0f);
  if (s.learned_positions) put(h.positions, {s.max_positions, H}, 0.3f, 0.0f);
  put(h.final_norm, {H}, 0.2f, 1.0f);
  put(h.final_norm_bias, {H}, 0.05f, 0.0f);
  if (!h.lm_head.empty()) put(h.lm_head, {V, H}, 0.2f, 0.0f);
  for (int l = 0; l < s.n_layers; ++l) {
    const LayerNames n = NamesForLayer(s, l);
    put(n.attn_norm, {H}, 0.2f, 1.0f);
    put(n.attn_norm_bias, {H}, 0.05f, 0.0f);
    put(n.mlp_norm, {H}, 0.2f, 1.0f);
    put(n.mlp_norm_bias, {H}, 0.05f, 0.0f);
    if (s.fused_qkv) {
      mat(n.q, q + 2 * kv, H);
      put(n.q_bias, {q + 2 * kv}, 0.1f, 0.0f);
    } else {
      mat(n.q, q, H);
      mat(n.k, kv, H);
      mat(n.v, kv, H);
      put(n.q_bias, {q}, 0.1f, 0.0f);
      put(n.k_bias, {kv}, 0.1f, 0.0f);
      put(n.v_bias, {kv}, 0.1f, 0.0f);
    }
    mat(n.o, H, q);
    put(n.o_bias, {H}, 0.05f, 0.0f);
    mat(n.gate, I, H);
    mat(n.up, I, H);
    mat(n.down, H, I);
    put(n.up_bias, {I}, 0.05f, 0.0f);
    put(n.down_bias, {H}, 0.05f, 0.0f);
  }
  return t;
}

// Index of the largest logit (the first on ties).
inline int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

// Greedy decoding through a HeadStage: one-shot prefill, then one token per step.
// Returns the generated ids; `logits` (when given) receives every step's logits.
inline Result<std::vector<int32_t>> GreedyDecode(HeadStage& head, std::span<const int32_t> prompt, int n,
                                                 std::vector<std::vector<float>>* logits = nullptr) {
  std::vector<int32_t> out;
  DAISY_ASSIGN_OR_RETURN(std::vector<float> l, head.Forward(prompt, 0));
  int pos = static_cast<int>(prompt.size());
  for (int i = 0; i < n; ++i) {
    if (logits) logits->push_back(l);
    const int32_t next = Argmax(l);
    out.push_back(next);
    if (i + 1 == n) break;
    DAISY_ASSIGN_OR_RETURN(l, head.Forward(std::span<const int32_t>(&next, 1), pos));
    ++pos;
  }
  return out;
}

// Positions [0, n) of two caches of the same layers and context hold the same bytes (k, its
// residual, v and their scales), whatever lies past n.
inline bool SameCachePrefix(const KvCache& a, const KvCache& b, const ModelSpec& spec, int n) {
  if (a.first() != b.first() || a.end() != b.end() || a.ctx() != b.ctx()) return false;
  const size_t slots = static_cast<size_t>(a.slots()), un = static_cast<size_t>(n);
  auto same = [](const auto& x, const auto& y, size_t at, size_t len) {
    return std::memcmp(x.data() + at, y.data() + at, len * sizeof(x[0])) == 0;
  };
  for (int l = a.first(); l < a.end(); ++l) {
    const KvCache::Layer& x = a.layer(l);
    const KvCache::Layer& y = b.layer(l);
    for (int h = 0; h < spec.n_kv_heads; ++h) {
      const size_t at = static_cast<size_t>(h) * slots;
      if (!same(x.k_scale, y.k_scale, at, un) || !same(x.k_res_scale, y.k_res_scale, at, un)) return false;
      if (!same(x.v_scale, y.v_scale, at, un)) return false;
      if (x.v_res.empty() != y.v_res.empty()) return false;
      if (!x.v_res.empty() && !same(x.v_res_scale, y.v_res_scale, at, un)) return false;
      for (int p = 0; p < n; ++p)
        for (int d = 0; d < spec.head_dim; ++d) {
          const size_t k = a.KeyAt(h, p, d), v = a.ValueAt(h, p, d);
          if (x.k[k] != y.k[k] || x.k_res[k] != y.k_res[k] || x.v[v] != y.v[v]) return false;
          if (!x.v_res.empty() && x.v_res[v] != y.v_res[v]) return false;
        }
    }
  }
  return true;
}

}  // namespace daisy::testing
