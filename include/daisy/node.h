// A ring member: joins a room through the rendezvous, says hello, receives an assignment,
// fetches its own layers itself, reports ready and serves hops until stopped. Also the
// device identity and state under DAISY_HOME, shared by every role.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "daisy/hub.h"
#include "daisy/model.h"
#include "daisy/net.h"
#include "daisy/plan.h"
#include "daisy/status.h"
#include "daisy/wire.h"

namespace daisy {

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
// The slice cache: $DAISY_CACHE_DIR, else DeviceHome()/cache when DAISY_HOME is set, else
// the Hub client's default.
std::string DeviceCacheDir();
// Bytes this device can give to weights: MemAvailable from /proc/meminfo, or
// $DAISY_FREE_MEMORY (bytes) when set (tests and demos simulate small devices with it).
uint64_t FreeMemoryBytes();
// The memory budget a device reports: --max-memory when given, else FreeMemoryBytes().
uint64_t MemoryBudget(std::optional<uint64_t> max_memory);
// The hello of this device: capacity measured through the live kernel, probe, backend, and
// `budget` as its free memory (what the plan may give it).
wire::Hello MeasureHello(const std::string& device_id, const std::string& name, uint32_t capabilities, uint64_t budget);
// What the plan counts for this model at context ctx (PlanModelFromSpec with the embedding
// at the width of its file, when that header is read; BF16 width otherwise).
PlanModel PlanModelOf(const ModelInfo& info, int ctx);

// What every device of a ring must agree on before it runs a hop: the normalized spec
// (XXH64 of its fields) and the model load (wire::ModelHash of repo id, pinned commit and a
// digest of the tensor index: names, dtypes, shapes and offsets).
uint64_t SpecHash(const ModelSpec& spec);
uint32_t ModelHashOf(const ModelSource& source, const TensorIndex& index);

// Fault injection, for tests only: hooks that make a device lie or lag on purpose. The
// product never sets one (NodeOptions::faults stays null in the daisychain binary); tests
// set it in-process, and the test-only daisychain_faulty binary installs one from its
// environment. Called on the node's own thread only.
class NodeFaults {
 public:
  virtual ~NodeFaults() = default;
  // Printed once at start, so a rigged device is never mistaken for an honest one.
  virtual std::string Describe() const = 0;
  // A hop's output after its layers ran, before its hash is taken and it is sent on.
  virtual void OnHopOutput(std::vector<float>& values) = 0;
  // In an audited turn: after the hop's digest went to the head, and after its receipt went
  // to the next stage (a liar that reports honestly and sends something else). Default: no-op.
  virtual void AfterReport(std::vector<float>& /*values*/) {}
  virtual void AfterReceipt(std::vector<float>& /*values*/) {}
};

// The local model folder an assignment names, if this device allows it: `path` with its
// symlinks and ".." resolved (realpath) must be one of `allowed_dirs` (each resolved too) or
// lie under one. Otherwise refused with an error naming `path`, before anything under it is
// opened. Returns the resolved path.
Result<std::string> AllowedModelFolder(const std::string& path, const std::vector<std::string>& allowed_dirs);

struct NodeOptions {
  std::string role = "node";       // which id under DAISY_HOME this device uses
  std::string rendezvous;          // "tcp://HOST:PORT"
  std::string room = "default";
  std::string name;                // empty: the host name
  std::string bind_host = "127.0.0.1";  // the address peers reach this device at
  int port = 0;                    // the inbox's port (0: any free port)
  std::string advertise;           // "HOST:PORT" peers are told to send to ("": the inbox's own)
  std::string server_key;          // --server-key FPR (see JoinOptions)
  std::optional<net::Admission> admission;  // in-process admission (see JoinOptions)
  HubOptions hub;                  // this device's own credentials and cache
  bool print_tokens = true;        // print the token stream as it arrives
  const std::atomic<bool>* stop = nullptr;  // stops the loop when it becomes true
  int cache_slots = 4;             // conversations whose KV this device keeps (prefix cache)
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
