// UTF-8 and Unicode character-class helpers shared by the tokenizer stages. Each predicate
// names the Rust function whose behaviour it reproduces. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace daisy::tok {

// Decodes the code point at s[i] and advances i. The input must be valid UTF-8 (every
// string inside the pipeline is: Encode() sanitises its input first).
inline uint32_t NextCodePoint(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  uint32_t c = p[i];
  if (c < 0x80) {
    i += 1;
    return c;
  }
  if (c < 0xE0) {
    uint32_t cp = ((c & 0x1F) << 6) | (p[i + 1] & 0x3F);
    i += 2;
    return cp;
  }
  if (c < 0xF0) {
    uint32_t cp = ((c & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
    i += 3;
    return cp;
  }
  uint32_t cp = ((c & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
  i += 4;
  return cp;
}

// Byte length of the UTF-8 sequence that starts with lead byte b (valid UTF-8 only).
inline size_t Utf8Len(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

void AppendUtf8(std::string& out, uint32_t cp);

// True if s is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Rust's String::from_utf8_lossy: every maximal ill-formed subsequence becomes U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

// Code point ranges of a Unicode general category or property, from tables generated from a
// recent ICU (unicode_tables.inc; gen_unicode_tables.js), so that \p{L}, \p{N} and
// is_numeric follow the Unicode version of the reference libraries rather than the older
// tables of Debian's PCRE2 and utf8proc. Names: L Lu Ll Lt Lm Lo M Mn Mc Me N Nd Nl No P Pc S
// Z Alphabetic White_Space. Empty for other names.
struct CodeRange {
  uint32_t lo, hi;
};
std::span<const CodeRange> PropertyRanges(std::string_view name);
bool InRanges(std::span<const CodeRange> ranges, uint32_t cp);
// The Unicode version of those tables ("17.0").
std::string_view UnicodeTablesVersion();

// Rust char::is_whitespace (the Unicode White_Space property).
bool IsWhitespace(uint32_t cp);
// Rust char::is_numeric: '0'..='9', or above U+007F with general category Nd, Nl or No.
bool IsNumeric(uint32_t cp);
// A \w character (single_word added tokens): Alphabetic, marks, Nd, Pc, ZWNJ/ZWJ.
bool IsWordChar(uint32_t cp);

// Rust char::to_lowercase appended to out (one or more code points).
void AppendLowercase(std::string& out, uint32_t cp);

}  // namespace daisy::tok
