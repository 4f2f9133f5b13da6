#include "ring_common.h"

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace daisy::cli {

std::atomic<bool>& StopRequested() {
  static std::atomic<bool> stop{false};
  return stop;
}

namespace {
void OnSignal(int) { StopRequested().store(true); }
}  // namespace

void InstallStopSignals() {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);
}

void AddGenFlags(CLI::App* sub, GenFlags& f) {
  sub->add_option("-n,--max-tokens", f.max_tokens, "Tokens to generate at most (default 60)")->check(CLI::Range(0, 1 << 20));
  sub->add_option("--temperature", f.temperature, "Sampling temperature; 0 = greedy (default 0)");
  sub->add_option("--seed", f.seed, "Sampling seed (default 1234)");
  sub->add_option("--top-k", f.top_k, "Keep the k most likely tokens; 0 = off");
  sub->add_option("--top-p", f.top_p, "Nucleus sampling mass; 1 = off");
  sub->add_option("--ctx", f.ctx, "Context length (default: the model's, at most 4096)");
  sub->add_option("--stop-id", f.stop_ids, "Extra token id that ends generation (repeatable)");
}

GenerateOptions ToGenerateOptions(const GenFlags& f) {
  GenerateOptions g;
  g.max_tokens = f.max_tokens;
  g.sampling.temperature = f.temperature;
  g.sampling.seed = f.seed;
  g.sampling.top_k = f.top_k;
  g.sampling.top_p = f.top_p;
  for (int id : f.stop_ids) g.stop_ids.push_back(id);
  return g;
}

void PrintHeadReport(const HeadReport& r, bool json, bool verify) {
  if (json) {
    nlohmann::json plan = nlohmann::json::array();
    for (const auto& s : r.plan)
      plan.push_back({{"device", s.device_name}, {"device_id", s.device_id}, {"layers", {s.first, s.end}}, {"bytes", s.download_bytes}});
    nlohmann::json out = {{"prompt_ids", r.prompt_ids},
                          {"ids", r.ids},
                          {"text", r.text},
                          {"finish_reason", r.finish_reason},
                          {"plan", plan},
                          {"tokens_per_s", r.tokens_per_s},
                          {"prefill_seconds", r.prefill_seconds},
                          {"decode_seconds", r.decode_seconds},
                          {"ring_hops", r.ring_hops},
                          {"laps", r.laps},
                          {"lap_seconds", r.lap_seconds},
                          {"replays", r.replays}};
    if (verify) out["verified"] = r.verified.value_or(false);
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  std::printf("\n\n%zu tokens (%s), %.1f tok/s decode, %lld ring hops in %lld laps%s\n", r.ids.size(), r.finish_reason.c_str(),
              r.tokens_per_s, static_cast<long long>(r.ring_hops), static_cast<long long>(r.laps),
              r.replays ? ", replayed once after a stage dropped" : "");
  if (verify) std::printf("%s\n", r.verify_message.c_str());
  std::fflush(stdout);
}

}  // namespace daisy::cli
