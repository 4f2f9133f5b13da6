// Accuracy against float64, where int8 losses could grow: whole 512-token texts of the real
// stories260K (every block of 128 positions, against tests/reference/stories_reference.py's
// checked-in float64 log-probabilities), the attention probability the int8 form of P loses
// on those texts, and the random SmolLM and Qwen shapes at a 2,048-token context against a
// float64 forward pass written here from the Hugging Face definitions (modeling_llama.py,
// modeling_qwen2.py). docs/KERNELS.md, "Accuracy against float64", has the figures.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "daisy/forward.h"
#include "daisy/model.h"
#include "model_maker.h"
#include "reference_files.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;

// stories260K, per block of 128 positions, against float64 (the targets: top-1 at
// least 99% and mean KL at most 1e-3 nats in every block). A narrow model runs its weights,
// queries and values as two int8 terms (model.h NarrowModel); measured: every block 100%
// top-1 (1990/1990 positions), mean KL 2.8e-8 .. 7.3e-8. The KL bound pins that with a
// margin, so losing any one of the three second terms is noticed: one-term values alone
// give 7e-6, one-term queries 1.2e-4, one-term weights 6e-4 (and 96-98% top-1 blocks).
constexpr double kMaxBlockMeanKl = 1e-6;
constexpr double kMinTop1All = 0.99;
constexpr double kMinTop1Block = 0.99;
// Attention probability lost per row by the int8 terms of P, mean over every (position,
// head) row of every layer: measured 2.0e-4 moved and 4.1e-5 flushed to zero with two
// terms; 0.024 and 0.0098 with one.
constexpr double kMaxMeanMassMoved = 1e-3;
constexpr double kMaxMeanMassFlushed = 2e-4;

using reference_files::Fnv1a64;
using reference_files::ReadF32;
using reference_files::ReadFile;

const char* const kTexts[] = {"greedy_lily_ben", "greedy_little_dog", "garden", "boat", "bread"};

TEST(Accuracy, Stories260KEveryBlockAgainstFloat64) {
  const fs::path model = fs::path(std::getenv("DAISY_MODELS")) / "stories260K";  // tests/test_env.cc
  const fs::path data = fs::path(std::getenv("DAISY_TESTDATA")) / "reference" / "stories260K";
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(
                    Fnv1a64({ReadFile(model / "config.json"), ReadFile(model / "model.safetensors")})));
  auto src = OpenLocalFolder(model.string());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  auto info = LoadModelInfo(**src);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  const size_t vocab = static_cast<size_t>(info->spec.vocab);

  AttentionMassStats mass;
  int agree_all = 0, rows_all = 0, blocks = 0;
  for (const char* text : kTexts) {
    const nlohmann::json m = nlohmann::json::parse(ReadFile(data / (std::string(text) + ".json")));
    ASSERT_EQ(m.at("model_fnv1a64").get<std::string>(), std::string(hash))
        << text << ": the reference saw another model; regenerate with tests/reference/stories_reference.py";
    const std::vector<int32_t> ids = m.at("ids").get<std::vector<int32_t>>();
    const int n = static_cast<int>(ids.size()) - 1;  // the last id is only a target
    const std::vector<float> ref = ReadF32(data / m.at("logprob").get<std::string>());
    ASSERT_EQ(ref.size(), static_cast<size_t>(n) * vocab) << text;

    const int whole[] = {info->spec.n_layers};
    auto pipeline = LocalPipeline::Load(**src, *info, whole, 512);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status().ToString();
    // Chunks of 128 through the KV cache, as eval runs them (the bits are those of one pass).
    std::vector<float> logits;
    SetAttentionMassStats(&mass);
    for (int at = 0; at < n; at += 128) {
      const int len = std::min(128, n - at);
      auto chunk = pipeline->head().ForwardAll(
          std::span<const int32_t>(ids).subspan(static_cast<size_t>(at), static_cast<size_t>(len)), at);
      ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
      logits.insert(logits.end(), chunk->begin(), chunk->end());
    }
    SetAttentionMassStats(nullptr);

    std::printf("%-18s", text);
    for (int b = 0; b < n; b += 128) {
      const int e = std::min(n, b + 128);
      int agree = 0;
      double kl = 0;
      for (int i = b; i < e; ++i) {
        const float* row = &logits[static_cast<size_t>(i) * vocab];
        const float* rl = &ref[static_cast<size_t>(i) * vocab];
        const size_t best = static_cast<size_t>(std::max_element(row, row + vocab) - row);
        const size_t rbest = static_cast<size_t>(std::max_element(rl, rl + vocab) - rl);
        agree += best == rbest;
        double mx = row[best], z = 0;
        for (size_t j = 0; j < vocab; ++j) z += std::exp(static_cast<double>(row[j]) - mx);
        const double lz = mx + std::log(z);
        for (size_t j = 0; j < vocab; ++j)
          kl += std::exp(static_cast<double>(rl[j])) * (static_cast<double>(rl[j]) - (row[j] - lz));
      }
      const double mean_kl = kl / (e - b), top1 = static_cast<double>(agree) / (e - b);
      std::printf("  [%d, %d) top-1 %5.1f%% KL %.2e", b, e, 100 * top1, mean_kl);
      EXPECT_LE(mean_kl, kMaxBlockMeanKl) << text << " positions [" << b << ", " << e << ")";
      EXPECT_GE(top1, kMinTop1Block) << text << " positions [" << b << ", " << e << ")";
      agree_all += agree;
      rows_all += e - b;
      ++blocks;
    }
    std::printf("\n");
  }
  EXPECT_EQ(blocks, 16);  // 2 + 2 + 4 + 4 + 4: every text was read whole
  std::printf("top-1 agreement %d/%d (%.2f%%)\n", agree_all, rows_all, 100.0 * agree_all / rows_all);
  EXPECT_GE(static_cast<double>(agree_all) / rows_all, kMinTop1All);

  const double moved = mass.l1_sum / static_cast<double>(mass.rows);
  const double flushed = mass.flushed_sum / static_cast<double>(mass.rows);
  std::printf(
      "attention rows %lld: probability moved by int8 P mean %.2e (max %.2e), flushed to zero mean %.2e "
      "(max %.2e)\n",
      static_cast<long long>(mass.rows), moved, mass.l1_max, flushed, mass.flushed_max);
  EXPECT_EQ(mass.rows, int64_t{256 + 201 + 3 * 511} * 5 * 8);  // positions x layers x heads
  EXPECT_LE(moved, kMaxMeanMassMoved);
  EXPECT_LE(flushed, kMaxMeanMassFlushed);
}

// --- the random SmolLM and Qwen shapes at a long context ----------------------------------

// A float64 forward pass of LlamaForCausalLM / Qwen2ForCausalLM (default RoPE, no scaling,
// no window: what the two presets are), from the exact f32 weight values the model maker
// writes. Independent of the engine: it shares no code with src/forward.
class Float64Llama {
 public:
  Float64Llama(const modelmaker::ModelShape& s, uint64_t seed) : s_(s) {
    for (const modelmaker::TensorPlan& t : modelmaker::PlanTensors(s)) {
      std::vector<double>& v = t_[t.name];
      v.resize(t.Elements());
      for (uint64_t i = 0; i < v.size(); ++i) v[i] = modelmaker::WeightValue(seed, t.name, i, t.mean, t.std);
    }
  }

  // Logits (rows.size(), vocab) of the positions in `rows` after teacher-forcing ids.
  std::vector<double> Logits(const std::vector<int32_t>& ids, const std::vector<int>& rows) const {
    const int n = static_cast<int>(ids.size()), h = s_.hidden, hd = s_.head_dim;
    const int q_dim = s_.n_heads * hd, kv_dim = s_.n_kv_heads * hd, group = s_.n_heads / s_.n_kv_heads;
    const std::vector<double>& emb = T("model.embed_tokens.weight");
    std::vector<double> x(static_cast<size_t>(n) * h);
    for (int i = 0; i < n; ++i)
      std::copy_n(&emb[static_cast<size_t>(ids[static_cast<size_t>(i)]) * h], h, &x[static_cast<size_t>(i) * h]);
    std::vector<double> inv(static_cast<size_t>(hd / 2));
    for (int i = 0; i < hd / 2; ++i) inv[static_cast<size_t>(i)] = 1.0 / std::pow(s_.rope_theta, 2.0 * i / hd);
    for (int l = 0; l < s_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      std::vector<double> xn = Norm(x, n, T(p + "input_layernorm.weight"));
      std::vector<double> q =
          Linear(xn, n, h, T(p + "self_attn.q_proj.weight"), q_dim, Bias(p + "self_attn.q_proj.bias"));
      std::vector<double> k =
          Linear(xn, n, h, T(p + "self_attn.k_proj.weight"), kv_dim, Bias(p + "self_attn.k_proj.bias"));
      std::vector<double> v =
          Linear(xn, n, h, T(p + "self_attn.v_proj.weight"), kv_dim, Bias(p + "self_attn.v_proj.bias"));
      for (int i = 0; i < n; ++i) {
        for (int hh = 0; hh < s_.n_heads; ++hh) Rope(&q[static_cast<size_t>(i) * q_dim + hh * hd], i, inv);
        for (int g = 0; g < s_.n_kv_heads; ++g) Rope(&k[static_cast<size_t>(i) * kv_dim + g * hd], i, inv);
      }
      std::vector<double> att(static_cast<size_t>(n) * q_dim);
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
      ParallelFor(n, [&](int i) {
        std::vector<double> sc(static_cast<size_t>(i) + 1);
        for (int hh = 0; hh < s_.n_heads; ++hh) {
          const int g = hh / group;  // repeat_kv
          const double* qr = &q[static_cast<size_t>(i) * q_dim + hh * hd];
          double mx = -INFINITY;
          for (int t = 0; t <= i; ++t) {
            sc[static_cast<size_t>(t)] = Dot(qr, &k[static_cast<size_t>(t) * kv_dim + g * hd], hd) * scale;
            mx = std::max(mx, sc[static_cast<size_t>(t)]);
          }
          double z = 0;
          for (int t = 0; t <= i; ++t) z += sc[static_cast<size_t>(t)] = std::exp(sc[static_cast<size_t>(t)] - mx);
          double* o = &att[static_cast<size_t>(i) * q_dim + hh * hd];
          for (int t = 0; t <= i; ++t) {
            const double pt = sc[static_cast<size_t>(t)] / z;
            const double* vr = &v[static_cast<size_t>(t) * kv_dim + g * hd];
            for (int d = 0; d < hd; ++d) o[d] += pt * vr[d];
          }
        }
      });
      std::vector<double> o = Linear(att, n, q_dim, T(p + "self_attn.o_proj.weight"), h, nullptr);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      xn = Norm(x, n, T(p + "post_attention_layernorm.weight"));
      const int f = s_.intermediate;
      std::vector<double> gate = Linear(xn, n, h, T(p + "mlp.gate_proj.weight"), f, nullptr);
      const std::vector<double> up = Linear(xn, n, h, T(p + "mlp.up_proj.weight"), f, nullptr);
      for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      o = Linear(gate, n, f, T(p + "mlp.down_proj.weight"), h, nullptr);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    }
    std::vector<double> last;
    for (int r : rows) last.insert(last.end(), &x[static_cast<size_t>(r) * h], &x[static_cast<size_t>(r + 1) * h]);
    const std::vector<double> xn = Norm(last, static_cast<int>(rows.size()), T("model.norm.weight"));
    return Linear(xn, static_cast<int>(rows.size()), h, T(s_.tied ? "model.embed_tokens.weight" : "lm_head.weight"),
                  s_.vocab, nullptr);
  }

 private:
  const std::vector<double>& T(const std::string& name) const { return t_.at(name); }
  const double* Bias(const std::string& name) const {
    auto it = t_.find(name);
    return it == t_.end() ? nullptr : it->second.data();
  }
  // Four partial sums: the order of a float64 sum changes it by ~1e-16, far below int8.
  static double Dot(const double* a, const double* b, int k) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int t = 0;
    for (; t + 4 <= k; t += 4) {
      s0 += a[t] * b[t];
      s1 += a[t + 1] * b[t + 1];
      s2 += a[t + 2] * b[t + 2];
      s3 += a[t + 3] * b[t + 3];
    }
    for (; t < k; ++t) s0 += a[t] * b[t];
    return (s0 + s1) + (s2 + s3);
  }
  template <typename F>
  static void ParallelFor(int n, F fn) {
    const int threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int w = 0; w < threads; ++w)
      pool.emplace_back([&, w] {
        for (int i = w; i < n; i += threads) fn(i);
      });
    for (std::thread& t : pool) t.join();
  }
  // nn.Linear: y (n, out) = x (n, in) W^T + b, W (out, in).
  static std::vector<double> Linear(const std::vector<double>& x, int n, int in, const std::vector<double>& w, int out,
                                    const double* b) {
    std::vector<double> y(static_cast<size_t>(n) * out);
    ParallelFor(n, [&](int i) {
      for (int j = 0; j < out; ++j)
        y[static_cast<size_t>(i) * out + j] =
            Dot(&x[static_cast<size_t>(i) * in], &w[static_cast<size_t>(j) * in], in) + (b ? b[j] : 0.0);
    });
    return y;
  }
  // LlamaRMSNorm / Qwen2RMSNorm: x * rsqrt(mean(x^2) + eps) * weight.
  std::vector<double> Norm(const std::vector<double>& x, int n, const std::vector<double>& w) const {
    const int h = s_.hidden;
    std::vector<double> y(x.size());
    for (int i = 0; i < n; ++i) {
      const double* r = &x[static_cast<size_t>(i) * h];
      const double inv = 1.0 / std::sqrt(Dot(r, r, h) / h + s_.norm_eps);
      for (int d = 0; d < h; ++d) y[static_cast<size_t>(i) * h + d] = w[static_cast<size_t>(d)] * (r[d] * inv);
    }
    return y;
  }
  // rotate_half with cos/sin of cat(freqs, freqs).
  void Rope(double* v, int pos, const std::vector<double>& inv) const {
    const int half = s_.head_dim / 2;
    for (int i = 0; i < half; ++i) {
      const double a = pos * inv[static_cast<size_t>(i)], c = std::cos(a), sn = std::sin(a);
      const double x1 = v[i], x2 = v[i + half];
      v[i] = x1 * c - x2 * sn;
      v[i + half] = x2 * c + x1 * sn;
    }
  }
  modelmaker::ModelShape s_;
  std::map<std::string, std::vector<double>> t_;
};

struct LongCase {
  std::string name;    // the test's name
  std::string preset;  // the model maker's
  float weight_std;    // 0.02: the preset's (real checkpoints' init); larger: sharper attention
  double max_ratio;    // error at 2,048 tokens / error at 64, at most
};

// ctest lists the case by name, not by its bytes.
void PrintTo(const LongCase& c, std::ostream* os) {
  *os << c.name;
}

class LongContext : public ::testing::TestWithParam<LongCase> {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("daisy_accuracy_" + GetParam().name + "_" + std::to_string(getpid()));
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

// The relative error of the final logits against float64 at a 2,048-token context is at
// most what it is at 64 tokens. The preset's widths, heads, head_dim, RoPE theta and biases,
// with one layer and a vocabulary of 4,096 so that the float64 pass stays a few seconds;
// F32 weights so both passes start from the same values. Positions 0..63 of the 2,048-token
// run are the 64-token run (causal attention; the KV cache and chunking give the same bits),
// so one pass gives both: rows [48, 64) and [2032, 2048).
//
// With the presets' weights (std 0.02, as real checkpoints are initialised) attention is
// nearly uniform, so one int8 term of P already flushes little there (measured ratios 0.895
// and 0.923 with one term, 0.906 and 0.913 with two). The SmolLM shape with std 0.06 has
// sharp and spread attention, where one term of P makes the error grow with the context
// (measured ratio 1.52) and two terms hold it (1.045): that case guards P, with a bound of
// 1.15, not the acceptance figure of 1.
TEST_P(LongContext, ErrorAt2048TokensVersus64) {
  const LongCase& c = GetParam();
  constexpr int kCtx = 2048, kRows = 16;
  constexpr uint64_t kSeed = 31;
  modelmaker::MakeOptions o;
  o.seed = kSeed;
  o.dtype = modelmaker::WeightDType::kF32;
  o.n_layers = 1;
  o.vocab = 4096;
  auto shape = modelmaker::ResolveShape(modelmaker::PresetShape(c.preset), o);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  shape->weight_std = c.weight_std;
  ASSERT_TRUE(modelmaker::MakeModel(*shape, dir_.string(), o).ok());

  // Token ids from a 64-bit LCG (Knuth's MMIX constants), as the reference tools use.
  std::vector<int32_t> ids(kCtx);
  uint64_t st = kSeed;
  for (int32_t& id : ids) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((st >> 33) % static_cast<uint64_t>(shape->vocab));
  }
  std::vector<int> rows;
  for (int i = 64 - kRows; i < 64; ++i) rows.push_back(i);
  for (int i = kCtx - kRows; i < kCtx; ++i) rows.push_back(i);
  const std::vector<double> want = Float64Llama(*shape, kSeed).Logits(ids, rows);

  auto src = OpenLocalFolder(dir_.string());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  auto info = LoadModelInfo(**src);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  const int whole[] = {1};
  auto pipeline = LocalPipeline::Load(**src, *info, whole, kCtx);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status().ToString();
  std::vector<float> got;
  for (int at = 0; at < kCtx; at += 256) {
    auto chunk = pipeline->head().ForwardAll(std::span<const int32_t>(ids).subspan(static_cast<size_t>(at), 256), at);
    ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
    got.insert(got.end(), chunk->begin(), chunk->end());
  }
  const size_t vocab = static_cast<size_t>(shape->vocab);
  ASSERT_EQ(got.size(), static_cast<size_t>(kCtx) * vocab);
  // sqrt(sum (engine - ref)^2 / sum ref^2) over the rows [first, first + kRows) of `rows`.
  auto rel = [&](int first) {
    double num = 0, den = 0;
    for (int r = first; r < first + kRows; ++r)
      for (size_t j = 0; j < vocab; ++j) {
        const double ref = want[static_cast<size_t>(r) * vocab + j];
        const double d = got[static_cast<size_t>(rows[static_cast<size_t>(r)]) * vocab + j] - ref;
        num += d * d;
        den += ref * ref;
      }
    return std::sqrt(num / den);
  };
  const double at64 = rel(0), at2048 = rel(kRows);
  std::printf(
      "%s (weight std %.2f): relative error of the final logits vs float64: %.4e at 64 tokens, %.4e at 2048 "
      "(ratio %.3f, at most %.2f)\n",
      c.preset.c_str(), c.weight_std, at64, at2048, at2048 / at64, c.max_ratio);
  EXPECT_GT(at64, 0.0);  // the engine is int8: equal to float64 would mean the comparison saw nothing
  EXPECT_LE(at2048, c.max_ratio * at64);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LongContext,
                         ::testing::Values(LongCase{"SmolLM", "smollm-135m", 0.02f, 1.0},
                                           LongCase{"Qwen", "qwen2.5-0.5b", 0.02f, 1.0},
                                           LongCase{"SmolLMSharpAttention", "smollm-135m", 0.06f, 1.15}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace daisy
