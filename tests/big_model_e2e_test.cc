// A model bigger than any one device, end to end with real processes on 127.0.0.1: the test
// Hub server, `daisychain serve`, three `node`s and a `run` head, every one with a memory
// budget (--max-memory) too small for the whole model. The ring holds it between them, every
// stage's peak RSS stays within its budget, and Verify re-runs the turn stage by stage on the
// head; a lying stage is still caught that way; budgets too small for any plan are refused,
// with the shortfall named, before a byte of weights is fetched.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "daisy/model.h"
#include "daisy/node.h"
#include "daisy/ring.h"
#include "e2e_util.h"
#include "model_maker.h"
#include "proc_util.h"
#include "test_hub.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;
using e2e::Proc;

constexpr int kCtx = 256;
constexpr uint64_t kBudget = 125ull << 20;  // every device's --max-memory: 125M

class BigModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/daisy_big_models_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    repos_ = tmpl;
    // The SmolLM-135M shape cut to 12 layers (42 MB int8, BF16 file) with the stories
    // tokenizer's 512 ids: with the working memory every device counts, 144 MiB in all.
    modelmaker::MakeOptions o;
    o.tokenizer_dir = e2e::Models() + "/stories260K";
    o.vocab = modelmaker::MakeOptions::kVocabFromTokenizer;
    o.n_layers = 12;
    o.seed = 16;
    ASSERT_TRUE(modelmaker::MakeModel(modelmaker::PresetShape("smollm-135m"), (repos_ / "acme/big").string(), o).ok());
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(repos_, ec);
  }
  void SetUp() override {
    char tmpl[] = "/tmp/daisy_big_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    port_ = e2e::FreePort();
    auto hub = testing::TestHub::Start(repos_.string());
    ASSERT_TRUE(hub.ok()) << hub.status().message();
    hub_ = std::move(*hub);
  }
  void TearDown() override {
    procs_.clear();
    serve_ = Proc();
    hub_.reset();
    if (!HasFailure()) {
      std::error_code ec;
      fs::remove_all(tmp_, ec);
    } else {
      std::fprintf(stderr, "logs kept in %s\n", tmp_.c_str());
    }
  }

  std::vector<std::string> Env(const std::string& home) const {
    return {"DAISY_HOME=" + (tmp_ / home).string(), "HF_ENDPOINT=" + hub_->endpoint()};
  }
  std::string Join() const { return "127.0.0.1:" + std::to_string(port_); }

  // serve (rendezvous only) and three nodes with `budget`; `flip_env` makes node-1 a liar
  // (the test-only daisychain_faulty binary).
  void StartRing(const std::string& budget, const std::string& flip_env = "") {
    serve_ = Proc::Spawn(
        {e2e::Bin(), "serve", "--port", std::to_string(port_), "--auto-approve", "--no-compute", "--name", "serve"},
        Env("serve"), (tmp_ / "serve.log").string());
    for (int i = 1; i <= 3; ++i) {
      const std::string name = "node-" + std::to_string(i);
      auto env = Env(name);
      const bool liar = i == 1 && !flip_env.empty();
      if (liar) env.push_back(flip_env);
      procs_.push_back(Proc::Spawn(
          {liar ? e2e::FaultyBin() : e2e::Bin(), "node", "--join", Join(), "--name", name, "--max-memory", budget}, env,
          (tmp_ / (name + ".log")).string()));
    }
  }
  // `run --json` over 4 stages (the head and the three nodes); the exit code and the object.
  std::pair<int, nlohmann::json> Run(const std::string& budget) {
    const std::string log = (tmp_ / "run.log").string();
    Proc p = Proc::Spawn({e2e::Bin(),         "run",  "--join",       Join(),     "--json",
                          "--name",           "head", "--model",      "acme/big", "--prompt",
                          "Once upon a time", "-n",   "12",           "--ctx",    std::to_string(kCtx),
                          "--stages",         "4",    "--max-memory", budget,     "--verify"},
                         Env("head"), log);
    const int rc = p.Wait(120);
    run_log_ = e2e::ReadAll(log);
    nlohmann::json j;
    const size_t brace = run_log_.rfind("\n{");
    try {
      j = nlohmann::json::parse(brace == std::string::npos ? run_log_ : run_log_.substr(brace + 1));
    } catch (...) {
    }
    return {rc, j};
  }

  static fs::path repos_;
  fs::path tmp_;
  int port_ = 0;
  std::unique_ptr<testing::TestHub> hub_;
  Proc serve_;
  std::vector<Proc> procs_;
  std::string run_log_;
};
fs::path BigModelTest::repos_;

TEST_F(BigModelTest, ThreeNodesHoldWhatNoDeviceCanAndVerifyRunsStageByStage) {
  // No device, the head included, can hold the model alone within its budget.
  auto src = OpenLocalFolder((repos_ / "acme/big").string());
  ASSERT_TRUE(src.ok());
  auto info = LoadModelInfo(**src);
  ASSERT_TRUE(info.ok());
  const PlanModel pm = PlanModelOf(*info, kCtx);
  ASSERT_GT(pm.Need(info->spec.n_layers, /*is_head=*/true), kBudget);
  ASSERT_GT(pm.Need(info->spec.n_layers, /*is_head=*/false), kBudget);

  StartRing("125M");
  auto [rc, j] = Run("125M");
  ASSERT_EQ(rc, 0) << run_log_;
  ASSERT_TRUE(j.is_object()) << run_log_;
  EXPECT_EQ(j["verified"], true) << run_log_;
  EXPECT_EQ(j["verify_mode"], "stage by stage") << run_log_;
  EXPECT_NE(run_log_.find("verifying stage by stage: the whole model"), std::string::npos) << run_log_;
  EXPECT_NE(run_log_.find("VERIFIED"), std::string::npos);
  ASSERT_EQ(j["plan"].size(), 4u) << run_log_;
  for (const auto& s : j["plan"]) {
    const uint64_t peak = s["peak_rss_bytes"], budget = s["budget_bytes"], need = s["need_bytes"];
    EXPECT_EQ(budget, kBudget) << s;
    EXPECT_LE(need, budget) << s;
    EXPECT_GT(peak, 0u) << s;  // reported in ready and after done
    EXPECT_LE(peak, budget) << "stage " << s["device"] << " went over its budget: " << s;
    RecordProperty(s["device"].get<std::string>() + "_peak_rss_bytes", std::to_string(peak));
  }
  EXPECT_GT(j["verify_peak_rss_bytes"].get<uint64_t>(), 0u);
  EXPECT_LE(j["verify_peak_rss_bytes"].get<uint64_t>(), kBudget);
  // The same ids as one device holding everything (no budget).
  auto gen = e2e::RunCli(
      "DAISY_HOME=" + (tmp_ / "gen").string(),
      "generate --model " + (repos_ / "acme/big").string() + " --prompt 'Once upon a time' -n 12 --ctx 256 --json",
      tmp_.string());
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_EQ(j["ids"], nlohmann::json::parse(gen.out)["ids"]);
}

TEST_F(BigModelTest, StageByStageVerifyStillCatchesALyingStage) {
  StartRing("125M", "DAISY_TEST_FLIP_EVERY=1");  // node-1 flips the lowest bit of every hop's output
  auto [rc, j] = Run("125M");
  EXPECT_EQ(rc, 3) << run_log_;
  ASSERT_TRUE(j.is_object()) << run_log_;
  EXPECT_EQ(j["verify_mode"], "stage by stage") << run_log_;
  EXPECT_EQ(j["verified"], false) << run_log_;
  EXPECT_EQ(j["verify_message"].get<std::string>().rfind("MISMATCH: position ", 0), 0u) << run_log_;
}

TEST_F(BigModelTest, BudgetsTooSmallForAnyPlanAreRefusedBeforeAnyDownload) {
  StartRing("109M");
  hub_->ResetCounters();
  auto [rc, j] = Run("110M");
  EXPECT_NE(rc, 0) << run_log_;
  EXPECT_NE(run_log_.find("does not fit in the devices' memory budgets"), std::string::npos) << run_log_;
  EXPECT_NE(run_log_.find("short by"), std::string::npos) << run_log_;
  EXPECT_NE(run_log_.find("stopping before any download"), std::string::npos) << run_log_;
  // The head read config, tokenizer and headers; nobody asked for a byte of weights.
  std::ifstream f(repos_ / "acme/big/model.safetensors", std::ios::binary);
  uint8_t len[8] = {};
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | len[i];
  const uint64_t data_start = 8 + header;
  int header_reads = 0;
  for (const auto& r : hub_->requests()) {
    if (!r.path.ends_with(".safetensors")) continue;  // the index and other files are not weights
    ASSERT_TRUE(r.range.starts_with("bytes=")) << r.path << " read whole";
    const uint64_t from = std::stoull(r.range.substr(6));
    EXPECT_LT(from, data_start) << "a weight range was requested: " << r.range;
    ++header_reads;
  }
  EXPECT_GT(header_reads, 0);  // the head did read the headers from this hub
}

}  // namespace
}  // namespace daisy
