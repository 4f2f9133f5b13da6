// A ring member in this process (RunNode on a thread) driven by a hand-written head over
// real sockets on 127.0.0.1: assignment, ready, hops, and the hops it must refuse.
#include "daisy/node.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

#include "daisy/forward.h"
#include "daisy/memory.h"
#include "daisy/model.h"
#include "daisy/net.h"
#include "daisy/ring.h"

namespace daisy {
namespace {

template <typename T>
std::optional<T> Await(net::Endpoint& ep, int ms, std::string* error = nullptr) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    auto f = ep.Receive(50);
    if (!f.ok() || !f->has_value()) continue;
    auto m = wire::Decode(**f);
    if (!m.ok()) continue;
    if (auto* e = std::get_if<wire::ErrorMsg>(&*m); e && error) *error = e->message;
    if (std::holds_alternative<T>(*m)) return std::get<T>(*m);
  }
  return std::nullopt;
}

class NodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/daisy_node_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    home_ = tmpl;
    ::setenv("DAISY_HOME", home_.c_str(), 1);
    net::RendezvousOptions ro;
    ro.port = 0;
    ro.auto_approve = true;
    ro.dead_after_s = 120;  // the hand-written head sends no heartbeats
    auto rv = net::Rendezvous::Start(ro);
    ASSERT_TRUE(rv.ok());
    rv_ = std::move(*rv);
    options_.rendezvous = rv_->address();
    options_.admission = rv_->LocalAdmission(/*trusted=*/false);
    options_.print_tokens = false;
    options_.stop = &stop_;
    options_.hub.use_cache = false;
    // Local models the node may open: the bundled ones and <home>/allowed; <home>/outside
    // holds a whole model it must not, and <home>/allowed/link leads there.
    allowed_ = home_ + "/allowed";
    outside_ = home_ + "/outside/stories";
    std::filesystem::create_directories(allowed_ + "/sub");
    std::filesystem::create_directories(home_ + "/outside");
    std::filesystem::copy(std::string(std::getenv("DAISY_MODELS")) + "/stories260K", outside_,
                          std::filesystem::copy_options::recursive);
    std::filesystem::create_directory_symlink(outside_, allowed_ + "/link");
    options_.models_dirs = {std::getenv("DAISY_MODELS"), allowed_};
    options_.max_memory = max_memory_;
    thread_ = std::thread([this] { status_ = RunNode(options_); });
    for (int i = 0; i < 100 && rv_->Members().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_EQ(rv_->Members().size(), 1u);
    node_ = rv_->Members()[0];
    // The hand-written head is a member of the room too: the node's inbox admits only the
    // keys of its room's members.
    auto ep = net::Endpoint::Bind("127.0.0.1", 0);
    ASSERT_TRUE(ep.ok());
    head_ = std::move(*ep);
    head_id_ = net::KeyId(head_->public_key());
    rv_->Admit("default", head_->public_key(), "test-head");
    head_->SetPeerKey(rv_->address(), rv_->public_key());
    head_->Allow(rv_->public_key());
    wire::Hello hh{wire::kProtocolVersion, wire::kCapHead, 1.0, 0, 0, "scalar", head_id_, "test-head"};
    ASSERT_TRUE(head_->Send(rv_->address(), wire::Message(wire::Join{"default", head_->address(), hh})).ok());
    std::optional<wire::Peers> peers;
    for (int i = 0; i < 10 && (!peers || peers->peers.size() < 2); ++i) peers = Await<wire::Peers>(*head_, 500);
    ASSERT_TRUE(peers && peers->peers.size() == 2u);
    net::ApplyPeerList(*head_, rv_->public_key(), *peers);
    model_dir_ = std::string(std::getenv("DAISY_MODELS")) + "/stories260K";
    source_ = std::move(OpenLocalFolder(model_dir_).value());
    info_ = std::make_unique<ModelInfo>(std::move(LoadModelInfo(*source_).value()));
  }
  void TearDown() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    EXPECT_TRUE(status_.ok()) << status_.message();
    std::error_code ec;
    std::filesystem::remove_all(home_, ec);
  }

  wire::Assignment MakeAssignment() {
    wire::Assignment a;
    a.turn = 1;
    a.model_id = source_->ModelId();
    a.revision = source_->Revision();
    a.spec_hash = SpecHash(info_->spec);
    a.model_hash = ModelHashOf(*source_, info_->index);
    a.ctx = 64;
    a.stages = {{head_id_, head_->address(), 0, 2}, {node_.hello.device_id, node_.address, 2, 5}};
    a.your_stage = 1;
    return a;
  }

  // Hidden states after layers [0, 2) for a short prompt, computed here.
  HiddenStates Prefix() {
    auto w = StageWeights::Load(*source_, *info_, 0, 2, true);
    EXPECT_TRUE(w.ok());
    std::vector<int32_t> ids = {1, 403, 407, 261, 378};
    auto h = Embed(*w, ids, 0);
    KvCache kv(info_->spec, 0, 2, 64);
    EXPECT_TRUE(RunLayers(*w, 0, 2, *h, kv).ok());
    return std::move(*h);
  }

  wire::Activation Hop(const HiddenStates& h, uint32_t model_hash) {
    wire::Activation a;
    a.seq = 1;
    a.token_index = 0;
    a.next = 1;
    a.model_hash = model_hash;
    a.values = h.values;
    a.act_hash = wire::ActHash(a.values);
    return a;
  }

  std::string home_, model_dir_, allowed_, outside_;
  std::unique_ptr<net::Rendezvous> rv_;
  NodeOptions options_;
  std::atomic<bool> stop_{false};
  Status status_;
  std::thread thread_;
  net::MemberInfo node_;
  std::unique_ptr<net::Endpoint> head_;
  std::string head_id_;
  std::unique_ptr<ModelSource> source_;
  std::unique_ptr<ModelInfo> info_;
  std::optional<uint64_t> max_memory_;  // set before SetUp: the node's --max-memory
};

// A node with --max-memory one byte short of what 3 layers of stories260K need at ctx 64.
class NodeBudgetTest : public NodeTest {
 protected:
  void SetUp() override {
    auto src = OpenLocalFolder(std::string(std::getenv("DAISY_MODELS")) + "/stories260K");
    ASSERT_TRUE(src.ok());
    auto info = LoadModelInfo(**src);
    ASSERT_TRUE(info.ok());
    need3_ = PlanModelOf(*info, 64).Need(3, false);
    max_memory_ = need3_ - 1;
    NodeTest::SetUp();
  }
  uint64_t need3_ = 0;
};

TEST_F(NodeBudgetTest, RefusesAnAssignmentItCannotHoldBeforeFetchingAndTakesOneThatFits) {
  EXPECT_EQ(node_.hello.free_memory, need3_ - 1);  // the hello reports the budget
  std::string error;
  ASSERT_TRUE(head_->Send(node_.address, wire::Message(MakeAssignment())).ok());  // layers [2, 5)
  EXPECT_FALSE(Await<wire::Ready>(*head_, 3000, &error).has_value());
  EXPECT_NE(error.find("layers [2, 5) of " + source_->ModelId() + " at context 64 need " + FormatBytes(need3_)),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("this device's memory budget is " + FormatBytes(need3_ - 1) + ": refused before any download"),
            std::string::npos)
      << error;
  wire::Assignment two = MakeAssignment();
  two.stages = {{head_id_, head_->address(), 0, 3}, {node_.hello.device_id, node_.address, 3, 5}};
  ASSERT_TRUE(head_->Send(node_.address, wire::Message(two)).ok());
  auto ready = Await<wire::Ready>(*head_, 5000);
  ASSERT_TRUE(ready.has_value());
  EXPECT_GT(ready->peak_rss, 0u);  // its VmHWM after loading
}

TEST_F(NodeTest, ServesAHopBitIdenticalToRunningItsLayersLocally) {
  ASSERT_TRUE(head_->Send(node_.address, wire::Message(MakeAssignment())).ok());
  auto ready = Await<wire::Ready>(*head_, 5000);
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->stage, 1);
  HiddenStates h = Prefix();
  const uint32_t mh = ModelHashOf(*source_, info_->index);
  ASSERT_TRUE(head_->Send(node_.address, wire::Message(Hop(h, mh))).ok());
  auto back = Await<wire::Activation>(*head_, 5000);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->next, wire::kNextReturn);
  EXPECT_EQ(back->model_hash, mh);
  // The same layers in this process.
  auto w = StageWeights::Load(*source_, *info_, 2, 5, false);
  KvCache kv(info_->spec, 2, 5, 64);
  ASSERT_TRUE(RunLayers(*w, 2, 5, h, kv).ok());
  ASSERT_EQ(back->values.size(), h.values.size());
  EXPECT_EQ(0, std::memcmp(back->values.data(), h.values.data(), 4 * h.values.size()));
}

TEST_F(NodeTest, RefusesHopsOfAnotherModelAndDamagedPayloads) {
  ASSERT_TRUE(head_->Send(node_.address, wire::Message(MakeAssignment())).ok());
  ASSERT_TRUE(Await<wire::Ready>(*head_, 5000).has_value());
  HiddenStates h = Prefix();
  const uint32_t mh = ModelHashOf(*source_, info_->index);
  std::string error;
  // A hop of another model (a node still holding a previous model).
  ASSERT_TRUE(head_->Send(node_.address, wire::Message(Hop(h, mh ^ 1))).ok());
  EXPECT_FALSE(Await<wire::Activation>(*head_, 1500, &error).has_value());
  EXPECT_NE(error.find("model_hash mismatch"), std::string::npos) << error;
  // A payload damaged in transit: one bit.
  auto bytes = wire::Encode(wire::Message(Hop(h, mh)));
  bytes[24 + 4 * 77] ^= 1;
  error.clear();
  ASSERT_TRUE(head_->Send(node_.address, bytes).ok());
  EXPECT_FALSE(Await<wire::Activation>(*head_, 1500, &error).has_value());
  EXPECT_NE(error.find("act_hash mismatch"), std::string::npos) << error;
  // A non-finite payload with a matching hash.
  wire::Activation bad = Hop(h, mh);
  bad.values[3] = INFINITY;
  bad.act_hash = wire::ActHash(bad.values);
  error.clear();
  ASSERT_TRUE(head_->Send(node_.address, wire::Message(bad)).ok());
  EXPECT_FALSE(Await<wire::Activation>(*head_, 1500, &error).has_value());
  EXPECT_NE(error.find("non-finite"), std::string::npos) << error;
  // The node is still fine: a good hop goes through.
  ASSERT_TRUE(head_->Send(node_.address, wire::Message(Hop(h, mh))).ok());
  EXPECT_TRUE(Await<wire::Activation>(*head_, 5000).has_value());
}

TEST_F(NodeTest, RefusesAnAssignmentWithACraftedRepoIdOrAGap) {
  wire::Assignment crafted = MakeAssignment();
  crafted.model_id = "a/b?x=1";
  std::string error;
  ASSERT_TRUE(head_->Send(node_.address, wire::Message(crafted)).ok());
  EXPECT_FALSE(Await<wire::Ready>(*head_, 1500, &error).has_value());
  // The node cannot know the head's address from a frame it refused, so it stays silent;
  // what matters is that it did not fetch or get ready.
  wire::Assignment wrong_stage = MakeAssignment();
  wrong_stage.stages[1].device_id = "someoneelse00000";
  ASSERT_TRUE(head_->Send(node_.address, wire::Message(wrong_stage)).ok());
  EXPECT_FALSE(Await<wire::Ready>(*head_, 1500, &error).has_value());
  EXPECT_NE(error.find("not this device"), std::string::npos) << error;
}

// A head may name any absolute path; the node opens a local folder only under one its user
// allowed (--models-dir), with symlinks resolved. Each refusal names the path and comes
// instead of a ready: the folders outside hold a whole model the node would otherwise load
// (its own spec and model hashes are in the assignment), so any read would end in a ready.
TEST_F(NodeTest, OpensALocalFolderOnlyUnderAnAllowedOne) {
  auto assignment_for = [&](const std::string& path) {
    wire::Assignment a = MakeAssignment();
    a.model_id = path;
    if (auto src = OpenLocalFolder(path); src.ok()) {
      if (auto info = LoadModelInfo(**src); info.ok()) {  // all but /etc
        a.spec_hash = SpecHash(info->spec);
        a.model_hash = ModelHashOf(**src, info->index);
      }
    }
    return a;
  };
  for (const std::string path : {std::string("/etc"), outside_, allowed_ + "/link"}) {
    std::string error;
    ASSERT_TRUE(head_->Send(node_.address, wire::Message(assignment_for(path))).ok());
    EXPECT_FALSE(Await<wire::Ready>(*head_, 3000, &error).has_value()) << path << " was opened";
    EXPECT_NE(error.find("refusing the local model folder " + path + ": it is not under a folder this device allows"),
              std::string::npos)
        << error;
  }
  // The same model under an allowed folder is served, and so is the symlink's target once
  // its own folder is allowed (the check is on where a path leads).
  std::filesystem::copy(outside_, allowed_ + "/sub/stories", std::filesystem::copy_options::recursive);
  ASSERT_TRUE(head_->Send(node_.address, wire::Message(assignment_for(allowed_ + "/sub/stories"))).ok());
  EXPECT_TRUE(Await<wire::Ready>(*head_, 5000).has_value());
}

TEST(AllowedModelFolder, ResolvesDotDotAndSymlinksBeforeTheCheck) {
  char tmpl[] = "/tmp/daisy_allowed_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::filesystem::path tmp = tmpl;
  std::filesystem::create_directories(tmp / "models/a");
  std::filesystem::create_directories(tmp / "models-other/b");
  std::filesystem::create_directories(tmp / "secret");
  std::filesystem::create_directory_symlink(tmp / "secret", tmp / "models/escape");
  std::filesystem::create_directory_symlink(tmp / "models/a", tmp / "alias");
  const std::vector<std::string> allowed = {(tmp / "models").string()};
  EXPECT_EQ(AllowedModelFolder((tmp / "models/a").string(), allowed).value(), (tmp / "models/a").string());
  EXPECT_EQ(AllowedModelFolder((tmp / "models").string(), allowed).value(), (tmp / "models").string());
  // A symlink from outside into an allowed folder leads there: allowed.
  EXPECT_EQ(AllowedModelFolder((tmp / "alias").string(), allowed).value(), (tmp / "models/a").string());
  for (const std::string path :
       {(tmp / "models/../secret").string(), (tmp / "models/a/../../secret").string(), (tmp / "models/escape").string(),
        (tmp / "models-other/b").string(), std::string("/etc"), (tmp / "models/missing").string()}) {
    auto r = AllowedModelFolder(path, allowed);
    ASSERT_FALSE(r.ok()) << path << " allowed as " << r.value();
    EXPECT_NE(r.status().message().find("refusing the local model folder " + path + ":"), std::string::npos)
        << r.status().message();
    // The allowed folders are this device's business, not the head's.
    EXPECT_EQ(r.status().message().find((tmp / "models").string() + " "), std::string::npos) << r.status().message();
  }
  // No folder allowed: no local folder at all.
  EXPECT_FALSE(AllowedModelFolder((tmp / "models/a").string(), {}).ok());
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
}

}  // namespace
}  // namespace daisy
