#include "ring_common.h"

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "daisy/memory.h"

namespace daisy::cli {

std::atomic<bool>& StopRequested() {
  static std::atomic<bool> stop{false};
  return stop;
}

namespace {
void OnSignal(int) {
  StopRequested().store(true);
}
}  // namespace

void InstallStopSignals() {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);
}

void AddMaxMemoryFlag(CLI::App* app, std::string& text) {
  app->add_option("--max-memory", text,
                  "Memory budget of this device, e.g. 512M, 4G, 1.5GiB (default: what the OS reports as available, "
                  "MemAvailable). The plan gives it only the layers whose weights, KV cache and working memory fit; an "
                  "assignment that does not fit is refused before any download");
}

void AddShareTokensFlag(CLI::App* app, bool& no_share) {
  app->add_flag("--no-share-tokens", no_share,
                "Send the text of this head's turns to no other device (by default every device of the room, "
                "approved by the host, sees it as it is generated, whether or not it holds layers of the turn)");
}

Result<std::optional<uint64_t>> ParseMaxMemory(const std::string& text) {
  if (text.empty()) return std::optional<uint64_t>{};
  auto bytes = ParseMemorySize(text);
  if (!bytes.ok()) return InvalidArgument("--max-memory: " + bytes.status().message());
  if (const uint64_t avail = AvailableMemoryBytes(); avail > 0 && *bytes > avail)
    std::fprintf(stderr, "warning: --max-memory %s is more than the %s this machine reports as available now\n",
                 text.c_str(), FormatBytes(avail).c_str());
  return std::optional<uint64_t>(*bytes);
}

void PrintHeadReport(const HeadReport& r, bool json, bool verify) {
  if (json) {
    nlohmann::json plan = nlohmann::json::array();
    for (const auto& s : r.plan)
      plan.push_back({{"device", s.device_name},
                      {"device_id", s.device_id},
                      {"layers", {s.first, s.end}},
                      {"bytes", s.download_bytes},
                      {"need_bytes", s.need_bytes},
                      {"budget_bytes", s.budget_bytes},
                      {"peak_rss_bytes", s.peak_rss_bytes},
                      {"relayed", s.relayed}});
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
                          {"ready_seconds", r.ready_seconds},
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
      out["verify_mode"] = r.verify_mode;
      out["verify_seconds"] = r.verify_seconds;
      out["verify_peak_rss_bytes"] = r.verify_peak_rss_bytes;
    }
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  std::printf("\n\n%zu tokens (%s), %.1f tok/s decode, %lld ring hops in %lld laps, lookahead kept %d of %d drafts%s\n",
              r.ids.size(), r.finish_reason.c_str(), r.tokens_per_s, static_cast<long long>(r.ring_hops),
              static_cast<long long>(r.laps), r.accepted, r.drafted,
              r.replays ? ", replayed once after a stage dropped" : "");
  if (r.audited_hops > 0)
    std::printf("audit: %lld hop(s) drawn, %lld re-run and compared bit for bit%s\n",
                static_cast<long long>(r.audited_hops), static_cast<long long>(r.recomputed_hops),
                r.audit_failures.empty() ? ", all exact" : "");
  for (const auto& f : r.audit_failures) std::printf("%s\n", f.c_str());
  for (size_t i = 0; i < r.plan.size(); ++i) {
    const auto& s = r.plan[i];
    if (s.peak_rss_bytes == 0) continue;
    std::printf("stage %zu (%s): peak memory %s of a %s budget (the plan counted %s)\n", i, s.device_name.c_str(),
                FormatBytes(s.peak_rss_bytes).c_str(), FormatBytes(s.budget_bytes).c_str(),
                FormatBytes(s.need_bytes).c_str());
  }
  if (verify && !r.verify_mode.empty())
    std::printf("verify (%s): %.1f s%s\n", r.verify_mode.c_str(), r.verify_seconds,
                r.verify_peak_rss_bytes ? (", peak memory " + FormatBytes(r.verify_peak_rss_bytes)).c_str() : "");
  if (verify) std::printf("%s\n", r.verify_message.c_str());
  std::fflush(stdout);
}

}  // namespace daisy::cli
