// Internal: the on-disk cache of fetched byte ranges. An entry is the payload followed by a
// 24-byte trailer (magic "DCRANGE1", u64 length, u64 XXH64 of the payload; little-endian),
// written to a temp file and renamed, so a reader sees a whole entry or none; a short or
// corrupt entry is deleted and reported as absent. Thread-safe (no shared mutable state).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "daisy/source.h"
#include "daisy/status.h"

namespace daisy::hub {

class RangeCache {
 public:
  explicit RangeCache(std::string root) : root_(std::move(root)) {}
  const std::string& root() const { return root_; }

  // <root>/hub/<owner>/<name>/<commit>/<file>/<entry>; every part was validated before.
  std::string EntryPath(const std::string& repo, const std::string& commit, const std::string& file,
                        const std::string& entry) const;

  // Streams an intact entry of `length` bytes to sink and returns true; false if absent,
  // short or corrupt (then it is deleted). An error only when the sink fails.
  Result<bool> Serve(const std::string& path, uint64_t length, const ChunkSink& sink) const;
  // A whole small entry, if present and intact and at most max_bytes.
  std::optional<std::string> ReadSmall(const std::string& path, uint64_t max_bytes) const;
  void WriteSmall(const std::string& path, std::string_view payload) const;

  // Accumulates one entry; Commit() renames it into place. Write failures only disable the
  // entry (a warning is logged): the cache never fails a read.
  class Writer {
   public:
    explicit Writer(std::string path);
    ~Writer();
    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;
    void Append(std::span<const uint8_t> bytes);
    void Commit();

   private:
    void Fail(const std::string& why);
    std::string path_;
    std::string tmp_;
    int fd_ = -1;
    uint64_t length_ = 0;
    void* hash_state_ = nullptr;
  };

 private:
  std::string root_;
};

}  // namespace daisy::hub
