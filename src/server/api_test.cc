// The server's model-free pieces: OpenAI request parsing and errors, response and chunk
// shapes, SSE framing, stop strings and the embedded UI files.
#include "api.h"

#include <gtest/gtest.h>

#include "assets.h"
#include "daisy/server.h"

namespace daisy::srv {
namespace {

CompletionRequest ParseOk(const std::string& body, bool chat = false) {
  auto r = ParseCompletionRequest(body, chat);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
  return std::holds_alternative<CompletionRequest>(r) ? std::get<CompletionRequest>(r) : CompletionRequest{};
}

ApiError ParseBad(const std::string& body, bool chat = false) {
  auto r = ParseCompletionRequest(body, chat);
  if (std::holds_alternative<CompletionRequest>(r)) ADD_FAILURE() << body << " was accepted";
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(ParseCompletion, ReadsEveryFieldWithOpenAIDefaults) {
  auto d = ParseOk(R"({"prompt": "Once"})");
  EXPECT_EQ(d.prompt, "Once");
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_EQ(d.temperature, 1.0f);
  EXPECT_EQ(d.top_p, 1.0f);
  EXPECT_FALSE(d.seed.has_value());
  EXPECT_FALSE(d.stream);
  EXPECT_FALSE(d.json_object);

  auto r = ParseOk(R"({"model": "m", "prompt": ["Hi"], "max_tokens": 7, "temperature": 0, "top_p": 0.5, "seed": 9,
                       "stop": ["\n\n", "The end"], "stream": true, "stream_options": {"include_usage": true},
                       "response_format": {"type": "json_object"}, "user": "alice", "n": 1, "frequency_penalty": 0,
                       "some_future_field": {"x": 1}})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "Hi");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.seed, 9u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "The end"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.json_object);
  EXPECT_EQ(r.user, "alice");

  auto ids = ParseOk(R"({"prompt": [1, 403, 407]})");
  ASSERT_TRUE(ids.prompt_ids.has_value());
  EXPECT_EQ(*ids.prompt_ids, (std::vector<int32_t>{1, 403, 407}));
  // null means "not given".
  auto nulls = ParseOk(R"({"prompt": "x", "max_tokens": null, "stop": null, "temperature": null})");
  EXPECT_FALSE(nulls.max_tokens.has_value());
  EXPECT_EQ(nulls.temperature, 1.0f);
}

TEST(ParseCompletion, ChatFlattensTextPartsAndTakesMaxCompletionTokens) {
  auto r = ParseOk(R"({"messages": [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": [{"type": "text", "text": "Hel"},
                                                                 {"type": "text", "text": "lo"}]}],
                       "max_completion_tokens": 5})",
                   /*chat=*/true);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1]["content"], "Hello");
  EXPECT_EQ(r.max_tokens, 5);
}

TEST(ParseCompletion, RefusesBadRequestsNamingTheField) {
  struct Case {
    const char* body;
    bool chat;
    const char* param;  // "" -> none
  };
  const Case cases[] = {
      {"not json", false, ""},
      {"[1, 2]", false, ""},
      {R"({})", false, "prompt"},
      {R"({"prompt": 5})", false, "prompt"},
      {R"({"prompt": ["a", "b"]})", false, "prompt"},
      {R"({"prompt": "x", "max_tokens": "ten"})", false, "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 0})", false, "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 1.5})", false, "max_tokens"},
      {R"({"prompt": "x", "temperature": -1})", false, "temperature"},
      {R"({"prompt": "x", "temperature": "hot"})", false, "temperature"},
      {R"({"prompt": "x", "top_p": 0})", false, "top_p"},
      {R"({"prompt": "x", "n": 2})", false, "n"},
      {R"({"prompt": "x", "stop": [1]})", false, "stop"},
      {R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", false, "stop"},
      {R"({"prompt": "x", "stream": "yes"})", false, "stream"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema"}})", false, "response_format"},
      {R"({"prompt": "x", "logprobs": 3})", false, "logprobs"},
      {R"({"prompt": "x", "presence_penalty": 0.5})", false, "presence_penalty"},
      {R"({"prompt": "x", "logit_bias": {"1": 5}})", false, "logit_bias"},
      {R"({"prompt": "x", "echo": true})", false, "echo"},
      {R"({"prompt": "x", "model": 3})", false, "model"},
      {R"({"messages": []})", true, "messages"},
      {R"({"messages": "hi"})", true, "messages"},
      {R"({"messages": [{"content": "hi"}]})", true, "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", true, "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", true, "tools"},
  };
  for (const auto& c : cases) {
    ApiError e = ParseBad(c.body, c.chat);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
}

TEST(ErrorBody, HasTheOpenAIShape) {
  Json j = ErrorBody(BadRequest("'n' must be 1", "n"));
  ASSERT_TRUE(j.contains("error"));
  EXPECT_EQ(j["error"]["message"], "'n' must be 1");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_TRUE(ErrorBody(BadRequest("bad body"))["error"]["param"].is_null());
}

TEST(Shapes, CompletionResponsesAndChunks) {
  CompletionResult r{"cmpl-1", 1700000000, "models/stories260K", "Hello", "length", 5, 3};
  Json c = CompletionResponse(r, false);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "Hello");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["usage"]["total_tokens"], 8);
  Json chat = CompletionResponse(r, true);
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "Hello");

  Json first = CompletionChunk(r, true, "", true, "");
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  Json mid = CompletionChunk(r, true, "lo", false, "");
  EXPECT_EQ(mid["choices"][0]["delta"]["content"], "lo");
  EXPECT_FALSE(mid["choices"][0]["delta"].contains("role"));
  Json last = CompletionChunk(r, false, "", false, "stop");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  Json usage = UsageChunk(r, true);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(NewCompletionId(true).rfind("chatcmpl-", 0), 0u);
  EXPECT_NE(NewCompletionId(false), NewCompletionId(false));
}

TEST(Sse, FramesEventsOnOneDataLine) {
  EXPECT_EQ(SseEvent("token", Json{{"text", "a\nb"}}), "event: token\ndata: {\"text\":\"a\\nb\"}\n\n");
  EXPECT_EQ(SseData("[DONE]"), "data: [DONE]\n\n");
  // Invalid UTF-8 never throws: it becomes U+FFFD.
  EXPECT_NE(SseEvent("token", Json{{"text", std::string("\xff", 1)}}).find("\xef\xbf\xbd"), std::string::npos);
}

TEST(StopMatcher, CutsBeforeTheStopStringAndHoldsBackPossibleStarts) {
  StopMatcher m({"The end", "\n\n"});
  EXPECT_EQ(m.Add("Once upon"), "Once upon");
  EXPECT_EQ(m.Add(" a time. Th"), " a time. ");  // "Th" could start "The end"
  EXPECT_EQ(m.Add("e cat"), "The cat");          // it did not
  EXPECT_EQ(m.Add(". The e"), ". ");
  EXPECT_EQ(m.Add("nd!"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Add("more"), "");
  EXPECT_EQ(m.Finish(), "");
  EXPECT_EQ(m.text(), "Once upon a time. The cat. ");

  StopMatcher n({"\n\n"});
  EXPECT_EQ(n.Add("a\n"), "a");
  EXPECT_EQ(n.Finish(), "\n");  // never completed: shown at the end
  EXPECT_FALSE(n.stopped());
  EXPECT_EQ(n.text(), "a\n");

  StopMatcher none({});
  EXPECT_EQ(none.Add("x"), "x");
  // Of two stop strings completed by one piece, the one that starts first cuts.
  StopMatcher two({"bc", "abcd"});
  EXPECT_EQ(two.Add("xab"), "x");
  EXPECT_EQ(two.Add("cd"), "");
  EXPECT_EQ(two.text(), "x");
}

TEST(UiGenerate, DefaultsAndRefusals) {
  auto r = ParseUiGenerateRequest(R"({"prompt": "Once upon a time"})");
  ASSERT_TRUE(std::holds_alternative<UiGenerateRequest>(r));
  const auto& g = std::get<UiGenerateRequest>(r);
  EXPECT_EQ(g.max_tokens, 60);
  EXPECT_EQ(g.temperature, 0.0f);
  EXPECT_EQ(g.seed, 1234u);
  EXPECT_FALSE(g.verify);
  auto bad = ParseUiGenerateRequest(R"({"prompt": "x", "verify": "yes"})");
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  EXPECT_EQ(std::get<ApiError>(bad).param, "verify");
  EXPECT_TRUE(std::holds_alternative<ApiError>(ParseUiGenerateRequest(R"({"prompt": ""})")));
}

TEST(UiChat, ReadsAConversationWithDefaults) {
  auto r = ParseUiChatRequest(
      R"({"conversation": "c-1:a_b.c", "messages": [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}, {"role": "user", "content": "And?"}],
          "verify": true, "seed": 7})");
  ASSERT_TRUE(std::holds_alternative<UiChatRequest>(r)) << std::get<ApiError>(r).message;
  const auto& c = std::get<UiChatRequest>(r);
  EXPECT_EQ(c.conversation, "c-1:a_b.c");
  ASSERT_EQ(c.messages.size(), 4u);
  EXPECT_EQ(c.messages[3]["content"], "And?");
  EXPECT_EQ(c.max_tokens, 256);
  EXPECT_EQ(c.temperature, 0.0f);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_TRUE(c.verify);
  EXPECT_EQ(PlainChatPrompt(c.messages), "Be brief.HiAnd?");
  // No conversation: none named (the longest shared prefix is reused).
  auto n = ParseUiChatRequest(R"({"messages": [{"role": "user", "content": "Hi"}]})");
  ASSERT_TRUE(std::holds_alternative<UiChatRequest>(n));
  EXPECT_EQ(std::get<UiChatRequest>(n).conversation, "");
}

TEST(UiChat, RefusesMalformedRequestsNamingWhatIsWrong) {
  struct Case {
    const char* body;
    const char* param;
    const char* says;
  };
  const std::string too_long =
      std::string(R"({"messages": [{"role": "user", "content": ")") + std::string(kMaxChatChars + 1, 'a') + R"("}]})";
  std::string many = R"({"messages": [)";
  for (size_t i = 0; i <= kMaxChatMessages; ++i)
    many += std::string(i ? "," : "") + R"({"role": "user", "content": "x"})";
  many += "]}";
  const std::string long_id = R"({"conversation": ")" + std::string(kMaxConversationId + 1, 'a') +
                              R"(", "messages": [{"role": "user", "content": "x"}]})";
  const Case cases[] = {
      {R"([1, 2])", "", "JSON object"},
      {R"({"conversation": "x"})", "messages", "required"},
      {R"({"messages": []})", "messages", "at least one"},
      {R"({"messages": "hi"})", "messages", "must be an array"},
      {R"({"messages": ["hi"]})", "messages[0]", "must be an object"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role", "\"system\", \"user\""},
      {R"({"messages": [{"role": 1, "content": "x"}]})", "messages[0].role", "a string"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role", "required"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content", "required"},
      {R"({"messages": [{"role": "user", "content": ""}]})", "messages[0].content", "empty"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]})", "messages[0].content",
       "a string"},
      {R"({"messages": [{"role": "user", "content": "x", "name": "bob"}]})", "messages[0].name", "unknown field"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "y"},
          {"role": "user", "content": "z"}]})",
       "messages[1].role", "only the first"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})", "messages[1].role",
       "the user's"},
      {R"({"messages": [{"role": "user", "content": "x"}], "conversation": 5})", "conversation", "a string"},
      {R"({"messages": [{"role": "user", "content": "x"}], "conversation": "a b"})", "conversation", "letters"},
      {R"({"messages": [{"role": "user", "content": "x"}], "conversation": ""})", "conversation", "letters"},
      {long_id.c_str(), "conversation", "letters"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens", "must be in"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"})", "max_tokens", "an integer"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": -1})", "temperature", "must be in"},
      {R"({"messages": [{"role": "user", "content": "x"}], "verify": "yes"})", "verify", "true or false"},
      {R"({"messages": [{"role": "user", "content": "x"}], "prompt": "y"})", "prompt", "unknown field"},
      {too_long.c_str(), "messages[0].content", "too long"},
      {many.c_str(), "messages", "at most"},
  };
  for (const auto& c : cases) {
    auto r = ParseUiChatRequest(c.body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << std::string(c.body).substr(0, 200);
    const auto& e = std::get<ApiError>(r);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << std::string(c.body).substr(0, 200) << " -> " << e.message;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << std::string(c.body).substr(0, 200) << " -> " << e.message;
  }
}

TEST(ApplyTemplate, OtherFieldsBecomeTemplateVariables) {
  auto r = ParseApplyTemplateRequest(
      R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": false, "enable_thinking": false,
          "chat_template_kwargs": {"x": 1}})");
  ASSERT_TRUE(std::holds_alternative<ApplyTemplateRequest>(r));
  const auto& a = std::get<ApplyTemplateRequest>(r);
  EXPECT_FALSE(a.add_generation_prompt);
  EXPECT_EQ(a.kwargs["enable_thinking"], false);
  EXPECT_EQ(a.kwargs["x"], 1);
  EXPECT_FALSE(a.kwargs.contains("messages"));
}

TEST(Assets, TheUiIsEmbedded) {
  const Asset* index = FindAsset("/");
  ASSERT_NE(index, nullptr);
  EXPECT_EQ(index, FindAsset("/index.html"));
  EXPECT_EQ(index->content_type, "text/html; charset=utf-8");
  EXPECT_NE(index->bytes.find("<"), std::string_view::npos);
  ASSERT_NE(FindAsset("/app.js"), nullptr);
  EXPECT_EQ(FindAsset("/app.js")->content_type, "text/javascript; charset=utf-8");
  ASSERT_NE(FindAsset("/style.css"), nullptr);
  ASSERT_NE(FindAsset("/chat.js"), nullptr);
  ASSERT_NE(FindAsset("/chat.css"), nullptr);
  EXPECT_EQ(FindAsset("/secret.txt"), nullptr);
}

TEST(Assets, TheJoinPageAndTheBrowserNodeAreEmbedded) {
  const Asset* join = FindAsset("/join");
  ASSERT_NE(join, nullptr);
  EXPECT_EQ(join, FindAsset("/join.html"));
  EXPECT_NE(join->bytes.find("/join.js"), std::string_view::npos);
  for (const char* file : {"/join.js", "/join.css", "/qr.js", "/tab_worker.js"})
    EXPECT_NE(FindAsset(file), nullptr) << file;
  // Present when the binary was built with Emscripten (CMake says when it was not).
  for (const Asset& a : EngineAssets()) {
    EXPECT_EQ(FindAsset(a.path), &a);
    if (a.path.ends_with(".wasm")) {
      EXPECT_EQ(a.content_type, "application/wasm") << a.path;
      EXPECT_EQ(a.bytes.substr(0, 4), std::string_view("\0asm", 4)) << a.path;
    } else {
      EXPECT_EQ(a.content_type, "text/javascript; charset=utf-8") << a.path;
    }
  }
}

TEST(JoinPageUrl, PhonesAreSentToTheAddressServeListensOn) {
  EXPECT_EQ(JoinPageUrl("192.168.1.10", 8788), "http://192.168.1.10:8788/join");
  EXPECT_EQ(JoinPageUrl("daisy-host.lan", 9000), "http://daisy-host.lan:9000/join");
  EXPECT_EQ(JoinPageUrl("fd00::7", 8788), "http://[fd00::7]:8788/join");
  // Loopback: no address a phone could use; the UI shows its own origin instead.
  for (const char* host : {"127.0.0.1", "127.0.0.2", "localhost", "::1", ""}) EXPECT_EQ(JoinPageUrl(host, 8788), "");
  // Every address: one of this machine's own, never the wildcard itself.
  for (const char* any : {"0.0.0.0", "::"}) {
    const std::string url = JoinPageUrl(any, 8788);
    EXPECT_EQ(url.find("0.0.0.0"), std::string::npos);
    EXPECT_EQ(url.find("[::]"), std::string::npos);
    if (!url.empty()) {
      EXPECT_TRUE(url.starts_with("http://") && url.ends_with(":8788/join")) << url;
    }
  }
}

}  // namespace
}  // namespace daisy::srv
