// daisychain inspect: reads only config.json, the tokenizer files and the safetensors
// headers (a few KB, whatever the model's size) and prints the spec, the exact parameter
// count, bytes per layer and an even split over N devices.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "daisy/model.h"

namespace daisy::cli {
namespace {

struct InspectOptions {
  std::string model;
  int devices = 1;
  bool json = false;
  bool no_cache = false;
};

// Bytes a device holds once weights are quantized: int8 matrices plus one f32 scale per
// output row; vectors (norms, biases) stay f32.
uint64_t HeldBytes(const TensorIndex& index, const std::vector<std::string>& names) {
  uint64_t total = 0;
  for (const auto& n : names) {
    const TensorInfo* t = index.Find(n);
    if (!t) continue;
    if (t->shape.size() == 2)
      total += t->Elements() + 4 * static_cast<uint64_t>(t->shape[0]);
    else
      total += 4 * t->Elements();
  }
  return total;
}

std::string Mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

std::string Grouped(uint64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

int RunInspect(const InspectOptions& o) {
  auto src = OpenSourceForCli(o.model, !o.no_cache);
  if (!src.ok()) return ReportError(src.status().message());
  auto info = LoadModelInfo(**src);
  if (!info.ok()) return ReportError(info.status().message());
  const ModelSpec& s = info->spec;
  const TensorIndex& idx = info->index;
  if (o.devices < 1 || o.devices > 1024) return ReportError("--devices must be between 1 and 1024");

  // Tokenizer summary: its own files only.
  nlohmann::json tok = nullptr;
  auto tj = (*src)->ReadFile("tokenizer.json");
  if (tj.ok()) {
    try {
      auto j = nlohmann::json::parse(*tj);
      tok = nlohmann::json::object();
      if (j.contains("model") && j["model"].is_object()) {
        tok["model"] = j["model"].value("type", "");
        if (j["model"].contains("vocab") && (j["model"]["vocab"].is_object() || j["model"]["vocab"].is_array()))
          tok["vocab"] = j["model"]["vocab"].size();
      }
      if (j.contains("added_tokens") && j["added_tokens"].is_array()) tok["added_tokens"] = j["added_tokens"].size();
    } catch (const nlohmann::json::exception&) {
      tok = "invalid tokenizer.json";
    }
  } else if (tj.status().code() != ErrorCode::kNotFound) {
    return ReportError(tj.status().message());
  }

  // Even split: layer counts differ by at most one, the extra layers go to the first devices.
  nlohmann::json plan = nlohmann::json::array();
  const int n = std::min(o.devices, std::max(1, s.n_layers));
  int first = 0;
  for (int d = 0; d < n; ++d) {
    const int count = s.n_layers / n + (d < s.n_layers % n ? 1 : 0);
    auto names = StageTensorNames(s, first, first + count, d == 0);
    plan.push_back({{"device", d},
                    {"role", d == 0 ? "head" : "stage"},
                    {"layers", {first, first + count}},
                    {"bytes", TensorBytes(idx, names)},
                    {"hold_bytes", HeldBytes(idx, names)}});
    first += count;
  }
  std::vector<uint64_t> layer_bytes;
  layer_bytes.reserve(static_cast<size_t>(s.n_layers));
  for (int l = 0; l < s.n_layers; ++l) layer_bytes.push_back(TensorBytes(idx, LayerTensorNames(s, l)));
  std::map<std::string, uint64_t> dtypes;
  for (const auto& t : idx.tensors()) dtypes[std::string(DTypeName(t.dtype))] += t.Elements();

  if (o.json) {
    nlohmann::json out = {
        {"model", (*src)->Describe()},
        {"revision", (*src)->Revision()},
        {"family", std::string(FamilyName(s.family))},
        {"architecture", s.architecture},
        {"layers", s.n_layers},
        {"hidden", s.hidden},
        {"heads", s.n_heads},
        {"kv_heads", s.n_kv_heads},
        {"head_dim", s.head_dim},
        {"intermediate", s.intermediate},
        {"vocab", s.vocab},
        {"max_positions", s.max_positions},
        {"norm", s.norm == NormType::kRmsNorm ? "rmsnorm" : "layernorm"},
        {"norm_eps", s.norm_eps},
        {"activation", s.activation == Activation::kSilu ? "silu" : "gelu_new"},
        {"gated_mlp", s.gated_mlp},
        {"rope_theta", s.rope_theta},
        {"rope_scaling", s.rope_scaling.type == RopeScalingType::kLlama3 ? "llama3" : "none"},
        {"tied_embeddings", s.tied_embeddings},
        {"fused_qkv", s.fused_qkv},
        {"qkv_bias", s.qkv_bias},
        {"weight_layout", s.layout == WeightLayout::kOutIn ? "out_in" : "in_out"},
        {"sliding_window", s.use_sliding_window ? s.sliding_window : 0},
        {"eos_ids", s.eos_ids},
        {"parameters", idx.ParameterCount()},
        {"tensors", idx.tensors().size()},
        {"files", idx.files()},
        {"dtypes", dtypes},
        {"header_bytes", idx.HeaderBytes()},
        {"bytes_per_layer", layer_bytes},
        {"tokenizer", tok},
        {"plan", plan},
    };
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }

  std::printf("model         %s (revision %s)\n", (*src)->Describe().c_str(), (*src)->Revision().c_str());
  std::printf("architecture  %s (family %s)\n", s.architecture.c_str(), std::string(FamilyName(s.family)).c_str());
  std::printf(
      "shape         %d layers, hidden %d, %d heads (%d kv, head_dim %d), intermediate %d, vocab %d, context %d\n",
      s.n_layers, s.hidden, s.n_heads, s.n_kv_heads, s.head_dim, s.intermediate, s.vocab, s.max_positions);
  std::printf("blocks        %s eps %g, %s%s, rope theta %g%s%s\n",
              s.norm == NormType::kRmsNorm ? "RMSNorm" : "LayerNorm", static_cast<double>(s.norm_eps),
              s.activation == Activation::kSilu ? "SiLU" : "GELU (tanh)", s.gated_mlp ? " gated MLP" : " MLP",
              s.rope_theta, s.rope_scaling.type == RopeScalingType::kLlama3 ? " (llama3 scaling)" : "",
              s.learned_positions ? ", learned positions" : "");
  std::printf("weights       %s%s%s, %s layout%s\n", s.tied_embeddings ? "tied embeddings" : "separate LM head",
              s.qkv_bias ? ", q/k/v bias" : "", s.fused_qkv ? ", fused QKV" : "",
              s.layout == WeightLayout::kOutIn ? "(out, in)" : "Conv1D (in, out)",
              s.use_sliding_window ? (", sliding window " + std::to_string(s.sliding_window)).c_str() : "");
  std::string dt;
  for (const auto& [name, count] : dtypes) dt += (dt.empty() ? "" : ", ") + name;
  std::printf("parameters    %s (%zu tensors in %zu file%s; %s)\n", Grouped(idx.ParameterCount()).c_str(),
              idx.tensors().size(), idx.files().size(), idx.files().size() == 1 ? "" : "s", dt.c_str());
  if (!layer_bytes.empty()) std::printf("per layer     %s stored\n", Mb(layer_bytes[0]).c_str());
  if (tok.is_object())
    std::printf("tokenizer     %s, %s tokens\n", tok.value("model", std::string("?")).c_str(),
                tok.contains("vocab") ? std::to_string(tok["vocab"].get<size_t>()).c_str() : "?");
  std::printf("read          %s bytes of headers\n", Grouped(idx.HeaderBytes()).c_str());
  std::printf("\nplan over %d device%s (even split; the ring planner weighs measured capacity):\n", n,
              n == 1 ? "" : "s");
  for (const auto& p : plan) {
    std::printf("  device %d %-6s layers [%2d, %2d)  download %10s  hold %10s\n", p["device"].get<int>(),
                p["role"].get<std::string>().c_str(), p["layers"][0].get<int>(), p["layers"][1].get<int>(),
                Mb(p["bytes"].get<uint64_t>()).c_str(), Mb(p["hold_bytes"].get<uint64_t>()).c_str());
  }
  return 0;
}

}  // namespace

DAISY_REGISTER_COMMAND(inspect, 20, [](CLI::App& app) -> std::function<int()> {
  auto o = std::make_shared<InspectOptions>();
  auto* sub = app.add_subcommand("inspect",
                                 "Read only config, tokenizer and safetensors headers; print the spec, the parameter "
                                 "count and an even split over N devices");
  sub->add_option("--model", o->model, "Local folder or Hub repo id owner/name[@revision]")->required();
  sub->add_option("--devices", o->devices, "Number of devices to split over (default 1)")->check(CLI::Range(1, 1024));
  sub->add_flag("--json", o->json, "Print one JSON object");
  sub->add_flag("--no-cache", o->no_cache, "Do not use the on-disk download cache");
  return [o] { return RunInspect(*o); };
});

}  // namespace daisy::cli
