// The hop codec and the plan's wire form: the only places a plan becomes stage entries (and
// back) and rows become an activation (and back).
#include <utility>

#include "daisy/stage.h"

namespace daisy {

std::vector<wire::StageEntry> WireStages(const Plan& plan) {
  std::vector<wire::StageEntry> out;
  out.reserve(plan.stages.size());
  for (const auto& s : plan.stages) out.push_back({s.device_id, s.address, s.first, s.end});
  return out;
}

Plan PlanFromWire(const std::vector<wire::StageEntry>& stages) {
  Plan plan;
  for (const auto& s : stages) {
    StageAssignment a;
    a.device_id = s.device_id;
    a.address = s.address;
    a.relayed = wire::IsRelayAddress(s.address);
    a.first = s.first;
    a.end = s.end;
    plan.stages.push_back(std::move(a));
  }
  return plan;
}

std::string_view MessageName(const wire::Message& message) {
  return std::visit([](const auto& m) { return wire::TagName(static_cast<int32_t>(std::decay_t<decltype(m)>::kTag)); },
                    message);
}

int32_t WireNext(const Hop& hop) {
  return hop.to_return ? wire::kNextReturn : hop.stage;
}

Result<OutgoingHop> EncodeHop(const Plan& plan, int from_stage, int32_t seq, uint32_t model_hash,
                              HiddenStates& hidden) {
  DAISY_ASSIGN_OR_RETURN(Hop hop, Route(plan, from_stage));
  if (hidden.positions.empty()) return Internal("Bug: a hop without rows");
  OutgoingHop out;
  out.address = plan.stages[hop.to_return ? 0 : static_cast<size_t>(hop.stage)].address;
  out.activation.seq = seq;
  out.activation.token_index = hidden.positions.front();
  out.activation.next = WireNext(hop);
  out.activation.model_hash = model_hash;
  out.activation.values = std::move(hidden.values);
  hidden.values.clear();
  out.activation.act_hash = wire::ActHash(out.activation.values);
  return out;
}

Result<HiddenStates> DecodeHop(wire::Activation& activation, int hidden) {
  if (hidden <= 0) return Internal("Bug: DecodeHop without a row width");
  if (activation.values.empty() || activation.values.size() % static_cast<size_t>(hidden) != 0)
    return InvalidArgument("an activation of " + std::to_string(activation.values.size()) +
                           " values is not a whole number of rows of " + std::to_string(hidden));
  HiddenStates h;
  h.hidden = hidden;
  const int n = static_cast<int>(activation.values.size() / static_cast<size_t>(hidden));
  h.positions.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) h.positions.push_back(activation.token_index + i);
  h.values = std::move(activation.values);
  activation.values.clear();
  return h;
}

}  // namespace daisy
