// The ring module's pure parts: the plan's wire form and the hop codec routed by plan::Route.
#include "daisy/ring.h"

#include <gtest/gtest.h>

namespace daisy {
namespace {

Plan ThreeStages() {
  Plan p;
  for (int i = 0; i < 3; ++i) {
    StageAssignment s;
    s.device_id = "dev" + std::to_string(i);
    s.address = "tcp://127.0.0.1:" + std::to_string(9000 + i);
    s.first = i * 2;
    s.end = i * 2 + 2;
    p.stages.push_back(s);
  }
  return p;
}

HiddenStates Rows(int first, int n, int hidden) {
  HiddenStates h;
  h.hidden = hidden;
  for (int i = 0; i < n; ++i) h.positions.push_back(first + i);
  for (int i = 0; i < n * hidden; ++i) h.values.push_back(0.25f * static_cast<float>(i) - 1.0f);
  return h;
}

TEST(PlanWire, RoundTripsDeviceAddressAndLayers) {
  const Plan p = ThreeStages();
  const auto wire = WireStages(p);
  ASSERT_EQ(wire.size(), 3u);
  EXPECT_EQ(wire[1].device_id, "dev1");
  EXPECT_EQ(wire[1].address, "tcp://127.0.0.1:9001");
  EXPECT_EQ(wire[2].first, 4);
  const Plan back = PlanFromWire(wire);
  ASSERT_EQ(back.stages.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back.stages[i].device_id, p.stages[i].device_id);
    EXPECT_EQ(back.stages[i].address, p.stages[i].address);
    EXPECT_EQ(back.stages[i].first, p.stages[i].first);
    EXPECT_EQ(back.stages[i].end, p.stages[i].end);
  }
}

// Walks a lap the way the ring does: the head encodes for stage 1, each stage decodes,
// encodes for where Route sends it, and the last hop goes to the head's RETURN address.
TEST(HopCodec, ALapFollowsRouteAndReturnsToTheHead) {
  const Plan p = ThreeStages();
  const HiddenStates sent = Rows(5, 3, 4);
  HiddenStates first = Rows(5, 3, 4);
  auto hop = EncodeHop(p, 0, 7, 0xabcd, first);
  EXPECT_TRUE(first.values.empty()) << "the rows' values travel in the activation";
  EXPECT_EQ(first.positions, sent.positions) << "the positions stay with the sender";
  ASSERT_TRUE(hop.ok()) << hop.status().message();
  std::vector<std::string> visited;
  for (int step = 0; step < 3; ++step) {
    visited.push_back(hop->address);
    if (hop->activation.next == wire::kNextReturn) break;
    EXPECT_EQ(hop->activation.seq, 7);
    EXPECT_EQ(hop->activation.model_hash, 0xabcdu);
    EXPECT_EQ(hop->activation.act_hash, wire::ActHash(hop->activation.values));
    const int at = hop->activation.next;
    auto rows = DecodeHop(hop->activation, 4);
    ASSERT_TRUE(rows.ok()) << rows.status().message();
    EXPECT_EQ(rows->positions, sent.positions);
    EXPECT_EQ(rows->values, sent.values);
    hop = EncodeHop(p, at, 7, 0xabcd, *rows);
    ASSERT_TRUE(hop.ok());
  }
  EXPECT_EQ(visited,
            (std::vector<std::string>{"tcp://127.0.0.1:9001", "tcp://127.0.0.1:9002", "tcp://127.0.0.1:9000"}));
  EXPECT_EQ(hop->activation.next, wire::kNextReturn);
  EXPECT_EQ(hop->activation.token_index, 5);
}

TEST(HopCodec, RefusesRowsOfTheWrongWidthAndStagesOutsideThePlan) {
  wire::Activation a;
  a.token_index = 3;
  a.values.assign(10, 1.0f);
  auto bad = DecodeHop(a, 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("whole number of rows"), std::string::npos) << bad.status().message();
  a.values.clear();
  EXPECT_FALSE(DecodeHop(a, 4).ok()) << "an empty activation carries no rows";
  HiddenStates rows = Rows(0, 1, 4);
  EXPECT_FALSE(EncodeHop(ThreeStages(), 3, 1, 1, rows).ok()) << "there is no stage 3";
}

TEST(MessageName, NamesEveryMessageByItsTag) {
  EXPECT_EQ(MessageName(wire::Message(wire::Activation{})), "activation");
  EXPECT_EQ(MessageName(wire::Message(wire::Hello{})), "hello");
  EXPECT_EQ(MessageName(wire::Message(wire::HopReceipt{})), "hop_receipt");
}

}  // namespace
}  // namespace daisy
