// The browser tab's link against a real `daisychain serve` process on 127.0.0.1: the tab's
// key is refused (4003) until it asks over HTTP (POST /api/join) and the host approves it
// in the UI's API; then the link comes up on serve's one port, the tab joins its room as
// relay://ID and gets the room's list; the UI and a plain GET of the link still answer.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "daisy/net.h"
#include "e2e_util.h"
#include "link_client.h"
#include "proc_util.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using e2e::Proc;
using testlink::LinkClient;

TEST(LinkE2E, ATabIsApprovedLikeANodeAndLinksThroughServesOnePort) {
  char tmpl[] = "/tmp/daisy_link_e2e_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path tmp = tmpl;
  const int port = e2e::FreePort();
  Proc serve = Proc::Spawn({e2e::Bin(), "serve", "--port", std::to_string(port), "--no-compute"},
                           {"DAISY_HOME=" + (tmp / "serve").string()}, (tmp / "serve.log").string());
  const std::string secret = e2e::AdminSecretFromLog((tmp / "serve.log").string());
  ASSERT_FALSE(secret.empty()) << e2e::ReadAll((tmp / "serve.log").string());
  httplib::Client cli("127.0.0.1", port);
  cli.set_default_headers({{"Cookie", "daisy_admin=" + secret}});  // the host's UI
  std::string server_key;
  for (int i = 0; i < 400 && server_key.empty(); ++i) {
    auto r = cli.Get("/api/key");
    if (r && r->status == 200) server_key = Json::parse(r->body)["public_key"];
    if (server_key.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(net::IsPublicKey(server_key));

  const net::KeyPair tab = net::NewKeyPair();
  {
    auto link = LinkClient::Open("127.0.0.1", port);
    ASSERT_TRUE(link.ok()) << link.status().message();
    EXPECT_FALSE((*link)->Handshake(tab, server_key).ok());
    EXPECT_EQ((*link)->close_code(), net::LinkCloseCode(net::LinkClose::kNotApproved)) << (*link)->close_reason();
  }
  // The page asks to join, as a native node does, and the host approves the fingerprint.
  auto asked =
      cli.Post("/api/join", Json{{"room", "default"}, {"public_key", tab.public_key}, {"name", "phone"}}.dump(),
               "application/json");
  ASSERT_TRUE(asked);
  EXPECT_EQ(Json::parse(asked->body).value("status", ""), "pending") << asked->body;
  Json pending;
  for (int i = 0; i < 100 && pending.is_null(); ++i) {
    auto r = cli.Get("/api/state");
    const Json state = r && r->status == 200 ? Json::parse(r->body) : Json::object();
    for (const auto& d : state.value("devices", Json::array()))
      if (d["name"] == "phone" && d["status"] == "pending") pending = d;
    if (pending.is_null()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(pending.is_null()) << cli.Get("/api/state")->body;
  EXPECT_EQ(pending["fingerprint"], net::Fingerprint(tab.public_key));
  auto approved = cli.Post("/api/approve", Json{{"id", pending["id"]}}.dump(), "application/json");
  ASSERT_TRUE(approved);
  ASSERT_EQ(approved->status, 200) << approved->body;

  auto link = LinkClient::Connect("127.0.0.1", port, tab, server_key);
  ASSERT_TRUE(link.ok()) << link.status().message();
  wire::Join join;
  join.room = "default";
  join.address = "relay://" + (*link)->id();
  join.hello.capabilities = wire::kCapRelayed | wire::kCapCompute;
  join.hello.device_id = (*link)->id();
  join.hello.name = "phone";
  ASSERT_TRUE((*link)->Send(wire::Message(join)).ok());
  bool listed = false;
  for (int i = 0; i < 100 && !listed; ++i) {
    auto in = (*link)->Receive(100);
    ASSERT_TRUE(in.ok()) << in.status().message();
    if (!in->has_value()) continue;
    if (const auto* peers = std::get_if<wire::Peers>(&**in))
      for (const auto& p : peers->peers) listed = listed || p.address == join.address;
  }
  EXPECT_TRUE(listed) << "the tab never saw itself in the room";

  auto plain = cli.Get("/api/link");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 426);
  auto page = cli.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  (*link)->Close();
  const std::string log = e2e::ReadAll((tmp / "serve.log").string());
  EXPECT_NE(log.find("link: tab " + net::Fingerprint(tab.public_key) + " is linked"), std::string::npos) << log;
  serve = Proc();
  if (!HasFailure()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
}

}  // namespace
}  // namespace daisy
