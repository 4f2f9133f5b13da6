// Chat templates and JSON mode for the server (see chat.h).
#include "chat.h"

#include "daisy/chat_template.h"
#include "daisy/json_mode.h"

namespace daisy::srv {

struct ChatTemplateHandle {
  ModelChatTemplate model;
  ChatTemplate parsed;
};

Result<std::shared_ptr<const ChatTemplateHandle>> LoadChatTemplateFor(const std::string& source,
                                                                      const HubOptions& hub) {
  DAISY_ASSIGN_OR_RETURN(auto src, OpenModelSource(source, hub));
  DAISY_ASSIGN_OR_RETURN(ModelChatTemplate t, LoadChatTemplate(*src));
  DAISY_ASSIGN_OR_RETURN(ChatTemplate parsed, ChatTemplate::Parse(t.source));
  return std::shared_ptr<const ChatTemplateHandle>(new ChatTemplateHandle{std::move(t), std::move(parsed)});
}

Result<std::string> RenderChatTemplate(const ChatTemplateHandle& t, const nlohmann::json& messages,
                                       bool add_generation_prompt, const nlohmann::json& kwargs) {
  const auto dump = [](const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  return ApplyChatTemplate(t.parsed, t.model, dump(messages), add_generation_prompt,
                           kwargs.empty() ? "" : dump(kwargs));
}

std::shared_ptr<JsonTable> MakeJsonTable(const Tokenizer& tokenizer) {
  return std::make_shared<JsonTokenTable>(tokenizer);
}

void InstallJsonMode(GenerateOptions& options, const std::shared_ptr<JsonTable>& table) {
  JsonMode::Install(options, std::make_shared<JsonMode>(std::shared_ptr<const JsonTokenTable>(table)));
}

}  // namespace daisy::srv
