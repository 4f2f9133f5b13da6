// The engine as a WebAssembly module for a page (the browser node) or node.js: a small C
// API exported to JavaScript (apps/wasm/CMakeLists.txt lists the exports; docs/KERNELS.md,
// "wasm", shows a call). Built only by the Emscripten build (tests/wasm), never natively.
//
// Process-wide (the kernels are): the backend choice, its report and the probe hash. Per
// engine (a handle from daisy_engine_new): a folder of files the caller puts in memory
// (config.json, model.safetensors, ...), a model loaded from them whole, and its forward
// pass. Strings returned are valid until the next call of the same function (or on the
// same engine); JavaScript copies them at once (UTF8ToString). Not thread-safe: a module
// instance is driven by one JavaScript thread.
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daisy/crypt.h"
#include "daisy/forward.h"
#include "daisy/kernels.h"
#include "daisy/model.h"
#include "daisy/source.h"

namespace daisy {
namespace {

using Files = std::map<std::string, std::vector<uint8_t>, std::less<>>;

// One file of a MemoryFolder, read by range without a copy of the whole.
class MemoryFile final : public ByteSource {
 public:
  MemoryFile(std::string name, const std::vector<uint8_t>& bytes) : name_(std::move(name)), bytes_(bytes) {}
  const std::string& name() const override { return name_; }
  Result<uint64_t> Size() override { return static_cast<uint64_t>(bytes_.size()); }
  Status ReadStream(uint64_t offset, uint64_t length, const ChunkSink& sink) override {
    const uint64_t size = bytes_.size();
    if (offset > size || length > size - offset)
      return OutOfRange(name_ + ": read of " + std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                        " runs past the end of the file (" + std::to_string(size) + " bytes)");
    // Bounded chunks, as a file or the network delivers them.
    constexpr uint64_t kChunk = 1u << 20;
    for (uint64_t done = 0; done < length;) {
      const uint64_t n = std::min(kChunk, length - done);
      DAISY_RETURN_IF_ERROR(sink(std::span<const uint8_t>(bytes_.data() + offset + done, static_cast<size_t>(n))));
      done += n;
    }
    return Status::Ok();
  }

 private:
  std::string name_;
  const std::vector<uint8_t>& bytes_;
};

// The files the caller put in memory, as a model folder. Holds a reference to `files`.
class MemoryFolder final : public ModelSource {
 public:
  explicit MemoryFolder(const Files& files) : files_(files) {}
  std::string Describe() const override { return "the files in this engine's memory"; }
  std::string ModelId() const override { return "memory"; }
  std::string Revision() const override { return "local"; }
  Result<std::string> ReadFile(std::string_view file) override {
    DAISY_ASSIGN_OR_RETURN(const std::vector<uint8_t>* bytes, Find(file));
    return std::string(bytes->begin(), bytes->end());
  }
  Result<std::unique_ptr<ByteSource>> OpenFile(std::string_view file) override {
    DAISY_ASSIGN_OR_RETURN(const std::vector<uint8_t>* bytes, Find(file));
    return std::unique_ptr<ByteSource>(std::make_unique<MemoryFile>(std::string(file), *bytes));
  }

 private:
  Result<const std::vector<uint8_t>*> Find(std::string_view file) const {
    const auto it = files_.find(file);
    if (it == files_.end()) return NotFound("file '" + std::string(file) + "' is not in " + Describe());
    return &it->second;
  }
  const Files& files_;
};

std::string HexHash(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, h);
  return buf;
}

}  // namespace
}  // namespace daisy

// The handle JavaScript holds: one model and its KV cache.
struct DaisyEngine {
  daisy::Files files;
  std::unique_ptr<daisy::LocalPipeline> pipeline;
  std::string error;
};

extern "C" {

// The backend of every product shape ("wasm", "scalar", or one per shape).
const char* daisy_backend_name() {
  static std::string out;
  out = daisy::kernels::BackendChoiceSummary();
  return out.c_str();
}

// Every backend: [{"backend", "supported", "gate_passed", "reason"}], as JSON.
const char* daisy_backend_report() {
  static std::string out;
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : daisy::kernels::BackendReport())
    j.push_back({{"backend", std::string(daisy::kernels::BackendName(s.backend))},
                 {"supported", s.supported},
                 {"gate_passed", s.gate_passed},
                 {"reason", s.reason}});
  out = j.dump();
  return out.c_str();
}

// The probe hash (16 hex digits, as `daisychain generate` prints it): equal on every honest
// device, the proof that this tab computes the same bits as the native nodes.
const char* daisy_probe_hash() {
  static std::string out;
  out = daisy::HexHash(daisy::kernels::ProbeHash());
  return out.c_str();
}

// Forces `name` (scalar, wasm, ...) for every product shape. Returns "" or why not.
const char* daisy_set_backend(const char* name) {
  static std::string out;
  out.clear();
  const std::string want = name == nullptr ? "" : name;
  for (int b = 0; b < daisy::kernels::kBackendCount; ++b) {
    const auto backend = static_cast<daisy::kernels::Backend>(b);
    if (daisy::kernels::BackendName(backend) != want) continue;
    const daisy::Status st = daisy::kernels::SetBackend(backend);
    if (!st.ok()) out = st.ToString();
    return out.c_str();
  }
  out = "'" + want + "' is not a backend (scalar|avx2|avx512vnni|neon|wasm)";
  return out.c_str();
}

DaisyEngine* daisy_engine_new() {
  return new DaisyEngine;
}

void daisy_engine_free(DaisyEngine* e) {
  delete e;
}

// Why the last failing call on `e` failed.
const char* daisy_engine_error(const DaisyEngine* e) {
  return e->error.c_str();
}

// Makes room for a file of `size` bytes named `name` (config.json, model.safetensors, ...)
// and returns where the caller writes its bytes, or null (daisy_engine_error says why).
// The memory stays valid until the file is replaced or the engine freed.
uint8_t* daisy_engine_file(DaisyEngine* e, const char* name, uint32_t size) {
  const std::string file = name == nullptr ? "" : name;
  if (!daisy::IsSafeFileName(file)) {
    e->error = "file name '" + file + "' is refused (no '/', '..' or control characters)";
    return nullptr;
  }
  std::vector<uint8_t>& bytes = e->files[file];
  bytes.assign(size, 0);
  e->error.clear();
  // A zero-byte file still gets a non-null address (nothing is written there).
  static uint8_t empty = 0;
  return size == 0 ? &empty : bytes.data();
}

// Loads the whole model from the files (one stage holding every layer, context `ctx`
// positions). Returns the vocabulary size, or -1 (daisy_engine_error says why).
int daisy_engine_load(DaisyEngine* e, int ctx) {
  daisy::MemoryFolder folder(e->files);
  auto info = daisy::LoadModelInfo(folder);
  if (!info.ok()) {
    e->error = info.status().ToString();
    return -1;
  }
  if (daisy::Status st = daisy::CheckContext(info->spec, ctx); !st.ok()) {
    e->error = st.ToString();
    return -1;
  }
  const int layers[] = {info->spec.n_layers};
  auto p = daisy::LocalPipeline::Load(folder, *info, layers, ctx);
  if (!p.ok()) {
    e->error = p.status().ToString();
    return -1;
  }
  e->pipeline = std::make_unique<daisy::LocalPipeline>(std::move(*p));
  e->error.clear();
  return e->pipeline->head().spec().vocab;
}

// Runs tokens[0, n) at positions first_position.. and writes the logits of the last one
// (vocab floats), or of every one when `all_rows` (n * vocab), to `out`. Returns the number
// of floats written, or -1 (daisy_engine_error says why).
int daisy_engine_forward(DaisyEngine* e, const int32_t* tokens, int n, int first_position, int all_rows, float* out) {
  if (!e->pipeline) {
    e->error = "no model is loaded (daisy_engine_load)";
    return -1;
  }
  if (n <= 0 || tokens == nullptr || out == nullptr) {
    e->error = "forward needs at least one token and an output buffer";
    return -1;
  }
  const std::span<const int32_t> ids(tokens, static_cast<size_t>(n));
  daisy::HeadStage& head = e->pipeline->head();
  auto logits = all_rows ? head.ForwardAll(ids, first_position) : head.Forward(ids, first_position);
  if (!logits.ok()) {
    e->error = logits.status().ToString();
    return -1;
  }
  std::memcpy(out, logits->data(), logits->size() * sizeof(float));
  e->error.clear();
  return static_cast<int>(logits->size());
}

// The fingerprint of a Z85 public key as net::Fingerprint writes it ("abcd-ef01-2345-6789":
// the first 8 bytes of BLAKE2b-256 of the raw key, hex), or "" when it is not a key.
const char* daisy_fingerprint(const char* public_z85) {
  static std::string out;
  out.clear();
  uint8_t raw[32];
  if (public_z85 == nullptr || std::strlen(public_z85) != 40 || daisy::crypt::Z85Decode(raw, public_z85) == nullptr)
    return out.c_str();
  unsigned char digest[32];
  daisy::crypt::GenericHash(digest, sizeof digest, raw, sizeof raw, nullptr, 0);
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 8; ++i) {
    if (i > 0 && i % 2 == 0) out += '-';
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out.c_str();
}

// A new X25519 (CURVE) key pair for this tab, from crypto.getRandomValues:
// {"public_key", "secret_key" (Z85, 40 characters each), "fingerprint"}, as JSON. The page
// keeps it in its origin's storage; the secret stays in this string until the next call.
const char* daisy_keypair() {
  static std::string out;
  char pub[41], sec[41];
  daisy::crypt::CurveKeypair(pub, sec);
  out = nlohmann::json{{"public_key", pub}, {"secret_key", sec}, {"fingerprint", daisy_fingerprint(pub)}}.dump();
  daisy::crypt::MemZero(sec, sizeof sec);
  return out.c_str();
}

}  // extern "C"
