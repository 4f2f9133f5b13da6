// The server's use of two other modules: chat templates (chat) and JSON mode (sample).
// Kept behind this small interface so the rest of the server does not depend on their
// headers' details.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "daisy/generator.h"
#include "daisy/hub.h"
#include "daisy/status.h"
#include "daisy/tokenizer.h"

namespace daisy {
class JsonTokenTable;
}

namespace daisy::srv {

// A model's chat template, ready to render. Immutable; shared by concurrent requests.
struct ChatTemplateHandle;
// Reads and parses the chat template of SRC (chat_template.jinja, or tokenizer_config.json's
// chat_template) and its special tokens. NotFound when the model has none.
Result<std::shared_ptr<const ChatTemplateHandle>> LoadChatTemplateFor(const std::string& source, const HubOptions& hub);
// Renders messages (an array of {role, content, ...}) with extra template variables.
Result<std::string> RenderChatTemplate(const ChatTemplateHandle& t, const nlohmann::json& messages,
                                       bool add_generation_prompt, const nlohmann::json& kwargs);

// JSON mode's per-tokenizer table (expensive: build once per model) and its per-run hooks.
using JsonTable = JsonTokenTable;
std::shared_ptr<JsonTable> MakeJsonTable(const Tokenizer& tokenizer);
// Installs a fresh JSON mode into `options` (after the stop ids and other hooks are set).
void InstallJsonMode(GenerateOptions& options, const std::shared_ptr<JsonTable>& table);

}  // namespace daisy::srv
