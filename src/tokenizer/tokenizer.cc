// Tokenizer: loads tokenizer.json (+ tokenizer_config.json) into the pipeline stages and
// runs them in the Rust library's order: added tokens and normalizer
// (AddedVocabulary::extract_and_normalize), pre-tokenizer, model, post-processor.
#include "daisy/tokenizer.h"

#include <algorithm>
#include <utility>

#include "added_tokens.h"
#include "bpe.h"
#include "pipeline.h"
#include "unicode.h"

namespace daisy {

using nlohmann::json;
using tok::AddedToken;
using tok::Pieces;

struct Tokenizer::Impl {
  std::unique_ptr<tok::Normalizer> normalizer;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tok::Bpe> model;
  std::unique_ptr<tok::PostProcessor> post_processor;
  std::unique_ptr<tok::Decoder> decoder;
  tok::AddedVocabulary added;
  bool cleanup = false;
  std::optional<int32_t> bos, eos;
  int32_t vocab_size = 0;

  std::optional<int32_t> TokenToId(std::string_view t) const {
    if (const AddedToken* a = added.ByContent(t)) return a->id;
    return model->TokenToId(t);
  }
};

namespace {

// transformers' classes whose __init__ rebuilds the post-processor from add_bos_token /
// add_eos_token (update_post_processor).
bool IsLlamaFamily(const std::string& cls) {
  static constexpr const char* kNames[] = {"LlamaTokenizer",         "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                           "CodeLlamaTokenizerFast", "GemmaTokenizer",     "GemmaTokenizerFast"};
  return std::any_of(std::begin(kNames), std::end(kNames), [&](const char* n) { return cls == n; });
}

// A special token in tokenizer_config.json: "text", {"content": "text", ...} or null.
std::optional<std::string> ConfigToken(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

void CleanUpTokenization(std::string& s) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    size_t pos = s.find(from);
    if (pos == std::string::npos) continue;
    std::string out;
    out.reserve(s.size());
    size_t last = 0;
    for (; pos != std::string::npos; pos = s.find(from, last)) {
      out.append(s, last, pos - last);
      out.append(to);
      last = pos + from.size();
    }
    out.append(s, last, std::string::npos);
    s = std::move(out);
  }
}

}  // namespace

Result<std::unique_ptr<Tokenizer::Impl>> Tokenizer::Build(std::string_view tokenizer_json,
                                                          std::string_view config_json) {
  json j = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("tokenizer.json is not a JSON object");
  json cfg = json::object();
  if (!config_json.empty()) {
    cfg = json::parse(config_json, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object()) return InvalidArgument("tokenizer_config.json is not a JSON object");
  }
  auto impl = std::make_unique<Tokenizer::Impl>();

  // Model.
  if (!j.contains("model") || !j["model"].is_object()) return InvalidArgument("tokenizer.json has no 'model'");
  const json& model = j["model"];
  std::string model_type;
  if (model.contains("type") && model["type"].is_string()) {
    model_type = model["type"].get<std::string>();
  } else if (model.contains("merges") && model.contains("vocab")) {
    model_type = "BPE";  // files written before the type tag was added
  } else {
    return Unimplemented("tokenizer model without a type is not supported");
  }
  if (model_type != "BPE") return Unimplemented("tokenizer model '" + model_type + "' is not supported");
  DAISY_ASSIGN_OR_RETURN(impl->model, tok::Bpe::FromJson(model));

  // Stages.
  auto get = [&](const char* key) -> json { return j.contains(key) ? j[key] : json(); };
  DAISY_ASSIGN_OR_RETURN(impl->normalizer, tok::MakeNormalizer(get("normalizer")));
  DAISY_ASSIGN_OR_RETURN(impl->pre_tokenizer, tok::MakePreTokenizer(get("pre_tokenizer")));
  DAISY_ASSIGN_OR_RETURN(impl->post_processor, tok::MakePostProcessor(get("post_processor")));
  DAISY_ASSIGN_OR_RETURN(impl->decoder, tok::MakeDecoder(get("decoder")));

  // Added tokens: an entry whose content is in the model vocabulary takes the model's id
  // (AddedVocabulary::add_tokens), otherwise the id written in the file.
  std::vector<AddedToken> added;
  int32_t max_id = impl->model->max_id();
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id") ||
          !a["id"].is_number_integer()) {
        return InvalidArgument("added_tokens entry without content and id: " + a.dump().substr(0, 200));
      }
      auto flag = [&](const char* k, bool d) { return a.contains(k) && a[k].is_boolean() ? a[k].get<bool>() : d; };
      AddedToken t;
      t.content = a["content"].get<std::string>();
      int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id > tok::kMaxTokenId)
        return InvalidArgument("added token '" + t.content + "' has id out of range");
      t.id = static_cast<int32_t>(id);
      if (auto mid = impl->model->TokenToId(t.content)) t.id = *mid;
      t.special = flag("special", false);
      t.normalized = flag("normalized", !t.special);
      t.lstrip = flag("lstrip", false);
      t.rstrip = flag("rstrip", false);
      t.single_word = flag("single_word", false);
      max_id = std::max(max_id, t.id);
      added.push_back(std::move(t));
    }
  }
  DAISY_RETURN_IF_ERROR(impl->added.Init(std::move(added), impl->normalizer.get()));
  impl->vocab_size = max_id + 1;

  // tokenizer_config.json, as transformers applies it.
  std::string cls = cfg.contains("tokenizer_class") && cfg["tokenizer_class"].is_string()
                        ? cfg["tokenizer_class"].get<std::string>()
                        : std::string();
  if (cfg.contains("clean_up_tokenization_spaces") && cfg["clean_up_tokenization_spaces"].is_boolean()) {
    impl->cleanup = cfg["clean_up_tokenization_spaces"].get<bool>();
  }
  auto bos_tok = ConfigToken(cfg, "bos_token");
  auto eos_tok = ConfigToken(cfg, "eos_token");
  if (bos_tok) impl->bos = impl->TokenToId(*bos_tok);
  if (eos_tok) impl->eos = impl->TokenToId(*eos_tok);
  if (IsLlamaFamily(cls)) {
    if (cfg.contains("add_prefix_space") && !cfg["add_prefix_space"].is_null()) {
      return Unimplemented("tokenizer_config.json sets add_prefix_space for " + cls +
                           ", which transformers applies by rebuilding from the SentencePiece model; not supported");
    }
    bool add_bos =
        cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean() ? cfg["add_bos_token"].get<bool>() : true;
    bool add_eos =
        cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean() ? cfg["add_eos_token"].get<bool>() : false;
    std::vector<int32_t> prefix, suffix;
    if (add_bos) {
      if (!bos_tok || !impl->bos)
        return InvalidArgument("add_bos_token is true but bos_token is missing or not in the vocabulary");
      prefix.push_back(*impl->bos);
    }
    if (add_eos) {
      if (!eos_tok || !impl->eos)
        return InvalidArgument("add_eos_token is true but eos_token is missing or not in the vocabulary");
      suffix.push_back(*impl->eos);
    }
    impl->post_processor = tok::MakeBosEosTemplate(std::move(prefix), std::move(suffix));
  } else if (cls == "GPT2Tokenizer" || cls == "GPT2TokenizerFast") {
    if (cfg.contains("add_prefix_space") && cfg["add_prefix_space"].is_boolean() && impl->pre_tokenizer) {
      tok::SetByteLevelPrefixSpace(impl->pre_tokenizer.get(), cfg["add_prefix_space"].get<bool>());
    }
  }
  return impl;
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::FromJson(std::string_view tokenizer_json, std::string_view tokenizer_config_json) {
  try {
    DAISY_ASSIGN_OR_RETURN(auto impl, Build(tokenizer_json, tokenizer_config_json));
    return Tokenizer(std::move(impl));
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("malformed tokenizer.json: ") + e.what());
  }
}

Result<Tokenizer> Tokenizer::Load(ModelSource& src) {
  auto tj = src.ReadFile("tokenizer.json");
  if (!tj.ok()) return tj.status().WithContext("loading the tokenizer of " + src.Describe());
  std::string config;
  auto cj = src.ReadFile("tokenizer_config.json");
  if (cj.ok()) {
    config = std::move(cj).value();
  } else if (cj.status().code() != ErrorCode::kNotFound) {
    return cj.status().WithContext("loading the tokenizer of " + src.Describe());
  }
  auto t = FromJson(*tj, config);
  if (!t.ok()) return t.status().WithContext("tokenizer.json of " + src.Describe());
  return t;
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::string lossy;
  if (!tok::IsValidUtf8(text)) {
    lossy = tok::Utf8Lossy(text);
    text = lossy;
  }
  Pieces pieces;
  DAISY_RETURN_IF_ERROR(impl_->added.ExtractAndNormalize(text, impl_->normalizer.get(), pieces));
  if (impl_->pre_tokenizer) DAISY_RETURN_IF_ERROR(impl_->pre_tokenizer->PreTokenize(pieces));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const auto& p : pieces) {
    if (p.token >= 0) {
      ids.push_back(p.token);
    } else {
      DAISY_RETURN_IF_ERROR(impl_->model->Tokenize(p.text, ids));
    }
  }
  if (impl_->post_processor) impl_->post_processor->Process(ids, add_special_tokens);
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens,
                              std::optional<bool> cleanup) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    std::string t;
    if (const AddedToken* a = impl_->added.ById(id)) {
      t = a->content;
    } else {
      const std::string& m = impl_->model->IdToToken(id);
      if (m.empty()) continue;
      t = m;
    }
    if (skip_special_tokens) {
      const AddedToken* a = impl_->added.ByContent(t);
      if (a && a->special) continue;
    }
    tokens.push_back(std::move(t));
  }
  std::string out;
  if (impl_->decoder) {
    impl_->decoder->DecodeChain(tokens);
    for (const auto& t : tokens) out += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out.push_back(' ');
      out += tokens[i];
    }
  }
  if (cleanup.value_or(impl_->cleanup)) CleanUpTokenization(out);
  return out;
}

std::string Tokenizer::IdToPiece(int32_t id) const {
  if (const AddedToken* a = impl_->added.ById(id)) return a->content;
  return impl_->model->IdToToken(id);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  return impl_->TokenToId(token);
}
int32_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}
std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->eos;
}
bool Tokenizer::IsSpecial(int32_t id) const {
  const AddedToken* a = impl_->added.ById(id);
  return a && a->special;
}

}  // namespace daisy
