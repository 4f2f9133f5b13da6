// The head's view of the room: a RoomMember that, during a turn, takes frames only from the
// turn's stages (and peer lists from the rendezvous), plus a stash for frames read while
// waiting for something else.
#pragma once

#include <deque>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "daisy/ring.h"

namespace daisy::head {

class HeadRoom {
 public:
  explicit HeadRoom(RoomMember& member) : member_(member) {}

  // The next frame from a stage of the turn, read from the inbox (never the stash). Peer
  // lists are applied; frames from any other member are dropped unread (and never end a
  // turn); a stage's frame that does not decode is kept for TakeRefusal.
  std::optional<wire::Message> Poll(int timeout_ms, int hidden);
  // The stash first (frames put back with Unread, in order), then the inbox.
  std::optional<wire::Message> Next(int timeout_ms, int hidden);
  void Unread(wire::Message message, std::string sender) { stash_.emplace_back(std::move(message), std::move(sender)); }

  // The keys of the turn's stages (the room lists each member's key); empty between turns.
  // The stash of the turn before goes.
  void SetStageDevices(const std::vector<std::string>& device_ids);
  // The key that sent the frame Poll or Next returned last.
  const std::string& last_sender() const { return last_sender_; }
  // Whether that key is stage s's own, in `plan`: a stage's digests and reports cannot be
  // forged by another member.
  bool FromStage(const Plan& plan, int s) const;
  // The stage whose key sent the frame returned last; -1 for none.
  int StageOfSender(const Plan& plan) const;
  std::string TakeRefusal() { return std::exchange(last_refusal_, ""); }

  RoomMember& member() { return member_; }
  std::string KeyOf(const std::string& device_id) const { return member_.KeyOf(device_id); }
  bool Has(const std::string& device_id) const { return member_.Has(device_id); }
  std::vector<wire::Peer> peers() const { return member_.Peers(); }
  bool seen_peers() const { return member_.seen_peers(); }

 private:
  RoomMember& member_;
  std::set<std::string> stage_keys_;
  std::string last_refusal_;
  std::string last_sender_;
  std::deque<std::pair<wire::Message, std::string>> stash_;  // with the key that sent it
};

}  // namespace daisy::head
