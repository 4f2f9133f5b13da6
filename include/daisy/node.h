// A ring member that holds layers: joins a room (as a RoomMember, daisy/ring.h), is
// assigned a slice by a head, fetches its own layers itself, reports ready and serves hops
// until stopped. Device identity and admission, shared by every role, are in daisy/ring.h.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "daisy/hub.h"
#include "daisy/model.h"
#include "daisy/net.h"
#include "daisy/stage.h"
#include "daisy/status.h"
#include "daisy/wire.h"

namespace daisy {

// NodeFaults (tests only: a device that lies or lags on purpose): daisy/stage.h.

// The local model folder an assignment names, if this device allows it: `path` with its
// symlinks and ".." resolved (realpath) must be one of `allowed_dirs` (each resolved too) or
// lie under one. Otherwise refused with an error naming `path`, before anything under it is
// opened. Returns the resolved path.
Result<std::string> AllowedModelFolder(const std::string& path, const std::vector<std::string>& allowed_dirs);

struct NodeOptions {
  std::string role = "node";  // which id under DAISY_HOME this device uses
  std::string rendezvous;     // "tcp://HOST:PORT"
  std::string room = "default";
  std::string name;                         // empty: the host name
  std::string bind_host = "127.0.0.1";      // the address peers reach this device at
  int port = 0;                             // the inbox's port (0: any free port)
  std::string advertise;                    // "HOST:PORT" peers are told to send to ("": the inbox's own)
  bool no_listen = false;                   // bind no port: every hop through serve's relay
  std::string server_key;                   // --server-key FPR (see JoinOptions)
  std::optional<net::Admission> admission;  // in-process admission (see JoinOptions)
  HubOptions hub;                           // this device's own credentials and cache
  // Print the text of the room's turns as it arrives (wire::Text from any head of the room,
  // whether or not this device holds layers of the turn) on stdout; node --no-show-tokens.
  bool print_tokens = true;
  // Each such message, with the sending head's device id and name ("" when the room's list
  // does not have it), on the node's thread: serve shows the room's stream in the web UI.
  std::function<void(const std::string& head_id, const std::string& head_name, const wire::Text& text)> on_text;
  const std::atomic<bool>* stop = nullptr;  // stops the loop when it becomes true
  int cache_slots = 4;                      // conversations whose KV this device keeps (prefix cache)
  // Local folders an assignment may name (node --models-dir): a folder is opened only if it
  // lies under one of these (see AllowedModelFolder). Empty: Hub repo ids only.
  std::vector<std::string> models_dirs;
  NodeFaults* faults = nullptr;  // tests only (see NodeFaults); not owned
  // --max-memory: the budget this device reports and holds to; unset: FreeMemoryBytes(). An
  // assignment whose layers need more (PlanModel::Need) is refused before any download.
  std::optional<uint64_t> max_memory;
};

// Runs the member loop until *options.stop is true. Survives a head that disappears and
// serves the next turn. Returns an error only when it cannot start (a --models-dir that is
// not a folder among them).
Status RunNode(const NodeOptions& options);

}  // namespace daisy
