// The turn's text for every device of the room (wire::Text): members that hold no layers of
// the turn, and every device when the turn stays on the head, show it as it is generated.
// Internal to the head module.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "daisy/net.h"
#include "daisy/status.h"
#include "daisy/wire.h"

namespace daisy::head {

// Sends from a thread and an outbox socket of its own (the head's key), so a slow or
// unreachable member never delays a lap: the turn only queues. Each member gets a stream's
// messages in order; one that cannot be reached within a few seconds misses the rest of
// that stream. Begin .. Fail are called by one thread at a time (the turn's); sent() by any.
class TextCast {
 public:
  // `boxes`: the head member's own (one counter for everything it seals), for members that
  // accept no connections: their text goes boxed through serve's relay.
  static Result<std::unique_ptr<TextCast>> Start(const net::KeyPair& keys, std::shared_ptr<net::PeerBoxes> boxes);
  ~TextCast();  // what is queued is sent first (a few seconds at most), then it stops
  TextCast(const TextCast&) = delete;
  TextCast& operator=(const TextCast&) = delete;

  // A new turn's stream, to `members` (each with its address and public key); a relayed
  // member's through the rendezvous at `rendezvous` (its address and key).
  void Begin(std::vector<wire::Peer> members, std::string rendezvous, std::string rendezvous_key);
  // Generated token `token_id` adds `text` (which may be empty).
  void Piece(int32_t token_id, std::string_view text);
  // Only the first `kept` tokens stand (the audit withdrew the rest).
  void Retract(size_t kept);
  // The turn is done; `tail` is the text the head held back until now.
  void End(std::string_view tail);
  void Fail();
  // Messages handed to a member's connection so far (tests).
  int64_t sent() const;

 private:
  struct Stream {
    std::vector<wire::Peer> members;
    std::string rendezvous, rendezvous_key;
  };
  struct Item {
    std::shared_ptr<const Stream> to;
    std::vector<uint8_t> frame;
  };
  TextCast() = default;
  void Queue(wire::Text t);
  void Loop();

  std::unique_ptr<net::Endpoint> out_;  // used by the thread only
  std::shared_ptr<net::PeerBoxes> boxes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  int64_t sent_ = 0;
  // The turn's stream (the turn's thread only).
  std::shared_ptr<const Stream> members_;
  uint32_t stream_ = 0;
  int32_t tokens_ = 0;
  std::thread thread_;
};

}  // namespace daisy::head
