#include "daisy/net.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "flipping_proxy.h"

namespace daisy::net {
namespace {

namespace fs = std::filesystem;

wire::Hello HelloFor(const std::string& id) {
  return wire::Hello{wire::kProtocolVersion,  wire::kCapCompute, 100.0, 42, 1u << 30, "scalar", id,
                     "dev-" + id.substr(0, 4)};
}

// Receives until a frame decodes to T or the deadline passes.
template <typename T>
std::optional<T> Await(Endpoint& ep, int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    auto f = ep.Receive(50);
    if (!f.ok() || !f->has_value()) continue;
    auto m = wire::Decode(**f);
    if (m.ok() && std::holds_alternative<T>(*m)) return std::get<T>(*m);
  }
  return std::nullopt;
}

// Anything at all within `ms`?
bool ReceivesAnything(Endpoint& ep, int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    auto f = ep.Receive(50);
    if (f.ok() && f->has_value()) return true;
  }
  return false;
}

// Two endpoints that know each other's keys: a may send to b.
struct Pair {
  std::unique_ptr<Endpoint> a, b;
};
Pair Linked() {
  Pair p{Endpoint::Bind("127.0.0.1", 0).value(), Endpoint::Bind("127.0.0.1", 0).value()};
  p.a->SetPeerKey(p.b->address(), p.b->public_key());
  p.b->Allow(p.a->public_key());
  return p;
}

// A device of a rendezvous test: its endpoint knows the rendezvous and says hello under the
// id its key gives.
struct Device {
  std::unique_ptr<Endpoint> ep;
  std::string id;
  explicit Device(const Rendezvous& rv) : ep(Endpoint::Bind("127.0.0.1", 0).value()), id(KeyId(ep->public_key())) {
    ep->SetPeerKey(rv.address(), rv.public_key());
    ep->Allow(rv.public_key());
  }
  Status Join(const Rendezvous& rv, const std::string& room, int timeout_ms = 1000) {
    return ep->Send(rv.address(), wire::Message(wire::Join{room, ep->address(), HelloFor(id)}), timeout_ms);
  }
};

// The end-to-end box of relayed frames: only the recipient opens it, only from the key that
// sealed it, each counter once and in order, and any changed byte refuses it.
TEST(PeerBoxes, OnlyTheRecipientOpensABoxFromItsSenderOnceAndUnchanged) {
  const KeyPair a = NewKeyPair(), b = NewKeyPair(), c = NewKeyPair();
  PeerBoxes sa(a), sb(b), sc(c);
  const std::vector<uint8_t> frame = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
  auto env = sa.Seal(b.public_key, frame);
  ASSERT_TRUE(env.ok()) << env.status().message();
  EXPECT_EQ(env->from, KeyId(a.public_key));
  EXPECT_EQ(env->to, KeyId(b.public_key));
  EXPECT_EQ(env->box.size(), frame.size() + wire::kBoxMacBytes);
  // The plaintext is nowhere in the box.
  EXPECT_EQ(std::search(env->box.begin(), env->box.end(), frame.begin(), frame.begin() + 8), env->box.end());
  // Another member cannot open it, and the recipient refuses it as coming from another key.
  EXPECT_FALSE(sc.Open(a.public_key, *env).ok());
  EXPECT_FALSE(sb.Open(c.public_key, *env).ok());
  // Any changed byte of the box, or a changed counter (the nonce), is refused.
  for (size_t i = 0; i < env->box.size(); ++i) {
    wire::Relay bad = *env;
    bad.box[i] ^= 0x01;
    EXPECT_FALSE(sb.Open(a.public_key, bad).ok()) << "byte " << i;
  }
  wire::Relay moved = *env;
  moved.counter += 1;
  EXPECT_FALSE(sb.Open(a.public_key, moved).ok());
  auto opened = sb.Open(a.public_key, *env);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  EXPECT_EQ(*opened, frame);
  // A replay of the same envelope is refused; an older one delivered late (it came by
  // another connection) opens, once; one further back than the window is refused.
  auto second = sa.Seal(b.public_key, frame);
  ASSERT_TRUE(second.ok());
  auto third = sa.Seal(b.public_key, frame);
  ASSERT_TRUE(third.ok());
  EXPECT_GT(second->counter, env->counter);
  EXPECT_NE(second->box, env->box) << "a new nonce per box";
  const Status replay = sb.Open(a.public_key, *env).status();
  EXPECT_NE(replay.message().find("already opened: a replay"), std::string::npos) << replay.message();
  ASSERT_TRUE(sb.Open(a.public_key, *third).ok());
  EXPECT_TRUE(sb.Open(a.public_key, *second).ok()) << "a late envelope within the window";
  EXPECT_FALSE(sb.Open(a.public_key, *second).ok()) << "the late one again";
  EXPECT_FALSE(sb.Open(a.public_key, *third).ok()) << "the highest again";
  std::vector<wire::Relay> later;
  for (uint64_t i = 0; i <= kReplayWindow; ++i) later.push_back(*sa.Seal(b.public_key, frame));
  ASSERT_TRUE(sb.Open(a.public_key, later.back()).ok());
  const Status old = sb.Open(a.public_key, later.front()).status();
  EXPECT_NE(old.message().find("too old to tell from a replay"), std::string::npos) << old.message();
  EXPECT_TRUE(sb.Open(a.public_key, later[1]).ok()) << "the oldest inside the window";
  // The other direction under the same pair key opens too (its own nonces).
  auto back = sb.Seal(a.public_key, frame);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(sa.Open(b.public_key, *back).ok());
}

TEST(JoinAddress, AcceptsHostPortAndRefusesTheRest) {
  EXPECT_EQ(*JoinAddress("127.0.0.1:8788"), "tcp://127.0.0.1:8788");
  EXPECT_EQ(*JoinAddress("my-laptop.local:1"), "tcp://my-laptop.local:1");
  for (const char* bad : {"8788", ":8788", "host:", "host:0", "host:99999", "ho st:1", "tcp://h:1", "h:1/x"})
    EXPECT_FALSE(JoinAddress(bad).ok()) << bad;
}

TEST(Keys, FingerprintsAreShortStableAndDistinct) {
  const KeyPair a = NewKeyPair(), b = NewKeyPair();
  EXPECT_TRUE(IsPublicKey(a.public_key));
  EXPECT_FALSE(IsPublicKey("not a key"));
  const std::string f = Fingerprint(a.public_key);
  ASSERT_EQ(f.size(), 19u);
  EXPECT_EQ(f[4], '-');
  EXPECT_EQ(f, Fingerprint(a.public_key));
  EXPECT_NE(f, Fingerprint(b.public_key));
  std::string hex = f;
  std::erase(hex, '-');
  EXPECT_EQ(KeyId(a.public_key), hex);
  EXPECT_EQ(*NormalizeFingerprint(" AB12-cd34 "), "ab12cd34");
  EXPECT_FALSE(NormalizeFingerprint("xyz").ok());
  EXPECT_FALSE(NormalizeFingerprint("").ok());
  EXPECT_EQ(Fingerprint("garbage"), "");
}

TEST(Keys, TheKeyFileIsMadeWithMode0600ReusedAndRefusedWhenOthersCanReadIt) {
  char tmpl[] = "/tmp/daisy_keys_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path file = fs::path(tmpl) / "keys" / "node.key";
  auto k1 = LoadOrCreateKeyPair(file.string());
  ASSERT_TRUE(k1.ok()) << k1.status().message();
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto k2 = LoadOrCreateKeyPair(file.string());
  ASSERT_TRUE(k2.ok());
  EXPECT_EQ(k1->public_key, k2->public_key);
  EXPECT_EQ(k1->secret_key, k2->secret_key);
  // Readable by the group: refused, naming the file, and never replaced.
  ::chmod(file.c_str(), 0640);
  auto k3 = LoadOrCreateKeyPair(file.string());
  ASSERT_FALSE(k3.ok());
  EXPECT_NE(k3.status().message().find(file.string()), std::string::npos) << k3.status().message();
  EXPECT_NE(k3.status().message().find("640"), std::string::npos) << k3.status().message();
  ::chmod(file.c_str(), 0600);
  EXPECT_EQ(LoadOrCreateKeyPair(file.string())->public_key, k1->public_key);
  // A secret that does not belong to the public key: refused.
  const fs::path bad = fs::path(tmpl) / "bad.key";
  {
    std::ofstream out(bad);
    out << "public " << k1->public_key << "\nsecret " << NewKeyPair().secret_key << "\n";
  }
  ::chmod(bad.c_str(), 0600);
  EXPECT_FALSE(LoadOrCreateKeyPair(bad.string()).ok());
  std::error_code ec;
  fs::remove_all(tmpl, ec);
}

TEST(Endpoint, FramesTravelDirectlyBetweenTwoEndpoints) {
  Pair p = Linked();
  ASSERT_TRUE(p.a->Send(p.b->address(), wire::Message(wire::Token{1, 2, 3})).ok());
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  std::optional<Endpoint::Frame> got;
  while (!got && std::chrono::steady_clock::now() < end) {
    auto f = p.b->ReceiveFrame(50);
    ASSERT_TRUE(f.ok());
    if (f->has_value()) got = std::move(**f);
  }
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->sender_key, p.a->public_key());  // the key the sender proved
  auto m = wire::Decode(got->bytes);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(std::get<wire::Token>(*m).token_id, 3);
}

TEST(Endpoint, SendingToAnAddressWithoutAKnownKeyIsRefused) {
  auto a = Endpoint::Bind("127.0.0.1", 0);
  auto b = Endpoint::Bind("127.0.0.1", 0);
  b.value()->Allow(a.value()->public_key());
  Status st = (*a)->Send((*b)->address(), wire::Message(wire::Token{1, 2, 3}), 300);
  EXPECT_EQ(st.code(), ErrorCode::kFailedPrecondition) << st.message();
  EXPECT_FALSE(ReceivesAnything(**b, 300));
}

TEST(Endpoint, SendingToNobodyFailsQuicklyInsteadOfHanging) {
  auto a = Endpoint::Bind("127.0.0.1", 0);
  ASSERT_TRUE(a.ok());
  (*a)->SetPeerKey("tcp://127.0.0.1:1", NewKeyPair().public_key);
  const auto start = std::chrono::steady_clock::now();
  Status st = (*a)->Send("tcp://127.0.0.1:1", wire::Message(wire::Bye{"x"}), 300);
  EXPECT_EQ(st.code(), ErrorCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST(Endpoint, OversizedFramesAreDroppedBeforeAllocation) {
  Pair p = Linked();
  std::vector<uint8_t> huge(wire::kMaxFrameBytes + 1, 0);
  (void)p.a->Send(p.b->address(), huge, 1000);
  // The oversized frame kills that connection; a fresh sender still gets through, and
  // nothing over the cap ever comes out of the inbox.
  auto c = Endpoint::Bind("127.0.0.1", 0);
  (*c)->SetPeerKey(p.b->address(), p.b->public_key());
  p.b->Allow((*c)->public_key());
  // b's I/O thread may still be reading the 256 MiB when c's handshake arrives (a CI run took
  // over 3 s there), so c waits as long as the loop below does.
  const Status sent = (*c)->Send(p.b->address(), wire::Message(wire::Token{1, 1, 7}), 120000);
  ASSERT_TRUE(sent.ok()) << sent.message();
  // Read until both have happened: the token came, and the sender of the huge frame saw its
  // connection dropped (after that the frame cannot arrive). Encrypting 256 MiB takes a
  // while on a loaded machine, so no fixed wait: events, under a generous bound.
  bool got_token = false, dropped = false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!(got_token && dropped) && std::chrono::steady_clock::now() < end) {
    for (const auto& addr : p.a->TakeDropped()) dropped = dropped || addr == p.b->address();
    auto f = p.b->Receive(50);
    ASSERT_TRUE(f.ok());
    if (!f->has_value()) continue;
    ASSERT_LE((*f)->size(), wire::kMaxFrameBytes) << "an oversized frame reached the inbox";
    auto m = wire::Decode(**f);
    if (m.ok() && std::holds_alternative<wire::Token>(*m)) got_token = std::get<wire::Token>(*m).token_id == 7;
  }
  EXPECT_TRUE(dropped) << "the receiver never dropped the connection that carried the oversized frame";
  EXPECT_TRUE(got_token);
}

// A raw ZeroMQ PUSH: with a fresh CURVE key pair (a device nobody approved) or with no
// encryption at all.
struct RawPush {
  void* socket;
  RawPush(void* ctx, const std::string& to, const std::string& server_key, bool curve) {
    socket = zmq_socket(ctx, ZMQ_PUSH);
    int linger = 0;
    zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof linger);
    if (curve) {
      const KeyPair k = NewKeyPair();
      zmq_setsockopt(socket, ZMQ_CURVE_SERVERKEY, server_key.c_str(), 40);
      zmq_setsockopt(socket, ZMQ_CURVE_PUBLICKEY, k.public_key.c_str(), 40);
      zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, k.secret_key.c_str(), 40);
    }
    zmq_connect(socket, to.c_str());
  }
  void Send(const std::vector<uint8_t>& frame) { zmq_send(socket, frame.data(), frame.size(), ZMQ_DONTWAIT); }
  ~RawPush() { zmq_close(socket); }
};

TEST(Curve, ADeviceWithAnUnknownKeyCannotReachAStageOrTheRendezvous) {
  void* ctx = zmq_ctx_new();
  // A stage that admits one key.
  Pair p = Linked();
  // The rendezvous, with one approved member in room r.
  RendezvousOptions o;
  o.port = 0;
  auto rv = Rendezvous::Start(o);
  ASSERT_TRUE(rv.ok());
  Device member(**rv);
  (*rv)->Admit("r", member.ep->public_key(), "member");
  ASSERT_TRUE(member.Join(**rv, "r").ok());
  ASSERT_TRUE(Await<wire::Peers>(*member.ep, 2000).has_value());
  {
    RawPush stranger(ctx, p.b->address(), p.b->public_key(), /*curve=*/true);
    RawPush plaintext(ctx, p.b->address(), "", /*curve=*/false);
    RawPush stranger_rv(ctx, (*rv)->address(), (*rv)->public_key(), /*curve=*/true);
    RawPush plaintext_rv(ctx, (*rv)->address(), "", /*curve=*/false);
    const auto token = wire::Encode(wire::Message(wire::Token{1, 2, 3}));
    const auto join = wire::Encode(wire::Message(wire::Join{"r", "tcp://127.0.0.1:9", HelloFor("0123456789abcdef")}));
    for (int i = 0; i < 10; ++i) {
      stranger.Send(token);
      plaintext.Send(token);
      stranger_rv.Send(join);
      plaintext_rv.Send(join);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_FALSE(ReceivesAnything(*p.b, 1000)) << "a frame from an unknown key reached the stage";
    EXPECT_EQ((*rv)->Members().size(), 1u) << "a device with an unknown key joined";
  }
  // The approved sender still gets through (the refusals were for the strangers only).
  ASSERT_TRUE(p.a->Send(p.b->address(), wire::Message(wire::Token{1, 2, 4})).ok());
  EXPECT_TRUE(Await<wire::Token>(*p.b, 2000).has_value());
  // An Endpoint whose key the stage does not admit: its send never connects.
  auto outsider = Endpoint::Bind("127.0.0.1", 0);
  (*outsider)->SetPeerKey(p.b->address(), p.b->public_key());
  EXPECT_EQ((*outsider)->Send(p.b->address(), wire::Message(wire::Token{1, 2, 5}), 500).code(),
            ErrorCode::kUnavailable);
  EXPECT_FALSE(ReceivesAnything(*p.b, 500));
  rv->reset();
  zmq_ctx_term(ctx);
}

TEST(Curve, AKeyTakenOffTheListIsNotHeardAnyMore) {
  Pair p = Linked();
  ASSERT_TRUE(p.a->Send(p.b->address(), wire::Message(wire::Token{1, 2, 3})).ok());
  ASSERT_TRUE(Await<wire::Token>(*p.b, 2000).has_value());
  p.b->SetAllowed({});  // the connection stays up, its frames stop at the inbox
  (void)p.a->Send(p.b->address(), wire::Message(wire::Token{1, 2, 4}), 500);
  EXPECT_FALSE(ReceivesAnything(*p.b, 700));
}

TEST(Curve, AFrameTamperedWithInFlightIsNeverDeliveredAndTheLinkIsReportedBroken) {
  Pair p = Linked();
  const int b_port = std::stoi(p.b->address().substr(p.b->address().rfind(':') + 1));
  // Past the greeting and the handshake: the flip lands in the first big frame.
  test::FlippingProxy proxy(b_port, 3000);
  const std::string via = "tcp://127.0.0.1:" + std::to_string(proxy.port());
  p.a->SetPeerKey(via, p.b->public_key());
  wire::Activation act;
  act.seq = 1;
  act.next = 1;
  act.values.assign(2048, 0.5f);
  act.act_hash = wire::ActHash(act.values);
  ASSERT_TRUE(p.a->Send(via, wire::Message(act)).ok());
  EXPECT_FALSE(ReceivesAnything(*p.b, 1500)) << "a tampered frame was delivered";
  EXPECT_EQ(proxy.flipped(), 1);
  std::vector<std::string> dropped;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (dropped.empty() && std::chrono::steady_clock::now() < end) {
    dropped = p.a->TakeDropped();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(dropped.empty()) << "the sender was not told that the link broke";
  EXPECT_EQ(dropped[0], via);
  // The link comes back (ZeroMQ reconnects) and an untouched frame gets through.
  ASSERT_TRUE(p.a->Send(via, wire::Message(wire::Token{1, 2, 9})).ok());
  auto t = Await<wire::Token>(*p.b, 3000);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->token_id, 9);
}

TEST(Rendezvous, ApprovedMembersOfARoomLearnEachOtherAndTheDeadAreDropped) {
  RendezvousOptions o;
  o.port = 0;
  o.auto_approve = true;
  o.dead_after_s = 1.0;
  auto rv = Rendezvous::Start(o);
  ASSERT_TRUE(rv.ok()) << rv.status().message();
  Device a(**rv), b(**rv), other(**rv);
  for (auto* d : {&a, &b}) ASSERT_TRUE((*rv)->RequestJoin({"r1", d->ep->public_key(), "d", "127.0.0.1"})->approved);
  ASSERT_TRUE((*rv)->RequestJoin({"r2", other.ep->public_key(), "d", "127.0.0.1"})->approved);
  ASSERT_TRUE(a.Join(**rv, "r1").ok());
  ASSERT_TRUE(b.Join(**rv, "r1").ok());
  ASSERT_TRUE(other.Join(**rv, "r2").ok());
  std::optional<wire::Peers> peers;
  for (int i = 0; i < 5 && (!peers || peers->peers.size() < 2); ++i) peers = Await<wire::Peers>(*a.ep, 1000);
  ASSERT_TRUE(peers.has_value());
  ASSERT_EQ(peers->peers.size(), 2u);  // room r2 is not visible
  EXPECT_EQ(peers->room, "r1");
  for (const auto& p : peers->peers) EXPECT_EQ(KeyId(p.public_key), p.hello.device_id);  // each with its key
  // b stops sending heartbeats; a keeps going and learns that b is gone.
  std::optional<wire::Peers> after;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < end) {
    (void)a.ep->Send((*rv)->address(), wire::Message(wire::Heartbeat{0, a.id}));
    auto p = Await<wire::Peers>(*a.ep, 300);
    if (p && p->peers.size() == 1) {
      after = p;
      break;
    }
  }
  ASSERT_TRUE(after.has_value()) << "b was never dropped";
  EXPECT_EQ(after->peers[0].hello.device_id, a.id);
}

TEST(Rendezvous, APendingDeviceReceivesNothingUntilTheHostApproves) {
  RendezvousOptions o;
  o.port = 0;
  auto rv = Rendezvous::Start(o);
  ASSERT_TRUE(rv.ok());
  Device a(**rv);
  auto asked = (*rv)->RequestJoin({"r", a.ep->public_key(), "laptop", "10.0.0.7"});
  ASSERT_TRUE(asked.ok());
  EXPECT_FALSE(asked->approved);
  EXPECT_EQ(asked->fingerprint, Fingerprint(a.ep->public_key()));
  ASSERT_EQ((*rv)->Pending().size(), 1u);
  EXPECT_EQ((*rv)->Pending()[0].name, "laptop");
  // Pending: its ZeroMQ connection is refused, so its join never arrives and nothing comes back.
  EXPECT_FALSE(a.Join(**rv, "r", 700).ok());
  EXPECT_FALSE(Await<wire::Peers>(*a.ep, 700).has_value());
  EXPECT_TRUE((*rv)->Members().empty());
  std::string wrong = KeyId(a.ep->public_key()).substr(0, 4);
  wrong[0] = wrong[0] == '0' ? '1' : '0';
  EXPECT_EQ((*rv)->Approve(wrong).code(), ErrorCode::kNotFound);
  EXPECT_TRUE((*rv)->Members().empty());
  // The host approves it by (a prefix of) the fingerprint it saw.
  ASSERT_TRUE((*rv)->Approve(Fingerprint(a.ep->public_key()).substr(0, 9)).ok());
  EXPECT_TRUE((*rv)->Pending().empty());
  EXPECT_TRUE((*rv)->RequestJoin({"r", a.ep->public_key(), "laptop", "10.0.0.7"})->approved);
  std::optional<wire::Peers> p;
  for (int i = 0; i < 5 && !p; ++i) {
    (void)a.Join(**rv, "r");
    p = Await<wire::Peers>(*a.ep, 1000);
  }
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->peers.size(), 1u);
}

TEST(Rendezvous, ADeviceApprovedInAnotherRoomIsRefusedInThisOne) {
  RendezvousOptions o;
  o.port = 0;
  auto rv = Rendezvous::Start(o);
  ASSERT_TRUE(rv.ok());
  Device member_b(**rv), intruder(**rv);
  (*rv)->Admit("room-b", member_b.ep->public_key(), "b");
  (*rv)->Admit("room-a", intruder.ep->public_key(), "a");
  ASSERT_TRUE(member_b.Join(**rv, "room-b").ok());
  auto peers = Await<wire::Peers>(*member_b.ep, 2000);
  ASSERT_TRUE(peers.has_value());
  ApplyPeerList(*member_b.ep, (*rv)->public_key(), *peers);
  // Its connection to the rendezvous is admitted (it is approved somewhere), but a join to
  // room-b is ignored: nothing comes back and room-b does not list it.
  ASSERT_TRUE(intruder.Join(**rv, "room-b").ok());
  EXPECT_FALSE(Await<wire::Peers>(*intruder.ep, 1000).has_value());
  for (const auto& m : (*rv)->Members()) EXPECT_NE(m.hello.device_id, intruder.id);
  // Nor does it reach room-b's member directly: that inbox admits room-b's keys only.
  intruder.ep->SetPeerKey(member_b.ep->address(), member_b.ep->public_key());
  EXPECT_FALSE(intruder.ep->Send(member_b.ep->address(), wire::Message(wire::Token{1, 1, 1}), 500).ok());
  EXPECT_FALSE(ReceivesAnything(*member_b.ep, 500));
  // A join claiming another device's id is ignored too.
  Device liar(**rv);
  (*rv)->Admit("room-b", liar.ep->public_key(), "liar");
  ASSERT_TRUE(
      liar.ep->Send((*rv)->address(), wire::Message(wire::Join{"room-b", liar.ep->address(), HelloFor(member_b.id)}))
          .ok());
  EXPECT_FALSE(Await<wire::Peers>(*liar.ep, 700).has_value());
}

TEST(Rendezvous, JoinRequestsAreLimitedPerSourceAndInNumber) {
  RendezvousOptions o;
  o.port = 0;
  o.join_burst = 4;
  o.join_per_s = 0.01;
  o.max_pending = 6;
  auto rv = Rendezvous::Start(o);
  ASSERT_TRUE(rv.ok());
  std::vector<std::string> keys;
  for (int i = 0; i < 4; ++i) {
    keys.push_back(NewKeyPair().public_key);
    ASSERT_TRUE((*rv)->RequestJoin({"r", keys.back(), "flood", "10.0.0.1"}).ok());
  }
  // The fifth new key from that source is refused; asking again with a known key is not a
  // new request.
  auto fifth = (*rv)->RequestJoin({"r", NewKeyPair().public_key, "flood", "10.0.0.1"});
  EXPECT_EQ(fifth.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE((*rv)->RequestJoin({"r", keys[0], "flood", "10.0.0.1"}).ok());
  // Another source still gets in, until the pending cap.
  EXPECT_TRUE((*rv)->RequestJoin({"r", NewKeyPair().public_key, "x", "10.0.0.2"}).ok());
  EXPECT_TRUE((*rv)->RequestJoin({"r", NewKeyPair().public_key, "x", "10.0.0.2"}).ok());
  EXPECT_EQ((*rv)->RequestJoin({"r", NewKeyPair().public_key, "x", "10.0.0.3"}).status().code(),
            ErrorCode::kResourceExhausted);
  EXPECT_EQ((*rv)->Pending().size(), 6u);
  // Malformed requests: refused by name.
  EXPECT_EQ((*rv)->RequestJoin({"r", "short", "x", "10.0.0.4"}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ((*rv)->RequestJoin({"", NewKeyPair().public_key, "x", "10.0.0.4"}).status().code(),
            ErrorCode::kInvalidArgument);
}

TEST(Rendezvous, PreApprovedFingerprintsAreAdmittedWhenTheyAsk) {
  RendezvousOptions o;
  o.port = 0;
  auto rv = Rendezvous::Start(o);
  ASSERT_TRUE(rv.ok());
  const KeyPair known = NewKeyPair();
  EXPECT_FALSE((*rv)->PreApprove("r", "ab12").ok());  // a whole fingerprint only
  ASSERT_TRUE((*rv)->PreApprove("r", Fingerprint(known.public_key)).ok());
  EXPECT_TRUE((*rv)->RequestJoin({"r", known.public_key, "k", ""})->approved);
  EXPECT_FALSE((*rv)->RequestJoin({"other-room", known.public_key, "k", ""})->approved);
  EXPECT_FALSE((*rv)->RequestJoin({"r", NewKeyPair().public_key, "u", ""})->approved);
}

// ---- liveness from a thread of its own (Pulse), and links to members that left ----

bool IsMember(const Rendezvous& rv, const std::string& id) {
  for (const auto& m : rv.Members())
    if (m.hello.device_id == id) return true;
  return false;
}

// A member whose own thread is busy (a long load, a long prefill) stays in the room: the
// pulse beats for it. The same member without a pulse is dropped.
TEST(Pulse, KeepsAMemberWhoseThreadIsBusyInTheRoom) {
  RendezvousOptions o;
  o.port = 0;
  o.auto_approve = true;
  o.dead_after_s = 1.0;
  auto rv = Rendezvous::Start(o);
  ASSERT_TRUE(rv.ok()) << rv.status().message();
  const KeyPair ka = NewKeyPair(), kb = NewKeyPair();
  auto a = Endpoint::Bind("127.0.0.1", 0, ka).value();
  auto b = Endpoint::Bind("127.0.0.1", 0, kb).value();
  for (auto* ep : {a.get(), b.get()}) {
    ASSERT_TRUE((*rv)->RequestJoin({"r", ep->public_key(), "d", "127.0.0.1"})->approved);
    ep->SetPeerKey((*rv)->address(), (*rv)->public_key());
    ep->Allow((*rv)->public_key());
  }
  const std::string ida = KeyId(ka.public_key), idb = KeyId(kb.public_key);
  PulseOptions po;
  po.rendezvous = (*rv)->address();
  po.server_key = (*rv)->public_key();
  po.keys = ka;
  po.device_id = ida;
  po.interval_s = 0.2;
  po.join_frame = wire::Encode(wire::Message(wire::Join{"r", a->address(), HelloFor(ida)}));
  auto pulse = Pulse::Start(po);
  ASSERT_TRUE(pulse.ok()) << pulse.status().message();
  ASSERT_TRUE(b->Send((*rv)->address(), wire::Message(wire::Join{"r", b->address(), HelloFor(idb)})).ok());
  for (int i = 0; i < 100 && !(IsMember(**rv, ida) && IsMember(**rv, idb)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(IsMember(**rv, ida)) << "the pulse's join did not get a in";
  ASSERT_TRUE(IsMember(**rv, idb));
  // Both devices' own threads are busy for 3 s (three times the dead-member timeout).
  std::this_thread::sleep_for(std::chrono::seconds(3));
  EXPECT_TRUE(IsMember(**rv, ida)) << "a member with a pulse was dropped while busy";
  EXPECT_FALSE(IsMember(**rv, idb)) << "a member without heartbeats was kept";
  EXPECT_LT((*pulse)->SilentFor(), 1.0);
}

// The pulse tells its owner when the rendezvous stops taking heartbeats (gone, or restarted
// and no longer admitting this key), so a member knows to ask for admission again.
TEST(Pulse, SaysHowLongTheRendezvousHasNotTakenAHeartbeat) {
  RendezvousOptions o;
  o.port = 0;
  o.auto_approve = true;
  auto rv = Rendezvous::Start(o);
  ASSERT_TRUE(rv.ok());
  const KeyPair k = NewKeyPair();
  ASSERT_TRUE((*rv)->RequestJoin({"r", k.public_key, "d", "127.0.0.1"})->approved);
  PulseOptions po;
  po.rendezvous = (*rv)->address();
  po.server_key = (*rv)->public_key();
  po.keys = k;
  po.device_id = KeyId(k.public_key);
  po.interval_s = 0.2;
  auto pulse = Pulse::Start(po);
  ASSERT_TRUE(pulse.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  EXPECT_LT((*pulse)->SilentFor(), 0.5);
  rv->reset();  // the rendezvous goes away
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_GT((*pulse)->SilentFor(), 1.5);
}

// A device closes its links to members that left the room: no socket keeps reconnecting to
// a departed head (each left one eventfd and a reconnect loop behind).
TEST(Endpoint, LinksToMembersThatLeftTheRoomAreClosed) {
  auto a = Endpoint::Bind("127.0.0.1", 0).value();
  auto b = Endpoint::Bind("127.0.0.1", 0).value();
  auto c = Endpoint::Bind("127.0.0.1", 0).value();
  const KeyPair rv = NewKeyPair();
  auto peer = [](const Endpoint& ep) {
    return wire::Peer{ep.address(), HelloFor(KeyId(ep.public_key())), ep.public_key()};
  };
  wire::Peers both{"r", {peer(*b), peer(*c)}};
  ApplyPeerList(*a, rv.public_key, both);
  b->Allow(a->public_key());
  c->Allow(a->public_key());
  ASSERT_TRUE(a->Send(b->address(), wire::Message(wire::Bye{"x"})).ok());
  ASSERT_TRUE(a->Send(c->address(), wire::Message(wire::Bye{"x"})).ok());
  EXPECT_EQ(a->outboxes(), 2);
  wire::Peers only_b{"r", {peer(*b)}};
  ApplyPeerList(*a, rv.public_key, only_b);
  EXPECT_EQ(a->outboxes(), 1) << "the link to the member that left is still open";
  EXPECT_FALSE(a->Send(c->address(), wire::Message(wire::Bye{"x"}), 200).ok()) << "its key is forgotten too";
  EXPECT_TRUE(a->Send(b->address(), wire::Message(wire::Bye{"x"})).ok());
}

}  // namespace
}  // namespace daisy::net
