// The HTTP server of `daisychain serve`: the embedded web UI, its API (/api/state, the
// /api/events stream, approve, load, generate), the OpenAI-compatible API (/v1/models,
// /v1/completions, /v1/chat/completions) and /apply-template. docs/HTTP.md is the contract.
//
// One turn owns the ring: requests are tokenized at once, then wait in the head's line of
// turns (HeadSession::turns(), FIFO) for the ring; UI streams see their position. A
// client that goes away ends its stream, and a turn it was waiting for stops at the next
// token. Thread-safe: httplib serves each connection on a thread of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daisy/hub.h"
#include "daisy/status.h"

namespace daisy {

class HeadSession;
namespace net {
class Rendezvous;
}

struct ServerOptions {
  std::string host = "127.0.0.1";  // where the HTTP server listens (serve: 127.0.0.1, behind the mux)
  int port = 0;                    // 0: any free port
  std::string room = "default";
  std::string join_line;  // "daisychain node --join HOST:PORT --room ROOM", shown by the UI
  // The join page's URL for phones (JoinPageUrl), shown by the UI as a link and a QR code;
  // "": the UI uses its own origin.
  std::string join_url;
  bool auto_approve = false;
  net::Rendezvous* rendezvous = nullptr;  // devices (pending ones too) and approval; may be null
  HeadSession* session = nullptr;         // the head; required
  HubOptions hub;                         // for reading the chat template of a loaded model
  std::string compute_device_id;          // serve's own compute device ("" if none)
  // The real client address of a connection the port mux relays, by the loopback port the
  // server sees it from ("" when unknown): join requests are rate-limited per source.
  std::function<std::string(int remote_port)> source_of;
  int default_stages = 0;  // split when a request names none (0: automatic)
  // Access (docs/HTTP.md, "Access"). The host's UI (/, /api/* but the join endpoints) needs
  // this secret, in the cookie that GET /?token=SECRET sets; "": one is made at start
  // (admin_secret() says which).
  std::string admin_secret;
  // The OpenAI-compatible API (/v1/*, /apply-template) needs "Authorization: Bearer KEY";
  // "": it answers only clients on this machine (127.0.0.1, ::1).
  std::string api_key;
  // Host-header names served besides IP literals and localhost (against DNS rebinding).
  std::vector<std::string> allowed_hosts;
  // Limits against clients that hold connections (docs/HTTP.md, "Limits"). Each open
  // connection has a thread of its own, so event streams and slow clients never take the
  // threads that answer everyone else; past `threads`, new connections wait for one.
  int threads = 512;             // connections served at once (the port mux lets in 256)
  double header_timeout_s = 10;  // a request's line and headers must arrive within this
  double body_timeout_s = 30;    // and its body within this after the headers
  // /api/events streams: a browser tab holds one for as long as it is open. Past these,
  // 429 (per client address) or 503 (in all) with a message saying which limit.
  int max_event_streams = 64;
  int max_event_streams_per_client = 8;
};

// One message of a turn's text as a device of the room received it (wire::Text): the UI's
// "What the room sees" panel shows the room's turns, whichever head runs them.
struct RoomText {
  std::string head_id;    // the sending head's device id
  std::string head_name;  // and its name
  uint32_t stream = 0;    // the head's count of its turns
  std::string kind;       // "begin", "piece", "retract", "end" or "failed"
  int32_t index = 0;      // as in wire::Text
  std::string text;
};

class Server {
 public:
  // Binds and starts serving on its own threads.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();  // ends every stream, asks running turns to stop, stops listening
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  // The admin secret of the host's UI (ServerOptions::admin_secret, or the one made).
  const std::string& admin_secret() const;
  // Loads SRC as the session's model (as POST /api/load does) and reads its chat template.
  Status Load(const std::string& source, int ctx);
  // Sends `text` to every open /api/events stream (event room_text). Thread-safe.
  void ShowRoomText(const RoomText& text);

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// True when a server listening on `host` is reachable from this machine only (127.0.0.0/8,
// ::1, localhost); serve warns at start otherwise.
bool ListensOnLoopbackOnly(const std::string& host);

// The join page's URL for devices on the network when serve listens on `listen_host`:
// "http://HOST:PORT/join"; for 0.0.0.0 or ::, an up non-loopback IPv4 address of this
// machine; "" when serve listens on loopback only (or no such address exists): the UI then
// shows its own origin's /join.
std::string JoinPageUrl(const std::string& listen_host, int port);

// Only the join endpoints of a rendezvous (GET /api/key, POST /api/join; docs/HTTP.md),
// for a room run without the rest of serve (the demo). Thread-safe.
struct JoinServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string room = "default";
  net::Rendezvous* rendezvous = nullptr;  // required
  std::function<std::string(int remote_port)> source_of;
};

class JoinServer {
 public:
  static Result<std::unique_ptr<JoinServer>> Start(const JoinServerOptions& options);
  ~JoinServer();
  JoinServer(const JoinServer&) = delete;
  JoinServer& operator=(const JoinServer&) = delete;
  int port() const;

 private:
  struct Impl;
  explicit JoinServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace daisy
