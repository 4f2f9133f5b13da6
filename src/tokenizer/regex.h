// A compiled tokenizer regex: an Oniguruma (Ruby syntax) pattern, as the Rust `tokenizers`
// library compiles it, run through PCRE2 (UTF, UCP, JIT). The few constructs whose meaning
// differs between the two engines are rewritten before compiling: \s and \S become the
// Unicode White_Space set Oniguruma uses, \w and \W Oniguruma's Unicode word set, \h and
// \H hexadecimal digits. Thread-safe: matching state lives on the caller's stack.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daisy/status.h"

namespace daisy::tok {

// [start, end) byte offsets of one match.
using Span = std::pair<size_t, size_t>;

class Regex {
 public:
  // Fails with a message naming the pattern when it cannot be translated or compiled.
  static Result<std::unique_ptr<Regex>> Compile(std::string_view onig_pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All non-overlapping matches in `text` (valid UTF-8), left to right, as the onig crate's
  // find_iter yields them: an empty match right after the previous match is skipped by one
  // character. Fails only if the engine gives up (resource limits).
  Status FindAll(std::string_view text, std::vector<Span>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// Exposed for tests: the PCRE2 pattern an Oniguruma pattern is rewritten to.
Result<std::string> TranslateOnigPattern(std::string_view onig_pattern);

}  // namespace daisy::tok
