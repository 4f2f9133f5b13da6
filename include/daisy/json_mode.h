// JSON mode (the OpenAI API's `response_format: {"type": "json_object"}`): the completion
// is kept inside one JSON object and closed before max_tokens runs out.
//
// Three parts:
//   JsonPrefix     a pushdown recognizer of JSON-object prefixes over bytes, and the
//                  shortest text that completes the value from where it stands;
//   JsonTokenTable each token id's bytes (what it adds to the completion) and the fewest
//                  tokens that spell a given closing text; built once per tokenizer;
//   JsonMode       one turn: masks the logits before each token (the generator's
//                  `constrain` hook) and feeds the chosen token (`stop_after`).
//
// What the recognizer accepts is stricter than RFC 8259 where a strict parser (nlohmann,
// Python's json) would refuse valid-looking text, so every completed value parses:
// strings must be well-formed UTF-8 (raw control bytes < 0x20 refused, \uXXXX surrogates
// only as a high-low pair); numbers keep at most kMaxNumberDigits digits before the
// exponent and kMaxExponentDigits exponent digits (always finite as a double). To keep a
// model from running out its budget on layout, a run of whitespace between tokens of
// the JSON grammar is at most kMaxWhitespaceRun bytes with at most kMaxLineBreaks
// newlines (enough for indented output), and nesting is at most kMaxDepth.
// The top-level value must be an object (leading whitespace allowed), as OpenAI's
// json_object asks.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace daisy {

class Tokenizer;

// A prefix of a JSON object text, fed byte by byte. A value type (about 24 bytes, cheap to
// copy: checking a candidate token is feeding its bytes to a copy); thread-compatible.
class JsonPrefix {
 public:
  static constexpr int kMaxDepth = 64;          // open objects and arrays
  static constexpr int kMaxWhitespaceRun = 16;  // whitespace bytes in a row outside strings
  static constexpr int kMaxLineBreaks = 2;      // newlines among them (indentation fits, loops do not)
  static constexpr int kMaxNumberDigits = 40;   // integer + fraction digits of one number
  static constexpr int kMaxExponentDigits = 2;  // digits after e/E

  // Appends `bytes` when the text stays a prefix of an accepted JSON object (after a
  // complete value only whitespace may follow); otherwise returns false and the state is
  // unchanged. Feeding "" succeeds.
  bool Feed(std::string_view bytes);
  // True once the object is closed (the text is an accepted JSON object).
  bool complete() const { return expect_ == Expect::kDone; }
  // The shortest text that completes the value from here, "" when complete: closes an open
  // string (finishing an escape, a \u sequence or a multi-byte character first), finishes
  // a number or literal, gives an object key ":" and the value `null` (a missing key
  // becomes `"":null`, a missing value `null`), then "}" / "]" for every open container.
  // Feeding it, or any prefix of it, leaves exactly the rest as the new closing suffix.
  std::string ClosingSuffix() const;

 private:
  enum class Expect : uint8_t {
    kStart,          // before the top-level object: whitespace or '{'
    kObjKeyOrEnd,    // after '{'
    kObjKey,         // after ',' in an object
    kObjColon,       // after a key
    kObjValue,       // after ':'
    kObjCommaOrEnd,  // after a member's value
    kArrValueOrEnd,  // after '['
    kArrValue,       // after ',' in an array
    kArrCommaOrEnd,  // after an element
    kDone,           // the top-level object is closed
  };
  enum class Lex : uint8_t { kNone, kString, kNumber, kLiteral };
  enum class Str : uint8_t { kChars, kEscape, kHex, kUtf8, kLowBackslash, kLowU, kLowHex };
  enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };

  bool Step(uint8_t c);  // one byte; on false the state is garbage (Feed works on a copy)
  bool StringByte(uint8_t c);
  bool StructuralByte(uint8_t c);
  bool StartValue(uint8_t c);
  void StartScalar(Lex lex);
  bool Push(bool object);
  void Pop();
  Expect AfterValue() const;
  uint8_t NextClosingByte() const;

  uint64_t objects_ = 0;  // bit i set: the container at depth i is an object
  uint8_t depth_ = 0;     // open containers
  Expect expect_ = Expect::kStart;
  Lex lex_ = Lex::kNone;  // a scalar being read (expect_ already says what follows it)
  Str str_ = Str::kChars;
  Num num_ = Num::kInt;
  uint8_t count_ = 0;                  // number digits / hex digits read / literal position
  uint8_t exp_digits_ = 0;             // exponent digits
  uint8_t literal_ = 0;                // 0 true, 1 false, 2 null
  uint8_t hex_first_ = 0;              // first hex digit of a \u escape
  bool high_ = false;                  // the \u escape being read is a high surrogate
  uint8_t utf8_left_ = 0;              // continuation bytes still due
  uint8_t utf8_lo_ = 0, utf8_hi_ = 0;  // range of the next continuation byte
  uint8_t ws_run_ = 0;                 // whitespace bytes in the current run
  uint8_t ws_breaks_ = 0;              // '\n' in the current run
};

// Each token id's bytes and the closing-text segmentation, for one tokenizer. Immutable
// once built, so one table may serve any number of turns and threads at once. Building
// decodes every id twice (about 40 ms for Qwen3's 151k ids here): build it once per model.
//
// How a token's bytes are found: Decode({p, id}) with the prefix text Decode({p}) removed,
// where p is a plain one-letter token ("a"). Decoding the id behind another token keeps
// the leading space that a SentencePiece decoder strips at the start of a text (the
// Metaspace prepend rule, the Strip decoder after Fuse), so "▁the" gives " the", as it
// reads inside a completion. cleanup (clean_up_tokenization_spaces) is off: it only drops
// spaces, which never changes whether text is JSON. When the decoded text holds U+FFFD
// that the piece does not (a lone byte of a multi-byte character, which the decoders
// replace), the raw bytes are taken from the piece instead: "<0xE2>" (byte fallback) or
// the GPT-2 byte-level alphabet ("â" -> 0xE2). JsonPrefix requires complete UTF-8 in
// strings, so the completion text equals the bytes the recognizer saw.
// Never allowed (empty bytes): special tokens, ids outside the vocabulary, tokens that
// decode to nothing.
class JsonTokenTable {
 public:
  static constexpr int kUnreachable = 1 << 29;
  explicit JsonTokenTable(const Tokenizer& tokenizer);  // reads the tokenizer only here

  int32_t size() const { return static_cast<int32_t>(offsets_.size()) - 1; }  // vocab_size()
  // The bytes `id` adds to the completion; "" for an id that is never allowed.
  std::string_view bytes(int32_t id) const;
  // Ids with non-empty bytes, ascending.
  const std::vector<int32_t>& usable_ids() const { return usable_; }
  // The fewest tokens whose bytes, concatenated, are exactly `text` (kUnreachable if none).
  // Used for closing suffixes; considers tokens of at most 16 bytes drawn from the bytes
  // a closing suffix can contain.
  int TokensFor(std::string_view text) const;
  // True when every byte of `text` is some token's whole bytes (then TokensFor <= size).
  bool EachByteIsAToken(std::string_view text) const;

 private:
  std::vector<uint32_t> offsets_;  // (vocab + 1) offsets into blob_
  std::string blob_;
  std::vector<int32_t> usable_;
  std::array<int8_t, 256> symbol_{};  // byte -> trie symbol, -1 outside the closing alphabet
  std::array<bool, 256> single_{};    // byte is some token's whole bytes
  int n_symbols_ = 0;
  std::vector<int32_t> trie_;   // node * n_symbols_ + symbol -> child node (0: none)
  std::vector<bool> terminal_;  // node spells some token's bytes
};

// One turn of JSON mode. Not thread-safe (one per turn; tables are shared).
class JsonMode {
 public:
  static constexpr int kTopCandidates = 40;

  // Builds a private table (see JsonTokenTable for the cost); `tokenizer` is not kept.
  explicit JsonMode(const Tokenizer& tokenizer);
  explicit JsonMode(std::shared_ptr<const JsonTokenTable> table);

  // Ids never to allow in addition to special tokens (the turn's stop ids: a stop id ends
  // the turn before the value is closed). Adds to earlier calls; survives Reset().
  void Forbid(std::span<const int32_t> ids);
  // Back to an empty completion.
  void Reset();

  // Before a token is sampled from `logits` (tokens_left counts this one): a candidate is
  // allowed when its bytes keep the text an accepted prefix and the closing suffix of the
  // result still fits in the tokens left after it (TokensFor(suffix) <= tokens_left - 1).
  // Among the kTopCandidates best (logit descending, then id ascending; -inf and NaN never
  // count) the allowed ones keep their logits and every other logit becomes -inf. If none
  // of them is allowed, only the best allowed token of the whole vocabulary stays; if no
  // token fits the budget at all (max_tokens too small to close), the one that leaves the
  // shortest closing (then the best logit). So once tokens_left is just enough, only
  // tokens that emit the closing suffix (in as few tokens as it takes) remain. Does nothing
  // when the value is complete or the turn failed, or when no token is allowed at all (all
  // allowed tokens at -inf or NaN: then the sampler's pick will fail Accept).
  void Constrain(std::span<float> logits, int tokens_left);
  // Feeds the chosen token. True when the object is complete (the turn should stop). A
  // token the recognizer refuses (only if Constrain was bypassed) fails the turn: the text
  // stops growing, Accept returns false from then on and Constrain leaves logits alone.
  bool Accept(int32_t id);

  bool complete() const { return state_.complete(); }
  bool failed() const { return failed_; }
  // The completion as the recognizer saw it (the token bytes concatenated).
  const std::string& text() const { return text_; }
  // Tokens the closing suffix takes from here (0 when complete).
  int TokensToClose() const;
  const JsonTokenTable& table() const { return *table_; }

  // The hooks of a generation loop (GenerateOptions, daisy/generator.h) that JSON mode sets.
  using ConstrainHook = std::function<void(std::span<float> logits, int tokens_left)>;
  using StopAfterHook = std::function<bool(int32_t id)>;

  // Resets `mode` and installs it as options.constrain and options.stop_after, chained
  // after hooks already there (those run too: constrain first, stop_after on every token).
  // The ids in options.stop_ids are forbidden, so set them first. The hooks notice a new
  // turn (the options reused, the head replaying a turn) when tokens_left does not fall
  // or the object is already complete, and start afresh; a turn that ended open (a stop
  // string, an error) followed by one with a smaller max_tokens is not noticed: call
  // Install again for it. A template over the options (a GenerateOptions) because sample
  // sits below forward, which defines them (docs/ARCHITECTURE.md).
  template <class Options>
  static void Install(Options& options, const std::shared_ptr<JsonMode>& mode) {
    Install(options.stop_ids, options.constrain, options.stop_after, mode);
  }
  static void Install(std::span<const int32_t> stop_ids, ConstrainHook& constrain, StopAfterHook& stop_after,
                      const std::shared_ptr<JsonMode>& mode);

 private:
  // The state after `id`, when allowed at all; fits: its closing suffix fits in `budget`.
  bool Try(int32_t id, JsonPrefix& after) const;
  bool Fits(const JsonPrefix& after, int budget) const;
  int Need(const JsonPrefix& after) const;

  std::shared_ptr<const JsonTokenTable> table_;
  std::vector<bool> forbidden_;
  JsonPrefix state_;
  std::string text_;
  bool failed_ = false;
  std::vector<int32_t> top_;   // scratch: the best candidates
  std::vector<int32_t> keep_;  // scratch: the ids that keep their logits
  std::vector<float> kept_logits_;
};

}  // namespace daisy
