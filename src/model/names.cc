// Tensor-name maps per family, the tensors a layer range needs, and the facts that only the
// weights can tell (biases, tied embeddings, shapes).
#include <nlohmann/json.hpp>

#include "daisy/model.h"

namespace daisy {

LayerNames NamesForLayer(const ModelSpec& spec, int layer) {
  LayerNames n;
  if (spec.family == Family::kLlama) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    n.attn_norm = p + "input_layernorm.weight";
    n.q = p + "self_attn.q_proj.weight";
    n.k = p + "self_attn.k_proj.weight";
    n.v = p + "self_attn.v_proj.weight";
    n.o = p + "self_attn.o_proj.weight";
    if (spec.qkv_bias) {
      n.q_bias = p + "self_attn.q_proj.bias";
      n.k_bias = p + "self_attn.k_proj.bias";
      n.v_bias = p + "self_attn.v_proj.bias";
    }
    if (spec.o_bias) n.o_bias = p + "self_attn.o_proj.bias";
    n.mlp_norm = p + "post_attention_layernorm.weight";
    n.gate = p + "mlp.gate_proj.weight";
    n.up = p + "mlp.up_proj.weight";
    n.down = p + "mlp.down_proj.weight";
    if (spec.mlp_bias) {
      n.up_bias = p + "mlp.up_proj.bias";
      n.down_bias = p + "mlp.down_proj.bias";
    }
  } else {
    const std::string p = spec.tensor_prefix + "h." + std::to_string(layer) + ".";
    n.attn_norm = p + "ln_1.weight";
    n.attn_norm_bias = p + "ln_1.bias";
    n.q = p + "attn.c_attn.weight";  // fused q|k|v, Conv1D (in, 3 * out)
    n.q_bias = p + "attn.c_attn.bias";
    n.o = p + "attn.c_proj.weight";
    n.o_bias = p + "attn.c_proj.bias";
    n.mlp_norm = p + "ln_2.weight";
    n.mlp_norm_bias = p + "ln_2.bias";
    n.up = p + "mlp.c_fc.weight";
    n.up_bias = p + "mlp.c_fc.bias";
    n.down = p + "mlp.c_proj.weight";
    n.down_bias = p + "mlp.c_proj.bias";
  }
  return n;
}

HeadNames NamesForHead(const ModelSpec& spec) {
  HeadNames h;
  if (spec.family == Family::kLlama) {
    h.embed = "model.embed_tokens.weight";
    h.final_norm = "model.norm.weight";
    if (!spec.tied_embeddings) h.lm_head = "lm_head.weight";
  } else {
    h.embed = spec.tensor_prefix + "wte.weight";
    h.positions = spec.tensor_prefix + "wpe.weight";
    h.final_norm = spec.tensor_prefix + "ln_f.weight";
    h.final_norm_bias = spec.tensor_prefix + "ln_f.bias";
    if (!spec.tied_embeddings) h.lm_head = "lm_head.weight";
  }
  return h;
}

namespace {
void Push(std::vector<std::string>& out, const std::string& s) {
  if (!s.empty()) out.push_back(s);
}
}  // namespace

std::vector<std::string> LayerTensorNames(const ModelSpec& spec, int layer) {
  const LayerNames n = NamesForLayer(spec, layer);
  std::vector<std::string> out;
  for (const std::string* s :
       {&n.attn_norm, &n.attn_norm_bias, &n.q, &n.k, &n.v, &n.q_bias, &n.k_bias, &n.v_bias, &n.o, &n.o_bias,
        &n.mlp_norm, &n.mlp_norm_bias, &n.gate, &n.up, &n.down, &n.up_bias, &n.down_bias})
    Push(out, *s);
  return out;
}

std::vector<std::string> HeadTensorNames(const ModelSpec& spec) {
  const HeadNames h = NamesForHead(spec);
  std::vector<std::string> out;
  for (const std::string* s : {&h.embed, &h.positions, &h.final_norm, &h.final_norm_bias, &h.lm_head}) Push(out, *s);
  return out;
}

std::vector<std::string> StageTensorNames(const ModelSpec& spec, int first, int end, bool is_head) {
  std::vector<std::string> out;
  if (is_head) out = HeadTensorNames(spec);
  for (int l = first; l < end; ++l)
    for (auto& s : LayerTensorNames(spec, l)) out.push_back(std::move(s));
  return out;
}

uint64_t TensorBytes(const TensorIndex& index, const std::vector<std::string>& names) {
  uint64_t total = 0;
  for (const auto& n : names)
    if (const TensorInfo* t = index.Find(n)) total += t->bytes;
  return total;
}

namespace {

// Checks a tensor's shape when its header has been read.
Status CheckShape(const TensorIndex& index, const std::string& name, const std::vector<int64_t>& want) {
  const TensorInfo* t = index.Find(name);
  if (!t) return Status::Ok();
  if (t->shape != want) {
    auto show = [](const std::vector<int64_t>& s) {
      std::string o = "[";
      for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
      return o + "]";
    };
    return InvalidArgument("tensor '" + name + "' has shape " + show(t->shape) + " but config.json implies " +
                           show(want));
  }
  return Status::Ok();
}

}  // namespace

Status ApplyTensorFacts(ModelSpec& spec, const TensorIndex& index) {
  if (spec.family == Family::kGpt2) {
    // Both "transformer.h.0..." and "h.0..." layouts exist on the Hub.
    if (index.Has("transformer.wte.weight"))
      spec.tensor_prefix = "transformer.";
    else if (index.Has("wte.weight"))
      spec.tensor_prefix = "";
    else
      return InvalidArgument("GPT-2 model has neither 'transformer.wte.weight' nor 'wte.weight'");
  } else {
    const std::string p = "model.layers.0.";
    spec.qkv_bias = index.Has(p + "self_attn.q_proj.bias");
    spec.o_bias = index.Has(p + "self_attn.o_proj.bias");
    spec.mlp_bias = index.Has(p + "mlp.up_proj.bias");
    if (spec.qkv_bias && !(index.Has(p + "self_attn.k_proj.bias") && index.Has(p + "self_attn.v_proj.bias")))
      return InvalidArgument("layer 0 has a q_proj bias but not k_proj and v_proj biases");
  }
  // Untied configs need an lm_head; a tied config with an lm_head tensor uses the embedding,
  // as transformers does.
  if (!spec.tied_embeddings && !index.Has("lm_head.weight"))
    return InvalidArgument("config.json says tie_word_embeddings is false but there is no 'lm_head.weight' tensor");
  for (const auto& n : StageTensorNames(spec, 0, spec.n_layers, true))
    if (!index.Has(n)) return InvalidArgument("tensor '" + n + "' is missing from the weights");

  const int64_t hidden = spec.hidden, head_dim = spec.head_dim, inter = spec.intermediate, vocab = spec.vocab;
  const int64_t q_out = static_cast<int64_t>(spec.n_heads) * head_dim,
                kv_out = static_cast<int64_t>(spec.n_kv_heads) * head_dim;
  const HeadNames h = NamesForHead(spec);
  DAISY_RETURN_IF_ERROR(CheckShape(index, h.embed, {vocab, hidden}));
  if (!h.lm_head.empty()) DAISY_RETURN_IF_ERROR(CheckShape(index, h.lm_head, {vocab, hidden}));
  DAISY_RETURN_IF_ERROR(CheckShape(index, h.final_norm, {hidden}));
  if (!h.positions.empty()) DAISY_RETURN_IF_ERROR(CheckShape(index, h.positions, {spec.max_positions, hidden}));
  for (int l = 0; l < spec.n_layers; ++l) {
    const LayerNames n = NamesForLayer(spec, l);
    DAISY_RETURN_IF_ERROR(CheckShape(index, n.attn_norm, {hidden}));
    DAISY_RETURN_IF_ERROR(CheckShape(index, n.mlp_norm, {hidden}));
    if (spec.family == Family::kLlama) {
      DAISY_RETURN_IF_ERROR(CheckShape(index, n.q, {q_out, hidden}));
      DAISY_RETURN_IF_ERROR(CheckShape(index, n.k, {kv_out, hidden}));
      DAISY_RETURN_IF_ERROR(CheckShape(index, n.v, {kv_out, hidden}));
      DAISY_RETURN_IF_ERROR(CheckShape(index, n.o, {hidden, q_out}));
      DAISY_RETURN_IF_ERROR(CheckShape(index, n.gate, {inter, hidden}));
      DAISY_RETURN_IF_ERROR(CheckShape(index, n.up, {inter, hidden}));
      DAISY_RETURN_IF_ERROR(CheckShape(index, n.down, {hidden, inter}));
      if (spec.qkv_bias) {
        DAISY_RETURN_IF_ERROR(CheckShape(index, n.q_bias, {q_out}));
        DAISY_RETURN_IF_ERROR(CheckShape(index, n.k_bias, {kv_out}));
        DAISY_RETURN_IF_ERROR(CheckShape(index, n.v_bias, {kv_out}));
      }
    } else {  // Conv1D layout: (in, out)
      DAISY_RETURN_IF_ERROR(CheckShape(index, n.q, {hidden, 3 * hidden}));
      DAISY_RETURN_IF_ERROR(CheckShape(index, n.q_bias, {3 * hidden}));
      DAISY_RETURN_IF_ERROR(CheckShape(index, n.o, {hidden, hidden}));
      DAISY_RETURN_IF_ERROR(CheckShape(index, n.up, {hidden, inter}));
      DAISY_RETURN_IF_ERROR(CheckShape(index, n.down, {inter, hidden}));
    }
  }
  return Status::Ok();
}

Result<ModelInfo> LoadModelInfo(ModelSource& source) {
  DAISY_ASSIGN_OR_RETURN(std::string config, source.ReadFile("config.json"));
  auto spec = SpecFromConfig(config);
  if (!spec.ok()) return spec.status().WithContext(source.Describe());
  auto gen = source.ReadFile("generation_config.json");
  if (gen.ok()) {
    Status st = ApplyGenerationConfig(*spec, *gen);
    if (!st.ok()) return st.WithContext(source.Describe());
  } else if (gen.status().code() != ErrorCode::kNotFound) {
    return gen.status();
  }
  DAISY_ASSIGN_OR_RETURN(TensorIndex index, TensorIndex::Load(source));
  Status st = ApplyTensorFacts(*spec, index);
  if (!st.ok()) return st.WithContext(source.Describe());
  return ModelInfo{std::move(*spec), std::move(index)};
}

}  // namespace daisy
