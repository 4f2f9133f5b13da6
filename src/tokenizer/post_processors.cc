// Post-processors (single sequence): TemplateProcessing, ByteLevel (ids unchanged; it only
// trims offsets), BertProcessing and RobertaProcessing, Sequence.
#include <utility>

#include "pipeline.h"

namespace daisy::tok {

namespace {

using nlohmann::json;

// Adds fixed ids before and after the sequence when special tokens are requested.
class AffixProcessor final : public PostProcessor {
 public:
  AffixProcessor(std::vector<int32_t> prefix, std::vector<int32_t> suffix)
      : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  void Process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
    ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  }

 private:
  std::vector<int32_t> prefix_, suffix_;
};

// TemplateProcessing's single template: pieces in order, "$A" the sequence.
class TemplateProcessor final : public PostProcessor {
 public:
  struct Item {
    bool is_sequence;
    std::vector<int32_t> ids;
  };
  explicit TemplateProcessor(std::vector<Item> items) : items_(std::move(items)) {}
  void Process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& it : items_) {
      if (it.is_sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else if (add_special_tokens) {
        out.insert(out.end(), it.ids.begin(), it.ids.end());
      }
    }
    ids = std::move(out);
  }

 private:
  std::vector<Item> items_;
};

class NoopProcessor final : public PostProcessor {
 public:
  void Process(std::vector<int32_t>&, bool) const override {}
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void Process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (const auto& s : steps_) s->Process(ids, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

Result<std::vector<int32_t>> SpecialIds(const json& special_tokens, const std::string& name) {
  if (!special_tokens.is_object() || !special_tokens.contains(name)) {
    return InvalidArgument("TemplateProcessing uses special token '" + name + "' missing from special_tokens");
  }
  const json& st = special_tokens[name];
  if (!st.contains("ids") || !st["ids"].is_array()) return InvalidArgument("special token '" + name + "' has no ids");
  std::vector<int32_t> ids;
  for (const auto& v : st["ids"]) {
    if (!v.is_number_integer()) return InvalidArgument("special token '" + name + "' has a non-integer id");
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

// A template piece: {"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "<s>"}} or the
// string forms "$A", "$B", "$", "$0", "<s>", each optionally with ":type_id".
Result<TemplateProcessor::Item> ParsePiece(const json& p, const json& special_tokens) {
  if (p.is_object() && p.contains("Sequence")) {
    const json& s = p["Sequence"];
    std::string id = s.contains("id") && s["id"].is_string() ? s["id"].get<std::string>() : "A";
    return TemplateProcessor::Item{id == "A", {}};
  }
  if (p.is_object() && p.contains("SpecialToken")) {
    const json& s = p["SpecialToken"];
    if (!s.contains("id") || !s["id"].is_string()) return InvalidArgument("template SpecialToken without id");
    DAISY_ASSIGN_OR_RETURN(auto ids, SpecialIds(special_tokens, s["id"].get<std::string>()));
    return TemplateProcessor::Item{false, std::move(ids)};
  }
  if (p.is_string()) {
    std::string s = p.get<std::string>();
    size_t colon = s.rfind(':');
    if (colon != std::string::npos && colon + 1 < s.size() &&
        s.find_first_not_of("0123456789", colon + 1) == std::string::npos) {
      s = s.substr(0, colon);
    }
    if (s == "$" || s == "$A" || s == "$a" || s == "$0") return TemplateProcessor::Item{true, {}};
    if (s == "$B" || s == "$b" || s == "$1") return TemplateProcessor::Item{false, {}};
    if (!s.empty() && s[0] == '$') return InvalidArgument("template piece '" + s + "' is not understood");
    DAISY_ASSIGN_OR_RETURN(auto ids, SpecialIds(special_tokens, s));
    return TemplateProcessor::Item{false, std::move(ids)};
  }
  return InvalidArgument("template piece " + p.dump() + " is not understood");
}

Result<std::pair<std::string, int32_t>> NameAndId(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2 || !j[key][1].is_number_integer()) {
    return InvalidArgument(std::string("post-processor field '") + key + "' must be [token, id]");
  }
  return std::make_pair(j[key][0].is_string() ? j[key][0].get<std::string>() : std::string(), j[key][1].get<int32_t>());
}

}  // namespace

std::unique_ptr<PostProcessor> MakeBosEosTemplate(std::vector<int32_t> prefix, std::vector<int32_t> suffix) {
  return std::make_unique<AffixProcessor>(std::move(prefix), std::move(suffix));
}

Result<std::unique_ptr<PostProcessor>> MakePostProcessor(const json& j) {
  if (j.is_null()) return std::unique_ptr<PostProcessor>();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return InvalidArgument("post_processor without a type: " + j.dump().substr(0, 200));
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return std::unique_ptr<PostProcessor>(new NoopProcessor());
  if (type == "TemplateProcessing") {
    const json special = j.contains("special_tokens") ? j["special_tokens"] : json::object();
    json single = j.contains("single") ? j["single"] : json();
    if (single.is_string()) {  // "[CLS] $A [SEP]"
      json arr = json::array();
      std::string s = single.get<std::string>();
      size_t pos = 0;
      while (pos < s.size()) {
        size_t sp = s.find(' ', pos);
        if (sp == std::string::npos) sp = s.size();
        if (sp > pos) arr.push_back(s.substr(pos, sp - pos));
        pos = sp + 1;
      }
      single = arr;
    }
    if (!single.is_array()) return InvalidArgument("TemplateProcessing without a 'single' template");
    std::vector<TemplateProcessor::Item> items;
    for (const auto& p : single) {
      DAISY_ASSIGN_OR_RETURN(auto item, ParsePiece(p, special));
      items.push_back(std::move(item));
    }
    return std::unique_ptr<PostProcessor>(new TemplateProcessor(std::move(items)));
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    DAISY_ASSIGN_OR_RETURN(auto cls, NameAndId(j, "cls"));
    DAISY_ASSIGN_OR_RETURN(auto sep, NameAndId(j, "sep"));
    return std::unique_ptr<PostProcessor>(new AffixProcessor({cls.second}, {sep.second}));
  }
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array()) {
      return InvalidArgument("Sequence post-processor without 'processors'");
    }
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (const auto& sub : j["processors"]) {
      DAISY_ASSIGN_OR_RETURN(auto p, MakePostProcessor(sub));
      if (p) steps.push_back(std::move(p));
    }
    return std::unique_ptr<PostProcessor>(new SequenceProcessor(std::move(steps)));
  }
  return Unimplemented("tokenizer post-processor '" + type + "' is not supported");
}

}  // namespace daisy::tok
