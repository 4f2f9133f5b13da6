// JSON mode (see daisy/json_mode.h): the recognizer, the token table and the logit mask.
#include "daisy/json_mode.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "daisy/status.h"
#include "daisy/tokenizer.h"

namespace daisy {

namespace {

constexpr const char* kLiterals[3] = {"true", "false", "null"};

bool IsWhitespace(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool IsDigit(uint8_t c) {
  return c >= '0' && c <= '9';
}
int HexValue(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Every byte NextClosingByte can return (the trie's alphabet).
constexpr std::string_view kClosingAlphabet =
    "{}]\":n0\\udctruefalsl"
    "\x80\x90\xA0";

}  // namespace

// ---------------------------------------------------------------------------------------
// JsonPrefix

bool JsonPrefix::Feed(std::string_view bytes) {
  JsonPrefix next = *this;
  for (char ch : bytes) {
    if (!next.Step(static_cast<uint8_t>(ch))) return false;
  }
  *this = next;
  return true;
}

JsonPrefix::Expect JsonPrefix::AfterValue() const {
  return (objects_ >> (depth_ - 1)) & 1 ? Expect::kObjCommaOrEnd : Expect::kArrCommaOrEnd;
}

bool JsonPrefix::Push(bool object) {
  if (depth_ >= kMaxDepth) return false;
  if (object) {
    objects_ |= uint64_t{1} << depth_;
  } else {
    objects_ &= ~(uint64_t{1} << depth_);
  }
  ++depth_;
  expect_ = object ? Expect::kObjKeyOrEnd : Expect::kArrValueOrEnd;
  return true;
}

void JsonPrefix::Pop() {
  --depth_;
  expect_ = depth_ == 0 ? Expect::kDone : AfterValue();
}

// A string, number or literal starts: what follows it is known now.
void JsonPrefix::StartScalar(Lex lex) {
  lex_ = lex;
  expect_ = AfterValue();
}

bool JsonPrefix::StartValue(uint8_t c) {
  switch (c) {
    case '{':
      return Push(true);
    case '[':
      return Push(false);
    case '"':
      StartScalar(Lex::kString);
      str_ = Str::kChars;
      return true;
    case '-':
      StartScalar(Lex::kNumber);
      num_ = Num::kMinus;
      count_ = 0;
      exp_digits_ = 0;
      return true;
    case 't':
    case 'f':
    case 'n':
      StartScalar(Lex::kLiteral);
      literal_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
      count_ = 1;
      return true;
    default:
      if (!IsDigit(c)) return false;
      StartScalar(Lex::kNumber);
      num_ = c == '0' ? Num::kZero : Num::kInt;
      count_ = 1;
      exp_digits_ = 0;
      return true;
  }
}

bool JsonPrefix::StringByte(uint8_t c) {
  switch (str_) {
    case Str::kChars:
      if (c == '"') {
        lex_ = Lex::kNone;  // expect_ was set when the string started
        return true;
      }
      if (c == '\\') {
        str_ = Str::kEscape;
        return true;
      }
      if (c < 0x20) return false;  // raw control characters are not allowed in strings
      if (c < 0x80) return true;
      // a UTF-8 lead byte (Unicode Table 3-7, well-formed sequences only)
      utf8_lo_ = 0x80;
      utf8_hi_ = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        utf8_left_ = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        utf8_left_ = 2;
        if (c == 0xE0) utf8_lo_ = 0xA0;  // no overlong forms
        if (c == 0xED) utf8_hi_ = 0x9F;  // no surrogates
      } else if (c >= 0xF0 && c <= 0xF4) {
        utf8_left_ = 3;
        if (c == 0xF0) utf8_lo_ = 0x90;
        if (c == 0xF4) utf8_hi_ = 0x8F;  // nothing above U+10FFFF
      } else {
        return false;  // a continuation byte without a lead, C0, C1, F5..FF
      }
      str_ = Str::kUtf8;
      return true;
    case Str::kUtf8:
      if (c < utf8_lo_ || c > utf8_hi_) return false;
      utf8_lo_ = 0x80;
      utf8_hi_ = 0xBF;
      if (--utf8_left_ == 0) str_ = Str::kChars;
      return true;
    case Str::kEscape:
      if (c == 'u') {
        str_ = Str::kHex;
        count_ = 0;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
        str_ = Str::kChars;
        return true;
      }
      return false;
    case Str::kHex: {
      const int v = HexValue(c);
      if (v < 0) return false;
      if (count_ == 0) hex_first_ = static_cast<uint8_t>(v);
      if (count_ == 1) {
        high_ = hex_first_ == 0xD && v >= 0x8 && v <= 0xB;
        if (hex_first_ == 0xD && v >= 0xC) return false;  // a low surrogate without a high one
      }
      if (++count_ == 4) str_ = high_ ? Str::kLowBackslash : Str::kChars;
      return true;
    }
    case Str::kLowBackslash:
      if (c != '\\') return false;
      str_ = Str::kLowU;
      return true;
    case Str::kLowU:
      if (c != 'u') return false;
      str_ = Str::kLowHex;
      count_ = 0;
      return true;
    case Str::kLowHex: {
      const int v = HexValue(c);
      if (v < 0) return false;
      if (count_ == 0 && v != 0xD) return false;  // DC00..DFFF only
      if (count_ == 1 && v < 0xC) return false;
      if (++count_ == 4) str_ = Str::kChars;
      return true;
    }
  }
  return false;
}

bool JsonPrefix::StructuralByte(uint8_t c) {
  if (IsWhitespace(c)) {
    if (ws_run_ >= kMaxWhitespaceRun || (c == '\n' && ws_breaks_ >= kMaxLineBreaks)) return false;
    ++ws_run_;
    ws_breaks_ += c == '\n';
    return true;
  }
  ws_run_ = 0;
  ws_breaks_ = 0;
  switch (expect_) {
    case Expect::kStart:
      return c == '{' && Push(true);
    case Expect::kObjKeyOrEnd:
      if (c == '}') {
        Pop();
        return true;
      }
      [[fallthrough]];
    case Expect::kObjKey:
      if (c != '"') return false;
      lex_ = Lex::kString;  // a key
      str_ = Str::kChars;
      expect_ = Expect::kObjColon;
      return true;
    case Expect::kObjColon:
      if (c != ':') return false;
      expect_ = Expect::kObjValue;
      return true;
    case Expect::kArrValueOrEnd:
      if (c == ']') {
        Pop();
        return true;
      }
      return StartValue(c);
    case Expect::kObjValue:
    case Expect::kArrValue:
      return StartValue(c);
    case Expect::kObjCommaOrEnd:
      if (c == ',') {
        expect_ = Expect::kObjKey;
        return true;
      }
      if (c != '}') return false;
      Pop();
      return true;
    case Expect::kArrCommaOrEnd:
      if (c == ',') {
        expect_ = Expect::kArrValue;
        return true;
      }
      if (c != ']') return false;
      Pop();
      return true;
    case Expect::kDone:
      return false;
  }
  return false;
}

bool JsonPrefix::Step(uint8_t c) {
  switch (lex_) {
    case Lex::kString:
      return StringByte(c);
    case Lex::kLiteral: {
      const char* lit = kLiterals[literal_];
      if (c != static_cast<uint8_t>(lit[count_])) return false;
      if (lit[++count_] == '\0') lex_ = Lex::kNone;
      return true;
    }
    case Lex::kNumber: {
      const bool digit = IsDigit(c);
      const bool exp = c == 'e' || c == 'E';
      switch (num_) {
        case Num::kMinus:
          if (!digit) return false;
          num_ = c == '0' ? Num::kZero : Num::kInt;
          count_ = 1;
          return true;
        case Num::kZero:
        case Num::kInt:
        case Num::kFrac:
          if (digit && num_ != Num::kZero) {
            if (count_ >= kMaxNumberDigits) return false;
            ++count_;
            return true;
          }
          if (c == '.' && num_ != Num::kFrac) {
            if (count_ >= kMaxNumberDigits) return false;  // no room for a fraction digit
            num_ = Num::kDot;
            return true;
          }
          if (exp) {
            num_ = Num::kExp;
            return true;
          }
          break;  // the number ended; c is structural
        case Num::kDot:
          if (!digit) return false;
          num_ = Num::kFrac;
          ++count_;
          return true;
        case Num::kExp:
          if (c == '+' || c == '-') {
            num_ = Num::kExpSign;
            return true;
          }
          [[fallthrough]];
        case Num::kExpSign:
          if (!digit) return false;
          num_ = Num::kExpDigits;
          exp_digits_ = 1;
          return true;
        case Num::kExpDigits:
          if (digit) {
            if (exp_digits_ >= kMaxExponentDigits) return false;
            ++exp_digits_;
            return true;
          }
          break;  // the number ended
      }
      lex_ = Lex::kNone;
      return StructuralByte(c);
    }
    case Lex::kNone:
      return StructuralByte(c);
  }
  return false;
}

uint8_t JsonPrefix::NextClosingByte() const {
  switch (lex_) {
    case Lex::kString:
      switch (str_) {
        case Str::kChars:
          return '"';
        case Str::kEscape:
          return 'n';
        case Str::kHex:
          return '0';  // 0 never makes a surrogate at any position
        case Str::kUtf8:
          return utf8_lo_;
        case Str::kLowBackslash:
          return '\\';
        case Str::kLowU:
          return 'u';
        case Str::kLowHex:
          return count_ == 0 ? 'd' : count_ == 1 ? 'c' : '0';
      }
      break;
    case Lex::kLiteral:
      return static_cast<uint8_t>(kLiterals[literal_][count_]);
    case Lex::kNumber:
      if (num_ == Num::kMinus || num_ == Num::kDot || num_ == Num::kExp || num_ == Num::kExpSign) return '0';
      break;  // a complete number: close what contains it
    case Lex::kNone:
      break;
  }
  switch (expect_) {
    case Expect::kStart:
      return '{';
    case Expect::kObjKeyOrEnd:
    case Expect::kObjCommaOrEnd:
      return '}';
    case Expect::kObjKey:
      return '"';
    case Expect::kObjColon:
      return ':';
    case Expect::kObjValue:
    case Expect::kArrValue:
      return 'n';  // null
    case Expect::kArrValueOrEnd:
    case Expect::kArrCommaOrEnd:
      return ']';
    case Expect::kDone:
      break;
  }
  return 0;
}

std::string JsonPrefix::ClosingSuffix() const {
  std::string out;
  JsonPrefix s = *this;
  while (!s.complete()) {
    const uint8_t c = s.NextClosingByte();
    DAISY_CHECK(c != 0 && s.Step(c), "Bug: the JSON closing byte was refused");
    out.push_back(static_cast<char>(c));
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// JsonTokenTable

namespace {

// The GPT-2 byte-level alphabet, reversed: code point -> byte (-1 outside it).
int ByteLevelByte(uint32_t cp) {
  if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) {
    return static_cast<int>(cp);
  }
  if (cp < 0x100 || cp >= 0x100 + 68) return -1;
  int n = 0;  // the bytes outside the printable ranges, in order, map to U+0100...
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) continue;
    if (static_cast<uint32_t>(0x100 + n) == cp) return b;
    ++n;
  }
  return -1;
}

// The next code point of `s` at byte i (advancing i); nullopt on malformed UTF-8.
std::optional<uint32_t> NextCodePoint(std::string_view s, size_t& i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  const size_t n = b0 < 0x80 ? 0 : b0 >= 0xF0 ? 3 : b0 >= 0xE0 ? 2 : b0 >= 0xC0 ? 1 : 4;
  if (n == 4 || i + n >= s.size()) return std::nullopt;  // a stray continuation byte, or cut short
  uint32_t cp = n == 0 ? b0 : b0 & (0x3Fu >> n);
  for (size_t k = 1; k <= n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3Fu);
  i += n + 1;
  return cp;
}

// The raw bytes of a piece whose decoded text lost some (a lone byte of a character):
// "<0xXX>" byte fallback, or a piece spelled in the GPT-2 byte-level alphabet.
std::optional<std::string> RawPieceBytes(std::string_view piece) {
  if (piece.size() == 6 && piece.substr(0, 3) == "<0x" && piece[5] == '>') {
    const int hi = HexValue(static_cast<uint8_t>(piece[3])), lo = HexValue(static_cast<uint8_t>(piece[4]));
    if (hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
  }
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    const std::optional<uint32_t> cp = NextCodePoint(piece, i);
    if (!cp) return std::nullopt;
    const int b = ByteLevelByte(*cp);
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
  }
  return out;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

JsonTokenTable::JsonTokenTable(const Tokenizer& tokenizer) {
  const int32_t vocab = tokenizer.vocab_size();
  // The prefix token: a plain "a" that decodes to itself (else any such one-letter token).
  std::optional<int32_t> prefix;
  auto plain = [&](int32_t id) {
    const std::string piece = tokenizer.IdToPiece(id);
    return !tokenizer.IsSpecial(id) && piece.size() == 1 && piece[0] >= 'a' && piece[0] <= 'z' &&
           tokenizer.Decode(std::span<const int32_t>(&id, 1), false, false) == piece;
  };
  if (std::optional<int32_t> a = tokenizer.TokenToId("a"); a && plain(*a)) prefix = a;
  for (int32_t id = 0; !prefix && id < vocab; ++id) {
    if (plain(id)) prefix = id;
  }
  std::string prefix_text;
  if (prefix) prefix_text = tokenizer.Decode(std::span<const int32_t>(&*prefix, 1), false, false);

  offsets_.reserve(static_cast<size_t>(vocab) + 1);
  offsets_.push_back(0);
  for (int32_t id = 0; id < vocab; ++id) {
    std::string text;
    const std::string piece = tokenizer.IdToPiece(id);
    if (!piece.empty() && !tokenizer.IsSpecial(id)) {
      bool done = false;
      if (prefix) {
        const int32_t pair[2] = {*prefix, id};
        std::string both = tokenizer.Decode(pair, false, false);
        if (both.compare(0, prefix_text.size(), prefix_text) == 0) {
          text = both.substr(prefix_text.size());
          done = true;
        }
      }
      if (!done) text = tokenizer.Decode(std::span<const int32_t>(&id, 1), false, false);
      if (text.find(kReplacement) != std::string::npos && piece.find(kReplacement) == std::string::npos) {
        if (std::optional<std::string> raw = RawPieceBytes(piece)) text = std::move(*raw);
      }
    }
    if (!text.empty()) usable_.push_back(id);
    blob_ += text;
    offsets_.push_back(static_cast<uint32_t>(blob_.size()));
  }

  // The trie of tokens that can spell part of a closing suffix.
  symbol_.fill(-1);
  for (char c : kClosingAlphabet) {
    if (symbol_[static_cast<uint8_t>(c)] < 0) symbol_[static_cast<uint8_t>(c)] = static_cast<int8_t>(n_symbols_++);
  }
  trie_.assign(static_cast<size_t>(n_symbols_), 0);  // node 0: the root
  terminal_.assign(1, false);
  for (int32_t id : usable_) {
    const std::string_view b = bytes(id);
    if (b.size() == 1) single_[static_cast<uint8_t>(b[0])] = true;
    if (b.size() > 16) continue;
    bool in_alphabet = true;
    for (char c : b) in_alphabet = in_alphabet && symbol_[static_cast<uint8_t>(c)] >= 0;
    if (!in_alphabet) continue;
    size_t node = 0;
    for (char c : b) {
      const size_t slot =
          node * static_cast<size_t>(n_symbols_) + static_cast<size_t>(symbol_[static_cast<uint8_t>(c)]);
      if (trie_[slot] == 0) {
        trie_[slot] = static_cast<int32_t>(terminal_.size());
        terminal_.push_back(false);
        trie_.resize(trie_.size() + static_cast<size_t>(n_symbols_), 0);
      }
      node = static_cast<size_t>(trie_[slot]);
    }
    terminal_[node] = true;
  }
}

std::string_view JsonTokenTable::bytes(int32_t id) const {
  if (id < 0 || id >= size()) return {};
  return std::string_view(blob_).substr(offsets_[static_cast<size_t>(id)],
                                        offsets_[static_cast<size_t>(id) + 1] - offsets_[static_cast<size_t>(id)]);
}

bool JsonTokenTable::EachByteIsAToken(std::string_view text) const {
  for (char c : text) {
    if (!single_[static_cast<uint8_t>(c)]) return false;
  }
  return true;
}

int JsonTokenTable::TokensFor(std::string_view text) const {
  // dp[i]: the fewest tokens for text[i..]; tokens are matched by walking the trie.
  const size_t m = text.size();
  std::vector<int> dp(m + 1, kUnreachable);
  dp[m] = 0;
  for (size_t i = m; i-- > 0;) {
    size_t node = 0;
    for (size_t j = i; j < m && j - i < 16; ++j) {
      // NOLINTNEXTLINE(bugprone-signed-char-misuse): symbol_ holds numbers, -1 for a byte outside the alphabet
      const int sym = symbol_[static_cast<uint8_t>(text[j])];
      if (sym < 0) break;
      const int32_t next = trie_[node * static_cast<size_t>(n_symbols_) + static_cast<size_t>(sym)];
      if (next == 0) break;
      node = static_cast<size_t>(next);
      if (terminal_[node] && dp[j + 1] < kUnreachable) dp[i] = std::min(dp[i], dp[j + 1] + 1);
    }
  }
  return dp[0];
}

// ---------------------------------------------------------------------------------------
// JsonMode

JsonMode::JsonMode(const Tokenizer& tokenizer) : JsonMode(std::make_shared<const JsonTokenTable>(tokenizer)) {}

JsonMode::JsonMode(std::shared_ptr<const JsonTokenTable> table) : table_(std::move(table)) {
  DAISY_CHECK(table_ != nullptr, "Bug: JsonMode without a token table");
  forbidden_.assign(static_cast<size_t>(table_->size()), false);
  top_.reserve(kTopCandidates + 1);
}

void JsonMode::Forbid(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    if (id >= 0 && id < table_->size()) forbidden_[static_cast<size_t>(id)] = true;
  }
}

void JsonMode::Reset() {
  state_ = JsonPrefix();
  text_.clear();
  failed_ = false;
}

bool JsonMode::Try(int32_t id, JsonPrefix& after) const {
  if (id < 0 || id >= table_->size() || forbidden_[static_cast<size_t>(id)]) return false;
  const std::string_view b = table_->bytes(id);
  if (b.empty()) return false;
  after = state_;
  return after.Feed(b);
}

int JsonMode::Need(const JsonPrefix& after) const {
  return table_->TokensFor(after.ClosingSuffix());
}

bool JsonMode::Fits(const JsonPrefix& after, int budget) const {
  if (budget < 0) return false;
  if (after.complete()) return true;
  const std::string suffix = after.ClosingSuffix();
  if (suffix.size() <= static_cast<size_t>(budget) && table_->EachByteIsAToken(suffix)) return true;
  return table_->TokensFor(suffix) <= budget;
}

int JsonMode::TokensToClose() const {
  return Need(state_);
}

void JsonMode::Constrain(std::span<float> logits, int tokens_left) {
  if (failed_ || state_.complete()) return;
  const int budget = tokens_left - 1;  // tokens after this one
  const auto n = static_cast<int32_t>(logits.size());
  // logit descending, then id ascending (the sampler's order); NaN and -inf are never kept
  auto better = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
  // the top candidates, kept sorted best first
  top_.clear();
  for (int32_t id = 0; id < n; ++id) {
    if (!(logits[id] > -std::numeric_limits<float>::infinity())) continue;
    if (static_cast<int>(top_.size()) == kTopCandidates && !better(id, top_.back())) continue;
    top_.insert(std::upper_bound(top_.begin(), top_.end(), id, better), id);
    if (static_cast<int>(top_.size()) > kTopCandidates) top_.pop_back();
  }
  keep_.clear();
  JsonPrefix after;
  for (int32_t id : top_) {
    if (Try(id, after) && Fits(after, budget)) keep_.push_back(id);
  }
  if (keep_.empty()) {
    // the best allowed token of the whole vocabulary
    int32_t best = -1;
    for (int32_t id : table_->usable_ids()) {
      if (id >= n || !(logits[id] > -std::numeric_limits<float>::infinity())) continue;
      if (best >= 0 && !better(id, best)) continue;
      if (Try(id, after) && Fits(after, budget)) best = id;
    }
    if (best < 0) {
      // nothing closes in time: the shortest closing, then the best logit
      int best_need = 0;
      for (int32_t id : table_->usable_ids()) {
        if (id >= n || !(logits[id] > -std::numeric_limits<float>::infinity())) continue;
        if (!Try(id, after)) continue;
        const int need = Need(after);
        if (best < 0 || need < best_need || (need == best_need && better(id, best))) {
          best = id;
          best_need = need;
        }
      }
    }
    if (best < 0) return;  // nothing allowed at all
    keep_.push_back(best);
  }
  // every logit but the kept ones -> -inf
  kept_logits_.clear();
  for (int32_t id : keep_) kept_logits_.push_back(logits[id]);
  std::fill(logits.begin(), logits.end(), -std::numeric_limits<float>::infinity());
  for (size_t k = 0; k < keep_.size(); ++k) logits[keep_[k]] = kept_logits_[k];
}

bool JsonMode::Accept(int32_t id) {
  if (failed_) return false;
  JsonPrefix after;
  if (!Try(id, after)) {
    failed_ = true;
    return false;
  }
  state_ = after;
  text_.append(table_->bytes(id));
  return state_.complete();
}

void JsonMode::Install(std::span<const int32_t> stop_ids, ConstrainHook& constrain, StopAfterHook& stop_after,
                       const std::shared_ptr<JsonMode>& mode) {
  DAISY_CHECK(mode != nullptr, "Bug: JsonMode::Install without a mode");
  mode->Reset();
  mode->Forbid(stop_ids);
  auto last_left = std::make_shared<int>(std::numeric_limits<int>::max());
  constrain = [mode, last_left, prev = std::move(constrain)](std::span<float> logits, int tokens_left) {
    if (prev) prev(logits, tokens_left);
    // Within a turn tokens_left falls by one per token and the object is open; anything
    // else is a new turn (the options reused, or the head replaying the turn).
    if (tokens_left >= *last_left || mode->complete()) mode->Reset();
    *last_left = tokens_left;
    mode->Constrain(logits, tokens_left);
  };
  stop_after = [mode, prev = std::move(stop_after)](int32_t id) {
    const bool closed = mode->Accept(id);
    const bool other = prev && prev(id);
    return closed || other;
  };
}

}  // namespace daisy
