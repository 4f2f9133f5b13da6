// Pre-tokenizers: ByteLevel, Split, Digits, Metaspace, Whitespace, WhitespaceSplit,
// Sequence, as in tokenizers/src/pre_tokenizers/*.rs.
#include <array>
#include <utility>

#include "pipeline.h"
#include "unicode.h"

namespace daisy::tok {

namespace {

using nlohmann::json;

struct ByteTable {
  std::array<std::string, 256> to_char;
  std::array<int, 324> to_byte;  // code points used are below 324
  ByteTable() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      AppendUtf8(to_char[b], cp);
      to_byte[cp] = b;
    }
  }
};

const ByteTable& Table() {
  static const ByteTable kTable;
  return kTable;
}

// Applies fn(piece, out) to every piece without a token; pieces with tokens pass through.
template <typename Fn>
Status SplitEach(Pieces& pieces, Fn&& fn) {
  Pieces out;
  out.reserve(pieces.size() * 2);
  for (auto& p : pieces) {
    if (p.token >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    DAISY_RETURN_IF_ERROR(fn(p, out));
  }
  pieces = std::move(out);
  return Status::Ok();
}

// The Fn(char) -> bool pattern: each matching character is its own match.
template <typename Pred>
void CharMatches(std::string_view s, Pred pred, std::vector<MatchSpan>& out) {
  out.clear();
  if (s.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t last_offset = 0;
  for (size_t i = 0; i < s.size();) {
    size_t b = i;
    uint32_t cp = NextCodePoint(s, i);
    if (pred(cp)) {
      if (last_offset < b) out.push_back({last_offset, b, false});
      out.push_back({b, i, true});
      last_offset = i;
    }
  }
  if (s.size() > last_offset) out.push_back({last_offset, s.size(), false});
}

constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPre final : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, std::unique_ptr<Regex> re)
      : add_prefix_space_(add_prefix_space), re_(std::move(re)) {}
  void SetAddPrefixSpace(bool v) { add_prefix_space_ = v; }

  Status PreTokenize(Pieces& pieces) const override {
    std::vector<Span> spans;
    const ByteTable& t = Table();
    auto map_bytes = [&](std::string_view s) {
      std::string m;
      m.reserve(s.size() * 2);
      for (unsigned char c : s) m.append(t.to_char[c]);
      return m;
    };
    return SplitEach(pieces, [&](Piece& p, Pieces& out) -> Status {
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text.insert(p.text.begin(), ' ');
      if (!re_) {
        p.text = map_bytes(p.text);
        out.push_back(std::move(p));
        return Status::Ok();
      }
      spans.clear();
      DAISY_RETURN_IF_ERROR(re_->FindAll(p.text, spans));
      // Isolated: matches and the gaps between them, each its own piece.
      size_t prev = 0;
      auto emit = [&](size_t s, size_t e) {
        if (e == s) return;
        Piece np;
        np.text = map_bytes(std::string_view(p.text).substr(s, e - s));
        np.at_origin = p.at_origin && s == 0;
        out.push_back(std::move(np));
      };
      for (auto [s, e] : spans) {
        emit(prev, s);
        emit(s, e);
        prev = e;
      }
      emit(prev, p.text.size());
      return Status::Ok();
    });
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

class SplitPre final : public PreTokenizer {
 public:
  SplitPre(std::unique_ptr<Pattern> pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  Status PreTokenize(Pieces& pieces) const override {
    std::vector<MatchSpan> m;
    return SplitEach(pieces, [&](Piece& p, Pieces& out) -> Status {
      DAISY_RETURN_IF_ERROR(pattern_->FindMatches(p.text, m));
      if (invert_) {
        for (auto& x : m) x.is_match = !x.is_match;
      }
      SplitByMatches(p, m, behavior_, out);
      return Status::Ok();
    });
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class DigitsPre final : public PreTokenizer {
 public:
  explicit DigitsPre(bool individual) : individual_(individual) {}
  Status PreTokenize(Pieces& pieces) const override {
    std::vector<MatchSpan> m;
    return SplitEach(pieces, [&](Piece& p, Pieces& out) -> Status {
      CharMatches(p.text, IsNumeric, m);
      SplitByMatches(p, m, individual_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, out);
      return Status::Ok();
    });
  }

 private:
  bool individual_;
};

enum class PrependScheme { kFirst, kAlways, kNever };

class MetaspacePre final : public PreTokenizer {
 public:
  MetaspacePre(uint32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), scheme_(scheme), split_(split) {
    AppendUtf8(rep_, replacement);
  }
  Status PreTokenize(Pieces& pieces) const override {
    std::vector<MatchSpan> m;
    return SplitEach(pieces, [&](Piece& p, Pieces& out) -> Status {
      std::string s;
      s.reserve(p.text.size() + 8);
      for (char c : p.text) {
        if (c == ' ') {
          s.append(rep_);
        } else {
          s.push_back(c);
        }
      }
      p.text = std::move(s);
      bool starts = p.text.compare(0, rep_.size(), rep_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_origin))) {
        p.text.insert(0, rep_);
      }
      if (!split_) {
        out.push_back(std::move(p));
        return Status::Ok();
      }
      CharMatches(
          p.text, [&](uint32_t cp) { return cp == replacement_; }, m);
      SplitByMatches(p, m, SplitBehavior::kMergedWithNext, out);
      return Status::Ok();
    });
  }

 private:
  uint32_t replacement_;
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

class WhitespacePre final : public PreTokenizer {
 public:
  explicit WhitespacePre(std::unique_ptr<Regex> re) : re_(std::move(re)) {}
  Status PreTokenize(Pieces& pieces) const override {
    std::vector<Span> spans;
    return SplitEach(pieces, [&](Piece& p, Pieces& out) -> Status {
      if (re_) {  // Whitespace: keep the matches of \w+|[^\w\s]+
        spans.clear();
        DAISY_RETURN_IF_ERROR(re_->FindAll(p.text, spans));
        for (auto [s, e] : spans) {
          if (e == s) continue;
          Piece np;
          np.text = p.text.substr(s, e - s);
          np.at_origin = p.at_origin && s == 0;
          out.push_back(std::move(np));
        }
      } else {  // WhitespaceSplit: drop whitespace characters
        std::vector<MatchSpan> m;
        CharMatches(p.text, IsWhitespace, m);
        SplitByMatches(p, m, SplitBehavior::kRemoved, out);
      }
      return Status::Ok();
    });
  }

 private:
  std::unique_ptr<Regex> re_;
};

class SequencePre final : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  Status PreTokenize(Pieces& pieces) const override {
    for (const auto& s : steps_) DAISY_RETURN_IF_ERROR(s->PreTokenize(pieces));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

bool GetBool(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : dflt;
}

}  // namespace

const std::string& ByteToChar(uint8_t b) {
  return Table().to_char[b];
}
int CharToByte(uint32_t cp) {
  return cp < 324 ? Table().to_byte[cp] : -1;
}

bool SetByteLevelPrefixSpace(PreTokenizer* pre, bool add_prefix_space) {
  auto* bl = dynamic_cast<ByteLevelPre*>(pre);
  if (!bl) return false;
  bl->SetAddPrefixSpace(add_prefix_space);
  return true;
}

Result<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const json& j) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return InvalidArgument("pre_tokenizer without a type: " + j.dump().substr(0, 200));
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") {
    std::unique_ptr<Regex> re;
    if (GetBool(j, "use_regex", true)) {
      DAISY_ASSIGN_OR_RETURN(re, Regex::Compile(kGpt2Pattern));
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPre(GetBool(j, "add_prefix_space", true), std::move(re)));
  }
  if (type == "Split") {
    if (!j.contains("pattern") || !j.contains("behavior"))
      return InvalidArgument("Split pre-tokenizer needs 'pattern' and 'behavior'");
    DAISY_ASSIGN_OR_RETURN(auto pattern, Pattern::FromJson(j["pattern"]));
    DAISY_ASSIGN_OR_RETURN(SplitBehavior behavior, ParseSplitBehavior(j["behavior"]));
    return std::unique_ptr<PreTokenizer>(new SplitPre(std::move(pattern), behavior, GetBool(j, "invert", false)));
  }
  if (type == "Digits") return std::unique_ptr<PreTokenizer>(new DigitsPre(GetBool(j, "individual_digits", false)));
  if (type == "Metaspace") {
    std::string rep = j.contains("replacement") && j["replacement"].is_string() ? j["replacement"].get<std::string>()
                                                                                : std::string("\xE2\x96\x81");
    size_t i = 0;
    if (rep.empty() || !IsValidUtf8(rep) || (NextCodePoint(rep, i), i != rep.size())) {
      return InvalidArgument("Metaspace replacement must be one character, got '" + rep + "'");
    }
    i = 0;
    uint32_t cp = NextCodePoint(rep, i);
    PrependScheme scheme = GetBool(j, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      const std::string ps = j["prepend_scheme"].is_string() ? j["prepend_scheme"].get<std::string>() : "";
      if (ps == "first") {
        scheme = PrependScheme::kFirst;
      } else if (ps == "always") {
        scheme = PrependScheme::kAlways;
      } else if (ps == "never") {
        scheme = PrependScheme::kNever;
      } else {
        return Unimplemented("Metaspace prepend_scheme '" + j["prepend_scheme"].dump() + "' is not supported");
      }
    }
    return std::unique_ptr<PreTokenizer>(new MetaspacePre(cp, scheme, GetBool(j, "split", true)));
  }
  if (type == "Whitespace") {
    DAISY_ASSIGN_OR_RETURN(auto re, Regex::Compile(R"(\w+|[^\w\s]+)"));
    return std::unique_ptr<PreTokenizer>(new WhitespacePre(std::move(re)));
  }
  if (type == "WhitespaceSplit") return std::unique_ptr<PreTokenizer>(new WhitespacePre(nullptr));
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return InvalidArgument("Sequence pre-tokenizer without 'pretokenizers'");
    }
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& sub : j["pretokenizers"]) {
      DAISY_ASSIGN_OR_RETURN(auto p, MakePreTokenizer(sub));
      if (p) steps.push_back(std::move(p));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePre(std::move(steps)));
  }
  return Unimplemented("tokenizer pre-tokenizer '" + type + "' is not supported");
}

}  // namespace daisy::tok
