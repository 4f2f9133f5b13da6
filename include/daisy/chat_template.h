// Chat templates: the Jinja template a model ships (tokenizer_config.json "chat_template" or
// chat_template.jinja) rendered as transformers' apply_chat_template(tokenize=False) does,
// by a small Jinja interpreter of our own. docs/TEMPLATES.md lists the supported subset.
//
// A construct outside the subset (a filter, test, tag or method it does not know) is
// refused with a message naming it, e.g. "unsupported Jinja construct: filter 'wordcount'
// at line 3"; nothing is guessed. Malformed templates and hostile ones (deep nesting,
// runaway loops, huge output) end with an error, never a crash or a hang.
//
// JSON crosses this interface as text, so no JSON library type appears here.
//
// Thread safety: a parsed ChatTemplate is immutable; Render() may be called from any
// number of threads at once. Movable, not copyable.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "daisy/source.h"
#include "daisy/status.h"

namespace daisy {

namespace jinja {
struct Program;
}

class ChatTemplate {
 public:
  // Parses the template (trim_blocks and lstrip_blocks on, as transformers sets them).
  // InvalidArgument for a syntax error, Unimplemented for a construct outside the subset.
  static Result<ChatTemplate> Parse(std::string_view source);

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;
  ~ChatTemplate();

  // Renders with `context_json`, a JSON object whose members are the template's variables
  // (messages, add_generation_prompt, bos_token, ..., extra kwargs). The globals
  // raise_exception(msg) (fails with exactly msg, InvalidArgument), strftime_now(fmt)
  // (local clock), namespace(), range() and dict() are defined.
  Result<std::string> Render(std::string_view context_json) const;

 private:
  explicit ChatTemplate(std::unique_ptr<jinja::Program> program);
  std::unique_ptr<jinja::Program> program_;
};

// A model's template and the special tokens transformers passes to it.
struct ModelChatTemplate {
  std::string source;
  // bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token from
  // tokenizer_config.json (a string or {"content": ...}); unset or null ones are absent.
  std::map<std::string, std::string> special_tokens;
};

// chat_template.jinja when the source has one (it wins, as in transformers), else
// tokenizer_config.json "chat_template": a string, or a list of {name, template} of which
// "default" is used. NotFound when the model has no template.
Result<ModelChatTemplate> LoadChatTemplate(ModelSource& src);

// transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt, **kwargs):
// `messages_json` is a JSON array, `kwargs_json` a JSON object or empty. The context is
// the special tokens, then tools=None and documents=None, then the kwargs, then messages
// and add_generation_prompt.
Result<std::string> ApplyChatTemplate(const ModelChatTemplate& t, std::string_view messages_json,
                                      bool add_generation_prompt, std::string_view kwargs_json);
// The same with a template already parsed (for rendering many conversations).
Result<std::string> ApplyChatTemplate(const ChatTemplate& parsed, const ModelChatTemplate& t,
                                      std::string_view messages_json, bool add_generation_prompt,
                                      std::string_view kwargs_json);

}  // namespace daisy
