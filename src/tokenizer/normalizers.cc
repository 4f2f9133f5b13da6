// Normalizers: NFC, NFD, NFKC, NFKD (utf8proc), Lowercase, Strip, StripAccents, Prepend,
// Replace, Sequence. The Rust library normalizes with its own frozen copy of old Unicode
// data (unicode-normalization-alignments), which utf8proc 2.6 (Unicode 13) is close to;
// Lowercase follows char::to_lowercase (current Unicode, generated table). Each works on one piece's text, like
// NormalizedString in the Rust library (alignments are not kept: ids do not depend on them).
#include <utf8proc.h>

#include <cstdlib>
#include <utility>

#include "pipeline.h"
#include "unicode.h"

namespace daisy::tok {

namespace {

using nlohmann::json;

class UnicodeNormalizer final : public Normalizer {
 public:
  // nfc_fast: the form is NFC, which leaves every code point below U+0300 unchanged.
  UnicodeNormalizer(int options, bool nfc_fast) : options_(options), nfc_fast_(nfc_fast) {}
  Status Normalize(Piece& piece) const override {
    std::string& s = piece.text;
    // ASCII is unchanged by every form; below U+0300 (no byte >= 0xCC) unchanged by NFC.
    bool trivial = true;
    for (unsigned char c : s) {
      if (c >= (nfc_fast_ ? 0xCC : 0x80)) {
        trivial = false;
        break;
      }
    }
    if (trivial) return Status::Ok();
    utf8proc_uint8_t* out = nullptr;
    utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out,
                     static_cast<utf8proc_option_t>(options_));
    if (n < 0) {
      return Internal(std::string("unicode normalization failed: ") + utf8proc_errmsg(n));
    }
    s.assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    return Status::Ok();
  }

 private:
  int options_;
  bool nfc_fast_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  Status Normalize(Piece& piece) const override {
    const std::string& s = piece.text;
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) AppendLowercase(out, NextCodePoint(s, i));
    piece.text = std::move(out);
    return Status::Ok();
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status Normalize(Piece& piece) const override {
    std::string& s = piece.text;
    size_t begin = 0, end = s.size();
    if (left_) {
      while (begin < end) {
        size_t j = begin;
        if (!IsWhitespace(NextCodePoint(s, j))) break;
        begin = j;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t k = end - 1;
        while (k > begin && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t j = k;
        if (!IsWhitespace(NextCodePoint(s, j))) break;
        end = k;
      }
    }
    if (begin > 0) piece.at_origin = false;
    s = s.substr(begin, end - begin);
    return Status::Ok();
  }

 private:
  bool left_, right_;
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  Status Normalize(Piece& piece) const override {
    const std::string& s = piece.text;
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      size_t start = i;
      uint32_t cp = NextCodePoint(s, i);
      auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
      bool mark = cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
      if (!mark) {
        out.append(s, start, i - start);
      } else if (start == 0) {
        piece.at_origin = false;
      }
    }
    piece.text = std::move(out);
    return Status::Ok();
  }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  Status Normalize(Piece& piece) const override {
    if (!piece.text.empty()) piece.text.insert(0, prepend_);
    return Status::Ok();
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Status Normalize(Piece& piece) const override {
    if (content_.empty() && piece.at_origin) {
      // A match at the start replaced by nothing moves the piece's first character.
      std::vector<MatchSpan> spans;
      DAISY_RETURN_IF_ERROR(pattern_->FindMatches(piece.text, spans));
      if (!spans.empty() && spans[0].is_match && spans[0].end > spans[0].start) piece.at_origin = false;
    }
    return pattern_->ReplaceAll(piece.text, content_);
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  Status Normalize(Piece& piece) const override {
    for (const auto& n : steps_) DAISY_RETURN_IF_ERROR(n->Normalize(piece));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

bool GetBool(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : dflt;
}

}  // namespace

Result<std::unique_ptr<Normalizer>> MakeNormalizer(const json& j) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return InvalidArgument("normalizer without a type: " + j.dump().substr(0, 200));
  }
  const std::string type = j["type"].get<std::string>();
  constexpr int kStable = UTF8PROC_STABLE;
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(kStable | UTF8PROC_COMPOSE, true));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(kStable | UTF8PROC_DECOMPOSE, false));
  if (type == "NFKC") {
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(kStable | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, false));
  }
  if (type == "NFKD") {
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(kStable | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, false));
  }
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "StripAccents") return std::unique_ptr<Normalizer>(new StripAccentsNormalizer());
  if (type == "Strip") {
    return std::unique_ptr<Normalizer>(
        new StripNormalizer(GetBool(j, "strip_left", true), GetBool(j, "strip_right", true)));
  }
  if (type == "Prepend") {
    if (!j.contains("prepend") || !j["prepend"].is_string())
      return InvalidArgument("Prepend normalizer without 'prepend'");
    return std::unique_ptr<Normalizer>(new PrependNormalizer(j["prepend"].get<std::string>()));
  }
  if (type == "Replace") {
    if (!j.contains("pattern") || !j.contains("content") || !j["content"].is_string()) {
      return InvalidArgument("Replace normalizer needs 'pattern' and 'content'");
    }
    DAISY_ASSIGN_OR_RETURN(auto pattern, Pattern::FromJson(j["pattern"]));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(pattern), j["content"].get<std::string>()));
  }
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array()) {
      return InvalidArgument("Sequence normalizer without 'normalizers'");
    }
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& sub : j["normalizers"]) {
      DAISY_ASSIGN_OR_RETURN(auto n, MakeNormalizer(sub));
      if (n) steps.push_back(std::move(n));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  return Unimplemented("tokenizer normalizer '" + type + "' is not supported");
}

}  // namespace daisy::tok
