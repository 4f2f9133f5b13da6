// The room announcement's codec: what serve sends parses back; anything else is refused.
#include <gtest/gtest.h>

#include <random>

#include "daisy/net.h"
#include "daisy/ring.h"

namespace daisy {
namespace {

Announcement Sample() {
  Announcement a;
  a.room = "kitchen";
  a.port = 8788;
  a.fingerprint = net::Fingerprint(net::NewKeyPair().public_key);
  return a;
}

TEST(Discovery, AnnouncementRoundTrips) {
  const Announcement a = Sample();
  auto d = EncodeAnnouncement(a);
  ASSERT_TRUE(d.ok()) << d.status().message();
  auto b = ParseAnnouncement(*d);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->room, "kitchen");
  EXPECT_EQ(b->port, 8788);
  EXPECT_EQ(b->fingerprint, a.fingerprint);
  EXPECT_EQ(b->address, "");  // the listener fills it from the datagram's source
}

TEST(Discovery, EncodeRefusesWhatCannotBeAnnounced) {
  Announcement a = Sample();
  a.room = "";
  EXPECT_FALSE(EncodeAnnouncement(a).ok());
  a.room = std::string(65, 'r');
  EXPECT_FALSE(EncodeAnnouncement(a).ok());
  a.room = "two words";
  EXPECT_FALSE(EncodeAnnouncement(a).ok());
  a = Sample();
  a.port = 0;
  EXPECT_FALSE(EncodeAnnouncement(a).ok());
  a = Sample();
  a.fingerprint = "not-a-fingerprint";
  EXPECT_FALSE(EncodeAnnouncement(a).ok());
}

TEST(Discovery, EveryTruncationAndTrailingByteIsRefused) {
  const std::string d = *EncodeAnnouncement(Sample());
  for (size_t n = 0; n < d.size(); ++n) EXPECT_FALSE(ParseAnnouncement(d.substr(0, n)).ok()) << "prefix of " << n;
  EXPECT_FALSE(ParseAnnouncement(d + "x").ok());
}

TEST(Discovery, CorruptFieldsAreRefused) {
  const std::string good = *EncodeAnnouncement(Sample());
  auto with = [&](size_t at, char c) {
    std::string d = good;
    d[at] = c;
    return d;
  };
  EXPECT_FALSE(ParseAnnouncement(with(0, 'X')).ok());  // magic
  EXPECT_FALSE(ParseAnnouncement(with(4, 2)).ok());    // version
  std::string zero_port = with(5, 0);
  zero_port[6] = 0;
  EXPECT_FALSE(ParseAnnouncement(zero_port).ok());
  EXPECT_FALSE(ParseAnnouncement(with(8, ' ')).ok());   // a space in the room
  EXPECT_FALSE(ParseAnnouncement(with(8, '\n')).ok());  // a control character in the room
  EXPECT_FALSE(ParseAnnouncement(with(7, 0)).ok());     // empty room: the rest no longer fits
  const size_t fpr = 8 + 7 + 1;
  EXPECT_FALSE(ParseAnnouncement(with(fpr, 'G')).ok());      // not hex
  EXPECT_FALSE(ParseAnnouncement(with(fpr, 'A')).ok());      // upper case is not what serve writes
  EXPECT_FALSE(ParseAnnouncement(with(fpr + 4, ':')).ok());  // group separator
}

TEST(Discovery, RandomDatagramsNeverParseAndNeverCrash) {
  std::mt19937 rng(15);
  const std::string good = *EncodeAnnouncement(Sample());
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string d(rng() % 80, '\0');
    for (auto& c : d) c = static_cast<char>(rng());
    if (i % 2 == 0 && d.size() >= 4) d.replace(0, 4, "DCRM");  // past the magic, into the fields
    if (i % 4 == 0 && d.size() >= 5) d[4] = 1;
    accepted += ParseAnnouncement(d).ok();
  }
  EXPECT_EQ(accepted, 0);
  // Single-byte corruptions of a good datagram: parsed ones still hold only valid fields.
  for (size_t at = 0; at < good.size(); ++at) {
    for (int v = 0; v < 256; ++v) {
      std::string d = good;
      d[at] = static_cast<char>(v);
      auto a = ParseAnnouncement(d);
      if (!a.ok()) continue;
      EXPECT_TRUE(EncodeAnnouncement(*a).ok());
      EXPECT_EQ(*EncodeAnnouncement(*a), d);
    }
  }
}

TEST(Discovery, ChoosesTheOnlyRoomOrTheNamedOneAndSaysWhatItFound) {
  Announcement a = Sample(), b = Sample();
  a.address = "10.0.0.1";
  b.room = "garage";
  b.address = "10.0.0.2";
  auto none = ChooseRoom({}, "");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("--join"), std::string::npos);
  auto only = ChooseRoom({a}, "");
  ASSERT_TRUE(only.ok());
  EXPECT_EQ(only->address, "10.0.0.1");
  auto several = ChooseRoom({a, b}, "");
  ASSERT_FALSE(several.ok());
  EXPECT_NE(several.status().message().find("--room"), std::string::npos);
  EXPECT_NE(several.status().message().find("kitchen"), std::string::npos);
  EXPECT_NE(several.status().message().find("garage"), std::string::npos);
  EXPECT_NE(several.status().message().find(b.fingerprint), std::string::npos);
  auto named = ChooseRoom({a, b}, "garage");
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->address, "10.0.0.2");
  auto missing = ChooseRoom({a, b}, "attic");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("attic"), std::string::npos);
}

}  // namespace
}  // namespace daisy
