#include "regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdio>
#include <map>
#include <span>
#include <vector>

#include "unicode.h"

namespace daisy::tok {

namespace {

// Oniguruma's \s for Unicode subjects: the White_Space property (as class items).
constexpr std::string_view kSpaceItems =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
constexpr std::string_view kHexItems = "0-9a-fA-F";

void AppendRangeItems(std::string& out, std::span<const CodeRange> ranges) {
  char buf[40];
  for (const auto& r : ranges) {
    if (r.lo == r.hi) {
      std::snprintf(buf, sizeof buf, "\\x{%X}", r.lo);
    } else {
      std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", r.lo, r.hi);
    }
    out += buf;
  }
}

// Class items of a property from the generated tables, "" if the name is not one of them.
// Names follow Oniguruma: case, spaces, '_' and '-' are ignored; long names are accepted.
const std::string& PropertyItems(std::string_view raw_name) {
  static const std::string kNone;
  static const auto* items_by_name = [] {
    auto* m = new std::map<std::string, std::string>();
    const std::pair<const char*, std::vector<const char*>> aliases_by_table[] = {
        {"L", {"l", "letter"}},
        {"Lu", {"lu", "uppercaseletter"}},
        {"Ll", {"ll", "lowercaseletter"}},
        {"Lt", {"lt", "titlecaseletter"}},
        {"Lm", {"lm", "modifierletter"}},
        {"Lo", {"lo", "otherletter"}},
        {"M", {"m", "mark", "combiningmark"}},
        {"Mn", {"mn", "nonspacingmark"}},
        {"Mc", {"mc", "spacingmark"}},
        {"Me", {"me", "enclosingmark"}},
        {"N", {"n", "number"}},
        {"Nd", {"nd", "decimalnumber", "digit"}},
        {"Nl", {"nl", "letternumber"}},
        {"No", {"no", "othernumber"}},
        {"P", {"p", "punctuation", "punct"}},
        {"Pc", {"pc", "connectorpunctuation"}},
        {"S", {"s", "symbol"}},
        {"Z", {"z", "separator"}},
        {"Alphabetic", {"alphabetic", "alpha"}},
        {"White_Space", {"whitespace", "space"}},
    };
    for (const auto& [table, aliases] : aliases_by_table) {
      std::string items;
      AppendRangeItems(items, PropertyRanges(table));
      for (const char* a : aliases) (*m)[a] = items;
    }
    return m;
  }();
  std::string key;
  for (char c : raw_name) {
    if (c == ' ' || c == '_' || c == '-') continue;
    key.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
  }
  auto it = items_by_name->find(key);
  return it == items_by_name->end() ? kNone : it->second;
}

// Oniguruma's \w for Unicode subjects: Alphabetic, Mark, Decimal_Number,
// Connector_Punctuation, Join_Control.
const std::string& WordItems() {
  static const std::string kWordItems = [] {
    std::string s;
    for (const char* t : {"Alphabetic", "M", "Nd", "Pc"}) AppendRangeItems(s, PropertyRanges(t));
    return s + "\\x{200C}\\x{200D}";
  }();
  return kWordItems;
}

struct JitStack {
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* ctx = nullptr;
  JitStack() {
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    if (stack && ctx) pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~JitStack() {
    if (ctx) pcre2_match_context_free(ctx);
    if (stack) pcre2_jit_stack_free(stack);
  }
};

pcre2_match_context* ThreadMatchContext() {
  thread_local JitStack js;
  return js.ctx;
}

}  // namespace

Result<std::string> TranslateOnigPattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  int class_depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) return InvalidArgument("regex ends with a lone backslash: " + std::string(p));
      const size_t esc_start = i;
      char e = p[++i];
      std::string_view items;
      bool negate = false;
      switch (e) {
        case 's':
          items = kSpaceItems;
          break;
        case 'S':
          items = kSpaceItems, negate = true;
          break;
        case 'w':
          items = WordItems();
          break;
        case 'W':
          items = WordItems(), negate = true;
          break;
        case 'd':
          items = PropertyItems("Nd");
          break;
        case 'D':
          items = PropertyItems("Nd"), negate = true;
          break;
        case 'h':
          items = kHexItems;
          break;
        case 'H':
          items = kHexItems, negate = true;
          break;
        case 'p':
        case 'P': {
          negate = e == 'P';
          std::string_view name;
          if (i + 1 < p.size() && p[i + 1] == '{') {
            size_t close = p.find('}', i + 2);
            if (close == std::string_view::npos)
              return InvalidArgument("unterminated \\p{ in regex: " + std::string(p));
            name = p.substr(i + 2, close - i - 2);
            i = close;
          } else if (i + 1 < p.size()) {
            name = p.substr(++i, 1);
          } else {
            return InvalidArgument("regex ends with \\p: " + std::string(p));
          }
          if (!name.empty() && name[0] == '^') {
            negate = !negate;
            name.remove_prefix(1);
          }
          items = PropertyItems(name);
          if (items.empty()) {  // not in the tables: left to PCRE2's own Unicode data
            out.append(p.substr(esc_start, i + 1 - esc_start));
            continue;
          }
          break;
        }
        default:
          break;
      }
      if (items.empty()) {
        out.push_back('\\');
        out.push_back(e);
        continue;
      }
      if (class_depth > 0) {
        if (negate) {
          return Unimplemented("regex uses a negated class escape (\\" + std::string(1, e) +
                               ") inside a character class, which is not supported: " + std::string(p));
        }
        out.append(items);
      } else {
        out.append(negate ? "[^" : "[");
        out.append(items);
        out.push_back(']');
      }
      continue;
    }
    if (class_depth > 0) {
      if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {  // POSIX bracket [:alpha:]
          size_t close = p.find(":]", i + 2);
          if (close == std::string_view::npos)
            return InvalidArgument("unterminated POSIX class in regex: " + std::string(p));
          out.append(p.substr(i, close + 2 - i));
          i = close + 1;
          continue;
        }
        return Unimplemented("regex uses a nested character class, which is not supported: " + std::string(p));
      }
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        return Unimplemented("regex uses class intersection (&&), which is not supported: " + std::string(p));
      }
      if (c == ']') --class_depth;
      out.push_back(c);
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out.push_back(c);
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') {  // a leading ']' is literal
        out.append("\\]");
        ++i;
      }
      continue;
    }
    out.push_back(c);
  }
  if (class_depth != 0) return InvalidArgument("unterminated character class in regex: " + std::string(p));
  return out;
}

Result<std::unique_ptr<Regex>> Regex::Compile(std::string_view onig_pattern) {
  DAISY_ASSIGN_OR_RETURN(std::string translated, TranslateOnigPattern(onig_pattern));
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return InvalidArgument("cannot compile tokenizer regex '" + std::string(onig_pattern) + "' at offset " +
                           std::to_string(err_off) + ": " + reinterpret_cast<const char*>(buf));
  }
  std::unique_ptr<Regex> re(new Regex());
  re->pattern_ = std::string(onig_pattern);
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

Regex::~Regex() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Status Regex::FindAll(std::string_view text, std::vector<Span>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  if (!md) return Internal("out of memory creating regex match data");
  pcre2_match_context* ctx = ThreadMatchContext();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  bool have_last = false;
  size_t last_end = 0;
  Status status;
  while (pos <= n) {
    int rc;
    if (jit_) {
      rc = pcre2_jit_match(code, subject, n, pos, 0, md, ctx);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        rc = pcre2_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      }
    } else {
      rc = pcre2_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof(buf));
      status = Internal("tokenizer regex '" + pattern_ + "' failed: " + reinterpret_cast<const char*>(buf));
      break;
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t s = ov[0], e = ov[1];
    if (s == e && have_last && last_end == e) {
      // onig's find_iter: no empty match right after the previous match; step one char.
      if (pos >= n) break;
      pos += Utf8Len(static_cast<unsigned char>(text[pos]));
      continue;
    }
    out.emplace_back(s, e);
    have_last = true;
    last_end = e;
    // An empty match searches again from e; the rule above then steps past it.
    pos = e;
  }
  pcre2_match_data_free(md);
  return status;
}

}  // namespace daisy::tok
