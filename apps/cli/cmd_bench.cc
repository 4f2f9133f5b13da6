// daisychain bench: what this device can do. Kernel throughput (decode GEMV and prefill
// GEMM, GOP/s) for every backend that is supported and passed its gate, then prefill and
// decode tokens per second of a whole model through the live backend (default: the bundled
// stories260K; any folder with --model, e.g. one made by tools/make_model), peak memory and
// the probe hash. The figures of docs/KERNELS.md "Speed" (bandwidth ceiling, kernel ratio,
// peak RSS budget) come from the same run, so one machine's load affects them alike.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
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
#include "daisy/memory.h"
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

// Bytes a decode step reads: every layer's resident weights, the final norm and LM head, one
// embedding row, and the KV cache up to `position`.
double DecodeBytesPerToken(const StageWeights& w, double position) {
  const ModelSpec& s = w.spec();
  double b = 0;
  for (int l = w.first(); l < w.end(); ++l) b += static_cast<double>(w.layer(l).Bytes());
  const HeadWeights& h = w.head();
  b += static_cast<double>(h.lm_head.Bytes()) + 4.0 * static_cast<double>(h.final_norm.size());
  b += static_cast<double>(h.embed.Bytes()) / std::max(1, s.vocab);
  b += static_cast<double>(w.end() - w.first()) * position * static_cast<double>(KvCache::PositionBytes(s));
  return b;
}

// Useful operations of a prefill of n tokens from position 0: 2 per multiply-add of every
// weight product (every row), attention's Q.K and P.V over the visible keys (2 * head_dim
// per key each, per query head), and the LM head for the last row only.
double PrefillOps(const StageWeights& w, int n) {
  const ModelSpec& s = w.spec();
  double macs_per_row = 0;
  for (int l = w.first(); l < w.end(); ++l) {
    const LayerWeights& lw = w.layer(l);
    for (const kernels::QuantizedMatrix* m : {&lw.qkv, &lw.o, &lw.gate_up, &lw.down})
      macs_per_row += static_cast<double>(m->n) * m->k;
  }
  double keys = 0;  // visible keys summed over the queries (causal, window where set)
  for (int l = w.first(); l < w.end(); ++l) {
    const int window = w.layer(l).sliding_window ? s.sliding_window : 0;
    for (int i = 0; i < n; ++i) keys += window > 0 ? std::min(i + 1, window) : i + 1;
  }
  const double attention = 2.0 * 2.0 * s.head_dim * s.n_heads * keys;
  const double head = 2.0 * static_cast<double>(w.head().lm_head.n) * w.head().lm_head.k;
  return 2.0 * macs_per_row * n + attention + head;
}

// GOP/s of the GEMM kernel on this model's own weight products, as a prefill of m rows
// makes them: every layer's q/k/v, o, gate/up and down against m int8 rows, in layer order,
// so the weights come from memory as they do in the prefill (the kernel case of
// MeasureKernelThroughput keeps a 64 x 2048 x 896 product's weights in cache). The best of
// `passes` passes. Attention's products and the rest of the prefill are not in it, so the
// prefill's useful GOP/s over this says how far the prefill is from its own products' speed.
double ModelGemmGops(const StageWeights& w, int m, int passes) {
  int max_k = 1, max_n = 1;
  for (int l = w.first(); l < w.end(); ++l)
    for (const kernels::QuantizedMatrix* q : {&w.layer(l).qkv, &w.layer(l).o, &w.layer(l).gate_up, &w.layer(l).down}) {
      max_k = std::max(max_k, q->k);
      max_n = std::max(max_n, q->n);
    }
  std::vector<int8_t> xq(static_cast<size_t>(m) * static_cast<size_t>(max_k));
  for (size_t i = 0; i < xq.size(); ++i)
    xq[i] = static_cast<int8_t>(static_cast<int>((i * 2654435761u) >> 24) % 255 - 127);
  const std::vector<float> xs(static_cast<size_t>(m), 0.01f);
  std::vector<float> y(static_cast<size_t>(m) * static_cast<size_t>(max_n));
  double best = 0;
  for (int pass = 0; pass < passes; ++pass) {
    double ops = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int l = w.first(); l < w.end(); ++l)
      for (const kernels::QuantizedMatrix* q :
           {&w.layer(l).qkv, &w.layer(l).o, &w.layer(l).gate_up, &w.layer(l).down}) {
        kernels::MatMulQ(xq.data(), xs.data(), m, static_cast<size_t>(q->k), q->View(), y.data(),
                         static_cast<size_t>(q->n), kernels::ProductShape::kGemm);
        ops += 2.0 * m * static_cast<double>(q->n) * q->k;
      }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sec > 0) best = std::max(best, ops / sec * 1e-9);
  }
  return best;
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

// A phase's wall time in us per layer run (0 when nothing ran).
double PhaseUs(const LayerPhaseTimes& t, int phase) {
  return t.layer_runs > 0 ? 1e6 * t.seconds[static_cast<size_t>(phase)] / static_cast<double>(t.layer_runs) : 0.0;
}

// Where a decode step's layer time goes: the share of it in the four weight products and
// the rate at which those products read their weights (bytes of the layers' matrices, per
// layer, over the products' time), from the phase-timed decode turn. Against the ceiling it
// splits the bandwidth ratio into the products' own speed and the rest of the layer (norms,
// RoPE and cache writes, attention, activation, residual), which reads almost nothing.
struct ProductsShare {
  double share = 0;        // of a layer's decode time
  double gbps = 0;         // weight bytes per second while in the products
  double layer_bytes = 0;  // the four matrices of a layer, on average (int8 rows and scales)
};
ProductsShare DecodeProducts(const StageWeights& w, const LayerPhaseTimes& t) {
  double all = 0, products = 0;
  for (int ph = 0; ph < LayerPhaseTimes::kPhases; ++ph) all += PhaseUs(t, ph);
  for (int ph : {LayerPhaseTimes::kQkv, LayerPhaseTimes::kOutput, LayerPhaseTimes::kGateUp, LayerPhaseTimes::kDown})
    products += PhaseUs(t, ph);
  double bytes = 0;
  for (int l = w.first(); l < w.end(); ++l) {
    const LayerWeights& lw = w.layer(l);
    for (const kernels::QuantizedMatrix* m : {&lw.qkv, &lw.o, &lw.gate_up, &lw.down})
      bytes += static_cast<double>(m->Bytes());
  }
  bytes /= std::max(1, w.end() - w.first());
  ProductsShare out;
  out.layer_bytes = bytes;
  if (all > 0) out.share = products / all;
  if (products > 0) out.gbps = bytes / products * 1e-3;  // bytes per us -> GB/s
  return out;
}

// One decode turn and the read bandwidth around it (the better of the measurements just
// before and just after).
struct DecodeRound {
  double tps;
  kernels::ReadBandwidth bandwidth;
  int steps;
  double ratio = 0;
};

int RunBench(const BenchCliOptions& o) {
  if (o.threads > 0) kernels::SetThreads(o.threads);
  const std::string model = o.model.empty() ? BundledModel() : o.model;
  if (model.empty()) return ReportError("the bundled stories260K was not found (set DAISY_MODELS or pass --model)");
  // The per-shape backend choice (measured or read from DAISY_HOME), before the peak RSS of
  // the generation is tracked: its buffers are a one-off of the first start on this CPU.
  const kernels::BackendChoice choice = kernels::ActiveChoice();
  const bool rss_reset = ResetPeakRss();

  // the model through the live backends
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
  const StageWeights& weights = pipeline->weights(0);
  // A fixed, spread-out prompt (no tokenizer needed): ids cycle through the vocabulary.
  auto make_prompt = [&](int n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>((1 + 7919LL * i) % spec.vocab);
    return p;
  };
  const std::vector<int32_t> prompt = make_prompt(n_prompt);
  GenerateOptions g;
  g.max_tokens = o.decode_tokens;  // no stop ids: always the full count
  Generator gen(pipeline->head());
  // warm-up (page in the weights, spin up the threads), then the measured turn
  if (auto w = gen.Generate(std::span<const int32_t>(prompt).subspan(0, std::min<size_t>(8, prompt.size())), g);
      !w.ok())
    return ReportError(w.status().ToString());
  auto r = gen.Generate(prompt, g);
  if (!r.ok()) return ReportError(r.status().ToString());
  const uint64_t peak_rss = PeakRssBytes();
  // How much of the process the kernel backs with large pages now (weights and KV cache ask
  // for them, memory.h): 0 says the decode streams from 4 KiB pages (THP off, or no room).
  const uint64_t large_pages = HugePageBytes();
  const uint64_t rss_budget = pipeline->WeightBytes() + pipeline->CacheBytes() + (uint64_t{64} << 20);
  // count per second, 0 for a phase too short to time
  const auto per_second = [](double count, double seconds) { return seconds > 0 ? count / seconds : 0; };
  const double prefill_tps = per_second(r->prefill_tokens, r->prefill_seconds);
  const double bytes_per_token = DecodeBytesPerToken(weights, n_prompt + 0.5 * o.decode_tokens);

  // prefill of 64 and 512 tokens (as many as the context allows), from position 0
  // Each length runs twice and the second run is the figure: the first, like the kernel
  // cases' warm-up, pays the one-off costs of its length (the first touch of this many rows'
  // scratch and cache pages: a fifth of a 512-token prefill on a 2-core VM). The first
  // run's speed is kept too (cold_tps), since a node's first long prompt meets it.
  auto prefill = [&](int n, double* tps, double* gops, double* cold_tps) -> Status {
    n = std::max(1, std::min(n, ctx - 1));
    GenerateOptions p;
    p.max_tokens = 0;
    const std::vector<int32_t> ids = make_prompt(n);
    DAISY_ASSIGN_OR_RETURN(GenerateResult cold, gen.Generate(ids, p));
    *cold_tps = per_second(n, cold.prefill_seconds);
    DAISY_ASSIGN_OR_RETURN(GenerateResult pr, gen.Generate(ids, p));
    *tps = per_second(n, pr.prefill_seconds);
    *gops = per_second(PrefillOps(weights, n) * 1e-9, pr.prefill_seconds);
    return Status::Ok();
  };
  double prefill64_tps = 0, prefill64_gops = 0, prefill64_cold_tps = 0;
  double prefill512_tps = 0, prefill512_gops = 0, prefill512_cold_tps = 0;
  if (Status st = prefill(64, &prefill64_tps, &prefill64_gops, &prefill64_cold_tps); !st.ok())
    return ReportError(st.ToString());
  if (Status st = prefill(512, &prefill512_tps, &prefill512_gops, &prefill512_cold_tps); !st.ok())
    return ReportError(st.ToString());
  const int prefill512_tokens = std::max(1, std::min(512, ctx - 1));

  // The decode against the read bandwidth, in rounds: each round's decode (the same turn as
  // above) runs between two bandwidth measurements, and its ceiling is the better of the two.
  // On a shared VM the bandwidth swings by half within seconds (measured: 37 and 64 GB/s a
  // minute apart), so a ceiling measured once, before everything else, made the ratio swing
  // from 0.5 to 1.15 between runs. The figures are the round with the median ratio.
  if (!o.json) std::fprintf(stderr, "measuring decode against read bandwidth...\n");
  constexpr int kDecodeRounds = 3;
  const double round_seconds = std::max(0.01, 0.5 * o.kernel_seconds);
  std::vector<kernels::ReadBandwidth> around{kernels::MeasureReadBandwidth(round_seconds)};
  std::vector<DecodeRound> rounds;
  for (int i = 0; i < kDecodeRounds; ++i) {
    auto d = gen.Generate(prompt, g);
    if (!d.ok()) return ReportError(d.status().ToString());
    around.push_back(kernels::MeasureReadBandwidth(round_seconds));
    const kernels::ReadBandwidth& bw = around[static_cast<size_t>(i)].best_gbps >= around.back().best_gbps
                                           ? around[static_cast<size_t>(i)]
                                           : around.back();
    rounds.push_back(DecodeRound{per_second(d->decode_steps, d->decode_seconds), bw, d->decode_steps});
  }
  // Decode tokens/s at a bandwidth, and a decode's share of it.
  const auto ceiling_at = [&](double gbps) { return gbps * 1e9 / bytes_per_token; };
  const auto share_of = [&](double tps, double gbps) {
    const double ceiling = ceiling_at(gbps);
    return ceiling > 0 ? tps / ceiling : 0;
  };
  std::vector<const DecodeRound*> by_ratio;
  for (DecodeRound& dr : rounds) {
    dr.ratio = share_of(dr.tps, dr.bandwidth.best_gbps);
    by_ratio.push_back(&dr);
  }
  std::sort(by_ratio.begin(), by_ratio.end(),
            [](const DecodeRound* x, const DecodeRound* y) { return x->ratio < y->ratio; });
  const DecodeRound& chosen = *by_ratio[by_ratio.size() / 2];
  const kernels::ReadBandwidth& bandwidth = chosen.bandwidth;
  const double read_gbps = bandwidth.best_gbps;
  const double decode_tps = chosen.tps;
  // Where a layer's time goes: one more decode turn (its layers timed from the first decode
  // step on) and one more prefill of prefill512_tokens, phase by phase. Separate runs, so the
  // figures above ran without the clocks.
  if (!o.json) std::fprintf(stderr, "timing a layer's phases...\n");
  LayerPhaseTimes decode_phases, prefill_phases;
  double decode_phase_seconds = 0, prefill_phase_seconds = 0;
  {
    bool timing = false;
    auto d = gen.Generate(prompt, g, [&](int32_t, std::span<const float>) {
      if (!timing) SetLayerPhaseTimes(&decode_phases);  // after the prefill, before the first decode step
      timing = true;
    });
    SetLayerPhaseTimes(nullptr);
    if (!d.ok()) return ReportError(d.status().ToString());
    decode_phase_seconds = d->decode_seconds;
    GenerateOptions p;
    p.max_tokens = 0;
    SetLayerPhaseTimes(&prefill_phases);
    auto pr = gen.Generate(make_prompt(prefill512_tokens), p);
    SetLayerPhaseTimes(nullptr);
    if (!pr.ok()) return ReportError(pr.status().ToString());
    prefill_phase_seconds = pr->prefill_seconds;
  }
  // the kernels' ceiling, measured in the same run: every gated backend's
  if (!o.json) std::fprintf(stderr, "measuring kernels...\n");
  const auto kernels_tp = kernels::MeasureKernelThroughput(o.kernel_seconds);
  double gemm_gops = 0;
  for (const auto& k : kernels_tp)
    if (k.backend == choice.For(kernels::ProductShape::kGemm)) gemm_gops = k.gemm_gops;
  // The decode's share of the bandwidth: against the best pass (the target) and the median
  // pass (what a decode, averaging over its whole run, meets on a machine whose passes swing).
  const double ceiling_tps = ceiling_at(read_gbps);
  const double bandwidth_ratio = chosen.ratio;
  const double median_ceiling_tps = ceiling_at(bandwidth.median_gbps);
  const double median_ratio = share_of(decode_tps, bandwidth.median_gbps);
  const double kernel_ratio = gemm_gops > 0 ? prefill512_gops / gemm_gops : 0;
  const ProductsShare decode_products = DecodeProducts(weights, decode_phases);
  const double decode_products_ratio = read_gbps > 0 ? decode_products.gbps / read_gbps : 0;
  const double model_gemm_gops = ModelGemmGops(weights, prefill512_tokens, 2);
  const double model_kernel_ratio = model_gemm_gops > 0 ? prefill512_gops / model_gemm_gops : 0;

  char hash[17];
  std::snprintf(hash, sizeof hash, "%016" PRIx64, kernels::ProbeHash());
  const std::string backend(kernels::BackendName(kernels::ActiveBackend()));
  const std::string summary = kernels::BackendChoiceSummary();

  if (o.json) {
    nlohmann::ordered_json j;
    j["backend"] = backend;
    nlohmann::ordered_json bc;
    for (kernels::ProductShape s :
         {kernels::ProductShape::kGemv, kernels::ProductShape::kGemm, kernels::ProductShape::kAttention})
      bc[std::string(kernels::ProductShapeName(s))] = std::string(kernels::BackendName(choice.For(s)));
    bc["source"] = choice.source;
    j["backend_choice"] = bc;
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
    j["kv_cache_bytes"] = pipeline->CacheBytes();
    j["load_seconds"] = load_seconds;
    j["prefill_tokens"] = r->prefill_tokens;
    j["prefill_tokens_per_s"] = prefill_tps;
    j["decode_tokens"] = chosen.steps;
    j["decode_tokens_per_s"] = decode_tps;
    nlohmann::ordered_json jr = nlohmann::ordered_json::array();
    for (const DecodeRound& dr : rounds)
      jr.push_back({{"decode_tokens_per_s", dr.tps},
                    {"read_bandwidth_gbps", dr.bandwidth.best_gbps},
                    {"decode_bandwidth_ratio", dr.ratio}});
    j["decode_rounds"] = jr;
    j["read_bandwidth_gbps"] = read_gbps;
    j["read_bandwidth_median_gbps"] = bandwidth.median_gbps;
    j["read_bandwidth_passes"] = bandwidth.passes;
    j["decode_bytes_per_token"] = bytes_per_token;
    j["decode_bandwidth_ratio"] = bandwidth_ratio;
    j["decode_bandwidth_median_ratio"] = median_ratio;
    j["gemm_gops"] = gemm_gops;
    j["prefill64_tokens_per_s"] = prefill64_tps;
    j["prefill512_tokens"] = prefill512_tokens;
    j["prefill512_tokens_per_s"] = prefill512_tps;
    j["prefill512_first_run_tokens_per_s"] = prefill512_cold_tps;
    j["prefill512_gops"] = prefill512_gops;
    j["prefill_kernel_ratio"] = kernel_ratio;
    j["model_gemm_gops"] = model_gemm_gops;
    j["prefill_model_gemm_ratio"] = model_kernel_ratio;
    j["peak_rss_bytes"] = peak_rss;
    j["rss_budget_bytes"] = rss_budget;
    j["peak_rss_since_start"] = !rss_reset;
    j["peak_memory_bytes"] = ProcessPeakRssBytes();
    j["large_page_bytes"] = large_pages;
    // A layer's wall time per phase, in us per layer run, and the runs' own time.
    const auto phases_json = [](const LayerPhaseTimes& t, double seconds) {
      nlohmann::ordered_json us;
      for (int ph = 0; ph < LayerPhaseTimes::kPhases; ++ph) us[LayerPhaseTimes::Name(ph)] = PhaseUs(t, ph);
      return nlohmann::ordered_json{
          {"seconds", seconds}, {"layer_runs", t.layer_runs}, {"rows", t.rows}, {"layer_us", us}};
    };
    j["decode_phases"] = phases_json(decode_phases, decode_phase_seconds);
    j["decode_products_share"] = decode_products.share;
    j["decode_products_gbps"] = decode_products.gbps;
    j["decode_products_layer_bytes"] = decode_products.layer_bytes;
    j["decode_products_ratio"] = decode_products_ratio;
    j["prefill512_phases"] = phases_json(prefill_phases, prefill_phase_seconds);
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("backend per product shape (%s): %s\n", choice.source.c_str(), summary.c_str());
    std::printf("kernels (threads %d):\n", kernels::Threads());
    for (const auto& k : kernels_tp)
      std::printf("  %-11s GEMV %8.1f GOP/s (%6.1f GB/s of weights)   GEMM %8.1f GOP/s\n",
                  std::string(kernels::BackendName(k.backend)).c_str(), k.gemv_gops, k.gemv_gbps, k.gemm_gops);
    std::printf("model %s (%d layers, %.2f MB resident):\n", (*src)->Describe().c_str(), spec.n_layers,
                static_cast<double>(pipeline->WeightBytes()) / 1e6);
    std::printf("  prefill %d tokens: %.1f tok/s\n", r->prefill_tokens, prefill_tps);
    std::printf("  prefill 64 tokens: %.1f tok/s; %d tokens: %.1f tok/s = %.1f GOP/s, %.0f%% of the GEMM's %.1f\n",
                prefill64_tps, prefill512_tokens, prefill512_tps, prefill512_gops, 100 * kernel_ratio, gemm_gops);
    std::printf("  (the second run of each length; the first: %.1f and %.1f tok/s)\n", prefill64_cold_tps,
                prefill512_cold_tps);
    std::printf("  the GEMM on this model's weight products, %d rows: %.1f GOP/s; the prefill reached %.0f%% of it\n",
                prefill512_tokens, model_gemm_gops, 100 * model_kernel_ratio);
    std::printf("  decode  %d tokens, %d rounds, each between two read-bandwidth measurements:\n", chosen.steps,
                kDecodeRounds);
    for (const DecodeRound& dr : rounds)
      std::printf("    %.1f tok/s at %.1f GB/s: %.0f%% of its ceiling%s\n", dr.tps, dr.bandwidth.best_gbps,
                  100 * dr.ratio, &dr == &chosen ? " (the median round)" : "");
    std::printf(
        "  decode %.1f tok/s; read bandwidth %.1f GB/s (the best of %d passes; the median of its kind's %.1f); "
        "%.2f MB read per token: ceiling %.1f tok/s, reached %.0f%% (%.0f%% of the median pass's %.1f)\n",
        decode_tps, read_gbps, bandwidth.passes, bandwidth.median_gbps, bytes_per_token / 1e6, ceiling_tps,
        100 * bandwidth_ratio, 100 * median_ratio, median_ceiling_tps);
    std::printf("  a layer's time by phase, us per layer (decode: per token; prefill: the %d-row batch):\n",
                prefill512_tokens);
    for (int ph = 0; ph < LayerPhaseTimes::kPhases; ++ph)
      std::printf("    %-15s %10.1f %12.1f\n", LayerPhaseTimes::Name(ph), PhaseUs(decode_phases, ph),
                  PhaseUs(prefill_phases, ph));
    if (kernels::Threads() > 1)
      std::printf(
          "  (a decode step on %d threads that sees %d keys or more runs RoPE and the cache writes inside "
          "attention's dispatch: they count as attention)\n",
          kernels::Threads(), kDecodeSplitMinKeys);
    std::printf(
        "  decode: the weight products (q/k/v, output, gate/up, down) take %.0f%% of a layer's time and read "
        "%.1f GB/s while they run, %.0f%% of the ceiling; the rest of the layer reads only the KV cache\n",
        100 * decode_products.share, decode_products.gbps, 100 * decode_products_ratio);
    std::printf("peak RSS of the generation %.1f MB (budget %.1f MB: weights + KV cache + 64 MiB), probe hash %s\n",
                static_cast<double>(peak_rss) / 1e6, static_cast<double>(rss_budget) / 1e6, hash);
    std::printf("large pages in this process: %.1f MB (weights and KV cache: %.1f MB)%s\n",
                static_cast<double>(large_pages) / 1e6,
                static_cast<double>(pipeline->WeightBytes() + pipeline->CacheBytes()) / 1e6,
                large_pages == 0 ? " (none: transparent huge pages off or unavailable, decode reads 4 KiB pages)" : "");
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
  sub->add_option("--kernel-seconds", o->kernel_seconds,
                  "Seconds per kernel case (default 0.5); each read-bandwidth measurement around the 3 decode rounds "
                  "takes about half of it")
      ->check(CLI::Range(0.01, 60.0));
  sub->add_option("--threads", o->threads, "Kernel threads (default: all cores)")->check(CLI::Range(1, 1024));
  sub->add_flag("--json", o->json, "Print one JSON object");
  sub->add_flag("--no-cache", o->no_cache, "Do not use the on-disk download cache");
  return [o] { return RunBench(*o); };
});

}  // namespace daisy::cli
