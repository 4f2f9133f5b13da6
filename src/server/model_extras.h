// What serve keeps of the loaded model beside the session: its chat template (read once
// per model) and its JSON-mode token table (made at the first JSON turn). Internal to
// src/server; thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "api.h"
#include "chat.h"
#include "daisy/head.h"
#include "daisy/hub.h"
#include "daisy/status.h"
#include "daisy/tokenizer.h"

namespace daisy::srv {

class ModelExtras {
 public:
  explicit ModelExtras(HubOptions hub) : hub_(std::move(hub)) {}

  // Reads the chat template of `m` unless it is the model already read.
  void LoadFor(const ModelView& m);
  bool HasTemplate(const ModelView& m) const;
  // Renders chat messages with the template of `model`; refuses a model without one.
  Result<std::string> RenderChat(const ModelView& model, const Json& messages, bool add_generation_prompt,
                                 const Json& kwargs);
  // The JSON-mode table of the current model, made from `tokenizer` at first use.
  std::shared_ptr<JsonTable> JsonTableFor(const Tokenizer& tokenizer);

 private:
  const HubOptions hub_;
  mutable std::mutex mu_;
  std::string model_key_;  // model_id@revision the extras belong to
  std::shared_ptr<const ChatTemplateHandle> chat_template_;
  std::string template_error_;  // why there is none
  std::shared_ptr<JsonTable> json_table_;
};

}  // namespace daisy::srv
