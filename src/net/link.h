// serve's side of the browser tab's link (DCL1 over a WebSocket; docs/WIRE.md, "link"): a
// server on 127.0.0.1 that PortMux hands GET /api/link. Each link is one tab: the
// handshake proves its key, then every message is an envelope between that key and the
// rendezvous key (PeerBoxes). The server knows no room: what a tab's frames mean is the
// rendezvous's business (Hooks). Internal to net.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daisy/net.h"

namespace daisy::net {

// Takes a frame for one linked tab: thread-safe; false when the link is gone or already
// holds too much that the tab has not taken.
using LinkSink = std::function<bool(std::vector<uint8_t> frame)>;

class LinkServer {
 public:
  // Called on the link's own thread.
  struct Hooks {
    // The key is approved in some room (else the link is closed with 4003).
    std::function<bool(const std::string& key)> approved;
    // A link finished its handshake: frames for the tab go to `sink` until `down`.
    std::function<void(const std::string& key, uint64_t link, LinkSink sink)> up;
    // A link that was up ended; `superseded` when a newer link of the same key is up.
    std::function<void(const std::string& key, uint64_t link, bool superseded)> down;
    // An inner frame the tab sent (opened, not yet decoded).
    std::function<void(const std::string& key, std::vector<uint8_t> frame)> frame;
  };
  struct Options {
    int max_links = 64;
    double ping_s = kLinkPingSeconds;
    double timeout_s = kLinkTimeoutSeconds;
    double handshake_s = 10;
  };
  // Listens on 127.0.0.1 (any free port) with the rendezvous's key pair.
  static Result<std::unique_ptr<LinkServer>> Start(const KeyPair& keys, Hooks hooks, Options options);
  ~LinkServer();  // closes every link (1001, serve is stopping) and waits for their threads
  LinkServer(const LinkServer&) = delete;
  LinkServer& operator=(const LinkServer&) = delete;

  int port() const;
  int links() const;  // past the upgrade: in the handshake or up

  struct Impl;  // link.cc's links use it too

 private:
  explicit LinkServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace daisy::net
