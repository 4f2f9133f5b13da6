// daisychain bench: what this device can do. Kernel throughput (decode GEMV and prefill
// GEMM, GOP/s) for every backend that is supported and passed its gate, then prefill and
// decode tokens per second of a whole model through the live backend (default: the bundled
// stories260K; any folder with --model, e.g. one made by tools/make_model), peak memory and
// the probe hash.
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "daisy/forward.h"
#include "daisy/generator.h"
#include "daisy/kernels.h"
#include "daisy/model.h"

namespace daisy::cli {
namespace {

namespace fs = std::filesystem;

struct BenchCliOptions {
  std::string model;
  int prompt_tokens = 128;
  int decode_tokens = 64;
  double kernel_seconds = 0.5;
  int threads = 0;
  bool json = false;
  bool no_cache = false;
};

uint64_t PeakMemoryBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

// The bundled model: $DAISY_MODELS/stories260K, else models/stories260K in a folder above
// the executable (a build tree inside the checkout), else under the working directory.
std::string BundledModel() {
  auto is_model = [](const fs::path& p) {
    return fs::exists(p / "config.json") && fs::exists(p / "model.safetensors");
  };
  if (const char* env = std::getenv("DAISY_MODELS"); env && is_model(fs::path(env) / "stories260K"))
    return (fs::path(env) / "stories260K").string();
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path())
      if (is_model(dir / "models" / "stories260K")) return (dir / "models" / "stories260K").string();
  }
  if (is_model(fs::path("models") / "stories260K")) return "models/stories260K";
  return {};
}

int RunBench(const BenchCliOptions& o) {
  if (o.threads > 0) kernels::SetThreads(o.threads);
  const std::string model = o.model.empty() ? BundledModel() : o.model;
  if (model.empty()) return ReportError("the bundled stories260K was not found (set DAISY_MODELS or pass --model)");

  // kernels, every backend that may run here
  if (!o.json) std::fprintf(stderr, "measuring kernels...\n");
  const auto kernels_tp = kernels::MeasureKernelThroughput(o.kernel_seconds);

  // the model through the live backend
  auto src = OpenSourceForCli(model, !o.no_cache);
  if (!src.ok()) return ReportError(src.status().ToString());
  auto info = LoadModelInfo(**src);
  if (!info.ok()) return ReportError(info.status().ToString());
  const ModelSpec& spec = info->spec;
  const int ctx = DefaultContext(spec);
  const int n_prompt = std::max(1, std::min(o.prompt_tokens, ctx - o.decode_tokens - 1));
  const auto t_load = std::chrono::steady_clock::now();
  auto pipeline = LocalPipeline::Load(**src, *info, std::vector<int>{spec.n_layers}, ctx);
  if (!pipeline.ok()) return ReportError(pipeline.status().ToString());
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  // A fixed, spread-out prompt (no tokenizer needed): ids cycle through the vocabulary.
  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
  for (int i = 0; i < n_prompt; ++i)
    prompt[static_cast<size_t>(i)] = static_cast<int32_t>((1 + 7919LL * i) % spec.vocab);
  GenerateOptions g;
  g.max_tokens = o.decode_tokens;  // no stop ids: always the full count
  Generator gen(pipeline->head());
  // warm-up (page in the weights, spin up the threads), then the measured turn
  if (auto w = gen.Generate(std::span<const int32_t>(prompt).subspan(0, std::min<size_t>(8, prompt.size())), g);
      !w.ok())
    return ReportError(w.status().ToString());
  auto r = gen.Generate(prompt, g);
  if (!r.ok()) return ReportError(r.status().ToString());
  const double prefill_tps = r->prefill_seconds > 0 ? r->prefill_tokens / r->prefill_seconds : 0;
  const double decode_tps = r->decode_seconds > 0 ? r->decode_steps / r->decode_seconds : 0;
  const uint64_t peak = PeakMemoryBytes();
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016" PRIx64, kernels::ProbeHash());
  const std::string backend(kernels::BackendName(kernels::ActiveBackend()));

  if (o.json) {
    nlohmann::ordered_json j;
    j["backend"] = backend;
    j["threads"] = kernels::Threads();
    j["probe_hash"] = hash;
    nlohmann::ordered_json ks = nlohmann::ordered_json::array();
    for (const auto& k : kernels_tp)
      ks.push_back({{"backend", std::string(kernels::BackendName(k.backend))},
                    {"gemv_gops", k.gemv_gops},
                    {"gemv_gbps", k.gemv_gbps},
                    {"gemm_gops", k.gemm_gops}});
    j["kernels"] = ks;
    j["model"] = (*src)->Describe();
    j["layers"] = spec.n_layers;
    j["weight_bytes"] = pipeline->WeightBytes();
    j["load_seconds"] = load_seconds;
    j["prefill_tokens"] = r->prefill_tokens;
    j["prefill_tokens_per_s"] = prefill_tps;
    j["decode_tokens"] = r->decode_steps;
    j["decode_tokens_per_s"] = decode_tps;
    j["peak_memory_bytes"] = peak;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("kernels (threads %d):\n", kernels::Threads());
    for (const auto& k : kernels_tp)
      std::printf("  %-11s GEMV %8.1f GOP/s (%6.1f GB/s of weights)   GEMM %8.1f GOP/s\n",
                  std::string(kernels::BackendName(k.backend)).c_str(), k.gemv_gops, k.gemv_gbps, k.gemm_gops);
    std::printf("model %s (%d layers, %.2f MB resident) on %s:\n", (*src)->Describe().c_str(), spec.n_layers,
                static_cast<double>(pipeline->WeightBytes()) / 1e6, backend.c_str());
    std::printf("  prefill %d tokens: %.1f tok/s\n", r->prefill_tokens, prefill_tps);
    std::printf("  decode  %d tokens: %.1f tok/s\n", r->decode_steps, decode_tps);
    std::printf("peak memory %.1f MB, probe hash %s\n", static_cast<double>(peak) / 1e6, hash);
  }
  return 0;
}

}  // namespace

DAISY_REGISTER_COMMAND(bench, 80, [](CLI::App& app) -> std::function<int()> {
  auto o = std::make_shared<BenchCliOptions>();
  CLI::App* sub = app.add_subcommand("bench", "Kernel, prefill and decode throughput of this device");
  sub->add_option("--model", o->model, "Model to time (default: the bundled stories260K)");
  sub->add_option("--prompt-tokens", o->prompt_tokens, "Prefill length (default 128)")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--decode-tokens", o->decode_tokens, "Tokens to decode (default 64)")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--kernel-seconds", o->kernel_seconds, "Seconds per kernel case (default 0.5)")
      ->check(CLI::Range(0.01, 60.0));
  sub->add_option("--threads", o->threads, "Kernel threads (default: all cores)")->check(CLI::Range(1, 1024));
  sub->add_flag("--json", o->json, "Print one JSON object");
  sub->add_flag("--no-cache", o->no_cache, "Do not use the on-disk download cache");
  return [o] { return RunBench(*o); };
});

}  // namespace daisy::cli
