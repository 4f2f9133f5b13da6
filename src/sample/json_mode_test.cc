// JSON mode: the prefix recognizer (accepted and refused prefixes, completion, closing
// suffixes checked against nlohmann::json on many random truncated documents), the token
// tables of the bundled stories260K and GPT-2 tokenizers, Constrain/Accept driven by fake
// logits, and the generator running the real stories260K with the mode installed.
#include "daisy/json_mode.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "daisy/forward.h"
#include "daisy/generator.h"
#include "daisy/model.h"
#include "daisy/sampling.h"
#include "daisy/source.h"
#include "daisy/tokenizer.h"

namespace daisy {
namespace {

// splitmix64: seeded and the same on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int Below(int n) { return static_cast<int>(Next() % static_cast<uint64_t>(n)); }
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_;
};

bool Accepts(std::string_view text) {
  JsonPrefix p;
  return p.Feed(text);
}

bool Completes(std::string_view text) {
  JsonPrefix p;
  return p.Feed(text) && p.complete();
}

std::string Closing(std::string_view text) {
  JsonPrefix p;
  EXPECT_TRUE(p.Feed(text)) << text;
  return p.ClosingSuffix();
}

bool ParsesAsObject(const std::string& text) {
  try {
    return nlohmann::json::parse(text).is_object();
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

// ---------------------------------------------------------------------------------------
// The recognizer

TEST(JsonPrefix, AcceptsEveryPrefixOfValidObjects) {
  const std::vector<std::string> docs = {
      "{}",
      " \n\t\r{ }",
      R"({"a":1})",
      R"({"a": [1, -2.5e+10, 0, -0.0, 3E-2, true, false, null, {"b": "c\n\u00e9\ud83d\ude00\/\\\""}], "x": {}})",
      "{\"caf\xC3\xA9\": \"\xE2\x82\xAC \xF0\x9F\x98\x80 \x7F\"}",
      R"({"nested": [[[[]]], [{}], {"k": [null]}]})",
      "{\n  \"a\": 1,\n  \"b\": [\n    2\n  ]\n} \n",
  };
  for (const std::string& d : docs) {
    ASSERT_TRUE(ParsesAsObject(d)) << d;  // the test data itself
    JsonPrefix p;
    for (size_t i = 0; i < d.size(); ++i) {
      ASSERT_FALSE(p.complete()) << d.substr(0, i);
      ASSERT_TRUE(p.Feed(d.substr(i, 1))) << "refused byte " << i << " of " << d;
      if (p.complete()) {
        // only whitespace after the value
        for (size_t j = i + 1; j < d.size(); ++j) ASSERT_TRUE(d[j] == ' ' || d[j] == '\n') << d;
        break;
      }
    }
    EXPECT_TRUE(p.complete()) << d;
  }
}

TEST(JsonPrefix, RefusesInvalidText) {
  const std::vector<std::string> bad = {
      "[",                          // the top level must be an object
      "\"x\"",                      //
      "1",                          //
      "x",                          //
      "{'a'",                       // single quotes
      "{a",                         // bare key
      "{\"a\" 1",                   // missing colon
      "{\"a\":}",                   // missing value
      "{\"a\":1,}",                 // trailing comma
      "{,",                         //
      "{\"a\":[1,]",                //
      "{\"a\":01",                  // leading zero
      "{\"a\":1.}",                 // no fraction digit
      "{\"a\":.5",                  //
      "{\"a\":+1",                  //
      "{\"a\":-}",                  //
      "{\"a\":1e}",                 //
      "{\"a\":1e+}",                //
      "{\"a\":1.2.3",               //
      "{\"a\":1e123",               // more than kMaxExponentDigits
      "{\"a\":tru}",                //
      "{\"a\":nul ",                //
      "{\"a\":True",                //
      "{\"a\":\"\x01",              // a raw control byte in a string
      "{\"a\":\"\n",                //
      "{\"a\":\"\\x",               // bad escape
      "{\"a\":\"\\u12G",            // bad hex
      "{\"a\":\"\\udc00",           // a lone low surrogate
      "{\"a\":\"\\ud800\"",         // a high surrogate without its low half
      "{\"a\":\"\\ud800\\u0041",    // ... followed by a non-low escape
      "{\"a\":\"\x80",              // a continuation byte without a lead
      "{\"a\":\"\xC0\x80",          // overlong
      "{\"a\":\"\xE0\x80\x80",      // overlong
      "{\"a\":\"\xED\xA0\x80",      // an encoded surrogate
      "{\"a\":\"\xF4\x90\x80\x80",  // above U+10FFFF
      "{\"a\":\"\xF5",              //
      "{\"a\":\"\xE2\x82\"",        // a character cut short by the closing quote
      "{}x",                        // text after the value
      "{}{}",                       //
      "{\"a\":1}}",                 //
      "{\"a\":[1}",                 // mismatched close
      "{\"a\":{]",                  //
  };
  for (const std::string& b : bad) EXPECT_FALSE(Accepts(b)) << b;
  // Limits: a whitespace run, nesting depth, number digits.
  const std::string spaces(JsonPrefix::kMaxWhitespaceRun, ' ');
  EXPECT_TRUE(Accepts(std::string("{").append(spaces)));
  EXPECT_FALSE(Accepts(std::string("{").append(spaces).append(" ")));
  EXPECT_TRUE(Accepts(std::string(JsonPrefix::kMaxLineBreaks, '\n').append("{").append(spaces).append("\"a\"")));
  EXPECT_FALSE(Accepts(std::string(JsonPrefix::kMaxLineBreaks + 1, '\n')));
  EXPECT_FALSE(Accepts(std::string("{\"a\":1 \n \r\n\t\n")));
  EXPECT_TRUE(Accepts(std::string("{\"a\":1 \n \r\n\t ,\n\n").append(spaces.substr(2))));  // a run ends at ","
  EXPECT_TRUE(Accepts("{\"a\":\"" + std::string(1000, ' ')));  // spaces inside strings are content
  std::string deep = "{\"a\":";
  for (int d = 1; d < JsonPrefix::kMaxDepth; ++d) deep += "[";
  EXPECT_TRUE(Accepts(deep));
  EXPECT_FALSE(Accepts(deep + "["));
  EXPECT_FALSE(Accepts(deep + "{"));
  const std::string digits(JsonPrefix::kMaxNumberDigits, '7');
  EXPECT_TRUE(Completes("{\"a\":" + digits + "e99}"));
  EXPECT_FALSE(Accepts("{\"a\":" + digits + "7"));
  EXPECT_FALSE(Accepts("{\"a\":" + digits + "."));
  EXPECT_TRUE(Completes("{\"a\":-" + digits.substr(1) + ".7e-99}"));
  EXPECT_TRUE(ParsesAsObject("{\"a\":-" + digits + "e99}"));
}

TEST(JsonPrefix, FeedIsAllOrNothing) {
  JsonPrefix p;
  ASSERT_TRUE(p.Feed("{\"a\":[1"));
  const std::string before = p.ClosingSuffix();
  EXPECT_FALSE(p.Feed("2, x"));  // valid bytes first, then a refused one
  EXPECT_EQ(p.ClosingSuffix(), before);
  EXPECT_TRUE(p.Feed("2"));
  EXPECT_TRUE(p.Feed(""));
  EXPECT_EQ(p.ClosingSuffix(), "]}");
}

TEST(JsonPrefix, CompleteDetection) {
  EXPECT_FALSE(Completes(""));
  EXPECT_FALSE(Completes("  {"));
  EXPECT_TRUE(Completes("{}"));
  EXPECT_TRUE(Completes("  {} \n"));
  EXPECT_FALSE(Completes("{\"a\":1"));
  EXPECT_FALSE(Completes("{\"a\":\"}\""));
  EXPECT_TRUE(Completes("{\"a\":\"}\"}"));
  EXPECT_FALSE(Completes("{\"a\":{}"));
  EXPECT_TRUE(Completes("{\"a\":{}}"));
}

TEST(JsonPrefix, ClosingSuffixes) {
  EXPECT_EQ(Closing(""), "{}");
  EXPECT_EQ(Closing("  "), "{}");
  EXPECT_EQ(Closing("{"), "}");
  EXPECT_EQ(Closing("{\"ab"), "\":null}");
  EXPECT_EQ(Closing("{\"ab\""), ":null}");
  EXPECT_EQ(Closing("{\"ab\" :"), "null}");
  EXPECT_EQ(Closing("{\"a\":1,"), "\"\":null}");
  EXPECT_EQ(Closing("{\"a\":[1,"), "null]}");
  EXPECT_EQ(Closing("{\"a\":[{\"b\":[["), "]]}]}");
  EXPECT_EQ(Closing("{\"a\":12"), "}");
  EXPECT_EQ(Closing("{\"a\":-"), "0}");
  EXPECT_EQ(Closing("{\"a\":1."), "0}");
  EXPECT_EQ(Closing("{\"a\":1e-"), "0}");
  EXPECT_EQ(Closing("{\"a\":[t"), "rue]}");
  EXPECT_EQ(Closing("{\"a\":fa"), "lse}");
  EXPECT_EQ(Closing("{\"a\":\"x\\"), "n\"}");
  EXPECT_EQ(Closing("{\"a\":\"\\u12"), "00\"}");
  EXPECT_EQ(Closing("{\"a\":\"\\uD"), "000\"}");
  EXPECT_EQ(Closing("{\"a\":\"\\ud83d"), "\\udc00\"}");
  EXPECT_EQ(Closing("{\"a\":\"\\ud83d\\u"), "dc00\"}");
  EXPECT_EQ(Closing("{\"a\":\"\xE2"), "\x80\x80\"}");
  EXPECT_EQ(Closing("{\"a\":\"\xE0"), "\xA0\x80\"}");
  EXPECT_EQ(Closing("{\"a\":\"\xF0"), "\x90\x80\x80\"}");
  EXPECT_EQ(Closing("{\"a\":\"\xF4\x8F"), "\x80\x80\"}");
  EXPECT_EQ(Closing("{}"), "");
  for (const char* t : {"{\"a\":\"\\ud83d", "{\"a\":\"\xE0", "{\"a\":\"\xF0", "{\"a\":1,", "{\"a\":[t"}) {
    EXPECT_TRUE(ParsesAsObject(std::string(t) + Closing(t))) << t;
  }
}

// A random JSON value: objects and arrays (up to `depth`), strings with escapes and
// non-ASCII characters (some outside the BMP: surrogate pairs when ASCII-escaped),
// integers, decimals within the recognizer's number limits, literals.
nlohmann::json RandomValue(Rng& rng, int depth) {
  const int kind = rng.Below(depth > 0 ? 8 : 6);
  auto random_string = [&]() {
    static const char* const kPieces[] = {
        "a", "key", " ", "\"", "\\", "/",   "\n", "\t", "\x01", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80",
        "}", "]",   ",", ":",  "0",  "null"};
    std::string s;
    const int n = rng.Below(6);
    for (int i = 0; i < n; ++i) s += kPieces[rng.Below(static_cast<int>(std::size(kPieces)))];
    return s;
  };
  switch (kind) {
    case 0:
      return random_string();
    case 1:
      return static_cast<int64_t>(rng.Next() >> rng.Below(64)) * (rng.Below(2) ? 1 : -1);
    case 2:
      return (rng.Unit() - 0.5) * std::pow(10.0, rng.Below(30) - 15);
    case 3:
      return rng.Below(2) == 0;
    case 4:
      return nullptr;
    case 5:
      return rng.Below(100);
    case 6: {
      nlohmann::json a = nlohmann::json::array();
      const int n = rng.Below(5);
      for (int i = 0; i < n; ++i) a.push_back(RandomValue(rng, depth - 1));
      return a;
    }
    default: {
      nlohmann::json o = nlohmann::json::object();
      const int n = rng.Below(5);
      for (int i = 0; i < n; ++i) o[random_string()] = RandomValue(rng, depth - 1);
      return o;
    }
  }
}

std::string RandomDocument(Rng& rng) {
  nlohmann::json o = nlohmann::json::object();
  const int n = 1 + rng.Below(4);
  for (int i = 0; i < n; ++i) o[std::string("k").append(std::to_string(i))] = RandomValue(rng, 3);
  const int style = rng.Below(3);
  const std::string lead = rng.Below(3) == 0 ? " \n" : "";
  if (style == 0) return lead + o.dump();
  if (style == 1) return lead + o.dump(-1, ' ', true);  // ASCII: \u escapes, surrogate pairs
  return lead + o.dump(1);                              // indented (whitespace runs <= 5)
}

// Every closing suffix of every truncation of 300 random documents completes a value that
// nlohmann parses as an object; feeding any prefix of the suffix leaves exactly the rest.
TEST(JsonPrefix, ClosingSuffixOfRandomTruncationsParses) {
  Rng rng(20240611);
  int checked = 0;
  for (int doc = 0; doc < 300; ++doc) {
    const std::string d = RandomDocument(rng);
    ASSERT_TRUE(ParsesAsObject(d)) << d;
    JsonPrefix p;
    for (size_t cut = 0; cut <= d.size(); ++cut) {
      if (cut > 0) {
        ASSERT_TRUE(p.Feed(d.substr(cut - 1, 1))) << "refused byte " << cut - 1 << " of " << d;
      }
      const std::string suffix = p.ClosingSuffix();
      const std::string closed = d.substr(0, cut) + suffix;
      ASSERT_TRUE(ParsesAsObject(closed)) << "prefix: " << d.substr(0, cut) << "\nclosed: " << closed;
      ++checked;
      if (cut % 7 == 0) {  // the invariance the budget relies on
        for (size_t k = 0; k <= suffix.size(); ++k) {
          JsonPrefix q = p;
          ASSERT_TRUE(q.Feed(suffix.substr(0, k)));
          ASSERT_EQ(q.ClosingSuffix(), suffix.substr(k));
        }
      }
      if (p.complete()) break;
    }
    EXPECT_TRUE(p.complete()) << d;
  }
  std::printf("closed and parsed %d truncations\n", checked);
}

// Random bytes from a JSON-heavy alphabet: whatever the recognizer accepts closes into a
// value nlohmann parses (soundness on prefixes no document generator would produce).
TEST(JsonPrefix, AcceptedRandomBytesCloseIntoParsableObjects) {
  const std::string alphabet =
      "{}[]\",:  \n0123456789-+.eEtrufalsn\\u\\\"abcdDF/\x01\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xED\xA0";
  Rng rng(7);
  int accepted = 0;
  for (int run = 0; run < 2000; ++run) {
    JsonPrefix p;
    std::string text;
    for (int step = 0; step < 80 && !p.complete(); ++step) {
      std::string chunk;
      const int len = 1 + rng.Below(3);
      for (int i = 0; i < len; ++i)
        chunk.push_back(alphabet[static_cast<size_t>(rng.Below(static_cast<int>(alphabet.size())))]);
      if (rng.Below(4) == 0) chunk = "{\"k\":"[static_cast<size_t>(rng.Below(5))];  // keep some runs going deep
      if (!p.Feed(chunk)) continue;
      text += chunk;
      ++accepted;
      ASSERT_TRUE(ParsesAsObject(text + p.ClosingSuffix())) << text << " + " << p.ClosingSuffix();
    }
  }
  std::printf("accepted %d random chunks\n", accepted);
  EXPECT_GT(accepted, 10000);
}

// ---------------------------------------------------------------------------------------
// Token tables

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string StoriesDir() {
  return std::string(std::getenv("DAISY_MODELS")) + "/stories260K";
}

const Tokenizer& StoriesTokenizer() {
  static const Tokenizer* tok = [] {
    auto src = OpenLocalFolder(StoriesDir());
    EXPECT_TRUE(src.ok()) << src.status().ToString();
    auto t = Tokenizer::Load(**src);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return new Tokenizer(std::move(*t));
  }();
  return *tok;
}

const Tokenizer& Gpt2Tokenizer() {
  static const Tokenizer* tok = [] {
    const std::string dir = std::string(std::getenv("DAISY_TESTDATA")) + "/tokenizers/gpt2";
    auto t = Tokenizer::FromJson(ReadFile(dir + "/tokenizer.json"), ReadFile(dir + "/tokenizer_config.json"));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return new Tokenizer(std::move(*t));
  }();
  return *tok;
}

std::shared_ptr<const JsonTokenTable> StoriesTable() {
  static const auto table = std::make_shared<const JsonTokenTable>(StoriesTokenizer());
  return table;
}

std::shared_ptr<const JsonTokenTable> Gpt2Table() {
  static const auto table = std::make_shared<const JsonTokenTable>(Gpt2Tokenizer());
  return table;
}

// The text `ids` add after `context`, decoded without clean_up_tokenization (GPT-2's config
// turns it on; it only drops spaces before punctuation, never changing whether text is JSON).
std::string DecodedCompletion(const Tokenizer& tok, std::vector<int32_t> context, std::span<const int32_t> ids) {
  const std::string before = tok.Decode(context, true, false);
  context.insert(context.end(), ids.begin(), ids.end());
  const std::string all = tok.Decode(context, true, false);
  EXPECT_EQ(all.compare(0, before.size(), before), 0);
  return all.substr(std::min(before.size(), all.size()));
}

int32_t Id(const Tokenizer& tok, const std::string& piece) {
  auto id = tok.TokenToId(piece);
  EXPECT_TRUE(id.has_value()) << piece;
  return id.value_or(-1);
}

TEST(JsonTokenTable, StoriesBytes) {
  const Tokenizer& tok = StoriesTokenizer();
  const JsonTokenTable& t = *StoriesTable();
  EXPECT_EQ(t.size(), tok.vocab_size());
  EXPECT_EQ(t.bytes(Id(tok, "\xE2\x96\x81the")), " the");  // "▁the": the space is kept
  EXPECT_EQ(t.bytes(Id(tok, "he")), "he");
  EXPECT_EQ(t.bytes(Id(tok, "<0x7B>")), "{");
  EXPECT_EQ(t.bytes(Id(tok, "<0x0A>")), "\n");
  EXPECT_EQ(t.bytes(Id(tok, "<0xE2>")), "\xE2");  // a lone byte: raw, not U+FFFD
  EXPECT_EQ(t.bytes(0), "");                      // <unk>, <s>, </s>: special
  EXPECT_EQ(t.bytes(1), "");
  EXPECT_EQ(t.bytes(2), "");
  EXPECT_EQ(t.bytes(-1), "");
  EXPECT_EQ(t.bytes(t.size()), "");
  // A character from byte tokens: the bytes concatenate to what the tokenizer decodes.
  const std::vector<int32_t> euro = {Id(tok, "<0xE2>"), Id(tok, "<0x82>"), Id(tok, "<0xAC>")};
  EXPECT_EQ(std::string(t.bytes(euro[0])) + std::string(t.bytes(euro[1])) + std::string(t.bytes(euro[2])),
            "\xE2\x82\xAC");
  EXPECT_EQ(DecodedCompletion(tok, *tok.Encode("a", true), euro), "\xE2\x82\xAC");
  EXPECT_EQ(t.TokensFor("}"), 1);
  EXPECT_LE(t.TokensFor("\":null}"), 7);  // byte tokens at worst, one per character
  EXPECT_EQ(t.TokensFor(""), 0);
}

TEST(JsonTokenTable, Gpt2Bytes) {
  const Tokenizer& tok = Gpt2Tokenizer();
  const JsonTokenTable& t = *Gpt2Table();
  EXPECT_EQ(t.bytes(Id(tok, "\xC4\xA0the")), " the");  // "Ġthe"
  EXPECT_EQ(t.bytes(Id(tok, "{\"")), "{\"");
  EXPECT_EQ(t.bytes(Id(tok, "\xC3\xA2")), "\xE2");              // "â": the lone byte 0xE2
  EXPECT_EQ(t.bytes(Id(tok, "\xC3\xA2\xC4\xA2")), "\xE2\x80");  // "âĢ": two bytes of one character
  EXPECT_EQ(t.bytes(Id(tok, "\xC4\x8A")), "\n");                // "Ċ"
  EXPECT_EQ(t.bytes(Id(tok, "<|endoftext|>")), "");
  // Multi-character tokens make closing shorter than one token per byte.
  EXPECT_LT(t.TokensFor("\":null}]}"), 9);
  EXPECT_EQ(t.TokensFor("}"), 1);
}

// Token bytes concatenated are the text the tokenizer decodes, for any id sequence whose
// bytes are complete UTF-8 (what JsonPrefix enforces inside strings).
TEST(JsonTokenTable, BytesConcatenateToTheDecodedText) {
  for (int which = 0; which < 2; ++which) {
    const Tokenizer& tok = which == 0 ? StoriesTokenizer() : Gpt2Tokenizer();
    const JsonTokenTable& t = which == 0 ? *StoriesTable() : *Gpt2Table();
    const std::vector<int32_t> context = *tok.Encode("Once upon a time", true);
    Rng rng(99 + static_cast<uint64_t>(which));
    int compared = 0;
    for (int run = 0; run < 300; ++run) {
      // 12 random ids whose bytes stay well-formed string content (JsonPrefix inside a
      // string checks exactly complete UTF-8, no control bytes, quotes or backslashes)
      std::vector<int32_t> ids;
      std::string bytes;
      JsonPrefix p;
      ASSERT_TRUE(p.Feed("{\"s\":\""));
      for (int tries = 0; ids.size() < 12 && tries < 1000; ++tries) {
        const int32_t id = t.usable_ids()[static_cast<size_t>(rng.Below(static_cast<int>(t.usable_ids().size())))];
        const std::string_view b = t.bytes(id);
        if (b.find_first_of("\"\\") != std::string_view::npos || !p.Feed(b)) continue;
        ids.push_back(id);
        bytes += b;
      }
      if (!p.Feed("\"}")) continue;  // ends inside a character
      EXPECT_EQ(DecodedCompletion(tok, context, ids), bytes);
      ++compared;
    }
    EXPECT_GT(compared, 50);
  }
}

// ---------------------------------------------------------------------------------------
// Constrain / Accept with fake logits (GPT-2 vocabulary)

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Random logits; with `json_bias`, tokens made only of JSON-looking bytes get +6 so that
// the candidates include structure, not just the whole-vocabulary fallback.
std::vector<float> FakeLogits(const JsonTokenTable& t, Rng& rng, bool json_bias) {
  std::vector<float> logits(static_cast<size_t>(t.size()));
  for (int32_t id = 0; id < t.size(); ++id) {
    float v = static_cast<float>(rng.Unit() * 4.0 - 2.0);
    if (json_bias) {
      bool jsonish = !t.bytes(id).empty();
      for (char c : t.bytes(id))
        jsonish = jsonish && std::string_view("{}[]\":, 0123456789.-etrufalsnk\n").find(c) != std::string_view::npos;
      if (jsonish) v += 6.0f;
    }
    logits[static_cast<size_t>(id)] = v;
  }
  return logits;
}

struct RunResult {
  bool complete = false;
  int steps = 0;
  std::string text;
  std::vector<int32_t> ids;
};

RunResult DriveFake(std::shared_ptr<const JsonTokenTable> table, uint64_t seed, float temperature, int max_tokens,
                    bool json_bias) {
  JsonMode mode(table);
  Rng rng(seed);
  SamplingParams sp;
  sp.temperature = temperature;
  sp.seed = seed;
  RunResult r;
  for (int step = 0; step < max_tokens; ++step) {
    std::vector<float> logits = FakeLogits(*table, rng, json_bias);
    const std::vector<float> before = logits;
    mode.Constrain(logits, max_tokens - step);
    int kept = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      EXPECT_TRUE(logits[i] == before[i] || logits[i] == kNegInf);  // lowered to -inf, never raised
      kept += logits[i] != kNegInf;
    }
    EXPECT_GE(kept, 1);
    EXPECT_LE(kept, JsonMode::kTopCandidates);
    const int32_t id = SampleToken(logits, sp, step);
    r.ids.push_back(id);
    ++r.steps;
    if (mode.Accept(id)) break;
    EXPECT_FALSE(mode.failed());
    EXPECT_LE(mode.TokensToClose(), max_tokens - step - 1);  // the budget invariant
  }
  r.complete = mode.complete();
  r.text = mode.text();
  return r;
}

TEST(JsonMode, FakeLogitsGpt2CloseWithin200Steps) {
  const Tokenizer& tok = Gpt2Tokenizer();
  int runs = 0;
  for (uint64_t seed : {1u, 2u, 3u}) {
    for (float temperature : {0.0f, 0.7f, 1.5f}) {
      for (bool bias : {false, true}) {
        const RunResult r = DriveFake(Gpt2Table(), seed, temperature, 200, bias);
        EXPECT_TRUE(r.complete) << "seed " << seed << " T " << temperature << ": " << r.text;
        EXPECT_TRUE(ParsesAsObject(r.text)) << r.text;
        // the text is what the tokenizer decodes for these ids
        EXPECT_EQ(DecodedCompletion(tok, {}, r.ids), r.text);
        if (seed == 1 && bias) std::printf("T %.1f, %d tokens: %s\n", temperature, r.steps, r.text.c_str());
        ++runs;
      }
    }
  }
  EXPECT_EQ(runs, 18);
}

// A tight budget still closes: every max_tokens from 2 (one "{" and one "}" token) up.
TEST(JsonMode, FakeLogitsTightBudgetsClose) {
  for (auto table : {Gpt2Table(), StoriesTable()}) {
    for (int max_tokens : {2, 3, 4, 5, 8, 13, 21, 34}) {
      for (uint64_t seed : {11u, 12u, 13u, 14u}) {
        const RunResult r = DriveFake(table, seed, seed % 2 ? 1.0f : 0.0f, max_tokens, true);
        EXPECT_TRUE(r.complete) << "max_tokens " << max_tokens << " seed " << seed << ": " << r.text;
        EXPECT_LE(r.steps, max_tokens);
        EXPECT_TRUE(ParsesAsObject(r.text)) << r.text;
      }
    }
  }
}

TEST(JsonMode, KeepsAllowedTopCandidatesOnly) {
  const Tokenizer& tok = Gpt2Tokenizer();
  JsonMode mode(Gpt2Table());
  std::vector<float> logits(static_cast<size_t>(Gpt2Table()->size()), 0.0f);
  const int32_t brace = Id(tok, "{"), brace_quote = Id(tok, "{\""), hello = Id(tok, "hello");
  const int32_t space = Id(tok, "\xC4\xA0");  // "Ġ"
  logits[static_cast<size_t>(hello)] = 9;     // the best, not JSON
  logits[static_cast<size_t>(brace)] = 8;
  logits[static_cast<size_t>(brace_quote)] = 7;
  logits[static_cast<size_t>(space)] = 6;
  mode.Constrain(logits, 100);
  EXPECT_EQ(logits[static_cast<size_t>(hello)], kNegInf);
  EXPECT_EQ(logits[static_cast<size_t>(brace)], 8);
  EXPECT_EQ(logits[static_cast<size_t>(brace_quote)], 7);
  EXPECT_EQ(logits[static_cast<size_t>(space)], 6);
  // The 36 other top candidates are zero-logit ids in id order ("!", "\"", "#", ...): none
  // of them starts an object, so they are masked too.
  int kept = 0;
  for (float v : logits) kept += v != kNegInf;
  EXPECT_EQ(kept, 3);
  // None of the top 40 allowed: the best allowed of the whole vocabulary stays alone.
  std::vector<float> l2(logits.size(), -1.0f);
  for (int32_t id = 0; id < JsonMode::kTopCandidates; ++id) l2[static_cast<size_t>(id)] = 1.0f;  // "!" ... "I"
  l2[static_cast<size_t>(brace_quote)] = 0.5f;
  l2[static_cast<size_t>(brace)] = 0.25f;
  mode.Constrain(l2, 100);
  for (size_t i = 0; i < l2.size(); ++i) {
    if (static_cast<int32_t>(i) == brace_quote) {
      EXPECT_EQ(l2[i], 0.5f);
    } else if (l2[i] != kNegInf) {
      ADD_FAILURE() << "kept " << i << " " << tok.IdToPiece(static_cast<int32_t>(i));
    }
  }
  EXPECT_FALSE(mode.Accept(hello));  // a refused token fails the turn
  EXPECT_TRUE(mode.failed());
}

TEST(JsonMode, ForbiddenAndSpecialIdsNeverKept) {
  const Tokenizer& tok = Gpt2Tokenizer();
  JsonMode mode(Gpt2Table());
  const int32_t eot = Id(tok, "<|endoftext|>"), brace = Id(tok, "{");
  mode.Forbid(std::vector<int32_t>{brace});
  std::vector<float> logits(static_cast<size_t>(Gpt2Table()->size()), -1.0f);
  logits[static_cast<size_t>(eot)] = 10;
  logits[static_cast<size_t>(brace)] = 9;
  mode.Constrain(logits, 50);
  EXPECT_EQ(logits[static_cast<size_t>(eot)], kNegInf);
  EXPECT_EQ(logits[static_cast<size_t>(brace)], kNegInf);
  const int32_t pick = ArgMax(logits);
  EXPECT_NE(logits[static_cast<size_t>(pick)], kNegInf);
  EXPECT_NE(pick, eot);
  EXPECT_NE(pick, brace);
  JsonPrefix p;
  EXPECT_TRUE(p.Feed(mode.table().bytes(pick))) << tok.IdToPiece(pick);
}

// ---------------------------------------------------------------------------------------
// The generator on the real stories260K

class StoriesJson : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto src = OpenLocalFolder(StoriesDir());
    ASSERT_TRUE(src.ok()) << src.status().ToString();
    auto info = LoadModelInfo(**src);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    const std::vector<int> split = {info->spec.n_layers};
    auto p = LocalPipeline::Load(**src, *info, split, 256);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    pipeline_ = new LocalPipeline(std::move(*p));
    eos_ = info->spec.eos_ids;
  }
  static void TearDownTestSuite() { delete pipeline_; }

  // Runs the turn with JSON mode installed; checks the text against the tokenizer's
  // decoding and returns (finish reason, text).
  static std::pair<FinishReason, std::string> Run(uint64_t seed, float temperature, int max_tokens) {
    const Tokenizer& tok = StoriesTokenizer();
    const std::vector<int32_t> prompt = *tok.Encode("Tom had a red ball. The answer as JSON:", true);
    Generator gen(pipeline_->head());
    GenerateOptions o;
    o.max_tokens = max_tokens;
    o.sampling.temperature = temperature;
    o.sampling.seed = seed;
    o.stop_ids = eos_;
    auto mode = std::make_shared<JsonMode>(StoriesTable());
    JsonMode::Install(o, mode);
    auto r = gen.Generate(prompt, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return {FinishReason::kLength, ""};
    EXPECT_LE(static_cast<int>(r->ids.size()), max_tokens);
    TextStream stream(tok, prompt);
    for (int32_t id : r->ids) stream.Add(id);
    stream.Finish();
    EXPECT_EQ(stream.Completion(), mode->text());
    EXPECT_FALSE(mode->failed());
    EXPECT_EQ(r->finish_reason == FinishReason::kStop, mode->complete());
    return {r->finish_reason, stream.Completion()};
  }

  static LocalPipeline* pipeline_;
  static std::vector<int32_t> eos_;
};
LocalPipeline* StoriesJson::pipeline_ = nullptr;
std::vector<int32_t> StoriesJson::eos_;

TEST_F(StoriesJson, StopMeansAParsableObject) {
  int stops = 0, runs = 0;
  for (uint64_t seed : {1u, 2u, 3u}) {
    for (float temperature : {0.0f, 0.8f, 1.5f}) {
      for (int max_tokens : {8, 13, 21, 34, 60}) {
        const auto [finish, text] = Run(seed, temperature, max_tokens);
        ++runs;
        if (finish == FinishReason::kStop) {
          ++stops;
          EXPECT_TRUE(ParsesAsObject(text)) << text;
        }
        if (seed == 1 && max_tokens == 60) std::printf("T %.1f: %s\n", temperature, text.c_str());
      }
    }
  }
  std::printf("%d of %d turns stopped on a closed object\n", stops, runs);
}

// max_tokens is never the end of an open value: every turn closes its object in time
// (with 2 tokens or more; stories260K spells "{" and "}" with one byte token each).
TEST_F(StoriesJson, TightMaxTokensStillCloses) {
  for (int max_tokens = 2; max_tokens <= 24; max_tokens += 1) {
    for (uint64_t seed : {5u, 6u}) {
      const auto [finish, text] = Run(seed, seed == 5 ? 0.0f : 1.0f, max_tokens);
      EXPECT_EQ(finish, FinishReason::kStop) << "max_tokens " << max_tokens << ": " << text;
      EXPECT_TRUE(ParsesAsObject(text)) << "max_tokens " << max_tokens << ": " << text;
    }
  }
}

// Reusing the options for a second turn starts the mode afresh.
TEST_F(StoriesJson, OptionsReusedForAnotherTurn) {
  const Tokenizer& tok = StoriesTokenizer();
  const std::vector<int32_t> prompt = *tok.Encode("Lily", true);
  Generator gen(pipeline_->head());
  GenerateOptions o;
  o.max_tokens = 10;
  o.stop_ids = eos_;
  auto mode = std::make_shared<JsonMode>(StoriesTable());
  JsonMode::Install(o, mode);
  auto a = gen.Generate(prompt, o);
  ASSERT_TRUE(a.ok());
  const std::string first = mode->text();
  auto b = gen.Generate(prompt, o);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->ids, b->ids);
  EXPECT_EQ(mode->text(), first);
  EXPECT_TRUE(ParsesAsObject(first)) << first;
  // A smaller max_tokens after a closed object: still a fresh turn.
  o.max_tokens = 4;
  auto c = gen.Generate(prompt, o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->finish_reason, FinishReason::kStop);
  EXPECT_LE(c->ids.size(), 4u);
  EXPECT_TRUE(ParsesAsObject(mode->text())) << mode->text();
}

}  // namespace
}  // namespace daisy
