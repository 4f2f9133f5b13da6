// The browser tab's ring member (daisy/tab.h) as a second WebAssembly module, for the page's
// Web Worker: createDaisyTab() (apps/wasm/CMakeLists.txt lists the exports; README.md in this
// folder shows the calls). The page's main thread holds the WebSocket to serve and passes
// each binary message in (daisy_tab_receive), sends what daisy_tab_take_outgoing gives, and
// ticks the tab a few times a second; the worker reads the tab's events as JSON. Slices are
// read with synchronous XMLHttpRequest byte ranges (xhr_source.h), or, for tests under
// node.js, from files handed over in memory (daisy_tab_file). Built only by the Emscripten
// build. Not thread-safe: one JavaScript thread drives a module instance.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daisy/log.h"
#include "daisy/tab.h"
#include "xhr_source.h"

namespace {

using Files = std::map<std::string, std::vector<uint8_t>, std::less<>>;

// Files handed over in memory, as a model `model_id` at `revision` (tests under node.js,
// where there is no XMLHttpRequest). Holds a reference to `files`.
class MemoryFile final : public daisy::ByteSource {
 public:
  MemoryFile(std::string name, const std::vector<uint8_t>& bytes) : name_(std::move(name)), bytes_(bytes) {}
  const std::string& name() const override { return name_; }
  daisy::Result<uint64_t> Size() override { return static_cast<uint64_t>(bytes_.size()); }
  daisy::Status ReadStream(uint64_t offset, uint64_t length, const daisy::ChunkSink& sink) override {
    if (offset > bytes_.size() || length > bytes_.size() - offset)
      return daisy::OutOfRange(name_ + ": a read past the end of the file");
    return sink(std::span<const uint8_t>(bytes_.data() + offset, static_cast<size_t>(length)));
  }

 private:
  std::string name_;
  const std::vector<uint8_t>& bytes_;
};

class MemoryModel final : public daisy::ModelSource {
 public:
  MemoryModel(const Files& files, std::string id, std::string revision)
      : files_(files), id_(std::move(id)), revision_(std::move(revision)) {}
  std::string Describe() const override { return id_ + "@" + revision_ + " (in memory)"; }
  std::string ModelId() const override { return id_; }
  std::string Revision() const override { return revision_; }
  daisy::Result<std::string> ReadFile(std::string_view file) override {
    auto it = files_.find(file);
    if (it == files_.end()) return daisy::NotFound("file '" + std::string(file) + "' is not in memory");
    return std::string(it->second.begin(), it->second.end());
  }
  daisy::Result<std::unique_ptr<daisy::ByteSource>> OpenFile(std::string_view file) override {
    auto it = files_.find(file);
    if (it == files_.end()) return daisy::NotFound("file '" + std::string(file) + "' is not in memory");
    return std::unique_ptr<daisy::ByteSource>(std::make_unique<MemoryFile>(std::string(file), it->second));
  }

 private:
  const Files& files_;
  std::string id_, revision_;
};

}  // namespace

// The handle JavaScript holds: one tab, its pending outgoing messages, its files.
struct DaisyTab {
  std::unique_ptr<daisy::tab::TabMember> member;
  std::string hub_endpoint;  // "": files in memory only
  // The page's Hub token ("": none), shared with every model source this tab opened, so a
  // token given or forgotten applies to the next read at once (no new link, the slice kept).
  std::shared_ptr<std::string> hub_token = std::make_shared<std::string>();
  Files files;
  std::vector<std::vector<uint8_t>> outgoing;
  size_t next_out = 0;
  std::vector<uint8_t> taken;  // the message daisy_tab_take_outgoing returned last
  std::string public_key, secret_key, text, error;
};

namespace {
std::string g_error;  // why the last daisy_tab_new failed

// Replaces the tab's token: the old one is overwritten in place and dropped from the log
// scrubber's list (a forgotten token is held nowhere in the module), the new one is
// registered there, so a line that might quote it never does.
void SetToken(DaisyTab& t, const std::string& token) {
  std::string& held = *t.hub_token;
  if (!held.empty()) {
    daisy::ForgetSecret(held);
    std::fill(held.begin(), held.end(), '\0');
  }
  held.clear();
  held.shrink_to_fit();
  held = token;
  if (!held.empty()) daisy::RegisterSecret(held);
}
}  // namespace

extern "C" {

// A tab with the key pair of `secret_z85` (from the page's storage) or a new one ("" or
// null); `server_key`: the rendezvous key the page showed ("": serve's own); `hub_endpoint`
// ("": slices from files in memory) and `hub_token` ("": none; kept in this module's
// memory only). Null on failure (daisy_tab_new_error says why).
DaisyTab* daisy_tab_new(const char* secret_z85, const char* server_key, const char* room, const char* name,
                        double budget_bytes, const char* hub_endpoint, const char* hub_token) {
  auto s = [](const char* p) { return std::string(p == nullptr ? "" : p); };
  auto tab = std::make_unique<DaisyTab>();
  daisy::tab::TabOptions o;
  if (s(secret_z85).empty()) {
    o.keys = daisy::net::NewBoxKeyPair();
  } else {
    auto k = daisy::net::KeyPairFromSecret(s(secret_z85));
    if (!k.ok()) {
      g_error = k.status().ToString();
      return nullptr;
    }
    o.keys = *k;
  }
  o.server_key = s(server_key);
  o.room = s(room).empty() ? "default" : s(room);
  o.name = s(name);
  o.budget = budget_bytes > 0 ? static_cast<uint64_t>(budget_bytes) : 0;
  tab->hub_endpoint = s(hub_endpoint);
  SetToken(*tab, s(hub_token));
  DaisyTab* raw = tab.get();
  o.open_model = [raw](const std::string& model_id,
                       const std::string& revision) -> daisy::Result<std::unique_ptr<daisy::ModelSource>> {
    // A browser reads a Hub repo, never a folder on some other device's disk.
    if (model_id.empty() || model_id[0] == '/')
      return daisy::PermissionDenied("a browser tab opens Hub repo ids only, not the local folder " + model_id);
    if (raw->hub_endpoint.empty())
      return std::unique_ptr<daisy::ModelSource>(std::make_unique<MemoryModel>(raw->files, model_id, revision));
    return daisy::wasm::OpenXhrModelSource(raw->hub_endpoint, model_id, revision, raw->hub_token);
  };
  tab->public_key = o.keys.public_key;
  tab->secret_key = o.keys.secret_key;
  auto m = daisy::tab::TabMember::Create(std::move(o));
  if (!m.ok()) {
    g_error = m.status().ToString();
    return nullptr;
  }
  tab->member = std::move(*m);
  return tab.release();
}

const char* daisy_tab_new_error() {
  return g_error.c_str();
}

void daisy_tab_free(DaisyTab* t) {
  if (t != nullptr) SetToken(*t, "");
  delete t;
}

// The page's Hub token for this tab's reads from now on ("" or null: forget it).
void daisy_tab_set_token(DaisyTab* t, const char* token) {
  SetToken(*t, token == nullptr ? "" : token);
}

// The key pair's halves (the page keeps the secret in its storage) and the device id.
const char* daisy_tab_public_key(DaisyTab* t) {
  return t->public_key.c_str();
}
const char* daisy_tab_secret_key(DaisyTab* t) {
  return t->secret_key.c_str();
}
const char* daisy_tab_id(DaisyTab* t) {
  return t->member->id().c_str();
}

// Why the last failing call on `t` failed.
const char* daisy_tab_error(DaisyTab* t) {
  return t->error.c_str();
}

// Room for a file of `size` bytes (tests: slices from memory); the caller writes there.
uint8_t* daisy_tab_file(DaisyTab* t, const char* name, uint32_t size) {
  const std::string file = name == nullptr ? "" : name;
  if (!daisy::IsSafeFileName(file)) {
    t->error = "file name '" + file + "' is refused";
    return nullptr;
  }
  auto& bytes = t->files[file];
  bytes.assign(size, 0);
  static uint8_t empty = 0;
  return size == 0 ? &empty : bytes.data();
}

// One binary WebSocket message from serve. 0, or -1: close the link (daisy_tab_error says
// why; a new tab with the same secret links again).
int daisy_tab_receive(DaisyTab* t, const uint8_t* bytes, uint32_t size) {
  daisy::Status st = t->member->Receive(std::span<const uint8_t>(bytes, size));
  if (!st.ok()) {
    t->error = st.ToString();
    return -1;
  }
  t->error.clear();
  return 0;
}

// The next message to send up the link and its length at *size; null when none is left.
// Valid until the next call.
const uint8_t* daisy_tab_take_outgoing(DaisyTab* t, uint32_t* size) {
  if (t->next_out >= t->outgoing.size()) {
    t->outgoing = t->member->TakeOutgoing();
    t->next_out = 0;
  }
  if (t->next_out >= t->outgoing.size()) {
    *size = 0;
    return nullptr;
  }
  t->taken = std::move(t->outgoing[t->next_out++]);
  *size = static_cast<uint32_t>(t->taken.size());
  return t->taken.data();
}

void daisy_tab_tick(DaisyTab* t) {
  t->member->Tick();
}

void daisy_tab_leave(DaisyTab* t) {
  t->member->Leave();
}

void daisy_tab_rejoin(DaisyTab* t) {
  t->member->Rejoin();
}

// The events since the last call, as a JSON array of objects (see README.md).
const char* daisy_tab_events(DaisyTab* t) {
  std::string out = "[";
  for (const auto& e : t->member->TakeEvents()) {
    if (out.size() > 1) out += ",";
    out += e;
  }
  out += "]";
  t->text = std::move(out);
  return t->text.c_str();
}

}  // extern "C"
