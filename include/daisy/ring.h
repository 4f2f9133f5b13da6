// The ring's shared ground, between {net, wire, plan, forward} below and {head, node} above:
// who a device is (its identity and memory budget) and how it gets into a room (admission),
// one RoomMember that both the head and a node are, the hop codec (HiddenStates <-> the
// wire's Activation, next hop from plan::Route), and the plan's wire form. A new kind of
// member (a browser tab, a relayed device) is added here once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "daisy/forward.h"
#include "daisy/hub.h"
#include "daisy/model.h"
#include "daisy/net.h"
#include "daisy/plan.h"
#include "daisy/stage.h"
#include "daisy/status.h"
#include "daisy/wire.h"

namespace daisy {

// ---- identity (ring/identity.cc) ----

// Where a device keeps its id, settings and slice cache: $DAISY_HOME, else
// $XDG_CONFIG_HOME/daisychain or ~/.config/daisychain. Several devices can share a machine
// by giving each its own DAISY_HOME (the demo and the tests do).
std::string DeviceHome();
// The device's long-term CURVE key pair for a role ("node", "serve", "serve-head", "head",
// "rendezvous"): made on first run and kept in <home>/keys/<role>.key with mode 0600, so
// a serve and a run on one machine are two devices. A key file others can read is refused.
Result<net::KeyPair> DeviceKeys(const std::string& home, const std::string& role);
std::string DeviceKeyPath(const std::string& home, const std::string& role);
// The device's id for a role: net::KeyId of its public key (16 hex characters, the key's
// fingerprint without dashes).
Result<std::string> DeviceId(const std::string& home, const std::string& role);
// The slice cache: $DAISY_CACHE_DIR, else DeviceHome()/cache when DAISY_HOME is set, else
// the Hub client's default.
std::string DeviceCacheDir();
// Bytes this device can give to weights: MemAvailable from /proc/meminfo, or
// $DAISY_FREE_MEMORY (bytes) when set (tests and demos simulate small devices with it).
uint64_t FreeMemoryBytes();
// The memory budget a device reports: --max-memory when given, else FreeMemoryBytes().
uint64_t MemoryBudget(std::optional<uint64_t> max_memory);
// MeasureHello, PlanModelOf, SpecHash, ModelHashOf: daisy/stage.h.

// ---- admission (ring/admission.cc) ----

// How a device gets into a room: learn the rendezvous's public key and have the host
// approve this device's key for the room.
struct JoinOptions {
  std::string rendezvous;  // "tcp://HOST:PORT": the HTTP join is asked at http://HOST:PORT
  std::string room = "default";
  std::string name;
  // --server-key FPR: the rendezvous's key must have this fingerprint. "": trust on first
  // use, remembered per HOST:PORT in <home>/known_servers; a later change is refused.
  std::string server_fingerprint;
  std::string home;  // DeviceHome()
  // In-process (serve's own devices, tests): ask this instead of HTTP.
  std::optional<net::Admission> admission;
  const std::atomic<bool>* stop = nullptr;
  double unreachable_timeout_s = 0;  // give up when HTTP fails this long (0: keep trying)
};
// Blocks until the host approved `keys` for the room (printing this device's fingerprint,
// the server's, and "waiting for the host to approve ..." while pending); returns the
// rendezvous's public key. Refuses a server key that does not match --server-key or the
// one remembered for that address.
Result<std::string> AwaitAdmission(const JoinOptions& options, const net::KeyPair& keys);

// ---- the room member (ring/member.cc) ----

// One frame from a sender the owner expects, as RoomMember::Receive hands it over.
struct Incoming {
  std::string sender;             // the CURVE key that sent it
  Result<wire::Message> message;  // an error: it did not decode
};

// A device in a room, head or node alike: its keys and inbox, its hello, its admission by
// the host and its heartbeats (from a thread of their own, so long work never makes it look
// dead), and the room's member list as the rendezvous last sent it. Peer lists are taken
// only from the rendezvous and applied here (only members may then reach the inbox); every
// other frame is the owner's to judge, and what it drops is logged here, at most one line a
// second however many arrive. Peers(), KeyOf() and Has() are thread-safe; the rest belongs
// to the one thread that receives.
class RoomMember {
 public:
  struct Options {
    std::string role = "node";      // which key under DAISY_HOME
    std::string name;               // "": the host name
    std::string log_name = "node";  // how its log lines start
    std::string rendezvous;         // "tcp://HOST:PORT"
    std::string room = "default";
    std::string server_key;  // --server-key FPR (see JoinOptions)
    std::optional<net::Admission> admission;
    std::string bind_host = "127.0.0.1";
    int port = 0;           // the inbox's port (0: any free port)
    std::string advertise;  // "HOST:PORT" peers are told to send to ("": the inbox's own)
    // Accepts no connections (node --no-listen): no inbox is bound; after admission one
    // outbound link to serve's relay carries every frame to and from the room, each boxed
    // end to end (net::PeerBoxes). Its address is relay://ID.
    bool no_listen = false;
    double relay_connect_s = 10;  // the relay link must be up this soon after admission
    uint32_t capabilities = 0;    // wire::kCap*
    uint64_t budget = 0;          // memory budget for the hello
    const std::atomic<bool>* stop = nullptr;
    double unreachable_timeout_s = 0;
  };
  // Keys, inbox and the measured hello; nothing is sent yet.
  static Result<std::unique_ptr<RoomMember>> Create(const Options& options);
  ~RoomMember();
  RoomMember(const RoomMember&) = delete;
  RoomMember& operator=(const RoomMember&) = delete;

  // Blocks until the host approved this device (aborted: *stop became true), then starts
  // the heartbeats and the join from their own thread.
  Status Admit();
  bool admitted() const { return !server_key_.empty(); }
  // No heartbeat got through for net::kRendezvousLostSeconds: the rendezvous is gone or
  // restarted. Readmit asks again (the same server key is required).
  bool RendezvousLost() const;
  Status Readmit();
  // A join now, sooner than the heartbeat thread's (while waiting to appear in the room).
  void SendJoin(int timeout_ms);
  // Leaves the room: the heartbeats stop and the rendezvous hears bye.
  void Leave();

  // The next frame within timeout_ms: nullopt for none, or for one dropped here (a peer
  // list is applied and returned too). `expects(sender)`: whether a frame that does not
  // decode is reported to the owner (an error in Incoming::message) rather than dropped.
  Result<std::optional<Incoming>> Receive(int timeout_ms, int hidden,
                                          const std::function<bool(const std::string&)>& expects);
  // Logs a frame the owner refused (rate-limited): "<log_name>: dropped WHAT from key K".
  void Dropped(const std::string& sender, const std::string& what);
  void set_log_name(std::string name) { o_.log_name = std::move(name); }
  // To a member's inbox directly, or, when it or this member is relayed, boxed for it
  // through serve's relay (FailedPrecondition when no member of the room has that address).
  Status Send(const std::string& address, const wire::Message& message, int timeout_ms);
  bool relayed() const { return o_.no_listen; }

  std::vector<wire::Peer> Peers() const;
  std::string KeyOf(const std::string& device_id) const;  // "" when not in the room
  bool Has(const std::string& device_id) const;
  bool seen_peers() const;

  net::Endpoint& endpoint() { return *ep_; }
  const net::KeyPair& keys() const { return keys_; }
  const std::string& id() const { return hello_.device_id; }
  const wire::Hello& hello() const { return hello_; }
  const std::string& address() const { return address_; }  // what peers send to
  const std::string& server_key() const { return server_key_; }
  // The boxes this member seals relayed frames with: one counter, shared with a head's text.
  std::shared_ptr<net::PeerBoxes> boxes() const { return boxes_; }
  const Options& options() const { return o_; }

 private:
  RoomMember() = default;
  JoinOptions Join() const;
  Status StartPulse();
  // A relayed member's link says who it is every second (Admit said it first), so a
  // reconnected link is known again.
  void AttachToRelay();
  // A relayed member's link to serve's relay, up within relay_connect_s (a clear error if not).
  Status ConnectRelay();
  // The inner frame of an envelope from the relay, with its true sender's key; nullopt when
  // dropped (a sender not in the room, a box that does not open, a replay).
  std::optional<std::pair<std::string, std::vector<uint8_t>>> Unbox(const wire::Relay& envelope);

  Options o_;
  net::KeyPair keys_;
  std::unique_ptr<net::Endpoint> ep_;
  std::string address_;
  wire::Hello hello_;
  std::string server_key_;
  std::unique_ptr<net::Pulse> pulse_;
  std::shared_ptr<net::PeerBoxes> boxes_;  // the end-to-end boxes of relayed frames
  std::chrono::steady_clock::time_point last_attach_{};
  mutable std::mutex mu_;
  std::vector<wire::Peer> peers_;
  bool seen_peers_ = false;
  int64_t dropped_ = 0;
  std::chrono::steady_clock::time_point last_drop_log_ = std::chrono::steady_clock::now() - std::chrono::seconds(10);
};

// ---- the hop codec and the plan's wire form: daisy/stage.h ----

// ---- finding a room on the LAN (ring/discovery.cc) ----

// `serve` announces its room on the local network every kAnnounceIntervalMs: one UDP
// datagram to the administratively scoped group kDiscoveryGroup:kDiscoveryPort with TTL 1,
// so it never leaves the link. It says where to join (the port; the address is the
// datagram's source) and which server key to expect; nothing secret. The datagram:
//   "DCRM" | version u8 (1) | port u16 big-endian | room length u8 | room | fingerprint length u8 | fingerprint
// where the fingerprint is net::Fingerprint of the rendezvous's key ("ab12-cd34-ef56-7890").
inline constexpr const char* kDiscoveryGroup = "239.255.87.88";
inline constexpr int kDiscoveryPort = 8788;
inline constexpr int kAnnounceIntervalMs = 2000;
inline constexpr uint8_t kAnnounceVersion = 1;

struct Announcement {
  std::string room;
  int port = 0;             // the serve's HTTP/ZeroMQ port
  std::string fingerprint;  // the rendezvous key's fingerprint, as net::Fingerprint writes it
  std::string address;      // the sender's IPv4 address (filled by the listener, not carried)
  bool operator==(const Announcement&) const = default;
};
// The datagram for `a` (address not carried). InvalidArgument for a room that is empty,
// longer than 64 bytes or not printable ASCII, a port outside 1..65535, or a malformed
// fingerprint.
Result<std::string> EncodeAnnouncement(const Announcement& a);
// The announcement a datagram carries, or InvalidArgument naming what is wrong with it
// (wrong magic or version, truncated, trailing bytes, a bad room, port or fingerprint).
Result<Announcement> ParseAnnouncement(std::string_view datagram);

// Sends the announcement from its own thread until destroyed. `interface_address`: the IPv4
// address of the interface to send on ("0.0.0.0" or "": every up, multicast-capable,
// non-loopback IPv4 interface).
class Announcer {
 public:
  static Result<std::unique_ptr<Announcer>> Start(const Announcement& a, const std::string& interface_address,
                                                  int port = kDiscoveryPort);
  ~Announcer();
  Announcer(const Announcer&) = delete;
  Announcer& operator=(const Announcer&) = delete;
  int64_t sent() const { return sent_.load(); }

 private:
  Announcer() = default;
  void Loop();
  int fd_ = -1;
  std::string datagram_;
  std::vector<uint32_t> interfaces_;  // network order
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> sent_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

// Listens on every up, multicast-capable IPv4 interface for `seconds` (bounded; *stop ends
// it early) and returns the distinct rooms heard, in the order first heard. Malformed
// datagrams are ignored.
Result<std::vector<Announcement>> ListenForRooms(double seconds, const std::atomic<bool>* stop = nullptr,
                                                 int port = kDiscoveryPort);
// The room to join among those found: the only one, or the one named `room` ("": none
// named). InvalidArgument listing what was found when none or several match, saying how to
// pass --join when nothing was heard.
Result<Announcement> ChooseRoom(const std::vector<Announcement>& found, const std::string& room);
// The local IPv4 address this machine reaches `address` from (what peers on that network
// reach it at); "" when it cannot tell.
std::string LocalAddressTowards(const std::string& address);

}  // namespace daisy
