// The C names of the shims (shim/sodium.h, shim/zmq.h, as the wasm build includes them)
// against fixed vectors and the golden digest alone: no libsodium here, so the same test
// runs natively and under node.js (scripts/test-wasm.sh) and pins both builds to the bits
// real libsodium gives (crypt_test asserts the same constants with it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "shim/sodium.h"
#include "shim/zmq.h"
// After the shims: crypt_golden.h calls the C names.
#include "crypt_golden.h"
#include "crypt_vectors.h"

// In crypt_test: the golden digest, the vectors and the hex helpers are that namespace's.
namespace daisy::crypt_test {
namespace {

TEST(CryptShim, GivesTheGoldenDigest) {
  EXPECT_EQ(CryptGoldenDigest(), kCryptGoldenDigest);
}

TEST(CryptShim, X25519MatchesRfc7748) {
  unsigned char out[32];
  for (const auto& v : kX25519Vectors) {
    const Bytes n = FromHex(v.scalar), u = FromHex(v.u);
    ASSERT_EQ(crypto_scalarmult(out, n.data(), u.data()), 0);
    EXPECT_EQ(Hex(out, 32), v.out);
  }
  const Bytes alice = FromHex(kAliceSecret);
  ASSERT_EQ(crypto_scalarmult_base(out, alice.data()), 0);
  EXPECT_EQ(Hex(out, 32), kAlicePublic);
  ASSERT_EQ(crypto_scalarmult_base(out, FromHex(kBobSecret).data()), 0);
  EXPECT_EQ(Hex(out, 32), kBobPublic);
  unsigned char k[32] = {9}, u[32] = {9}, r[32];
  for (int i = 1; i <= 1000; ++i) {  // section 5.2's iteration
    ASSERT_EQ(crypto_scalarmult(r, k, u), 0);
    std::memcpy(u, k, 32);
    std::memcpy(k, r, 32);
    if (i == 1) {
      EXPECT_EQ(Hex(k, 32), kX25519After1);
    }
  }
  EXPECT_EQ(Hex(k, 32), kX25519After1000);
  const unsigned char zero[32] = {0};
  EXPECT_EQ(crypto_scalarmult(out, alice.data(), zero), -1);
}

TEST(CryptShim, Poly1305AndBlake2bMatchTheirRfcs) {
  const Bytes key = FromHex(kPolyKey);
  const std::string text = kPolyText;
  unsigned char tag[16];
  crypto_onetimeauth_poly1305(tag, reinterpret_cast<const unsigned char*>(text.data()), text.size(), key.data());
  EXPECT_EQ(Hex(tag, 16), kPolyTag);
  for (const auto& e : kPolyEdges) {
    const Bytes k = FromHex(e.key), m = FromHex(e.msg);
    crypto_onetimeauth_poly1305(tag, m.data(), m.size(), k.data());
    EXPECT_EQ(Hex(tag, 16), e.tag) << e.key << " " << e.msg;
  }
  unsigned char d[64];
  ASSERT_EQ(crypto_generichash(d, 64, nullptr, 0, nullptr, 0), 0);
  EXPECT_EQ(Hex(d, 64), kBlake2bEmpty);
  ASSERT_EQ(crypto_generichash(d, 64, reinterpret_cast<const unsigned char*>("abc"), 3, nullptr, 0), 0);
  EXPECT_EQ(Hex(d, 64), kBlake2bAbc);
}

// net::KeyId / net::Fingerprint's recipe (the first 8 bytes of BLAKE2b-256 of the raw
// public key) on RFC 7748's Alice: the constant crypt_test also gets from real libsodium,
// and tests/wasm/engine_test.mjs from the engine's daisy_fingerprint.
TEST(CryptShim, KeyIdOfAFixedKey) {
  const Bytes pub = FromHex(kAlicePublic);
  char z85[41];
  ASSERT_NE(zmq_z85_encode(z85, pub.data(), 32), nullptr);
  EXPECT_STREQ(z85, kAliceZ85);
  uint8_t raw[32];
  ASSERT_NE(zmq_z85_decode(raw, z85), nullptr);
  unsigned char digest[32];
  crypto_generichash(digest, sizeof digest, raw, sizeof raw, nullptr, 0);
  EXPECT_EQ(Hex(digest, 8), kAliceKeyId);
}

TEST(CryptShim, BoxesRoundTripAndRefuseTampering) {
  EXPECT_GE(sodium_init(), 0);
  unsigned char pk_a[32], sk_a[32], pk_b[32], sk_b[32], n[24];
  ASSERT_EQ(crypto_box_keypair(pk_a, sk_a), 0);
  ASSERT_EQ(crypto_box_keypair(pk_b, sk_b), 0);
  EXPECT_NE(Hex(pk_a, 32), Hex(pk_b, 32));  // the generator gave two different secrets
  randombytes_buf(n, sizeof n);
  unsigned char k_ab[32], k_ba[32];
  ASSERT_EQ(crypto_box_beforenm(k_ab, pk_b, sk_a), 0);
  ASSERT_EQ(crypto_box_beforenm(k_ba, pk_a, sk_b), 0);
  EXPECT_EQ(Hex(k_ab, 32), Hex(k_ba, 32));
  for (size_t len : {0, 1, 15, 16, 17, 63, 64, 65, 1000}) {
    Bytes m(len), c(len + crypto_box_MACBYTES), back(len + 1);
    randombytes_buf(m.data(), m.size());
    ASSERT_EQ(crypto_box_easy_afternm(c.data(), m.data(), len, n, k_ab), 0);
    ASSERT_EQ(crypto_box_open_easy(back.data(), c.data(), c.size(), n, pk_a, sk_b), 0);
    EXPECT_TRUE(std::equal(m.begin(), m.end(), back.begin()));
    for (size_t at = 0; at < c.size(); at += 7) {
      c[at] ^= 0x80;
      EXPECT_EQ(crypto_box_open_easy_afternm(back.data(), c.data(), c.size(), n, k_ba), -1) << len << " at " << at;
      c[at] ^= 0x80;
    }
  }
}

TEST(CryptShim, Z85RefusesBadLengthsAndCharacters) {
  char text[11];
  ASSERT_NE(zmq_z85_encode(text, kZ85HelloBytes, 8), nullptr);
  EXPECT_STREQ(text, kZ85Hello);
  EXPECT_EQ(zmq_z85_encode(text, kZ85HelloBytes, 7), nullptr);
  uint8_t raw[8];
  ASSERT_NE(zmq_z85_decode(raw, kZ85Hello), nullptr);
  EXPECT_EQ(Hex(raw, 8), Hex(kZ85HelloBytes, 8));
  for (const char* bad : {"", "Hell", "HelloWorl", "Hello orld", "#####", "%nSc1"}) {
    EXPECT_EQ(zmq_z85_decode(raw, bad), nullptr) << bad;
  }
  char pub[41], sec[41], derived[41];
  ASSERT_EQ(zmq_curve_keypair(pub, sec), 0);
  ASSERT_EQ(zmq_curve_public(derived, sec), 0);
  EXPECT_STREQ(pub, derived);
  EXPECT_EQ(zmq_curve_public(derived, "tooshort"), -1);
}

}  // namespace
}  // namespace daisy::crypt_test
