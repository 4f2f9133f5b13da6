// The golden digest of crypt's tests: BLAKE2b-256 over the outputs of every function of the
// subset on inputs derived from a counter, through libsodium's and ZeroMQ's C names. Included
// after the real <sodium.h> and <zmq.h> (crypt_test: real libsodium gives kCryptGoldenDigest)
// or after the shims (crypt_shim_test, natively and in wasm: daisy::crypt gives it too), so
// every build is pinned to libsodium's bits.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace daisy::crypt_test {

inline constexpr char kCryptGoldenDigest[] = "c59343c0f5654d8badc36d2fe345594b7af6e44eb1a1834e2986474505e14858";
// RFC 7748's Alice public key in Z85, and its key id (net::KeyId: BLAKE2b-256's first 8 bytes).
inline constexpr char kAliceZ85[] = "G=]<>I7>&bBC>O5V{aj/4zK}kco8}o(.HIuS*=:#";
inline constexpr char kAliceKeyId[] = "7a91869e4c114964";

// splitmix64: inputs independent of the functions under test.
class Inputs {
 public:
  explicit Inputs(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
    z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
    return z ^ (z >> 31);
  }
  void Fill(unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(Next() >> 56);
  }

 private:
  uint64_t state_;
};

inline std::string CryptGoldenDigest() {
  crypto_generichash_state all;
  crypto_generichash_init(&all, nullptr, 0, 32);
  const auto absorb = [&all](const void* p, size_t n) {
    crypto_generichash_update(&all, static_cast<const unsigned char*>(p), n);
  };
  const auto absorb_int = [&absorb](int v) {
    const unsigned char b = static_cast<unsigned char>(v & 0xff);
    absorb(&b, 1);
  };
  Inputs in(0x6461697379637279);
  // Points of small order are refused (only the return value is defined then).
  unsigned char q[32], scalar[32], point[32] = {0};
  in.Fill(scalar, sizeof scalar);
  absorb_int(crypto_scalarmult(q, scalar, point));
  point[0] = 1;
  absorb_int(crypto_scalarmult(q, scalar, point));
  static constexpr size_t kLengths[] = {0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 1000, 3000};
  constexpr int kCases = 72;
  for (int i = 0; i < kCases; ++i) {
    unsigned char sk_a[32], sk_b[32], pk_a[32], pk_b[32], shared[32], k[32], nonce[24], key[64];
    in.Fill(sk_a, 32);
    in.Fill(sk_b, 32);
    absorb_int(crypto_scalarmult_base(pk_a, sk_a));
    absorb_int(crypto_scalarmult_base(pk_b, sk_b));
    absorb(pk_a, 32);
    absorb(pk_b, 32);
    absorb_int(crypto_scalarmult(shared, sk_a, pk_b));
    absorb(shared, 32);
    absorb_int(crypto_box_beforenm(k, pk_b, sk_a));
    absorb(k, 32);
    const size_t n = kLengths[i % (sizeof kLengths / sizeof kLengths[0])];
    std::vector<unsigned char> m(n + 1), c(n + 16), back(n + 1);
    in.Fill(m.data(), n);
    in.Fill(nonce, 24);
    absorb_int(crypto_box_easy_afternm(c.data(), m.data(), n, nonce, k));
    absorb(c.data(), c.size());
    absorb_int(crypto_box_open_easy(back.data(), c.data(), c.size(), nonce, pk_a, sk_b));
    absorb(back.data(), n);
    c[static_cast<size_t>(i) % c.size()] ^= 0x20;  // tampered: refused
    absorb_int(crypto_box_open_easy_afternm(back.data(), c.data(), c.size(), nonce, k));
    absorb_int(crypto_box_easy(c.data(), m.data(), n, nonce, pk_b, sk_a));
    absorb(c.data(), c.size());
    // BLAKE2b: every digest length, keys of 0..64 bytes.
    unsigned char digest[64];
    const size_t outlen = 1 + static_cast<size_t>(i) % 64, keylen = static_cast<size_t>(i * 7) % 65;
    in.Fill(key, sizeof key);
    absorb_int(crypto_generichash(digest, outlen, m.data(), n, keylen ? key : nullptr, keylen));
    absorb(digest, outlen);
    // Poly1305, XSalsa20, HSalsa20 alone.
    unsigned char tag[16];
    crypto_onetimeauth_poly1305(tag, m.data(), n, key);
    absorb(tag, 16);
    crypto_stream_xsalsa20_xor(back.data(), m.data(), n, nonce, key);
    absorb(back.data(), n);
    crypto_core_hsalsa20(shared, nonce, key, nullptr);
    absorb(shared, 32);
    // Z85 and the CURVE helpers.
    char z_public[41], z_secret[41], z_derived[41];
    zmq_z85_encode(z_public, pk_a, 32);
    zmq_z85_encode(z_secret, sk_a, 32);
    absorb(z_public, 40);
    absorb_int(zmq_curve_public(z_derived, z_secret));
    absorb(z_derived, 40);
    absorb_int(zmq_z85_decode(pk_b, z_public) != nullptr);
    absorb(pk_b, 32);
  }
  unsigned char out[32];
  crypto_generichash_final(&all, out, sizeof out);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : out) {
    hex += kHex[b >> 4];
    hex += kHex[b & 15];
  }
  return hex;
}

}  // namespace daisy::crypt_test
