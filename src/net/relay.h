// The relay inside the rendezvous (see Rendezvous in daisy/net.h): forwards end-to-end
// boxed envelopes (wire::Relay) for members that accept no connections. Internal to net.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daisy/net.h"
#include "link.h"

namespace daisy::net {

class RelayCore {
 public:
  // Where an envelope goes: a member's inbox, or a relayed member's link.
  struct Target {
    std::string address;
    std::string public_key;
    bool relayed = false;
  };
  // The member `to_id` when it and the sender (`from_key`) are members of one room; nullopt
  // otherwise. Called on the relay's thread.
  using Resolve = std::function<std::optional<Target>(const std::string& from_key, const std::string& to_id)>;
  // A relayed member's link said who it is (the rendezvous re-sends it its room's list).
  using OnAttach = std::function<void(const std::string& device_id)>;

  // Binds the relay's ROUTER on 127.0.0.1 (any free port) with the rendezvous's key pair.
  static Result<std::unique_ptr<RelayCore>> Start(const KeyPair& keys, Resolve resolve, OnAttach on_attach,
                                                  RelayObserver observer);
  ~RelayCore();  // stops the thread
  RelayCore(const RelayCore&) = delete;
  RelayCore& operator=(const RelayCore&) = delete;

  int port() const;
  void SetAllowed(const std::vector<std::string>& public_keys);
  // Thread-safe. An envelope that reached the rendezvous's inbox from `sender_key`.
  void Forward(std::string sender_key, std::vector<uint8_t> frame);
  // Thread-safe. A frame of the rendezvous itself (a peer list, an error) for a relayed member.
  void Deliver(std::string device_id, std::vector<uint8_t> frame);
  // Thread-safe. A relayed member reached through another kind of link (a browser tab's
  // WebSocket, LinkServer): frames for `device_id` go to `sink` instead of a ROUTER
  // connection, until DetachLink with the same `link` (a newer link replaces an older one).
  void AttachLink(std::string device_id, uint64_t link, LinkSink sink);
  void DetachLink(std::string device_id, uint64_t link);
  int64_t forwarded() const;
  int64_t refused() const;

 private:
  struct Impl;
  explicit RelayCore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace daisy::net
