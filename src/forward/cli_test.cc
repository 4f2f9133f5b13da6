// The generate, eval and bench commands, run as a user would: the daisychain binary from
// the build tree ($DAISY_BIN_DIR/apps/cli/daisychain) on the bundled stories260K.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "daisy/forward.h"
#include "daisy/model.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;

// Paths from the environment every test binary gets (tests/test_env.cc).
std::string Binary() {
  return std::string(std::getenv("DAISY_BIN_DIR")) + "/apps/cli/daisychain";
}
std::string Stories() {
  return std::string(std::getenv("DAISY_MODELS")) + "/stories260K";
}

struct Output {
  int exit_code = -1;
  std::string out;
};

// Runs a shell command line, capturing stdout (stderr goes to the test log). A command
// that hangs is killed after two minutes and fails the test instead of stalling ctest.
Output RunCommand(const std::string& cmd) {
  Output o;
  FILE* p = popen(("timeout 120 " + cmd).c_str(), "r");
  if (!p) return o;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) o.out.append(buf.data(), n);
  const int st = pclose(p);
  o.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(Binary())) << Binary() << " is missing: build the daisychain target first";
    ASSERT_TRUE(fs::exists(Stories() + "/config.json")) << Stories();
  }
};

TEST_F(Cli, GenerateJsonTellsAStory) {
  const Output r =
      RunCommand(Binary() + " generate --model " + Stories() + " --prompt \"Once upon a time\" -n 60 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"], nlohmann::json({1, 403, 407, 261, 378}));
  ASSERT_TRUE(j["ids"].is_array());
  EXPECT_EQ(j["ids"].size(), 60u);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_FALSE(j["backend"].get<std::string>().empty());
  EXPECT_GT(j["prefill_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["decode_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["peak_memory_bytes"].get<double>(), 0);
  const std::string text = j["text"];
  ASSERT_EQ(text.rfind("Once upon a time", 0), 0u) << text;
  // A story: many words of letters, sentences ending with a period.
  std::istringstream words(text);
  int n_words = 0, alpha_words = 0;
  for (std::string w; words >> w; ++n_words) alpha_words += std::isalpha(static_cast<unsigned char>(w[0])) != 0;
  EXPECT_GE(n_words, 30) << text;
  EXPECT_GE(alpha_words, n_words * 9 / 10) << text;
  EXPECT_NE(text.find(". "), std::string::npos) << text;
  EXPECT_EQ(text, "Once upon a time" + j["completion"].get<std::string>());
}

TEST_F(Cli, GenerateStreamsTheSameText) {
  const Output js = RunCommand(Binary() + " generate --model " + Stories() + " --prompt \"Lily and Ben\" -n 40 --json");
  const Output plain =
      RunCommand(Binary() + " generate --model " + Stories() + " --prompt \"Lily and Ben\" -n 40 2>/dev/null");
  ASSERT_EQ(js.exit_code, 0);
  ASSERT_EQ(plain.exit_code, 0);
  EXPECT_EQ(plain.out, nlohmann::json::parse(js.out)["text"].get<std::string>() + "\n");
}

TEST_F(Cli, GenerateStopsOnAStopId) {
  const Output a =
      RunCommand(Binary() + " generate --model " + Stories() + " --prompt \"Once upon a time\" -n 20 --json");
  ASSERT_EQ(a.exit_code, 0);
  const auto ids = nlohmann::json::parse(a.out)["ids"].get<std::vector<int>>();
  const Output b = RunCommand(Binary() + " generate --model " + Stories() +
                              " --prompt \"Once upon a time\" -n 20 --json --stop-id " + std::to_string(ids[3]));
  ASSERT_EQ(b.exit_code, 0);
  const nlohmann::json j = nlohmann::json::parse(b.out);
  EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_EQ(j["stop_id"], ids[3]);
  // Refused settings fail with a message, not a crash.
  const Output c = RunCommand(Binary() + " generate --model " + Stories() + " --prompt x --temperature -1 2>&1");
  EXPECT_NE(c.exit_code, 0);
  EXPECT_NE(c.out.find("temperature"), std::string::npos) << c.out;
}

TEST_F(Cli, EvalDumpsTheEnginesLogits) {
  std::ifstream f(Stories() + "/reference/logits.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  const std::vector<int32_t> ids = ref["token_ids"].get<std::vector<int32_t>>();
  const fs::path dir = fs::path(::testing::TempDir()) / ("daisy_eval_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "ids.json") << nlohmann::json(ids).dump();
  const Output r = RunCommand(Binary() + " eval --model " + Stories() + " --ids-file " + (dir / "ids.json").string() +
                              " --json --chunk 16 --dump-logits " + (dir / "logits.bin").string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["positions"], 63);
  EXPECT_EQ(j["top1"].size(), 63u);
  EXPECT_GT(j["mean_nll"].get<double>(), 0.0);
  EXPECT_LT(j["mean_nll"].get<double>(), 3.0);  // a trained model on its own kind of text
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(j["mean_nll"].get<double>()), 1e-9);
  // The dump is [63, 512] float32 and equals the in-process forward pass bit for bit.
  std::ifstream bin(dir / "logits.bin", std::ios::binary);
  std::vector<float> dumped(63 * 512);
  bin.read(reinterpret_cast<char*>(dumped.data()), static_cast<std::streamsize>(dumped.size() * 4));
  ASSERT_EQ(bin.gcount(), static_cast<std::streamsize>(dumped.size() * 4));
  EXPECT_EQ(bin.peek(), std::char_traits<char>::eof());
  auto src = OpenLocalFolder(Stories());
  ASSERT_TRUE(src.ok());
  auto info = LoadModelInfo(**src);
  ASSERT_TRUE(info.ok());
  auto p = LocalPipeline::Load(**src, *info, std::vector<int>{5}, 512);
  ASSERT_TRUE(p.ok());
  auto want = p->head().ForwardAll(std::span<const int32_t>(ids).subspan(0, 63), 0);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(std::memcmp(want->data(), dumped.data(), dumped.size() * 4), 0);
  for (size_t i = 0; i < 63; ++i) {
    const float* row = &(*want)[i * 512];
    EXPECT_EQ(j["top1"][i].get<int>(), std::max_element(row, row + 512) - row);
  }
  fs::remove_all(dir);
}

// The accuracy report: blocks of 128 positions against the float64 reference, the
// attention statistics, and a reference whose log-probability file is cut short refused
// with the sizes named.
TEST_F(Cli, EvalReportsAccuracyAgainstAFloat64Reference) {
  const fs::path ref = fs::path(std::getenv("DAISY_TESTDATA")) / "reference" / "stories260K" / "greedy_little_dog.json";
  const Output r = RunCommand(Binary() + " eval --model " + Stories() + " --reference " + ref.string() +
                              " --attention-stats --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["positions"], 201);
  ASSERT_EQ(j["blocks"].size(), 2u);
  EXPECT_EQ(j["blocks"][0]["begin"], 0);
  EXPECT_EQ(j["blocks"][0]["end"], 128);
  EXPECT_EQ(j["blocks"][1]["end"], 201);
  for (const auto& b : j["blocks"]) {
    EXPECT_GT(b["mean_kl"].get<double>(), 0.0);  // int8: never exactly float64
    EXPECT_LE(b["mean_kl"].get<double>(), 1e-3);
    EXPECT_GE(b["top1_agreement"].get<double>(), 0.9);
  }
  EXPECT_EQ(j["attention"]["rows"], 201 * 5 * 8);
  EXPECT_LE(j["attention"]["flushed_mean"].get<double>(), 2e-4);
  // The text form prints one line per block.
  const Output t = RunCommand(Binary() + " eval --model " + Stories() + " --reference " + ref.string());
  ASSERT_EQ(t.exit_code, 0) << t.out;
  EXPECT_NE(t.out.find("   0-127 "), std::string::npos) << t.out;
  EXPECT_NE(t.out.find(" 128-200 "), std::string::npos) << t.out;

  const fs::path dir = fs::path(::testing::TempDir()) / ("daisy_eval_ref_" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::copy_file(ref, dir / "r.json");
  std::ofstream(dir / "greedy_little_dog.logprob.f32", std::ios::binary) << std::string(100, '\0');
  const Output bad =
      RunCommand(Binary() + " eval --model " + Stories() + " --reference " + (dir / "r.json").string() + " 2>&1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("100 bytes, expected 411648"), std::string::npos) << bad.out;
  fs::remove_all(dir);
}

TEST_F(Cli, BenchReportsThroughput) {
  const Output r = RunCommand(Binary() + " bench --json --kernel-seconds 0.02 --prompt-tokens 32 --decode-tokens 16");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["kernels"].is_array());
  ASSERT_FALSE(j["kernels"].empty());
  for (const auto& k : j["kernels"]) {
    EXPECT_GT(k["gemv_gops"].get<double>(), 0) << k.dump();
    EXPECT_GT(k["gemm_gops"].get<double>(), 0) << k.dump();
  }
  EXPECT_EQ(j["prefill_tokens"], 32);
  EXPECT_EQ(j["decode_tokens"], 15);  // the first token comes from the prefill's logits
  EXPECT_GT(j["prefill_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["decode_tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(j["probe_hash"].get<std::string>().size(), 16u);
  EXPECT_GT(j["peak_memory_bytes"].get<double>(), 0);
  // Issue 13, item 8: the figures under their names, consistent with each other.
  for (const char* k :
       {"read_bandwidth_gbps", "decode_bytes_per_token", "decode_bandwidth_ratio", "gemm_gops",
        "prefill512_tokens_per_s", "prefill_kernel_ratio", "model_gemm_gops", "prefill_model_gemm_ratio",
        "peak_rss_bytes", "rss_budget_bytes", "read_bandwidth_median_gbps", "read_bandwidth_passes",
        "decode_bandwidth_median_ratio", "prefill512_first_run_tokens_per_s"}) {
    ASSERT_TRUE(j.contains(k) && j[k].is_number()) << k << " missing from " << r.out;
    EXPECT_GT(j[k].get<double>(), 0) << k;
  }
  const double ceiling = j["read_bandwidth_gbps"].get<double>() * 1e9 / j["decode_bytes_per_token"].get<double>();
  EXPECT_NEAR(j["decode_bandwidth_ratio"].get<double>(), j["decode_tokens_per_s"].get<double>() / ceiling,
              1e-9 * j["decode_bandwidth_ratio"].get<double>() + 1e-12);
  // The decode ran in 3 rounds, each against the bandwidth measured around it; the figures
  // are the round whose ratio is the median.
  const auto& rounds = j["decode_rounds"];
  ASSERT_TRUE(rounds.is_array() && rounds.size() == 3) << r.out;
  std::vector<double> ratios;
  bool listed = false;
  for (const auto& round : rounds) {
    const double tps = round["decode_tokens_per_s"].get<double>(), gbps = round["read_bandwidth_gbps"].get<double>();
    ASSERT_GT(gbps, 0);
    EXPECT_NEAR(round["decode_bandwidth_ratio"].get<double>(),
                tps / (gbps * 1e9 / j["decode_bytes_per_token"].get<double>()), 1e-9 * tps + 1e-12);
    ratios.push_back(round["decode_bandwidth_ratio"].get<double>());
    listed =
        listed || (tps == j["decode_tokens_per_s"].get<double>() && gbps == j["read_bandwidth_gbps"].get<double>());
  }
  EXPECT_TRUE(listed) << "the reported decode is none of the rounds: " << r.out;
  std::sort(ratios.begin(), ratios.end());
  EXPECT_EQ(j["decode_bandwidth_ratio"].get<double>(), ratios[1]) << r.out;
  // The median pass is one of the passes of the best pass's kind, so never faster than it;
  // the ratio against it is the same decode over that ceiling.
  EXPECT_LE(j["read_bandwidth_median_gbps"].get<double>(), j["read_bandwidth_gbps"].get<double>());
  EXPECT_GE(j["read_bandwidth_passes"].get<int>(), 6);  // the measurement's floor: 6 passes
  const double median_ceiling =
      j["read_bandwidth_median_gbps"].get<double>() * 1e9 / j["decode_bytes_per_token"].get<double>();
  EXPECT_NEAR(j["decode_bandwidth_median_ratio"].get<double>(), j["decode_tokens_per_s"].get<double>() / median_ceiling,
              1e-9 * j["decode_bandwidth_median_ratio"].get<double>() + 1e-12);
  EXPECT_NEAR(j["prefill_model_gemm_ratio"].get<double>(),
              j["prefill512_gops"].get<double>() / j["model_gemm_gops"].get<double>(),
              1e-9 * j["prefill_model_gemm_ratio"].get<double>() + 1e-12);
  // stories260K: the budget is its weights + KV cache + 64 MiB
  EXPECT_EQ(j["rss_budget_bytes"].get<uint64_t>(),
            j["weight_bytes"].get<uint64_t>() + j["kv_cache_bytes"].get<uint64_t>() + (uint64_t{64} << 20));
  // The large pages under the process now: a count of bytes, at most its peak (stories260K's
  // matrices are below the 64 KiB that large-page memory starts at, so it may be 0 here).
  ASSERT_TRUE(j["large_page_bytes"].is_number_unsigned()) << r.out;
  EXPECT_LE(j["large_page_bytes"].get<uint64_t>(), j["peak_memory_bytes"].get<uint64_t>());
  const auto& choice = j["backend_choice"];
  ASSERT_TRUE(choice.is_object()) << r.out;
  for (const char* shape : {"gemv", "gemm", "attention"}) {
    ASSERT_TRUE(choice.contains(shape)) << shape;
    const std::string b = choice[shape].get<std::string>();
    bool listed = false;  // a backend whose kernels were measured, i.e. one that passed its gate
    for (const auto& k : j["kernels"]) listed = listed || k["backend"] == b;
    EXPECT_TRUE(listed) << shape << " uses " << b;
  }
  EXPECT_EQ(j["backend"], choice["gemv"]);
  // A layer's time by phase: every phase of every layer run timed, and the phases of a run
  // are parts of the generation's own time (decode: from the first decode step on, one row
  // per run; prefill: one run per layer over the whole batch).
  const int layers = j["layers"].get<int>();
  for (const char* which : {"decode_phases", "prefill512_phases"}) {
    const auto& p = j[which];
    ASSERT_TRUE(p.is_object() && p["layer_us"].is_object()) << which << " missing from " << r.out;
    const int64_t runs = p["layer_runs"].get<int64_t>(), rows = p["rows"].get<int64_t>();
    const std::string decode = "decode_phases";
    if (which == decode) {
      EXPECT_EQ(runs, int64_t{15} * layers) << "one run per layer of each of the 15 decode steps";
      EXPECT_EQ(rows, runs);
    } else {
      EXPECT_EQ(runs, layers);
      EXPECT_EQ(rows, int64_t{j["prefill512_tokens"].get<int>()} * layers);
    }
    ASSERT_EQ(p["layer_us"].size(), 10u) << p.dump();
    double sum_us = 0;
    for (const char* phase : {"attention_norm", "qkv", "rope_and_cache", "attention", "output", "mlp_norm", "gate_up",
                              "activation", "down", "residual"}) {
      ASSERT_TRUE(p["layer_us"].contains(phase)) << which << " " << phase;
      const double us = p["layer_us"][phase].get<double>();
      EXPECT_GT(us, 0) << which << " " << phase;
      sum_us += us;
    }
    EXPECT_LE(sum_us * static_cast<double>(runs), 1e6 * p["seconds"].get<double>() * (1 + 1e-9)) << p.dump();
  }
  // The decode's weight products: their share of a layer's decode time and the rate they read
  // their matrices at, from those phases, and that rate against the ceiling.
  const auto& us = j["decode_phases"]["layer_us"];
  double all_us = 0;
  for (const auto& [phase, v] : us.items()) all_us += v.get<double>();
  const double products_us =
      us["qkv"].get<double>() + us["output"].get<double>() + us["gate_up"].get<double>() + us["down"].get<double>();
  for (const char* k :
       {"decode_products_share", "decode_products_gbps", "decode_products_ratio", "decode_products_layer_bytes"})
    ASSERT_TRUE(j.contains(k) && j[k].is_number() && j[k].get<double>() > 0) << k << " missing from " << r.out;
  EXPECT_NEAR(j["decode_products_share"].get<double>(), products_us / all_us, 1e-9);
  const double layer_bytes = j["decode_products_layer_bytes"].get<double>();
  {  // the four matrices of a layer (int8 rows, second terms, scales, biases), on average
    auto src = OpenLocalFolder(Stories());
    ASSERT_TRUE(src.ok());
    auto info = LoadModelInfo(**src);
    ASSERT_TRUE(info.ok());
    auto w = StageWeights::Load(**src, *info, 0, info->spec.n_layers, false);
    ASSERT_TRUE(w.ok());
    ASSERT_EQ(info->spec.n_layers, layers);
    double bytes = 0;
    for (int l = 0; l < layers; ++l)
      for (const kernels::QuantizedMatrix* m :
           {&w->layer(l).qkv, &w->layer(l).o, &w->layer(l).gate_up, &w->layer(l).down})
        bytes += static_cast<double>(m->Bytes());
    EXPECT_NEAR(layer_bytes, bytes / layers, 1e-9 * layer_bytes);
  }
  EXPECT_NEAR(j["decode_products_gbps"].get<double>(), layer_bytes / products_us * 1e-3,
              1e-9 * j["decode_products_gbps"].get<double>());
  EXPECT_NEAR(j["decode_products_ratio"].get<double>(),
              j["decode_products_gbps"].get<double>() / j["read_bandwidth_gbps"].get<double>(),
              1e-9 * j["decode_products_ratio"].get<double>());
}

// Issue 11, item 10: `inspect` on a folder where a model file is a FIFO used to block in
// open() forever. Each run is bounded (timeout 20 s: exit 124 means it hung).
TEST_F(Cli, InspectRefusesAFifoNamedLikeAModelFile) {
  char tmpl[] = "/tmp/daisy_cli_fifo_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  for (const char* name : {"config.json", "tokenizer.json", "model.safetensors"}) {
    const fs::path model = dir / name;  // a folder per case, named after the FIFO in it
    fs::copy(Stories(), model, fs::copy_options::recursive);
    fs::remove(model / name);
    ASSERT_EQ(::mkfifo((model / name).c_str(), 0600), 0);
    const Output r = RunCommand("timeout 20 " + Binary() + " inspect --model " + model.string() + " 2>&1");
    EXPECT_NE(r.exit_code, 124) << name << ": inspect hung on a FIFO";
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find((model / name).string() + " is a named pipe (FIFO), not a regular file"), std::string::npos)
        << r.out;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace daisy
