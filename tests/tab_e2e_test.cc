// Issue 15, item 1: the browser tab's ring member (tab::TabMember, the code the page's worker
// runs as wasm) in a ring with real processes on 127.0.0.1: `daisychain serve`, a native
// `node` and `run` as the head, and the tab as a native process (tab_native) whose only
// transport is serve's WebSocket link (DCL1). The run is VERIFIED with `generate`'s ids, the
// tab holds layers and its probe hash is the native one; killed mid-turn, the head replays
// without it.
#include <gtest/gtest.h>

#include <cinttypes>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "daisy/kernels.h"
#include "e2e_fixture.h"
#include "e2e_util.h"
#include "proc_util.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;
using e2e::Proc;

class TabTest : public e2e::RingFixture {
 protected:
  void StartServe() {
    serve_ = Proc::Spawn({e2e::Bin(), "serve", "--port", std::to_string(port_), "--auto-approve", "--name", "serve",
                          "--no-compute", "--models-dir", models_.string()},
                         Env("serve"), (tmp_ / "serve.log").string());
  }
  void StartNode(const std::vector<std::string>& env = {}) {
    procs_.push_back(Proc::Spawn({env.empty() ? e2e::Bin() : e2e::FaultyBin(), "node", "--join", Join(), "--name",
                                  "node-1", "--models-dir", models_.string()},
                                 Env("node-1", env), (tmp_ / "node-1.log").string()));
  }
  void StartTab(const std::vector<std::string>& env = {}) {
    procs_.push_back(Proc::Spawn({std::string(std::getenv("DAISY_BIN_DIR")) + "/tests/tab_native", "--port",
                                  std::to_string(port_), "--name", "tab-1", "--models-dir", models_.string()},
                                 Env("tab-1", env), (tmp_ / "tab-1.log").string()));
  }
  // Waits (bounded) until serve logs that each named device joined the room.
  void WaitForJoined(const std::vector<std::string>& names, double timeout_s = 20) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string log = e2e::ReadAll((tmp_ / "serve.log").string());
      bool all = true;
      for (const auto& n : names) {
        const size_t at = log.find("device " + n + " ");
        all = all && at != std::string::npos && log.find("joined room", at) != std::string::npos;
      }
      if (all) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    FAIL() << "not every device joined:\n"
           << e2e::ReadAll((tmp_ / "serve.log").string()) << "\ntab:\n"
           << e2e::ReadAll((tmp_ / "tab-1.log").string());
  }
};

TEST_F(TabTest, ATabHoldsLayersThroughTheLinkAndTheRunIsVerified) {
  StartServe();
  StartNode();
  StartTab();
  WaitForJoined({"node-1", "tab-1"});
  const std::string tiny = (models_ / "tiny30").string();
  const auto want = GenerateIds(tiny, "Once upon a time", 40);
  const std::string log = (tmp_ / "run.log").string();
  Proc run = Proc::Spawn({e2e::Bin(), "run", "--join", Join(), "--json", "--name", "head", "--model", tiny, "--prompt",
                          "Once upon a time", "-n", "40", "--verify", "--stages", "3"},
                         Env("head"), log);
  ASSERT_EQ(run.Wait(120), 0) << e2e::ReadAll(log) << "\ntab:\n" << e2e::ReadAll((tmp_ / "tab-1.log").string());
  const auto j = LastJson(e2e::ReadAll(log));
  ASSERT_TRUE(j.is_object()) << e2e::ReadAll(log);
  EXPECT_TRUE(j["verified"].get<bool>()) << e2e::ReadAll(log);
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), want);
  ASSERT_EQ(j["plan"].size(), 3u) << j["plan"].dump();
  bool tab_in_plan = false;
  for (const auto& s : j["plan"])
    if (s["device"] == "tab-1") {
      tab_in_plan = true;
      EXPECT_TRUE(s["relayed"].get<bool>());
      EXPECT_GT(s["layers"][1].get<int>(), s["layers"][0].get<int>());
    }
  EXPECT_TRUE(tab_in_plan) << j["plan"].dump();
  // The tab's hello carried the probe hash of this (native) build: the head admits only equal ones.
  const std::string tab_log = e2e::ReadAll((tmp_ / "tab-1.log").string());
  char probe[17];
  std::snprintf(probe, sizeof probe, "%016" PRIx64, static_cast<uint64_t>(kernels::ProbeHash()));
  EXPECT_NE(tab_log.find(std::string("\"probe_hash\":\"") + probe + "\""), std::string::npos) << tab_log;
  EXPECT_NE(tab_log.find("\"event\":\"slice\""), std::string::npos) << tab_log;
  EXPECT_EQ(tab_log.find("the link closed"), std::string::npos) << tab_log;
}

TEST_F(TabTest, ATabKilledMidTurnIsPlannedAroundAndTheTurnReplayed) {
  StartServe();
  StartNode({"DAISY_TEST_HOP_DELAY_MS=30"});
  StartTab({"DAISY_TEST_HOP_DELAY_MS=30"});
  WaitForJoined({"node-1", "tab-1"});
  const std::string tiny = (models_ / "tiny30").string();
  const auto want = GenerateIds(tiny, "Once upon a time", 80);
  const std::string log = (tmp_ / "run-kill.log").string();
  Proc run = Proc::Spawn({e2e::Bin(), "run", "--join", Join(), "--json", "--name", "head", "--model", tiny, "--prompt",
                          "Once upon a time", "-n", "80", "--stages", "3"},
                         Env("head"), log);
  // Killed once it holds its layers and the turn's hops are going (each slow: 30 ms a hop).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline &&
         e2e::ReadAll((tmp_ / "tab-1.log").string()).find("\"state\":\"holding\"") == std::string::npos)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  procs_[1].Stop(SIGKILL);  // the tab: in the first plan, as every device is
  ASSERT_EQ(run.Wait(120), 0) << e2e::ReadAll(log);
  const auto j = LastJson(e2e::ReadAll(log));
  ASSERT_TRUE(j.is_object()) << e2e::ReadAll(log);
  EXPECT_EQ(j["replays"], 1) << e2e::ReadAll(log);
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), want);
  ASSERT_EQ(j["plan"].size(), 2u) << j["plan"].dump();  // the head and the native node
  for (const auto& s : j["plan"]) EXPECT_NE(s["device"], "tab-1") << j["plan"].dump();
}

}  // namespace
}  // namespace daisy
