// Unit tests of the tokenizer pipeline on small inline tokenizer.json files, the bundled
// stories260K reference, refusals, and random bytes. Quick enough for ASan+UBSan ("parser").
#include "daisy/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daisy/source.h"
#include "regex.h"
#include "unicode.h"

namespace daisy {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

std::string Env(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v ? v : dflt;
}

// A BPE tokenizer.json with the given vocabulary (ids in order) and merges.
json MakeBpe(const std::vector<std::string>& vocab, const json& merges) {
  json v = json::object();
  for (size_t i = 0; i < vocab.size(); ++i) v[vocab[i]] = static_cast<int>(i);
  return json{{"version", "1.0"},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", nullptr},
              {"post_processor", nullptr},
              {"decoder", nullptr},
              {"model", {{"type", "BPE"}, {"vocab", v}, {"merges", merges}}}};
}

Tokenizer Build(const json& j, const json& config = json()) {
  auto t = Tokenizer::FromJson(j.dump(), config.is_null() ? std::string() : config.dump());
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) std::abort();
  return std::move(t).value();
}

Ids Enc(const Tokenizer& t, std::string_view s, bool special = false) {
  auto r = t.Encode(s, special);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : Ids{};
}

json Added(int id, const std::string& content, bool special, bool lstrip = false, bool rstrip = false,
           bool single_word = false, bool normalized = false) {
  return json{{"id", id},         {"content", content},       {"single_word", single_word}, {"lstrip", lstrip},
              {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
}

// ---- UTF-8 and regex ----------------------------------------------------------------------

TEST(TokenizerUnicode, LossyMatchesRustFromUtf8Lossy) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(tok::Utf8Lossy("abc"), "abc");
  EXPECT_EQ(tok::Utf8Lossy("\xF0\x90\x80"
                           "a"),
            r + "a");                                    // truncated 4-byte: one U+FFFD
  EXPECT_EQ(tok::Utf8Lossy("\xC0\x80"), r + r);          // overlong: each byte
  EXPECT_EQ(tok::Utf8Lossy("\xED\xA0\x80"), r + r + r);  // surrogate: each byte
  EXPECT_EQ(tok::Utf8Lossy("\xE2\x82"), r);              // truncated at the end
  EXPECT_EQ(tok::Utf8Lossy("\xFF\xFE"), r + r);
  EXPECT_EQ(tok::Utf8Lossy("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_TRUE(tok::IsValidUtf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(tok::IsValidUtf8("\xC3"));
}

TEST(TokenizerUnicode, RustCharPredicates) {
  EXPECT_TRUE(tok::IsWhitespace(0x3000));
  EXPECT_TRUE(tok::IsWhitespace(0x85));
  EXPECT_FALSE(tok::IsWhitespace(0x180E));
  EXPECT_FALSE(tok::IsWhitespace(0x200B));
  EXPECT_TRUE(tok::IsNumeric(0xBD));    // ½ (No)
  EXPECT_TRUE(tok::IsNumeric(0x2167));  // Ⅷ (Nl)
  EXPECT_TRUE(tok::IsNumeric(0x0661));  // Arabic-Indic one (Nd)
  EXPECT_FALSE(tok::IsNumeric('a'));
  EXPECT_TRUE(tok::IsNumeric(0x1CCF0));  // outlined digit zero, Unicode 16
  EXPECT_TRUE(tok::IsNumeric(0x11BF0));  // Sunuwar digit zero, Unicode 16
}

TEST(TokenizerUnicode, TablesAreRecentAndConsistent) {
  EXPECT_GE(std::stod(std::string(tok::UnicodeTablesVersion())), 16.0);
  // The hard-coded White_Space set equals the generated property.
  auto ws = tok::PropertyRanges("White_Space");
  ASSERT_FALSE(ws.empty());
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    ASSERT_EQ(tok::IsWhitespace(cp), tok::InRanges(ws, cp)) << cp;
  }
  EXPECT_TRUE(tok::InRanges(tok::PropertyRanges("L"), 0x10D50));  // Garay letter, Unicode 16
  EXPECT_TRUE(tok::PropertyRanges("Han").empty());
}

std::vector<std::string> Matches(const char* pattern, std::string_view text) {
  auto re = tok::Regex::Compile(pattern);
  EXPECT_TRUE(re.ok()) << re.status().ToString();
  std::vector<tok::Span> spans;
  EXPECT_TRUE((*re)->FindAll(text, spans).ok());
  std::vector<std::string> out;
  for (auto [s, e] : spans) out.emplace_back(text.substr(s, e - s));
  return out;
}

TEST(TokenizerRegex, Gpt2PatternSplitsLikeOnig) {
  const char* gpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(Matches(gpt2, "Hello world's  end\n"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " end", "\n"}));
  // NBSP is \s for Oniguruma: it does not join the word.
  EXPECT_EQ(Matches(gpt2,
                    "a\xC2\xA0"
                    "b"),
            (std::vector<std::string>{"a", "\xC2\xA0", "b"}));
  // U+180E is not White_Space, so it is "other".
  EXPECT_EQ(Matches(gpt2, "a\xE1\xA0\x8E"), (std::vector<std::string>{"a", "\xE1\xA0\x8E"}));
}

TEST(TokenizerRegex, LetterAndNumberClassesUseTheGeneratedTables) {
  // Garay letters (Unicode 16) are \p{L}; Sunuwar digits (Unicode 16) are \p{N}.
  EXPECT_EQ(Matches(R"(\p{L}+|\p{N}+)", "a\xF0\x90\xB5\x90\xF0\x91\xAF\xB0"),
            (std::vector<std::string>{"a\xF0\x90\xB5\x90", "\xF0\x91\xAF\xB0"}));
  EXPECT_EQ(Matches(R"(\P{L}+)", "ab12c"), (std::vector<std::string>{"12"}));
  EXPECT_EQ(Matches(R"(\pN+)", "ab12c"), (std::vector<std::string>{"12"}));
  EXPECT_EQ(Matches(R"(\p{^Letter}+)", "ab12c"), (std::vector<std::string>{"12"}));
}

TEST(TokenizerRegex, CaseInsensitiveContractionsFoldLongS) {
  const char* p = R"((?i:'s|'t)|\p{L}+)";
  EXPECT_EQ(Matches(p, "IT'S it'\xC5\xBF"), (std::vector<std::string>{"IT", "'S", "it", "'\xC5\xBF"}));
}

TEST(TokenizerRegex, TranslatesSpaceClassesInsideAndOutside) {
  auto t = tok::TranslateOnigPattern(R"([^\s\p{L}]\S)");
  ASSERT_TRUE(t.ok());
  EXPECT_NE(t->find("\\x{3000}"), std::string::npos);
  EXPECT_EQ(t->find("\\s"), std::string::npos);
  EXPECT_FALSE(tok::TranslateOnigPattern(R"([^\S])").ok());
  EXPECT_FALSE(tok::TranslateOnigPattern(R"([\P{L}])").ok());
  EXPECT_FALSE(tok::Regex::Compile("(unclosed").ok());
}

TEST(TokenizerRegex, EmptyMatchesAdvanceLikeOnig) {
  EXPECT_EQ(Matches("a*", "baa"), (std::vector<std::string>{"", "aa"}));
}

// ---- BPE model -----------------------------------------------------------------------------

TEST(TokenizerBpe, MergesInBothFormsAndRankOrder) {
  std::vector<std::string> vocab = {"a", "b", "c", "ab", "bc", "abc"};
  for (const json& merges : {json{"b c", "a b", "a bc"}, json::array({json::array({"b", "c"}), json::array({"a", "b"}),
                                                                      json::array({"a", "bc"})})}) {
    Tokenizer t = Build(MakeBpe(vocab, merges));
    // "b c" ranks first, so abc -> a + bc -> abc.
    EXPECT_EQ(Enc(t, "abc"), (Ids{5}));
    EXPECT_EQ(Enc(t, "ab"), (Ids{3}));
    EXPECT_EQ(Enc(t, "cab"), (Ids{2, 3}));
  }
  // Same rank at two positions: the leftmost merges first.
  Tokenizer t = Build(MakeBpe({"a", "aa"}, json{"a a"}));
  EXPECT_EQ(Enc(t, "aaa"), (Ids{1, 0}));
  EXPECT_EQ(Enc(t, "aaaa"), (Ids{1, 1}));
}

TEST(TokenizerBpe, IgnoreMergesLooksUpTheWholeWordFirst) {
  json j = MakeBpe({"a", "b", "c", "ab", "abc", "bc"}, json{"a b", "b c"});
  Tokenizer plain = Build(j);
  EXPECT_EQ(Enc(plain, "abc"), (Ids{3, 2}));
  j["model"]["ignore_merges"] = true;
  Tokenizer ignoring = Build(j);
  EXPECT_EQ(Enc(ignoring, "abc"), (Ids{4}));
}

TEST(TokenizerBpe, ByteFallbackUnkAndFuse) {
  std::vector<std::string> vocab = {"<unk>", "a"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    vocab.push_back(buf);
  }
  json j = MakeBpe(vocab, json::array());
  j["model"]["unk_token"] = "<unk>";
  j["model"]["byte_fallback"] = true;
  Tokenizer bf = Build(j);
  // 'a' is in the vocab; 'é' (C3 A9) is not, so it becomes <0xC3> <0xA9>.
  EXPECT_EQ(Enc(bf, "a\xC3\xA9"), (Ids{1, 2 + 0xC3, 2 + 0xA9}));

  json k = MakeBpe({"<unk>", "a"}, json::array());
  k["model"]["unk_token"] = "<unk>";
  Tokenizer unfused = Build(k);
  EXPECT_EQ(Enc(unfused, "xya"), (Ids{0, 0, 1}));
  k["model"]["fuse_unk"] = true;
  Tokenizer fused = Build(k);
  EXPECT_EQ(Enc(fused, "xya"), (Ids{0, 1}));
  EXPECT_EQ(Enc(fused, "xyaz"), (Ids{0, 1, 0}));
  // No unk_token: unknown characters are dropped, as in the Rust library.
  Tokenizer none = Build(MakeBpe({"a"}, json::array()));
  EXPECT_EQ(Enc(none, "xa"), (Ids{0}));
}

TEST(TokenizerBpe, SubwordPrefixAndSuffix) {
  json j = MakeBpe({"a", "##b", "##c</w>", "c</w>", "a##b", "ab"}, json::array());
  j["model"]["continuing_subword_prefix"] = "##";
  j["model"]["end_of_word_suffix"] = "</w>";
  j["model"]["merges"] = json{"a ##b"};
  // The merge of "a" and "##b" is "a" + "b" (prefix removed from the right side).
  Tokenizer t = Build(j);
  EXPECT_EQ(Enc(t, "abc"), (Ids{5, 2}));
  EXPECT_EQ(Enc(t, "c"), (Ids{3}));
}

// ---- added tokens ----------------------------------------------------------------------------

TEST(TokenizerAdded, StripFlagsAndSingleWord) {
  json j = MakeBpe({" ", "a", "b", "x"}, json::array());
  j["added_tokens"] = json{Added(4, "<L>", true, /*lstrip=*/true), Added(5, "<R>", true, false, /*rstrip=*/true),
                           Added(6, "xy", false, false, false, /*single_word=*/true)};
  Tokenizer t = Build(j);
  EXPECT_EQ(Enc(t, "a  <L>b"), (Ids{1, 4, 2}));
  EXPECT_EQ(Enc(t, "a<R>  b"), (Ids{1, 5, 2}));
  EXPECT_EQ(Enc(t, "a xy b"), (Ids{1, 0, 6, 0, 2}));
  // Not a single word: plain text, where the model knows "x" but not "y" (dropped: no unk).
  EXPECT_EQ(Enc(t, "axyb"), (Ids{1, 3, 2}));
  EXPECT_EQ(t.TokenToId("<L>"), 4);
  EXPECT_EQ(t.IdToPiece(5), "<R>");
  EXPECT_TRUE(t.IsSpecial(4));
  EXPECT_FALSE(t.IsSpecial(6));
}

TEST(TokenizerAdded, LongestMatchAndNormalizedTokens) {
  json j = MakeBpe({"a", "<", ">", "b"}, json::array());
  j["added_tokens"] = json{Added(4, "<a>", true), Added(5, "<a><b>", true),
                           Added(6, "ab", false, false, false, false,
                                 /*normalized=*/true)};
  j["normalizer"] = json{{"type", "Lowercase"}};
  Tokenizer t = Build(j);
  EXPECT_EQ(Enc(t, "<a><b>"), (Ids{5}));
  EXPECT_EQ(Enc(t, "<a>b"), (Ids{4, 3}));
  EXPECT_EQ(Enc(t, "AB"), (Ids{6}));         // matched after lowercasing
  EXPECT_EQ(Enc(t, "<A>"), (Ids{1, 0, 2}));  // raw tokens are case-sensitive
}

// ---- normalizers and pre-tokenizers ----------------------------------------------------------

std::vector<std::string> Pieces(const Tokenizer& t, std::string_view s) {
  std::vector<std::string> out;
  for (int32_t id : Enc(t, s)) out.push_back(t.IdToPiece(id));
  return out;
}

// A vocabulary holding every character of the tests, so ids show the pre-tokenizer's pieces.
json CharVocab(const std::vector<std::string>& extra) {
  std::vector<std::string> vocab;
  for (int c = 32; c < 127; ++c) vocab.emplace_back(1, static_cast<char>(c));
  for (const auto& e : extra) vocab.push_back(e);
  return MakeBpe(vocab, json::array());
}

TEST(TokenizerNormalizers, PrependReplaceStripNfkc) {
  json j = CharVocab({"\xE2\x96\x81",
                      "\xE2\x96\x81"
                      "a"});
  j["model"]["merges"] = json{"\xE2\x96\x81 a"};
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                       {{"type", "NFKC"}},
                       {{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}};
  Tokenizer t = Build(j);
  // "ﬁ" (U+FB01) becomes "fi" under NFKC; the outer spaces are stripped.
  EXPECT_EQ(Pieces(t, "  a \xEF\xAC\x81 "), (std::vector<std::string>{"\xE2\x96\x81"
                                                                      "a",
                                                                      "\xE2\x96\x81", "f", "i"}));
  EXPECT_TRUE(Enc(t, "").empty());
}

TEST(TokenizerNormalizers, NfdLowercaseStripAccents) {
  json j = CharVocab({"\xCC\x81", "\xC3\xA9", "\xCF\x83", "\xCC\x87"});
  j["normalizer"] = {{"type", "NFD"}};
  // U+00E9 is below U+0300 but decomposes under NFD: e + U+0301.
  EXPECT_EQ(Pieces(Build(j), "\xC3\xA9"), (std::vector<std::string>{"e", "\xCC\x81"}));
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(Pieces(Build(j), "e\xCC\x81"), (std::vector<std::string>{"\xC3\xA9"}));
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFD"}}, {{"type", "StripAccents"}}}}};
  EXPECT_EQ(Pieces(Build(j), "\xC3\xA9"), (std::vector<std::string>{"e"}));
  // char::to_lowercase: Σ -> σ with no final-sigma rule, İ -> i + U+0307.
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_EQ(Pieces(Build(j), "A\xCE\xA3\xC4\xB0"), (std::vector<std::string>{"a", "\xCF\x83", "i", "\xCC\x87"}));
}

TEST(TokenizerPreTokenizers, MetaspacePrependSchemes) {
  const std::string m = "\xE2\x96\x81";
  json j = CharVocab({m, m + "a", m + "b"});
  j["model"]["merges"] = json{m + " a", m + " b"};
  j["added_tokens"] = json{Added(200, "<s>", true)};
  for (auto [scheme, want_first, want_after] :
       {std::tuple{"first", std::vector<std::string>{m + "a"}, std::vector<std::string>{"<s>", "b"}},
        std::tuple{"always", std::vector<std::string>{m + "a"}, std::vector<std::string>{"<s>", m + "b"}},
        std::tuple{"never", std::vector<std::string>{"a"}, std::vector<std::string>{"<s>", "b"}}}) {
    j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", scheme}, {"split", true}};
    Tokenizer t = Build(j);
    EXPECT_EQ(Pieces(t, "a"), want_first) << scheme;
    EXPECT_EQ(Pieces(t, "<s>b"), want_after) << scheme;
  }
  // split: "a b" -> "▁a", "▁b" (merged with next).
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(Pieces(Build(j), "a  b"), (std::vector<std::string>{m + "a", m, m + "b"}));
}

TEST(TokenizerPreTokenizers, SplitBehaviorsAndInvert) {
  json j = CharVocab({"a-", "-b", "--", "b-", "ab"});
  j["model"]["merges"] = json{"a -", "- b", "- -", "b -", "a b"};
  auto with = [&](const char* behavior, bool invert) {
    j["pre_tokenizer"] = {
        {"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
    return Pieces(Build(j), "a-b--");
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(with("Removed", false), (V{"a", "b"}));
  EXPECT_EQ(with("Isolated", false), (V{"a", "-", "b", "-", "-"}));
  EXPECT_EQ(with("MergedWithPrevious", false), (V{"a-", "b-", "-"}));
  EXPECT_EQ(with("MergedWithNext", false), (V{"a", "-b", "-", "-"}));
  EXPECT_EQ(with("Contiguous", false), (V{"a", "-", "b", "--"}));
  // Inverted: the letters are the matches; each "-" is its own (kept) non-match.
  EXPECT_EQ(with("Removed", true), (V{"-", "-", "-"}));
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+"}}}, {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_EQ(Pieces(Build(j), "ab-"), (V{"ab", "-"}));
}

TEST(TokenizerPreTokenizers, DigitsWhitespaceByteLevel) {
  using V = std::vector<std::string>;
  json j = CharVocab({"12", "ab", "\xC2\xBD"});
  j["model"]["merges"] = json{"1 2", "a b"};
  j["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
  EXPECT_EQ(Pieces(Build(j), "ab12"), (V{"ab", "1", "2"}));
  j["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", false}};
  EXPECT_EQ(Pieces(Build(j), "ab12"), (V{"ab", "12"}));
  // ½ is numeric for Rust (No), so it is split off even when individual_digits is false.
  EXPECT_EQ(Pieces(Build(j),
                   "ab\xC2\xBD"
                   "12"),
            (V{"ab", "\xC2\xBD", "12"}));
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_EQ(Pieces(Build(j), "ab  12!!"), (V{"ab", "12", "!", "!"}));
  j["pre_tokenizer"] = {{"type", "WhitespaceSplit"}};
  EXPECT_EQ(Pieces(Build(j), " ab\t12 "), (V{"ab", "12"}));
}

// ---- post-processors, decoders, config ------------------------------------------------------

TEST(TokenizerPostProcess, TemplateAndLlamaConfigFlags) {
  json j = CharVocab({});
  j["added_tokens"] = json{Added(100, "<s>", true), Added(101, "</s>", true)};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", json::array()},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {100}}, {"tokens", {"<s>"}}}}}}};
  Tokenizer t = Build(j);
  EXPECT_EQ(Enc(t, "a", true), (Ids{100, 'a' - 32}));
  EXPECT_EQ(Enc(t, "a", false), (Ids{'a' - 32}));
  // LlamaTokenizer: transformers rebuilds the template from add_bos_token / add_eos_token.
  json cfg = {{"tokenizer_class", "LlamaTokenizer"},
              {"bos_token", "<s>"},
              {"eos_token", {{"content", "</s>"}}},
              {"add_bos_token", false},
              {"add_eos_token", true}};
  Tokenizer llama = Build(j, cfg);
  EXPECT_EQ(Enc(llama, "a", true), (Ids{'a' - 32, 101}));
  EXPECT_EQ(llama.bos_id(), 100);
  EXPECT_EQ(llama.eos_id(), 101);
  cfg.erase("add_bos_token");  // default true
  EXPECT_EQ(Enc(Build(j, cfg), "a", true), (Ids{100, 'a' - 32, 101}));
  // Another class keeps the file's post-processor.
  cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
  EXPECT_EQ(Enc(Build(j, cfg), "a", true), (Ids{100, 'a' - 32}));
}

TEST(TokenizerDecode, SentencePieceChainAndCleanup) {
  const std::string m = "\xE2\x96\x81";
  json j = MakeBpe({"<unk>", "<s>", m + "Hi", m + "there", "<0xE2>", "<0x82>", "<0xAC>", "<0xFF>", m + ".", "."},
                   json::array());
  j["added_tokens"] = json{Added(1, "<s>", true)};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", m}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  Tokenizer t = Build(j, json{{"clean_up_tokenization_spaces", true}});
  Ids ids = {1, 2, 3, 4, 5, 6, 8, 7};
  EXPECT_EQ(t.Decode(ids, false, false),
            "<s> Hi there\xE2\x82\xAC ."
            "\xEF\xBF\xBD");
  EXPECT_EQ(t.Decode(ids, true, false),
            "Hi there\xE2\x82\xAC ."
            "\xEF\xBF\xBD");
  EXPECT_EQ(t.Decode(ids, true),
            "Hi there\xE2\x82\xAC."
            "\xEF\xBF\xBD");                                 // config cleanup: " ." -> "."
  EXPECT_EQ(t.Decode(Ids{2, 999, -5}, false, false), "Hi");  // unknown ids are skipped
}

TEST(TokenizerDecode, ByteLevelAndMetaspace) {
  json j = MakeBpe({"\xC4\xA0"
                    "hi",
                    "\xC3\xA2\xC4\xA4\xC2\xAC", "<x>"},
                   json::array());  // "Ġhi", "âĤ¬" = €
  j["decoder"] = {{"type", "ByteLevel"}};
  Tokenizer t = Build(j);
  EXPECT_EQ(t.Decode(Ids{0, 1, 2}, false), " hi\xE2\x82\xAC<x>");
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "h"}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(Build(j).Decode(Ids{0, 0}, false), "\xC4\xA0i\xC4\xA0 i");
}

// ---- refusals --------------------------------------------------------------------------------

void ExpectRefused(const json& j, const std::string& name) {
  auto t = Tokenizer::FromJson(j.dump(), "");
  ASSERT_FALSE(t.ok()) << name;
  EXPECT_NE(t.status().message().find(name), std::string::npos) << t.status().ToString();
}

TEST(TokenizerRefuses, OtherModelsAndUnknownComponentsByName) {
  json unigram = {{"model", {{"type", "Unigram"}, {"unk_id", 0}, {"vocab", {{"<unk>", 0.0}}}}}};
  ExpectRefused(unigram, "tokenizer model 'Unigram' is not supported");
  json wordpiece = {{"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", {{"[UNK]", 0}}}}}};
  ExpectRefused(wordpiece, "tokenizer model 'WordPiece' is not supported");
  json base = MakeBpe({"a"}, json::array());
  json n = base, p = base, pp = base, d = base;
  n["normalizer"] = {{"type", "BertNormalizer"}};
  ExpectRefused(n, "normalizer 'BertNormalizer'");
  p["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "UnicodeScripts"}}}}};
  ExpectRefused(p, "pre-tokenizer 'UnicodeScripts'");
  pp["post_processor"] = {{"type", "Frobnicate"}};
  ExpectRefused(pp, "post-processor 'Frobnicate'");
  d["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}};
  ExpectRefused(d, "decoder 'WordPiece'");
  ExpectRefused(json{{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", {"a b"}}}}}, "'b'");
  EXPECT_FALSE(Tokenizer::FromJson("{not json", "").ok());
  EXPECT_FALSE(Tokenizer::FromJson(base.dump(), "[1,").ok());
}

TEST(TokenizerRefuses, RefusalFilesInTestdata) {
  const std::string dir = Env("DAISY_TESTDATA", "testdata") + "/tokenizers/refused/";
  for (auto [file, name] : {std::pair{"unigram.json", "'Unigram'"}, std::pair{"wordpiece.json", "'WordPiece'"},
                            std::pair{"unknown_decoder.json", "'CTC'"}}) {
    std::ifstream in(dir + file);
    ASSERT_TRUE(in) << dir + file;
    std::stringstream ss;
    ss << in.rdbuf();
    auto t = Tokenizer::FromJson(ss.str(), "");
    ASSERT_FALSE(t.ok()) << file;
    EXPECT_NE(t.status().message().find(name), std::string::npos) << t.status().ToString();
  }
}

// ---- the bundled model -----------------------------------------------------------------------

Tokenizer LoadFolder(const std::string& dir) {
  auto src = OpenLocalFolder(dir);
  EXPECT_TRUE(src.ok()) << src.status().ToString();
  if (!src.ok()) std::abort();
  auto t = Tokenizer::Load(**src);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) std::abort();
  return std::move(t).value();
}

TEST(TokenizerStories260K, MatchesReferenceCases) {
  const std::string dir = Env("DAISY_MODELS", "models") + "/stories260K";
  Tokenizer t = LoadFolder(dir);
  std::ifstream in(dir + "/reference/tokenizer_cases.json");
  ASSERT_TRUE(in);
  json ref = json::parse(in);
  ASSERT_GT(ref["cases"].size(), 10u);
  for (const auto& c : ref["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(Enc(t, text, true), c["ids"].get<Ids>()) << json(text).dump();
    EXPECT_EQ(t.Decode(c["ids"].get<Ids>(), true), text) << json(text).dump();
  }
  EXPECT_EQ(Enc(t, "Once upon a time", true), (Ids{1, 403, 407, 261, 378}));
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.IdToPiece(403), "\xE2\x96\x81Once");
}

TEST(TokenizerStories260K, ConcurrentEncodeIsConsistent) {
  Tokenizer t = LoadFolder(Env("DAISY_MODELS", "models") + "/stories260K");
  const std::string text = "Once upon a time, there was a little girl named Lily. She loved to play outside.";
  const Ids want = Enc(t, text, true);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 200; ++i) {
        auto r = t.Encode(text + std::to_string(i % 7), true);
        if (!r.ok() || r->size() < want.size()) ++bad[k];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

// ---- random bytes ------------------------------------------------------------------------------

// 10^5 seeded random strings (raw bytes, valid UTF-8 from odd ranges, special-token text):
// encode never fails or crashes, ids are in the vocabulary, invalid UTF-8 encodes exactly
// like its U+FFFD-substituted form, and byte-level round trips give back the lossy text.
std::string RandomString(std::mt19937_64& rng) {
  static constexpr uint32_t kPoints[] = {' ',      '\n',   '\t',   'a',    'Z',    '0',    '\'',   0xA0,
                                         0xBD,     0x300,  0x301,  0x3000, 0x2028, 0xFFFD, 0xFEFF, 0x1F600,
                                         0x10FFFF, 0x4E2D, 0x0661, 0x2581, 0x120,  0x17F,  0x0};
  static constexpr const char* kFragments[] = {"<s>", "</s>", "<unk>", "<|endoftext|>", "<0x0A>", "'s", "  ", "\r\n"};
  std::string s;
  size_t n = rng() % 24;
  for (size_t i = 0; i < n; ++i) {
    switch (rng() % 4) {
      case 0:
        s.push_back(static_cast<char>(rng() & 0xFF));
        break;
      case 1:
        tok::AppendUtf8(s, kPoints[rng() % std::size(kPoints)]);
        break;
      case 2: {
        uint32_t cp = static_cast<uint32_t>(rng() % 0x110000);
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
        tok::AppendUtf8(s, cp);
        break;
      }
      default:
        s += kFragments[rng() % std::size(kFragments)];
        break;
    }
  }
  return s;
}

// Every string is encoded; every 8th invalid one is checked against its lossy form and
// every 4th is decoded (round trip for byte-level tokenizers), which keeps the ASan run short.
void FuzzTokenizer(const Tokenizer& t, uint64_t seed, int count, bool byte_level) {
  std::mt19937_64 rng(seed);
  int failures = 0;
  for (int i = 0; i < count && failures < 5; ++i) {
    std::string s = RandomString(rng);
    const bool special = byte_level ? false : (i % 2 == 0);
    auto ids = t.Encode(s, special);
    if (!ids.ok()) {
      ADD_FAILURE() << "encode failed: " << ids.status().ToString();
      ++failures;
      continue;
    }
    for (int32_t id : *ids) {
      if (id < 0 || id >= t.vocab_size()) {
        ADD_FAILURE() << "id " << id << " out of range";
        ++failures;
      }
    }
    if (i % 4 != 0) continue;
    std::string lossy = tok::Utf8Lossy(s);
    if (lossy != s && i % 8 == 0) {
      auto again = t.Encode(lossy, special);
      if (!again.ok() || *again != *ids) {
        ADD_FAILURE() << "invalid UTF-8 not encoded as its lossy form: " << json(lossy).dump();
        ++failures;
      }
    }
    std::string back = t.Decode(*ids, false, false);
    if (byte_level && back != lossy) {
      ADD_FAILURE() << "round trip " << json(lossy).dump() << " -> " << json(back).dump();
      ++failures;
    }
  }
}

TEST(TokenizerRandomBytes, NeverCrashStories260K) {
  Tokenizer t = LoadFolder(Env("DAISY_MODELS", "models") + "/stories260K");
  FuzzTokenizer(t, 1234, 50000, false);
}

// Every normalizer and the regex pre-tokenizers on random text, including unassigned code
// points and noncharacters: a byte-level vocabulary of the 256 byte characters, so every
// input encodes and decodes back to its normalized form.
TEST(TokenizerRandomBytes, NeverCrashNormalizersAndRegexes) {
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) {
    // The GPT-2 byte characters, the same table the ByteLevel pre-tokenizer uses.
    int n = 0;
    uint32_t cp = 0;
    for (int k = 0; k <= b; ++k) {
      bool printable = (k >= 33 && k <= 126) || (k >= 161 && k <= 172) || (k >= 174 && k <= 255);
      cp = printable ? static_cast<uint32_t>(k) : static_cast<uint32_t>(256 + n++);
    }
    std::string c;
    tok::AppendUtf8(c, cp);
    vocab.push_back(c);
  }
  json j = MakeBpe(vocab, json::array());
  j["decoder"] = {{"type", "ByteLevel"}};
  const json pre = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern",
          {{"Regex",
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
            "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "Digits"}, {"individual_digits", true}},
        {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "first"}, {"split", true}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}};
  for (const char* form : {"NFC", "NFD", "NFKC", "NFKD"}) {
    j["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", {{{"type", form}}, {{"type", "Lowercase"}}, {{"type", "StripAccents"}}}}};
    j["pre_tokenizer"] = pre;
    Tokenizer t = Build(j);
    std::mt19937_64 rng(99);
    for (int i = 0; i < 2500; ++i) {
      std::string s = RandomString(rng);
      auto ids = t.Encode(s, true);
      ASSERT_TRUE(ids.ok()) << form << ": " << ids.status().ToString();
      (void)t.Decode(*ids, false);
    }
  }
}

TEST(TokenizerRandomBytes, NeverCrashGpt2) {
  Tokenizer t = LoadFolder(Env("DAISY_TESTDATA", "testdata") + "/tokenizers/gpt2");
  FuzzTokenizer(t, 5678, 50000, true);
}

}  // namespace
}  // namespace daisy
