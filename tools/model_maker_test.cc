// Tests of the random-weight model maker: the folders it writes must be read back by the
// project's own readers (safetensors index, config -> ModelSpec, tensor names per family),
// follow the safetensors byte format exactly, and be the same bytes for the same seed.
#include "model_maker.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "daisy/model.h"
#include "daisy/safetensors.h"
#include "daisy/source.h"

namespace daisy::modelmaker {
namespace {

namespace fs = std::filesystem;

// A fresh folder per test, removed afterwards.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() / ("daisy_mm_" + std::to_string(::getpid()) + "_" + tag)) {
    fs::remove_all(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  fs::path path() const { return path_; }

 private:
  fs::path path_;
};

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Asserts that a Status is OK and prints it otherwise.
#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const ::daisy::Status st_ = (expr);                       \
    ASSERT_TRUE(st_.ok()) << #expr << ": " << st_.ToString(); \
  } while (0)

std::string ModelsDir() {
  return std::getenv("DAISY_MODELS");
}  // set by tests/test_env.cc

// All tensors of a folder as f32, by name, read through the project's fetch path.
std::map<std::string, std::vector<float>> ReadAll(const std::string& dir) {
  std::map<std::string, std::vector<float>> out;
  auto src = OpenLocalFolder(dir);
  EXPECT_TRUE(src.ok()) << src.status().ToString();
  if (!src.ok()) return out;
  auto index = TensorIndex::Load(**src);
  EXPECT_TRUE(index.ok()) << index.status().ToString();
  if (!index.ok()) return out;
  std::vector<std::string> names;
  for (const TensorInfo& t : index->tensors()) names.push_back(t.name);
  const Status st = FetchTensors(**src, *index, names, [&](const TensorInfo& info, std::span<const float> v) {
    out[info.name].assign(v.begin(), v.end());
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

class PresetTest : public ::testing::TestWithParam<std::string> {};

// Each preset (2 layers, a small vocabulary for the big ones) loads with LoadModelInfo
// (config + generation config + headers + ApplyTensorFacts) and holds exactly the tensors
// the model module asks for.
TEST_P(PresetTest, ParsesWithTheProjectReaders) {
  const ModelShape shape = PresetShape(GetParam());
  TempDir dir("preset_" + GetParam());
  MakeOptions o;
  o.n_layers = shape.hidden >= 4096 ? 1 : 2;  // one 7-8 B layer is already 436 MB of BF16
  if (shape.vocab > 4096) o.vocab = 1000;
  ASSERT_OK(MakeModel(shape, dir.str(), o));

  auto src = OpenLocalFolder(dir.str());
  ASSERT_TRUE(src.ok());
  auto info = LoadModelInfo(**src);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  const ModelSpec& s = info->spec;
  EXPECT_EQ(s.architecture, shape.architecture);
  EXPECT_EQ(s.n_layers, o.n_layers);
  EXPECT_EQ(s.hidden, shape.hidden);
  EXPECT_EQ(s.n_heads, shape.n_heads);
  EXPECT_EQ(s.n_kv_heads, shape.n_kv_heads);
  EXPECT_EQ(s.head_dim, shape.head_dim);
  EXPECT_EQ(s.intermediate, shape.intermediate);
  EXPECT_EQ(s.vocab, o.vocab > 0 ? o.vocab : shape.vocab);
  EXPECT_EQ(s.max_positions, shape.max_positions);
  EXPECT_FLOAT_EQ(s.norm_eps, static_cast<float>(shape.norm_eps));
  EXPECT_EQ(s.tied_embeddings, shape.tied);
  EXPECT_EQ(s.rope_scaling.type, shape.llama3_factor > 0 ? RopeScalingType::kLlama3 : RopeScalingType::kNone);
  if (shape.llama3_factor > 0) {
    EXPECT_EQ(s.rope_scaling.factor, shape.llama3_factor);
    EXPECT_EQ(s.rope_scaling.original_max_position_embeddings, shape.llama3_original_max_positions);
  }
  EXPECT_EQ(s.use_sliding_window, shape.sliding_window > 0);
  if (shape.sliding_window > 0) EXPECT_EQ(s.sliding_window, shape.sliding_window);
  EXPECT_EQ(s.qkv_bias, shape.qkv_bias || shape.naming == Naming::kGpt2);
  if (shape.naming == Naming::kGpt2) {
    EXPECT_EQ(s.family, Family::kGpt2);
    EXPECT_EQ(s.layout, WeightLayout::kInOut);
    EXPECT_EQ(s.bos_id, s.vocab - 1);
  } else {
    EXPECT_EQ(s.family, Family::kLlama);
    EXPECT_EQ(s.rope_theta, shape.rope_theta);
    // Qwen's 151643 does not fit the reduced test vocabulary and becomes its last id.
    const int expected_bos = shape.bos_id < (o.vocab > 0 ? o.vocab : shape.vocab) ? shape.bos_id : o.vocab - 1;
    EXPECT_EQ(s.bos_id, expected_bos);
  }
  const std::vector<std::string> wanted = StageTensorNames(s, 0, s.n_layers, /*is_head=*/true);
  std::set<std::string> have;
  for (const TensorInfo& t : info->index.tensors()) {
    have.insert(t.name);
    EXPECT_EQ(t.dtype, DType::kBF16) << t.name;
  }
  EXPECT_EQ(std::set<std::string>(wanted.begin(), wanted.end()), have);
}

INSTANTIATE_TEST_SUITE_P(AllPresets, PresetTest, ::testing::ValuesIn(PresetNames()));

// The full shapes have the parameter counts of the real checkpoints they imitate.
TEST(ModelMakerTest, FullShapesHaveTheRealParameterCounts) {
  auto count = [](const std::string& name) {
    uint64_t n = 0;
    for (const TensorPlan& t : PlanTensors(PresetShape(name))) n += t.Elements();
    return n;
  };
  EXPECT_EQ(count("smollm-135m"), 134515008u);    // SmolLM2-135M
  EXPECT_EQ(count("qwen2.5-0.5b"), 494032768u);   // Qwen2.5-0.5B
  EXPECT_EQ(count("llama-3.1-8b"), 8030261248u);  // Llama-3.1-8B
  EXPECT_EQ(count("mistral-7b"), 7241732096u);    // Mistral-7B-v0.1
  EXPECT_EQ(PresetShape("tiny-llama-30").n_layers, 30);
  EXPECT_FALSE(FindPreset("llama-70b").has_value());
}

TEST(ModelMakerTest, Gpt2UsesTheHuggingFaceNamesAndConv1DLayout) {
  TempDir dir("gpt2names");
  MakeOptions o;
  o.n_layers = 1;
  ASSERT_OK(MakeModel(PresetShape("gpt2-small-test"), dir.str(), o));
  auto src = OpenLocalFolder(dir.str());
  ASSERT_TRUE(src.ok());
  auto index = TensorIndex::Load(**src);
  ASSERT_TRUE(index.ok());
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"transformer.wte.weight", {512, 64}},
      {"transformer.wpe.weight", {256, 64}},
      {"transformer.h.0.ln_1.weight", {64}},
      {"transformer.h.0.ln_1.bias", {64}},
      {"transformer.h.0.attn.c_attn.weight", {64, 192}},
      {"transformer.h.0.attn.c_attn.bias", {192}},
      {"transformer.h.0.attn.c_proj.weight", {64, 64}},
      {"transformer.h.0.attn.c_proj.bias", {64}},
      {"transformer.h.0.ln_2.weight", {64}},
      {"transformer.h.0.ln_2.bias", {64}},
      {"transformer.h.0.mlp.c_fc.weight", {64, 256}},
      {"transformer.h.0.mlp.c_fc.bias", {256}},
      {"transformer.h.0.mlp.c_proj.weight", {256, 64}},
      {"transformer.h.0.mlp.c_proj.bias", {64}},
      {"transformer.ln_f.weight", {64}},
      {"transformer.ln_f.bias", {64}},
  };
  std::map<std::string, std::vector<int64_t>> got;
  for (const TensorInfo& t : index->tensors()) got[t.name] = t.shape;
  EXPECT_EQ(got, expected);
}

// Byte-level check of the writer against the format: 8-byte LE length, JSON header with
// __metadata__ first and tensors sorted by name, padded with spaces to a multiple of 8,
// data back to back in header order up to the end of the file.
TEST(ModelMakerTest, SafetensorsBytesFollowTheFormat) {
  TempDir dir("format");
  MakeOptions o;
  o.n_layers = 3;
  ASSERT_OK(MakeModel(PresetShape("qwen2.5-0.5b"), dir.str(), [&] {
    MakeOptions x = o;
    x.vocab = 300;
    return x;
  }()));
  const std::string bytes = Slurp(dir.path() / "model.safetensors");
  ASSERT_GT(bytes.size(), 8u);
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<uint8_t>(bytes[b]);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.rfind(R"({"__metadata__":{"format":"pt"},)", 0), 0u);
  const size_t close = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "padding must be spaces";
  EXPECT_LT(header.size() - close - 1, 8u);

  auto parsed = ParseSafetensorsHeader("model.safetensors", header, n, bytes.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->metadata.at("format"), "pt");
  // Sorted by offset (ParseSafetensorsHeader's order) is sorted by name, contiguous.
  uint64_t expect_offset = 8 + n;
  std::string prev;
  for (const TensorInfo& t : parsed->tensors) {
    EXPECT_LT(prev, t.name);
    EXPECT_EQ(t.offset, expect_offset) << t.name;
    expect_offset += t.bytes;
    prev = t.name;
  }
  EXPECT_EQ(expect_offset, bytes.size());
  // The name order in the JSON text is the same order.
  size_t last = 0;
  for (const TensorInfo& t : parsed->tensors) {
    const size_t at = header.find("\"" + t.name + "\":{\"dtype\":\"BF16\",\"shape\":[");
    ASSERT_NE(at, std::string::npos) << t.name;
    EXPECT_GT(at, last);
    last = at;
  }
}

// Same seed, same bytes (pinned, so a change of the generator is deliberate); another
// seed, other bytes.
TEST(ModelMakerTest, SameSeedGivesTheSameBytesOnEveryMachine) {
  TempDir a("seed_a"), b("seed_b"), c("seed_c");
  MakeOptions o;
  o.n_layers = 1;
  ASSERT_OK(MakeModel(PresetShape("tiny-llama-30"), a.str(), o));
  ASSERT_OK(MakeModel(PresetShape("tiny-llama-30"), b.str(), o));
  o.seed = 2;
  ASSERT_OK(MakeModel(PresetShape("tiny-llama-30"), c.str(), o));
  const std::string fa = Slurp(a.path() / "model.safetensors");
  EXPECT_EQ(fa, Slurp(b.path() / "model.safetensors"));
  EXPECT_NE(fa, Slurp(c.path() / "model.safetensors"));
  EXPECT_EQ(Fnv1a(fa), 0x90d12765b466bac1ull) << std::hex << Fnv1a(fa);
  EXPECT_EQ(WeightValue(1, "model.norm.weight", 0, 1.0f, 0.02f), WeightValue(1, "model.norm.weight", 0, 1.0f, 0.02f));
}

TEST(ModelMakerTest, WeightsHaveTheIntendedDistribution) {
  TempDir dir("dist");
  MakeOptions o;
  o.n_layers = 1;
  o.dtype = WeightDType::kF32;
  ASSERT_OK(MakeModel(PresetShape("tiny-llama-30"), dir.str(), o));
  const auto all = ReadAll(dir.str());
  auto stats = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x;
    const double mean = s / v.size();
    for (float x : v) s2 += (x - mean) * (x - mean);
    return std::pair<double, double>(mean, std::sqrt(s2 / v.size()));
  };
  const auto [emb_mean, emb_std] = stats(all.at("model.embed_tokens.weight"));  // 32768 values
  EXPECT_NEAR(emb_mean, 0.0, 0.001);
  EXPECT_NEAR(emb_std, 0.02, 0.001);
  const auto [norm_mean, norm_std] = stats(all.at("model.norm.weight"));
  EXPECT_NEAR(norm_mean, 1.0, 0.01);
  EXPECT_GT(norm_std, 0.005);
  for (const auto& [name, v] : all) {
    for (float x : v) ASSERT_TRUE(std::isfinite(x)) << name;
  }
}

// BF16 is the F32 value rounded to nearest even, and a sharded folder holds the same
// tensors with the same values as the single file.
TEST(ModelMakerTest, Bf16AndShardedFoldersHoldTheSameValues) {
  TempDir f32("f32"), bf16("bf16"), sharded("sharded");
  MakeOptions o;
  o.n_layers = 2;
  o.dtype = WeightDType::kF32;
  ASSERT_OK(MakeModel(PresetShape("gpt2-small-test"), f32.str(), o));
  o.dtype = WeightDType::kBF16;
  ASSERT_OK(MakeModel(PresetShape("gpt2-small-test"), bf16.str(), o));
  o.n_shards = 3;
  ASSERT_OK(MakeModel(PresetShape("gpt2-small-test"), sharded.str(), o));

  EXPECT_FALSE(fs::exists(sharded.path() / "model.safetensors"));
  for (const char* f : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                        "model-00003-of-00003.safetensors", "model.safetensors.index.json"}) {
    EXPECT_TRUE(fs::exists(sharded.path() / f)) << f;
  }
  auto src = OpenLocalFolder(sharded.str());
  ASSERT_TRUE(src.ok());
  auto index = TensorIndex::Load(**src);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->files().size(), 3u);
  const std::string idx = Slurp(sharded.path() / "model.safetensors.index.json");
  uint64_t total = 0;
  for (const TensorInfo& t : index->tensors()) total += t.bytes;
  EXPECT_NE(idx.find("\"total_size\": " + std::to_string(total)), std::string::npos) << idx;

  const auto a = ReadAll(f32.str()), b = ReadAll(bf16.str()), c = ReadAll(sharded.str());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(b, c);
  for (const auto& [name, va] : a) {
    const std::vector<float>& vb = b.at(name);
    ASSERT_EQ(va.size(), vb.size());
    for (size_t i = 0; i < va.size(); ++i) {
      const uint32_t bits = std::bit_cast<uint32_t>(va[i]);
      const uint32_t rounded = ((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16) << 16;
      ASSERT_EQ(std::bit_cast<uint32_t>(vb[i]), rounded) << name << "[" << i << "]";
    }
  }
}

// F16 is the F32 value rounded to nearest even at half precision, subnormals included: each
// read-back value is the half nearest the F32 one (no other half is closer).
TEST(ModelMakerTest, F16FoldersHoldTheNearestHalves) {
  TempDir f32("f32h"), f16("f16");
  MakeOptions o;
  o.n_layers = 1;
  o.dtype = WeightDType::kF32;
  ASSERT_OK(MakeModel(PresetShape("gpt2-small-test"), f32.str(), o));
  o.dtype = WeightDType::kF16;
  ASSERT_OK(MakeModel(PresetShape("gpt2-small-test"), f16.str(), o));
  EXPECT_NE(Slurp(f16.path() / "model.safetensors").find("\"dtype\":\"F16\""), std::string::npos);
  const auto a = ReadAll(f32.str()), h = ReadAll(f16.str());
  ASSERT_EQ(a.size(), h.size());
  int subnormals = 0;
  for (const auto& [name, va] : a) {
    const std::vector<float>& vh = h.at(name);
    ASSERT_EQ(va.size(), vh.size());
    for (size_t i = 0; i < va.size(); ++i) {
      const double x = va[i], got = vh[i];
      if (std::fabs(got) < 6.103515625e-05) ++subnormals;
      // The neighbours of `got` one half-ulp step away are no closer to x (ties: even).
      const double ulp = std::ldexp(1.0, std::max(-24, std::ilogb(got == 0 ? 6.103515625e-05 : got) - 10));
      ASSERT_LE(std::fabs(x - got), ulp / 2) << name << "[" << i << "] " << x << " -> " << got;
    }
  }
  EXPECT_GT(subnormals, 0);  // values near zero took the subnormal path
}

TEST(ModelMakerTest, CopiesTheTokenizerAndCanTakeItsVocabularySize) {
  TempDir dir("tok");
  MakeOptions o;
  o.n_layers = 1;
  o.tokenizer_dir = ModelsDir() + "/stories260K";
  o.vocab = MakeOptions::kVocabFromTokenizer;
  ASSERT_OK(MakeModel(PresetShape("gpt2-small-test"), dir.str(), o));
  EXPECT_EQ(Slurp(dir.path() / "tokenizer.json"), Slurp(o.tokenizer_dir + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(dir.path() / "tokenizer_config.json"));
  auto n = TokenizerVocabSize(o.tokenizer_dir + "/tokenizer.json");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 512);
  // A tokenizer with more ids than the model has rows is refused before any weights.
  TempDir small("tok_small");
  o.vocab = 100;
  const Status st = MakeModel(PresetShape("gpt2-small-test"), small.str(), o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("512"), std::string::npos) << st.message();
  EXPECT_FALSE(fs::exists(small.path() / "model.safetensors"));
}

TEST(ModelMakerTest, RefusesBadOptions) {
  TempDir dir("bad");
  MakeOptions o;
  o.n_layers = -3;
  EXPECT_FALSE(MakeModel(PresetShape("tiny-llama-30"), dir.str(), o).ok());
  o.n_layers = 1;
  o.n_shards = 0;
  EXPECT_FALSE(MakeModel(PresetShape("tiny-llama-30"), dir.str(), o).ok());
  o.n_shards = 1000;  // more shards than tensors
  EXPECT_FALSE(MakeModel(PresetShape("tiny-llama-30"), dir.str(), o).ok());
  o.n_shards = 1;
  o.vocab = MakeOptions::kVocabFromTokenizer;  // without a tokenizer
  EXPECT_FALSE(MakeModel(PresetShape("tiny-llama-30"), dir.str(), o).ok());
}

// Runs the CLI in a child process and returns its exit status and peak RSS (KiB).
std::pair<int, long> RunMakeModel(const std::vector<std::string>& args) {
  const std::string bin = std::string(std::getenv("DAISY_BIN_DIR")) + "/tools/make_model";
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(bin.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage ru {};
  ::wait4(pid, &status, 0, &ru);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ru.ru_maxrss};
}

// Tensors are streamed: writing a 113 MB F32 file (smollm-135m, 1 layer: the 49152 x 576
// embedding alone is 28M floats) stays far below the file's size in memory.
TEST(ModelMakerTest, CliStreamsTensorsWithBoundedMemory) {
  TempDir dir("cli");
  const auto [rc, rss_kib] =
      RunMakeModel({"--preset", "smollm-135m", "--layers", "1", "--dtype", "f32", "--out", dir.str()});
  ASSERT_EQ(rc, 0);
  const uint64_t size = fs::file_size(dir.path() / "model.safetensors");
  EXPECT_GT(size, 110u << 20);
  EXPECT_LT(static_cast<uint64_t>(rss_kib) * 1024, size / 4) << "peak RSS " << rss_kib << " KiB";
  EXPECT_EQ(RunMakeModel({"--preset", "no-such-model", "--out", dir.str()}).first, 2);
  // An unknown dtype is refused (f16 was, before make_model wrote F16; it is accepted now).
  EXPECT_EQ(RunMakeModel({"--preset", "tiny-llama-30", "--dtype", "f8", "--out", dir.str()}).first, 2);
  EXPECT_EQ(RunMakeModel({"--preset", "tiny-llama-30", "--dtype", "f16", "--out", dir.str()}).first, 0);
}

}  // namespace
}  // namespace daisy::modelmaker
