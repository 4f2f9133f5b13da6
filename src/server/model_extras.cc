#include "model_extras.h"

#include "daisy/log.h"

namespace daisy::srv {

void ModelExtras::LoadFor(const ModelView& m) {
  const std::string key = m.model_id + "@" + m.revision;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (model_key_ == key) return;
  }
  std::shared_ptr<const ChatTemplateHandle> tmpl;
  auto t = LoadChatTemplateFor(m.source, hub_);
  if (t.ok()) tmpl = *t;
  if (!t.ok() && t.status().code() != ErrorCode::kNotFound)
    LogWarning("serve: the chat template of " + m.model_id + " cannot be used: " + t.status().message());
  std::lock_guard<std::mutex> lock(mu_);
  model_key_ = key;
  chat_template_ = tmpl;
  template_error_ = t.ok() ? "" : t.status().message();
  json_table_.reset();
}

bool ModelExtras::HasTemplate(const ModelView& m) const {
  std::lock_guard<std::mutex> lock(mu_);
  return model_key_ == m.model_id + "@" + m.revision && chat_template_ != nullptr;
}

Result<std::string> ModelExtras::RenderChat(const ModelView& model, const Json& messages, bool add_generation_prompt,
                                            const Json& kwargs) {
  LoadFor(model);
  std::shared_ptr<const ChatTemplateHandle> tmpl;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tmpl = chat_template_;
    why = template_error_;
  }
  if (!tmpl)
    return InvalidArgument("no chat template for " + model.model_id + ": " + why +
                           " (a plain prompt goes to /v1/completions)");
  return RenderChatTemplate(*tmpl, messages, add_generation_prompt, kwargs);
}

std::shared_ptr<JsonTable> ModelExtras::JsonTableFor(const Tokenizer& tokenizer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!json_table_) json_table_ = MakeJsonTable(tokenizer);
  return json_table_;
}

}  // namespace daisy::srv
