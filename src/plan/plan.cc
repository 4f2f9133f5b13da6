// Planning and routing: pure functions, so every device derives the same plan.
#include "daisy/plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "daisy/memory.h"

namespace daisy {

namespace {

// The reference product of kernels::MeasureCapacityGemmsPerSecond (m = 1, n = k = 4096):
// the unit the hello's capacity is measured in.
constexpr double kReferenceGemmMacs = 4096.0 * 4096.0;

// An int8 matrix with one f32 scale per row, per term: a narrow model holds two terms
// (model.h NarrowModel).
uint64_t MatrixBytes(uint64_t rows, uint64_t cols, uint64_t terms) {
  return terms * (rows * cols + 4 * rows);
}

}  // namespace

PlanModel PlanModelFromSpec(const ModelSpec& s, int ctx, int embed_bytes_per_value) {
  const uint64_t hidden = static_cast<uint64_t>(s.hidden), head_dim = static_cast<uint64_t>(s.head_dim);
  const uint64_t q = static_cast<uint64_t>(s.n_heads) * head_dim, kv = static_cast<uint64_t>(s.n_kv_heads) * head_dim;
  const uint64_t inter = static_cast<uint64_t>(s.intermediate), vocab = static_cast<uint64_t>(s.vocab);
  const uint64_t terms = NarrowModel(s) ? 2 : 1;
  uint64_t layer = MatrixBytes(q + 2 * kv, hidden, terms) + MatrixBytes(hidden, q, terms) +
                   MatrixBytes((s.gated_mlp ? 2 : 1) * inter, hidden, terms) + MatrixBytes(hidden, inter, terms) +
                   4 * 4 * hidden /* norms and their biases */;
  if (s.qkv_bias) layer += 4 * (q + 2 * kv);
  // KV cache, per position: K as two int8 terms (the second quantizes the first's residual)
  // and V as one int8 term (two in a narrow model), each with one f32 scale per kv head;
  // value rows held in whole tiles of 16 dimensions, positions in whole tiles of 16
  // (forward.h KvCache::PositionBytes; plan may not depend on forward, DESIGN.md).
  const uint64_t kv_terms = 2 + terms, heads = static_cast<uint64_t>(s.n_kv_heads);
  const uint64_t value_row = (head_dim + 15) / 16 * 16, slots = (static_cast<uint64_t>(ctx) + 15) / 16 * 16;
  layer += slots * (2 * kv + terms * heads * value_row + kv_terms * 4 * heads);
  PlanModel m;
  m.n_layers = s.n_layers;
  m.layer_bytes = layer;
  // Embedding rows kept at the file's width plus the int8 LM head (the int8 copy of the
  // embedding when tied), final norm, learned positions, and the logits of a step.
  m.head_bytes = static_cast<uint64_t>(embed_bytes_per_value) * vocab * hidden + MatrixBytes(vocab, hidden, terms) +
                 8 * hidden + 4 * 4 * vocab +
                 (s.learned_positions ? 4 * static_cast<uint64_t>(s.max_positions) * hidden : 0);
  // Activations of the prefill chunk a stage computes (up to 64 positions: head/turn.cc
  // RingPrefillChunk), with its attention scores over the whole context and the MLP's
  // intermediate rows, a few copies each; the chunks waiting for it are only hidden states.
  constexpr uint64_t kPositions = 64;
  m.working_bytes = kProcessBytes + 4 * kPositions * 4 * (4 * hidden + q + 2 * kv + 3 * inter) +
                    4 * kPositions * static_cast<uint64_t>(s.n_heads) * static_cast<uint64_t>(ctx);
  const double macs = static_cast<double>((q + 2 * kv) * hidden + hidden * q + (s.gated_mlp ? 3 : 2) * inter * hidden);
  m.layer_cost_gemms = macs / kReferenceGemmMacs;
  return m;
}

namespace {

// Largest remainder: shares proportional to weights, summing to total, each <= cap.
Result<std::vector<int>> Apportion(int total, const std::vector<double>& weights, const std::vector<int>& caps) {
  const size_t n = weights.size();
  std::vector<int> out(n, 0);
  int remaining = total;
  std::vector<bool> open(n, true);
  for (size_t i = 0; i < n; ++i)
    if (caps[i] <= 0) open[i] = false;
  // Each round gives the open devices their proportional share of what is left; a device
  // that hits its memory cap is closed and the rest is shared again.
  while (remaining > 0) {
    double wsum = 0;
    for (size_t i = 0; i < n; ++i)
      if (open[i]) wsum += weights[i];
    if (wsum <= 0) return InvalidArgument("the model does not fit in the devices' free memory");
    std::vector<double> exact(n, 0);
    std::vector<int> add(n, 0);
    int given = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!open[i]) continue;
      exact[i] = remaining * weights[i] / wsum;
      add[i] = static_cast<int>(std::floor(exact[i]));
      given += add[i];
    }
    std::vector<size_t> order;
    for (size_t i = 0; i < n; ++i)
      if (open[i]) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return exact[a] - std::floor(exact[a]) > exact[b] - std::floor(exact[b]);
    });
    for (size_t k = 0; given < remaining && k < order.size(); ++k, ++given) ++add[order[k]];
    bool capped = false;
    for (size_t i = 0; i < n; ++i) {
      if (!open[i]) continue;
      int room = caps[i] - out[i];
      int take = std::min(add[i], room);
      out[i] += take;
      remaining -= take;
      if (out[i] >= caps[i]) {
        open[i] = false;
        capped = capped || take < add[i];
      }
    }
    if (!capped && remaining > 0) return Internal("Bug: apportioning left layers unassigned");
  }
  return out;
}

// No plan fits: what the model needs against what the budgets give, device by device.
template <typename MaxLayers>
Status Shortfall(const PlanModel& model, const std::vector<DeviceReport>& devices, MaxLayers&& max_layers) {
  uint64_t need = model.Need(model.n_layers, true) + (devices.size() - 1) * model.working_bytes;
  uint64_t budgets = 0;
  int room = 0;
  std::string each;
  for (size_t i = 0; i < devices.size(); ++i) {
    const int cap = std::max(0, max_layers(devices[i], i == 0));
    room += cap;
    budgets += devices[i].free_memory;
    each += (i ? ", " : "") + devices[i].name + " " + FormatBytes(devices[i].free_memory) + " (room for " +
            std::to_string(cap) + (cap == 1 ? " layer)" : " layers)");
  }
  const int missing = model.n_layers - room;
  const uint64_t short_by = need > budgets ? need - budgets : static_cast<uint64_t>(missing) * model.layer_bytes;
  return InvalidArgument("the model does not fit in the devices' memory budgets: it needs " + FormatBytes(need) +
                         " over " + std::to_string(devices.size()) + " device(s) (" + std::to_string(model.n_layers) +
                         " layers of " + FormatBytes(model.layer_bytes) + " with their KV cache, the head's tensors " +
                         FormatBytes(model.head_bytes) + ", " + FormatBytes(model.working_bytes) +
                         " of working memory per device) but the budgets add up to " + FormatBytes(budgets) + " [" +
                         each + "]: short by " + FormatBytes(short_by) + ", " + std::to_string(missing) +
                         " layer(s) without a place; "
                         "stopping before any download (add a device, raise --max-memory, or use a smaller --ctx)");
}

}  // namespace

Result<Plan> MakePlan(const PlanModel& model, const std::vector<DeviceReport>& devices, const PlanOptions& options) {
  if (devices.empty()) return InvalidArgument("no devices to plan over");
  if (model.n_layers <= 0) return InvalidArgument("the model has no layers");
  Plan plan;
  const DeviceReport& head = devices[0];

  // Eligible devices: the head first, then the others by id; a probe mismatch is left out.
  std::vector<DeviceReport> eligible = {head};
  std::vector<DeviceReport> others(devices.begin() + 1, devices.end());
  std::sort(others.begin(), others.end(), [](const DeviceReport& a, const DeviceReport& b) { return a.id < b.id; });
  std::set<std::string> seen = {head.id};
  for (const auto& d : others) {
    if (!seen.insert(d.id).second) return InvalidArgument("device id '" + d.id + "' appears twice");
    if (d.probe_hash != head.probe_hash) {
      plan.notes.push_back("left out " + d.name + " (" + d.id +
                           "): its probe hash differs from the head's, so its arithmetic is not bit-identical");
      continue;
    }
    eligible.push_back(d);
  }

  auto max_layers = [&](const DeviceReport& d, bool is_head) -> int {
    const uint64_t extra = model.Need(0, is_head) + (is_head ? options.head_reserve_bytes : 0);
    if (d.free_memory < extra) return is_head ? -1 : 0;
    const uint64_t per_layer = model.layer_bytes + (is_head ? options.head_reserve_per_layer : 0);
    if (per_layer == 0) return model.n_layers;
    return static_cast<int>(
        std::min<uint64_t>((d.free_memory - extra) / per_layer, static_cast<uint64_t>(model.n_layers)));
  };
  if (max_layers(head, true) < 0)
    return InvalidArgument(
        "the head (" + head.name + ") has a memory budget of " + FormatBytes(head.free_memory) + " but needs " +
        FormatBytes(model.Need(0, true) + options.head_reserve_bytes) + " before any layer (embedding, LM head, " +
        FormatBytes(model.working_bytes) + " of working memory" +
        (options.head_reserve_bytes ? ", " + FormatBytes(options.head_reserve_bytes) + " for Verify" : std::string()) +
        "): short by " + FormatBytes(model.Need(0, true) + options.head_reserve_bytes - head.free_memory) +
        "; stopping before any download (raise its --max-memory or use a smaller model)");

  std::vector<int> counts;
  if (options.layer_counts) {
    counts = *options.layer_counts;
    if (counts.empty()) return InvalidArgument("--plan lists no stages");
    if (counts.size() > eligible.size())
      return InvalidArgument("--plan lists " + std::to_string(counts.size()) + " stages but only " +
                             std::to_string(eligible.size()) + " devices are available");
    int sum = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      if (counts[i] < 0 || (i > 0 && counts[i] == 0))
        return InvalidArgument("--plan: stage " + std::to_string(i) +
                               " needs at least one layer (only the head may have none)");
      sum += counts[i];
    }
    if (sum != model.n_layers)
      return InvalidArgument("--plan covers " + std::to_string(sum) + " layers but the model has " +
                             std::to_string(model.n_layers));
    eligible.resize(counts.size());
    for (size_t i = 0; i < counts.size(); ++i)
      if (counts[i] > max_layers(eligible[i], i == 0))
        return InvalidArgument("--plan gives " + std::to_string(counts[i]) + " layers to " + eligible[i].name +
                               ", which need " + FormatBytes(model.Need(counts[i], i == 0)) +
                               " but its memory budget is " + FormatBytes(eligible[i].free_memory) +
                               "; stopping before any download");
  } else {
    size_t n = eligible.size();
    if (options.stages) {
      if (*options.stages < 1) return InvalidArgument("--stages must be at least 1");
      if (static_cast<size_t>(*options.stages) > eligible.size())
        return InvalidArgument("asked for " + std::to_string(*options.stages) + " stages but only " +
                               std::to_string(eligible.size()) + " devices are available");
      n = static_cast<size_t>(*options.stages);
    } else if (max_layers(head, true) >= model.n_layers) {
      n = 1;  // the head can hold everything: the turn stays on the head
    }
    eligible.resize(n);
    // A split asked for with --stages gives every non-head stage at least one layer; the
    // rest goes by capacity.
    const int floor_layers = options.stages ? 1 : 0;
    if (floor_layers && static_cast<int>(n) - 1 > model.n_layers)
      return InvalidArgument("asked for " + std::to_string(n) + " stages but the model has only " +
                             std::to_string(model.n_layers) + " layers");
    std::vector<double> weights;
    std::vector<int> caps;
    int reserved = 0;
    for (size_t i = 0; i < n; ++i) {
      const int fl = i == 0 ? 0 : floor_layers;
      const int cap = max_layers(eligible[i], i == 0);
      if (cap < fl)
        return InvalidArgument(eligible[i].name + " cannot hold even one layer: its memory budget is " +
                               FormatBytes(eligible[i].free_memory) + ", one layer needs " +
                               FormatBytes(model.Need(1, i == 0)) + "; stopping before any download");
      weights.push_back(std::max(eligible[i].gemms_per_s, 0.0));
      caps.push_back(cap - fl);
      reserved += fl;
    }
    int room = reserved;
    for (int c : caps) room += c;
    if (room < model.n_layers) return Shortfall(model, eligible, max_layers);
    auto apportioned = Apportion(model.n_layers - reserved, weights, caps);
    if (!apportioned.ok()) return apportioned.status();
    counts = *apportioned;
    for (size_t i = 1; i < n; ++i) counts[i] += floor_layers;
  }

  int first = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (i > 0 && counts[i] == 0) {
      plan.notes.push_back("dropped " + eligible[i].name + " (" + eligible[i].id + "): no layers to hold");
      continue;
    }
    StageAssignment s;
    s.device_id = eligible[i].id;
    s.device_name = eligible[i].name;
    s.address = eligible[i].address;
    s.relayed = eligible[i].relayed;
    s.first = first;
    s.end = first + counts[i];
    s.hold_bytes = static_cast<uint64_t>(counts[i]) * model.layer_bytes + (i == 0 ? model.head_bytes : 0);
    s.need_bytes = model.Need(counts[i], i == 0);
    s.budget_bytes = eligible[i].free_memory;
    first = s.end;
    if (eligible[i].gemms_per_s > 0)
      plan.est_seconds_per_token += counts[i] * model.layer_cost_gemms / eligible[i].gemms_per_s;
    else if (counts[i] > 0)
      plan.est_seconds_per_token = INFINITY;
    plan.stages.push_back(std::move(s));
  }
  if (plan.est_seconds_per_token > options.max_seconds_per_token) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", plan.est_seconds_per_token);
    return InvalidArgument(std::string("the estimated time per token is ") + buf + " s, above the limit of " +
                           std::to_string(static_cast<int>(options.max_seconds_per_token)) +
                           " s: stopping before any download (add devices or use a smaller model)");
  }
  DAISY_RETURN_IF_ERROR(ValidateAssignment(plan, model.n_layers, head.id));
  return plan;
}

Status ValidateAssignment(const Plan& plan, int n_layers, const std::string& head_id) {
  if (plan.stages.empty()) return InvalidArgument("the plan has no stages");
  if (plan.stages[0].device_id != head_id)
    return InvalidArgument("stage 0 of the plan is '" + plan.stages[0].device_id + "', not the head '" + head_id + "'");
  std::set<std::string> ids;
  int expect = 0;
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const auto& s = plan.stages[i];
    if (!ids.insert(s.device_id).second) return InvalidArgument("device '" + s.device_id + "' holds two stages");
    if (s.first != expect)
      return InvalidArgument(
          "stage " + std::to_string(i) + " starts at layer " + std::to_string(s.first) +
          (s.first > expect ? ": layers " + std::to_string(expect) + ".." + std::to_string(s.first) + " are not covered"
                            : ": layer " + std::to_string(s.first) + " is covered twice"));
    if (s.end < s.first || (i > 0 && s.end == s.first))
      return InvalidArgument("stage " + std::to_string(i) + " has no layers");
    expect = s.end;
  }
  if (expect != n_layers)
    return InvalidArgument("the plan covers layers [0, " + std::to_string(expect) + ") but the model has " +
                           std::to_string(n_layers));
  return Status::Ok();
}

Result<Hop> Route(const Plan& plan, int from_stage) {
  const int n = static_cast<int>(plan.stages.size());
  if (from_stage < 0 || from_stage >= n)
    return InvalidArgument("no stage " + std::to_string(from_stage) + " in a plan of " + std::to_string(n));
  if (from_stage + 1 < n) return Hop{false, from_stage + 1};
  return Hop{true, kReturnAddress};
}

}  // namespace daisy
