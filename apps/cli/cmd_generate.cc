// daisychain generate: the whole model on this device, no network. Tokenizes the prompt,
// prefills, decodes with the project's sampler and streams the text as tokens arrive
// (held back while a multi-byte character is incomplete), then reports prefill and decode
// throughput and peak memory. --json prints one object instead.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "daisy/forward.h"
#include "daisy/generator.h"
#include "daisy/kernels.h"
#include "daisy/memory.h"
#include "daisy/model.h"
#include "daisy/tokenizer.h"

namespace daisy::cli {
namespace {

struct GenerateCliOptions {
  std::string model;
  std::string prompt;
  GenFlags gen;
  int prefill_chunk = 0;
  int threads = 0;
  bool json = false;
  bool verbose = false;
  bool no_cache = false;
};

// What generate may hold at its peak (docs/FORWARD.md, "Loading"): the weights as held
// (int8 matrices with their scales and biases, f32 norms, the embedding at the file's
// width), the KV cache, and 64 MiB for everything else (code, tokenizer, load blocks,
// activations, logits).
constexpr uint64_t kRssSlackBytes = 64ull << 20;

double PerSecond(double n, double seconds) {
  return seconds > 0 ? n / seconds : 0.0;
}

void PrintBackendReport() {
  std::fprintf(stderr, "backend: %s (threads %d)\n",
               std::string(kernels::BackendName(kernels::ActiveBackend())).c_str(), kernels::Threads());
  for (const auto& b : kernels::BackendReport())
    std::fprintf(stderr, "  %-11s supported=%s gate=%s%s%s\n", std::string(kernels::BackendName(b.backend)).c_str(),
                 b.supported ? "yes" : "no", b.gate_passed ? "passed" : "no", b.reason.empty() ? "" : "  ",
                 b.reason.c_str());
  std::fprintf(stderr, "probe hash: %016" PRIx64 "\n", kernels::ProbeHash());
}

int RunGenerate(const GenerateCliOptions& o) {
  if (o.threads > 0) kernels::SetThreads(o.threads);
  auto src = OpenSourceForCli(o.model, !o.no_cache);
  if (!src.ok()) return ReportError(src.status().ToString());
  auto info = LoadModelInfo(**src);
  if (!info.ok()) return ReportError(info.status().ToString());
  const ModelSpec& spec = info->spec;
  auto tok = Tokenizer::Load(**src);
  if (!tok.ok()) return ReportError(tok.status().ToString());
  const int ctx = o.gen.ctx > 0 ? o.gen.ctx : DefaultContext(spec);
  if (Status st = CheckContext(spec, ctx); !st.ok()) return ReportError(st.ToString());

  auto prompt = tok->Encode(o.prompt, /*add_special_tokens=*/true);
  if (!prompt.ok()) return ReportError(prompt.status().ToString());
  if (prompt->empty()) return ReportError("the prompt encodes to no tokens; give some text");

  GenerateOptions g = ToGenerateOptions(o.gen);
  g.prefill_chunk = o.prefill_chunk;
  g.stop_ids.insert(g.stop_ids.begin(), spec.eos_ids.begin(), spec.eos_ids.end());
  if (Status st = ValidateSamplingParams(g.sampling); !st.ok()) return ReportError(st.ToString());

  const auto load_start = std::chrono::steady_clock::now();
  auto pipeline = LocalPipeline::Load(**src, *info, std::vector<int>{spec.n_layers}, ctx);
  if (!pipeline.ok()) return ReportError(pipeline.status().ToString());
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  if (o.verbose) {
    PrintBackendReport();
    std::fprintf(stderr, "model: %s, %d layers, weights %.2f MB resident, context %d\n", (*src)->Describe().c_str(),
                 spec.n_layers, static_cast<double>(pipeline->WeightBytes()) / 1e6, ctx);
    std::fprintf(stderr, "prompt: %zu tokens\n", prompt->size());
  }

  TextStream stream(*tok, *prompt);
  auto show = [&](const std::string& piece) {
    if (o.json || piece.empty()) return;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
  show(stream.context_text());
  Generator gen(pipeline->head());
  auto r = gen.Generate(*prompt, g, [&](int32_t id, std::span<const float>) { show(stream.Add(id)); });
  show(stream.Finish());
  const std::string text = stream.context_text() + stream.Completion();
  if (!r.ok()) {
    if (!o.json) std::fputc('\n', stdout);
    return ReportError(r.status().ToString());
  }
  const double prefill_tps = PerSecond(r->prefill_tokens, r->prefill_seconds);
  const double decode_tps = PerSecond(r->decode_steps, r->decode_seconds);
  const uint64_t peak = ProcessPeakRssBytes();
  const std::string backend(kernels::BackendName(kernels::ActiveBackend()));
  if (o.json) {
    nlohmann::ordered_json j;
    j["model"] = (*src)->Describe();
    j["prompt"] = o.prompt;
    j["prompt_ids"] = *prompt;
    j["ids"] = r->ids;
    j["text"] = text;  // prompt + completion, as decoded together
    j["completion"] = stream.Completion();
    j["finish_reason"] = std::string(FinishReasonName(r->finish_reason));
    if (r->stop_id) j["stop_id"] = *r->stop_id;
    j["backend"] = backend;
    j["load_seconds"] = load_seconds;  // fetching and converting the weights
    j["threads"] = kernels::Threads();
    j["ctx"] = ctx;
    j["prefill_tokens"] = r->prefill_tokens;
    j["prefill_seconds"] = r->prefill_seconds;
    j["prefill_tokens_per_s"] = prefill_tps;
    j["decode_tokens"] = r->decode_steps;
    j["decode_seconds"] = r->decode_seconds;
    j["decode_tokens_per_s"] = decode_tps;
    j["lookahead"] = g.lookahead;  // drafts per step at most; 0 = off (--no-lookahead)
    j["decode_laps"] = r->decode_laps;
    j["drafted"] = r->drafted;
    j["accepted"] = r->accepted;
    j["peak_memory_bytes"] = peak;
    j["peak_rss_bytes"] = PeakRssBytes();
    j["weight_bytes"] = pipeline->WeightBytes();
    j["embedding_bytes"] = pipeline->weights(0).head().embed.Bytes();
    j["kv_cache_bytes"] = pipeline->CacheBytes();
    j["rss_budget_bytes"] = pipeline->WeightBytes() + pipeline->CacheBytes() + kRssSlackBytes;
    if (o.verbose) {
      char hash[17];
      std::snprintf(hash, sizeof hash, "%016" PRIx64, kernels::ProbeHash());
      j["probe_hash"] = hash;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::fputc('\n', stdout);
    std::fflush(stdout);
    std::fprintf(stderr,
                 "[%s] prefill %d tokens at %.1f tok/s, decode %d tokens at %.1f tok/s (lookahead: %d of %d drafts "
                 "kept), peak memory %.1f MB, %s\n",
                 std::string(FinishReasonName(r->finish_reason)).c_str(), r->prefill_tokens, prefill_tps,
                 r->decode_steps, decode_tps, r->accepted, r->drafted, static_cast<double>(peak) / 1e6,
                 backend.c_str());
  }
  return 0;
}

}  // namespace

DAISY_REGISTER_COMMAND(generate, 10, [](CLI::App& app) -> std::function<int()> {
  auto o = std::make_shared<GenerateCliOptions>();
  CLI::App* sub = app.add_subcommand("generate", "Generate text with the whole model on this device (no network)");
  sub->add_option("--model", o->model, "Local folder or Hub repo id owner/name[@revision]")->required();
  sub->add_option("--prompt", o->prompt, "The prompt text")->required();
  AddGenFlags(sub, o->gen);
  sub->add_option("--prefill-chunk", o->prefill_chunk, "Prompt positions per forward step; 0 = all at once")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--threads", o->threads, "Kernel threads (default: all cores)")->check(CLI::Range(1, 1024));
  sub->add_flag("--json", o->json,
                "Print one JSON object: prompt_ids, ids, text (prompt + completion), completion, finish_reason, "
                "backend, throughput, peak memory (peak_rss_bytes against rss_budget_bytes)");
  sub->add_flag("--verbose", o->verbose, "Print the backend report and the probe hash");
  sub->add_flag("--no-cache", o->no_cache, "Do not use the on-disk download cache");
  return [o] { return RunGenerate(*o); };
});

}  // namespace daisy::cli
