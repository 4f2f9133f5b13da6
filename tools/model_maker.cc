// Random-weight model folders (see model_maker.h). The safetensors writer follows the
// format's reference implementation: an 8-byte little-endian header length, a compact JSON
// header with "__metadata__" first and the tensors sorted by name, padded with spaces to a
// multiple of 8 bytes (so the data section starts 8-aligned), then the tensors' bytes in
// the same order, back to back.
#include "model_maker.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

namespace daisy::modelmaker {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

uint64_t Mix64(uint64_t z) {  // the SplitMix64 output function
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// f32 -> bf16 bits, round to nearest even (the values are finite).
uint16_t ToBF16(float f) {
  const uint32_t b = std::bit_cast<uint32_t>(f);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// n = (u1 + u2 + u3 + u4 - 2) * sqrt(3): the Irwin-Hall sum of four uniforms, mean 0 and
// variance 1, from the four 16-bit quarters of one SplitMix64 output at counter `index`
// of the stream keyed by (seed, FNV-1a of the name). Integer mixing and a few double
// operations only: the same value on every machine.
uint64_t StreamKey(uint64_t seed, std::string_view name) {
  return Mix64(seed ^ Mix64(Fnv1a(name)));
}

float ValueAt(uint64_t key, uint64_t index, float mean, float std) {
  const uint64_t h = Mix64(key + (index + 1) * 0x9e3779b97f4a7c15ull);
  double sum = 0;
  for (int q = 0; q < 4; ++q) sum += (static_cast<double>((h >> (16 * q)) & 0xffffu) + 0.5) * (1.0 / 65536.0);
  const double n = (sum - 2.0) * 1.7320508075688772;
  return static_cast<float>(static_cast<double>(mean) + static_cast<double>(std) * n);
}

// f32 -> IEEE half bits, round to nearest even, subnormals included (values past 65504
// become infinity, as a cast does).
uint16_t ToF16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) return sign | (mag > 0x7f800000u ? 0x7e00u : 0x7c00u);
  auto round = [](uint32_t v, int shift) {  // v >> shift, to nearest even
    const uint32_t r = v >> shift, rem = v & ((1u << shift) - 1), half = 1u << (shift - 1);
    return r + ((rem > half || (rem == half && (r & 1u))) ? 1u : 0u);
  };
  if (mag < 0x38800000u) {               // below 2^-14: a subnormal half, m x 2^-24
    if (mag < 0x33000000u) return sign;  // at most 2^-25: rounds to zero
    const int e = static_cast<int>(mag >> 23);
    return sign | static_cast<uint16_t>(round((mag & 0x7fffffu) | 0x800000u, 126 - e));
  }
  const uint32_t r = round(mag, 13) - (112u << 10);  // rebias 127 -> 15; a carry may reach infinity
  return sign | static_cast<uint16_t>(std::min<uint32_t>(r, 0x7c00u));
}

size_t ElementSize(WeightDType d) {
  return d == WeightDType::kF32 ? 4 : 2;
}
const char* DTypeString(WeightDType d) {
  return d == WeightDType::kBF16 ? "BF16" : d == WeightDType::kF16 ? "F16" : "F32";
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// The file that holds each tensor: consecutive runs of the sorted list, cut when a shard
// reaches total / n_shards bytes (every shard gets at least one tensor).
std::vector<int> AssignShards(const std::vector<TensorPlan>& plan, int n_shards, size_t elem) {
  std::vector<int> shard(plan.size(), 0);
  if (n_shards <= 1) return shard;
  uint64_t total = 0;
  for (const TensorPlan& t : plan) total += t.Elements() * elem;
  const uint64_t target = (total + n_shards - 1) / n_shards;
  int cur = 0;
  uint64_t in_cur = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const size_t left = plan.size() - i;                                  // tensors still to place, this one included
    const bool must_move = static_cast<int>(left) <= n_shards - 1 - cur;  // later shards need one each
    if (in_cur > 0 && cur < n_shards - 1 && (in_cur >= target || must_move)) {
      ++cur;
      in_cur = 0;
    }
    shard[i] = cur;
    in_cur += plan[i].Elements() * elem;
  }
  return shard;
}

std::string ShardName(int i, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, n);
  return buf;
}

// A file written under "<path>.partial" and renamed by Commit(); removed if abandoned.
class AtomicFile {
 public:
  explicit AtomicFile(fs::path path) : path_(std::move(path)), tmp_(path_.string() + ".partial") {}
  ~AtomicFile() {
    if (f_ != nullptr) std::fclose(f_);
    if (!committed_) {
      std::error_code ec;
      fs::remove(tmp_, ec);
    }
  }
  Status Open() {
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (f_ == nullptr) return Internal("cannot create " + tmp_.string() + ": " + std::strerror(errno));
    return Status::Ok();
  }
  Status Write(const void* data, size_t n) {
    if (n > 0 && std::fwrite(data, 1, n, f_) != n) return Internal("write failed: " + tmp_.string());
    return Status::Ok();
  }
  Status Commit() {
    const int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) return Internal("write failed: " + tmp_.string());
    std::error_code ec;
    fs::rename(tmp_, path_, ec);
    if (ec) return Internal("cannot rename " + tmp_.string() + ": " + ec.message());
    committed_ = true;
    return Status::Ok();
  }

 private:
  fs::path path_, tmp_;
  std::FILE* f_ = nullptr;
  bool committed_ = false;
};

Status WriteText(const fs::path& path, const std::string& text) {
  AtomicFile f(path);
  DAISY_RETURN_IF_ERROR(f.Open());
  DAISY_RETURN_IF_ERROR(f.Write(text.data(), text.size()));
  return f.Commit();
}

// One safetensors file holding plan[i] for the given indices (already in name order).
Status WriteSafetensors(const fs::path& path, const std::vector<TensorPlan>& plan, const std::vector<size_t>& which,
                        const MakeOptions& options) {
  const size_t elem = ElementSize(options.dtype);
  std::string header = R"({"__metadata__":{"format":"pt"})";
  uint64_t offset = 0;
  for (size_t i : which) {
    const uint64_t bytes = plan[i].Elements() * elem;
    header += ",\"" + plan[i].name + "\":{\"dtype\":\"" + DTypeString(options.dtype) +
              "\",\"shape\":" + ShapeString(plan[i].shape) + ",\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int b = 0; b < 8; ++b) len[b] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * b));

  AtomicFile f(path);
  DAISY_RETURN_IF_ERROR(f.Open());
  DAISY_RETURN_IF_ERROR(f.Write(len, 8));
  DAISY_RETURN_IF_ERROR(f.Write(header.data(), header.size()));
  // Stream each tensor in chunks: memory is one chunk, whatever the model size.
  constexpr uint64_t kChunk = 1 << 16;
  std::vector<uint8_t> buf(kChunk * elem);
  for (size_t i : which) {
    const TensorPlan& t = plan[i];
    const uint64_t n = t.Elements();
    const uint64_t key = StreamKey(options.seed, t.name);
    for (uint64_t start = 0; start < n; start += kChunk) {
      const uint64_t count = std::min(kChunk, n - start);
      for (uint64_t j = 0; j < count; ++j) {
        const float v = ValueAt(key, start + j, t.mean, t.std);
        if (options.dtype != WeightDType::kF32) {
          const uint16_t h = options.dtype == WeightDType::kBF16 ? ToBF16(v) : ToF16(v);
          buf[2 * j] = static_cast<uint8_t>(h);
          buf[2 * j + 1] = static_cast<uint8_t>(h >> 8);
        } else {
          const uint32_t w = std::bit_cast<uint32_t>(v);
          for (int b = 0; b < 4; ++b) buf[4 * j + b] = static_cast<uint8_t>(w >> (8 * b));
        }
      }
      DAISY_RETURN_IF_ERROR(f.Write(buf.data(), count * elem));
    }
  }
  return f.Commit();
}

json IdsJson(const std::vector<int>& ids) {
  if (ids.size() == 1) return ids[0];
  return json(ids);
}

// config.json with the field names and conventions of the real checkpoints (keys sorted,
// as transformers writes them).
std::string ConfigJson(const ModelShape& s, const MakeOptions& o) {
  nlohmann::json j;  // std::map keys: sorted
  j["architectures"] = {s.architecture};
  j["model_type"] = s.model_type;
  j["vocab_size"] = s.vocab;
  j["bos_token_id"] = s.bos_id;
  j["eos_token_id"] = s.eos_ids.size() == 1 ? nlohmann::json(s.eos_ids[0]) : nlohmann::json(s.eos_ids);
  j["tie_word_embeddings"] = s.tied;
  j["torch_dtype"] = o.dtype == WeightDType::kBF16 ? "bfloat16" : o.dtype == WeightDType::kF16 ? "float16" : "float32";
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  if (s.naming == Naming::kGpt2) {
    j["n_embd"] = s.hidden;
    j["n_layer"] = s.n_layers;
    j["n_head"] = s.n_heads;
    j["n_positions"] = s.max_positions;
    j["n_ctx"] = s.max_positions;
    j["n_inner"] = nullptr;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = s.norm_eps;
    j["attn_pdrop"] = 0.1;
    j["embd_pdrop"] = 0.1;
    j["resid_pdrop"] = 0.1;
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
  } else {
    j["hidden_size"] = s.hidden;
    j["intermediate_size"] = s.intermediate;
    j["num_hidden_layers"] = s.n_layers;
    j["num_attention_heads"] = s.n_heads;
    j["num_key_value_heads"] = s.n_kv_heads;
    if (s.head_dim * s.n_heads != s.hidden) j["head_dim"] = s.head_dim;
    j["max_position_embeddings"] = s.max_positions;
    j["rms_norm_eps"] = s.norm_eps;
    j["rope_theta"] = s.rope_theta;
    if (s.llama3_factor > 0) {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", s.llama3_factor},
                           {"low_freq_factor", s.llama3_low_freq_factor},
                           {"high_freq_factor", s.llama3_high_freq_factor},
                           {"original_max_position_embeddings", s.llama3_original_max_positions}};
    } else {
      j["rope_scaling"] = nullptr;
    }
    j["hidden_act"] = "silu";
    j["attention_dropout"] = 0.0;
    if (s.model_type == "qwen2") {
      j["use_sliding_window"] = false;
      j["sliding_window"] = s.max_positions;
      j["max_window_layers"] = s.n_layers;
      j["use_mrope"] = false;
    } else if (s.model_type == "mistral") {
      j["sliding_window"] = s.sliding_window > 0 ? nlohmann::json(s.sliding_window) : nlohmann::json(nullptr);
    } else {
      j["attention_bias"] = s.qkv_bias;
      j["mlp_bias"] = false;
      j["pretraining_tp"] = 1;
    }
  }
  return j.dump(2) + "\n";
}

std::string GenerationConfigJson(const ModelShape& s) {
  json j;
  j["_from_model_config"] = true;
  j["bos_token_id"] = s.bos_id;
  j["eos_token_id"] = IdsJson(s.eos_ids);
  return j.dump(2) + "\n";
}

Result<std::string> ReadWholeFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

uint64_t TensorPlan::Elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

float WeightValue(uint64_t seed, std::string_view name, uint64_t index, float mean, float std) {
  return ValueAt(StreamKey(seed, name), index, mean, std);
}

std::vector<std::string> PresetNames() {
  return {"smollm-135m",   "qwen2.5-0.5b", "llama-3.1-8b", "mistral-7b", "gpt2-small-test",
          "tiny-llama-30", "ref-gpt2",     "ref-qwen2",    "ref-llama3", "ref-mistral"};
}

namespace {
// The ref-* presets' spreads: sharp attention, biases that matter (docs/FORWARD.md,
// "Reference logits").
constexpr float kRefWeightStd = 0.15f, kRefBiasStd = 0.5f;
}  // namespace

std::optional<ModelShape> FindPreset(std::string_view name) {
  ModelShape s;
  s.name = std::string(name);
  if (name == "smollm-135m") {
    s.architecture = "LlamaForCausalLM";
    s.model_type = "llama";
    s.hidden = 576, s.intermediate = 1536, s.n_layers = 30, s.n_heads = 9, s.n_kv_heads = 3, s.head_dim = 64;
    s.vocab = 49152, s.max_positions = 8192, s.rope_theta = 100000.0, s.norm_eps = 1e-5;
    s.bos_id = 1, s.eos_ids = {2};
  } else if (name == "qwen2.5-0.5b") {
    s.architecture = "Qwen2ForCausalLM";
    s.model_type = "qwen2";
    s.hidden = 896, s.intermediate = 4864, s.n_layers = 24, s.n_heads = 14, s.n_kv_heads = 2, s.head_dim = 64;
    s.vocab = 151936, s.max_positions = 32768, s.rope_theta = 1000000.0, s.norm_eps = 1e-6;
    s.qkv_bias = true;
    s.bos_id = 151643, s.eos_ids = {151643};
  } else if (name == "llama-3.1-8b") {
    // meta-llama/Llama-3.1-8B's config.json: 8.03 B parameters, 16 GB in BF16.
    s.architecture = "LlamaForCausalLM";
    s.model_type = "llama";
    s.hidden = 4096, s.intermediate = 14336, s.n_layers = 32, s.n_heads = 32, s.n_kv_heads = 8, s.head_dim = 128;
    s.vocab = 128256, s.max_positions = 131072, s.rope_theta = 500000.0, s.norm_eps = 1e-5;
    s.tied = false;
    s.bos_id = 128000, s.eos_ids = {128001, 128008, 128009};
    s.llama3_factor = 8.0, s.llama3_low_freq_factor = 1.0, s.llama3_high_freq_factor = 4.0;
    s.llama3_original_max_positions = 8192;
  } else if (name == "mistral-7b") {
    // mistralai/Mistral-7B-v0.1's config.json (../shared/configs): 7.24 B parameters.
    s.architecture = "MistralForCausalLM";
    s.model_type = "mistral";
    s.hidden = 4096, s.intermediate = 14336, s.n_layers = 32, s.n_heads = 32, s.n_kv_heads = 8, s.head_dim = 128;
    s.vocab = 32000, s.max_positions = 32768, s.rope_theta = 10000.0, s.norm_eps = 1e-5;
    s.tied = false, s.sliding_window = 4096;
    s.bos_id = 1, s.eos_ids = {2};
  } else if (name == "gpt2-small-test") {
    s.architecture = "GPT2LMHeadModel";
    s.model_type = "gpt2";
    s.naming = Naming::kGpt2;
    s.hidden = 64, s.intermediate = 256, s.n_layers = 4, s.n_heads = 4, s.n_kv_heads = 4, s.head_dim = 16;
    s.vocab = 512, s.max_positions = 256, s.norm_eps = 1e-5;
    s.bos_id = -1, s.eos_ids = {-1};  // <|endoftext|>: the last id
  } else if (name == "tiny-llama-30") {
    s.architecture = "LlamaForCausalLM";
    s.model_type = "llama";
    s.hidden = 64, s.intermediate = 128, s.n_layers = 30, s.n_heads = 8, s.n_kv_heads = 4, s.head_dim = 8;
    s.vocab = 512, s.max_positions = 512, s.rope_theta = 10000.0, s.norm_eps = 1e-5;
    s.bos_id = 1, s.eos_ids = {2};  // the stories260K tokenizer's <s> and </s>
  } else if (name == "ref-gpt2" || name == "ref-qwen2" || name == "ref-llama3" || name == "ref-mistral") {
    // Tiny models for the float64 reference (tests/reference/): 2 layers of width 64,
    // 256 ids, values large enough that attention is sharp and every feature matters.
    s.hidden = 64, s.intermediate = 128, s.n_layers = 2, s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 16;
    s.vocab = 256, s.max_positions = 128, s.rope_theta = 10000.0, s.norm_eps = 1e-5;
    s.bos_id = 1, s.eos_ids = {2};
    s.weight_std = kRefWeightStd, s.bias_std = kRefBiasStd, s.norm_std = 0.1f, s.position_std = kRefWeightStd;
    if (name == "ref-gpt2") {
      s.architecture = "GPT2LMHeadModel", s.model_type = "gpt2", s.naming = Naming::kGpt2;
      s.intermediate = 256, s.n_kv_heads = 4;
      s.bos_id = -1, s.eos_ids = {-1};
    } else if (name == "ref-qwen2") {
      s.architecture = "Qwen2ForCausalLM", s.model_type = "qwen2";
      s.norm_eps = 1e-6, s.qkv_bias = true, s.tied = false;
    } else if (name == "ref-llama3") {
      s.architecture = "LlamaForCausalLM", s.model_type = "llama";
      s.max_positions = 256;  // factor x original, as in Llama 3.1's config
      s.llama3_factor = 8.0, s.llama3_low_freq_factor = 1.0, s.llama3_high_freq_factor = 4.0;
      s.llama3_original_max_positions = 32;  // most frequencies scaled within 32 positions
    } else {
      s.architecture = "MistralForCausalLM", s.model_type = "mistral";
      s.sliding_window = 8, s.tied = false;
    }
  } else {
    return std::nullopt;
  }
  return s;
}

ModelShape PresetShape(std::string_view name) {
  std::optional<ModelShape> s = FindPreset(name);
  DAISY_CHECK(s.has_value(), "Bug: unknown model preset '" + std::string(name) + "'");
  return *s;
}

Result<int> TokenizerVocabSize(const std::string& tokenizer_json_path) {
  DAISY_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(tokenizer_json_path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(tokenizer_json_path + " is not valid JSON");
  int64_t max_id = -1;
  auto take = [&max_id](const nlohmann::json& id) {
    if (id.is_number_integer()) max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  };
  if (j.contains("model") && j["model"].contains("vocab")) {
    const nlohmann::json& v = j["model"]["vocab"];
    if (v.is_object()) {
      for (const auto& [piece, id] : v.items()) take(id);
    } else if (v.is_array()) {  // Unigram: [[piece, score], ...] indexed by id
      max_id = std::max<int64_t>(max_id, static_cast<int64_t>(v.size()) - 1);
    }
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const nlohmann::json& t : j["added_tokens"]) {
      if (t.is_object() && t.contains("id")) take(t["id"]);
    }
  }
  if (max_id < 0 || max_id > (1 << 24)) return InvalidArgument(tokenizer_json_path + " holds no usable vocabulary");
  return static_cast<int>(max_id + 1);
}

Result<ModelShape> ResolveShape(const ModelShape& shape, const MakeOptions& options) {
  ModelShape s = shape;
  if (options.n_layers < 0 || options.n_layers > 1000) {
    return InvalidArgument("layers must be in [1, 1000] (0 = the preset's), got " + std::to_string(options.n_layers));
  }
  if (options.n_layers > 0) s.n_layers = options.n_layers;
  if (options.vocab == MakeOptions::kVocabFromTokenizer) {
    if (options.tokenizer_dir.empty())
      return InvalidArgument("the vocabulary size from the tokenizer needs a tokenizer folder");
    DAISY_ASSIGN_OR_RETURN(s.vocab, TokenizerVocabSize((fs::path(options.tokenizer_dir) / "tokenizer.json").string()));
  } else if (options.vocab > 0) {
    s.vocab = options.vocab;
  } else if (options.vocab != 0) {
    return InvalidArgument("vocab must be positive, got " + std::to_string(options.vocab));
  }
  // -1 means the last id; so does an id that a reduced vocabulary no longer holds (a
  // small test model of a big family keeps a valid <eos>).
  const bool reduced = s.vocab != shape.vocab;
  auto fix = [&](int& id) {
    if (id < 0 || (reduced && id >= s.vocab)) id = s.vocab - 1;
  };
  fix(s.bos_id);
  for (int& id : s.eos_ids) fix(id);
  if (options.n_shards < 1 || options.n_shards > 99999) {
    return InvalidArgument("shards must be in [1, 99999], got " + std::to_string(options.n_shards));
  }
  if (s.hidden <= 0 || s.n_layers <= 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 || s.vocab <= 0 ||
      s.intermediate <= 0 || s.max_positions <= 0 || s.n_heads % s.n_kv_heads != 0) {
    return InvalidArgument("model shape '" + s.name + "' is inconsistent");
  }
  if (s.naming == Naming::kGpt2 && (s.n_heads * s.head_dim != s.hidden || s.n_kv_heads != s.n_heads)) {
    return InvalidArgument("GPT-2 shape '" + s.name + "' needs n_heads * head_dim == hidden and no GQA");
  }
  if (s.bos_id >= s.vocab) return InvalidArgument("bos id " + std::to_string(s.bos_id) + " is outside the vocabulary");
  for (int id : s.eos_ids) {
    if (id >= s.vocab) return InvalidArgument("eos id " + std::to_string(id) + " is outside the vocabulary");
  }
  return s;
}

std::vector<TensorPlan> PlanTensors(const ModelShape& s) {
  std::vector<TensorPlan> p;
  const int64_t h = s.hidden, inter = s.intermediate, v = s.vocab;
  auto add = [&p](std::string name, std::vector<int64_t> shape, float mean, float std) {
    p.push_back(TensorPlan{std::move(name), std::move(shape), mean, std});
  };
  const float w_std = s.weight_std, norm_std = s.norm_std, bias_std = s.bias_std;
  if (s.naming == Naming::kGpt2) {
    add("transformer.wte.weight", {v, h}, 0, w_std);                         // (vocab, n_embd)
    add("transformer.wpe.weight", {s.max_positions, h}, 0, s.position_std);  // (n_positions, n_embd)
    for (int l = 0; l < s.n_layers; ++l) {
      const std::string pre = "transformer.h." + std::to_string(l) + ".";
      add(pre + "ln_1.weight", {h}, 1, norm_std);
      add(pre + "ln_1.bias", {h}, 0, bias_std);
      add(pre + "attn.c_attn.weight", {h, 3 * h}, 0, w_std);  // Conv1D: (in, out)
      add(pre + "attn.c_attn.bias", {3 * h}, 0, bias_std);
      add(pre + "attn.c_proj.weight", {h, h}, 0, w_std);
      add(pre + "attn.c_proj.bias", {h}, 0, bias_std);
      add(pre + "ln_2.weight", {h}, 1, norm_std);
      add(pre + "ln_2.bias", {h}, 0, bias_std);
      add(pre + "mlp.c_fc.weight", {h, inter}, 0, w_std);
      add(pre + "mlp.c_fc.bias", {inter}, 0, bias_std);
      add(pre + "mlp.c_proj.weight", {inter, h}, 0, w_std);
      add(pre + "mlp.c_proj.bias", {h}, 0, bias_std);
    }
    add("transformer.ln_f.weight", {h}, 1, norm_std);
    add("transformer.ln_f.bias", {h}, 0, bias_std);
    if (!s.tied) add("lm_head.weight", {v, h}, 0, w_std);
  } else {
    const int64_t q = static_cast<int64_t>(s.n_heads) * s.head_dim,
                  kv = static_cast<int64_t>(s.n_kv_heads) * s.head_dim;
    add("model.embed_tokens.weight", {v, h}, 0, w_std);  // (vocab, hidden)
    for (int l = 0; l < s.n_layers; ++l) {
      const std::string pre = "model.layers." + std::to_string(l) + ".";
      add(pre + "input_layernorm.weight", {h}, 1, norm_std);
      add(pre + "self_attn.q_proj.weight", {q, h}, 0, w_std);  // nn.Linear: (out, in)
      add(pre + "self_attn.k_proj.weight", {kv, h}, 0, w_std);
      add(pre + "self_attn.v_proj.weight", {kv, h}, 0, w_std);
      add(pre + "self_attn.o_proj.weight", {h, q}, 0, w_std);
      if (s.qkv_bias) {
        add(pre + "self_attn.q_proj.bias", {q}, 0, bias_std);
        add(pre + "self_attn.k_proj.bias", {kv}, 0, bias_std);
        add(pre + "self_attn.v_proj.bias", {kv}, 0, bias_std);
      }
      add(pre + "post_attention_layernorm.weight", {h}, 1, norm_std);
      add(pre + "mlp.gate_proj.weight", {inter, h}, 0, w_std);
      add(pre + "mlp.up_proj.weight", {inter, h}, 0, w_std);
      add(pre + "mlp.down_proj.weight", {h, inter}, 0, w_std);
    }
    add("model.norm.weight", {h}, 1, norm_std);
    if (!s.tied) add("lm_head.weight", {v, h}, 0, w_std);
  }
  std::sort(p.begin(), p.end(), [](const TensorPlan& a, const TensorPlan& b) { return a.name < b.name; });
  return p;
}

Status MakeModel(const ModelShape& shape, const std::string& out_dir, const MakeOptions& options) {
  DAISY_ASSIGN_OR_RETURN(const ModelShape s, ResolveShape(shape, options));
  const fs::path dir(out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Internal("cannot create " + out_dir + ": " + ec.message());

  // The tokenizer first: it may refuse the vocabulary before anything large is written.
  if (!options.tokenizer_dir.empty()) {
    const fs::path src(options.tokenizer_dir);
    DAISY_ASSIGN_OR_RETURN(const int tok_vocab, TokenizerVocabSize((src / "tokenizer.json").string()));
    if (tok_vocab > s.vocab) {
      return InvalidArgument("the tokenizer in " + options.tokenizer_dir + " has " + std::to_string(tok_vocab) +
                             " ids but the model's vocabulary is " + std::to_string(s.vocab) +
                             " (use the tokenizer's size as the vocabulary)");
    }
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                             "merges.txt", "tokenizer.model"}) {
      if (!fs::exists(src / name)) continue;
      DAISY_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(src / name));
      DAISY_RETURN_IF_ERROR(WriteText(dir / name, text));
    }
  }

  DAISY_RETURN_IF_ERROR(WriteText(dir / "config.json", ConfigJson(s, options)));
  DAISY_RETURN_IF_ERROR(WriteText(dir / "generation_config.json", GenerationConfigJson(s)));

  const std::vector<TensorPlan> plan = PlanTensors(s);
  const size_t elem = ElementSize(options.dtype);
  if (options.n_shards > static_cast<int>(plan.size())) {
    return InvalidArgument("cannot split " + std::to_string(plan.size()) + " tensors into " +
                           std::to_string(options.n_shards) + " shards");
  }
  if (options.n_shards == 1) {
    std::vector<size_t> all(plan.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return WriteSafetensors(dir / "model.safetensors", plan, all, options);
  }
  const std::vector<int> shard = AssignShards(plan, options.n_shards, elem);
  json weight_map = json::object();
  uint64_t total = 0;
  for (int f = 0; f < options.n_shards; ++f) {
    std::vector<size_t> which;
    for (size_t i = 0; i < plan.size(); ++i) {
      if (shard[i] != f) continue;
      which.push_back(i);
      weight_map[plan[i].name] = ShardName(f, options.n_shards);
      total += plan[i].Elements() * elem;
    }
    DAISY_RETURN_IF_ERROR(WriteSafetensors(dir / ShardName(f, options.n_shards), plan, which, options));
  }
  json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = std::move(weight_map);
  return WriteText(dir / "model.safetensors.index.json", index.dump(2) + "\n");
}

}  // namespace daisy::modelmaker
