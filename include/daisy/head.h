// A request's life on the head: join the room, plan over the devices there, assign each
// stage its layers (never weights), wait until every stage is ready, then prefill and
// decode with laps around the ring, broadcasting each token; replay once around a stage
// that drops; optionally verify against a single-device run. Not thread-safe: one turn at
// a time per HeadSession.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/generator.h"
#include "daisy/hub.h"
#include "daisy/status.h"

namespace daisy {

struct HeadOptions {
  std::string rendezvous;               // "tcp://HOST:PORT"
  std::string room = "default";
  std::string name;
  std::string bind_host = "127.0.0.1";
  std::string model;                    // SRC
  HubOptions hub;
  std::string prompt;
  GenerateOptions generate;             // stop ids are added from the model's config
  int ctx = 0;                          // 0: DefaultContext(spec)
  std::optional<int> stages;            // split over exactly N devices (incl. the head)
  std::optional<std::vector<int>> plan; // layers per stage, head first
  bool verify = false;
  double wait_s = 30;                   // how long --stages waits for devices
  double lap_timeout_s = 60;            // a lap that takes longer has stalled
  std::function<void(std::string_view)> on_text;    // streamed text as tokens arrive
  std::function<void(std::string_view)> on_status;  // plan, progress, re-plans (lines)
};

struct HeadStageReport {
  std::string device_id;
  std::string device_name;
  int first = 0;
  int end = 0;
  uint64_t download_bytes = 0;  // bytes of its tensors as stored
};

struct HeadReport {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> ids;
  std::string text;
  std::string finish_reason;
  std::vector<HeadStageReport> plan;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double tokens_per_s = 0;      // decode
  int64_t ring_hops = 0;        // activation messages sent around the ring
  int64_t laps = 0;
  double lap_seconds = 0;       // wall time inside laps (transport + remote compute)
  int replays = 0;
  std::optional<bool> verified;
  std::string verify_message;   // the VERIFIED line or the first mismatch
};

Result<HeadReport> RunHead(const HeadOptions& options);

}  // namespace daisy
