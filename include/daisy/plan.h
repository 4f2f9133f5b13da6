// The ring plan: pure functions of value types (DESIGN.md "The plan"). Every device derives
// the same plan from the same reports. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "daisy/model.h"
#include "daisy/status.h"

namespace daisy {

// What a device reports in its hello.
struct DeviceReport {
  std::string id;            // peer id; devices after the head are ordered by it
  std::string name;          // for people
  double gemms_per_s = 0;    // measured through the live kernel on the reference GEMM
  uint64_t free_memory = 0;  // the device's memory budget (--max-memory, else MemAvailable), bytes
  uint64_t probe_hash = 0;   // kernels::ProbeHash(); must equal the head's
  std::string backend;
  std::string address;   // its inbox ("tcp://host:port"), carried into the plan
  bool relayed = false;  // accepts no connections: its hops go through serve's relay
};

// What planning needs to know of the model, independent of any device.
struct PlanModel {
  int n_layers = 0;
  uint64_t layer_bytes = 0;     // resident bytes of one layer (int8 weights + KV cache)
  uint64_t head_bytes = 0;      // the head's extra tensors (embedding, LM head, norms)
  double layer_cost_gemms = 0;  // one token through one layer, in reference GEMMs
  uint64_t working_bytes = 0;   // per device, whatever it holds: process, buffers, activations

  // What a device holding `layers` layers (and the head's tensors when `is_head`) needs.
  uint64_t Need(int layers, bool is_head) const {
    return static_cast<uint64_t>(layers) * layer_bytes + (is_head ? head_bytes : 0) + working_bytes;
  }
};
// The part of every device's need that does not depend on the model's size: the process
// itself (code, libraries, tokenizer, sockets), load blocks and range buffers.
inline constexpr uint64_t kProcessBytes = 96ull << 20;
// Resident sizes from the spec: int8 matrices + one f32 scale per row, f32 norms and
// biases, an int8 KV cache of ctx positions (+ one f32 scale per position and head), the
// embedding at the width it is held (the file's: 2 bytes per value for BF16/F16, 4 for
// F32), and working bytes (kProcessBytes + activations of a prefill chunk in flight).
PlanModel PlanModelFromSpec(const ModelSpec& spec, int ctx, int embed_bytes_per_value = 2);

struct PlanOptions {
  std::optional<int> stages;                     // split over exactly this many devices
  std::optional<std::vector<int>> layer_counts;  // explicit layers per stage, head first
  double max_seconds_per_token = 120;            // refuse before any download above this
  // Room the head keeps beside its stage (a verified turn: stage-by-stage Verify's slice and
  // the hidden states), and per layer it holds (that Verify's second KV cache of its layers).
  uint64_t head_reserve_bytes = 0;
  uint64_t head_reserve_per_layer = 0;
};

struct StageAssignment {
  std::string device_id;
  std::string device_name;
  int first = 0;  // layers [first, end)
  int end = 0;
  uint64_t hold_bytes = 0;      // weights and KV cache of its layers (+ the head's tensors)
  uint64_t need_bytes = 0;      // hold_bytes + working bytes: what its budget must cover
  uint64_t budget_bytes = 0;    // its budget, as reported
  std::string address;          // where its hops are sent (the head's: where laps RETURN)
  uint64_t download_bytes = 0;  // its tensors as stored (the head fills it from the index)
  uint64_t peak_rss_bytes = 0;  // its peak resident set as it last reported it; 0: unknown
  bool relayed = false;         // its hops go through serve's relay (address relay://ID)
};

struct Plan {
  std::vector<StageAssignment> stages;  // stage 0 is the head
  double est_seconds_per_token = 0;
  std::vector<std::string> notes;  // devices left out or dropped, and why
  // A preview that could not be made (HeadSession::PreviewPlan): fits is false and warning
  // says why, so the user sees it before any download.
  bool fits = true;
  std::string warning;
};

// Capacities + free memory + model -> plan. devices[0] is the head. The head is stage 0,
// then devices ordered by id; layers by largest remainder of capacity, capped by memory;
// a non-head device with zero layers is dropped; a device whose probe differs from the
// head's is left out. When the head can hold the whole model and no split was asked for,
// the plan is the head alone. Every device's layers are capped by its budget (PlanModel::
// Need); when no plan fits, the error names what the model needs, what the budgets give
// and the shortfall, so the head refuses before anything is downloaded.
Result<Plan> MakePlan(const PlanModel& model, const std::vector<DeviceReport>& devices, const PlanOptions& options);

// Refuses a plan that does not cover [0, n_layers) exactly once in order, whose stage 0 is
// not the head, or in which a device appears twice or a non-head stage is empty.
Status ValidateAssignment(const Plan& plan, int n_layers, const std::string& head_id);

// Where an activation goes after `from_stage` has run its layers: the next stage, or the
// head's RETURN address at the end of the lap. RETURN is never "stage 0": stage 0 starts a
// lap, RETURN ends one.
inline constexpr int kReturnAddress = -1;
struct Hop {
  bool to_return = false;
  int stage = 0;  // valid when !to_return
};
Result<Hop> Route(const Plan& plan, int from_stage);

}  // namespace daisy
