// The ring end to end with real processes on 127.0.0.1: `daisychain serve`, `node` and
// `run`, against `daisychain generate` on one device.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "daisy/model.h"
#include "daisy/safetensors.h"
#include "e2e_fixture.h"
#include "e2e_util.h"
#include "flipping_proxy.h"
#include "proc_util.h"
#include "test_hub.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;
using e2e::Proc;

std::string Stories() {
  return e2e::Models() + "/stories260K";
}

class RingTest : public e2e::RingFixture {
 protected:
  // The local folders this test's models live in: devices open a local model only under a
  // folder they were given with --models-dir.
  std::vector<std::string> ModelsDirArgs() const {
    return {"--models-dir", e2e::Models(), "--models-dir", models_.string(), "--models-dir", tmp_.string()};
  }
  void StartServe(bool compute) {
    std::vector<std::string> args = {e2e::Bin(),       "serve",  "--port", std::to_string(port_),
                                     "--auto-approve", "--name", "serve"};
    if (!compute) args.push_back("--no-compute");
    for (const auto& a : ModelsDirArgs()) args.push_back(a);
    serve_ = Proc::Spawn(args, Env("serve"), (tmp_ / "serve.log").string());
  }
  // Waits until the rendezvous has admitted `n` of the nodes StartNodes started (serve logs
  // each join as "device NAME (id) joined room"; serve's own head joins too, and is not counted).
  void WaitForJoined(int n, double timeout_s = 10) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string log = e2e::ReadAll((tmp_ / "serve.log").string());
      int joined = 0;
      for (size_t at = log.find("device node-"); at != std::string::npos; at = log.find("device node-", at + 1)) {
        const size_t eol = log.find('\n', at);
        if (log.substr(at, eol == std::string::npos ? std::string::npos : eol - at).find("joined room") !=
            std::string::npos)
          ++joined;
      }
      if (joined >= n) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    FAIL() << "only some devices joined: " << e2e::ReadAll((tmp_ / "serve.log").string());
  }
  // Nodes given fault variables (DAISY_TEST_*) run the test-only daisychain_faulty: the
  // product ignores them.
  void StartNodes(int n, const std::vector<std::string>& env = {}, const std::vector<std::string>& node_args = {}) {
    bool faulty = false;
    for (const auto& x : env) faulty = faulty || x.starts_with("DAISY_TEST_");
    for (int i = 0; i < n; ++i) {
      const std::string name = "node-" + std::to_string(procs_.size() + 1);
      auto e = Env(name);
      for (const auto& x : env) e.push_back(x);
      std::vector<std::string> args = {
          faulty ? e2e::FaultyBin() : e2e::Bin(), "node", "--join", Join(), "--name", name};
      for (const auto& a : ModelsDirArgs()) args.push_back(a);
      for (const auto& a : node_args) args.push_back(a);
      procs_.push_back(Proc::Spawn(args, e, (tmp_ / (name + ".log")).string()));
    }
  }
  // `daisychain run ... --json`; returns the exit code and the parsed object (or null).
  std::pair<int, nlohmann::json> Run(const std::vector<std::string>& extra, double timeout_s = 120) {
    std::vector<std::string> args = {e2e::Bin(), "run", "--join", Join(), "--json", "--name", "head"};
    for (const auto& a : extra) args.push_back(a);
    const std::string log = (tmp_ / ("run" + std::to_string(++runs_) + ".log")).string();
    Proc p = Proc::Spawn(args, Env("head"), log);
    const int rc = p.Wait(timeout_s);
    last_run_log_ = e2e::ReadAll(log);
    return {rc, LastJson(last_run_log_)};
  }
  void ExpectVerifiedSplit(const std::string& model, const std::vector<std::string>& split, size_t stages,
                           const std::vector<int>& want, const std::string& prompt = "Once upon a time") {
    std::vector<std::string> args = {"--model", model, "--prompt", prompt, "-n", "40", "--verify"};
    for (const auto& s : split) args.push_back(s);
    auto [rc, j] = Run(args);
    ASSERT_EQ(rc, 0) << last_run_log_;
    ASSERT_TRUE(j.is_object()) << last_run_log_;
    EXPECT_TRUE(j["verified"].get<bool>()) << last_run_log_;
    EXPECT_EQ(j["plan"].size(), stages) << last_run_log_;
    EXPECT_EQ(j["ids"].get<std::vector<int>>(), want);
    EXPECT_GT(j["ring_hops"].get<int>(), 0);
  }

  int runs_ = 0;
  std::string last_run_log_;
};

TEST_F(RingTest, SplitsOverTwoThreeAndSixDevicesGiveTheSingleDeviceIds) {
  StartServe(/*compute=*/true);  // the serve process is a device too
  StartNodes(4);
  const auto stories = GenerateIds(Stories(), "Once upon a time", 40);
  ExpectVerifiedSplit(Stories(), {"--stages", "2"}, 2, stories);
  ExpectVerifiedSplit(Stories(), {"--stages", "3"}, 3, stories);
  ExpectVerifiedSplit(Stories(), {"--plan", "0,1,1,1,1,1"}, 6, stories);  // 5 layers: the head keeps none
  // A prompt of several 16-position chunks: two are in the ring at once during prefill.
  const std::string long_prompt =
      "Lily and Ben went to the park. They saw a big tree with red apples. Ben wanted to climb the tree, "
      "but Lily said it was too high. They asked their mom for help, and she";
  ExpectVerifiedSplit(Stories(), {"--stages", "3"}, 3, GenerateIds(Stories(), long_prompt, 40), long_prompt);
  const std::string tiny = (models_ / "tiny30").string();
  const auto tiny_ids = GenerateIds(tiny, "Once upon a time", 40);
  ExpectVerifiedSplit(tiny, {"--stages", "2"}, 2, tiny_ids);
  ExpectVerifiedSplit(tiny, {"--stages", "3"}, 3, tiny_ids);
  ExpectVerifiedSplit(tiny, {"--stages", "6"}, 6, tiny_ids);
}

TEST_F(RingTest, TheRendezvousNeverHoldsThePrompt) {
  StartServe(/*compute=*/false);
  StartNodes(1);
  const std::string marker = "Zanzibar quokka marmalade";
  auto [rc, j] = Run({"--model", Stories(), "--prompt", marker, "-n", "8", "--stages", "2"});
  ASSERT_EQ(rc, 0) << last_run_log_;
  // Its memory, read while it runs.
  std::ifstream maps("/proc/" + std::to_string(serve_.pid()) + "/maps");
  std::ifstream mem("/proc/" + std::to_string(serve_.pid()) + "/mem", std::ios::binary);
  ASSERT_TRUE(maps.good() && mem.good());
  std::string line;
  uint64_t scanned = 0;
  while (std::getline(maps, line)) {
    unsigned long long a = 0, b = 0;
    char perms[8] = {0};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s", &a, &b, perms) != 3 || perms[0] != 'r') continue;
    if (line.find("[vvar]") != std::string::npos) continue;
    std::string buf(static_cast<size_t>(b - a), '\0');
    mem.clear();
    mem.seekg(static_cast<std::streamoff>(a));
    if (!mem.read(buf.data(), static_cast<std::streamsize>(buf.size()))) continue;
    scanned += buf.size();
    ASSERT_EQ(buf.find(marker), std::string::npos) << "the prompt is in the rendezvous's memory: " << line;
  }
  EXPECT_GT(scanned, 100000u);
  serve_.Stop(SIGTERM);
  EXPECT_EQ(e2e::ReadAll((tmp_ / "serve.log").string()).find(marker), std::string::npos);
  // The marker did reach the head: the scan would have found it there.
  EXPECT_NE(j["prompt_ids"].size(), 0u);
}

TEST_F(RingTest, EachDeviceDownloadsOnlyItsOwnLayersAndOnlyTheHeadTheEmbedding) {
  fs::create_directories(tmp_ / "repos/acme");
  fs::copy(Stories(), tmp_ / "repos/acme/stories", fs::copy_options::recursive);
  auto hub = testing::TestHub::Start((tmp_ / "repos").string());
  ASSERT_TRUE(hub.ok());
  extra_env_ = {"HF_ENDPOINT=" + (*hub)->endpoint()};
  StartServe(/*compute=*/false);
  StartNodes(2);
  auto [rc, j] = Run({"--model", "acme/stories", "--prompt", "Once upon a time", "-n", "20", "--stages", "3"});
  ASSERT_EQ(rc, 0) << last_run_log_;
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), GenerateIds(Stories(), "Once upon a time", 20));

  auto src = OpenLocalFolder(Stories());
  auto info = LoadModelInfo(**src);
  ASSERT_TRUE(info.ok());
  // Which stage each byte of the file belongs to.
  struct Owned {
    uint64_t begin, end;
    int stage;
    std::string name;
  };
  std::vector<Owned> owned;
  for (size_t s = 0; s < j["plan"].size(); ++s) {
    const int first = j["plan"][s]["layers"][0], end = j["plan"][s]["layers"][1];
    for (const auto& n : StageTensorNames(info->spec, first, end, s == 0)) {
      const TensorInfo* t = info->index.Find(n);
      owned.push_back({t->offset, t->offset + t->bytes, static_cast<int>(s), n});
    }
  }
  const uint64_t data_start = 8 + 4856;
  std::map<int, uint64_t> bytes_by_stage;
  int embedding_reads = 0;
  for (const auto& r : (*hub)->requests()) {
    if (!r.path.ends_with("/model.safetensors") || r.range.empty()) continue;
    const size_t eq = r.range.find('='), dash = r.range.find('-');
    const uint64_t a = std::stoull(r.range.substr(eq + 1, dash - eq - 1)),
                   b = std::stoull(r.range.substr(dash + 1)) + 1;
    if (b <= data_start) continue;  // the header, read by every device
    std::set<int> stages;
    for (const auto& o : owned)
      if (o.begin < b && a < o.end) {
        stages.insert(o.stage);
        if (o.name == "model.embed_tokens.weight") ++embedding_reads;
      }
    EXPECT_EQ(stages.size(), 1u) << "range " << r.range << " spans several stages' tensors";
    if (!stages.empty()) bytes_by_stage[*stages.begin()] += b - a;
  }
  EXPECT_EQ(embedding_reads, 1) << "only the head fetches the embedding, once";
  for (size_t s = 0; s < j["plan"].size(); ++s) {
    uint64_t want = 0;
    for (const auto& o : owned)
      if (o.stage == static_cast<int>(s)) want += o.end - o.begin;
    EXPECT_EQ(bytes_by_stage[static_cast<int>(s)], want) << "stage " << s;
  }
}

// The ids of the nodes, in the order the planner takes them (by id).
std::vector<std::string> NodeIdsSorted(const fs::path& tmp, int n) {
  std::vector<std::string> ids;
  for (int i = 1; i <= n; ++i) {
    // The device id is the key's fingerprint without dashes (`daisychain id` prints it).
    const fs::path home = tmp / ("node-" + std::to_string(i));
    auto r = e2e::RunCli("DAISY_HOME=" + home.string(), "id", tmp.string());
    std::string id;
    for (char c : r.out)
      if (std::isxdigit(static_cast<unsigned char>(c))) id += c;
    ids.push_back(id);
  }
  return ids;
}

int NodeIndexOf(const std::vector<std::string>& ids, const std::string& id) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return static_cast<int>(i);
  return -1;
}

// The index (in start order) of the node whose id has rank `rank` among the first n (0:
// the lowest id, which the planner takes first after the head).
int NodeByRank(const fs::path& tmp, int n, int rank) {
  auto ids = NodeIdsSorted(tmp, n);
  auto sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  return NodeIndexOf(ids, sorted[static_cast<size_t>(rank)]);
}

// TCP sockets in the listening state that process `pid` holds (its /proc/PID/fd socket
// inodes among /proc/net/tcp and tcp6 entries in state 0A, LISTEN).
int ListeningSockets(pid_t pid) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (target.starts_with("socket:[")) inodes.insert(target.substr(8, target.size() - 9));
  }
  int n = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream lines(e2e::ReadAll(table));
    std::string line;
    std::getline(lines, line);  // the header
    while (std::getline(lines, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (st == "0A" && inodes.count(inode)) ++n;
    }
  }
  return n;
}

TEST_F(RingTest, AStageKilledMidTurnIsPlannedAroundAndTheTurnReplayed) {
  StartServe(/*compute=*/false);
  StartNodes(3, {"DAISY_TEST_HOP_DELAY_MS=30"});
  WaitForJoined(3);
  const std::string tiny = (models_ / "tiny30").string();
  const auto want = GenerateIds(tiny, "Once upon a time", 80);
  const int victim = NodeByRank(tmp_, 3, 0);  // in the first plan: head + the two lowest ids

  std::vector<std::string> args = {e2e::Bin(),         "run",  "--join",  Join(),     "--json",
                                   "--name",           "head", "--model", tiny,       "--prompt",
                                   "Once upon a time", "-n",   "80",      "--stages", "3"};
  Proc run = Proc::Spawn(args, Env("head"), (tmp_ / "run-kill.log").string());
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  procs_[static_cast<size_t>(victim)].Stop(SIGKILL);
  const int rc = run.Wait(90);
  const std::string log = e2e::ReadAll((tmp_ / "run-kill.log").string());
  ASSERT_EQ(rc, 0) << log;
  auto j = nlohmann::json::parse(log.substr(log.rfind("\n{") + 1));
  EXPECT_EQ(j["replays"], 1) << log;
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), want);
  EXPECT_EQ(j["plan"].size(), 3u);  // the spare node took the dead one's place
  // A fault, not an audit's verdict: the replay first lets the room drop the dead member
  // (audit_test's AReplayAfterAVerdictWaitsForNoOne is the other side).
  EXPECT_NE(log.find("for the room to drop members that died"), std::string::npos) << log;
  EXPECT_EQ(log.find("no wait for the room"), std::string::npos) << log;
}

TEST_F(RingTest, WhenTheReplacementDiesTooTheErrorIsClearAndTheRingServesTheNextPrompt) {
  StartServe(/*compute=*/false);
  StartNodes(3, {"DAISY_TEST_HOP_DELAY_MS=30"});
  WaitForJoined(3);
  const std::string tiny = (models_ / "tiny30").string();
  const int first_victim = NodeByRank(tmp_, 3, 0);
  const int replacement = NodeByRank(tmp_, 3, 2);

  std::vector<std::string> args = {e2e::Bin(),         "run",  "--join",  Join(),     "--json",
                                   "--name",           "head", "--model", tiny,       "--prompt",
                                   "Once upon a time", "-n",   "200",     "--stages", "3"};
  const auto start = std::chrono::steady_clock::now();
  Proc run = Proc::Spawn(args, Env("head"), (tmp_ / "run-kill2.log").string());
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  procs_[static_cast<size_t>(first_victim)].Stop(SIGKILL);
  // The head notices within a few seconds, re-plans with the spare and replays; kill that too.
  const std::string log_path = (tmp_ / "run-kill2.log").string();
  for (int i = 0; i < 300 && e2e::ReadAll(log_path).find("re-planning") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  procs_[static_cast<size_t>(replacement)].Stop(SIGKILL);
  const int rc = run.Wait(40);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string log = e2e::ReadAll(log_path);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(rc, -2) << "the head hung";
  EXPECT_LT(took, 40.0);
  EXPECT_NE(log.find("error: the replay failed too"), std::string::npos) << log;

  // The rendezvous and the surviving node serve the next prompt.
  const auto want = GenerateIds(tiny, "Lily and Ben", 20);
  auto [rc2, j] = Run({"--model", tiny, "--prompt", "Lily and Ben", "-n", "20", "--stages", "2"});
  ASSERT_EQ(rc2, 0) << last_run_log_;
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), want);
}

// The texts a device printed for the turns of the head named `head` (node: the room's
// stream on its terminal), each as it stood at the turn's end marker; waits up to 15 s
// for `want` of them.
std::vector<std::string> ShownTexts(const fs::path& log, const std::string& head, size_t want) {
  const std::string begin = "--- text of a turn by head '" + head + "' (", end = "--- end of the turn by head '" + head;
  std::vector<std::string> texts;
  for (int i = 0; i < 300; ++i) {
    const std::string out = e2e::ReadAll(log.string());
    texts.clear();
    for (size_t at = out.find(begin); at != std::string::npos; at = out.find(begin, at + 1)) {
      const size_t from = out.find('\n', at) + 1;
      const size_t to = out.find(end, from);
      if (to == std::string::npos) break;
      texts.push_back(out.substr(from, to - from));
    }
    if (texts.size() >= want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return texts;
}

// Every device of the room shows the turn's text as it is generated, as the original does:
// those the plan leaves out (every one when the turn stays on the head) and the stages alike,
// equal to the head's; `--no-share-tokens` keeps it on the head, `--no-show-tokens` off a
// device's terminal.
TEST_F(RingTest, EveryDeviceOfTheRoomShowsTheTurnsTextInThePlanOrNot) {
  StartServe(/*compute=*/false);
  StartNodes(2);
  std::vector<std::string> quiet = {e2e::Bin(), "node", "--join", Join(), "--name", "node-3", "--no-show-tokens"};
  for (const auto& a : ModelsDirArgs()) quiet.push_back(a);
  procs_.push_back(Proc::Spawn(quiet, Env("node-3"), (tmp_ / "node-3.log").string()));
  WaitForJoined(3);
  // The shown text ends its line (the closing marker starts the next).
  auto line = [](std::string t) { return t.empty() || t.back() == '\n' ? t : t + "\n"; };
  // The whole model fits the head: the turn stays there, and no node holds a layer.
  auto [rc1, alone] = Run({"--model", Stories(), "--prompt", "Once upon a time", "-n", "40"});
  ASSERT_EQ(rc1, 0) << last_run_log_;
  ASSERT_EQ(alone["plan"].size(), 1u) << last_run_log_;
  const std::string text1 = alone["text"];
  ASSERT_FALSE(text1.empty());
  // Two stages: one node holds layers, the other none.
  auto [rc2, split] = Run({"--model", Stories(), "--prompt", "Lily and Ben", "-n", "40", "--stages", "2"});
  ASSERT_EQ(rc2, 0) << last_run_log_;
  ASSERT_EQ(split["plan"].size(), 2u) << last_run_log_;
  const std::string text2 = split["text"];
  for (const char* node : {"node-1", "node-2"}) {
    SCOPED_TRACE(node);
    const auto shown = ShownTexts(tmp_ / (std::string(node) + ".log"), "head", 2);
    ASSERT_EQ(shown.size(), 2u) << e2e::ReadAll((tmp_ / (std::string(node) + ".log")).string());
    EXPECT_EQ(shown[0], line(text1));
    EXPECT_EQ(shown[1], line(text2));
  }
  // A head that does not share: its text stays on it.
  auto [rc3, kept] =
      Run({"--model", Stories(), "--prompt", "The little dog", "-n", "12", "--stages", "2", "--no-share-tokens"});
  ASSERT_EQ(rc3, 0) << last_run_log_;
  ASSERT_FALSE(kept["text"].get<std::string>().empty());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  for (const char* node : {"node-1", "node-2"}) {
    const std::string log = e2e::ReadAll((tmp_ / (std::string(node) + ".log")).string());
    size_t turns = 0;
    for (size_t at = log.find("--- text of a turn"); at != std::string::npos;
         at = log.find("--- text of a turn", at + 1))
      ++turns;
    EXPECT_EQ(turns, 2u) << node << ": " << log;
  }
  // The device that asked not to see the room's text showed none of it.
  const std::string quiet_log = e2e::ReadAll((tmp_ / "node-3.log").string());
  EXPECT_EQ(quiet_log.find("--- text of a turn"), std::string::npos) << quiet_log;
  EXPECT_EQ(quiet_log.find(text1), std::string::npos) << quiet_log;
}

// Issue 15, item 2: a device that accepts no connections (node --no-listen) holds layers
// through serve's relay. The lap crosses serve twice (to it and from it) and the turn is
// VERIFIED with the single-device ids; the plan says which stage is relayed.
TEST_F(RingTest, ANodeThatAcceptsNoConnectionsHoldsLayersThroughTheRelayAndTheRunIsVerified) {
  StartServe(/*compute=*/false);
  StartNodes(1, {}, {"--no-listen"});
  StartNodes(1);
  WaitForJoined(2);
  const std::string relayed_log = e2e::ReadAll((tmp_ / "node-1.log").string());
  EXPECT_NE(relayed_log.find("no inbox (--no-listen)"), std::string::npos) << relayed_log;
  const std::string tiny = (models_ / "tiny30").string();
  const auto want = GenerateIds(tiny, "Once upon a time", 40);
  // The head holds layers too, so the lap is head -> node -> node -> head, one leg relayed each way.
  auto [rc, j] = Run({"--model", tiny, "--prompt", "Once upon a time", "-n", "40", "--verify", "--stages", "3"});
  ASSERT_EQ(rc, 0) << last_run_log_;
  ASSERT_TRUE(j.is_object()) << last_run_log_;
  EXPECT_TRUE(j["verified"].get<bool>()) << last_run_log_;
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), want);
  ASSERT_EQ(j["plan"].size(), 3u);
  int relayed = 0;
  for (const auto& s : j["plan"]) relayed += s["relayed"].get<bool>() ? 1 : 0;
  EXPECT_EQ(relayed, 1) << j["plan"].dump();
  const std::string serve_log = e2e::ReadAll((tmp_ / "serve.log").string());
  EXPECT_NE(serve_log.find("is connected to the relay"), std::string::npos) << serve_log;
  EXPECT_EQ(serve_log.find("relay: refused"), std::string::npos) << serve_log;
  // The relayed node listens on no TCP port at all; the other node does (its inbox).
  EXPECT_EQ(ListeningSockets(procs_[0].pid()), 0);
  EXPECT_GT(ListeningSockets(procs_[1].pid()), 0);
  // The turn's text reached the relayed node too, boxed through the relay like its hops
  // (sealed with the head's one counter, from another connection than the hops).
  const std::string text = j["text"];
  ASSERT_FALSE(text.empty());
  const auto shown = ShownTexts(tmp_ / "node-1.log", "head", 1);
  ASSERT_EQ(shown.size(), 1u) << e2e::ReadAll((tmp_ / "node-1.log").string());
  EXPECT_EQ(shown[0], text.back() == '\n' ? text : text + "\n");
}

// A relayed node killed mid-turn is dropped like any stage and the turn replayed without it.
TEST_F(RingTest, ARelayedNodeKilledMidTurnIsPlannedAroundAndTheTurnReplayed) {
  StartServe(/*compute=*/false);
  StartNodes(1, {"DAISY_TEST_HOP_DELAY_MS=30"}, {"--no-listen"});
  StartNodes(1, {"DAISY_TEST_HOP_DELAY_MS=30"});
  WaitForJoined(2);
  const std::string tiny = (models_ / "tiny30").string();
  const auto want = GenerateIds(tiny, "Once upon a time", 80);
  std::vector<std::string> args = {e2e::Bin(),         "run",  "--join",  Join(),     "--json",
                                   "--name",           "head", "--model", tiny,       "--prompt",
                                   "Once upon a time", "-n",   "80",      "--stages", "3"};
  Proc run = Proc::Spawn(args, Env("head"), (tmp_ / "run-kill.log").string());
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  procs_[0].Stop(SIGKILL);  // the relayed node: in the first plan, as every device is
  const int rc = run.Wait(90);
  const std::string log = e2e::ReadAll((tmp_ / "run-kill.log").string());
  ASSERT_EQ(rc, 0) << log;
  auto j = nlohmann::json::parse(log.substr(log.rfind("\n{") + 1));
  EXPECT_EQ(j["replays"], 1) << log;
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), want);
  ASSERT_EQ(j["plan"].size(), 2u) << log;  // the head and the node that listens
  for (const auto& s : j["plan"]) EXPECT_FALSE(s["relayed"].get<bool>()) << j["plan"].dump();
}

// A clear error for --no-listen with flags that need a port (a serve without a relay:
// src/ring/relay_test.cc).
TEST_F(RingTest, NoListenRefusesPortFlags) {
  auto r = e2e::RunCli("DAISY_HOME=" + (tmp_ / "x").string(), "node --join " + Join() + " --no-listen --port 5000",
                       tmp_.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--no-listen binds no port: --port and --advertise do not apply"), std::string::npos) << r.err;
}

TEST_F(RingTest, ASecondPromptWaitsForTheTurnInProgress) {
  StartServe(/*compute=*/false);
  StartNodes(1, {"DAISY_TEST_HOP_DELAY_MS=30"});
  WaitForJoined(1);
  const std::string tiny = (models_ / "tiny30").string();
  const auto want_a = GenerateIds(tiny, "Once upon a time", 100);
  const auto want_b = GenerateIds(tiny, "Lily and Ben", 30);
  auto spawn = [&](const std::string& home, const std::string& prompt, int n, const std::string& log, bool draft) {
    std::vector<std::string> args = {e2e::Bin(), "run", "--join",          Join(),     "--json",
                                     "--name",   home,  "--model",         tiny,       "--prompt",
                                     prompt,     "-n",  std::to_string(n), "--stages", "2"};
    if (!draft) args.push_back("--no-lookahead");
    return Proc::Spawn(args, Env(home), (tmp_ / log).string());
  };
  // The first turn without drafts: its 100 laps of at least one 30 ms hop each keep the ring
  // for 3 s or more once its stages are ready (with drafts, this model's repetitive text
  // took a third of the laps, and the turn sometimes ended before the second head asked).
  Proc a = spawn("head-a", "Once upon a time", 100, "run-a.log", /*draft=*/false);
  const std::string log_a = (tmp_ / "run-a.log").string();
  for (int i = 0; i < 500 && e2e::ReadAll(log_a).find("all stages ready") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_NE(e2e::ReadAll(log_a).find("all stages ready"), std::string::npos) << e2e::ReadAll(log_a);
  Proc b = spawn("head-b", "Lily and Ben", 30, "run-b.log", /*draft=*/true);
  const std::string log_b = (tmp_ / "run-b.log").string();
  ASSERT_EQ(a.Wait(90), 0) << e2e::ReadAll(log_a);
  ASSERT_EQ(b.Wait(90), 0) << e2e::ReadAll(log_b);
  const std::string la = e2e::ReadAll(log_a), lb = e2e::ReadAll(log_b);
  EXPECT_EQ(nlohmann::json::parse(la.substr(la.rfind("\n{") + 1))["ids"].get<std::vector<int>>(), want_a);
  EXPECT_EQ(nlohmann::json::parse(lb.substr(lb.rfind("\n{") + 1))["ids"].get<std::vector<int>>(), want_b);
  EXPECT_NE(lb.find("waiting for the turn in progress"), std::string::npos) << lb;
}

// Every link is CURVE: a frame flipped in flight between the head and a stage fails
// authentication, the stage drops that connection (the frame never reaches the node), the
// head sees the link break, re-plans without that stage and replays the turn, which gives
// the single-device ids.
TEST_F(RingTest, AFrameTamperedWithInFlightBreaksTheLinkAndTheTurnIsReplayedWithoutThatStage) {
  StartServe(/*compute=*/false);
  const int inbox = e2e::FreePort();
  // Past the greeting and the CURVE handshake: the flip lands in a frame of the turn.
  test::FlippingProxy proxy(inbox, 1500);
  std::vector<std::string> node_args = {e2e::Bin(),    "node",
                                        "--join",      Join(),
                                        "--name",      "node-tampered",
                                        "--port",      std::to_string(inbox),
                                        "--advertise", "127.0.0.1:" + std::to_string(proxy.port())};
  for (const auto& a : ModelsDirArgs()) node_args.push_back(a);
  procs_.push_back(Proc::Spawn(node_args, Env("node-tampered"), (tmp_ / "node-tampered.log").string()));
  WaitForJoined(1);
  const auto want = GenerateIds(Stories(), "Once upon a time", 24);
  auto [rc, j] = Run({"--model", Stories(), "--prompt", "Once upon a time", "-n", "24", "--stages", "2", "--verify",
                      "--lap-timeout", "10"});
  ASSERT_EQ(rc, 0) << last_run_log_;
  ASSERT_TRUE(j.is_object()) << last_run_log_;
  EXPECT_GE(proxy.flipped(), 1);
  EXPECT_NE(last_run_log_.find("node-tampered"), std::string::npos)
      << "the first plan did not use the proxied stage: " << last_run_log_;
  EXPECT_EQ(j["replays"], 1) << last_run_log_;
  EXPECT_NE(last_run_log_.find("broke"), std::string::npos) << last_run_log_;  // seen at once, not after a stall
  EXPECT_EQ(j["plan"].size(), 1u) << last_run_log_;                            // re-planned without it
  EXPECT_TRUE(j["verified"].get<bool>()) << last_run_log_;
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), want);
  // The flipped frame never reached the node's code: CURVE refused it first (without
  // encryption the node would have refused a damaged hop itself).
  const std::string node_log = e2e::ReadAll((tmp_ / "node-tampered.log").string());
  EXPECT_EQ(node_log.find("refused"), std::string::npos) << node_log;
}

// ---- liveness: busy is not dead, every wait ends, members come back (issue: the steady ring) ----

// Open file descriptors of a process (sockets, eventfds, files).
int OpenFds(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

// The soak: a half-billion-parameter model (the Qwen2.5-0.5B shape, random BF16 weights,
// about 1 GB) over the head and two nodes, several fresh heads in a row, each planning,
// assigning and loading its slice (a new head loads its own slice every time, while the
// nodes keep theirs), the last one verified. Loading takes seconds on every device, longer
// than the 4 s after which a silent member is dropped: nobody may be dropped for it. A node
// also closes its links to each head that left (no descriptor grows per head).
TEST_F(RingTest, AHalfBillionParameterModelServesSeveralFreshHeadsInARow) {
  const fs::path qwen = tmp_ / "qwen";
  modelmaker::MakeOptions mo;
  mo.tokenizer_dir = Stories();
  mo.seed = 11;
  ASSERT_TRUE(modelmaker::MakeModel(modelmaker::PresetShape("qwen2.5-0.5b"), qwen.string(), mo).ok());
  StartServe(/*compute=*/false);
  StartNodes(2);
  WaitForJoined(2);
  int fds_after_first = 0;
  for (int turn = 0; turn < 3; ++turn) {
    const bool verify = turn == 2;
    std::vector<std::string> args = {"--model", qwen.string(), "--prompt", "Once upon a time",
                                     "-n",      "6",           "--stages", "3"};
    if (verify) args.push_back("--verify");
    auto [rc, j] = Run(args, 240);
    ASSERT_EQ(rc, 0) << "turn " << turn << ": " << last_run_log_;
    ASSERT_TRUE(j.is_object()) << last_run_log_;
    EXPECT_EQ(j["plan"].size(), 3u) << last_run_log_;
    EXPECT_EQ(j["replays"], 0) << "turn " << turn << " needed a replay: " << last_run_log_;
    EXPECT_EQ(j["ids"].size(), 6u);
    if (verify) EXPECT_TRUE(j["verified"].get<bool>()) << last_run_log_;
    // The head that just left is dropped from every node's links once the room says so.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    if (turn == 0) fds_after_first = OpenFds(procs_[0].pid());
  }
  EXPECT_LE(OpenFds(procs_[0].pid()), fds_after_first + 2) << "a node keeps links to heads that left";
  const std::string serve_log = e2e::ReadAll((tmp_ / "serve.log").string());
  EXPECT_EQ(serve_log.find("lost device"), std::string::npos) << "a busy member was taken for dead: " << serve_log;
}

// A Hub that takes 6 s before the first byte of every weight range: each stage's load takes
// longer than the 4 s after which a silent member used to be dropped, and nothing reports
// progress meanwhile. The heartbeats come from their own thread, so the turn completes
// without a replay and nobody is dropped.
TEST_F(RingTest, AStageWhoseLayersLoadSlowlyIsWaitedForAndTheTurnCompletes) {
  fs::create_directories(tmp_ / "repos/acme");
  fs::copy(Stories(), tmp_ / "repos/acme/stories", fs::copy_options::recursive);
  auto hub = testing::TestHub::Start((tmp_ / "repos").string());
  ASSERT_TRUE(hub.ok());
  (*hub)->SetFirstByteDelay(6000, /*min_length=*/64 * 1024);  // weight ranges only, not headers
  extra_env_ = {"HF_ENDPOINT=" + (*hub)->endpoint()};
  StartServe(/*compute=*/false);
  StartNodes(2);
  WaitForJoined(2);
  auto [rc, j] =
      Run({"--model", "acme/stories", "--prompt", "Once upon a time", "-n", "20", "--stages", "3", "--no-cache"}, 180);
  ASSERT_EQ(rc, 0) << last_run_log_;
  EXPECT_EQ(j["replays"], 0) << last_run_log_;
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), GenerateIds(Stories(), "Once upon a time", 20));
  const std::string serve_log = e2e::ReadAll((tmp_ / "serve.log").string());
  EXPECT_EQ(serve_log.find("lost device"), std::string::npos) << serve_log;
}

// SIGSTOP a stage mid-turn: its heartbeats stop, the rendezvous drops it after 4 s, the
// head gives up on it at once, waits for the room to settle (5 s), re-plans with the spare
// and replays. SIGCONT later: the stopped node comes back into the room, its stale hop is
// refused by everyone, and a verified turn over all the nodes gives the single-device ids.
TEST_F(RingTest, AStoppedStageIsGivenUpAndDoesNoHarmWhenItResumes) {
  StartServe(/*compute=*/false);
  StartNodes(3, {"DAISY_TEST_HOP_DELAY_MS=30"});
  WaitForJoined(3);
  const std::string tiny = (models_ / "tiny30").string();
  const auto want = GenerateIds(tiny, "Once upon a time", 80);
  const int victim = NodeByRank(tmp_, 3, 0);
  std::vector<std::string> args = {e2e::Bin(),         "run",  "--join",  Join(),     "--json",
                                   "--name",           "head", "--model", tiny,       "--prompt",
                                   "Once upon a time", "-n",   "80",      "--stages", "3"};
  const auto start = std::chrono::steady_clock::now();
  Proc run = Proc::Spawn(args, Env("head"), (tmp_ / "run-stop.log").string());
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  ::kill(procs_[static_cast<size_t>(victim)].pid(), SIGSTOP);
  const int rc = run.Wait(60);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string log = e2e::ReadAll((tmp_ / "run-stop.log").string());
  ::kill(procs_[static_cast<size_t>(victim)].pid(), SIGCONT);
  ASSERT_EQ(rc, 0) << log;
  auto j = nlohmann::json::parse(log.substr(log.rfind("\n{") + 1));
  EXPECT_EQ(j["replays"], 1) << log;
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), want);
  EXPECT_EQ(j["plan"].size(), 3u);
  EXPECT_NE(log.find("left the ring"), std::string::npos) << log;
  EXPECT_LT(took, 45.0) << "giving up on a stopped stage took too long: " << log;
  // Back from SIGCONT: it rejoins the room and serves a verified turn with the others.
  for (int i = 0; i < 200; ++i) {
    const std::string s = e2e::ReadAll((tmp_ / "serve.log").string());
    const size_t lost = s.rfind("lost device");
    if (lost != std::string::npos && s.find("joined room", lost) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  auto [rc2, j2] = Run({"--model", tiny, "--prompt", "Once upon a time", "-n", "40", "--stages", "4", "--verify"});
  ASSERT_EQ(rc2, 0) << last_run_log_;
  EXPECT_EQ(j2["plan"].size(), 4u) << last_run_log_;
  EXPECT_TRUE(j2["verified"].get<bool>()) << last_run_log_;
  EXPECT_EQ(j2["ids"].get<std::vector<int>>(), std::vector<int>(want.begin(), want.begin() + 40));
}

// Kill serve and start it again on the same port with the same DAISY_HOME (the same server
// key): the nodes notice that their heartbeats no longer get through, ask to be admitted
// again (trusting the key they remember) and rejoin; a head's run over them succeeds.
TEST_F(RingTest, NodesRejoinARestartedServeAndTheNextRunSucceeds) {
  StartServe(/*compute=*/false);
  StartNodes(2);
  WaitForJoined(2);
  serve_.Stop(SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  StartServe(/*compute=*/false);  // the log starts afresh
  WaitForJoined(2, 40);
  const std::string tiny = (models_ / "tiny30").string();
  auto [rc, j] = Run({"--model", tiny, "--prompt", "Once upon a time", "-n", "20", "--stages", "3"});
  ASSERT_EQ(rc, 0) << last_run_log_;
  EXPECT_EQ(j["plan"].size(), 3u);
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), GenerateIds(tiny, "Once upon a time", 20));
  const std::string node_log = e2e::ReadAll((tmp_ / "node-1.log").string());
  EXPECT_NE(node_log.find("lost the rendezvous"), std::string::npos) << node_log;
}

// The same with a relayed node: its link to the relay, refused by the restarted serve until
// the node is admitted again, is made anew, and the next run goes through the relay.
TEST_F(RingTest, ARelayedNodeRejoinsARestartedServeThroughTheRelay) {
  StartServe(/*compute=*/false);
  StartNodes(1, {}, {"--no-listen"});
  StartNodes(1);
  WaitForJoined(2);
  serve_.Stop(SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  StartServe(/*compute=*/false);
  WaitForJoined(2, 40);
  const std::string tiny = (models_ / "tiny30").string();
  auto [rc, j] = Run({"--model", tiny, "--prompt", "Once upon a time", "-n", "20", "--stages", "3"});
  ASSERT_EQ(rc, 0) << last_run_log_;
  ASSERT_EQ(j["plan"].size(), 3u);
  int relayed = 0;
  for (const auto& s : j["plan"]) relayed += s["relayed"].get<bool>() ? 1 : 0;
  EXPECT_EQ(relayed, 1) << j["plan"].dump();
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), GenerateIds(tiny, "Once upon a time", 20));
  const std::string node_log = e2e::ReadAll((tmp_ / "node-1.log").string());
  EXPECT_NE(node_log.find("lost the rendezvous"), std::string::npos) << node_log;
}

// `daisychain id`: the key pair is made on first use with mode 0600 and kept; the same
// fingerprint every time, another for another DAISY_HOME or role.
TEST(IdCommand, PrintsTheSameFingerprintFromAKeyFileOnlyTheUserCanRead) {
  char tmpl[] = "/tmp/daisy_id_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path tmp = tmpl;
  const std::string home = "DAISY_HOME=" + (tmp / "home").string();
  auto first = e2e::RunCli(home, "id", tmp.string());
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(first.out.size(), 20u) << first.out;  // "ab12-cd34-ef56-7890\n"
  struct stat st {};
  const fs::path key = tmp / "home" / "keys" / "node.key";
  ASSERT_EQ(::stat(key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(e2e::RunCli(home, "id", tmp.string()).out, first.out);
  EXPECT_NE(e2e::RunCli(home, "id --role head", tmp.string()).out, first.out);
  EXPECT_NE(e2e::RunCli("DAISY_HOME=" + (tmp / "other").string(), "id", tmp.string()).out, first.out);
  // Readable by others: refused, never replaced.
  ::chmod(key.c_str(), 0644);
  auto refused = e2e::RunCli(home, "id", tmp.string());
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("chmod 600"), std::string::npos) << refused.err;
  ::chmod(key.c_str(), 0600);
  EXPECT_EQ(e2e::RunCli(home, "id", tmp.string()).out, first.out);
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

}  // namespace
}  // namespace daisy
