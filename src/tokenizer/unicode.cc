#include "unicode.h"

#include <algorithm>
#include <iterator>

namespace daisy::tok {

namespace {
struct NamedRanges {
  std::string_view name;
  std::span<const CodeRange> ranges;
};
struct LowerMapping {
  uint32_t cp, lower, lower2;  // lower2 = 0 when the mapping is one code point
};
#include "unicode_tables.inc"
}  // namespace

std::span<const CodeRange> PropertyRanges(std::string_view name) {
  for (const auto& n : kNamedRanges) {
    if (n.name == name) return n.ranges;
  }
  return {};
}

bool InRanges(std::span<const CodeRange> ranges, uint32_t cp) {
  size_t lo = 0, hi = ranges.size();
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (ranges[mid].hi < cp) {
      lo = mid + 1;
    } else if (ranges[mid].lo > cp) {
      hi = mid;
    } else {
      return true;
    }
  }
  return false;
}

std::string_view UnicodeTablesVersion() {
  return kTablesUnicodeVersion;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Length of the well-formed sequence at p[i..n), or 0 with *bad set to the length of the
// maximal ill-formed prefix (at least 1), following the Unicode table "Well-Formed UTF-8
// Byte Sequences" (the same rule Rust's from_utf8_lossy uses).
size_t ValidSequenceAt(const unsigned char* p, size_t i, size_t n, size_t* bad) {
  unsigned char b = p[i];
  if (b < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
    need = 2;
  } else if (b == 0xED) {
    need = 2, hi = 0x9F;
  } else if (b == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b >= 0xF1 && b <= 0xF3) {
    need = 3;
  } else if (b == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    *bad = 1;
    return 0;
  }
  size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= n) break;
    unsigned char c = p[i + k];
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) break;
  }
  if (k == need + 1) return need + 1;
  *bad = k;  // the lead byte plus the continuation bytes that were acceptable so far
  return 0;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  for (size_t i = 0; i < n;) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t bad = 0;
    size_t len = ValidSequenceAt(p, i, n, &bad);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string Utf8Lossy(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  std::string out;
  out.reserve(n + 8);
  for (size_t i = 0; i < n;) {
    size_t bad = 0;
    size_t len = ValidSequenceAt(p, i, n, &bad);
    if (len > 0) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

bool IsWhitespace(uint32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool IsNumeric(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  static const auto kNumeric = PropertyRanges("N");
  return InRanges(kNumeric, c);
}

bool IsWordChar(uint32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;
  static const auto kAlphabetic = PropertyRanges("Alphabetic"), kMark = PropertyRanges("M"),
                    kDecimal = PropertyRanges("Nd"), kConnector = PropertyRanges("Pc");
  return InRanges(kAlphabetic, c) || InRanges(kMark, c) || InRanges(kDecimal, c) || InRanges(kConnector, c);
}

void AppendLowercase(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
    return;
  }
  auto it = std::lower_bound(std::begin(kLowercase), std::end(kLowercase), c,
                             [](const LowerMapping& m, uint32_t v) { return m.cp < v; });
  if (it == std::end(kLowercase) || it->cp != c) {
    AppendUtf8(out, c);
    return;
  }
  AppendUtf8(out, it->lower);
  if (it->lower2) AppendUtf8(out, it->lower2);
}

}  // namespace daisy::tok
