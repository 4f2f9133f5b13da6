#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "daisy/model.h"

namespace daisy {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string ConfigPath(const std::string& folder, const std::string& file = "config.json") {
  return std::string(std::getenv("DAISY_TESTDATA")) + "/configs/" + folder + "/" + file;
}

ModelSpec SpecOf(const std::string& folder) {
  auto spec = SpecFromConfig(Slurp(ConfigPath(folder)));
  EXPECT_TRUE(spec.ok()) << folder << ": " << spec.status().message();
  if (!spec.ok()) return {};
  auto gen = Slurp(ConfigPath(folder, "generation_config.json"));
  EXPECT_TRUE(ApplyGenerationConfig(*spec, gen).ok());
  return *spec;
}

TEST(Spec, SmolLM2) {
  ModelSpec s = SpecOf("HuggingFaceTB__SmolLM2-135M-Instruct");
  EXPECT_EQ(s.family, Family::kLlama);
  EXPECT_EQ(s.architecture, "LlamaForCausalLM");
  EXPECT_EQ(s.n_layers, 30);
  EXPECT_EQ(s.hidden, 576);
  EXPECT_EQ(s.n_heads, 9);
  EXPECT_EQ(s.n_kv_heads, 3);
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.intermediate, 1536);
  EXPECT_EQ(s.vocab, 49152);
  EXPECT_EQ(s.max_positions, 8192);
  EXPECT_EQ(s.norm, NormType::kRmsNorm);
  EXPECT_FLOAT_EQ(s.norm_eps, 1e-5f);
  EXPECT_EQ(s.activation, Activation::kSilu);
  EXPECT_TRUE(s.gated_mlp);
  EXPECT_EQ(s.rope_theta, 100000.0);
  EXPECT_EQ(s.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_TRUE(s.tied_embeddings);
  EXPECT_FALSE(s.fused_qkv);
  EXPECT_EQ(s.layout, WeightLayout::kOutIn);
  EXPECT_FALSE(s.use_sliding_window);
  EXPECT_EQ(s.eos_ids, std::vector<int>({2}));
  EXPECT_EQ(s.bos_id, 1);
  EXPECT_EQ(SpecOf("HuggingFaceTB__SmolLM2-360M-Instruct").hidden, 960);
}

TEST(Spec, Qwen25BaseAndInstruct) {
  for (const char* folder : {"Qwen__Qwen2.5-0.5B", "Qwen__Qwen2.5-0.5B-Instruct"}) {
    ModelSpec s = SpecOf(folder);
    EXPECT_EQ(s.architecture, "Qwen2ForCausalLM");
    EXPECT_EQ(s.n_layers, 24);
    EXPECT_EQ(s.hidden, 896);
    EXPECT_EQ(s.n_heads, 14);
    EXPECT_EQ(s.n_kv_heads, 2);
    EXPECT_EQ(s.head_dim, 64);
    EXPECT_EQ(s.intermediate, 4864);
    EXPECT_EQ(s.vocab, 151936);
    EXPECT_EQ(s.rope_theta, 1000000.0);
    EXPECT_FLOAT_EQ(s.norm_eps, 1e-6f);
    EXPECT_TRUE(s.tied_embeddings);
    EXPECT_FALSE(s.use_sliding_window);
    EXPECT_EQ(s.sliding_window, 32768);
  }
  EXPECT_EQ(SpecOf("Qwen__Qwen2.5-0.5B").max_window_layers, 24);
  ModelSpec inst = SpecOf("Qwen__Qwen2.5-0.5B-Instruct");
  EXPECT_EQ(inst.max_window_layers, 21);
  // config eos 151645 plus generation_config's list [151645, 151643].
  EXPECT_EQ(inst.eos_ids, std::vector<int>({151645, 151643}));
}

TEST(Spec, MistralAndTinyLlama) {
  ModelSpec m = SpecOf("mistralai__Mistral-7B-v0.1");
  EXPECT_EQ(m.architecture, "MistralForCausalLM");
  EXPECT_EQ(m.n_layers, 32);
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.n_kv_heads, 8);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.intermediate, 14336);
  EXPECT_EQ(m.vocab, 32000);
  EXPECT_TRUE(m.use_sliding_window);
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_EQ(m.max_window_layers, 0);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(SpecOf("mistralai__Mistral-7B-Instruct-v0.1").sliding_window, 4096);

  ModelSpec t = SpecOf("TinyLlama__TinyLlama-1.1B-Chat-v1.0");
  EXPECT_EQ(t.n_layers, 22);
  EXPECT_EQ(t.hidden, 2048);
  EXPECT_EQ(t.n_heads, 32);
  EXPECT_EQ(t.n_kv_heads, 4);
  EXPECT_EQ(t.head_dim, 64);
  EXPECT_EQ(t.intermediate, 5632);
  EXPECT_EQ(t.max_positions, 2048);
  EXPECT_FALSE(t.tied_embeddings);
  EXPECT_FALSE(t.use_sliding_window);
}

TEST(Spec, Llama32WithLlama3RopeScaling) {
  ModelSpec s = SpecOf("meta-llama__Llama-3.2-1B");
  EXPECT_EQ(s.n_layers, 16);
  EXPECT_EQ(s.hidden, 2048);
  EXPECT_EQ(s.n_heads, 32);
  EXPECT_EQ(s.n_kv_heads, 8);
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.vocab, 128256);
  EXPECT_EQ(s.max_positions, 131072);
  EXPECT_EQ(s.rope_theta, 500000.0);
  EXPECT_EQ(s.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(s.rope_scaling.factor, 32.0);
  EXPECT_EQ(s.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(s.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(s.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(s.tied_embeddings);
  EXPECT_EQ(s.eos_ids, std::vector<int>({128001}));
}

TEST(Spec, Gpt2) {
  auto s = SpecFromConfig(Slurp(ConfigPath("openai-community__gpt2")));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->family, Family::kGpt2);
  EXPECT_EQ(s->hidden, 768);
  EXPECT_EQ(s->n_layers, 12);
  EXPECT_EQ(s->n_heads, 12);
  EXPECT_EQ(s->head_dim, 64);
  EXPECT_EQ(s->intermediate, 3072);
  EXPECT_EQ(s->vocab, 50257);
  EXPECT_EQ(s->max_positions, 1024);
  EXPECT_EQ(s->activation, Activation::kGeluNew);
  EXPECT_EQ(s->norm, NormType::kLayerNorm);
  EXPECT_TRUE(s->learned_positions);
  EXPECT_TRUE(s->fused_qkv);
  EXPECT_EQ(s->layout, WeightLayout::kInOut);
  EXPECT_TRUE(s->tied_embeddings);
  EXPECT_FALSE(s->gated_mlp);
}

void ExpectRefused(const std::string& config, const std::string& needle) {
  auto s = SpecFromConfig(config);
  ASSERT_FALSE(s.ok()) << "accepted a config that should mention " << needle;
  EXPECT_NE(s.status().message().find(needle), std::string::npos) << s.status().message();
}

TEST(Spec, RefusesUnsupportedModelsByName) {
  ExpectRefused(Slurp(ConfigPath("mistralai__Mixtral-8x7B-v0.1")),
                "architecture 'MixtralForCausalLM' is not supported");
  ExpectRefused(Slurp(ConfigPath("sentence-transformers__all-MiniLM-L6-v2")),
                "architecture 'BertModel' is not supported");
  std::string llama = Slurp(ConfigPath("meta-llama__Llama-3.2-1B"));
  auto j = llama;
  j.replace(j.find("\"llama3\""), 8, "\"yarn\"");
  ExpectRefused(j, "rope_scaling type 'yarn' is not supported");
  ExpectRefused(
      R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":128,"vocab_size":10,"max_position_embeddings":16,"rope_scaling":{"type":"linear","factor":2.0}})",
      "rope_scaling type 'linear'");
  ExpectRefused(
      R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":128,"vocab_size":10,"max_position_embeddings":16,"hidden_act":"gelu"})",
      "hidden_act 'gelu'");
  ExpectRefused(
      R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":0,"num_attention_heads":4,"intermediate_size":128,"vocab_size":10,"max_position_embeddings":16})",
      "num_hidden_layers");
  ExpectRefused(
      R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":3,"intermediate_size":128,"vocab_size":10,"max_position_embeddings":16})",
      "not a multiple");
  ExpectRefused(
      R"({"architectures":["LlamaForCausalLM"],"hidden_size":60,"num_hidden_layers":2,"num_attention_heads":6,"intermediate_size":128,"vocab_size":10,"max_position_embeddings":16})",
      "head_dim 10 is not a multiple of 4");
  ExpectRefused(
      R"({"architectures":["GPT2LMHeadModel"],"n_embd":40,"n_layer":2,"n_head":4,"vocab_size":10,"n_positions":16})",
      "head_dim 10 is not a multiple of 4");
  ExpectRefused(R"({"architectures":["LlamaForCausalLM"],"hidden_size":"64"})", "hidden_size");
  ExpectRefused(R"({"model_type":"llama"})", "no 'architectures'");
  ExpectRefused("[1,2]", "not a JSON object");
  ExpectRefused("{", "not valid JSON");
  ExpectRefused(
      R"({"architectures":["GPT2LMHeadModel"],"n_embd":64,"n_layer":2,"n_head":4,"vocab_size":10,"n_positions":16,"activation_function":"relu"})",
      "activation_function 'relu'");
}

TEST(Spec, BundledModelWithTensorFacts) {
  auto src = OpenLocalFolder(std::string(std::getenv("DAISY_MODELS")) + "/stories260K");
  ASSERT_TRUE(src.ok());
  auto info = LoadModelInfo(**src);
  ASSERT_TRUE(info.ok()) << info.status().message();
  const ModelSpec& s = info->spec;
  EXPECT_EQ(s.n_layers, 5);
  EXPECT_EQ(s.hidden, 64);
  EXPECT_EQ(s.head_dim, 8);
  EXPECT_FALSE(s.qkv_bias);
  EXPECT_TRUE(s.tied_embeddings);
  EXPECT_EQ(info->index.ParameterCount(), 260032u);
  // Each layer: 2 norms (64) + q,o (64x64) + k,v (32x64) + 3 MLP (172x64), f32.
  EXPECT_EQ(TensorBytes(info->index, LayerTensorNames(s, 0)), 4u * (2 * 64 + 2 * 4096 + 2 * 2048 + 3 * 172 * 64));
  auto head = HeadTensorNames(s);
  EXPECT_EQ(head, (std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight"}));
  auto stage = StageTensorNames(s, 1, 3, false);
  EXPECT_EQ(stage.size(), 18u);
  EXPECT_EQ(stage.front(), "model.layers.1.input_layernorm.weight");
  // The stage list covers every tensor exactly once over a whole split.
  std::set<std::string> all;
  for (auto& n : StageTensorNames(s, 0, 2, true)) all.insert(n);
  for (auto& n : StageTensorNames(s, 2, 5, false)) all.insert(n);
  EXPECT_EQ(all.size(), info->index.tensors().size());
}

}  // namespace
}  // namespace daisy
