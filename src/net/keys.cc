// Long-term CURVE key pairs on disk and their fingerprints.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "daisy/net.h"

namespace daisy::net {

namespace fs = std::filesystem;

KeyPair NewKeyPair() {
  char pub[41] = {0}, sec[41] = {0};
  if (zmq_curve_keypair(pub, sec) != 0) {
    // Only when libzmq was built without CURVE: nothing of the project could work then.
    std::fprintf(stderr, "Bug: this libzmq cannot make CURVE keys (built without libsodium?)\n");
    std::abort();
  }
  return KeyPair{pub, sec};
}

namespace {

bool IsSecretFor(const std::string& secret, const std::string& pub) {
  if (!IsPublicKey(secret) || !IsPublicKey(pub)) return false;
  char derived[41] = {0};
  return zmq_curve_public(derived, secret.c_str()) == 0 && pub == derived;
}

}  // namespace

Result<std::string> NormalizeFingerprint(const std::string& typed) {
  std::string out;
  for (char c : typed) {
    if (c == '-' || c == ' ' || c == ':') continue;
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!std::isxdigit(static_cast<unsigned char>(l)))
      return InvalidArgument("'" + typed + "' is not a key fingerprint (hex digits like ab12-cd34-ef56-7890)");
    out += l;
  }
  if (out.empty() || out.size() > 16)
    return InvalidArgument("'" + typed + "' is not a key fingerprint (16 hex digits like ab12-cd34-ef56-7890)");
  return out;
}

Result<KeyPair> LoadOrCreateKeyPair(const std::string& path) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
      struct stat st {};
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return PermissionDenied("the key file " + path + " is not a regular file");
      }
      if ((st.st_mode & 077) != 0) {
        ::close(fd);
        char mode[8];
        std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
        return PermissionDenied("the key file " + path + " has mode " + mode +
                                ": other users may read this device's secret key. Run `chmod 600 " + path +
                                "` if it is yours, or delete it to make a new identity");
      }
      char buf[256];
      const ssize_t n = ::read(fd, buf, sizeof buf);
      ::close(fd);
      std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
      // Two lines: "public Z85" and "secret Z85".
      KeyPair k;
      size_t at = 0;
      while (at < text.size()) {
        size_t nl = text.find('\n', at);
        if (nl == std::string::npos) nl = text.size();
        const std::string line = text.substr(at, nl - at);
        if (line.rfind("public ", 0) == 0) k.public_key = line.substr(7);
        if (line.rfind("secret ", 0) == 0) k.secret_key = line.substr(7);
        at = nl + 1;
      }
      if (!IsSecretFor(k.secret_key, k.public_key))
        return DataLoss("the key file " + path +
                        " is malformed (it must hold a CURVE key pair: 'public Z85' and 'secret Z85'); "
                        "delete it to make a new identity");
      return k;
    }
    if (errno != ENOENT) return Unavailable("cannot read the key file " + path + ": " + std::strerror(errno));
    // Made exclusively with mode 0600: a file that appears meanwhile (another process of
    // this device) wins, and is read on the next attempt.
    const KeyPair k = NewKeyPair();
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      return Unavailable("cannot create the key file " + path + ": " + std::strerror(errno));
    }
    const std::string text = "public " + k.public_key + "\nsecret " + k.secret_key + "\n";
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
    ::close(fd);
    if (!ok) {
      ::unlink(path.c_str());
      return Unavailable("cannot write the key file " + path);
    }
    return k;
  }
  return Unavailable("cannot read the key file " + path + ": it keeps changing");
}

}  // namespace daisy::net
