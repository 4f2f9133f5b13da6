// `daisychain serve` end to end with real processes and real sockets on 127.0.0.1: a serve
// with the bundled model loaded at start and one node joined through the public port (the
// port mux), then the HTTP surface of docs/HTTP.md through an httplib client.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "daisy/net.h"
#include "e2e_util.h"
#include "model_maker.h"
#include "proc_util.h"
#include "test_hub.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;
using e2e::Proc;
using Json = nlohmann::json;

std::string Stories() {
  return e2e::Models() + "/stories260K";
}
const char* kPrompt = "Once upon a time";

// One serve and one node for the whole suite: every test talks to the same server.
// Polls the UI's /api/state (30 s at most) until a model is loaded and the device `name`
// is approved.
bool ModelLoadedAndApproved(httplib::Client& cli, const std::string& name) {
  for (int i = 0; i < 600; ++i) {
    auto s = cli.Get("/api/state");
    if (s && s->status == 200) {
      Json state = Json::parse(s->body, nullptr, false);
      if (state.is_object() && state["model"].is_object())
        for (const auto& d : state["devices"])
          if (d["name"] == name && d["status"] == "approved") return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/daisy_server_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    port_ = e2e::FreePort();
    serve_ = new Proc(Proc::Spawn({e2e::Bin(), "serve", "--port", std::to_string(port_), "--auto-approve", "--name",
                                   "serve", "--model", Stories()},
                                  {"DAISY_HOME=" + (tmp_ / "serve").string()}, (tmp_ / "serve.log").string()));
    node_ = new Proc(Proc::Spawn({e2e::Bin(), "node", "--join", "127.0.0.1:" + std::to_string(port_), "--name",
                                  "node-1", "--models-dir", e2e::Models()},
                                 {"DAISY_HOME=" + (tmp_ / "node").string()}, (tmp_ / "node.log").string()));
    secret_ = e2e::AdminSecretFromLog((tmp_ / "serve.log").string());
    ASSERT_FALSE(secret_.empty()) << "serve printed no UI URL with its secret: "
                                  << e2e::ReadAll((tmp_ / "serve.log").string());
    // Ready when the model is listed and the node has joined through the mux.
    for (int i = 0; i < 600; ++i) {
      auto cli = Client();
      auto m = cli.Get("/v1/models");
      auto s = cli.Get("/api/state");
      if (m && m->status == 200 && s && s->status == 200) {
        Json models = Json::parse(m->body, nullptr, false);
        Json state = Json::parse(s->body, nullptr, false);
        bool node_in = false;
        if (state.is_object())
          for (const auto& d : state["devices"]) node_in = node_in || d["name"] == "node-1";
        if (models.is_object() && models["data"].size() == 1 && node_in) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    FAIL() << "serve never became ready: " << e2e::ReadAll((tmp_ / "serve.log").string());
  }
  static void TearDownTestSuite() {
    delete node_;
    if (serve_) {
      serve_->Stop(SIGINT);
      delete serve_;
    }
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }

  // The host's client: it sends the admin cookie that the printed URL sets.
  static httplib::Client Client() {
    httplib::Client cli("127.0.0.1", port_);
    cli.set_read_timeout(60, 0);
    cli.set_default_headers({{"Cookie", "daisy_admin=" + secret_}});
    return cli;
  }
  static std::pair<int, Json> PostJson(const std::string& path, const std::string& body) {
    auto r = Client().Post(path.c_str(), body, "application/json");
    if (!r) return {-1, Json()};
    return {r->status, Json::parse(r->body, nullptr, false)};
  }
  // POSTs and reads the whole event stream; `stop_after_bytes` > 0 hangs up early.
  static std::pair<int, std::string> PostStream(const std::string& path, const std::string& body,
                                                size_t stop_after_bytes = 0) {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body;
    req.set_header("Content-Type", "application/json");
    std::string got;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      got.append(data, n);
      return stop_after_bytes == 0 || got.size() < stop_after_bytes;
    };
    auto cli = Client();
    auto r = cli.send(req);
    return {r ? r->status : -1, got};
  }
  struct Event {
    std::string name;
    Json data;
  };
  static std::vector<Event> ParseEvents(const std::string& stream) {
    std::vector<Event> out;
    size_t at = 0;
    while (at < stream.size()) {
      size_t end = stream.find("\n\n", at);
      if (end == std::string::npos) break;
      const std::string block = stream.substr(at, end - at);
      at = end + 2;
      Event e;
      std::string data;
      size_t line_at = 0;
      while (line_at < block.size()) {
        size_t nl = block.find('\n', line_at);
        if (nl == std::string::npos) nl = block.size();
        const std::string line = block.substr(line_at, nl - line_at);
        line_at = nl + 1;
        if (line.rfind("event: ", 0) == 0) e.name = line.substr(7);
        if (line.rfind("data: ", 0) == 0) data = line.substr(6);
      }
      if (data.empty()) continue;  // a comment (": ping")
      e.data = data == "[DONE]" ? Json("[DONE]") : Json::parse(data, nullptr, false);
      out.push_back(std::move(e));
    }
    return out;
  }
  // `daisychain generate --json` on one device.
  static Json Generate(const std::string& prompt, int n) {
    auto r =
        e2e::RunCli("DAISY_HOME=" + (tmp_ / "gen").string(),
                    "generate --model " + Stories() + " --prompt '" + prompt + "' -n " + std::to_string(n) + " --json",
                    tmp_.string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return Json::parse(r.out, nullptr, false);
  }
  // The completion part of generate's text (it starts with the prompt).
  static std::string GeneratedCompletion(const std::string& prompt, int n) {
    Json g = Generate(prompt, n);
    const std::string text = g["text"].get<std::string>();
    EXPECT_EQ(text.rfind(prompt, 0), 0u) << text;
    return text.substr(prompt.size());
  }

  static fs::path tmp_;
  static std::string secret_;
  static int port_;
  static Proc* serve_;
  static Proc* node_;
};
fs::path ServerTest::tmp_;
std::string ServerTest::secret_;
int ServerTest::port_ = 0;
Proc* ServerTest::serve_ = nullptr;
Proc* ServerTest::node_ = nullptr;

TEST_F(ServerTest, ModelsListsTheLoadedModel) {
  auto r = Client().Get("/v1/models");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  Json j = Json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_NE(j["data"][0]["id"].get<std::string>().find("stories260K"), std::string::npos);
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["owned_by"], "daisychain");
}

TEST_F(ServerTest, GreedyCompletionIsTheTextOfGenerate) {
  auto [status, j] =
      PostJson("/v1/completions", Json{{"prompt", kPrompt}, {"max_tokens", 30}, {"temperature", 0}}.dump());
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], GeneratedCompletion(kPrompt, 30));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);  // [1, 403, 407, 261, 378]
  EXPECT_EQ(j["usage"]["completion_tokens"], 30);
  EXPECT_EQ(j["usage"]["total_tokens"], 35);
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
}

TEST_F(ServerTest, StreamedCompletionHasTheSameTextAndEndsWithDone) {
  auto [status, stream] = PostStream("/v1/completions", Json{{"prompt", kPrompt},
                                                             {"max_tokens", 30},
                                                             {"temperature", 0},
                                                             {"stream", true},
                                                             {"stream_options", {{"include_usage", true}}}}
                                                            .dump());
  ASSERT_EQ(status, 200);
  auto events = ParseEvents(stream);
  ASSERT_GE(events.size(), 3u) << stream;
  EXPECT_EQ(events.back().data, "[DONE]") << stream;
  std::string text, finish;
  Json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json& c = events[i].data;
    ASSERT_TRUE(c.is_object()) << stream;
    EXPECT_EQ(c["object"], "text_completion");
    if (c.contains("usage")) {
      usage = c["usage"];
      continue;
    }
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, GeneratedCompletion(kPrompt, 30));
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage["completion_tokens"], 30);
}

TEST_F(ServerTest, StopStringsEndTheTurnAndAreCutFromTheText) {
  const std::string full = GeneratedCompletion(kPrompt, 40);
  const size_t at = full.find("Lily");
  ASSERT_NE(at, std::string::npos) << "the story changed: " << full;
  auto [status, j] = PostJson(
      "/v1/completions", Json{{"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 0}, {"stop", {"Lily"}}}.dump());
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["text"], full.substr(0, at));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(j["usage"]["completion_tokens"].get<int>(), 40);
  // Streamed: no piece of the stop string leaks out before it is recognised.
  auto [s2, stream] = PostStream(
      "/v1/completions",
      Json{{"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 0}, {"stop", "Lily"}, {"stream", true}}.dump());
  ASSERT_EQ(s2, 200);
  std::string text;
  for (const auto& e : ParseEvents(stream))
    if (e.data.is_object()) text += e.data["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, full.substr(0, at));
}

TEST_F(ServerTest, JsonObjectResponsesParse) {
  for (int max_tokens : {12, 40}) {
    auto [status, j] = PostJson("/v1/completions", Json{{"prompt", kPrompt},
                                                        {"max_tokens", max_tokens},
                                                        {"temperature", 0},
                                                        {"response_format", {{"type", "json_object"}}}}
                                                       .dump());
    ASSERT_EQ(status, 200) << j.dump();
    const std::string text = j["choices"][0]["text"];
    Json parsed = Json::parse(text, nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << max_tokens << " tokens: " << text;
    EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), max_tokens);
  }
}

TEST_F(ServerTest, BadRequestsGetOpenAIShapedErrors) {
  auto expect_error = [](int status, const Json& j, int want_status, const std::string& param) {
    EXPECT_EQ(status, want_status) << j.dump();
    ASSERT_TRUE(j.is_object() && j.contains("error")) << j.dump();
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("param") && j["error"].contains("code"));
    if (param.empty())
      EXPECT_TRUE(j["error"]["param"].is_null()) << j.dump();
    else
      EXPECT_EQ(j["error"]["param"], param) << j.dump();
  };
  {
    auto [s, j] = PostJson("/v1/completions", R"({"prompt": "x", "n": 2})");
    expect_error(s, j, 400, "n");
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
  {
    auto [s, j] = PostJson("/v1/completions", R"({"prompt": "x", "max_tokens": "ten"})");
    expect_error(s, j, 400, "max_tokens");
  }
  {
    auto [s, j] = PostJson("/v1/completions", "{not json");
    expect_error(s, j, 400, "");
  }
  {
    auto [s, j] = PostJson("/v1/completions", R"({"prompt": "x", "model": "someone/else"})");
    expect_error(s, j, 404, "model");
    EXPECT_EQ(j["error"]["code"], "model_not_found");
  }
  {
    // A prompt longer than the context (512 positions).
    std::string longp;
    for (int i = 0; i < 600; ++i) longp += "Once upon a time ";
    auto [s, j] = PostJson("/v1/completions", Json{{"prompt", longp}, {"max_tokens", 1}}.dump());
    expect_error(s, j, 400, "prompt");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("context"), std::string::npos) << j.dump();
  }
  {
    // stories260K has no chat template: chat is refused, naming that.
    auto [s, j] = PostJson("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})");
    expect_error(s, j, 400, "messages");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("chat template"), std::string::npos) << j.dump();
  }
  {
    auto r = Client().Get("/v1/nothing");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
    EXPECT_TRUE(Json::parse(r->body, nullptr, false).contains("error"));
  }
}

TEST_F(ServerTest, ApplyTemplateIsRefusedForAModelWithoutOne) {
  auto [s, j] = PostJson("/apply-template", R"({"messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(s, 400) << j.dump();
  EXPECT_NE(j["error"]["message"].get<std::string>().find("chat template"), std::string::npos) << j.dump();
}

TEST_F(ServerTest, LoadingABadPathGivesAClearErrorAndKeepsTheModel) {
  const std::string bad = (tmp_ / "no-such-model").string();
  auto [s, j] = PostJson("/api/load", Json{{"model", bad}}.dump());
  EXPECT_EQ(s, 400) << j.dump();
  ASSERT_TRUE(j.contains("error")) << j.dump();
  EXPECT_NE(j["error"]["message"].get<std::string>().find(bad), std::string::npos) << j.dump();
  auto r = Client().Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(Json::parse(r->body)["data"].size(), 1u);
}

TEST_F(ServerTest, StateHasTheDocumentedShape) {
  auto r = Client().Get("/api/state");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  Json j = Json::parse(r->body);
  EXPECT_EQ(j["room"], "default");
  auto key = Client().Get("/api/key");
  ASSERT_TRUE(key);
  ASSERT_EQ(key->status, 200);
  const std::string fpr = Json::parse(key->body)["fingerprint"];
  EXPECT_EQ(fpr.size(), 19u);
  // Where browser tabs fetch their layers: serve's HF_ENDPOINT, or the public Hub.
  const char* hf = std::getenv("HF_ENDPOINT");
  EXPECT_EQ(Json::parse(key->body)["hub_endpoint"], hf && *hf ? hf : "https://huggingface.co");
  EXPECT_EQ(j["join_url"], "");  // on 127.0.0.1: the UI links its own origin's /join
  EXPECT_EQ(j["join"],
            "daisychain node --join 127.0.0.1:" + std::to_string(port_) + " --room default --server-key " + fpr);
  EXPECT_EQ(j["auto_approve"], true);
  EXPECT_FALSE(j["busy"].get<bool>());
  EXPECT_EQ(j["queue"], 0);
  int heads = 0;
  bool node = false;
  for (const auto& d : j["devices"]) {
    for (const char* k : {"id", "short", "fingerprint", "name", "status", "is_head", "backend", "gemms_per_s",
                          "free_memory", "probe", "compute"})
      EXPECT_TRUE(d.contains(k)) << k << " in " << d.dump();
    heads += d["is_head"].get<bool>() ? 1 : 0;
    if (d["name"] == "node-1") {
      node = true;
      EXPECT_EQ(d["status"], "approved");
      EXPECT_EQ(d["probe"], "ok");
      EXPECT_TRUE(d["compute"].get<bool>());
    }
  }
  EXPECT_EQ(heads, 1);
  EXPECT_TRUE(node);
  const Json& m = j["model"];
  ASSERT_TRUE(m.is_object()) << j.dump();
  EXPECT_EQ(m["architecture"], "LlamaForCausalLM");
  EXPECT_EQ(m["n_layers"], 5);
  EXPECT_EQ(m["vocab"], 512);
  EXPECT_EQ(m["ctx"], 512);
  EXPECT_EQ(m["has_chat_template"], false);
  const Json& p = j["plan"];
  ASSERT_TRUE(p.is_object()) << j.dump();
  ASSERT_FALSE(p["stages"].empty());
  EXPECT_EQ(p["stages"][0]["first"], 0);
  EXPECT_EQ(p["stages"].back()["end"], 5);
  EXPECT_TRUE(p["fits"].get<bool>());
}

TEST_F(ServerTest, UiGenerateStreamsTokensThenDoneWithTheIdsOfGenerate) {
  auto [status, stream] = PostStream("/api/generate", Json{{"prompt", kPrompt}, {"max_tokens", 20}}.dump());
  ASSERT_EQ(status, 200);
  auto events = ParseEvents(stream);
  ASSERT_FALSE(events.empty());
  int tokens = 0;
  std::string text;
  for (const auto& e : events) {
    if (e.name == "token") {
      ++tokens;
      text += e.data["text"].get<std::string>();
    }
    EXPECT_NE(e.name, "error") << e.data.dump();
  }
  EXPECT_EQ(tokens, 20);
  ASSERT_EQ(events.back().name, "done") << stream;
  const Json& d = events.back().data;
  Json g = Generate(kPrompt, 20);
  EXPECT_EQ(d["ids"], g["ids"]);
  EXPECT_EQ(d["prompt_ids"], Json::array({1, 403, 407, 261, 378}));
  EXPECT_EQ(d["text"], text);
  EXPECT_EQ(std::string(kPrompt) + text, g["text"].get<std::string>());
  EXPECT_EQ(d["finish_reason"], "length");
  for (const char* k : {"tokens_per_s", "prefill_ms", "decode_ms", "ring_hops", "stages", "replays", "verified"})
    EXPECT_TRUE(d.contains(k)) << k;
}

TEST_F(ServerTest, UiGenerateSplitOverTheJoinedNodeIsVerified) {
  // The node joined through the public port; a split over it (head + node) runs real laps.
  auto [status, stream] = PostStream(
      "/api/generate", Json{{"prompt", kPrompt}, {"max_tokens", 20}, {"stages", 2}, {"verify", true}}.dump());
  ASSERT_EQ(status, 200);
  auto events = ParseEvents(stream);
  ASSERT_FALSE(events.empty());
  ASSERT_EQ(events.back().name, "done") << stream;
  const Json& d = events.back().data;
  EXPECT_EQ(d["ids"], Generate(kPrompt, 20)["ids"]);
  ASSERT_EQ(d["stages"].size(), 2u) << d.dump();
  EXPECT_EQ(d["stages"][1]["name"], "node-1");
  EXPECT_GT(d["ring_hops"].get<int>(), 0);
  EXPECT_EQ(d["verified"], true) << d.dump();
}

TEST_F(ServerTest, EventsStreamStartsWithTheState) {
  std::string got;
  auto cli = Client();
  auto r = cli.Get("/api/events", [&](const char* data, size_t n) {
    got.append(data, n);
    return got.find("\n\n") == std::string::npos;  // hang up after the first event
  });
  ASSERT_EQ(got.rfind("event: state\ndata: ", 0), 0u) << got;
  Json state = Json::parse(got.substr(got.find("data: ") + 6, got.find("\n\n") - got.find("data: ") - 6));
  EXPECT_EQ(state["room"], "default");
}

// What the room sees reaches the UI: a head from another terminal (`daisychain run`) runs a
// turn that stays on it; serve's own device is outside that turn, and /api/events carries the
// turn's text as that device received it (room_text), equal to the head's.
TEST_F(ServerTest, TheRoomsStreamReachesTheUi) {
  std::mutex mu;
  std::string got;
  std::atomic<bool> stop{false};
  std::thread listen([&] {
    auto cli = Client();
    cli.Get("/api/events", [&](const char* data, size_t n) {
      std::lock_guard<std::mutex> lock(mu);
      got.append(data, n);
      return !stop.load();
    });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto r = e2e::RunCli("DAISY_HOME=" + (tmp_ / "other-head").string(),
                       "run --join 127.0.0.1:" + std::to_string(port_) + " --name other-head --model " + Stories() +
                           " --prompt 'The little dog' -n 24 --json",
                       tmp_.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string want = Json::parse(r.out.substr(r.out.rfind("\n{") + 1))["text"];
  std::string text;
  bool ended = false;
  for (int i = 0; i < 200 && !ended; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    text.clear();
    std::string stream;
    {
      std::lock_guard<std::mutex> lock(mu);
      stream = got.substr(0, got.rfind("\n\n") == std::string::npos ? 0 : got.rfind("\n\n") + 2);
    }
    bool begun = false;
    for (const auto& e : ParseEvents(stream)) {
      if (e.name != "room_text" || e.data["head"] != "other-head") continue;
      const std::string kind = e.data["kind"];
      if (kind == "begin") begun = true;
      if (kind == "piece" && begun) text += e.data["text"].get<std::string>();
      if (kind == "end" && begun) {
        text += e.data["text"].get<std::string>();
        ended = true;
        EXPECT_EQ(e.data["index"], 24);
      }
    }
  }
  stop = true;
  listen.join();
  ASSERT_TRUE(ended) << got.substr(0, 4000);
  EXPECT_EQ(text, want);
}

TEST_F(ServerTest, ConcurrentRequestsQueueAndAllGetTheirAnswer) {
  const std::string want = GeneratedCompletion(kPrompt, 25);
  std::vector<std::thread> threads;
  std::vector<Json> answers(4);
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      answers[i] =
          PostJson("/v1/completions", Json{{"prompt", kPrompt}, {"max_tokens", 25}, {"temperature", 0}}.dump()).second;
    });
  for (auto& t : threads) t.join();
  for (const auto& a : answers) {
    ASSERT_TRUE(a.is_object() && a.contains("choices")) << a.dump();
    EXPECT_EQ(a["choices"][0]["text"], want);
  }
}

TEST_F(ServerTest, AClientThatHangsUpDoesNotLeaveTheRingStuck) {
  // Hang up after the first bytes of a long turn; the next request is served.
  auto [s, partial] = PostStream("/api/generate", Json{{"prompt", kPrompt}, {"max_tokens", 400}}.dump(), 1);
  EXPECT_FALSE(partial.empty());
  auto [status, j] =
      PostJson("/v1/completions", Json{{"prompt", kPrompt}, {"max_tokens", 5}, {"temperature", 0}}.dump());
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["text"], GeneratedCompletion(kPrompt, 5));
  auto r = Client().Get("/api/state");
  ASSERT_TRUE(r);
  EXPECT_EQ(Json::parse(r->body)["queue"], 0);
}

TEST_F(ServerTest, TheWebUiIsServed) {
  auto r = Client().Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(r->body.find("<html"), std::string::npos);
  auto js = Client().Get("/app.js");
  ASSERT_TRUE(js);
  EXPECT_EQ(js->status, 200);
}

// Every regular file under `dir` that holds `needle` (none, when a secret stayed out of them).
std::vector<std::string> FilesHolding(const fs::path& dir, const std::string& needle) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file() && e2e::ReadAll(it->path().string()).find(needle) != std::string::npos)
      found.push_back(it->path().string());
  return found;
}

// The UI asks for a Hub token only when the Hub refused a load for want of one: a gated repo
// of the test Hub fails with "needs a Hugging Face token" (code hub_token_required); after
// POST /api/hub-token it loads and a turn fetches the head's layers with it; after Forget it
// fails again. The token is never echoed, needs the admin secret, and appears in no log (serve's
// or a node's in the room) and no file under either DAISY_HOME.
TEST(ServeHubToken, AGatedModelLoadsWithTheTokenGivenInTheUiAndNotAfterForget) {
  char tmpl[] = "/tmp/daisy_serve_token_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path tmp = tmpl;
  fs::create_directories(tmp / "repos/acme");
  fs::copy(Stories(), tmp / "repos/acme/gated", fs::copy_options::recursive);
  auto hub = testing::TestHub::Start((tmp / "repos").string());
  ASSERT_TRUE(hub.ok()) << hub.status().message();
  const std::string token = "hf_UiGivenToken" + std::to_string(::getpid()) + "x7Q";
  (*hub)->Gate("acme/gated");
  (*hub)->SetToken(token);
  const int port = e2e::FreePort();
  // No token from this environment: only the UI's.
  auto env = [&](const std::string& home) {
    return std::vector<std::string>{"DAISY_HOME=" + (tmp / home).string(), "HF_ENDPOINT=" + (*hub)->endpoint(),
                                    "HF_TOKEN=", "HF_HOME=" + (tmp / home / "hf").string(),
                                    "HF_TOKEN_PATH=" + (tmp / home / "no-token").string()};
  };
  Proc serve = Proc::Spawn({e2e::Bin(), "serve", "--port", std::to_string(port), "--auto-approve", "--name", "serve",
                            "--admin-secret-file", (tmp / "secret").string()},
                           env("serve"), (tmp / "serve.log").string());
  Proc node = Proc::Spawn({e2e::Bin(), "node", "--join", "127.0.0.1:" + std::to_string(port), "--name", "node-1"},
                          env("node"), (tmp / "node.log").string());
  const std::string secret = e2e::AdminSecretFromLog((tmp / "serve.log").string());
  ASSERT_FALSE(secret.empty()) << e2e::ReadAll((tmp / "serve.log").string());
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  cli.set_default_headers({{"Cookie", "daisy_admin=" + secret}});
  auto post = [&](const std::string& path, const Json& body) {
    auto r = cli.Post(path.c_str(), body.dump(), "application/json");
    return std::pair<int, std::string>{r ? r->status : -1, r ? r->body : ""};
  };
  auto token_set = [&] {
    auto r = cli.Get("/api/hub-token");
    EXPECT_TRUE(r && r->status == 200);
    EXPECT_EQ(r->body.find(token), std::string::npos);
    return r ? Json::parse(r->body, nullptr, false)["set"] == true : false;
  };
  for (int i = 0; i < 400 && !cli.Get("/api/state"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));

  // Without a token: the Hub's 401, said as such.
  auto [s1, b1] = post("/api/load", {{"model", "acme/gated"}});
  EXPECT_EQ(s1, 400) << b1;
  EXPECT_EQ(Json::parse(b1, nullptr, false)["error"]["code"], "hub_token_required") << b1;
  EXPECT_NE(b1.find("needs a Hugging Face token"), std::string::npos) << b1;
  EXPECT_FALSE(token_set());
  // Strangers cannot give one; a malformed one is refused without being repeated.
  {
    httplib::Client stranger("127.0.0.1", port);
    auto r = stranger.Post("/api/hub-token", Json{{"token", token}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << r->body;
    EXPECT_FALSE(token_set());
  }
  auto [s2, b2] = post("/api/hub-token", {{"token", "hf_has a space"}});
  EXPECT_EQ(s2, 400);
  EXPECT_EQ(b2.find("has a space"), std::string::npos) << b2;
  // With the token: it loads, and a turn fetches the head's layers with it.
  auto [s3, b3] = post("/api/hub-token", {{"token", token}});
  EXPECT_EQ(s3, 200) << b3;
  EXPECT_EQ(b3.find(token), std::string::npos);
  EXPECT_TRUE(token_set());
  auto [s4, b4] = post("/api/load", {{"model", "acme/gated"}});
  ASSERT_EQ(s4, 200) << b4;
  ASSERT_TRUE(ModelLoadedAndApproved(cli, "node-1"));  // a device of the room during the turn
  auto gen =
      cli.Post("/api/generate", Json{{"prompt", "Once upon a time"}, {"max_tokens", 12}}.dump(), "application/json");
  ASSERT_TRUE(gen);
  EXPECT_NE(gen->body.find("event: done"), std::string::npos) << gen->body;
  // Forgotten: the next load is refused again.
  auto [s5, b5] = post("/api/hub-token/forget", Json::object());
  EXPECT_EQ(s5, 200) << b5;
  EXPECT_FALSE(token_set());
  auto [s6, b6] = post("/api/load", {{"model", "acme/gated"}});
  EXPECT_EQ(s6, 400) << b6;
  EXPECT_EQ(Json::parse(b6, nullptr, false)["error"]["code"], "hub_token_required") << b6;

  for (int i = 0; i < 100 && e2e::ReadAll((tmp / "node.log").string()).find("--- end of the turn") == std::string::npos;
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  serve.Stop(SIGINT);
  node.Stop(SIGINT);
  // The Hub let the token through (only the right one opens the gate), and it is nowhere else.
  int opened = 0;
  for (const auto& r : (*hub)->requests()) opened += r.had_auth && r.status / 100 == 2 ? 1 : 0;
  EXPECT_GT(opened, 0);
  for (const char* log : {"serve.log", "node.log"}) {
    const std::string text = e2e::ReadAll((tmp / log).string());
    EXPECT_EQ(text.find(token), std::string::npos) << log << ": " << text;
  }
  EXPECT_NE(e2e::ReadAll((tmp / "node.log").string()).find("--- text of a turn"), std::string::npos)
      << "the node was in the room during the turn";
  EXPECT_TRUE(FilesHolding(tmp / "serve", token).empty());
  EXPECT_TRUE(FilesHolding(tmp / "node", token).empty());
  std::error_code ec;
  if (!::testing::Test::HasFailure()) fs::remove_all(tmp, ec);
}

TEST(ServeCommand, StartsWithoutAModelAndStopsCleanlyOnCtrlC) {
  char tmpl[] = "/tmp/daisy_serve_stop_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path tmp = tmpl;
  const int port = e2e::FreePort();
  Proc serve = Proc::Spawn({e2e::Bin(), "serve", "--port", std::to_string(port), "--no-compute"},
                           {"DAISY_HOME=" + (tmp / "home").string()}, (tmp / "serve.log").string());
  bool up = false;
  for (int i = 0; i < 400 && !up; ++i) {
    httplib::Client cli("127.0.0.1", port);
    auto r = cli.Get("/v1/models");
    up = r && r->status == 200;
    if (up) {
      EXPECT_TRUE(Json::parse(r->body)["data"].empty());  // no model yet
      auto c = cli.Post("/v1/completions", R"({"prompt": "x"})", "application/json");
      ASSERT_TRUE(c);
      EXPECT_EQ(c->status, 503);
      EXPECT_EQ(Json::parse(c->body)["error"]["code"], "model_not_loaded");
    }
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(up) << e2e::ReadAll((tmp / "serve.log").string());
  const std::string log = e2e::ReadAll((tmp / "serve.log").string());
  EXPECT_NE(log.find("web UI: http://127.0.0.1:" + std::to_string(port) + "/"), std::string::npos) << log;
  EXPECT_NE(log.find("daisychain node --join 127.0.0.1:" + std::to_string(port)), std::string::npos) << log;
  ::kill(serve.pid(), SIGINT);
  EXPECT_EQ(serve.Wait(15), 0) << e2e::ReadAll((tmp / "serve.log").string());
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

// Joining by approved keys: a device waits, shows its fingerprint, gets nothing until the
// host approves that fingerprint (the UI's Approve sends the id /api/state lists); a wrong
// --server-key is refused; `serve --approve FPR` admits a known device up front.
TEST(ServeJoin, ADeviceWaitsWithItsFingerprintUntilTheHostApprovesIt) {
  char tmpl[] = "/tmp/daisy_serve_join_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path tmp = tmpl;
  const std::string node_home = "DAISY_HOME=" + (tmp / "node").string();
  // The known device's fingerprint, from `daisychain id` in its own home.
  auto known_id = e2e::RunCli("DAISY_HOME=" + (tmp / "known").string(), "id", tmp.string());
  ASSERT_EQ(known_id.exit_code, 0) << known_id.err;
  const std::string known_fpr = known_id.out.substr(0, 19);
  const int port = e2e::FreePort();
  const std::string hp = "127.0.0.1:" + std::to_string(port);
  Proc serve =
      Proc::Spawn({e2e::Bin(), "serve", "--port", std::to_string(port), "--no-compute", "--approve", known_fpr},
                  {"DAISY_HOME=" + (tmp / "serve").string()}, (tmp / "serve.log").string());
  httplib::Client cli("127.0.0.1", port);
  const std::string secret = e2e::AdminSecretFromLog((tmp / "serve.log").string());
  ASSERT_FALSE(secret.empty()) << e2e::ReadAll((tmp / "serve.log").string());
  cli.set_default_headers({{"Cookie", "daisy_admin=" + secret}});  // the host's UI
  std::string server_fpr;
  for (int i = 0; i < 400 && server_fpr.empty(); ++i) {
    auto r = cli.Get("/api/key");
    if (r && r->status == 200) server_fpr = Json::parse(r->body)["fingerprint"];
    if (server_fpr.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(server_fpr.empty()) << e2e::ReadAll((tmp / "serve.log").string());
  EXPECT_NE(e2e::ReadAll((tmp / "serve.log").string()).find("server key fingerprint: " + server_fpr),
            std::string::npos);

  // A wrong --server-key: refused loudly, nothing asked.
  std::string wrong = server_fpr;
  wrong[0] = wrong[0] == '0' ? '1' : '0';
  Proc liar = Proc::Spawn({e2e::Bin(), "node", "--join", hp, "--name", "n-wrong", "--server-key", wrong},
                          {"DAISY_HOME=" + (tmp / "wrong").string()}, (tmp / "wrong.log").string());
  EXPECT_NE(liar.Wait(30), 0);
  EXPECT_NE(e2e::ReadAll((tmp / "wrong.log").string()).find("not the " + wrong), std::string::npos)
      << e2e::ReadAll((tmp / "wrong.log").string());

  // The device asks and waits, showing its fingerprint; the host sees the same one.
  Proc node = Proc::Spawn({e2e::Bin(), "node", "--join", hp, "--name", "n-pending", "--server-key", server_fpr},
                          {node_home}, (tmp / "node.log").string());
  Json pending;
  for (int i = 0; i < 400 && pending.is_null(); ++i) {
    auto r = cli.Get("/api/state");
    if (r && r->status == 200) {
      const Json state = Json::parse(r->body);
      for (const auto& d : state["devices"])
        if (d["name"] == "n-pending") pending = d;
    }
    if (pending.is_null()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(pending.is_null()) << e2e::ReadAll((tmp / "serve.log").string());
  EXPECT_EQ(pending["status"], "pending");
  const std::string fpr = pending["fingerprint"];
  EXPECT_EQ(pending["short"], fpr);
  std::string log;
  for (int i = 0; i < 100 && log.find("waiting for the host to approve") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    log = e2e::ReadAll((tmp / "node.log").string());
  }
  EXPECT_NE(log.find("waiting for the host to approve " + fpr), std::string::npos) << log;
  // Pending: no peer list, no room.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(e2e::ReadAll((tmp / "node.log").string()).find("in room"), std::string::npos);
  // The UI's Approve sends the listed id.
  auto a = cli.Post("/api/approve", Json{{"id", pending["id"]}}.dump(), "application/json");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, 200) << a->body;
  bool joined = false;
  for (int i = 0; i < 200 && !joined; ++i) {
    joined = e2e::ReadAll((tmp / "node.log").string()).find("in room 'default'") != std::string::npos;
    if (!joined) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(joined) << e2e::ReadAll((tmp / "node.log").string());

  // The pre-approved device joins without anyone approving it.
  Proc known = Proc::Spawn({e2e::Bin(), "node", "--join", hp, "--name", "n-known"},
                           {"DAISY_HOME=" + (tmp / "known").string()}, (tmp / "known.log").string());
  bool known_in = false;
  for (int i = 0; i < 200 && !known_in; ++i) {
    known_in = e2e::ReadAll((tmp / "known.log").string()).find("in room 'default'") != std::string::npos;
    if (!known_in) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(known_in) << e2e::ReadAll((tmp / "known.log").string());
  // Trust on first use: it printed the server's fingerprint and remembered it.
  EXPECT_NE(e2e::ReadAll((tmp / "known.log").string()).find("has key fingerprint " + server_fpr), std::string::npos);
  EXPECT_NE(e2e::ReadAll((tmp / "known" / "known_servers").string()).find(hp), std::string::npos);
  // A malformed join request is refused by name.
  auto bad = cli.Post("/api/join", R"({"room": "default", "public_key": "nope"})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  node.Stop(SIGTERM);
  known.Stop(SIGTERM);
  serve.Stop(SIGTERM);
  if (!HasFailure()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
}

TEST(ServeChat, TemplatesRenderAndChatCompletionsRunOnAModelThatHasOne) {
  // A random-weight 2-layer model with the Qwen3 tokenizer and its chat template.
  char tmpl[] = "/tmp/daisy_serve_chat_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path tmp = tmpl;
  modelmaker::MakeOptions mo;
  mo.tokenizer_dir = std::string(std::getenv("DAISY_TESTDATA")) + "/tokenizers/qwen3";
  mo.vocab = modelmaker::MakeOptions::kVocabFromTokenizer;
  mo.n_layers = 2;
  mo.dtype = modelmaker::WeightDType::kF32;
  ASSERT_TRUE(modelmaker::MakeModel(modelmaker::PresetShape("tiny-llama-30"), (tmp / "chat").string(), mo).ok());
  const int port = e2e::FreePort();
  Proc serve = Proc::Spawn(
      {e2e::Bin(), "serve", "--port", std::to_string(port), "--no-compute", "--model", (tmp / "chat").string()},
      {"DAISY_HOME=" + (tmp / "home").string()}, (tmp / "serve.log").string());
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  const std::string secret = e2e::AdminSecretFromLog((tmp / "serve.log").string());
  ASSERT_FALSE(secret.empty()) << e2e::ReadAll((tmp / "serve.log").string());
  cli.set_default_headers({{"Cookie", "daisy_admin=" + secret}});
  bool up = false;
  for (int i = 0; i < 600 && !up; ++i) {
    auto r = cli.Get("/v1/models");
    up = r && r->status == 200 && Json::parse(r->body)["data"].size() == 1;
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(up) << e2e::ReadAll((tmp / "serve.log").string());
  const Json messages = Json::array({{{"role", "user"}, {"content", "hi"}}});
  auto t =
      cli.Post("/apply-template", Json{{"messages", messages}, {"enable_thinking", false}}.dump(), "application/json");
  ASSERT_TRUE(t);
  ASSERT_EQ(t->status, 200) << t->body;
  const std::string prompt = Json::parse(t->body)["prompt"];
  EXPECT_EQ(prompt, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  auto state = cli.Get("/api/state");
  ASSERT_TRUE(state);
  EXPECT_EQ(Json::parse(state->body)["model"]["has_chat_template"], true);
  auto c = cli.Post("/v1/chat/completions",
                    Json{{"messages", messages},
                         {"max_tokens", 4},
                         {"temperature", 0},
                         {"chat_template_kwargs", {{"enable_thinking", false}}}}
                        .dump(),
                    "application/json");
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200) << c->body;
  Json j = Json::parse(c->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
  // The rendered prompt, tokenized without extra special tokens: im_start, user, \n, hi, ...
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 8);
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 4);
  ::kill(serve.pid(), SIGINT);
  EXPECT_EQ(serve.Wait(15), 0);
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

TEST(ServeQueue, ARequestWaitsBehindTheRingHolderAndLeavesTheQueueWhenItsClientGoes) {
  // A "Hub" that accepts connections and never answers: a load from it holds the ring.
  int hub = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(hub, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(hub, 16), 0);
  socklen_t len = sizeof a;
  ::getsockname(hub, reinterpret_cast<sockaddr*>(&a), &len);
  const int hub_port = ntohs(a.sin_port);

  char tmpl[] = "/tmp/daisy_serve_queue_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path tmp = tmpl;
  const int port = e2e::FreePort();
  auto serve = std::make_unique<Proc>(
      Proc::Spawn({e2e::Bin(), "serve", "--port", std::to_string(port), "--no-compute", "--model", Stories()},
                  {"DAISY_HOME=" + (tmp / "home").string(), "HF_ENDPOINT=http://127.0.0.1:" + std::to_string(hub_port),
                   "HF_TOKEN="},
                  (tmp / "serve.log").string()));
  const std::string secret = e2e::AdminSecretFromLog((tmp / "serve.log").string());
  ASSERT_FALSE(secret.empty()) << e2e::ReadAll((tmp / "serve.log").string());
  const httplib::Headers host_cookie = {{"Cookie", "daisy_admin=" + secret}};
  auto state = [&]() -> Json {
    httplib::Client cli("127.0.0.1", port);
    cli.set_default_headers(host_cookie);
    auto r = cli.Get("/api/state");
    return r && r->status == 200 ? Json::parse(r->body, nullptr, false) : Json();
  };
  auto wait_for = [&](const std::function<bool(const Json&)>& pred) {
    for (int i = 0; i < 400; ++i) {
      Json s = state();
      if (s.is_object() && pred(s)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  ASSERT_TRUE(wait_for([](const Json& s) { return s["model"].is_object(); }))
      << e2e::ReadAll((tmp / "serve.log").string());

  std::thread loader([&] {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(120, 0);
    cli.set_default_headers(host_cookie);
    (void)cli.Post("/api/load", R"({"model": "someone/slow-model"})", "application/json");
  });
  EXPECT_TRUE(wait_for([](const Json& s) { return s["busy"] == true; }));

  // A turn asked for now waits: its stream says so, and the state counts it.
  std::string got;
  std::thread waiter([&] {
    httplib::Request req;
    req.method = "POST";
    req.path = "/api/generate";
    req.body = R"({"prompt": "Once upon a time", "max_tokens": 5})";
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      got.append(data, n);
      return got.find("event: queued") == std::string::npos ||
             got.find("\n\n", got.find("event: queued")) == std::string::npos;
    };
    httplib::Client cli("127.0.0.1", port);
    cli.set_default_headers(host_cookie);
    (void)cli.send(req);  // returns when the receiver hangs up
  });
  waiter.join();
  EXPECT_NE(got.find("event: queued\ndata: {\"position\":1}"), std::string::npos) << got;
  // The client that hung up leaves the queue; the ring holder is still there.
  EXPECT_TRUE(wait_for([](const Json& s) { return s["queue"] == 0 && s["busy"] == true; }))
      << e2e::ReadAll((tmp / "serve.log").string());
  serve.reset();  // SIGKILL: the loader's request ends
  loader.join();
  ::close(hub);
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

// serve --audit with a node rigged to corrupt some hops: the stage is caught, its tokens
// are withdrawn (`event: retract`) and replayed, and what the UI ends up showing and what
// the API answers is the single-device text.
TEST(ServeAudit, ARiggedNodeIsCaughtAndTheAnswerIsTheSingleDeviceOne) {
  char tmpl[] = "/tmp/daisy_serve_audit_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path tmp = tmpl;
  const int port = e2e::FreePort();
  Proc serve = Proc::Spawn({e2e::Bin(), "serve", "--port", std::to_string(port), "--auto-approve", "--no-compute",
                            "--model", Stories(), "--stages", "2", "--audit", "0.1", "--audit-seed", "5"},
                           {"DAISY_HOME=" + (tmp / "serve").string()}, (tmp / "serve.log").string());
  // The test-only build: the product ignores DAISY_TEST_FLIP_EVERY (see the test below).
  Proc node =
      Proc::Spawn({e2e::FaultyBin(), "node", "--join", "127.0.0.1:" + std::to_string(port), "--name", "rigged",
                   "--models-dir", e2e::Models()},
                  {"DAISY_HOME=" + (tmp / "node").string(), "DAISY_TEST_FLIP_EVERY=7"}, (tmp / "node.log").string());
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(120, 0);
  const std::string secret = e2e::AdminSecretFromLog((tmp / "serve.log").string());
  ASSERT_FALSE(secret.empty()) << e2e::ReadAll((tmp / "serve.log").string());
  cli.set_default_headers({{"Cookie", "daisy_admin=" + secret}});
  ASSERT_TRUE(ModelLoadedAndApproved(cli, "rigged")) << e2e::ReadAll((tmp / "serve.log").string());
  const std::string prompt = "Once upon a time";
  auto gen = e2e::RunCli("DAISY_HOME=" + (tmp / "gen").string(),
                         "generate --model " + Stories() + " --prompt '" + prompt + "' -n 60 --json", tmp.string());
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  const Json want = Json::parse(gen.out);
  const std::string want_text = want["text"].get<std::string>().substr(prompt.size());

  // The UI's stream: tokens, perhaps a retract, tokens again; what stands is the single-device text.
  httplib::Request req;
  req.method = "POST";
  req.path = "/api/generate";
  req.body = Json{{"prompt", prompt}, {"max_tokens", 60}, {"verify", true}}.dump();
  req.set_header("Content-Type", "application/json");
  std::string stream;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    stream.append(data, n);
    return true;
  };
  auto r = cli.send(req);
  ASSERT_TRUE(r);
  std::string shown;
  Json done;
  int retracts = 0;
  for (size_t at = 0; at < stream.size();) {
    const size_t end = stream.find("\n\n", at);
    if (end == std::string::npos) break;
    const std::string block = stream.substr(at, end - at);
    at = end + 2;
    const size_t ev = block.find("event: "), data = block.find("data: ");
    if (ev == std::string::npos || data == std::string::npos) continue;
    const std::string name = block.substr(ev + 7, block.find('\n', ev) - ev - 7);
    const Json d = Json::parse(block.substr(data + 6), nullptr, false);
    if (name == "token") shown += d["text"].get<std::string>();
    if (name == "retract") {
      ++retracts;
      shown = d["text"].get<std::string>();
    }
    if (name == "done") done = d;
  }
  ASSERT_TRUE(done.is_object()) << stream;
  EXPECT_GE(done["replays"].get<int>(), 1) << "the rigged node was not caught: " << done.dump();
  EXPECT_EQ(done["ids"], want["ids"]);
  EXPECT_EQ(done["verified"], true);
  EXPECT_GE(retracts, 1) << "with this seed the audit catches the stage after some of its tokens were shown";
  EXPECT_EQ(shown, want_text) << retracts << " retract event(s)";
  std::printf("audit in serve: %d retract event(s), replays %d\n", retracts, done["replays"].get<int>());

  // The API's answer is the single-device text too.
  auto c = cli.Post("/v1/completions", Json{{"prompt", prompt}, {"max_tokens", 60}, {"temperature", 0}}.dump(),
                    "application/json");
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200) << c->body;
  EXPECT_EQ(Json::parse(c->body)["choices"][0]["text"], want_text);
  ::kill(serve.pid(), SIGINT);
  EXPECT_EQ(serve.Wait(15), 0);
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

// One HTTP request to 127.0.0.1:port from the local address `from` (any of 127.0.0.0/8 is
// this machine on Linux: 127.0.0.2 plays "another device" without leaving it). Returns
// the status (-1: no answer within 10 s) and the body.
std::pair<int, std::string> RequestFrom(const std::string& from, int port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in me{};
  me.sin_family = AF_INET;
  ::inet_pton(AF_INET, from.c_str(), &me.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&me), sizeof me) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0 ||
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return {-1, "cannot connect from " + from};
  }
  std::string got;
  for (int i = 0; i < 100; ++i) {  // the refusals close the connection; 10 s at most
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
    const size_t head = got.find("\r\n\r\n"), cl = got.find("Content-Length: ");
    if (head != std::string::npos && cl != std::string::npos && cl < head &&
        got.size() >= head + 4 + std::stoul(got.substr(cl + 16)))
      break;
  }
  ::close(fd);
  if (got.rfind("HTTP/1.1 ", 0) != 0) return {-1, got};
  const size_t head = got.find("\r\n\r\n");
  return {std::stoi(got.substr(9, 3)), head == std::string::npos ? "" : got.substr(head + 4)};
}

// Issue 12 through the real port: the mux tells the server who is asking. A device waits
// for approval; requests from another address (127.0.0.2) without the secret, a
// cross-origin form post and a forged Host are refused and the device stays pending; the
// OpenAI API (no --api-key) answers this machine only; the host's secret works from the
// other address too (the UI on another device), and --admin-secret-file holds the same one.
TEST(ServeAccess, StrangersThroughThePortAreRefusedAndNoDeviceIsApproved) {
  char tmpl[] = "/tmp/daisy_serve_access_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path tmp = tmpl;
  const int port = e2e::FreePort();
  const std::string hp = "127.0.0.1:" + std::to_string(port);
  Proc serve = Proc::Spawn({e2e::Bin(), "serve", "--port", std::to_string(port), "--no-compute", "--admin-secret-file",
                            (tmp / "secret").string()},
                           {"DAISY_HOME=" + (tmp / "home").string()}, (tmp / "serve.log").string());
  const std::string secret = e2e::AdminSecretFromLog((tmp / "serve.log").string());
  ASSERT_EQ(secret.size(), 64u) << e2e::ReadAll((tmp / "serve.log").string());
  EXPECT_EQ(e2e::ReadAll((tmp / "secret").string()), secret + "\n");
  EXPECT_EQ(fs::status(tmp / "secret").permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  const std::string log = e2e::ReadAll((tmp / "serve.log").string());
  EXPECT_NE(log.find("answers only on this machine"), std::string::npos) << log;
  EXPECT_EQ(log.find("WARNING: --host"), std::string::npos) << log;  // loopback: nothing served to the network

  // A device asks to join (as `node` does: no secret needed for that).
  const Json join = {{"room", "default"}, {"public_key", net::NewKeyPair().public_key}, {"name", "stranger"}};
  httplib::Client device("127.0.0.1", port);
  auto asked = device.Post("/api/join", join.dump(), "application/json");
  for (int i = 0; i < 400 && !asked; ++i) {  // serve may still be starting
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    asked = device.Post("/api/join", join.dump(), "application/json");
  }
  ASSERT_TRUE(asked) << e2e::ReadAll((tmp / "serve.log").string());
  ASSERT_EQ(asked->status, 200) << asked->body;
  const std::string fpr = Json::parse(asked->body)["fingerprint"];
  auto pending = [&] {
    auto again = device.Post("/api/join", join.dump(), "application/json");
    return again && again->status == 200 && Json::parse(again->body)["status"] == "pending";
  };
  ASSERT_TRUE(pending());

  const std::string body = Json{{"id", fpr}}.dump();
  auto post = [&](const std::string& headers, const std::string& content) {
    return "POST /api/approve HTTP/1.1\r\nHost: " + hp + "\r\n" + headers +
           "Content-Length: " + std::to_string(content.size()) + "\r\n\r\n" + content;
  };
  const std::string cookie = "Cookie: daisy_admin=" + secret + "\r\n";
  // Another address, no secret: refused.
  auto r = RequestFrom("127.0.0.2", port, post("Content-Type: application/json\r\n", body));
  EXPECT_EQ(r.first, 401) << r.second;
  EXPECT_EQ(r.second.find(secret), std::string::npos);
  // This machine, no secret: refused too.
  r = RequestFrom("127.0.0.1", port, post("Content-Type: application/json\r\n", body));
  EXPECT_EQ(r.first, 401) << r.second;
  // A cross-origin form post (the browser would add the cookie only were it not Strict).
  r = RequestFrom(
      "127.0.0.1", port,
      post("Origin: http://evil.example\r\nContent-Type: application/x-www-form-urlencoded\r\n" + cookie, "id=" + fpr));
  EXPECT_EQ(r.first, 415) << r.second;
  r = RequestFrom("127.0.0.1", port,
                  post("Origin: http://evil.example\r\nContent-Type: application/json\r\n" + cookie, body));
  EXPECT_EQ(r.first, 403) << r.second;
  // A forged Host (DNS rebinding), with the secret even.
  r = RequestFrom("127.0.0.1", port,
                  "POST /api/approve HTTP/1.1\r\nHost: evil.example:" + std::to_string(port) +
                      "\r\nContent-Type: application/json\r\n" + cookie +
                      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(r.first, 403) << r.second;
  EXPECT_TRUE(pending()) << "a refused request approved the device";
  // The OpenAI API without --api-key: this machine, not another address.
  const std::string models = "GET /v1/models HTTP/1.1\r\nHost: " + hp + "\r\n\r\n";
  r = RequestFrom("127.0.0.2", port, models);
  EXPECT_EQ(r.first, 403) << r.second;
  EXPECT_NE(r.second.find("127.0.0.2"), std::string::npos) << r.second;
  r = RequestFrom("127.0.0.1", port, models);
  EXPECT_EQ(r.first, 200) << r.second;
  // The host, from the other address with the secret: the token URL, then its UI's API.
  r = RequestFrom("127.0.0.2", port, "GET /?token=" + secret + " HTTP/1.1\r\nHost: " + hp + "\r\n\r\n");
  EXPECT_EQ(r.first, 200) << r.second;
  r = RequestFrom("127.0.0.2", port, "GET /api/state HTTP/1.1\r\nHost: " + hp + "\r\n" + cookie + "\r\n");
  EXPECT_EQ(r.first, 200) << r.second;
  r = RequestFrom("127.0.0.2", port,
                  post("Origin: http://" + hp + "\r\nContent-Type: application/json\r\n" + cookie, body));
  EXPECT_EQ(r.first, 200) << r.second;
  EXPECT_FALSE(pending()) << "the host's approval did not take";
  ::kill(serve.pid(), SIGINT);
  EXPECT_EQ(serve.Wait(15), 0);
  if (!HasFailure()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
}

// The fault hooks are not in the product: the release daisychain holds neither variable's
// name, and a node under it with DAISY_TEST_FLIP_EVERY=1 and DAISY_TEST_HOP_DELAY_MS set is
// honest, so every hop passes an audit at rate 1.0 (the daisychain_faulty build with the
// same variable is caught on its first hop, as the test above shows at rate 0.1).
TEST(ServeAudit, TheReleaseBinaryIgnoresTheFaultInjectionVariables) {
  const std::string binary = e2e::ReadAll(e2e::Bin());
  ASSERT_GT(binary.size(), 100000u);
  EXPECT_EQ(binary.find("DAISY_TEST_FLIP_EVERY"), std::string::npos);
  EXPECT_EQ(binary.find("DAISY_TEST_HOP_DELAY_MS"), std::string::npos);
  char tmpl[] = "/tmp/daisy_serve_nofault_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path tmp = tmpl;
  const int port = e2e::FreePort();
  Proc serve = Proc::Spawn({e2e::Bin(), "serve", "--port", std::to_string(port), "--auto-approve", "--no-compute",
                            "--model", Stories(), "--stages", "2", "--audit", "1.0"},
                           {"DAISY_HOME=" + (tmp / "serve").string()}, (tmp / "serve.log").string());
  Proc node =
      Proc::Spawn({e2e::Bin(), "node", "--join", "127.0.0.1:" + std::to_string(port), "--name", "honest",
                   "--models-dir", e2e::Models()},
                  {"DAISY_HOME=" + (tmp / "node").string(), "DAISY_TEST_FLIP_EVERY=1", "DAISY_TEST_HOP_DELAY_MS=1"},
                  (tmp / "node.log").string());
  const std::string secret = e2e::AdminSecretFromLog((tmp / "serve.log").string());
  httplib::Client cli("127.0.0.1", port);
  cli.set_default_headers({{"Cookie", "daisy_admin=" + secret}});  // the host's UI
  cli.set_read_timeout(120, 0);
  ASSERT_TRUE(ModelLoadedAndApproved(cli, "honest")) << e2e::ReadAll((tmp / "serve.log").string());
  const std::string prompt = "Once upon a time";
  auto gen = e2e::RunCli("DAISY_HOME=" + (tmp / "gen").string(),
                         "generate --model " + Stories() + " --prompt '" + prompt + "' -n 20 --json", tmp.string());
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  auto r = cli.Post("/api/generate", Json{{"prompt", prompt}, {"max_tokens", 20}, {"verify", true}}.dump(),
                    "application/json");
  ASSERT_TRUE(r);
  const size_t at = r->body.rfind("event: done\ndata: ");
  ASSERT_NE(at, std::string::npos) << r->body;
  const size_t from = at + std::string("event: done\ndata: ").size();
  const Json done = Json::parse(r->body.substr(from, r->body.find('\n', from) - from), nullptr, false);
  ASSERT_TRUE(done.is_object()) << r->body;
  ASSERT_EQ(done["stages"].size(), 2u) << "the turn did not use the node: " << done.dump();
  EXPECT_EQ(done["stages"][1]["name"], "honest");
  EXPECT_GT(done["stages"][1]["hops"].get<int>(), 0) << done.dump();
  EXPECT_EQ(done["replays"], 0) << "a stage was caught lying: " << done.dump();
  EXPECT_EQ(done["verified"], true);
  EXPECT_EQ(done["ids"], Json::parse(gen.out)["ids"]);
  EXPECT_EQ(r->body.find("event: retract"), std::string::npos) << r->body;
  const std::string node_log = e2e::ReadAll((tmp / "node.log").string());
  EXPECT_EQ(node_log.find("FAULT INJECTION"), std::string::npos) << node_log;
  ::kill(serve.pid(), SIGINT);
  EXPECT_EQ(serve.Wait(15), 0);
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

}  // namespace
}  // namespace daisy
