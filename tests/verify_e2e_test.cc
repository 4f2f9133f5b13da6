// Verify through the real binary: `daisychain serve` and `daisychain run --verify --json` as
// processes on 127.0.0.1, and one node in this process rigged (a test::TestNodeFaults)
// to flip the lowest mantissa bit of every hop's output. The ids survive the flips; `run`
// must still say MISMATCH, report where in its JSON, and exit with code 3.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "daisy/net.h"
#include "daisy/node.h"
#include "e2e_util.h"
#include "node_faults.h"
#include "proc_util.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;
using e2e::Proc;

TEST(VerifyE2eTest, RunOnARiggedRingSaysMismatchAndExitsWith3) {
  char tmpl[] = "/tmp/daisy_verify_e2e_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path tmp = tmpl;
  const int port = e2e::FreePort();
  const std::string join = "127.0.0.1:" + std::to_string(port);
  Proc serve = Proc::Spawn(
      {e2e::Bin(), "serve", "--port", std::to_string(port), "--auto-approve", "--no-compute", "--name", "serve"},
      {"DAISY_HOME=" + (tmp / "serve").string()}, (tmp / "serve.log").string());
  // The rigged node, in this process: it asks serve's HTTP API to be admitted, like any node.
  ::setenv("DAISY_HOME", (tmp / "node").c_str(), 1);
  auto rendezvous = net::JoinAddress(join);
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status().message();
  std::atomic<bool> stop{false};
  test::TestNodeFaults faults(/*flip_every=*/1, /*hop_delay_ms=*/0);
  std::thread node([&] {
    NodeOptions o;
    o.role = o.name = "node-rigged";
    o.rendezvous = *rendezvous;
    o.print_tokens = false;
    o.stop = &stop;
    o.faults = &faults;
    o.models_dirs = {e2e::Models()};
    o.hub.cache_dir = (tmp / "node" / "cache").string();
    Status st = RunNode(o);
    if (!st.ok()) std::fprintf(stderr, "node: %s\n", st.message().c_str());
  });
  const std::string log = (tmp / "run.log").string();
  // --stages 2 waits (up to 30 s) for the node to join; its hops come straight back to the head.
  Proc run = Proc::Spawn(
      {e2e::Bin(), "run", "--join", join, "--json", "--name", "head", "--model", e2e::Models() + "/stories260K",
       "--prompt", "Once upon a time", "-n", "40", "--stages", "2", "--verify"},
      {"DAISY_HOME=" + (tmp / "head").string()}, log);
  const int rc = run.Wait(90);
  stop = true;
  node.join();
  serve = Proc();
  const std::string out = e2e::ReadAll(log);
  EXPECT_EQ(rc, 3) << out;
  nlohmann::json j;
  const size_t brace = out.rfind("\n{");
  try {
    j = nlohmann::json::parse(brace == std::string::npos ? out : out.substr(brace + 1));
  } catch (...) {
  }
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["plan"].size(), 2u) << out;
  EXPECT_EQ(j["verified"], false) << out;
  // The node's second hop, the first decode step, is the first flipped row the head reads.
  const int n = static_cast<int>(j["prompt_ids"].size());
  EXPECT_EQ(j["mismatch_position"], n + 1) << out;
  ASSERT_TRUE(j["mismatch"].is_string()) << out;
  EXPECT_EQ(j["mismatch"].get<std::string>().rfind("ids equal", 0), 0u) << out;
  EXPECT_EQ(
      j["verify_message"].get<std::string>().rfind("MISMATCH: position " + std::to_string(n + 1) + " (ids equal", 0),
      0u)
      << out;
  // The ids are the single-device ids all the same.
  auto gen = e2e::RunCli("DAISY_HOME=" + (tmp / "gen").string(),
                         "generate --model " + e2e::Models() + "/stories260K --prompt 'Once upon a time' -n 40 --json",
                         tmp.string());
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_EQ(j["ids"], nlohmann::json::parse(gen.out)["ids"]);
  if (!HasFailure()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  } else {
    std::fprintf(stderr, "logs kept in %s\n", tmp.c_str());
  }
}

}  // namespace
}  // namespace daisy
