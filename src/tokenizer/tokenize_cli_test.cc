// Runs the real `daisychain tokenize` binary ($DAISY_BIN_DIR/apps/cli/daisychain): the
// stories260K example, --help, a folder holding only the tokenizer files, a refused
// tokenizer, and --input-jsonl over every conformance case of the six tokenizers.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Env(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v ? v : dflt;
}

std::string Binary() {
  return Env("DAISY_BIN_DIR", ".") + "/apps/cli/daisychain";
}

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

struct RunResult {
  int code = -1;
  std::string out;
};

// Runs the binary with `args` (already quoted), stderr merged into stdout.
RunResult Daisychain(const std::string& args) {
  RunResult r;
  std::string cmd = Quote(Binary()) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class TokenizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(Binary())) << Binary() << " is missing: build the daisychain target first";
  }
};

TEST_F(TokenizeCli, StoriesExamplePrintsIdsAndPieces) {
  RunResult r =
      Daisychain("tokenize --model " + Quote(Env("DAISY_MODELS", "models") + "/stories260K") + " 'Once upon a time'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[1, 403, 407, 261, 378]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"\xE2\x96\x81Once\""), std::string::npos) << r.out;
  RunResult j = Daisychain("tokenize --json --model " + Quote(Env("DAISY_MODELS", "models") + "/stories260K") +
                           " 'Once upon a time'");
  ASSERT_EQ(j.code, 0) << j.out;
  json parsed = json::parse(j.out);
  EXPECT_EQ(parsed["ids"], json({1, 403, 407, 261, 378}));
  EXPECT_EQ(parsed["pieces"][0], "<s>");
}

TEST_F(TokenizeCli, HelpAndErrors) {
  RunResult h = Daisychain("tokenize --help");
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("--input-jsonl"), std::string::npos) << h.out;
  RunResult none = Daisychain("tokenize --model " + Quote(Env("DAISY_MODELS", "models") + "/stories260K"));
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.out.find("TEXT"), std::string::npos) << none.out;
}

TEST_F(TokenizeCli, FolderWithOnlyTokenizerFilesAndRefusal) {
  fs::path dir = fs::temp_directory_path() / ("daisy_tok_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir / "ok");
  fs::create_directories(dir / "refused");
  const std::string stories = Env("DAISY_MODELS", "models") + "/stories260K";
  fs::copy_file(stories + "/tokenizer.json", dir / "ok" / "tokenizer.json");
  fs::copy_file(stories + "/tokenizer_config.json", dir / "ok" / "tokenizer_config.json");
  fs::copy_file(Env("DAISY_TESTDATA", "testdata") + "/tokenizers/refused/unigram.json",
                dir / "refused" / "tokenizer.json");
  RunResult ok = Daisychain("tokenize --model " + Quote((dir / "ok").string()) + " 'Once upon a time'");
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("[1, 403, 407, 261, 378]"), std::string::npos) << ok.out;
  RunResult bad = Daisychain("tokenize --model " + Quote((dir / "refused").string()) + " 'x'");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("tokenizer model 'Unigram' is not supported"), std::string::npos) << bad.out;
  fs::remove_all(dir);
}

class TokenizeCliJsonl : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizeCliJsonl, MatchesEveryCase) {
  ASSERT_TRUE(fs::exists(Binary())) << Binary() << " is missing: build the daisychain target first";
  const std::string dir = Env("DAISY_TESTDATA", "testdata") + std::string("/tokenizers/") + GetParam();
  RunResult r = Daisychain("tokenize --model " + Quote(dir) + " --input-jsonl " + Quote(dir + "/cases.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out.substr(0, 2000);
  std::ifstream in(dir + "/cases.jsonl");
  std::istringstream got(r.out);
  std::string want_line, got_line;
  int n = 0, mismatches = 0;
  while (std::getline(in, want_line)) {
    if (want_line.empty()) continue;
    ASSERT_TRUE(std::getline(got, got_line)) << "output ended after " << n << " lines";
    json w = json::parse(want_line), g = json::parse(got_line);
    const json& ids = w.contains("hf_ids") ? w["hf_ids"] : w["ids"];
    const json& ids_special = w.contains("hf_ids_special") ? w["hf_ids_special"] : w["ids_special"];
    bool same = g["ids"] == ids && g["ids_special"] == ids_special && g["decoded"] == w["decoded"] &&
                g["decoded_raw"] == w["decoded_raw"];
    if (!same && mismatches++ < 5) ADD_FAILURE() << w["id"] << ": got " << got_line << "\nwant " << want_line;
    ++n;
  }
  EXPECT_EQ(n, 414);
  EXPECT_EQ(mismatches, 0);
  EXPECT_FALSE(std::getline(got, got_line)) << "extra output: " << got_line;
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, TokenizeCliJsonl,
                         ::testing::Values("gpt2", "smollm", "qwen3", "llama3", "mistral", "phi3"));

}  // namespace
