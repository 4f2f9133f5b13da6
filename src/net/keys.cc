// Long-term CURVE key pairs on disk and their fingerprints.
#include <fcntl.h>
#include <sodium.h>
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

Result<std::array<uint8_t, 32>> AuditKey(const KeyPair& mine, const std::string& other_public) {
  uint8_t secret[32], other[32], shared[32];
  if (mine.secret_key.size() != 40 || zmq_z85_decode(secret, mine.secret_key.c_str()) == nullptr)
    return InvalidArgument("Bug: AuditKey without a secret key");
  if (other_public.size() != 40 || zmq_z85_decode(other, other_public.c_str()) == nullptr)
    return InvalidArgument("AuditKey: '" + other_public.substr(0, 8) + "...' is not a CURVE public key");
  // X25519 of the two long-term CURVE keys: the same on both sides, known to no third one.
  if (crypto_scalarmult(shared, secret, other) != 0) return InvalidArgument("AuditKey: a degenerate public key");
  std::array<uint8_t, 32> key{};
  static const char kContext[] = "daisychain audit key v1";
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, key.size());
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(kContext), sizeof kContext - 1);
  crypto_generichash_update(&st, shared, sizeof shared);
  crypto_generichash_final(&st, key.data(), key.size());
  sodium_memzero(secret, sizeof secret);
  sodium_memzero(shared, sizeof shared);
  return key;
}

bool IsPublicKey(const std::string& z85) {
  if (z85.size() != 40) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, z85.c_str()) != nullptr;
}

namespace {

bool IsSecretFor(const std::string& secret, const std::string& pub) {
  if (!IsPublicKey(secret) || !IsPublicKey(pub)) return false;
  char derived[41] = {0};
  return zmq_curve_public(derived, secret.c_str()) == 0 && pub == derived;
}

std::string Hex16(const std::string& public_key) {
  uint8_t raw[32];
  if (public_key.size() != 40 || zmq_z85_decode(raw, public_key.c_str()) == nullptr) return "";
  uint8_t digest[32];
  crypto_generichash(digest, sizeof digest, raw, sizeof raw, nullptr, 0);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

}  // namespace

std::string KeyId(const std::string& public_key) {
  return Hex16(public_key);
}

std::string Fingerprint(const std::string& public_key) {
  const std::string h = Hex16(public_key);
  if (h.empty()) return "";
  return h.substr(0, 4) + "-" + h.substr(4, 4) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4);
}

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
