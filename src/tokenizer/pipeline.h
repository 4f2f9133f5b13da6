// Internal interfaces of the tokenizer pipeline, one abstract class per stage of
// tokenizer.json. Each stage is immutable after construction (thread-safe to run
// concurrently). Factories read the stage's JSON and refuse unknown types by name.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/status.h"
#include "regex.h"

namespace daisy::tok {

// One split of the input as it moves through the pipeline (the Rust library's `Split` of a
// PreTokenizedString, keeping only what ids depend on).
struct Piece {
  std::string text;        // current (normalized, pre-tokenized) text, valid UTF-8
  bool at_origin = false;  // starts at byte 0 of the original input (Metaspace "first")
  int32_t token = -1;      // id already assigned (an added token), or -1
};
using Pieces = std::vector<Piece>;

// ---- split patterns (NormalizedString::split) -------------------------------------------

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
Result<SplitBehavior> ParseSplitBehavior(const nlohmann::json& j);

// A pattern's matches over a whole string: consecutive [start, end) spans covering it, each
// flagged as a match or not (the Rust `Pattern::find_matches`).
struct MatchSpan {
  size_t start, end;
  bool is_match;
};

class Pattern {
 public:
  static Result<std::unique_ptr<Pattern>> FromJson(const nlohmann::json& j);  // {"String"|"Regex": ..}
  static std::unique_ptr<Pattern> Literal(std::string s);
  Status FindMatches(std::string_view text, std::vector<MatchSpan>& out) const;
  // Replaces every match by `content` (Replace normalizer and decoder).
  Status ReplaceAll(std::string& text, std::string_view content) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

// Splits `piece` into `out` by `matches` under `behavior` (empty parts are dropped).
void SplitByMatches(const Piece& piece, const std::vector<MatchSpan>& matches, SplitBehavior behavior, Pieces& out);

// ---- stages -------------------------------------------------------------------------------

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual Status Normalize(Piece& piece) const = 0;
};
// json may be null (no normalizer): returns nullptr.
Result<std::unique_ptr<Normalizer>> MakeNormalizer(const nlohmann::json& j);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits every piece that has no token yet.
  virtual Status PreTokenize(Pieces& pieces) const = 0;
};
Result<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const nlohmann::json& j);
// For transformers' GPT2TokenizerFast: set add_prefix_space on a top-level ByteLevel.
bool SetByteLevelPrefixSpace(PreTokenizer* pre, bool add_prefix_space);

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void Process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
};
// TemplateProcessing takes the ids of its special tokens from its own "special_tokens".
Result<std::unique_ptr<PostProcessor>> MakePostProcessor(const nlohmann::json& j);
// transformers' LlamaTokenizerFast.update_post_processor: "[bos:0] $A:0 [eos:0]".
std::unique_ptr<PostProcessor> MakeBosEosTemplate(std::vector<int32_t> prefix, std::vector<int32_t> suffix);

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>& tokens) const = 0;
};
Result<std::unique_ptr<Decoder>> MakeDecoder(const nlohmann::json& j);

// The GPT-2 byte <-> printable-character table (bytes_to_unicode), as UTF-8 strings.
const std::string& ByteToChar(uint8_t b);
// -1 if cp is not one of the 256 characters.
int CharToByte(uint32_t cp);

}  // namespace daisy::tok
