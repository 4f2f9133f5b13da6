// config.json -> one normalized ModelSpec, tensor-name maps per family, and the tensor list
// a layer range needs. Unknown architectures, unsupported rope_scaling types and other
// values that would change the arithmetic are refused by name, never approximated.
// Value types; functions are thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/safetensors.h"
#include "daisy/source.h"
#include "daisy/status.h"

namespace daisy {

enum class Family : uint8_t { kLlama, kGpt2 };
enum class NormType : uint8_t { kRmsNorm, kLayerNorm };
enum class Activation : uint8_t { kSilu, kGeluNew };
// kOutIn: nn.Linear, weight (out, in), y = W x.  kInOut: GPT-2 Conv1D, weight (in, out).
enum class WeightLayout : uint8_t { kOutIn, kInOut };
enum class RopeScalingType : uint8_t { kNone, kLlama3 };

std::string_view FamilyName(Family f);

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelSpec {
  Family family = Family::kLlama;
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string model_type;    // e.g. "llama"
  int n_layers = 0;
  int hidden = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int intermediate = 0;
  int vocab = 0;
  int max_positions = 0;
  NormType norm = NormType::kRmsNorm;
  float norm_eps = 1e-5f;
  Activation activation = Activation::kSilu;
  bool gated_mlp = true;
  bool learned_positions = false;  // GPT-2 wpe
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tied_embeddings = false;
  bool fused_qkv = false;  // GPT-2 c_attn
  // Bias presence comes from the tensors (ApplyTensorFacts), not from config flags.
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  WeightLayout layout = WeightLayout::kOutIn;
  std::string tensor_prefix;  // GPT-2: "transformer." or "" (both layouts exist on the Hub)
  bool use_sliding_window = false;
  int sliding_window = 0;     // 0: none
  int max_window_layers = 0;  // layers >= this use the window (Qwen2)
  std::optional<int> bos_id;
  std::vector<int> eos_ids;  // config.json + generation_config.json
};

// Parses config.json. Refuses unknown architectures and rope_scaling types by name.
Result<ModelSpec> SpecFromConfig(std::string_view config_json);
// Adds generation_config.json facts (eos_token_id int or list, bos).
Status ApplyGenerationConfig(ModelSpec& spec, std::string_view generation_config_json);
// Bias presence, tied embeddings and shapes from the tensor index; refuses a mismatch
// between config and tensors (e.g. a missing layer tensor) by name.
Status ApplyTensorFacts(ModelSpec& spec, const TensorIndex& index);

// Reads config.json, generation_config.json (optional) and the safetensors headers.
struct ModelInfo {
  ModelSpec spec;
  TensorIndex index;
};
Result<ModelInfo> LoadModelInfo(ModelSource& source);

// Tensor names. Layer tensors for layer l; the head's tensors (embedding, positions,
// final norm, LM head when untied).
std::vector<std::string> LayerTensorNames(const ModelSpec& spec, int layer);
std::vector<std::string> HeadTensorNames(const ModelSpec& spec);
// All tensors a stage holding layers [first, end) needs, plus the head's when is_head.
std::vector<std::string> StageTensorNames(const ModelSpec& spec, int first, int end, bool is_head);
// Bytes of those tensors as stored (the download size).
uint64_t TensorBytes(const TensorIndex& index, const std::vector<std::string>& names);

// Canonical tensor names used by the forward pass, mapped from the family's names.
// Narrow models (hidden width at most kNarrowHidden, as stories260K) run with finer
// arithmetic: every weight matrix, every query row and every value row as two int8 terms
// (the second quantizes the first's residual), not one. There int8 is the largest relative
// error (measured on stories260K: mean KL against float64 7e-4 with one term, 5e-8 with two)
// and the extra int8 work costs little in absolute terms; wider models (SmolLM, Qwen and up)
// keep one term, since their decode streams the weights and two terms would double it. A
// function of the shape only, so every device of a ring makes the same choice
// (docs/KERNELS.md, "Narrow models").
inline constexpr int kNarrowHidden = 256;
inline bool NarrowModel(const ModelSpec& spec) {
  return spec.hidden <= kNarrowHidden;
}

struct LayerNames {
  std::string attn_norm, attn_norm_bias;
  std::string q, k, v, q_bias, k_bias, v_bias;  // llama: separate; GPT-2: qkv in `q`
  std::string o, o_bias;
  std::string mlp_norm, mlp_norm_bias;
  std::string gate, up, down, up_bias, down_bias;  // GPT-2: c_fc in `up`, c_proj in `down`
};
LayerNames NamesForLayer(const ModelSpec& spec, int layer);
struct HeadNames {
  std::string embed;      // (vocab, hidden)
  std::string positions;  // GPT-2 wpe (max_positions, hidden); empty otherwise
  std::string final_norm, final_norm_bias;
  std::string lm_head;  // empty when tied
};
HeadNames NamesForHead(const ModelSpec& spec);

}  // namespace daisy
