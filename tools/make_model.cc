// make_model: writes a deterministic random-weight model folder in the Hugging Face layout
// (see model_maker.h), for tests and benchmarks of shapes the project cannot ship.
//   make_model --preset tiny-llama-30 --out /tmp/tiny --tokenizer models/stories260K
//   make_model --preset qwen2.5-0.5b --out /tmp/qwen --shards 2
//   make_model --preset llama-3.1-8b --out /tmp/llama8b --shards 4 --tokenizer testdata/tokenizers/llama3
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "model_maker.h"

int main(int argc, char** argv) {
  namespace mm = daisy::modelmaker;
  CLI::App app{
      "Writes a deterministic random-weight model folder (config.json, generation_config.json, "
      "safetensors, optional tokenizer)"};
  std::string preset, out, dtype = "bf16", vocab;
  mm::MakeOptions options;
  bool list = false;
  app.add_option("--preset", preset,
                 "Model shape: smollm-135m, qwen2.5-0.5b, llama-3.1-8b, mistral-7b, gpt2-small-test, tiny-llama-30, "
                 "ref-gpt2, ref-qwen2, "
                 "ref-llama3, ref-mistral (see --list)");
  app.add_option("--out", out, "Output folder (created if missing)");
  app.add_option("--layers", options.n_layers, "Number of layers (default: the preset's)");
  app.add_option("--seed", options.seed, "Weight seed (same seed, same bytes)")->capture_default_str();
  app.add_option("--dtype", dtype, "Weight dtype: bf16, f16 or f32")->capture_default_str();
  app.add_option("--shards", options.n_shards, "Number of safetensors files (> 1 writes an index)")
      ->capture_default_str();
  app.add_option("--tokenizer", options.tokenizer_dir, "Folder whose tokenizer.json (and friends) to copy");
  app.add_option("--vocab", vocab, "Vocabulary size, or 'tokenizer' for the copied tokenizer's size");
  app.add_flag("--list", list, "List the presets and exit");
  CLI11_PARSE(app, argc, argv);

  if (list) {
    for (const std::string& name : mm::PresetNames()) std::printf("%s\n", name.c_str());
    return 0;
  }
  if (preset.empty() || out.empty()) {
    std::fprintf(stderr, "make_model: --preset and --out are required (see --help)\n");
    return 2;
  }
  const std::optional<mm::ModelShape> shape = mm::FindPreset(preset);
  if (!shape) {
    std::fprintf(stderr, "make_model: unknown preset '%s' (see --list)\n", preset.c_str());
    return 2;
  }
  if (dtype == "bf16") {
    options.dtype = mm::WeightDType::kBF16;
  } else if (dtype == "f32") {
    options.dtype = mm::WeightDType::kF32;
  } else if (dtype == "f16") {
    options.dtype = mm::WeightDType::kF16;
  } else {
    std::fprintf(stderr, "make_model: --dtype must be bf16, f16 or f32, got '%s'\n", dtype.c_str());
    return 2;
  }
  if (vocab == "tokenizer") {
    options.vocab = mm::MakeOptions::kVocabFromTokenizer;
  } else if (!vocab.empty()) {
    try {
      size_t used = 0;
      options.vocab = std::stoi(vocab, &used);
      if (used != vocab.size() || options.vocab <= 0) throw std::invalid_argument(vocab);
    } catch (const std::exception&) {
      std::fprintf(stderr, "make_model: --vocab must be a positive number or 'tokenizer', got '%s'\n", vocab.c_str());
      return 2;
    }
  }
  const daisy::Status st = mm::MakeModel(*shape, out, options);
  if (!st.ok()) {
    std::fprintf(stderr, "make_model: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s (%s)\n", out.c_str(), preset.c_str());
  return 0;
}
