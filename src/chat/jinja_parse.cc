// Lexer and parser of the Jinja subset. The lexer applies Jinja2's whitespace rules as the
// text is cut (trim_blocks, lstrip_blocks, `-`/`+` markers, the dropped final newline); the
// parser is recursive descent with Jinja2's operator precedence, refusing by name every
// tag, filter and test outside the subset.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "jinja.h"

namespace daisy::jinja {
namespace {

struct Token {
  enum class Kind : uint8_t {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Kind kind = Kind::kEof;
  std::string text;  // text, name, string value, operator
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

using TK = Token::Kind;

bool IsSpaceByte(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}
bool IsNameChar(char c) {
  return IsNameStart(c) || IsDigit(c);
}

Status SyntaxError(int line, const std::string& what) {
  return InvalidArgument("chat template syntax error at line " + std::to_string(line) + ": " + what);
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {
    // keep_trailing_newline=False: one final newline of the template is dropped.
    if (src_.ends_with("\r\n")) {
      src_.remove_suffix(2);
    } else if (src_.ends_with("\n") || src_.ends_with("\r")) {
      src_.remove_suffix(1);
    }
  }

  Result<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      size_t tag = FindTagStart(pos_);
      std::string text(src_.substr(pos_, tag == std::string_view::npos ? std::string_view::npos : tag - pos_));
      if (tag == std::string_view::npos) {
        Emit(TK::kText, std::move(text), line_);
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
      if (sign == '-') {
        // {%- / {{- / {#-: all whitespace before the tag goes.
        size_t end = text.size();
        while (end > 0 && IsSpaceByte(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: spaces and tabs from the start of the line up to a block or
        // comment tag go, when nothing else precedes the tag on its line.
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting_) && l_pos < text.size() &&
            std::all_of(text.begin() + static_cast<ptrdiff_t>(l_pos), text.end(), IsSpaceByte)) {
          text.resize(l_pos);
        }
      }
      int text_line = line_;
      line_ += static_cast<int>(
          std::count(src_.begin() + static_cast<ptrdiff_t>(pos_), src_.begin() + static_cast<ptrdiff_t>(tag), '\n'));
      Emit(TK::kText, std::move(text), text_line);
      pos_ = tag + 2 + (sign ? 1 : 0);
      Status st;
      if (kind == '#') {
        st = LexComment(tag);
      } else if (kind == '%') {
        st = LexBlock(tag);
      } else {
        st = LexTag(TK::kVarBegin, tag);
      }
      if (!st.ok()) return st;
    }
    tokens_.push_back(Token{TK::kEof, "", 0, 0, line_});
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string_view::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string_view::npos;
  }

  void Emit(TK kind, std::string text, int line) {
    if (kind == TK::kText && text.empty()) return;
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    t.line = line;
    tokens_.push_back(std::move(t));
  }

  // After a tag's closing delimiter: `-` strips all following whitespace, a block or
  // comment end (no `+`) drops one newline (trim_blocks).
  void AfterTagEnd(char sign, bool is_block) {
    size_t start = pos_;
    if (sign == '-') {
      while (pos_ < src_.size() && IsSpaceByte(src_[pos_])) ++pos_;
    } else if (sign != '+' && is_block) {
      if (src_.substr(pos_, 2) == "\r\n") {
        pos_ += 2;
      } else if (pos_ < src_.size() && src_[pos_] == '\n') {
        ++pos_;
      }
    }
    line_ += static_cast<int>(
        std::count(src_.begin() + static_cast<ptrdiff_t>(start), src_.begin() + static_cast<ptrdiff_t>(pos_), '\n'));
    line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
  }

  Status LexComment(size_t tag) {
    size_t end = src_.find("#}", pos_);
    if (end == std::string_view::npos) return SyntaxError(line_, "comment opened here is never closed with #}");
    char sign = 0;
    if (end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+')) sign = src_[end - 1];
    (void)tag;
    line_ += static_cast<int>(
        std::count(src_.begin() + static_cast<ptrdiff_t>(pos_), src_.begin() + static_cast<ptrdiff_t>(end), '\n'));
    pos_ = end + 2;
    AfterTagEnd(sign, true);
    return Status::Ok();
  }

  // {% raw %}...{% endraw %} is text; other blocks are tokenized.
  Status LexBlock(size_t tag) {
    size_t p = pos_;
    while (p < src_.size() && IsSpaceByte(src_[p])) ++p;
    if (src_.substr(p, 3) == "raw" && (p + 3 >= src_.size() || !IsNameChar(src_[p + 3]))) {
      size_t q = p + 3;
      while (q < src_.size() && IsSpaceByte(src_[q])) ++q;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      if (src_.substr(q, 2) == "%}") {
        line_ += static_cast<int>(
            std::count(src_.begin() + static_cast<ptrdiff_t>(pos_), src_.begin() + static_cast<ptrdiff_t>(q), '\n'));
        pos_ = q + 2;
        AfterTagEnd(sign, true);
        return LexRawBody(tag);
      }
    }
    return LexTag(TK::kBlockBegin, tag);
  }

  Status LexRawBody(size_t tag) {
    (void)tag;
    const int open_line = line_;
    for (size_t p = src_.find("{%", pos_); p != std::string_view::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char open_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) open_sign = src_[q++];
      while (q < src_.size() && IsSpaceByte(src_[q])) ++q;
      if (src_.substr(q, 6) != "endraw") continue;
      q += 6;
      while (q < src_.size() && IsSpaceByte(src_[q])) ++q;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      if (src_.substr(q, 2) != "%}") continue;
      std::string text(src_.substr(pos_, p - pos_));
      if (open_sign == '-') {
        while (!text.empty() && IsSpaceByte(text.back())) text.pop_back();
      }
      Emit(TK::kText, std::move(text), line_);
      line_ += static_cast<int>(
          std::count(src_.begin() + static_cast<ptrdiff_t>(pos_), src_.begin() + static_cast<ptrdiff_t>(q), '\n'));
      pos_ = q + 2;
      AfterTagEnd(sign, true);
      return Status::Ok();
    }
    return SyntaxError(open_line, "{% raw %} is never closed with {% endraw %}");
  }

  // Tokens of one {% ... %} or {{ ... }} tag, up to its closing delimiter.
  Status LexTag(TK begin, size_t tag) {
    const bool is_block = begin == TK::kBlockBegin;
    const int open_line = line_;
    (void)tag;
    Emit(begin, "", line_);
    tokens_.back().text = is_block ? "{%" : "{{";
    int depth = 0;  // open brackets: a closing delimiter inside them is not one
    while (true) {
      while (pos_ < src_.size() && IsSpaceByte(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        return SyntaxError(open_line, std::string("tag opened here is never closed with ") + (is_block ? "%}" : "}}"));
      }
      std::string_view rest = src_.substr(pos_);
      if (depth == 0) {
        const std::string_view close = is_block ? "%}" : "}}";
        char sign = 0;
        size_t len = 0;
        if (rest.starts_with(close)) {
          len = 2;
        } else if (rest.size() >= 3 && (rest[0] == '-' || (is_block && rest[0] == '+')) && rest.substr(1, 2) == close) {
          sign = rest[0];
          len = 3;
        }
        if (len) {
          Emit(is_block ? TK::kBlockEnd : TK::kVarEnd, std::string(close), line_);
          pos_ += len;
          AfterTagEnd(sign, is_block);
          return Status::Ok();
        }
      }
      const char c = rest[0];
      if (c == '\'' || c == '"') {
        DAISY_RETURN_IF_ERROR(LexString(c));
        continue;
      }
      if (IsDigit(c)) {
        DAISY_RETURN_IF_ERROR(LexNumber());
        continue;
      }
      if (IsNameStart(c)) {
        size_t n = 1;
        while (n < rest.size() && IsNameChar(rest[n])) ++n;
        Emit(TK::kName, std::string(rest.substr(0, n)), line_);
        pos_ += n;
        continue;
      }
      static constexpr std::string_view kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
      std::string op;
      for (std::string_view o : kOps2) {
        if (rest.starts_with(o)) op = std::string(o);
      }
      if (op.empty() && std::string_view("+-*/%~<>=()[]{},.:|").find(c) != std::string_view::npos)
        op = std::string(1, c);
      if (op.empty()) {
        std::string shown = (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
                                ? "byte " + std::to_string(static_cast<unsigned char>(c))
                                : "'" + std::string(1, c) + "'";
        return SyntaxError(line_, "unexpected character " + shown + " inside a tag");
      }
      if (op == "(" || op == "[" || op == "{") {
        if (++depth > kMaxNesting) return SyntaxError(line_, "brackets nested too deeply");
      } else if ((op == ")" || op == "]" || op == "}") && depth > 0) {
        --depth;
      }
      Emit(TK::kOp, op, line_);
      pos_ += op.size();
    }
  }

  // Python string literal semantics (unicode-escape): unknown escapes keep the backslash.
  Status LexString(char quote) {
    const int start_line = line_;
    std::string out;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size()) return SyntaxError(start_line, "string literal is never closed");
      char c = src_[p];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) return SyntaxError(start_line, "string literal is never closed");
      char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\n':
          ++line_;
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < n; ++k) {
            int h = p + static_cast<size_t>(k) < src_.size() ? HexValue(src_[p + static_cast<size_t>(k)]) : -1;
            if (h < 0) return SyntaxError(line_, std::string("truncated \\") + e + " escape in a string literal");
            cp = cp * 16 + static_cast<uint32_t>(h);
          }
          if (cp > 0x10FFFF) return SyntaxError(line_, "escape beyond U+10FFFF in a string literal");
          p += static_cast<size_t>(n);
          AppendUtf8(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(src_[p++] - '0');
            }
            AppendUtf8(out, cp);
          } else if (e == 'N') {
            return Unimplemented("unsupported Jinja construct: \\N{...} escape at line " + std::to_string(line_));
          } else {
            out += '\\';
            out += e;
            if (e == '\n') ++line_;
          }
      }
    }
    Emit(TK::kString, std::move(out), start_line);
    pos_ = p + 1;
    return Status::Ok();
  }

  Status LexNumber() {
    size_t p = pos_;
    auto digits = [&] {
      while (p < src_.size() && (IsDigit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && IsDigit(src_[p + 1]))))
        ++p;
    };
    digits();
    bool is_float = false;
    const bool after_dot = !tokens_.empty() && tokens_.back().kind == TK::kOp && tokens_.back().text == ".";
    if (!after_dot && p + 1 < src_.size() && src_[p] == '.' && IsDigit(src_[p + 1])) {
      is_float = true;
      ++p;
      digits();
    }
    if (!after_dot && p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && IsDigit(src_[q])) {
        is_float = true;
        p = q;
        digits();
      }
    }
    std::string text;
    for (size_t k = pos_; k < p; ++k) {
      if (src_[k] != '_') text += src_[k];
    }
    Token t;
    t.line = line_;
    t.text = text;
    if (is_float) {
      t.kind = TK::kFloat;
      auto r = std::from_chars(text.data(), text.data() + text.size(), t.f);
      if (r.ec != std::errc() || !std::isfinite(t.f)) return SyntaxError(line_, "bad number " + text);
    } else {
      t.kind = TK::kInt;
      auto r = std::from_chars(text.data(), text.data() + text.size(), t.i);
      if (r.ec != std::errc()) return SyntaxError(line_, "integer literal " + text + " is out of range");
    }
    tokens_.push_back(std::move(t));
    pos_ = p;
    return Status::Ok();
  }

  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

// ---- Parser ------------------------------------------------------------------------------

const std::set<std::string, std::less<>>& SupportedFilters() {
  static const std::set<std::string, std::less<>> kFilters = {
      "abs",        "capitalize", "count",  "d",          "default", "e",       "escape", "first",
      "float",      "indent",     "int",    "items",      "join",    "last",    "length", "list",
      "lower",      "map",        "reject", "rejectattr", "replace", "reverse", "safe",   "select",
      "selectattr", "sort",       "string", "title",      "tojson",  "trim",    "unique", "upper"};
  return kFilters;
}

const std::set<std::string, std::less<>>& SupportedTests() {
  static const std::set<std::string, std::less<>> kTests = {
      "boolean", "callable", "defined",   "divisibleby", "eq",          "equalto",  "even",   "false",
      "float",   "ge",       "gt",        "in",          "integer",     "iterable", "le",     "lower",
      "lt",      "mapping",  "ne",        "none",        "number",      "odd",      "sameas", "sequence",
      "string",  "true",     "undefined", "upper",       "greaterthan", "lessthan"};
  return kTests;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Result<std::unique_ptr<Program>> Run() {
    auto program = std::make_unique<Program>();
    std::string end;
    DAISY_RETURN_IF_ERROR(ParseBody(program->body, {}, &end, 0));
    return program;
  }

 private:
  const Token& Peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& Next() {
    const Token& t = Peek();
    if (i_ < t_.size() - 1) ++i_;
    return t;
  }
  bool IsOp(std::string_view op, size_t k = 0) const { return Peek(k).kind == TK::kOp && Peek(k).text == op; }
  bool IsName(std::string_view n, size_t k = 0) const { return Peek(k).kind == TK::kName && Peek(k).text == n; }
  bool AcceptOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool AcceptName(std::string_view n) {
    if (!IsName(n)) return false;
    Next();
    return true;
  }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case TK::kEof:
        return "end of template";
      case TK::kText:
        return "text";
      case TK::kBlockEnd:
        return "'%}'";
      case TK::kVarEnd:
        return "'}}'";
      case TK::kBlockBegin:
        return "'{%'";
      case TK::kVarBegin:
        return "'{{'";
      case TK::kString:
        return "a string";
      case TK::kInt:
      case TK::kFloat:
        return "number " + t.text;
      default:
        return "'" + t.text + "'";
    }
  }
  Status Unexpected(const std::string& expected) const {
    return SyntaxError(Peek().line, "expected " + expected + ", found " + Describe(Peek()));
  }
  Status ExpectOp(std::string_view op) {
    if (!AcceptOp(op)) return Unexpected("'" + std::string(op) + "'");
    return Status::Ok();
  }
  Status ExpectBlockEnd() {
    if (Peek().kind != TK::kBlockEnd) return Unexpected("'%}'");
    Next();
    return Status::Ok();
  }
  Result<std::string> ExpectName(const std::string& what) {
    if (Peek().kind != TK::kName) return Unexpected(what);
    return Next().text;
  }
  static Status Refuse(const std::string& what, int line) {
    return Unimplemented("unsupported Jinja construct: " + what + " at line " + std::to_string(line));
  }

  // Parses statements until one of `ends` (a block tag name) is found; leaves the parser
  // just after that tag's name and stores it in *end. An empty `ends` means top level.
  Status ParseBody(Body& body, const std::vector<std::string_view>& ends, std::string* end, int open_line) {
    if (++depth_ > kMaxNesting) return SyntaxError(Peek().line, "blocks nested too deeply");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    while (true) {
      const Token& t = Peek();
      switch (t.kind) {
        case TK::kEof:
          if (!ends.empty()) {
            return SyntaxError(open_line,
                               "block opened here is never closed with {% " + std::string(ends.back()) + " %}");
          }
          return Status::Ok();
        case TK::kText: {
          auto s = std::make_unique<Stmt>();
          s->kind = Stmt::Kind::kText;
          s->line = t.line;
          s->text = t.text;
          body.push_back(std::move(s));
          Next();
          break;
        }
        case TK::kVarBegin: {
          auto s = std::make_unique<Stmt>();
          s->kind = Stmt::Kind::kOutput;
          s->line = t.line;
          Next();
          DAISY_ASSIGN_OR_RETURN(s->expr, ParseExpression());
          if (Peek().kind != TK::kVarEnd) return Unexpected("'}}'");
          Next();
          body.push_back(std::move(s));
          break;
        }
        case TK::kBlockBegin: {
          Next();
          const Token& name = Peek();
          if (name.kind != TK::kName) return Unexpected("a tag name");
          for (std::string_view e : ends) {
            if (name.text == e) {
              *end = name.text;
              Next();
              return Status::Ok();
            }
          }
          DAISY_RETURN_IF_ERROR(ParseStatement(body));
          break;
        }
        default:
          return Unexpected("text or a tag");
      }
    }
  }

  Status ParseStatement(Body& body) {
    const Token& name = Next();
    const int line = name.line;
    const std::string tag = name.text;
    if (tag == "if") return ParseIf(body, line);
    if (tag == "for") return ParseFor(body, line);
    if (tag == "set") return ParseSet(body, line);
    if (tag == "macro") return ParseMacro(body, line);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return SyntaxError(line, "'" + tag + "' outside a for loop");
      auto s = std::make_unique<Stmt>();
      s->kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      s->line = line;
      DAISY_RETURN_IF_ERROR(ExpectBlockEnd());
      body.push_back(std::move(s));
      return Status::Ok();
    }
    if (tag == "generation") {
      // transformers' assistant-mask tag: renders its body unchanged.
      DAISY_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      DAISY_RETURN_IF_ERROR(ParseBody(body, {"endgeneration"}, &end, line));
      return ExpectBlockEnd();
    }
    static const std::set<std::string, std::less<>> kKnownTags = {
        "call", "filter", "include", "import", "from", "extends", "block", "with", "do", "autoescape", "trans"};
    if (kKnownTags.contains(tag)) return Refuse("tag '" + tag + "'", line);
    if (tag.starts_with("end") || tag == "elif" || tag == "else") {
      return SyntaxError(line, "unexpected '" + tag + "' with no open block to close");
    }
    return Refuse("tag '" + tag + "'", line);
  }

  Status ParseIf(Body& body, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::kIf;
    s->line = line;
    while (true) {
      DAISY_ASSIGN_OR_RETURN(auto cond, ParseExpression());
      DAISY_RETURN_IF_ERROR(ExpectBlockEnd());
      s->conds.push_back(std::move(cond));
      s->bodies.emplace_back();
      std::string end;
      DAISY_RETURN_IF_ERROR(ParseBody(s->bodies.back(), {"elif", "else", "endif"}, &end, line));
      if (end == "elif") continue;
      if (end == "else") {
        DAISY_RETURN_IF_ERROR(ExpectBlockEnd());
        s->bodies.emplace_back();
        DAISY_RETURN_IF_ERROR(ParseBody(s->bodies.back(), {"endif"}, &end, line));
      }
      break;
    }
    DAISY_RETURN_IF_ERROR(ExpectBlockEnd());
    body.push_back(std::move(s));
    return Status::Ok();
  }

  Status ParseTargets(std::vector<std::string>& targets) {
    const bool paren = AcceptOp("(");
    do {
      DAISY_ASSIGN_OR_RETURN(std::string n, ExpectName("a variable name"));
      targets.push_back(std::move(n));
    } while (AcceptOp(","));
    if (paren) DAISY_RETURN_IF_ERROR(ExpectOp(")"));
    return Status::Ok();
  }

  Status ParseFor(Body& body, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::kFor;
    s->line = line;
    DAISY_RETURN_IF_ERROR(ParseTargets(s->targets));
    if (!AcceptName("in")) return Unexpected("'in'");
    DAISY_ASSIGN_OR_RETURN(s->expr, ParseOr());  // no ternary: `if` here filters the loop
    if (AcceptName("if")) {
      DAISY_ASSIGN_OR_RETURN(s->cond, ParseExpression());
    }
    if (IsName("recursive")) return Refuse("recursive for loop", Peek().line);
    DAISY_RETURN_IF_ERROR(ExpectBlockEnd());
    s->bodies.emplace_back();
    std::string end;
    ++loop_depth_;
    Status st = ParseBody(s->bodies.back(), {"else", "endfor"}, &end, line);
    --loop_depth_;
    DAISY_RETURN_IF_ERROR(st);
    if (end == "else") {
      DAISY_RETURN_IF_ERROR(ExpectBlockEnd());
      s->bodies.emplace_back();
      DAISY_RETURN_IF_ERROR(ParseBody(s->bodies.back(), {"endfor"}, &end, line));
    }
    DAISY_RETURN_IF_ERROR(ExpectBlockEnd());
    body.push_back(std::move(s));
    return Status::Ok();
  }

  Status ParseSet(Body& body, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::kSet;
    s->line = line;
    DAISY_ASSIGN_OR_RETURN(std::string first, ExpectName("a variable name"));
    s->targets.push_back(first);
    if (AcceptOp(".")) {
      DAISY_ASSIGN_OR_RETURN(std::string attr, ExpectName("an attribute name"));
      s->targets.push_back(attr);
      s->attr_target = true;
    } else {
      while (AcceptOp(",")) {
        DAISY_ASSIGN_OR_RETURN(std::string n, ExpectName("a variable name"));
        s->targets.push_back(std::move(n));
      }
    }
    if (Peek().kind == TK::kBlockEnd && !s->attr_target && s->targets.size() == 1) {
      Next();
      s->kind = Stmt::Kind::kSetBlock;
      s->bodies.emplace_back();
      std::string end;
      DAISY_RETURN_IF_ERROR(ParseBody(s->bodies.back(), {"endset"}, &end, line));
      DAISY_RETURN_IF_ERROR(ExpectBlockEnd());
      body.push_back(std::move(s));
      return Status::Ok();
    }
    if (IsOp("|")) return Refuse("filtered block set", line);
    DAISY_RETURN_IF_ERROR(ExpectOp("="));
    DAISY_ASSIGN_OR_RETURN(s->expr, ParseTupleOrExpression());
    DAISY_RETURN_IF_ERROR(ExpectBlockEnd());
    body.push_back(std::move(s));
    return Status::Ok();
  }

  Status ParseMacro(Body& body, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::kMacro;
    s->line = line;
    DAISY_ASSIGN_OR_RETURN(s->text, ExpectName("a macro name"));
    DAISY_RETURN_IF_ERROR(ExpectOp("("));
    if (!AcceptOp(")")) {
      do {
        if (IsOp(")")) break;
        DAISY_ASSIGN_OR_RETURN(std::string p, ExpectName("a parameter name"));
        ExprPtr dflt;
        if (AcceptOp("=")) {
          DAISY_ASSIGN_OR_RETURN(dflt, ParseExpression());
        }
        s->params.emplace_back(std::move(p), std::move(dflt));
      } while (AcceptOp(","));
      DAISY_RETURN_IF_ERROR(ExpectOp(")"));
    }
    DAISY_RETURN_IF_ERROR(ExpectBlockEnd());
    s->bodies.emplace_back();
    std::string end;
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    Status st = ParseBody(s->bodies.back(), {"endmacro"}, &end, line);
    loop_depth_ = saved_loops;
    DAISY_RETURN_IF_ERROR(st);
    if (Peek().kind == TK::kName) Next();  // {% endmacro name %}
    DAISY_RETURN_IF_ERROR(ExpectBlockEnd());
    body.push_back(std::move(s));
    return Status::Ok();
  }

  // ---- Expressions (Jinja2 precedence, loosest first) ----

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Guards every recursive descent step.
  struct DepthGuard {
    int& d;
    explicit DepthGuard(int& depth) : d(++depth) {}
    ~DepthGuard() { --d; }
  };
  Status CheckDepth() const {
    if (expr_depth_ > kMaxNesting * 4) return SyntaxError(Peek().line, "expression nested too deeply");
    return Status::Ok();
  }

  // `a, b` as a list (set values); otherwise one expression.
  Result<ExprPtr> ParseTupleOrExpression() {
    const int line = Peek().line;
    DAISY_ASSIGN_OR_RETURN(ExprPtr first, ParseExpression());
    if (!IsOp(",")) return first;
    auto list = Make(Expr::Kind::kList, line);
    list->kids.push_back(std::move(first));
    while (AcceptOp(",")) {
      if (Peek().kind == TK::kBlockEnd) break;
      DAISY_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression());
      list->kids.push_back(std::move(e));
    }
    return list;
  }

  Result<ExprPtr> ParseExpression() {
    DepthGuard g(expr_depth_);
    DAISY_RETURN_IF_ERROR(CheckDepth());
    const int line = Peek().line;
    DAISY_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (AcceptName("if")) {
      auto t = Make(Expr::Kind::kTernary, line);
      DAISY_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr other;
      if (AcceptName("else")) {
        DAISY_ASSIGN_OR_RETURN(other, ParseExpression());
      }
      t->kids.push_back(std::move(e));
      t->kids.push_back(std::move(cond));
      t->kids.push_back(std::move(other));
      e = std::move(t);
    }
    return e;
  }

  Result<ExprPtr> ParseBinaryChain(std::initializer_list<std::string_view> names, bool ops_are_names,
                                   Result<ExprPtr> (Parser::*next)()) {
    DAISY_ASSIGN_OR_RETURN(ExprPtr left, (this->*next)());
    while (true) {
      std::string op;
      for (std::string_view n : names) {
        if (ops_are_names ? IsName(n) : IsOp(n)) op = std::string(n);
      }
      if (op.empty()) return left;
      const int line = Next().line;
      DAISY_ASSIGN_OR_RETURN(ExprPtr right, (this->*next)());
      auto b = Make(Expr::Kind::kBinary, line);
      b->name = op;
      b->kids.push_back(std::move(left));
      b->kids.push_back(std::move(right));
      left = std::move(b);
    }
  }

  Result<ExprPtr> ParseOr() { return ParseBinaryChain({"or"}, true, &Parser::ParseAnd); }
  Result<ExprPtr> ParseAnd() { return ParseBinaryChain({"and"}, true, &Parser::ParseNot); }

  Result<ExprPtr> ParseNot() {
    DepthGuard g(expr_depth_);
    DAISY_RETURN_IF_ERROR(CheckDepth());
    if (IsName("not")) {
      const int line = Next().line;
      auto u = Make(Expr::Kind::kUnary, line);
      u->name = "not";
      DAISY_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      u->kids.push_back(std::move(operand));
      return u;
    }
    return ParseCompare();
  }

  Result<ExprPtr> ParseCompare() {
    const int line = Peek().line;
    DAISY_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Peek().kind == TK::kOp && (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">="))) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(Expr::Kind::kCompare, line);
        cmp->kids.push_back(std::move(first));
      }
      DAISY_ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
      cmp->ops.push_back(op);
      cmp->kids.push_back(std::move(right));
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  Result<ExprPtr> ParseMath1() { return ParseBinaryChain({"+", "-"}, false, &Parser::ParseConcat); }
  Result<ExprPtr> ParseConcat() { return ParseBinaryChain({"~"}, false, &Parser::ParseMath2); }
  Result<ExprPtr> ParseMath2() { return ParseBinaryChain({"*", "/", "//", "%"}, false, &Parser::ParsePow); }
  Result<ExprPtr> ParsePow() { return ParseBinaryChain({"**"}, false, &Parser::ParseUnaryWithFilters); }
  Result<ExprPtr> ParseUnaryWithFilters() { return ParseUnary(true); }

  Result<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard g(expr_depth_);
    DAISY_RETURN_IF_ERROR(CheckDepth());
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token& t = Next();
      auto u = Make(Expr::Kind::kUnary, t.line);
      u->name = t.text;
      DAISY_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      u->kids.push_back(std::move(operand));
      node = std::move(u);
    } else {
      DAISY_ASSIGN_OR_RETURN(node, ParsePrimary());
      DAISY_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    }
    if (with_filter) return ParseFilterExpr(std::move(node));
    return node;
  }

  Result<ExprPtr> ParsePrimary() {
    DepthGuard g(expr_depth_);
    DAISY_RETURN_IF_ERROR(CheckDepth());
    const Token& t = Peek();
    const int line = t.line;
    switch (t.kind) {
      case TK::kName: {
        Next();
        auto e = Make(Expr::Kind::kLiteral, line);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case TK::kString: {
        std::string s;
        while (Peek().kind == TK::kString) s += Next().text;  // adjacent literals concatenate
        auto e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::Str(std::move(s));
        return e;
      }
      case TK::kInt: {
        auto e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::Int(Next().i);
        return e;
      }
      case TK::kFloat: {
        auto e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::Float(Next().f);
        return e;
      }
      case TK::kOp:
        if (AcceptOp("(")) {
          if (AcceptOp(")")) return Make(Expr::Kind::kList, line);  // ()
          DAISY_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression());
          if (IsOp(",")) {
            auto list = Make(Expr::Kind::kList, line);
            list->kids.push_back(std::move(e));
            while (AcceptOp(",")) {
              if (IsOp(")")) break;
              DAISY_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
              list->kids.push_back(std::move(item));
            }
            e = std::move(list);
          }
          DAISY_RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (AcceptOp("[")) {
          auto list = Make(Expr::Kind::kList, line);
          while (!IsOp("]")) {
            DAISY_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
            list->kids.push_back(std::move(item));
            if (!AcceptOp(",")) break;
          }
          DAISY_RETURN_IF_ERROR(ExpectOp("]"));
          return list;
        }
        if (AcceptOp("{")) {
          auto dict = Make(Expr::Kind::kDict, line);
          while (!IsOp("}")) {
            DAISY_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
            DAISY_RETURN_IF_ERROR(ExpectOp(":"));
            DAISY_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
            dict->kids.push_back(std::move(key));
            dict->kids.push_back(std::move(value));
            if (!AcceptOp(",")) break;
          }
          DAISY_RETURN_IF_ERROR(ExpectOp("}"));
          return dict;
        }
        [[fallthrough]];
      default:
        return Unexpected("an expression");
    }
  }

  Status ParseCallArgs(std::vector<ExprPtr>& args, std::vector<std::pair<std::string, ExprPtr>>& kwargs) {
    // After '('.
    while (!IsOp(")")) {
      if (IsOp("*") || IsOp("**")) return Refuse("*args / **kwargs in a call", Peek().line);
      if (Peek().kind == TK::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        Next();
        DAISY_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
        kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!kwargs.empty()) return SyntaxError(Peek().line, "positional argument after a keyword argument");
        DAISY_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
        args.push_back(std::move(v));
      }
      if (!AcceptOp(",")) break;
    }
    return ExpectOp(")");
  }

  Result<ExprPtr> ParsePostfix(ExprPtr node) {
    int chain = 0;
    while (true) {
      if (++chain > kMaxNesting * 4) return SyntaxError(Peek().line, "expression chain too long");
      const int line = Peek().line;
      if (AcceptOp(".")) {
        auto a = Make(Expr::Kind::kAttr, line);
        if (Peek().kind == TK::kName) {
          a->name = Next().text;
        } else if (Peek().kind == TK::kInt) {
          // foo.0 is foo[0]
          a->kind = Expr::Kind::kIndex;
          auto idx = Make(Expr::Kind::kLiteral, line);
          idx->literal = Value::Int(Next().i);
          a->kids.push_back(std::move(node));
          a->kids.push_back(std::move(idx));
          node = std::move(a);
          continue;
        } else {
          return Unexpected("an attribute name");
        }
        a->kids.push_back(std::move(node));
        node = std::move(a);
      } else if (AcceptOp("[")) {
        ExprPtr parts[3];
        bool is_slice = false;
        if (!IsOp(":")) {
          DAISY_ASSIGN_OR_RETURN(parts[0], ParseExpression());
        }
        if (AcceptOp(":")) {
          is_slice = true;
          if (!IsOp(":") && !IsOp("]")) {
            DAISY_ASSIGN_OR_RETURN(parts[1], ParseExpression());
          }
          if (AcceptOp(":") && !IsOp("]")) {
            DAISY_ASSIGN_OR_RETURN(parts[2], ParseExpression());
          }
        }
        DAISY_RETURN_IF_ERROR(ExpectOp("]"));
        if (!is_slice && !parts[0]) return SyntaxError(line, "empty subscript");
        auto s = Make(is_slice ? Expr::Kind::kSlice : Expr::Kind::kIndex, line);
        s->kids.push_back(std::move(node));
        s->kids.push_back(std::move(parts[0]));
        if (is_slice) {
          s->kids.push_back(std::move(parts[1]));
          s->kids.push_back(std::move(parts[2]));
        }
        node = std::move(s);
      } else if (AcceptOp("(")) {
        auto c = Make(Expr::Kind::kCall, line);
        c->kids.push_back(std::move(node));
        DAISY_RETURN_IF_ERROR(ParseCallArgs(c->args, c->kwargs));
        node = std::move(c);
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> ParseFilterExpr(ExprPtr node) {
    int chain = 0;
    while (true) {
      if (++chain > kMaxNesting * 4) return SyntaxError(Peek().line, "filter chain too long");
      if (AcceptOp("|")) {
        const int line = Peek().line;
        DAISY_ASSIGN_OR_RETURN(std::string name, ExpectName("a filter name"));
        if (!SupportedFilters().contains(name)) return Refuse("filter '" + name + "'", line);
        auto f = Make(Expr::Kind::kFilter, line);
        f->name = name;
        f->kids.push_back(std::move(node));
        if (AcceptOp("(")) DAISY_RETURN_IF_ERROR(ParseCallArgs(f->args, f->kwargs));
        node = std::move(f);
      } else if (IsName("is")) {
        const int line = Next().line;
        auto t = Make(Expr::Kind::kTest, line);
        t->negated = AcceptName("not");
        DAISY_ASSIGN_OR_RETURN(std::string name, ExpectName("a test name"));
        if (!SupportedTests().contains(name)) return Refuse("test '" + name + "'", line);
        t->name = name;
        t->kids.push_back(std::move(node));
        if (AcceptOp("(")) {
          DAISY_RETURN_IF_ERROR(ParseCallArgs(t->args, t->kwargs));
        } else {
          const Token& a = Peek();
          const bool arg_follows = (a.kind == TK::kName && a.text != "else" && a.text != "or" && a.text != "and") ||
                                   a.kind == TK::kString || a.kind == TK::kInt || a.kind == TK::kFloat || IsOp("[") ||
                                   IsOp("{");
          if (arg_follows) {
            DAISY_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
            DAISY_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
            t->args.push_back(std::move(arg));
          }
        }
        node = std::move(t);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int expr_depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Result<std::unique_ptr<Program>> Parse(std::string_view source) {
  Lexer lexer(source);
  DAISY_ASSIGN_OR_RETURN(std::vector<Token> tokens, lexer.Run());
  Parser parser(std::move(tokens));
  return parser.Run();
}

}  // namespace daisy::jinja
