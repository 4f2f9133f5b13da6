// Deterministic random-weight models in the Hugging Face layout, for tests and benchmarks:
// config.json, generation_config.json, model.safetensors (or shards + index) and,
// optionally, a tokenizer copied from another folder. The weights come from a counter-based
// generator keyed by (seed, tensor name, element index), so the same options give the same
// bytes on every machine, and tensors are streamed to disk: memory stays bounded by a
// small chunk whatever the model size. Functions are thread-safe (distinct out_dirs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/status.h"

namespace daisy::modelmaker {

enum class Naming : uint8_t { kLlama, kGpt2 };  // tensor names and layouts of the family

struct ModelShape {
  std::string name;          // the preset name
  std::string architecture;  // config.json "architectures"[0]
  std::string model_type;    // "llama", "qwen2", "mistral", "gpt2"
  Naming naming = Naming::kLlama;
  int hidden = 0;
  int intermediate = 0;  // GPT-2: 4 * hidden
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab = 0;
  int max_positions = 0;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool tied = true;
  bool qkv_bias = false;           // Qwen2 q/k/v biases (GPT-2 always has biases)
  int bos_id = 1;                  // -1: vocab - 1 (GPT-2's <|endoftext|> is the last id)
  std::vector<int> eos_ids = {2};  // {-1}: vocab - 1
  // rope_scaling {"rope_type": "llama3", ...} when llama3_factor > 0; null otherwise.
  double llama3_factor = 0;
  double llama3_low_freq_factor = 1.0;
  double llama3_high_freq_factor = 4.0;
  int llama3_original_max_positions = 8192;
  int sliding_window = 0;  // Mistral: "sliding_window" (every layer); 0 writes null
  // Standard deviations of the random values. Real checkpoints' 0.02 makes attention nearly
  // uniform in a tiny model; the reference presets take larger ones so that every feature
  // (a bias, RoPE scaling, the window) moves the logits well above int8 error.
  float weight_std = 0.02f;    // matrices and embeddings
  float bias_std = 0.01f;      // biases
  float norm_std = 0.02f;      // norm weights, around 1
  float position_std = 0.01f;  // GPT-2 wpe
};

// Presets: "smollm-135m", "qwen2.5-0.5b", "llama-3.1-8b", "mistral-7b" (benchmark shapes:
// 16 and 14 GB in BF16, written tensor by tensor, never held), "gpt2-small-test", "tiny-llama-30", and the tiny
// models checked against the float64 reference (tests/reference/): "ref-gpt2", "ref-qwen2"
// (q/k/v biases, untied head), "ref-llama3" (llama3 rope_scaling), "ref-mistral" (sliding
// window 8).
std::vector<std::string> PresetNames();
std::optional<ModelShape> FindPreset(std::string_view name);
// For names fixed in code; an unknown name is a bug (user input goes through FindPreset).
ModelShape PresetShape(std::string_view name);

enum class WeightDType : uint8_t { kBF16, kF32, kF16 };

struct MakeOptions {
  uint64_t seed = 1;
  WeightDType dtype = WeightDType::kBF16;
  int n_layers = 0;           // 0: the shape's
  int n_shards = 1;           // > 1: model-0000i-of-0000N.safetensors + index
  std::string tokenizer_dir;  // copy tokenizer.json (+ tokenizer_config.json, ...) from here
  int vocab = 0;              // 0: the shape's; kVocabFromTokenizer: the tokenizer's size
                              // (bos/eos ids beyond a changed vocabulary become its last id)
  static constexpr int kVocabFromTokenizer = -1;
};

// One tensor to write: name, shape and the distribution of its values (mean + std * n,
// n an approximately standard normal deviate).
struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  float mean = 0;
  float std = 0.02f;
  uint64_t Elements() const;
};
// The tensors of a shape (after options are applied), sorted by name as the Python
// safetensors writer orders them.
std::vector<TensorPlan> PlanTensors(const ModelShape& shape);

// The shape with the options applied (layers, vocab) and validated.
Result<ModelShape> ResolveShape(const ModelShape& shape, const MakeOptions& options);

// The number of token ids a tokenizer.json defines (largest id in the vocabulary or the
// added tokens, plus one).
Result<int> TokenizerVocabSize(const std::string& tokenizer_json_path);

// Writes the model folder (created if missing; files of the same names are replaced).
// Each file is written under a temporary name and renamed when complete.
Status MakeModel(const ModelShape& shape, const std::string& out_dir, const MakeOptions& options);

// The value of element `index` of tensor `name` (exposed for tests: stable across versions
// unless the documented generator changes).
float WeightValue(uint64_t seed, std::string_view name, uint64_t index, float mean, float std);

}  // namespace daisy::modelmaker
