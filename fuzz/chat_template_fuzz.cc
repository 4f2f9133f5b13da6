// libFuzzer: the chat-template (Jinja subset) parser and renderer. Input: a template; when
// it parses, it is rendered with a fixed conversation. Errors are fine; crashes, hangs and
// unbounded memory are not.
#include <cstdint>
#include <string_view>

#include "daisy/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view src(reinterpret_cast<const char*>(data), size);
  auto t = daisy::ChatTemplate::Parse(src);
  if (!t.ok()) return 0;
  static constexpr std::string_view kContext =
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b>"},)"
      R"( {"role": "assistant", "content": "  Hello!  "}, {"role": "user", "content": "Again"}],)"
      R"( "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "tools": null})";
  (void)t->Render(kContext);
  return 0;
}
