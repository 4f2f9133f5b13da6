#include "daisy/source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace daisy {

Status ByteSource::ReadAt(uint64_t offset, std::span<uint8_t> out) {
  size_t filled = 0;
  DAISY_RETURN_IF_ERROR(ReadStream(offset, out.size(), [&](std::span<const uint8_t> chunk) {
    if (chunk.size() > out.size() - filled) return Internal("Bug: source delivered more bytes than asked");
    std::memcpy(out.data() + filled, chunk.data(), chunk.size());
    filled += chunk.size();
    return Status::Ok();
  }));
  if (filled != out.size()) return DataLoss(name() + ": short read");
  return Status::Ok();
}

bool IsSafeFileName(std::string_view file) {
  if (file.empty() || file.size() > 255) return false;
  if (file == "." || file == "..") return false;
  for (char c : file) {
    auto u = static_cast<unsigned char>(c);
    if (c == '/' || c == '\\' || u < 0x20 || u == 0x7f) return false;
  }
  return file.find("..") == std::string_view::npos;
}

namespace {

// What a file that is not a regular one is, for the error that refuses it.
std::string FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe (FIFO)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "of an unknown kind";
}

class LocalFile final : public ByteSource {
 public:
  LocalFile(int fd, std::string path, uint64_t size) : fd_(fd), name_(std::move(path)), size_(size) {}
  ~LocalFile() override { ::close(fd_); }
  const std::string& name() const override { return name_; }
  Result<uint64_t> Size() override { return size_; }
  Status ReadStream(uint64_t offset, uint64_t length, const ChunkSink& sink) override {
    if (offset > size_ || length > size_ - offset)
      return OutOfRange(name_ + ": read of " + std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                        " runs past the end of the file (" + std::to_string(size_) + " bytes)");
    constexpr uint64_t kChunk = 4u << 20;  // bounded buffer: memory does not grow with the read
    std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(kChunk, std::max<uint64_t>(length, 1))));
    uint64_t done = 0;
    while (done < length) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), length - done));
      ssize_t got = ::pread(fd_, buf.data(), want, static_cast<off_t>(offset + done));
      if (got < 0) {
        if (errno == EINTR) continue;
        return Unavailable(name_ + ": read failed: " + std::strerror(errno));
      }
      if (got == 0) return DataLoss(name_ + ": file shrank while reading");
      DAISY_RETURN_IF_ERROR(sink(std::span<const uint8_t>(buf.data(), static_cast<size_t>(got))));
      done += static_cast<uint64_t>(got);
    }
    return Status::Ok();
  }

 private:
  int fd_;
  std::string name_;
  uint64_t size_;
};

class LocalFolder final : public ModelSource {
 public:
  LocalFolder(std::string display, std::string abs) : display_(std::move(display)), abs_(std::move(abs)) {}
  std::string Describe() const override { return display_; }
  std::string ModelId() const override { return abs_; }
  std::string Revision() const override { return "local"; }
  Result<std::string> ReadFile(std::string_view file) override {
    DAISY_ASSIGN_OR_RETURN(auto src, OpenFile(file));
    DAISY_ASSIGN_OR_RETURN(uint64_t size, src->Size());
    constexpr uint64_t kMaxSmallFile = 256u << 20;
    if (size > kMaxSmallFile)
      return InvalidArgument(src->name() + " is " + std::to_string(size) + " bytes, too large to read whole");
    std::string out(static_cast<size_t>(size), '\0');
    DAISY_RETURN_IF_ERROR(src->ReadAt(0, std::span<uint8_t>(reinterpret_cast<uint8_t*>(out.data()), out.size())));
    return out;
  }
  Result<std::unique_ptr<ByteSource>> OpenFile(std::string_view file) override {
    if (!IsSafeFileName(file)) return InvalidArgument("refusing file name '" + std::string(file) + "'");
    return OpenLocalFile(display_ + "/" + std::string(file));
  }

 private:
  std::string display_;
  std::string abs_;
};

}  // namespace

Result<std::unique_ptr<ByteSource>> OpenLocalFile(const std::string& path) {
  // Looked at before opening: opening a FIFO waits for a writer forever, and opening some
  // devices has side effects. O_NONBLOCK covers a swap between this stat and the open.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return NotFound(path + ": no such file");
    return Unavailable(path + ": cannot open: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + " is " + FileKind(st.st_mode) + ", not a regular file");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound(path + ": no such file");
    return Unavailable(path + ": cannot open: " + std::strerror(errno));
  }
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Unavailable(path + ": cannot open: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + " is " + FileKind(st.st_mode) + ", not a regular file");
  }
  // O_NONBLOCK stays: reads of a regular file ignore it.
  return std::unique_ptr<ByteSource>(new LocalFile(fd, path, static_cast<uint64_t>(st.st_size)));
}

Result<std::unique_ptr<ModelSource>> OpenLocalFolder(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return NotFound(dir + ": no such folder");
  std::string display = dir;
  while (display.size() > 1 && display.back() == '/') display.pop_back();
  std::string abs = std::filesystem::absolute(dir, ec).lexically_normal().string();
  return std::unique_ptr<ModelSource>(new LocalFolder(display, abs));
}

}  // namespace daisy
