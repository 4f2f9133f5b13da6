// Tests only: the browser tab's ring member (tab::TabMember) as a native process, driven the
// way the page drives it in a browser: a small loop pumps one WebSocket to serve's
// /api/link (the native test link client, raw messages only: the handshake and every
// envelope are the tab's own), hands each message to the tab, sends what it gives back and
// ticks it. Its key is asked to be approved first (POST /api/join, as the page does), and
// its slice is read from a local folder under --models-dir (a browser reads the Hub by XHR).
// DAISY_TEST_HOP_DELAY_MS makes it a slow stage (kill tests). Events go to stderr, one JSON
// object a line. Stops on SIGTERM/SIGINT with a bye.
//   tab_native --port P --name N [--room R] --models-dir DIR
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "daisy/ring.h"
#include "daisy/tab.h"
#include "link_client.h"
#include "node_faults.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int /*signal*/) {
  g_stop = 1;
}
}  // namespace

namespace daisy {
namespace {

int Main(int argc, char** argv) {
  std::string room = "default", name = "tab", models_dir;
  int port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--port")
      port = std::stoi(v);
    else if (k == "--name")
      name = v;
    else if (k == "--room")
      room = v;
    else if (k == "--models-dir")
      models_dir = v;
  }
  if (port <= 0 || models_dir.empty()) {
    std::fprintf(stderr, "usage: tab_native --port P --name N [--room R] --models-dir DIR\n");
    return 2;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  auto keys = DeviceKeys(DeviceHome(), "tab");
  if (!keys.ok()) {
    std::fprintf(stderr, "tab: %s\n", keys.status().message().c_str());
    return 1;
  }
  // The page's POST /api/join: the link is refused until the host approved the key.
  JoinOptions jo;
  jo.rendezvous = "tcp://127.0.0.1:" + std::to_string(port);
  jo.room = room;
  jo.name = name;
  jo.home = DeviceHome();
  jo.unreachable_timeout_s = 20;
  auto server_key = AwaitAdmission(jo, *keys);
  if (!server_key.ok()) {
    std::fprintf(stderr, "tab: %s\n", server_key.status().message().c_str());
    return 1;
  }
  auto faults = test::TestNodeFaults::FromEnvironment();
  tab::TabOptions o;
  o.keys = *keys;
  o.server_key = *server_key;
  o.room = room;
  o.name = name;
  o.budget = MemoryBudget(std::nullopt);
  o.faults = faults.get();
  o.open_model = [models_dir](const std::string& model_id, const std::string&) -> Result<std::unique_ptr<ModelSource>> {
    // Only under the allowed folder, as a node with --models-dir.
    std::error_code ec;
    const auto real = std::filesystem::canonical(model_id, ec).string();
    const auto dir = std::filesystem::canonical(models_dir, ec).string();
    if (model_id.empty() || real.rfind(dir + "/", 0) != 0)
      return PermissionDenied("tab_native opens only folders under --models-dir, not " + model_id);
    return OpenLocalFolder(real);
  };
  auto member = tab::TabMember::Create(std::move(o));
  if (!member.ok()) {
    std::fprintf(stderr, "tab: %s\n", member.status().message().c_str());
    return 1;
  }
  tab::TabMember& t = **member;
  auto link = testlink::LinkClient::Open("127.0.0.1", port);
  if (!link.ok()) {
    std::fprintf(stderr, "tab: %s\n", link.status().message().c_str());
    return 1;
  }
  auto flush = [&] {
    for (const auto& e : t.TakeEvents()) std::fprintf(stderr, "tab event %s\n", e.c_str());
    for (const auto& m : t.TakeOutgoing()) {
      if (Status st = (*link)->SendRaw(m); !st.ok()) return st;
    }
    return Status::Ok();
  };
  int rc = 0;
  while (!g_stop) {  // bounded by the signal, or by serve closing the link
    auto in = (*link)->ReceiveRaw(100);
    if (!in.ok()) {
      std::fprintf(stderr, "tab: the link closed: %s (code %d: %s)\n", in.status().message().c_str(),
                   (*link)->close_code(), (*link)->close_reason().c_str());
      rc = 1;
      break;
    }
    if (*in) {
      if (Status st = t.Receive(**in); !st.ok()) {
        std::fprintf(stderr, "tab: closing the link: %s\n", st.message().c_str());
        (void)flush();
        (*link)->Close(net::LinkCloseCode(net::LinkClose::kRefusedEnvelope), "the tab refused a message");
        return 1;
      }
    }
    t.Tick();
    if (Status st = flush(); !st.ok()) {
      std::fprintf(stderr, "tab: %s\n", st.message().c_str());
      rc = 1;
      break;
    }
  }
  t.Leave();
  (void)flush();
  (*link)->Close();
  return rc;
}

}  // namespace
}  // namespace daisy

int main(int argc, char** argv) {
  return daisy::Main(argc, argv);
}
