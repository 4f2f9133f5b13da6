// Conformance: the six real tokenizers of testdata/tokenizers against 414 expected encodings
// each (made with transformers.js and checked against the Rust `tokenizers` library; where a
// row has hf_ids / hf_ids_special those are the Rust library's answer and win). Also
// decode(encode(s)) == s for the byte-level tokenizers (NFC(s) for qwen3, which normalizes).
#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "daisy/source.h"
#include "daisy/tokenizer.h"

namespace daisy {
namespace {

using nlohmann::json;

std::string TestData() {
  const char* d = std::getenv("DAISY_TESTDATA");
  return d ? d : "testdata";
}

std::vector<json> ReadCases(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) cases.push_back(json::parse(line));
  }
  return cases;
}

std::string Nfc(const std::string& s) {
  utf8proc_uint8_t* out = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                        &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return s;
  std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

std::string Show(const std::vector<int32_t>& v) {
  return json(v).dump();
}

struct Family {
  const char* name;
  bool byte_level;
  bool nfc;
};

class TokenizerConformance : public ::testing::TestWithParam<Family> {};

TEST_P(TokenizerConformance, AllCasesMatch) {
  const Family f = GetParam();
  const std::string dir = TestData() + "/tokenizers/" + f.name;
  auto src = OpenLocalFolder(dir);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  auto tk = Tokenizer::Load(**src);
  ASSERT_TRUE(tk.ok()) << tk.status().ToString();
  auto cases = ReadCases(dir + "/cases.jsonl");
  ASSERT_EQ(cases.size(), 414u) << dir;

  int ok_ids = 0, ok_special = 0, ok_decoded = 0, ok_raw = 0, ok_roundtrip = 0;
  int reported = 0, hf_rows = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const std::string name = c.value("id", std::string("?"));
    auto want_ids =
        c.contains("hf_ids") ? c["hf_ids"].get<std::vector<int32_t>>() : c["ids"].get<std::vector<int32_t>>();
    auto want_special = c.contains("hf_ids_special") ? c["hf_ids_special"].get<std::vector<int32_t>>()
                                                     : c["ids_special"].get<std::vector<int32_t>>();
    auto ids = tk->Encode(text, false);
    auto ids_special = tk->Encode(text, true);
    ASSERT_TRUE(ids.ok() && ids_special.ok()) << name;
    std::string decoded = tk->Decode(*ids, false);
    std::string decoded_raw = tk->Decode(*ids, false, false);
    bool a = *ids == want_ids, b = *ids_special == want_special;
    bool d = decoded == c["decoded"].get<std::string>(), r = decoded_raw == c["decoded_raw"].get<std::string>();
    ok_ids += a, ok_special += b, ok_decoded += d, ok_raw += r;
    // Rows with hf_ids record a transformers.js bug in `ids`: the Rust answer must differ.
    if (c.contains("hf_ids") && c["hf_ids"] != c["ids"]) {
      EXPECT_NE(*ids, c["ids"].get<std::vector<int32_t>>()) << name << ": matched the transformers.js bug";
      ++hf_rows;
    }
    bool rt = true;
    if (f.byte_level) {  // decode(encode(s)) == s
      std::string want = f.nfc ? Nfc(text) : text;
      rt = decoded_raw == want;
      ok_roundtrip += rt;
    }
    if ((!a || !b || !d || !r || !rt) && reported++ < 8) {
      ADD_FAILURE() << f.name << " " << name << " text=" << json(text).dump() << "\n  ids  got " << Show(*ids)
                    << "\n       want " << Show(want_ids) << "\n  special got " << Show(*ids_special) << " want "
                    << Show(want_special) << "\n  decoded got " << json(decoded).dump() << " want "
                    << c["decoded"].dump() << "\n  raw got " << json(decoded_raw).dump() << " want "
                    << c["decoded_raw"].dump();
    }
  }
  std::printf("%s: ids %d/414, ids_special %d/414, decoded %d/414, decoded_raw %d/414", f.name, ok_ids, ok_special,
              ok_decoded, ok_raw);
  if (f.byte_level) std::printf(", roundtrip %d/414", ok_roundtrip);
  if (hf_rows) std::printf(", %d rows where the Rust library differs from transformers.js", hf_rows);
  std::printf("\n");
  EXPECT_EQ(ok_ids, 414);
  EXPECT_EQ(ok_special, 414);
  EXPECT_EQ(ok_decoded, 414);
  EXPECT_EQ(ok_raw, 414);
  if (f.byte_level) {
    EXPECT_EQ(ok_roundtrip, 414);
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, TokenizerConformance,
                         ::testing::Values(Family{"gpt2", true, false}, Family{"smollm", true, false},
                                           Family{"qwen3", true, true}, Family{"llama3", true, false},
                                           Family{"mistral", false, false}, Family{"phi3", false, false}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace daisy
