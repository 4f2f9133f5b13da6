// Key text (Z85), ids, fingerprints and the audit key: libsodium's API alone, no ZeroMQ.
#include <sodium.h>

#include <cstring>

#include "daisy/seal.h"

namespace daisy::net {

namespace {

constexpr char kZ85[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

int Z85Value(char c) {
  const char* at = std::strchr(kZ85, c);
  return (c == '\0' || at == nullptr) ? -1 : static_cast<int>(at - kZ85);
}

bool DecodeKey(const std::string& z85, uint8_t out[32]) {
  std::array<uint8_t, 32> raw{};
  if (!Z85Decode(z85, raw)) return false;
  std::memcpy(out, raw.data(), raw.size());
  return true;
}

std::string Hex16(const std::string& public_key) {
  uint8_t raw[32];
  if (!DecodeKey(public_key, raw)) return "";
  [[maybe_unused]] static const int kSodiumReady = sodium_init();
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

std::string Z85Encode(std::span<const uint8_t, 32> raw) {
  std::string out;
  out.reserve(40);
  for (size_t at = 0; at < raw.size(); at += 4) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = v << 8 | raw[at + i];  // big-endian groups, as ZeroMQ's RFC 32
    char group[5];
    for (int i = 4; i >= 0; --i) {
      group[i] = kZ85[v % 85];
      v /= 85;
    }
    out.append(group, 5);
  }
  return out;
}

bool Z85Decode(const std::string& z85, std::array<uint8_t, 32>& raw) {
  if (z85.size() != 40) return false;
  for (size_t g = 0; g < 8; ++g) {
    uint64_t v = 0;
    for (size_t i = 0; i < 5; ++i) {
      const int d = Z85Value(z85[5 * g + i]);
      if (d < 0) return false;
      v = v * 85 + static_cast<uint64_t>(d);
    }
    if (v > 0xffffffffu) return false;  // "#####" and the like name no 32-bit group
    for (size_t i = 0; i < 4; ++i) raw[4 * g + i] = static_cast<uint8_t>(v >> (24 - 8 * i));
  }
  return true;
}

KeyPair NewBoxKeyPair() {
  [[maybe_unused]] static const int kSodiumReady = sodium_init();
  std::array<uint8_t, 32> pub{}, sec{};
  crypto_box_keypair(pub.data(), sec.data());
  KeyPair k{Z85Encode(pub), Z85Encode(sec)};
  sodium_memzero(sec.data(), sec.size());
  return k;
}

Result<KeyPair> KeyPairFromSecret(const std::string& secret_z85) {
  std::array<uint8_t, 32> sec{}, pub{};
  if (!Z85Decode(secret_z85, sec))
    return InvalidArgument("a secret key must be 40 characters of Z85 (ZeroMQ's key text); got " +
                           std::to_string(secret_z85.size()) + " characters that are not");
  [[maybe_unused]] static const int kSodiumReady = sodium_init();
  crypto_scalarmult_base(pub.data(), sec.data());
  sodium_memzero(sec.data(), sec.size());
  return KeyPair{Z85Encode(pub), secret_z85};
}

Result<std::array<uint8_t, 32>> AuditKey(const KeyPair& mine, const std::string& other_public) {
  uint8_t secret[32], other[32], shared[32];
  if (!DecodeKey(mine.secret_key, secret)) return InvalidArgument("Bug: AuditKey without a secret key");
  if (!DecodeKey(other_public, other))
    return InvalidArgument("AuditKey: '" + other_public.substr(0, 8) + "...' is not a CURVE public key");
  [[maybe_unused]] static const int kSodiumReady = sodium_init();
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
  std::array<uint8_t, 32> raw{};
  return Z85Decode(z85, raw);
}

std::string KeyId(const std::string& public_key) {
  return Hex16(public_key);
}

std::string Fingerprint(const std::string& public_key) {
  const std::string h = Hex16(public_key);
  if (h.empty()) return "";
  return h.substr(0, 4) + "-" + h.substr(4, 4) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4);
}

}  // namespace daisy::net
