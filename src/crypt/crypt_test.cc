// daisy::crypt against real libsodium and libzmq: the RFC vectors, ~2000 random cases per
// function (outputs equal byte for byte, boxes opened across the two both ways, tampered
// boxes refused by both), Z85's refusals, and the golden digest computed by real libsodium.
#include "daisy/crypt.h"

#include <gtest/gtest.h>
#include <sodium.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "crypt_golden.h"
#include "crypt_vectors.h"

namespace daisy::crypt {
namespace {

using crypt_test::Bytes;
using crypt_test::FromHex;
using crypt_test::Hex;

class CryptTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_GE(sodium_init(), 0); }
  Bytes Random(size_t n) {
    Bytes b(n);
    for (auto& x : b) x = static_cast<unsigned char>(rng_());
    return b;
  }
  // Message lengths: the block edges first, then random ones up to 3000.
  size_t Length(int i) {
    static constexpr size_t kEdges[] = {0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 4095};
    constexpr int kN = sizeof kEdges / sizeof kEdges[0];
    return i < kN ? kEdges[i] : rng_() % 3001;
  }
  std::mt19937_64 rng_{20261202};
};

constexpr int kCases = 2000;

TEST_F(CryptTest, X25519MatchesRfc7748Vectors) {
  for (const auto& v : crypt_test::kX25519Vectors) {
    const Bytes n = FromHex(v.scalar), p = FromHex(v.u);
    unsigned char ours[32], theirs[32];
    ASSERT_EQ(ScalarMult(ours, n.data(), p.data()), 0);
    ASSERT_EQ(crypto_scalarmult(theirs, n.data(), p.data()), 0);
    EXPECT_EQ(Hex(ours, 32), v.out);
    EXPECT_EQ(Hex(theirs, 32), v.out);
  }
  // Section 6.1: the public keys.
  unsigned char pub[32];
  ScalarMultBase(pub, FromHex(crypt_test::kAliceSecret).data());
  EXPECT_EQ(Hex(pub, 32), crypt_test::kAlicePublic);
  ScalarMultBase(pub, FromHex(crypt_test::kBobSecret).data());
  EXPECT_EQ(Hex(pub, 32), crypt_test::kBobPublic);
  // Section 5.2's iteration: k = u = 9, then k, u = X25519(k, u), k.
  unsigned char k[32] = {9}, u[32] = {9}, r[32];
  for (int i = 1; i <= 1000; ++i) {
    ScalarMult(r, k, u);
    std::memcpy(u, k, 32);
    std::memcpy(k, r, 32);
    if (i == 1) {
      EXPECT_EQ(Hex(k, 32), crypt_test::kX25519After1);
    }
  }
  EXPECT_EQ(Hex(k, 32), crypt_test::kX25519After1000);
}

TEST_F(CryptTest, X25519EqualsLibsodiumOnRandomKeysAndPoints) {
  for (int i = 0; i < kCases; ++i) {
    const Bytes n = Random(32), p = Random(32);  // any 32 bytes, top bit and values >= p included
    unsigned char ours[32], theirs[32];
    ASSERT_EQ(ScalarMultBase(ours, n.data()), crypto_scalarmult_base(theirs, n.data()));
    ASSERT_EQ(Hex(ours, 32), Hex(theirs, 32)) << "base, case " << i;
    const int r = ScalarMult(ours, n.data(), p.data());
    ASSERT_EQ(r, crypto_scalarmult(theirs, n.data(), p.data())) << "case " << i;
    if (r == 0) {
      ASSERT_EQ(Hex(ours, 32), Hex(theirs, 32)) << "case " << i;
    }
  }
}

TEST_F(CryptTest, X25519RefusesPointsOfSmallOrderAsLibsodiumDoes) {
  // 0, 1, the two points of order 8, p - 1, p, p + 1 (libsodium's list), with and without bit 255.
  static constexpr const char* kPoints[] = {
      "0000000000000000000000000000000000000000000000000000000000000000",
      "0100000000000000000000000000000000000000000000000000000000000000",
      "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
      "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
      "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
      "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
      "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
  };
  for (const char* hex : kPoints) {
    for (int top = 0; top < 2; ++top) {
      Bytes p = FromHex(hex);
      p[31] |= static_cast<unsigned char>(top << 7);
      const Bytes n = Random(32);
      unsigned char q[32], k[32];
      EXPECT_EQ(ScalarMult(q, n.data(), p.data()), -1) << hex;
      EXPECT_EQ(crypto_scalarmult(q, n.data(), p.data()), -1) << hex;
      EXPECT_EQ(BoxBeforeNm(k, p.data(), n.data()), -1) << hex;
      EXPECT_EQ(crypto_box_beforenm(k, p.data(), n.data()), -1) << hex;
    }
  }
}

TEST_F(CryptTest, Poly1305MatchesRfc8439AndLibsodium) {
  const Bytes key = FromHex(crypt_test::kPolyKey);
  const std::string text = crypt_test::kPolyText;
  const auto* m = reinterpret_cast<const unsigned char*>(text.data());
  unsigned char tag[16];
  OneTimeAuth(tag, m, text.size(), key.data());
  EXPECT_EQ(Hex(tag, 16), crypt_test::kPolyTag);
  EXPECT_EQ(OneTimeAuthVerify(tag, m, text.size(), key.data()), 0);
  tag[15] ^= 1;
  EXPECT_EQ(OneTimeAuthVerify(tag, m, text.size(), key.data()), -1);
  // Accumulators that land in [p, 2^130) before the final reduction, and a carry out of
  // h + s (crypt_vectors.h).
  for (const auto& e : crypt_test::kPolyEdges) {
    const Bytes k = FromHex(e.key), msg = FromHex(e.msg);
    unsigned char ours[16], theirs[16];
    OneTimeAuth(ours, msg.data(), msg.size(), k.data());
    crypto_onetimeauth_poly1305(theirs, msg.data(), msg.size(), k.data());
    EXPECT_EQ(Hex(ours, 16), Hex(theirs, 16)) << e.key << " " << e.msg;
    EXPECT_EQ(Hex(ours, 16), e.tag) << e.key << " " << e.msg;
  }
  for (int i = 0; i < kCases; ++i) {
    // Now and then r and s all ones, blocks of 0xff: the limbs at their largest.
    const Bytes k = i % 7 == 0 ? Bytes(32, 0xff) : Random(32);
    const Bytes msg = i % 11 == 0 ? Bytes(Length(i), 0xff) : Random(Length(i));
    unsigned char ours[16], theirs[16];
    OneTimeAuth(ours, msg.data(), msg.size(), k.data());
    crypto_onetimeauth_poly1305(theirs, msg.data(), msg.size(), k.data());
    ASSERT_EQ(Hex(ours, 16), Hex(theirs, 16)) << "case " << i << ", " << msg.size() << " bytes";
  }
}

TEST_F(CryptTest, SalsaEqualsLibsodium) {
  for (int i = 0; i < kCases; ++i) {
    const Bytes k = Random(32), n = Random(24), msg = Random(Length(i));
    unsigned char ours[32], theirs[32];
    CoreHSalsa20(ours, n.data(), k.data());
    crypto_core_hsalsa20(theirs, n.data(), k.data(), nullptr);
    ASSERT_EQ(Hex(ours, 32), Hex(theirs, 32)) << "case " << i;
    Bytes a(msg.size()), b(msg.size());
    StreamXSalsa20Xor(a.data(), msg.data(), msg.size(), n.data(), k.data());
    crypto_stream_xsalsa20_xor(b.data(), msg.data(), msg.size(), n.data(), k.data());
    ASSERT_EQ(a, b) << "case " << i << ", " << msg.size() << " bytes";
  }
}

TEST_F(CryptTest, BoxesEqualLibsodiumAndOpenAcrossBothWays) {
  unsigned char pk_a[32], sk_a[32], pk_b[32], sk_b[32], k_ours[32], k_theirs[32];
  for (int i = 0; i < kCases; ++i) {
    // New keys every 8 boxes (X25519 has its own 2000 cases above): a's ours, b's libsodium's.
    if (i % 8 == 0) {
      ASSERT_EQ(BoxKeypair(pk_a, sk_a), 0);
      ASSERT_EQ(crypto_box_keypair(pk_b, sk_b), 0);
      unsigned char check[32];
      crypto_scalarmult_base(check, sk_a);
      ASSERT_EQ(Hex(pk_a, 32), Hex(check, 32));
      ASSERT_EQ(BoxBeforeNm(k_ours, pk_b, sk_a), 0);
      ASSERT_EQ(crypto_box_beforenm(k_theirs, pk_b, sk_a), 0);
      ASSERT_EQ(Hex(k_ours, 32), Hex(k_theirs, 32));
    }
    const Bytes msg = Random(Length(i)), n = Random(24);
    Bytes ours(msg.size() + crypto_box_MACBYTES), theirs(ours.size());
    ASSERT_EQ(BoxEasyAfterNm(ours.data(), msg.data(), msg.size(), n.data(), k_ours), 0);
    ASSERT_EQ(crypto_box_easy_afternm(theirs.data(), msg.data(), msg.size(), n.data(), k_theirs), 0);
    ASSERT_EQ(ours, theirs) << "case " << i << ", " << msg.size() << " bytes";
    // Ours opened by libsodium (b's side, from a), libsodium's opened by ours; the one-call
    // forms (an X25519 each) on every 8th case.
    Bytes back(msg.size() + 1, 0xa5);
    ASSERT_EQ(crypto_box_open_easy_afternm(back.data(), ours.data(), ours.size(), n.data(), k_theirs), 0);
    ASSERT_TRUE(std::equal(msg.begin(), msg.end(), back.begin()));
    if (i % 8 == 0) {
      ASSERT_EQ(BoxEasy(ours.data(), msg.data(), msg.size(), n.data(), pk_b, sk_a), 0);
      ASSERT_EQ(ours, theirs);
      ASSERT_EQ(crypto_box_open_easy(back.data(), ours.data(), ours.size(), n.data(), pk_a, sk_b), 0);
      ASSERT_TRUE(std::equal(msg.begin(), msg.end(), back.begin()));
      std::fill(back.begin(), back.end(), 0xa5);
      ASSERT_EQ(BoxOpenEasy(back.data(), theirs.data(), theirs.size(), n.data(), pk_a, sk_b), 0);
      ASSERT_TRUE(std::equal(msg.begin(), msg.end(), back.begin()));
      ASSERT_EQ(back.back(), 0xa5) << "wrote past the message";
    }
    ASSERT_EQ(BoxOpenEasyAfterNm(back.data(), theirs.data(), theirs.size(), n.data(), k_ours), 0);
    ASSERT_TRUE(std::equal(msg.begin(), msg.end(), back.begin()));
    // In place, as libsodium allows (c == m).
    Bytes inplace(msg.size() + crypto_box_MACBYTES);
    std::copy(msg.begin(), msg.end(), inplace.begin());
    ASSERT_EQ(BoxEasyAfterNm(inplace.data(), inplace.data(), msg.size(), n.data(), k_ours), 0);
    ASSERT_EQ(inplace, theirs);
    ASSERT_EQ(BoxOpenEasyAfterNm(inplace.data(), inplace.data(), inplace.size(), n.data(), k_ours), 0);
    ASSERT_TRUE(std::equal(msg.begin(), msg.end(), inplace.begin()));
    // One flipped bit anywhere (MAC or ciphertext), or a wrong nonce: refused by both, nothing written.
    Bytes bad = theirs;
    bad[rng_() % bad.size()] ^= static_cast<unsigned char>(1u << (rng_() % 8));
    std::fill(back.begin(), back.end(), 0xa5);
    ASSERT_EQ(BoxOpenEasyAfterNm(back.data(), bad.data(), bad.size(), n.data(), k_ours), -1);
    ASSERT_EQ(crypto_box_open_easy_afternm(back.data(), bad.data(), bad.size(), n.data(), k_theirs), -1);
    if (i % 8 == 0) {
      ASSERT_EQ(crypto_box_open_easy(back.data(), bad.data(), bad.size(), n.data(), pk_a, sk_b), -1);
    }
    ASSERT_TRUE(std::all_of(back.begin(), back.end(), [](unsigned char x) { return x == 0xa5; }));
    Bytes other_n = n;
    other_n[rng_() % 24] ^= 1;
    ASSERT_EQ(BoxOpenEasyAfterNm(back.data(), theirs.data(), theirs.size(), other_n.data(), k_ours), -1);
    ASSERT_EQ(BoxOpenEasyAfterNm(back.data(), theirs.data(), rng_() % crypto_box_MACBYTES, n.data(), k_ours), -1);
  }
}

TEST_F(CryptTest, Blake2bMatchesRfc7693AndLibsodium) {
  unsigned char d[64];
  ASSERT_EQ(GenericHash(d, 64, nullptr, 0, nullptr, 0), 0);
  EXPECT_EQ(Hex(d, 64), crypt_test::kBlake2bEmpty);
  ASSERT_EQ(GenericHash(d, 64, reinterpret_cast<const unsigned char*>("abc"), 3, nullptr, 0), 0);
  EXPECT_EQ(Hex(d, 64), crypt_test::kBlake2bAbc);
  for (int i = 0; i < kCases; ++i) {
    const size_t outlen = 1 + rng_() % 64, keylen = i % 5 == 0 ? 0 : rng_() % 65;
    const Bytes msg = Random(Length(i)), key = Random(64);
    const unsigned char* kp = keylen ? key.data() : nullptr;
    unsigned char ours[64], theirs[64];
    ASSERT_EQ(GenericHash(ours, outlen, msg.data(), msg.size(), kp, keylen), 0);
    ASSERT_EQ(crypto_generichash(theirs, outlen, msg.data(), msg.size(), kp, keylen), 0);
    ASSERT_EQ(Hex(ours, outlen), Hex(theirs, outlen)) << "case " << i;
    // Streamed in random pieces, through both state APIs.
    GenericHashState st;
    crypto_generichash_state sst;
    ASSERT_EQ(GenericHashInit(&st, kp, keylen, outlen), 0);
    ASSERT_EQ(crypto_generichash_init(&sst, kp, keylen, outlen), 0);
    for (size_t at = 0; at < msg.size();) {
      const size_t piece = std::min<size_t>(msg.size() - at, rng_() % 300);
      ASSERT_EQ(GenericHashUpdate(&st, msg.data() + at, piece), 0);
      ASSERT_EQ(crypto_generichash_update(&sst, msg.data() + at, piece), 0);
      at += piece;
    }
    ASSERT_EQ(GenericHashFinal(&st, ours, outlen), 0);
    ASSERT_EQ(crypto_generichash_final(&sst, theirs, outlen), 0);
    ASSERT_EQ(Hex(ours, outlen), Hex(theirs, outlen)) << "streamed, case " << i;
    ASSERT_EQ(GenericHashFinal(&st, ours, outlen), -1);
    ASSERT_EQ(crypto_generichash_final(&sst, theirs, outlen), -1);
  }
  // Refused alike: no output, an output or a key over 64 bytes.
  const unsigned char key[65] = {0};
  for (const auto& [outlen, keylen] : {std::pair<size_t, size_t>{0, 0}, {65, 0}, {32, 65}}) {
    EXPECT_EQ(GenericHash(d, outlen, key, 1, key, keylen), -1);
    EXPECT_EQ(crypto_generichash(d, outlen, key, 1, key, keylen), -1);
    GenericHashState st;
    crypto_generichash_state sst;
    EXPECT_EQ(GenericHashInit(&st, key, keylen, outlen), -1);
    EXPECT_EQ(crypto_generichash_init(&sst, key, keylen, outlen), -1);
  }
}

TEST_F(CryptTest, Z85EqualsLibzmqAndRefusesWhatItRefuses) {
  // RFC 32's example.
  char text[11];
  ASSERT_NE(Z85Encode(text, crypt_test::kZ85HelloBytes, 8), nullptr);
  EXPECT_STREQ(text, crypt_test::kZ85Hello);
  static constexpr char kAlphabet[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  for (int i = 0; i < kCases; ++i) {
    // Encode: every size, the multiples of 4 accepted.
    const Bytes data = Random(rng_() % 70);
    std::string ours(data.size() * 5 / 4 + 1, 'x'), theirs(ours.size(), 'y');
    char* a = Z85Encode(ours.data(), data.data(), data.size());
    char* b = zmq_z85_encode(theirs.data(), data.data(), data.size());
    ASSERT_EQ(a == nullptr, b == nullptr) << data.size() << " bytes";
    if (a != nullptr) {
      ASSERT_EQ(ours, theirs);
      Bytes back(data.size() + 1, 0);
      if (!data.empty()) {
        ASSERT_NE(Z85Decode(back.data(), ours.c_str()), nullptr);
        ASSERT_TRUE(std::equal(data.begin(), data.end(), back.begin()));
      }
    }
    // Decode: strings of Z85 letters (any length, large groups), now and then another byte.
    std::string s(rng_() % 51, '0');
    for (auto& ch : s) ch = rng_() % 16 == 0 ? kAlphabet[84 - rng_() % 3] : kAlphabet[rng_() % 85];
    if (!s.empty() && i % 5 == 0) s[rng_() % s.size()] = static_cast<char>(1 + rng_() % 255);
    Bytes x(s.size(), 0x11), y(s.size(), 0x11);
    errno = 0;
    uint8_t* c = Z85Decode(x.data(), s.c_str());
    if (c == nullptr) {
      EXPECT_EQ(errno, EINVAL);
    }
    uint8_t* d = zmq_z85_decode(y.data(), s.c_str());
    ASSERT_EQ(c == nullptr, d == nullptr) << "'" << s << "'";
    if (c != nullptr) {
      ASSERT_EQ(x, y) << "'" << s << "'";
    }
  }
  unsigned char raw[8];
  for (const char* bad : {"", "0000", "000000", "#####", "%nSc1", "Hello Worl", "HelloWorl\x7f"}) {
    EXPECT_EQ(Z85Decode(raw, bad), nullptr) << bad;
    EXPECT_EQ(zmq_z85_decode(raw, bad), nullptr) << bad;
  }
  ASSERT_NE(Z85Decode(raw, "%nSc0"), nullptr);  // 2^32 - 1, the largest group
  EXPECT_EQ(Hex(raw, 4), "ffffffff");
}

TEST_F(CryptTest, CurveKeysEqualLibzmq) {
  for (int i = 0; i < kCases / 4; ++i) {  // X25519 itself has its 2000 cases above
    const Bytes secret = Random(32);
    char z_secret[41], ours[41], theirs[41];
    zmq_z85_encode(z_secret, secret.data(), 32);
    ASSERT_EQ(CurvePublic(ours, z_secret), 0);
    ASSERT_EQ(zmq_curve_public(theirs, z_secret), 0);
    ASSERT_STREQ(ours, theirs);
    char pub[41], sec[41];
    ASSERT_EQ(CurveKeypair(pub, sec), 0);
    ASSERT_EQ(zmq_curve_public(theirs, sec), 0);
    ASSERT_STREQ(pub, theirs);
  }
  char out[41];
  EXPECT_EQ(CurvePublic(out, "short"), -1);
  EXPECT_EQ(CurvePublic(out, "0000000000000000000000000000000000000 00"), -1);
}

TEST_F(CryptTest, HelpersBehaveAsLibsodiums) {
  EXPECT_GE(Init(), 0);
  EXPECT_EQ(Init(), 1);
  for (int i = 0; i < kCases; ++i) {
    Bytes a = Random(1 + rng_() % 64), b = a;
    if (i % 2) b[rng_() % b.size()] ^= static_cast<unsigned char>(1u << (rng_() % 8));
    ASSERT_EQ(MemCmp(a.data(), b.data(), a.size()), sodium_memcmp(a.data(), b.data(), a.size()));
  }
  // Random bytes: the whole buffer, nothing past it, never twice the same.
  Bytes r1(4097, 0), r2(4097, 0);
  RandomBytes(r1.data(), 4096);
  RandomBytes(r2.data(), 4096);
  EXPECT_NE(r1, r2);
  EXPECT_EQ(r1[4096], 0);
  int zeros = 0;
  for (size_t i = 0; i < 4096; ++i) zeros += r1[i] == 0;
  EXPECT_LT(zeros, 64);  // 16 expected; a generator that left bytes alone would leave 4096
  Bytes z = Random(33);
  MemZero(z.data(), 32);
  EXPECT_TRUE(std::all_of(z.begin(), z.begin() + 32, [](unsigned char x) { return x == 0; }));
}

// The bits every build must give (crypt_golden.h): real libsodium's, here.
TEST_F(CryptTest, LibsodiumGivesTheGoldenDigest) {
  EXPECT_EQ(crypt_test::CryptGoldenDigest(), crypt_test::kCryptGoldenDigest);
  // The fixed key of crypt_shim_test and tests/wasm/engine_test.mjs, as net::KeyId computes it.
  const Bytes pub = FromHex(crypt_test::kAlicePublic);
  char z85[41];
  ASSERT_NE(zmq_z85_encode(z85, pub.data(), 32), nullptr);
  EXPECT_STREQ(z85, crypt_test::kAliceZ85);
  unsigned char digest[32];
  crypto_generichash(digest, sizeof digest, pub.data(), pub.size(), nullptr, 0);
  EXPECT_EQ(Hex(digest, 8), crypt_test::kAliceKeyId);
}

}  // namespace
}  // namespace daisy::crypt
