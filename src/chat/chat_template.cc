// ChatTemplate and the loading of a model's template (chat_template.jinja or
// tokenizer_config.json) with its special tokens.
#include "daisy/chat_template.h"

#include <nlohmann/json.hpp>

#include "jinja.h"

namespace daisy {

using json = nlohmann::ordered_json;

ChatTemplate::ChatTemplate(std::unique_ptr<jinja::Program> program) : program_(std::move(program)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

Result<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  DAISY_ASSIGN_OR_RETURN(auto program, jinja::Parse(source));
  return ChatTemplate(std::move(program));
}

Result<std::string> ChatTemplate::Render(std::string_view context_json) const {
  DAISY_ASSIGN_OR_RETURN(jinja::Value context, jinja::FromJsonText(context_json));
  if (context.kind != jinja::Value::Kind::kDict) return InvalidArgument("the template context must be a JSON object");
  return jinja::Render(*program_, context);
}

namespace {

constexpr const char* kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

Result<std::string> TemplateFromConfig(const json& cfg, const std::string& where) {
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) return NotFound(where + " has no chat_template");
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& t : *it) {
      if (t.is_object() && t.value("name", json()) == "default") {
        if (!t.contains("template") || !t["template"].is_string()) {
          return InvalidArgument(where + ": the \"default\" chat_template has no string \"template\"");
        }
        return t["template"].get<std::string>();
      }
    }
    return NotFound(where + " has several chat templates and none is named \"default\"");
  }
  return InvalidArgument(where + ": chat_template is neither a string nor a list of {name, template}");
}

}  // namespace

Result<ModelChatTemplate> LoadChatTemplate(ModelSource& src) {
  ModelChatTemplate out;
  const std::string where = "tokenizer_config.json of " + src.Describe();
  json cfg;
  auto cj = src.ReadFile("tokenizer_config.json");
  if (cj.ok()) {
    cfg = json::parse(*cj, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object()) return InvalidArgument(where + " is not a JSON object");
    for (const char* key : kSpecialTokens) {
      auto it = cfg.find(key);
      if (it == cfg.end()) continue;
      if (it->is_string()) {
        out.special_tokens[key] = it->get<std::string>();
      } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        out.special_tokens[key] = (*it)["content"].get<std::string>();
      }
    }
  } else if (cj.status().code() != ErrorCode::kNotFound) {
    return cj.status().WithContext("loading the chat template of " + src.Describe());
  }
  auto jinja_file = src.ReadFile("chat_template.jinja");
  if (jinja_file.ok()) {
    out.source = std::move(jinja_file).value();
    return out;
  }
  if (jinja_file.status().code() != ErrorCode::kNotFound) {
    return jinja_file.status().WithContext("loading the chat template of " + src.Describe());
  }
  if (!cj.ok()) {
    return NotFound(src.Describe() + " has no chat template (neither chat_template.jinja nor tokenizer_config.json)");
  }
  DAISY_ASSIGN_OR_RETURN(out.source, TemplateFromConfig(cfg, where));
  return out;
}

Result<std::string> ApplyChatTemplate(const ChatTemplate& parsed, const ModelChatTemplate& t,
                                      std::string_view messages_json, bool add_generation_prompt,
                                      std::string_view kwargs_json) {
  json messages = json::parse(messages_json, nullptr, false);
  if (messages.is_discarded() || !messages.is_array()) return InvalidArgument("messages must be a JSON array");
  json context = json::object();
  for (const auto& [k, v] : t.special_tokens) context[k] = v;
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  if (!kwargs_json.empty()) {
    json kwargs = json::parse(kwargs_json, nullptr, false);
    if (kwargs.is_discarded() || !(kwargs.is_object() || kwargs.is_null())) {
      return InvalidArgument("kwargs must be a JSON object");
    }
    if (kwargs.is_object()) {
      for (auto it = kwargs.begin(); it != kwargs.end(); ++it) context[it.key()] = it.value();
    }
  }
  context["messages"] = std::move(messages);
  context["add_generation_prompt"] = add_generation_prompt;
  return parsed.Render(context.dump(-1, ' ', false, json::error_handler_t::replace));
}

Result<std::string> ApplyChatTemplate(const ModelChatTemplate& t, std::string_view messages_json,
                                      bool add_generation_prompt, std::string_view kwargs_json) {
  DAISY_ASSIGN_OR_RETURN(ChatTemplate parsed, ChatTemplate::Parse(t.source));
  return ApplyChatTemplate(parsed, t, messages_json, add_generation_prompt, kwargs_json);
}

}  // namespace daisy
