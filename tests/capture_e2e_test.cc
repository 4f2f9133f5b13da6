// A whole ring run captured on the loopback interface with tcpdump: the capture must hold
// neither a marker string of the prompt, nor the generated text, nor any activation's raw
// bytes, and every ZeroMQ handshake in it must be CURVE (none NULL). Real processes:
// `serve`, two `node`s and `run`; the head holds no layers (--plan 0,2,3), so its
// activations are exactly embedding rows, which the test reads from the model file.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "e2e_util.h"
#include "proc_util.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;
using e2e::Proc;

bool Contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

class CaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/daisy_capture_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    port_ = e2e::FreePort();
  }
  void TearDown() override {
    procs_.clear();
    if (!HasFailure()) {
      std::error_code ec;
      fs::remove_all(tmp_, ec);
    } else {
      std::fprintf(stderr, "capture and logs kept in %s\n", tmp_.c_str());
    }
  }
  std::vector<std::string> Env(const std::string& home) const { return {"DAISY_HOME=" + (tmp_ / home).string()}; }
  Proc& Spawn(const std::vector<std::string>& args, const std::string& home, const std::string& log) {
    procs_.push_back(Proc::Spawn(args, Env(home), (tmp_ / log).string()));
    return procs_.back();
  }
  bool WaitForLog(const std::string& log, const std::string& text, int tries = 200) {
    for (int i = 0; i < tries; ++i) {
      if (Contains(e2e::ReadAll((tmp_ / log).string()), text)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  // The first `n` bytes of the embedding row of `id` (F32 [vocab, hidden] at data offset 0).
  std::string EmbeddingBytes(int id, size_t n) const {
    const std::string file = e2e::ReadAll(e2e::Models() + "/stories260K/model.safetensors");
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<uint8_t>(file[static_cast<size_t>(i)]);
    auto meta = nlohmann::json::parse(file.substr(8, header));
    auto& e = meta["model.embed_tokens.weight"];
    EXPECT_EQ(e["dtype"], "F32");
    const size_t hidden = e["shape"][1].get<size_t>();
    const size_t at = 8 + header + e["data_offsets"][0].get<size_t>() + static_cast<size_t>(id) * hidden * 4;
    return file.substr(at, n);
  }

  void CaptureRingRun(const std::vector<std::string>& node1_args, nlohmann::json* out, std::string* capture);

  fs::path tmp_;
  int port_ = 0;
  std::vector<Proc> procs_;
};

// Captures a whole ring run, node-1 started with `node1_args`, and checks that the capture
// holds no plaintext; the run's JSON and the capture come back.
void CaptureTest::CaptureRingRun(const std::vector<std::string>& node1_args, nlohmann::json* out,
                                 std::string* capture) {
  ASSERT_EQ(::access("/usr/bin/tcpdump", X_OK), 0) << "tcpdump is missing: run scripts/install-deps.sh";
  const std::string pcap = (tmp_ / "ring.pcap").string();
  // Immediate mode and -U: every packet is written as it comes; -s 0: whole packets; -B: a
  // 64 MiB kernel buffer, so bursts on a busy machine are not dropped.
  Proc& dump =
      Spawn({"/usr/bin/tcpdump", "-i", "lo", "--immediate-mode", "-U", "-B", "65536", "-s", "0", "-w", pcap, "tcp"},
            "dump", "tcpdump.log");
  ASSERT_TRUE(WaitForLog("tcpdump.log", "listening on")) << e2e::ReadAll((tmp_ / "tcpdump.log").string());

  const std::string join = "127.0.0.1:" + std::to_string(port_);
  Spawn({e2e::Bin(), "serve", "--port", std::to_string(port_), "--auto-approve", "--no-compute", "--name", "serve"},
        "serve", "serve.log");
  std::vector<std::string> node1 = {e2e::Bin(), "node",   "--join",       join,
                                    "--name",   "node-1", "--models-dir", e2e::Models()};
  for (const auto& a : node1_args) node1.push_back(a);
  Spawn(node1, "node-1", "node-1.log");
  Spawn({e2e::Bin(), "node", "--join", join, "--name", "node-2", "--models-dir", e2e::Models()}, "node-2",
        "node-2.log");
  ASSERT_TRUE(WaitForLog("node-1.log", "in room")) << e2e::ReadAll((tmp_ / "node-1.log").string());
  ASSERT_TRUE(WaitForLog("node-2.log", "in room")) << e2e::ReadAll((tmp_ / "node-2.log").string());

  const std::string marker = "QZXV-marker-5512";
  const std::string prompt = "Once upon a time " + marker + " there was a cat";
  Proc run =
      Proc::Spawn({e2e::Bin(), "run", "--join", join, "--json", "--name", "head", "--model",
                   e2e::Models() + "/stories260K", "--prompt", prompt, "-n", "40", "--plan", "0,2,3", "--verify"},
                  Env("head"), (tmp_ / "run.log").string());
  ASSERT_EQ(run.Wait(120), 0) << e2e::ReadAll((tmp_ / "run.log").string());
  const std::string run_log = e2e::ReadAll((tmp_ / "run.log").string());
  const auto j = nlohmann::json::parse(run_log.substr(run_log.rfind("\n{") + 1));
  ASSERT_TRUE(j["verified"].get<bool>()) << run_log;
  ASSERT_EQ(j["plan"].size(), 3u);
  ASSERT_GT(j["ring_hops"].get<int>(), 0);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the last frames reach the capture
  dump.Stop(SIGINT);

  const std::string cap = e2e::ReadAll(pcap);
  ASSERT_GT(cap.size(), 24u) << "no capture";
  ASSERT_EQ(static_cast<uint8_t>(cap[0]), 0xd4) << "not a pcap file";  // little-endian magic a1b2c3d4
  // The capture saw the ring: ZeroMQ handshakes, and every one of them CURVE (a ZMTP 3
  // greeting names its mechanism in 20 bytes, zero-padded).
  EXPECT_TRUE(Contains(cap, std::string("CURVE") + std::string(15, '\0'))) << "no CURVE handshake in the capture";
  EXPECT_FALSE(Contains(cap, std::string("NULL") + std::string(16, '\0'))) << "a ZeroMQ link without encryption";
  // Nothing of the prompt, the text or the activations in the clear.
  EXPECT_FALSE(Contains(cap, marker)) << "the prompt's marker is in the capture";
  const std::string text = j["text"].get<std::string>();
  ASSERT_GE(text.size(), 16u);
  EXPECT_FALSE(Contains(cap, text)) << "the generated text is in the capture";
  EXPECT_FALSE(Contains(cap, text.substr(0, 16))) << "the generated text is in the capture";
  // The head holds no layers, so its first activations are the prompt's embedding rows.
  int found = 0;
  for (int id : j["prompt_ids"].get<std::vector<int>>())
    if (Contains(cap, EmbeddingBytes(id, 32))) ++found;
  EXPECT_EQ(found, 0) << found << " of the prompt's activation rows are in the capture";
  std::printf("capture: %zu bytes of loopback TCP searched\n", cap.size());
  *out = j;
  *capture = cap;
}

TEST_F(CaptureTest, ALoopbackCaptureOfARingRunHoldsNoPlaintext) {
  nlohmann::json j;
  std::string cap;
  CaptureRingRun({}, &j, &cap);
}

// Issue 15, item 2: node-1 accepts no connections, so its hops cross serve's relay, which
// ends one CurveZMQ link and starts the next. The capture still holds no plaintext (the
// relay's own view: src/ring/relay_test.cc), and it shows the relay link was used.
TEST_F(CaptureTest, ALoopbackCaptureOfARingRunThroughTheRelayHoldsNoPlaintext) {
  nlohmann::json j;
  std::string cap;
  CaptureRingRun({"--no-listen"}, &j, &cap);
  if (HasFatalFailure()) return;
  int relayed = 0;
  for (const auto& s : j["plan"]) relayed += s["relayed"].get<bool>() ? 1 : 0;
  EXPECT_EQ(relayed, 1) << j["plan"].dump();
  // node-1's link to the relay: its SOCKS5 CONNECT to the relay's name on serve's port.
  EXPECT_TRUE(Contains(cap, std::string("\x05\x01\x00\x03\x0b", 5) + "daisy-relay")) << "no relay link in the capture";
  EXPECT_NE(e2e::ReadAll((tmp_ / "serve.log").string()).find("is connected to the relay"), std::string::npos);
}

}  // namespace
}  // namespace daisy
