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

namespace daisy::crypt {
namespace {

using Bytes = std::vector<unsigned char>;

Bytes FromHex(const std::string& hex) {
  Bytes out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<unsigned char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::string Hex(const unsigned char* p, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 15];
  }
  return out;
}

TEST(CryptShim, GivesTheGoldenDigest) {
  EXPECT_EQ(crypt_test::CryptGoldenDigest(), crypt_test::kCryptGoldenDigest);
}

TEST(CryptShim, X25519MatchesRfc7748) {
  unsigned char out[32];
  const Bytes alice = FromHex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
  const Bytes bob = FromHex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb");
  ASSERT_EQ(crypto_scalarmult_base(out, alice.data()), 0);
  EXPECT_EQ(Hex(out, 32), "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
  const Bytes bob_public = FromHex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
  ASSERT_EQ(crypto_scalarmult(out, alice.data(), bob_public.data()), 0);
  EXPECT_EQ(Hex(out, 32), "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
  unsigned char k[32] = {9}, u[32] = {9}, r[32];
  for (int i = 1; i <= 1000; ++i) {  // section 5.2's iteration
    ASSERT_EQ(crypto_scalarmult(r, k, u), 0);
    std::memcpy(u, k, 32);
    std::memcpy(k, r, 32);
  }
  EXPECT_EQ(Hex(k, 32), "684cf59ba83309552800ef566f2f4d3c1c3887c49360e3875f2eb94d99532c51");
  const unsigned char zero[32] = {0};
  EXPECT_EQ(crypto_scalarmult(out, alice.data(), zero), -1);
}

TEST(CryptShim, Poly1305AndBlake2bMatchTheirRfcs) {
  const Bytes key = FromHex("85d6be7857556d337f4452fe42d506a80103808afb0db2fd4abff6af4149f51b");
  const std::string text = "Cryptographic Forum Research Group";
  unsigned char tag[16];
  crypto_onetimeauth_poly1305(tag, reinterpret_cast<const unsigned char*>(text.data()), text.size(), key.data());
  EXPECT_EQ(Hex(tag, 16), "a8061dc1305136c6c22b8baf0c0127a9");
  // RFC 8439 A.3, vectors 5, 6, 8: h reaches p or more before the final reduction, h + s carries.
  static constexpr struct {
    const char *key, *msg, *tag;
  } kEdges[] = {
      {"0200000000000000000000000000000000000000000000000000000000000000", "ffffffffffffffffffffffffffffffff",
       "03000000000000000000000000000000"},
      {"02000000000000000000000000000000ffffffffffffffffffffffffffffffff", "02000000000000000000000000000000",
       "03000000000000000000000000000000"},
      {"0100000000000000000000000000000000000000000000000000000000000000",
       "fffffffffffffffffffffffffffffffffbfefefefefefefefefefefefefefefe01010101010101010101010101010101",
       "00000000000000000000000000000000"},
  };
  for (const auto& e : kEdges) {
    const Bytes k = FromHex(e.key), m = FromHex(e.msg);
    crypto_onetimeauth_poly1305(tag, m.data(), m.size(), k.data());
    EXPECT_EQ(Hex(tag, 16), e.tag) << e.key << " " << e.msg;
  }
  unsigned char d[64];
  ASSERT_EQ(crypto_generichash(d, 64, nullptr, 0, nullptr, 0), 0);
  EXPECT_EQ(
      Hex(d, 64),
      "786a02f742015903c6c6fd852552d272912f4740e15847618a86e217f71f5419d25e1031afee585313896444934eb04b903a685b1448"
      "b755d56f701afe9be2ce");
}

// net::KeyId / net::Fingerprint's recipe (the first 8 bytes of BLAKE2b-256 of the raw
// public key) on RFC 7748's Alice: the constant crypt_test also gets from real libsodium,
// and tests/wasm/engine_test.mjs from the engine's daisy_fingerprint.
TEST(CryptShim, KeyIdOfAFixedKey) {
  const Bytes pub = FromHex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
  char z85[41];
  ASSERT_NE(zmq_z85_encode(z85, pub.data(), 32), nullptr);
  EXPECT_STREQ(z85, crypt_test::kAliceZ85);
  uint8_t raw[32];
  ASSERT_NE(zmq_z85_decode(raw, z85), nullptr);
  unsigned char digest[32];
  crypto_generichash(digest, sizeof digest, raw, sizeof raw, nullptr, 0);
  EXPECT_EQ(Hex(digest, 8), crypt_test::kAliceKeyId);
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
  const unsigned char hello[8] = {0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B};
  char text[11];
  ASSERT_NE(zmq_z85_encode(text, hello, 8), nullptr);
  EXPECT_STREQ(text, "HelloWorld");
  EXPECT_EQ(zmq_z85_encode(text, hello, 7), nullptr);
  uint8_t raw[8];
  ASSERT_NE(zmq_z85_decode(raw, "HelloWorld"), nullptr);
  EXPECT_EQ(Hex(raw, 8), "864fd26fb559f75b");
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
}  // namespace daisy::crypt
