// The browser tab as a ring member: the client side of serve's link (DCL1, docs/WIRE.md
// "link") and a member that holds layers through it. No socket, thread or HTTP client:
// bytes in, bytes out, so the same code runs natively (tests) and in a Web Worker (wasm,
// apps/wasm/tab_api.cc), where the page's main thread holds the WebSocket.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/seal.h"
#include "daisy/source.h"
#include "daisy/stage.h"
#include "daisy/status.h"
#include "daisy/wire.h"

namespace daisy::tab {

// The client side of one DCL1 session: serve's first message (its rendezvous key and a
// challenge) -> the tab's answer (its key and an envelope with both challenges) -> serve's
// proof (an envelope with the tab's challenge) -> up; then every message either way is one
// envelope between the tab's key and the rendezvous key, counters strictly increasing per
// direction. Not thread-safe.
class LinkClient {
 public:
  // `expected_server_key`: the rendezvous key the person was shown (GET /api/key), or ""
  // to take the one serve sends (the caller shows its fingerprint).
  explicit LinkClient(net::KeyPair keys, std::string expected_server_key = "");
  ~LinkClient();
  LinkClient(const LinkClient&) = delete;
  LinkClient& operator=(const LinkClient&) = delete;

  // serve's first message -> the tab's answer. InvalidArgument for a wrong magic, version
  // or length; PermissionDenied for a key other than the expected one.
  Result<std::vector<uint8_t>> Answer(std::span<const uint8_t> first);
  // serve's proof: PermissionDenied unless it is an envelope from the rendezvous key to
  // this tab holding the tab's challenge. Up after it.
  Status Confirm(std::span<const uint8_t> proof);
  bool up() const { return up_; }
  const std::string& server_key() const { return server_key_; }
  const std::string& server_id() const { return server_id_; }

  // Once up: the message carrying an inner frame (an encoded wire::Message) up the link.
  Result<std::vector<uint8_t>> Seal(std::span<const uint8_t> inner);
  // Once up: the inner frame of a message from serve. PermissionDenied for wrong ids, a
  // counter already opened or too old (a replay) or a box that does not open.
  Result<std::vector<uint8_t>> Open(std::span<const uint8_t> message);

 private:
  net::KeyPair keys_;
  std::string my_id_;
  std::string expected_;
  std::string server_key_, server_id_;
  std::array<uint8_t, net::kLinkChallengeBytes> challenge_c_{};
  bool answered_ = false;
  bool up_ = false;
  std::unique_ptr<net::PeerBoxes> boxes_;
};

// The tab's ring member. Inputs: serve's link messages (Receive) and the passing of time
// (Tick). Outputs: the messages to send up the link (TakeOutgoing) and what happened, as
// JSON objects for the page (TakeEvents). Once the link is up it joins the room as
// relay://ID with kCapRelayed | kCapCompute, opens the envelopes of the room's members
// with the keys of the last peer list (net::PeerBoxes), and runs the same StageCore as the
// native node: assignment, its own layers fetched through TabOptions::open_model, ready,
// hops, caches, audit answers, busy, head gone. Not thread-safe: one thread (the worker's).
struct TabOptions {
  net::KeyPair keys;             // the tab's key pair (its secret kept in the page's storage)
  std::string server_key;        // the rendezvous key the person was shown; "": serve's own
  std::string room = "default";  // the room it was approved in
  std::string name;              // shown to the host ("browser-" and the id's first digits when empty)
  uint64_t budget = 0;           // bytes the plan may give this tab
  int cache_slots = 2;
  // The model a head names: in the browser, a ModelSource over XMLHttpRequest byte ranges
  // (apps/wasm); natively (tests), a local folder or the test Hub.
  std::function<Result<std::unique_ptr<ModelSource>>(const std::string& model_id, const std::string& revision)>
      open_model;
  NodeFaults* faults = nullptr;  // tests only; not owned
};

class TabMember : public StageHost {
 public:
  // Measures the hello (the live kernel's capacity and probe). Nothing is sent yet: the
  // link's first message is serve's.
  static Result<std::unique_ptr<TabMember>> Create(TabOptions options);
  ~TabMember() override;
  TabMember(const TabMember&) = delete;
  TabMember& operator=(const TabMember&) = delete;

  // One binary WebSocket message from serve. An error means the link must be closed (a
  // bad handshake, an envelope refused): the tab is then gone from the room and a new
  // TabMember (same keys) links again.
  Status Receive(std::span<const uint8_t> message);
  // The messages to send up the link, oldest first.
  std::vector<std::vector<uint8_t>> TakeOutgoing();
  // Time passes (call it every few hundred ms): a head gone from the room is forgotten, a
  // join that got no peer list is sent again.
  void Tick();
  // Leaves the room (bye up the link): the screen turned off, or the page goes away. The
  // link may stay open; what arrives meanwhile is opened and dropped.
  void Leave();
  // Joins the room again over the same link after Leave (the screen came back on): the
  // same key, so no new approval, and the slice held is kept.
  void Rejoin();
  // What happened since the last call, each a JSON object with an "event" field:
  // status, hello, slice, progress, text, log, error (see apps/wasm/README.md).
  std::vector<std::string> TakeEvents();

  const std::string& id() const { return hello_.device_id; }
  const std::string& address() const { return address_; }
  const wire::Hello& hello() const { return hello_; }
  bool linked() const { return link_.up(); }
  bool in_room() const { return in_room_; }
  const StageCore& stage() const { return *stage_; }

  // ---- StageHost ----
  Status Send(const std::string& address, const wire::Message& message, int timeout_ms) override;
  std::vector<wire::Peer> Peers() const override { return peers_; }
  std::string KeyOf(const std::string& device_id) const override;
  void Dropped(const std::string& sender, const std::string& what) override;
  void Reach(const std::string& address, const std::string& key) override;
  Result<std::unique_ptr<ModelSource>> OpenModel(const std::string& model_id, const std::string& revision) override;
  void Log(StageLog level, const std::string& line) override;
  void LoadStarted() override;
  void LoadProgress(const TransferProgress& progress) override;
  void OnText(const std::string& sender_key, const std::string& head_id, const std::string& head_name,
              const wire::Text& text) override;

 private:
  using Clock = std::chrono::steady_clock;
  explicit TabMember(TabOptions options);
  Status SendUp(const wire::Message& inner);
  void OnInner(std::vector<uint8_t> inner);
  void Event(const std::string& json);
  void StatusEvent(const std::string& state, const std::string& line);

  TabOptions o_;
  LinkClient link_;
  net::PeerBoxes boxes_;  // tab <-> member envelopes
  wire::Hello hello_;
  std::string address_;
  std::unique_ptr<StageCore> stage_;
  std::vector<wire::Peer> peers_;
  std::vector<std::pair<std::string, std::string>> reach_;  // address -> key, beyond the list
  bool in_room_ = false;
  bool left_ = false;
  Clock::time_point joined_at_{};
  Clock::time_point last_progress_event_{};
  int64_t dropped_ = 0;
  Clock::time_point last_drop_log_{};
  std::vector<std::vector<uint8_t>> outgoing_;
  std::vector<std::string> events_;
};

}  // namespace daisy::tab
