// The head's view of the room.
#include "room.h"

#include "daisy/log.h"

namespace daisy::head {

std::optional<wire::Message> HeadRoom::Poll(int timeout_ms, int hidden) {
  auto in = member_.Receive(timeout_ms, hidden, [&](const std::string& key) { return stage_keys_.count(key) > 0; });
  if (!in.ok() || !in->has_value()) return std::nullopt;
  Incoming& frame = **in;
  last_sender_ = frame.sender;
  if (!frame.message.ok()) {  // Receive hands over only a stage's undecodable frames
    LogWarning("head: refused a frame: " + frame.message.status().message());
    last_refusal_ = frame.message.status().message();
    return std::nullopt;
  }
  if (std::holds_alternative<wire::Peers>(*frame.message)) return std::nullopt;  // applied by the member
  if (!stage_keys_.count(frame.sender)) {
    member_.Dropped(frame.sender, "a frame from a member that is not a stage of this turn");
    return std::nullopt;
  }
  return std::move(*frame.message);
}

std::optional<wire::Message> HeadRoom::Next(int timeout_ms, int hidden) {
  if (!stash_.empty()) {
    wire::Message m = std::move(stash_.front().first);
    last_sender_ = std::move(stash_.front().second);
    stash_.pop_front();
    return m;
  }
  return Poll(timeout_ms, hidden);
}

void HeadRoom::SetStageDevices(const std::vector<std::string>& device_ids) {
  stage_keys_.clear();
  stash_.clear();
  for (const auto& id : device_ids)
    if (std::string key = member_.KeyOf(id); !key.empty()) stage_keys_.insert(key);
}

bool HeadRoom::FromStage(const Plan& plan, int s) const {
  return s >= 1 && static_cast<size_t>(s) < plan.stages.size() &&
         last_sender_ == member_.KeyOf(plan.stages[static_cast<size_t>(s)].device_id);
}

int HeadRoom::StageOfSender(const Plan& plan) const {
  for (size_t i = 1; i < plan.stages.size(); ++i)
    if (FromStage(plan, static_cast<int>(i))) return static_cast<int>(i);
  return -1;
}

}  // namespace daisy::head
