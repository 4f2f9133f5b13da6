#include "range_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "daisy/log.h"

namespace daisy::hub {
namespace {

constexpr char kMagic[8] = {'D', 'C', 'R', 'A', 'N', 'G', 'E', '1'};
constexpr size_t kTrailer = 24;
constexpr size_t kBuf = 1u << 20;

void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

bool PreadAll(int fd, uint8_t* out, size_t n, uint64_t offset) {
  while (n > 0) {
    ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

bool WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void Discard(const std::string& path, const char* why) {
  LogWarning("cache entry " + path + " is " + why + "; fetching it again");
  ::unlink(path.c_str());
}

// Opens an entry and checks its length and hash. Returns the fd, or -1 (entry removed).
int OpenVerified(const std::string& path, uint64_t length) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) return -1;
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != length + kTrailer) {
    Discard(path, "short or overlong");
    return -1;
  }
  uint8_t trailer[kTrailer];
  if (!PreadAll(f.fd, trailer, kTrailer, length) || std::memcmp(trailer, kMagic, 8) != 0 ||
      GetU64(trailer + 8) != length) {
    Discard(path, "not a cache entry");
    return -1;
  }
  // Hash before handing out any byte: a sink cannot take back what it was given. XXH64
  // guards against accidents (a torn or rotted cache file), not against an attacker who can
  // write the cache; the weights' bits are then proven by Verify and the audit.
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(kBuf, std::max<uint64_t>(length, 1))));
  uint64_t done = 0;
  bool ok = true;
  while (ok && done < length) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), length - done));
    ok = PreadAll(f.fd, buf.data(), n, done);
    if (ok) XXH64_update(state, buf.data(), n);
    done += n;
  }
  uint64_t hash = XXH64_digest(state);
  XXH64_freeState(state);
  if (!ok || hash != GetU64(trailer + 16)) {
    Discard(path, "corrupt");
    return -1;
  }
  int fd = f.fd;
  f.fd = -1;
  return fd;
}

}  // namespace

std::string RangeCache::EntryPath(const std::string& repo, const std::string& commit, const std::string& file,
                                  const std::string& entry) const {
  return root_ + "/hub/" + repo + "/" + commit + "/" + file + "/" + entry;
}

Result<bool> RangeCache::Serve(const std::string& path, uint64_t length, const ChunkSink& sink) const {
  Fd f;
  f.fd = OpenVerified(path, length);
  if (f.fd < 0) return false;
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(kBuf, std::max<uint64_t>(length, 1))));
  uint64_t done = 0;
  while (done < length) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), length - done));
    if (!PreadAll(f.fd, buf.data(), n, done))
      return Unavailable("cache entry " + path + " became unreadable while reading it");
    DAISY_RETURN_IF_ERROR(sink(std::span<const uint8_t>(buf.data(), n)));
    done += n;
  }
  return true;
}

std::optional<std::string> RangeCache::ReadSmall(const std::string& path, uint64_t max_bytes) const {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  if (static_cast<uint64_t>(st.st_size) < kTrailer || static_cast<uint64_t>(st.st_size) - kTrailer > max_bytes)
    return std::nullopt;
  std::string out;
  auto served = Serve(path, static_cast<uint64_t>(st.st_size) - kTrailer, [&](std::span<const uint8_t> c) {
    out.append(reinterpret_cast<const char*>(c.data()), c.size());
    return Status::Ok();
  });
  if (!served.ok() || !*served) return std::nullopt;
  return out;
}

void RangeCache::WriteSmall(const std::string& path, std::string_view payload) const {
  Writer w(path);
  w.Append(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()));
  w.Commit();
}

RangeCache::Writer::Writer(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    Fail("cannot create " + dir.string() + ": " + ec.message());
    return;
  }
  // The temp file sits beside the entry so rename() is atomic (same file system).
  std::string tmpl = (dir / ".tmp-XXXXXX").string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  fd_ = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd_ < 0) {
    Fail("cannot create a temp file in " + dir.string() + ": " + std::strerror(errno));
    return;
  }
  tmp_ = name.data();
  auto* state = XXH64_createState();
  XXH64_reset(state, 0);
  hash_state_ = state;
}

RangeCache::Writer::~Writer() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
  if (hash_state_ != nullptr) XXH64_freeState(static_cast<XXH64_state_t*>(hash_state_));
}

void RangeCache::Writer::Fail(const std::string& why) {
  LogWarning("not caching " + path_ + ": " + why);
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
    fd_ = -1;
  }
}

void RangeCache::Writer::Append(std::span<const uint8_t> bytes) {
  if (fd_ < 0) return;
  if (!WriteAll(fd_, bytes.data(), bytes.size())) {
    Fail(std::string("write failed: ") + std::strerror(errno));
    return;
  }
  XXH64_update(static_cast<XXH64_state_t*>(hash_state_), bytes.data(), bytes.size());
  length_ += bytes.size();
}

void RangeCache::Writer::Commit() {
  if (fd_ < 0) return;
  uint8_t trailer[kTrailer];
  std::memcpy(trailer, kMagic, 8);
  PutU64(trailer + 8, length_);
  PutU64(trailer + 16, XXH64_digest(static_cast<XXH64_state_t*>(hash_state_)));
  if (!WriteAll(fd_, trailer, kTrailer)) {
    Fail(std::string("write failed: ") + std::strerror(errno));
    return;
  }
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    LogWarning("not caching " + path_ + ": rename failed: " + std::strerror(errno));
    ::unlink(tmp_.c_str());
  }
}

}  // namespace daisy::hub
