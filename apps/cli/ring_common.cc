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

void PrintHeadReport(const HeadReport& r, bool json, bool verify) {
  if (json) {
    nlohmann::json plan = nlohmann::json::array();
    for (const auto& s : r.plan)
      plan.push_back({{"device", s.device_name}, {"device_id", s.device_id}, {"layers", {s.first, s.end}}, {"bytes", s.download_bytes}});
    // Each stage's share of the turn, as it measured it (the head's: the time outside laps).
    nlohmann::json stages = nlohmann::json::array();
    for (const auto& l : r.stage_latency)
      stages.push_back(
          {{"stage", l.stage}, {"device", l.device_name}, {"hops", l.hops}, {"compute_seconds", l.compute_seconds}});
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
                          {"stage_latency", stages},
                          {"drafted", r.drafted},
                          {"accepted", r.accepted},
                          {"replays", r.replays},
                          {"ring_positions", r.ring_positions},
                          {"reused_positions", r.reused_positions},
                          {"audited_hops", r.audited_hops},
                          {"recomputed_hops", r.recomputed_hops},
                          {"audit_failures", r.audit_failures}};
    if (verify) {
      out["verified"] = r.verified.value_or(false);
      out["verify_message"] = r.verify_message;
      out["verified_steps"] = r.verified_steps;
      // Where and how the runs first differ: null when verified.
      out["mismatch_position"] = r.mismatch_position ? nlohmann::json(*r.mismatch_position) : nlohmann::json(nullptr);
      out["mismatch"] = r.mismatch.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.mismatch);
    }
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  std::printf("\n\n%zu tokens (%s), %.1f tok/s decode, %lld ring hops in %lld laps, lookahead kept %d of %d drafts%s\n",
              r.ids.size(), r.finish_reason.c_str(), r.tokens_per_s, static_cast<long long>(r.ring_hops),
              static_cast<long long>(r.laps), r.accepted, r.drafted,
              r.replays ? ", replayed once after a stage dropped" : "");
  if (r.audited_hops > 0)
    std::printf("audit: %lld hop(s) drawn, %lld re-run and compared bit for bit%s\n", static_cast<long long>(r.audited_hops),
                static_cast<long long>(r.recomputed_hops), r.audit_failures.empty() ? ", all exact" : "");
  for (const auto& f : r.audit_failures) std::printf("%s\n", f.c_str());
  if (verify) std::printf("%s\n", r.verify_message.c_str());
  std::fflush(stdout);
}

}  // namespace daisy::cli
