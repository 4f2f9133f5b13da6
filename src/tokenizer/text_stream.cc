// TextStream: showing generated text as it arrives, one id at a time.
#include "daisy/tokenizer.h"

namespace daisy {

namespace {

// The length of the prefix of `s` safe to show now: everything but an incomplete UTF-8
// sequence at the very end and a trailing run of U+FFFD (a byte-fallback character whose
// remaining bytes have not arrived yet).
size_t StableLength(const std::string& s) {
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > back) n -= back;
    break;
  }
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  while (n >= 3 && s.compare(n - 3, 3, kReplacement) == 0) n -= 3;
  return n;
}

}  // namespace

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<int32_t> context)
    : tok_(tokenizer), ids_(std::move(context)), context_len_(ids_.size()) {
  context_text_ = tok_.Decode(ids_, true);
  shown_ = context_text_.substr(0, StableLength(context_text_));
}

std::string TextStream::Add(int32_t id) {
  ids_.push_back(id);
  const std::string text = tok_.Decode(ids_, true);
  // A decoder may rewrite earlier text (e.g. cleanup); then wait for it to settle.
  if (text.compare(0, shown_.size(), shown_) != 0) return "";
  const size_t stable = StableLength(text);
  if (stable <= shown_.size()) return "";
  std::string piece = text.substr(shown_.size(), stable - shown_.size());
  shown_ += piece;
  return piece;
}

std::string TextStream::Finish() {
  const std::string text = tok_.Decode(ids_, true);
  if (text.compare(0, shown_.size(), shown_) != 0) return "";
  std::string rest = text.substr(shown_.size());
  shown_ += rest;
  return rest;
}

std::string TextStream::Completion() const {
  const std::string text = tok_.Decode(ids_, true);
  if (text.compare(0, context_text_.size(), context_text_) == 0) return text.substr(context_text_.size());
  // The decoder joined the context and the rest differently: decode the rest alone.
  return tok_.Decode(std::span<const int32_t>(ids_).subspan(context_len_), true);
}

}  // namespace daisy
