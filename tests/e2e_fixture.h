// The start-up the ring's end-to-end tests share (ring_e2e_test, tab_e2e_test): a model
// made once per suite (the tiny-llama-30 shape with the stories tokenizer: tiny30 under
// models_), a scratch folder and a free port per test, its processes killed after it, and
// its folder removed unless it failed or DAISY_KEEP_LOGS is set (then the folder is named).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "e2e_util.h"
#include "model_maker.h"
#include "proc_util.h"

namespace daisy::e2e {

class RingFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/daisy_e2e_models_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    models_ = tmpl;
    modelmaker::MakeOptions o;
    o.tokenizer_dir = Models() + "/stories260K";
    o.seed = 7;
    ASSERT_TRUE(modelmaker::MakeModel(modelmaker::PresetShape("tiny-llama-30"), (models_ / "tiny30").string(), o).ok());
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(models_, ec);
  }
  void SetUp() override {
    char tmpl[] = "/tmp/daisy_e2e_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    port_ = FreePort();
  }
  void TearDown() override {
    procs_.clear();
    serve_ = Proc();
    if (!HasFailure() && !std::getenv("DAISY_KEEP_LOGS")) {
      std::error_code ec;
      std::filesystem::remove_all(tmp_, ec);
    } else {
      std::fprintf(stderr, "logs kept in %s\n", tmp_.c_str());
    }
  }

  std::string Join() const { return "127.0.0.1:" + std::to_string(port_); }
  // A device's environment: its own DAISY_HOME under the scratch folder, then extra_env_
  // (the whole test's: a test Hub's HF_ENDPOINT) and `extra` (this device's).
  std::vector<std::string> Env(const std::string& home, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> env = {"DAISY_HOME=" + (tmp_ / home).string()};
    env.insert(env.end(), extra_env_.begin(), extra_env_.end());
    env.insert(env.end(), extra.begin(), extra.end());
    return env;
  }
  // `daisychain generate --json`'s ids: what every split must give.
  std::vector<int> GenerateIds(const std::string& model, const std::string& prompt, int n) {
    auto r = RunCli("DAISY_HOME=" + (tmp_ / "gen").string(),
                    "generate --model " + model + " --prompt '" + prompt + "' -n " + std::to_string(n) + " --json",
                    tmp_.string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["ids"].get<std::vector<int>>();
  }
  // The JSON object `run --json` prints last (status lines go to stderr first); null when
  // there is none.
  static nlohmann::json LastJson(const std::string& log) {
    const size_t brace = log.rfind("\n{");
    try {
      return nlohmann::json::parse(brace == std::string::npos ? log : log.substr(brace + 1));
    } catch (...) {
      return nullptr;
    }
  }

  static inline std::filesystem::path models_;
  std::filesystem::path tmp_;
  int port_ = 0;
  Proc serve_;
  std::vector<Proc> procs_;
  std::vector<std::string> extra_env_;
};

}  // namespace daisy::e2e
