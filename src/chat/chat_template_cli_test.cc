// Runs the real `daisychain chat-template` binary ($DAISY_BIN_DIR/apps/cli/daisychain) on
// testdata/chat_templates folders (tokenizer files only: no config.json, no weights) and
// compares every output line with the expected rendering or raised error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "e2e_util.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

std::string TestData() {
  return std::string(std::getenv("DAISY_TESTDATA")) + "/chat_templates";
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

class ChatTemplateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    scratch_ = fs::temp_directory_path() / ("daisy_chat_cli_" + std::to_string(::getpid()));
    fs::create_directories(scratch_);
  }
  void TearDown() override { fs::remove_all(scratch_); }
  fs::path scratch_;
};

// Mistral: rendered rows and rows where the template raises; written to --output.
TEST_F(ChatTemplateCli, MistralFolderMatchesEveryCase) {
  const std::string dir = TestData() + "/mistral-7b-instruct-v0.1";
  const std::string out_file = (scratch_ / "out.jsonl").string();
  auto r = daisy::e2e::RunCli(
      "", "chat-template --model " + dir + " --input-jsonl " + dir + "/cases.jsonl --output " + out_file,
      scratch_.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto expected = Lines(daisy::e2e::ReadAll(dir + "/cases.jsonl"));
  auto got = Lines(daisy::e2e::ReadAll(out_file));
  ASSERT_EQ(got.size(), expected.size());
  int errors = 0;
  for (size_t k = 0; k < expected.size(); ++k) {
    json want = json::parse(expected[k]);
    json have = json::parse(got[k]);
    if (want.contains("error")) {
      ++errors;
      EXPECT_EQ(have.value("error", ""), want["error"].get<std::string>()) << want["id"];
      EXPECT_FALSE(have.contains("rendered"));
    } else {
      EXPECT_EQ(have.value("rendered", ""), want["rendered"].get<std::string>()) << want["id"];
    }
  }
  EXPECT_GT(errors, 0);
}

// Llama 3.2: kwargs (date_string) reach the template; output on stdout.
TEST_F(ChatTemplateCli, Llama32KwargsOnStdout) {
  const std::string dir = TestData() + "/llama-3.2-1b-instruct";
  auto r = daisy::e2e::RunCli("", "chat-template --model " + dir + " --input-jsonl " + dir + "/cases.jsonl",
                              scratch_.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto expected = Lines(daisy::e2e::ReadAll(dir + "/cases.jsonl"));
  auto got = Lines(r.out);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t k = 0; k < expected.size(); ++k) {
    json want = json::parse(expected[k]);
    EXPECT_EQ(json::parse(got[k]).value("rendered", "<none>"), want["rendered"].get<std::string>()) << want["id"];
  }
}

// A malformed line gives {"error": "line N: ..."} and the run goes on.
TEST_F(ChatTemplateCli, MalformedLinesAreReportedNotFatal) {
  const std::string in = (scratch_ / "in.jsonl").string();
  std::ofstream(in) << "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"add_generation_prompt\": true}\n"
                    << "not json\n"
                    << "{\"messages\": 3}\n"
                    << "\n"
                    << "{\"messages\": [], \"add_generation_prompt\": \"yes\"}\n"
                    << "{\"messages\": [{\"role\": \"user\", \"content\": \"Yo\"}], \"kwargs\": []}\n";
  auto r = daisy::e2e::RunCli("", "chat-template --model " + TestData() + "/smollm2-135m-instruct --input-jsonl " + in,
                              scratch_.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto got = Lines(r.out);
  ASSERT_EQ(got.size(), 5u) << r.out;
  EXPECT_EQ(json::parse(got[0])["rendered"],
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(json::parse(got[1])["error"].get<std::string>().rfind("line 2: ", 0), 0u) << got[1];
  EXPECT_EQ(json::parse(got[2])["error"].get<std::string>().rfind("line 3: ", 0), 0u) << got[2];
  EXPECT_EQ(json::parse(got[3])["error"].get<std::string>().rfind("line 5: ", 0), 0u) << got[3];
  EXPECT_EQ(json::parse(got[4])["error"].get<std::string>().rfind("line 6: ", 0), 0u) << got[4];
}

TEST_F(ChatTemplateCli, FolderWithoutTemplateFails) {
  const std::string in = (scratch_ / "in.jsonl").string();
  std::ofstream(in) << "{\"messages\": []}\n";
  auto r =
      daisy::e2e::RunCli("", "chat-template --model " + scratch_.string() + " --input-jsonl " + in, scratch_.string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no chat template"), std::string::npos) << r.err;
}

TEST_F(ChatTemplateCli, Help) {
  auto r = daisy::e2e::RunCli("", "chat-template --help", scratch_.string());
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--input-jsonl"), std::string::npos);
}

}  // namespace
