// Decoders (tokenizers/src/decoders/*.rs): ByteLevel, Metaspace, Replace, ByteFallback,
// Fuse, Strip, Sequence. Each rewrites the list of token strings (decode_chain).
#include <utility>

#include "pipeline.h"
#include "unicode.h"

namespace daisy::tok {

namespace {

using nlohmann::json;

class ByteLevelDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      size_t mark = bytes.size();
      bool all = true;
      for (size_t i = 0; i < t.size();) {
        int b = CharToByte(NextCodePoint(t, i));
        if (b < 0) {
          all = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!all) {  // a token with a character outside the table keeps its own bytes
        bytes.resize(mark);
        bytes.append(t);
      }
    }
    tokens.assign(1, Utf8Lossy(bytes));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(uint32_t replacement, bool prepend) : replacement_(replacement), prepend_(prepend) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      const std::string& t = tokens[k];
      std::string out;
      out.reserve(t.size());
      for (size_t i = 0; i < t.size();) {
        size_t start = i;
        uint32_t cp = NextCodePoint(t, i);
        if (cp == replacement_) {
          if (!(k == 0 && prepend_)) out.push_back(' ');
        } else {
          out.append(t, start, i - start);
        }
      }
      tokens[k] = std::move(out);
    }
  }

 private:
  uint32_t replacement_;
  bool prepend_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      // A regex failure (resource limits) leaves the token as it is.
      (void)pattern_->ReplaceAll(t, content_);
    }
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class ByteFallbackDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&]() {
      if (pending.empty()) return;
      if (IsValidUtf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (auto& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        // u8::from_str_radix(&t[3..5], 16), which also accepts a leading '+'.
        int hi = HexValue(t[3]), lo = HexValue(t[4]);
        if (hi >= 0 && lo >= 0) {
          byte = hi * 16 + lo;
        } else if (t[3] == '+' && lo >= 0) {
          byte = lo;
        }
      }
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.clear();
    tokens.push_back(std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(uint32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<size_t, uint32_t>> chars;  // (byte offset, code point)
      for (size_t i = 0; i < t.size();) {
        size_t at = i;
        chars.emplace_back(at, NextCodePoint(t, i));
      }
      size_t start_cut = 0;
      for (size_t i = 0; i < start_ && i < chars.size(); ++i) {
        if (chars[i].second != content_) break;
        start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        size_t index = chars.size() - i - 1;
        if (chars[index].second != content_) break;
        stop_cut = index;
      }
      if (stop_cut < start_cut) stop_cut = start_cut;
      size_t b0 = start_cut < chars.size() ? chars[start_cut].first : t.size();
      size_t b1 = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(b0, b1 - b0);
    }
  }

 private:
  uint32_t content_;
  size_t start_, stop_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (const auto& s : steps_) s->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

Result<uint32_t> OneChar(const json& j, const char* key, const char* dflt) {
  std::string s = j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string(dflt);
  size_t i = 0;
  if (s.empty() || !IsValidUtf8(s))
    return InvalidArgument(std::string("decoder field '") + key + "' must be one character");
  uint32_t cp = NextCodePoint(s, i);
  if (i != s.size())
    return InvalidArgument(std::string("decoder field '") + key + "' must be one character, got '" + s + "'");
  return cp;
}

}  // namespace

Result<std::unique_ptr<Decoder>> MakeDecoder(const json& j) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return InvalidArgument("decoder without a type: " + j.dump().substr(0, 200));
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "Metaspace") {
    DAISY_ASSIGN_OR_RETURN(uint32_t rep, OneChar(j, "replacement", "\xE2\x96\x81"));
    bool prepend = true;
    if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean())
      prepend = j["add_prefix_space"].get<bool>();
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      const std::string ps = j["prepend_scheme"].get<std::string>();
      if (ps != "first" && ps != "always" && ps != "never") {
        return Unimplemented("Metaspace prepend_scheme '" + ps + "' is not supported");
      }
      prepend = ps != "never";
    }
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(rep, prepend));
  }
  if (type == "Replace") {
    if (!j.contains("pattern") || !j.contains("content") || !j["content"].is_string()) {
      return InvalidArgument("Replace decoder needs 'pattern' and 'content'");
    }
    DAISY_ASSIGN_OR_RETURN(auto pattern, Pattern::FromJson(j["pattern"]));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(pattern), j["content"].get<std::string>()));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    DAISY_ASSIGN_OR_RETURN(uint32_t content, OneChar(j, "content", " "));
    auto count = [&](const char* key) -> size_t {
      return j.contains(key) && j[key].is_number_unsigned() ? j[key].get<size_t>() : 0;
    };
    return std::unique_ptr<Decoder>(new StripDecoder(content, count("start"), count("stop")));
  }
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array())
      return InvalidArgument("Sequence decoder without 'decoders'");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& sub : j["decoders"]) {
      DAISY_ASSIGN_OR_RETURN(auto d, MakeDecoder(sub));
      if (d) steps.push_back(std::move(d));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  return Unimplemented("tokenizer decoder '" + type + "' is not supported");
}

}  // namespace daisy::tok
