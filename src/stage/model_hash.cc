// What every member of a ring must agree on: the spec's hash and the model load's hash, and
// what the plan counts for a model.
#if defined(DAISY_XXHASH_INLINE)
#define XXH_INLINE_ALL  // the wasm build, which has no libxxhash
#endif
#include <xxhash.h>

#include <cstdio>

#include "daisy/stage.h"

namespace daisy {

PlanModel PlanModelOf(const ModelInfo& info, int ctx) {
  const TensorInfo* embed = info.index.Find(NamesForHead(info.spec).embed);
  return PlanModelFromSpec(info.spec, ctx, embed ? static_cast<int>(DTypeSize(embed->dtype)) : 2);
}

namespace {
void Put(std::string& s, const std::string& key, const std::string& value) {
  s += key + "=" + value + ";";
}
}  // namespace

uint64_t SpecHash(const ModelSpec& p) {
  std::string s;
  Put(s, "family", std::string(FamilyName(p.family)));
  Put(s, "arch", p.architecture);
  for (auto [k, v] : {std::pair{"layers", p.n_layers},
                      {"hidden", p.hidden},
                      {"heads", p.n_heads},
                      {"kv", p.n_kv_heads},
                      {"head_dim", p.head_dim},
                      {"inter", p.intermediate},
                      {"vocab", p.vocab},
                      {"pos", p.max_positions},
                      {"norm", static_cast<int>(p.norm)},
                      {"act", static_cast<int>(p.activation)},
                      {"gated", p.gated_mlp},
                      {"learned", p.learned_positions},
                      {"tied", p.tied_embeddings},
                      {"fused", p.fused_qkv},
                      {"qkvb", p.qkv_bias},
                      {"ob", p.o_bias},
                      {"mlpb", p.mlp_bias},
                      {"layout", static_cast<int>(p.layout)},
                      {"swa", p.use_sliding_window},
                      {"sw", p.sliding_window},
                      {"mwl", p.max_window_layers},
                      {"rs", static_cast<int>(p.rope_scaling.type)}})
    Put(s, k, std::to_string(v));
  // Floating fields by their bits: equal specs hash equal on every machine.
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a/%a/%a/%a/%a", static_cast<double>(p.norm_eps), p.rope_theta, p.rope_scaling.factor,
                p.rope_scaling.low_freq_factor, p.rope_scaling.high_freq_factor);
  Put(s, "floats", buf);
  Put(s, "orig", std::to_string(p.rope_scaling.original_max_position_embeddings));
  Put(s, "prefix", p.tensor_prefix);
  return XXH64(s.data(), s.size(), 0x5350454355ull);  // agreement on the spec: an accident check, not evidence
}

uint32_t ModelHashOf(const ModelSource& source, const TensorIndex& index) {
  std::string digest;
  for (const auto& t : index.tensors()) {
    digest += t.name + "|" + t.file + "|" + std::string(DTypeName(t.dtype)) + "|" + std::to_string(t.offset) + "|";
    for (int64_t d : t.shape) digest += std::to_string(d) + ",";
    digest += ";";
  }
  return wire::ModelHash(source.ModelId(), source.Revision(), digest);
}

}  // namespace daisy
