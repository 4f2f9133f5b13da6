// ByteSource and ModelSource: how every module reads model files without knowing whether
// they come from a local folder (pread) or the Hub (HTTP byte ranges, see daisy/hub.h).
// Implementations are thread-compatible: use one instance per thread, or lock around it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "daisy/status.h"

namespace daisy {

// Receives consecutive chunks of a read, in order. A non-OK return aborts the read.
using ChunkSink = std::function<Status(std::span<const uint8_t> chunk)>;

struct TransferProgress {
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  double seconds = 0;  // since the transfer started
  double BytesPerSecond() const { return seconds > 0 ? static_cast<double>(bytes_done) / seconds : 0; }
};
using ProgressFn = std::function<void(const TransferProgress&)>;

// A random-access sequence of bytes: one file, local or remote.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // What to call this source in a message: a path, or "owner/name@commit/file".
  virtual const std::string& name() const = 0;
  virtual Result<uint64_t> Size() = 0;
  // Delivers exactly bytes [offset, offset + length) to sink, in order, or fails.
  // Reading past the end is an OutOfRange error that names the source.
  virtual Status ReadStream(uint64_t offset, uint64_t length, const ChunkSink& sink) = 0;
  // Convenience: reads [offset, offset + out.size()) into out.
  Status ReadAt(uint64_t offset, std::span<uint8_t> out);
};

// A folder of model files: a local directory or a Hub repo pinned to one commit.
class ModelSource {
 public:
  virtual ~ModelSource() = default;
  // "models/stories260K" or "owner/name@<commit>"; for messages.
  virtual std::string Describe() const = 0;
  // The repo id ("owner/name") or the folder's absolute path; part of the model hash.
  virtual std::string ModelId() const = 0;
  // The commit every read of this load uses; "local" for a folder.
  virtual std::string Revision() const = 0;
  // Reads a whole (small) file: config.json, tokenizer.json, an index. NotFound if absent.
  virtual Result<std::string> ReadFile(std::string_view file) = 0;
  // Opens a (large) file for ranged reads.
  virtual Result<std::unique_ptr<ByteSource>> OpenFile(std::string_view file) = 0;
};

Result<std::unique_ptr<ByteSource>> OpenLocalFile(const std::string& path);
Result<std::unique_ptr<ModelSource>> OpenLocalFolder(const std::string& dir);

// True for a file name a model folder may contain: no '/', no "..", no control characters.
bool IsSafeFileName(std::string_view file);

}  // namespace daisy
