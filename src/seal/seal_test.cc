// Keys and boxes without ZeroMQ agree with libzmq's Z85 and CURVE keys and with libsodium.
#include "daisy/seal.h"

#include <gtest/gtest.h>
#include <sodium.h>
#include <zmq.h>

namespace daisy::net {
namespace {

TEST(Seal, Z85MatchesLibzmq) {
  for (int i = 0; i < 64; ++i) {
    std::array<uint8_t, 32> raw{};
    randombytes_buf(raw.data(), raw.size());
    if (i == 0) raw.fill(0xff);  // the largest groups
    if (i == 1) raw.fill(0);
    char theirs[41] = {0};
    ASSERT_NE(zmq_z85_encode(theirs, raw.data(), raw.size()), nullptr);
    EXPECT_EQ(Z85Encode(raw), std::string(theirs));
    std::array<uint8_t, 32> back{};
    ASSERT_TRUE(Z85Decode(theirs, back));
    EXPECT_EQ(back, raw);
  }
  std::array<uint8_t, 32> out{};
  EXPECT_FALSE(Z85Decode(std::string(39, '0'), out));
  EXPECT_FALSE(Z85Decode(std::string(40, '"'), out));   // not in the alphabet
  EXPECT_FALSE(Z85Decode(std::string(40, '#'), out));   // 85^5 - 1 > 2^32 - 1
  EXPECT_FALSE(Z85Decode(std::string(40, '\0'), out));  // NUL is no digit
}

TEST(Seal, KeyPairsAreCurveKeys) {
  const KeyPair k = NewBoxKeyPair();
  char pub[41] = {0};
  ASSERT_EQ(zmq_curve_public(pub, k.secret_key.c_str()), 0);
  EXPECT_EQ(k.public_key, std::string(pub));
  char zpub[41] = {0}, zsec[41] = {0};
  ASSERT_EQ(zmq_curve_keypair(zpub, zsec), 0);
  auto derived = KeyPairFromSecret(zsec);
  ASSERT_TRUE(derived.ok()) << derived.status().message();
  EXPECT_EQ(derived->public_key, std::string(zpub));
  EXPECT_FALSE(KeyPairFromSecret("short").ok());
  EXPECT_EQ(KeyId(k.public_key).size(), 16u);
  EXPECT_EQ(Fingerprint(k.public_key).substr(0, 4), KeyId(k.public_key).substr(0, 4));
}

TEST(Seal, BoxesOpenOnceForTheirRecipient) {
  const KeyPair a = NewBoxKeyPair(), b = NewBoxKeyPair(), c = NewBoxKeyPair();
  PeerBoxes pa(a), pb(b), pc(c);
  const std::vector<uint8_t> frame{1, 2, 3, 4};
  auto env = pa.Seal(b.public_key, frame);
  ASSERT_TRUE(env.ok());
  EXPECT_FALSE(pc.Open(a.public_key, *env).ok());  // another recipient
  auto opened = pb.Open(a.public_key, *env);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  EXPECT_EQ(*opened, frame);
  EXPECT_FALSE(pb.Open(a.public_key, *env).ok());  // a replay
  auto env2 = pa.Seal(b.public_key, frame);
  ASSERT_TRUE(env2.ok());
  env2->box[3] ^= 1;
  EXPECT_FALSE(pb.Open(a.public_key, *env2).ok());  // changed on the way
}

}  // namespace
}  // namespace daisy::net
