// config.json -> ModelSpec. Every field that changes the arithmetic is read, validated and
// either supported exactly or refused by name: fluent wrong text is worse than an error.
#include <nlohmann/json.hpp>
#include <set>

#include "daisy/model.h"

namespace daisy {

using nlohmann::json;

std::string_view FamilyName(Family f) {
  switch (f) {
    case Family::kLlama:
      return "llama";
    case Family::kGpt2:
      return "gpt2";
  }
  return "?";
}

namespace {

constexpr const char* kSupported = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel";

// Bounds that keep later allocations sane; real models sit far inside them.
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHidden = 1 << 17;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxPositions = 1 << 24;

struct Reader {
  const json& j;
  std::string error;

  bool Has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

  // A positive integer field within [1, max]; `fallback` used when absent (0: required).
  int Int(const char* key, int64_t max, int64_t fallback = 0) {
    if (!error.empty()) return 0;
    if (!Has(key)) {
      if (fallback > 0) return static_cast<int>(fallback);
      error = std::string("config.json has no '") + key + "'";
      return 0;
    }
    const json& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > max) {
      error = std::string("config.json field '") + key + "' must be an integer in [1, " + std::to_string(max) +
              "], found " + v.dump();
      return 0;
    }
    return static_cast<int>(v.get<int64_t>());
  }

  double Num(const char* key, double fallback) {
    if (!error.empty() || !Has(key)) return fallback;
    const json& v = j[key];
    if (!v.is_number()) {
      error = std::string("config.json field '") + key + "' must be a number, found " + v.dump();
      return fallback;
    }
    return v.get<double>();
  }

  bool Bool(const char* key, bool fallback) {
    if (!error.empty() || !Has(key)) return fallback;
    if (!j[key].is_boolean()) {
      error = std::string("config.json field '") + key + "' must be true or false, found " + j[key].dump();
      return fallback;
    }
    return j[key].get<bool>();
  }

  std::string Str(const char* key, const std::string& fallback) {
    if (!error.empty() || !Has(key)) return fallback;
    if (!j[key].is_string()) {
      error = std::string("config.json field '") + key + "' must be a string, found " + j[key].dump();
      return fallback;
    }
    return j[key].get<std::string>();
  }
};

// eos_token_id may be an int or a list of ints.
Status AddIds(const json& j, const char* key, const std::string& file, std::vector<int>& out) {
  if (!j.contains(key) || j[key].is_null()) return Status::Ok();
  auto add = [&](const json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxVocab)
      return InvalidArgument(file + " field '" + key + "' holds an invalid token id " + v.dump());
    int id = static_cast<int>(v.get<int64_t>());
    for (int e : out)
      if (e == id) return Status::Ok();
    out.push_back(id);
    return Status::Ok();
  };
  if (j[key].is_array()) {
    for (const auto& v : j[key]) DAISY_RETURN_IF_ERROR(add(v));
    return Status::Ok();
  }
  return add(j[key]);
}

Status ParseRopeScaling(const json& j, ModelSpec& spec) {
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return Status::Ok();
  const json& rs = j["rope_scaling"];
  if (!rs.is_object()) return InvalidArgument("config.json field 'rope_scaling' must be an object or null");
  std::string type;
  if (rs.contains("rope_type") && rs["rope_type"].is_string())
    type = rs["rope_type"].get<std::string>();
  else if (rs.contains("type") && rs["type"].is_string())
    type = rs["type"].get<std::string>();
  if (type == "default") return Status::Ok();
  if (type != "llama3")
    return Unimplemented("rope_scaling type '" + (type.empty() ? std::string("(missing)") : type) +
                         "' is not supported (supported: llama3)");
  Reader r{rs, {}};
  spec.rope_scaling.type = RopeScalingType::kLlama3;
  spec.rope_scaling.factor = r.Num("factor", 0);
  spec.rope_scaling.low_freq_factor = r.Num("low_freq_factor", 0);
  spec.rope_scaling.high_freq_factor = r.Num("high_freq_factor", 0);
  spec.rope_scaling.original_max_position_embeddings = r.Int("original_max_position_embeddings", kMaxPositions);
  if (!r.error.empty()) return InvalidArgument("rope_scaling: " + r.error);
  if (!(spec.rope_scaling.factor >= 1) || !(spec.rope_scaling.low_freq_factor > 0) ||
      !(spec.rope_scaling.high_freq_factor > spec.rope_scaling.low_freq_factor))
    return InvalidArgument("rope_scaling llama3 needs factor >= 1 and high_freq_factor > low_freq_factor > 0");
  return Status::Ok();
}

Status ParseLlama(const json& j, ModelSpec& spec) {
  Reader r{j, {}};
  spec.family = Family::kLlama;
  spec.hidden = r.Int("hidden_size", kMaxHidden);
  spec.n_layers = r.Int("num_hidden_layers", kMaxLayers);
  spec.n_heads = r.Int("num_attention_heads", 4096);
  spec.n_kv_heads = r.Int("num_key_value_heads", 4096, spec.n_heads);
  spec.intermediate = r.Int("intermediate_size", kMaxHidden * 8);
  spec.vocab = r.Int("vocab_size", kMaxVocab);
  spec.max_positions = r.Int("max_position_embeddings", kMaxPositions);
  if (!r.error.empty()) return InvalidArgument(r.error);
  spec.head_dim = r.Int("head_dim", 4096, spec.hidden / spec.n_heads);
  spec.norm = NormType::kRmsNorm;
  spec.norm_eps = static_cast<float>(r.Num("rms_norm_eps", 1e-6));
  spec.rope_theta = r.Num("rope_theta", 10000.0);
  spec.tied_embeddings = r.Bool("tie_word_embeddings", false);
  const std::string act = r.Str("hidden_act", "silu");
  const bool interleaved = r.Bool("rope_interleaved", false);
  const bool mrope = r.Bool("use_mrope", false);
  const int pretraining_tp = r.Has("pretraining_tp") ? r.Int("pretraining_tp", 64) : 1;
  if (!r.error.empty()) return InvalidArgument(r.error);
  (void)pretraining_tp;  // a training-time slicing of the same products: no effect on the maths
  if (act != "silu")
    return Unimplemented("hidden_act '" + act + "' is not supported for " + spec.architecture + " (supported: silu)");
  if (interleaved) return Unimplemented("rope_interleaved true is not supported (rotate_half RoPE only)");
  if (mrope) return Unimplemented("use_mrope true (multimodal RoPE) is not supported");
  if (spec.n_heads % spec.n_kv_heads != 0)
    return InvalidArgument("num_attention_heads (" + std::to_string(spec.n_heads) +
                           ") is not a multiple of num_key_value_heads (" + std::to_string(spec.n_kv_heads) + ")");
  if (spec.head_dim % 2 != 0)
    return InvalidArgument("head_dim " + std::to_string(spec.head_dim) + " is odd; RoPE needs pairs");
  if (!(spec.rope_theta > 0)) return InvalidArgument("rope_theta must be positive");
  if (!(spec.norm_eps > 0)) return InvalidArgument("rms_norm_eps must be positive");
  spec.activation = Activation::kSilu;
  spec.gated_mlp = true;
  spec.layout = WeightLayout::kOutIn;
  DAISY_RETURN_IF_ERROR(ParseRopeScaling(j, spec));

  // Sliding windows: Mistral applies `sliding_window` on every layer; Qwen2 only when
  // use_sliding_window is true, on layers at or after max_window_layers.
  if (spec.architecture == "MistralForCausalLM") {
    if (r.Has("sliding_window")) {
      spec.sliding_window = r.Int("sliding_window", kMaxPositions);
      spec.use_sliding_window = true;
      spec.max_window_layers = 0;
    }
  } else if (spec.architecture == "Qwen2ForCausalLM") {
    spec.use_sliding_window = r.Bool("use_sliding_window", false);
    if (r.Has("sliding_window")) spec.sliding_window = r.Int("sliding_window", kMaxPositions);
    spec.max_window_layers = r.Has("max_window_layers") ? r.Int("max_window_layers", kMaxLayers) : spec.n_layers;
    if (spec.use_sliding_window && spec.sliding_window == 0)
      return InvalidArgument("use_sliding_window is true but sliding_window is missing");
  } else if (r.Bool("use_sliding_window", false)) {
    return Unimplemented("use_sliding_window is not supported for " + spec.architecture);
  }
  if (!r.error.empty()) return InvalidArgument(r.error);
  return Status::Ok();
}

Status ParseGpt2(const json& j, ModelSpec& spec) {
  Reader r{j, {}};
  spec.family = Family::kGpt2;
  spec.hidden = r.Int("n_embd", kMaxHidden);
  spec.n_layers = r.Int("n_layer", kMaxLayers);
  spec.n_heads = r.Int("n_head", 4096);
  spec.vocab = r.Int("vocab_size", kMaxVocab);
  spec.max_positions = r.Int("n_positions", kMaxPositions);
  if (!r.error.empty()) return InvalidArgument(r.error);
  spec.intermediate = r.Int("n_inner", kMaxHidden * 8, 4 * static_cast<int64_t>(spec.hidden));
  spec.norm_eps = static_cast<float>(r.Num("layer_norm_epsilon", 1e-5));
  spec.tied_embeddings = r.Bool("tie_word_embeddings", true);
  const std::string act = r.Str("activation_function", "gelu_new");
  const bool inv_layer = r.Bool("scale_attn_by_inverse_layer_idx", false);
  const bool reorder = r.Bool("reorder_and_upcast_attn", false);
  const bool scale_attn = r.Bool("scale_attn_weights", true);
  if (!r.error.empty()) return InvalidArgument(r.error);
  if (act != "gelu_new")
    return Unimplemented("activation_function '" + act + "' is not supported for GPT-2 (supported: gelu_new)");
  if (inv_layer) return Unimplemented("scale_attn_by_inverse_layer_idx true is not supported");
  if (reorder) return Unimplemented("reorder_and_upcast_attn true is not supported");
  if (!scale_attn) return Unimplemented("scale_attn_weights false is not supported");
  if (spec.hidden % spec.n_heads != 0)
    return InvalidArgument("n_embd (" + std::to_string(spec.hidden) + ") is not a multiple of n_head (" +
                           std::to_string(spec.n_heads) + ")");
  spec.n_kv_heads = spec.n_heads;
  spec.head_dim = spec.hidden / spec.n_heads;
  spec.norm = NormType::kLayerNorm;
  spec.activation = Activation::kGeluNew;
  spec.gated_mlp = false;
  spec.learned_positions = true;
  spec.fused_qkv = true;
  spec.layout = WeightLayout::kInOut;
  spec.tensor_prefix = "transformer.";
  spec.qkv_bias = spec.o_bias = spec.mlp_bias = true;  // GPT-2 always has them
  return Status::Ok();
}

}  // namespace

Result<ModelSpec> SpecFromConfig(std::string_view config_json) {
  json j;
  try {
    j = json::parse(config_json.begin(), config_json.end());
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("config.json is not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) return InvalidArgument("config.json is not a JSON object");
  ModelSpec spec;
  if (j.contains("model_type") && j["model_type"].is_string()) spec.model_type = j["model_type"].get<std::string>();
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
    if (j["architectures"].size() != 1 || !j["architectures"][0].is_string())
      return InvalidArgument("config.json 'architectures' must list exactly one class name, found " +
                             j["architectures"].dump());
    spec.architecture = j["architectures"][0].get<std::string>();
  } else {
    return InvalidArgument("config.json has no 'architectures' (model_type '" + spec.model_type + "')");
  }

  Status st;
  if (spec.architecture == "LlamaForCausalLM" || spec.architecture == "MistralForCausalLM" ||
      spec.architecture == "Qwen2ForCausalLM") {
    st = ParseLlama(j, spec);
  } else if (spec.architecture == "GPT2LMHeadModel") {
    st = ParseGpt2(j, spec);
  } else {
    return Unimplemented("architecture '" + spec.architecture + "' is not supported (supported: " + kSupported + ")");
  }
  if (!st.ok()) return st.WithContext(spec.architecture);
  // The KV cache holds keys in groups of 4 dimensions (forward.h KvCache::KeyAt); every
  // published model of these families has such heads.
  if (spec.head_dim % 4 != 0)
    return Unimplemented(spec.architecture + ": head_dim " + std::to_string(spec.head_dim) +
                         " is not a multiple of 4 (not supported)");
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) spec.bos_id = j["bos_token_id"].get<int>();
  DAISY_RETURN_IF_ERROR(AddIds(j, "eos_token_id", "config.json", spec.eos_ids));
  return spec;
}

Status ApplyGenerationConfig(ModelSpec& spec, std::string_view generation_config_json) {
  json j;
  try {
    j = json::parse(generation_config_json.begin(), generation_config_json.end());
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("generation_config.json is not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) return InvalidArgument("generation_config.json is not a JSON object");
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) spec.bos_id = j["bos_token_id"].get<int>();
  return AddIds(j, "eos_token_id", "generation_config.json", spec.eos_ids);
}

}  // namespace daisy
