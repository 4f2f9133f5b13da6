// Loading without the spike: `daisychain generate --json`, run as a real process, must stay
// within the memory it reports as its budget (peak_rss_bytes <= rss_budget_bytes = weights
// as held + KV cache + 64 MiB, docs/FORWARD.md "Loading"). The models are written here by
// the model maker with Qwen2's 151936-row vocabulary and hidden 256, so the embedding is
// nearly all of the model: a loader that widens it to f32, keeps the file's bytes whole or
// holds an extra copy overshoots the 64 MiB by hundreds of MB, in BF16 and in F32.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model_maker.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;

std::string Binary() {
  return std::string(std::getenv("DAISY_BIN_DIR")) + "/apps/cli/daisychain";
}
std::string Stories() {
  return std::string(std::getenv("DAISY_MODELS")) + "/stories260K";
}

struct ChildRun {
  int exit_code = -1;
  uint64_t max_rss_bytes = 0;  // the child's ru_maxrss, measured by the parent
  std::string out;
};

// Runs the binary with args, stdout to a file; the parent's wait4 gives the child's peak RSS
// independently of what the child reports (a hang is ended by the CTest timeout).
ChildRun RunBinary(const std::vector<std::string>& args, const fs::path& out_file) {
  std::vector<std::string> full = {Binary()};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  ChildRun r;
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!std::freopen(out_file.c_str(), "w", stdout)) ::_exit(126);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage ru {};
  ::wait4(pid, &status, 0, &ru);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.max_rss_bytes = static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux: KiB
  std::ifstream f(out_file);
  std::stringstream ss;
  ss << f.rdbuf();
  r.out = ss.str();
  return r;
}

class LoadMemory : public ::testing::TestWithParam<modelmaker::WeightDType> {};

TEST_P(LoadMemory, GeneratePeakRssStaysWithinTheBudget) {
  ASSERT_TRUE(fs::exists(Binary())) << Binary() << " is missing: build the daisychain target first";
  const bool bf16 = GetParam() != modelmaker::WeightDType::kF32;  // BF16 or F16: 2 bytes a value
  const char* tag = GetParam() == modelmaker::WeightDType::kBF16  ? "bf16_"
                    : GetParam() == modelmaker::WeightDType::kF16 ? "f16_"
                                                                  : "f32_";
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("daisy_load_memory_" + std::string(tag) + std::to_string(::getpid()));
  // Qwen2 with hidden 256: embedding 151936 x 256 (38.9M values, tied), two small layers.
  modelmaker::ModelShape shape = modelmaker::PresetShape("qwen2.5-0.5b");
  shape.hidden = 256, shape.intermediate = 512, shape.n_heads = 4, shape.n_kv_heads = 2, shape.head_dim = 64;
  modelmaker::MakeOptions o;
  o.n_layers = 2;
  o.dtype = GetParam();
  o.tokenizer_dir = Stories();  // a small tokenizer: ids it lacks decode to nothing
  const Status made = modelmaker::MakeModel(shape, (dir / "model").string(), o);
  ASSERT_TRUE(made.ok()) << made.ToString();

  const ChildRun r = RunBinary({"generate", "--model", (dir / "model").string(), "--prompt", "Once upon a time", "-n",
                                "16", "--ctx", "256", "--json"},
                               dir / "out.json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const uint64_t peak = j["peak_rss_bytes"], budget = j["rss_budget_bytes"];
  const uint64_t weights = j["weight_bytes"], embedding = j["embedding_bytes"], kv = j["kv_cache_bytes"];
  RecordProperty("peak_rss_bytes", std::to_string(peak));
  RecordProperty("rss_budget_bytes", std::to_string(budget));
  // The budget is what it says: weights as held (embedding included) + KV cache + 64 MiB.
  EXPECT_EQ(budget, weights + kv + (64ull << 20));
  EXPECT_EQ(embedding, (bf16 ? 2u : 4u) * 151936u * 256u);  // held at the file's width
  EXPECT_GT(weights, embedding + 151936u * 256u);           // + the int8 LM head (tied)
  EXPECT_GT(peak, weights);
  EXPECT_LE(peak, budget) << "peak RSS " << peak / 1e6 << " MB over the budget " << budget / 1e6 << " MB (weights "
                          << weights / 1e6 << " MB, KV " << kv / 1e6 << " MB)";
  // The parent's own measurement of the child agrees.
  EXPECT_LE(r.max_rss_bytes, budget) << "ru_maxrss " << r.max_rss_bytes / 1e6 << " MB";
  if (!HasFailure()) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
}

INSTANTIATE_TEST_SUITE_P(forward, LoadMemory,
                         ::testing::Values(modelmaker::WeightDType::kBF16, modelmaker::WeightDType::kF32,
                                           modelmaker::WeightDType::kF16),
                         [](const auto& info) {
                           return std::string(info.param == modelmaker::WeightDType::kBF16  ? "BF16"
                                              : info.param == modelmaker::WeightDType::kF16 ? "F16"
                                                                                            : "F32");
                         });

}  // namespace
}  // namespace daisy
