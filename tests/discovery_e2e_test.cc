// Finding a room on a LAN with real processes: `daisychain serve` in one network namespace,
// `daisychain node` with no --join in another, joined by a veth pair this test makes (a
// private /24, a multicast route on the veth). The node hears serve's announcement, joins
// with the announced server key, waits for the host's approval like any device, holds a
// stage, and a run over it is VERIFIED with the single-device ids.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "daisy/net.h"
#include "daisy/ring.h"
#include "e2e_util.h"
#include "proc_util.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;
using e2e::Proc;
using Json = nlohmann::json;

const std::string kServeIp = "10.231.15.1";
const std::string kNodeIp = "10.231.15.2";

int Sh(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Two namespaces and the veth pair between them; everything in them is killed and both are
// deleted when this goes away, however the test ended.
class NetnsPair {
 public:
  NetnsPair() {
    const std::string tag = std::to_string(::getpid());
    serve_ = "dcs" + tag;
    node_ = "dcn" + tag;
    const std::string a = "dcv" + tag + "a", b = "dcv" + tag + "b";
    ok_ = Sh("ip netns add " + serve_ + " 2>/dev/null") == 0;
    if (!ok_) return;
    ok_ = Sh("ip netns add " + node_) == 0 && Sh("ip link add " + a + " type veth peer name " + b) == 0 &&
          Sh("ip link set " + a + " netns " + serve_) == 0 && Sh("ip link set " + b + " netns " + node_) == 0 &&
          Sh("ip -n " + serve_ + " addr add " + kServeIp + "/24 dev " + a) == 0 &&
          Sh("ip -n " + node_ + " addr add " + kNodeIp + "/24 dev " + b) == 0 &&
          Sh("ip -n " + serve_ + " link set lo up") == 0 && Sh("ip -n " + node_ + " link set lo up") == 0 &&
          Sh("ip -n " + serve_ + " link set " + a + " up") == 0 &&
          Sh("ip -n " + node_ + " link set " + b + " up") == 0 &&
          // Multicast leaves by the veth: the namespaces have no default route.
          Sh("ip -n " + serve_ + " route add 224.0.0.0/4 dev " + a) == 0 &&
          Sh("ip -n " + node_ + " route add 224.0.0.0/4 dev " + b) == 0;
  }
  ~NetnsPair() {
    for (const auto& ns : {serve_, node_}) {
      Sh("ip netns pids " + ns + " 2>/dev/null | xargs -r kill -9 2>/dev/null");
      Sh("ip netns del " + ns + " 2>/dev/null");  // takes its end of the veth with it
    }
  }
  bool ok() const { return ok_; }
  // argv prefix that runs a program inside a namespace (ip netns exec execs it: the pid is the program's).
  std::vector<std::string> In(const std::string& ns) const { return {IpPath(), "netns", "exec", ns}; }
  static std::string IpPath() {
    for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
      if (::access(p, X_OK) == 0) return p;
    return "";
  }
  const std::string& serve() const { return serve_; }
  const std::string& node() const { return node_; }

 private:
  std::string serve_, node_;
  bool ok_ = false;
};

// A forged announcement from inside namespace `ns`: the real serve's address and port under a
// key that is not its key, as anyone on a LAN could send. A child process (setns is per
// thread; the child has one), killed when this goes away.
class ForgedAnnouncer {
 public:
  ForgedAnnouncer(const std::string& ns, const Announcement& a, const std::string& from) {
    pid_ = ::fork();
    if (pid_ != 0) return;
    const int fd = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) std::_Exit(3);
    auto an = Announcer::Start(a, from);
    if (!an.ok()) std::_Exit(4);
    for (int i = 0; i < 600; ++i) ::sleep(1);  // bounded: the parent kills it long before
    std::_Exit(0);
  }
  ~ForgedAnnouncer() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

 private:
  pid_t pid_ = -1;
};

std::vector<std::string> Cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Waits (bounded) until `path` holds `text`; returns the file's content then (or at the end).
std::string WaitFor(const std::string& path, const std::string& text, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string log = e2e::ReadAll(path);
  while (log.find(text) == std::string::npos && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    log = e2e::ReadAll(path);
  }
  return log;
}

std::string Between(const std::string& s, const std::string& before, const std::string& after) {
  const size_t a = s.find(before);
  if (a == std::string::npos) return "";
  const size_t b = s.find(after, a + before.size());
  return b == std::string::npos ? "" : s.substr(a + before.size(), b - a - before.size());
}

TEST(LanDiscovery, ANodeWithoutJoinFindsTheRoomWaitsForApprovalAndHoldsAVerifiedStage) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces (ip netns)";
  if (NetnsPair::IpPath().empty()) GTEST_SKIP() << "no `ip` command (iproute2) to make network namespaces";
  char tmpl[] = "/tmp/daisy_discovery_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path tmp = tmpl;
  NetnsPair ns;  // declared before the processes: they are killed before the namespaces go
  if (!ns.ok()) GTEST_SKIP() << "`ip netns add` / veth unavailable here (not allowed in this container?)";
  const std::string stories = e2e::Models() + "/stories260K";
  const std::string join = kServeIp + ":8788";
  auto home = [&](const std::string& who) { return "DAISY_HOME=" + (tmp / who).string(); };

  // The head of the run, pre-approved by its fingerprint; the node is approved by hand.
  auto head_id = e2e::RunCli(home("head"), "id --role head", tmp.string());
  ASSERT_EQ(head_id.exit_code, 0) << head_id.err;
  const std::string head_fpr = head_id.out.substr(0, 19);

  const std::string serve_log = (tmp / "serve.log").string(), node_log = (tmp / "node.log").string();
  Proc serve = Proc::Spawn(Cat(ns.In(ns.serve()), {e2e::Bin(), "serve", "--host", kServeIp, "--no-compute", "--name",
                                                   "serve", "--approve", head_fpr, "--models-dir", e2e::Models()}),
                           {home("serve")}, serve_log);
  std::string slog = WaitFor(serve_log, "announcing room 'default'", 30);
  ASSERT_NE(slog.find("announcing room 'default'"), std::string::npos) << slog;
  const std::string server_fpr = Between(slog, "server key fingerprint: ", "\n");
  ASSERT_EQ(server_fpr.size(), 19u) << slog;
  const std::string secret = e2e::AdminSecretFromLog(serve_log);
  ASSERT_FALSE(secret.empty()) << slog;

  // No --join, no --host: found by the announcement, inbox on the veth's address.
  Proc node =
      Proc::Spawn(Cat(ns.In(ns.node()), {e2e::Bin(), "node", "--name", "lan-node", "--models-dir", e2e::Models()}),
                  {home("node")}, node_log);
  std::string nlog = WaitFor(node_log, "waiting for the host to approve", 30);
  EXPECT_NE(nlog.find("found room 'default' at " + join + ", server key " + server_fpr), std::string::npos) << nlog;
  EXPECT_NE(nlog.find("inbox on " + kNodeIp), std::string::npos) << nlog;
  ASSERT_NE(nlog.find("waiting for the host to approve"), std::string::npos) << nlog;
  EXPECT_EQ(nlog.find("in room"), std::string::npos) << "in the room before the host approved it: " << nlog;

  // The host approves it as in the UI: the pending device's id from /api/state.
  const std::string curl =
      "ip netns exec " + ns.serve() + " curl -s --max-time 5 -H 'Cookie: daisy_admin=" + secret + "' http://" + join;
  Json pending;
  for (int i = 0; i < 100 && pending.is_null(); ++i) {
    ASSERT_EQ(Sh(curl + "/api/state > " + (tmp / "state.json").string()), 0);
    const Json state = Json::parse(e2e::ReadAll((tmp / "state.json").string()), nullptr, false);
    if (state.is_object())
      for (const auto& d : state["devices"])
        if (d["name"] == "lan-node" && d["status"] == "pending") pending = d;
    if (pending.is_null()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(pending.is_null()) << e2e::ReadAll((tmp / "state.json").string());
  const std::string body = Json{{"id", pending["id"]}}.dump();
  ASSERT_EQ(Sh(curl + "/api/approve -H 'Content-Type: application/json' -d '" + body + "' > /dev/null"), 0);
  nlog = WaitFor(node_log, "in room 'default'", 30);
  ASSERT_NE(nlog.find("in room 'default'"), std::string::npos) << nlog;

  // A run over the LAN: its head in serve's namespace, the found node the second stage.
  const auto want = e2e::RunCli(
      home("gen"), "generate --model " + stories + " --prompt 'Once upon a time' -n 24 --json", tmp.string());
  ASSERT_EQ(want.exit_code, 0) << want.err;
  const std::string run_log = (tmp / "run.log").string();
  Proc run = Proc::Spawn(
      Cat(ns.In(ns.serve()), {e2e::Bin(),         "run",    "--join", join,       "--host",  kServeIp,  "--server-key",
                              server_fpr,         "--json", "--name", "head",     "--model", stories,   "--prompt",
                              "Once upon a time", "-n",     "24",     "--stages", "2",       "--verify"}),
      {home("head")}, run_log);
  ASSERT_EQ(run.Wait(180), 0) << e2e::ReadAll(run_log);
  const std::string rlog = e2e::ReadAll(run_log);
  const Json j = Json::parse(rlog.substr(rlog.rfind("\n{") + 1), nullptr, false);
  ASSERT_TRUE(j.is_object()) << rlog;
  EXPECT_TRUE(j["verified"].get<bool>()) << rlog;
  EXPECT_EQ(j["ids"], Json::parse(want.out)["ids"]);
  ASSERT_EQ(j["plan"].size(), 2u) << rlog;
  EXPECT_EQ(j["plan"][1]["device"], "lan-node") << rlog;

  // Asked for a room nobody announces: a clear error naming what was found.
  const std::string miss_log = (tmp / "miss.log").string();
  Proc miss = Proc::Spawn(Cat(ns.In(ns.node()), {e2e::Bin(), "node", "--room", "attic", "--discover-seconds", "3"}),
                          {home("miss")}, miss_log);
  EXPECT_EQ(miss.Wait(30), 2);
  const std::string mlog = e2e::ReadAll(miss_log);
  EXPECT_NE(mlog.find("no room 'attic' on this network; found:"), std::string::npos) << mlog;
  EXPECT_NE(mlog.find("room 'default' at " + join + "  server key " + server_fpr), std::string::npos) << mlog;

  // A forged announcement of serve's address under another key: the node takes the announced
  // fingerprint as the server key it requires, so the key serve really has is refused.
  Announcement forged;
  forged.room = "forged";
  forged.port = 8788;
  forged.fingerprint = net::Fingerprint(net::NewKeyPair().public_key);
  ForgedAnnouncer liar(ns.serve(), forged, kServeIp);
  const std::string fooled_log = (tmp / "fooled.log").string();
  Proc fooled = Proc::Spawn(Cat(ns.In(ns.node()), {e2e::Bin(), "node", "--room", "forged", "--discover-seconds", "3"}),
                            {home("fooled")}, fooled_log);
  EXPECT_NE(fooled.Wait(60), 0);
  const std::string flog = e2e::ReadAll(fooled_log);
  EXPECT_NE(flog.find("found room 'forged' at " + join + ", server key " + forged.fingerprint), std::string::npos)
      << flog;
  EXPECT_NE(flog.find("not the " + forged.fingerprint), std::string::npos) << flog;
  EXPECT_EQ(flog.find("waiting for the host to approve"), std::string::npos) << flog;

  node.Stop(SIGTERM);
  serve.Stop(SIGTERM);
  if (!HasFailure()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  } else {
    std::fprintf(stderr, "logs kept in %s\n", tmp.c_str());
  }
}

}  // namespace
}  // namespace daisy
