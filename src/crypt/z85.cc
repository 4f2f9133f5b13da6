// Z85 (ZeroMQ RFC 32): 4 bytes as 5 characters of an 85-letter alphabet, big-endian, and
// the CURVE key helpers built on it (zmq_curve_public, zmq_curve_keypair).
#include <cerrno>
#include <cstring>

#include "daisy/crypt.h"

namespace daisy::crypt {
namespace {

constexpr char kAlphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

// The value of character c, or -1 when c is not in the alphabet. Without an early exit or
// an index by c: secret keys go through here.
int Digit(char c) {
  int value = -1;
  for (int i = 0; i < 85; ++i) {
    const int mask = -static_cast<int>(kAlphabet[i] == c);
    value = (value & ~mask) | (i & mask);
  }
  return value;
}

}  // namespace

char* Z85Encode(char* dest, const uint8_t* data, size_t size) {
  if (size % 4 != 0) {
    errno = EINVAL;
    return nullptr;
  }
  char* out = dest;
  for (size_t i = 0; i < size; i += 4) {
    uint32_t value = (uint32_t{data[i]} << 24) | (uint32_t{data[i + 1]} << 16) | (uint32_t{data[i + 2]} << 8) |
                     uint32_t{data[i + 3]};
    for (int j = 4; j >= 0; --j) {
      out[j] = kAlphabet[value % 85];
      value /= 85;
    }
    out += 5;
  }
  *out = '\0';
  return dest;
}

uint8_t* Z85Decode(uint8_t* dest, const char* string) {
  const size_t len = std::strlen(string);
  if (len < 5 || len % 5 != 0) {
    errno = EINVAL;
    return nullptr;
  }
  // Check everything first: nothing is written for a refused string.
  for (size_t i = 0; i < len; i += 5) {
    uint64_t value = 0;
    for (size_t j = 0; j < 5; ++j) {
      const int d = Digit(string[i + j]);
      if (d < 0) {
        errno = EINVAL;
        return nullptr;
      }
      value = value * 85 + static_cast<uint64_t>(d);
    }
    if (value > 0xffffffffu) {  // "#####" is 85^5 - 1: more than 4 bytes hold
      errno = EINVAL;
      return nullptr;
    }
  }
  for (size_t i = 0; i < len; i += 5) {
    uint32_t value = 0;
    for (size_t j = 0; j < 5; ++j) value = value * 85 + static_cast<uint32_t>(Digit(string[i + j]));
    for (size_t j = 0; j < 4; ++j) dest[i / 5 * 4 + j] = static_cast<uint8_t>(value >> (24 - 8 * j));
  }
  return dest;
}

int CurvePublic(char* z85_public_key, const char* z85_secret_key) {
  // libzmq decodes whatever length it is given into 32 bytes; only a key's 40 characters here.
  uint8_t secret[32], pub[32];
  if (std::strlen(z85_secret_key) != 40 || Z85Decode(secret, z85_secret_key) == nullptr) {
    errno = EINVAL;
    return -1;
  }
  ScalarMultBase(pub, secret);
  Z85Encode(z85_public_key, pub, sizeof pub);
  MemZero(secret, sizeof secret);
  return 0;
}

int CurveKeypair(char* z85_public_key, char* z85_secret_key) {
  uint8_t secret[32], pub[32];
  BoxKeypair(pub, secret);
  Z85Encode(z85_public_key, pub, sizeof pub);
  Z85Encode(z85_secret_key, secret, sizeof secret);
  MemZero(secret, sizeof secret);
  return 0;
}

}  // namespace daisy::crypt
