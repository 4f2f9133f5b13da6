// The tab's link client against serve's side of the DCL1 handshake as docs/WIRE.md writes
// it (here in the test), and the tab member fed frames in memory: it joins, takes a head's
// assignment, fetches its layers and runs a hop that equals the same layers run alone.
#include "daisy/tab.h"

#include <gtest/gtest.h>
#include <sodium.h>

#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "daisy/forward.h"
#include "daisy/kernels.h"
#include "daisy/model.h"

namespace daisy::tab {
namespace {

using Bytes = std::vector<uint8_t>;

// serve's side of one link, written from docs/WIRE.md alone.
struct FakeServe {
  net::KeyPair keys = net::NewBoxKeyPair();
  std::string id = net::KeyId(keys.public_key);
  net::PeerBoxes boxes{keys};
  std::array<uint8_t, 32> challenge_s{};
  std::string tab_key, tab_id;

  Bytes First(uint8_t version = 1) {
    randombytes_buf(challenge_s.data(), challenge_s.size());
    Bytes m{'D', 'C', 'L', '1', version};
    m.insert(m.end(), keys.public_key.begin(), keys.public_key.end());
    m.insert(m.end(), challenge_s.begin(), challenge_s.end());
    return m;
  }
  // The tab's answer -> serve's proof (or a test failure).
  Bytes Proof(const Bytes& answer, bool wrong_challenge = false) {
    EXPECT_GT(answer.size(), 45u);
    EXPECT_EQ(std::string(answer.begin(), answer.begin() + 4), "DCL1");
    EXPECT_EQ(answer[4], 1);
    tab_key.assign(answer.begin() + 5, answer.begin() + 45);
    tab_id = net::KeyId(tab_key);
    auto m = wire::Decode(std::span<const uint8_t>(answer).subspan(45));
    EXPECT_TRUE(m.ok());
    auto& env = std::get<wire::Relay>(*m);
    EXPECT_EQ(env.from, tab_id);
    EXPECT_EQ(env.to, id);
    auto inner = boxes.Open(tab_key, env);
    EXPECT_TRUE(inner.ok()) << inner.status().message();
    EXPECT_EQ(inner->size(), 64u);
    EXPECT_EQ(0, std::memcmp(inner->data(), challenge_s.data(), 32));
    Bytes challenge_c(inner->begin() + 32, inner->end());
    if (wrong_challenge) challenge_c[0] ^= 1;
    return Down(challenge_c);
  }
  Bytes Down(const Bytes& inner) { return wire::Encode(wire::Message(*boxes.Seal(tab_key, inner))); }
  Bytes Down(const wire::Message& m) { return Down(wire::Encode(m)); }
  Result<wire::Message> Up(const Bytes& message) {
    auto m = wire::Decode(message);
    if (!m.ok()) return m.status();
    DAISY_ASSIGN_OR_RETURN(Bytes inner, boxes.Open(tab_key, std::get<wire::Relay>(*m)));
    return wire::Decode(inner);
  }
};

TEST(LinkClient, HandshakeThenEnvelopesBothWays) {
  FakeServe serve;
  LinkClient link(net::NewBoxKeyPair(), serve.keys.public_key);
  auto answer = link.Answer(serve.First());
  ASSERT_TRUE(answer.ok()) << answer.status().message();
  EXPECT_FALSE(link.up());
  ASSERT_TRUE(link.Confirm(serve.Proof(*answer)).ok());
  EXPECT_TRUE(link.up());
  EXPECT_EQ(link.server_id(), serve.id);

  auto up = link.Seal(wire::Encode(wire::Message(wire::Bye{"0123456789abcdef"})));
  ASSERT_TRUE(up.ok());
  auto got = serve.Up(*up);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(std::get<wire::Bye>(*got).device_id, "0123456789abcdef");

  const Bytes down = serve.Down(Bytes{7, 8, 9});
  auto inner = link.Open(down);
  ASSERT_TRUE(inner.ok()) << inner.status().message();
  EXPECT_EQ(*inner, (Bytes{7, 8, 9}));
  EXPECT_FALSE(link.Open(down).ok());  // a replay
  Bytes tampered = serve.Down(Bytes{1, 2, 3});
  tampered.back() ^= 1;
  EXPECT_FALSE(link.Open(tampered).ok());
}

TEST(LinkClient, RefusesABadFirstMessageOrProof) {
  const net::KeyPair tab = net::NewBoxKeyPair();
  {
    FakeServe serve;
    Bytes first = serve.First();
    first[0] = 'X';
    EXPECT_EQ(LinkClient(tab).Answer(first).status().code(), ErrorCode::kInvalidArgument);
  }
  {
    FakeServe serve;
    EXPECT_EQ(LinkClient(tab).Answer(serve.First(/*version=*/2)).status().code(), ErrorCode::kInvalidArgument);
  }
  {
    FakeServe serve;
    Bytes first = serve.First();
    first.pop_back();
    EXPECT_EQ(LinkClient(tab).Answer(first).status().code(), ErrorCode::kInvalidArgument);
  }
  {
    FakeServe serve, impostor;
    auto r = LinkClient(tab, serve.keys.public_key).Answer(impostor.First());
    EXPECT_EQ(r.status().code(), ErrorCode::kPermissionDenied);
    EXPECT_NE(r.status().message().find(net::Fingerprint(impostor.keys.public_key)), std::string::npos);
  }
  {
    FakeServe serve;
    LinkClient link(tab);
    auto answer = link.Answer(serve.First());
    ASSERT_TRUE(answer.ok());
    EXPECT_EQ(link.Confirm(serve.Proof(*answer, /*wrong_challenge=*/true)).code(), ErrorCode::kPermissionDenied);
    EXPECT_FALSE(link.up());
  }
}

// A head in the test: its keys, its boxes, and the model's first layers.
struct FakeHead {
  net::KeyPair keys = net::NewBoxKeyPair();
  std::string id = net::KeyId(keys.public_key);
  std::string address = "tcp://127.0.0.1:1";
  net::PeerBoxes boxes{keys};
};

std::string Stories() {
  return std::string(std::getenv("DAISY_MODELS")) + "/stories260K";
}

struct TabRing : ::testing::Test {
  FakeServe serve;
  FakeHead head;
  std::unique_ptr<TabMember> tab;
  int opened = 0;

  void SetUp() override {
    TabOptions o;
    o.keys = net::NewBoxKeyPair();
    o.room = "r";
    o.name = "tab-under-test";
    o.budget = 1ull << 30;
    o.open_model = [this](const std::string& model_id, const std::string&) {
      ++opened;
      return OpenLocalFolder(model_id);
    };
    auto t = TabMember::Create(std::move(o));
    ASSERT_TRUE(t.ok()) << t.status().message();
    tab = std::move(*t);
  }

  std::vector<wire::Message> Up() {
    std::vector<wire::Message> out;
    for (auto& m : tab->TakeOutgoing()) {
      auto got = serve.Up(m);
      EXPECT_TRUE(got.ok()) << got.status().message();
      if (got.ok()) out.push_back(std::move(*got));
    }
    return out;
  }
  // What the head receives of the tab's member envelopes.
  std::vector<wire::Message> ToHead() {
    std::vector<wire::Message> out;
    for (auto& m : Up()) {
      auto* env = std::get_if<wire::Relay>(&m);
      if (!env) continue;
      EXPECT_EQ(env->to, head.id);
      auto inner = head.boxes.Open(serve.tab_key, *env);
      EXPECT_TRUE(inner.ok()) << inner.status().message();
      if (inner.ok()) out.push_back(*wire::Decode(*inner));
    }
    return out;
  }
  void FromHead(const wire::Message& m) {
    auto env = head.boxes.Seal(serve.tab_key, wire::Encode(m));
    ASSERT_TRUE(env.ok());
    ASSERT_TRUE(tab->Receive(serve.Down(wire::Message(*env))).ok());
  }
  void Link() {
    ASSERT_TRUE(tab->Receive(serve.First()).ok());
    auto out = tab->TakeOutgoing();
    ASSERT_EQ(out.size(), 1u);
    ASSERT_TRUE(tab->Receive(serve.Proof(out[0])).ok());
    auto up = Up();
    ASSERT_EQ(up.size(), 1u);
    const auto& join = std::get<wire::Join>(up[0]);
    EXPECT_EQ(join.room, "r");
    EXPECT_EQ(join.address, "relay://" + serve.tab_id);
    EXPECT_EQ(join.hello.capabilities, wire::kCapCompute | wire::kCapRelayed);
    EXPECT_EQ(join.hello.probe_hash, kernels::ProbeHash());
    wire::Hello hh;
    hh.device_id = head.id;
    hh.name = "head";
    hh.capabilities = wire::kCapHead;
    wire::Peers peers{"r", {{head.address, hh, head.keys.public_key}, {join.address, join.hello, serve.tab_key}}};
    ASSERT_TRUE(tab->Receive(serve.Down(wire::Message(peers))).ok());
    EXPECT_TRUE(tab->in_room());
  }
};

// stories260K split in two: the head `h` first, the tab second.
wire::Assignment Assignment(const FakeHead& h, const std::string& tab_id) {
  auto src = OpenLocalFolder(Stories());
  EXPECT_TRUE(src.ok());
  auto info = LoadModelInfo(**src);
  EXPECT_TRUE(info.ok());
  const int n = info->spec.n_layers, split = n / 2;
  wire::Assignment a;
  a.turn = 7;
  a.model_id = Stories();
  a.revision = "local";
  a.spec_hash = SpecHash(info->spec);
  a.model_hash = ModelHashOf(**src, info->index);
  a.ctx = 64;
  a.stages = {{h.id, h.address, 0, split}, {tab_id, "relay://" + tab_id, split, n}};
  a.your_stage = 1;
  a.cache_key = 1;
  return a;
}

TEST_F(TabRing, JoinsHoldsLayersAndRunsAHopBitForBit) {
  Link();
  auto src = OpenLocalFolder(Stories());
  ASSERT_TRUE(src.ok());
  auto info = LoadModelInfo(**src);
  ASSERT_TRUE(info.ok());
  const int n = info->spec.n_layers, split = n / 2;
  ASSERT_GE(n, 2);
  const wire::Assignment a = Assignment(head, serve.tab_id);
  FromHead(wire::Message(a));
  EXPECT_EQ(opened, 1);
  auto to_head = ToHead();
  bool ready = false;
  for (auto& m : to_head)
    if (auto* r = std::get_if<wire::Ready>(&m)) ready = r->stage == 1 && r->bytes_held > 0;
  ASSERT_TRUE(ready);
  EXPECT_EQ(tab->stage().first_layer(), split);

  // The head's half on this side, the tab's half there; the whole model alone for the truth.
  auto whole = StageWeights::Load(**src, *info, 0, n, true);
  ASSERT_TRUE(whole.ok());
  const std::vector<int32_t> ids{1, 403, 407, 261, 378};
  auto h = Embed(*whole, ids, 0);
  ASSERT_TRUE(h.ok());
  HiddenStates truth = *h;
  KvCache kv_all(info->spec, 0, n, 64), kv_head(info->spec, 0, split, 64);
  ASSERT_TRUE(RunLayers(*whole, 0, n, truth, kv_all).ok());
  ASSERT_TRUE(RunLayers(*whole, 0, split, *h, kv_head).ok());
  auto hop = EncodeHop(PlanFromWire(a.stages), 0, 7, a.model_hash, *h);
  ASSERT_TRUE(hop.ok());
  EXPECT_EQ(hop->address, "relay://" + serve.tab_id);
  FromHead(wire::Message(hop->activation));
  bool returned = false;
  for (auto& m : ToHead()) {
    auto* act = std::get_if<wire::Activation>(&m);
    if (!act) continue;
    EXPECT_EQ(act->next, wire::kNextReturn);
    ASSERT_EQ(act->values.size(), truth.values.size());
    EXPECT_EQ(0, std::memcmp(act->values.data(), truth.values.data(), truth.values.size() * sizeof(float)));
    returned = true;
  }
  EXPECT_TRUE(returned);
  EXPECT_EQ(tab->stage().hops(), 1);

  // The page's events: the hello with the probe, the slice held.
  bool probe = false, slice = false;
  for (const auto& e : tab->TakeEvents()) {
    auto j = nlohmann::json::parse(e);
    if (j["event"] == "hello") probe = j["probe_hash"].get<std::string>().size() == 16;
    if (j["event"] == "slice") slice = j["first"] == split && j["end"] == n;
  }
  EXPECT_TRUE(probe);
  EXPECT_TRUE(slice);
}

TEST_F(TabRing, DropsWhatNoOneMaySendAndRefusesAReplayedLink) {
  Link();
  // An assignment from a key the room does not list as its stage 0 is dropped unopened.
  FakeHead stranger;
  const wire::Assignment a = Assignment(stranger, serve.tab_id);
  auto env = head.boxes.Seal(serve.tab_key, wire::Encode(wire::Message(a)));
  ASSERT_TRUE(env.ok());
  const Bytes message = serve.Down(wire::Message(*env));
  ASSERT_TRUE(tab->Receive(message).ok());
  EXPECT_EQ(opened, 0);
  EXPECT_TRUE(ToHead().empty());
  EXPECT_FALSE(tab->stage().holds_layers());
  bool logged = false;
  for (const auto& e : tab->TakeEvents()) logged = logged || e.find("it has no business sending") != std::string::npos;
  EXPECT_TRUE(logged);
  // The same link message again: the link refuses it (the page closes the link).
  EXPECT_EQ(tab->Receive(message).code(), ErrorCode::kPermissionDenied);
}

// The screen turns off: a bye up the link, the link kept; what arrives meanwhile is dropped
// (no error: the page would close the link). Shown again: a join over the same link, and the
// slice held is kept (the same assignment opens no model again).
TEST_F(TabRing, LeavesByByeKeepsTheLinkAndRejoinsWithItsSlice) {
  Link();
  const wire::Assignment a = Assignment(head, serve.tab_id);
  FromHead(wire::Message(a));
  ASSERT_TRUE(tab->stage().holds_layers());
  ToHead();
  EXPECT_EQ(opened, 1);

  tab->Leave();
  auto up = Up();
  ASSERT_EQ(up.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<wire::Bye>(up[0]));
  EXPECT_EQ(std::get<wire::Bye>(up[0]).device_id, serve.tab_id);
  EXPECT_FALSE(tab->in_room());
  EXPECT_TRUE(tab->linked());
  wire::Hello hh;
  hh.device_id = head.id;
  hh.name = "head";
  hh.capabilities = wire::kCapHead;
  const wire::Peers heads_only{"r", {{head.address, hh, head.keys.public_key}}};
  ASSERT_TRUE(tab->Receive(serve.Down(wire::Message(heads_only))).ok());
  tab->Tick();
  EXPECT_TRUE(tab->TakeOutgoing().empty());  // no join while away, whatever arrives

  tab->Rejoin();
  up = Up();
  ASSERT_EQ(up.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<wire::Join>(up[0]));
  const auto& join = std::get<wire::Join>(up[0]);
  EXPECT_EQ(join.address, "relay://" + serve.tab_id);
  const wire::Peers both{"r", {{head.address, hh, head.keys.public_key}, {join.address, join.hello, serve.tab_key}}};
  ASSERT_TRUE(tab->Receive(serve.Down(wire::Message(both))).ok());
  EXPECT_TRUE(tab->in_room());
  wire::Assignment again = a;
  again.turn = 8;
  FromHead(wire::Message(again));
  bool ready = false;
  for (auto& m : ToHead())
    if (auto* r = std::get_if<wire::Ready>(&m)) ready = r->stage == 1 && r->bytes_held > 0;
  EXPECT_TRUE(ready);
  EXPECT_EQ(opened, 1);  // the slice was kept: nothing opened or fetched again
}

}  // namespace
}  // namespace daisy::tab
