// The pieces of the HTTP surface that need no model and no ring: request parsing for the
// OpenAI-compatible API and the UI, error bodies, response and chunk shaping, server-sent
// event framing and the stop-string matcher. Pure functions and value types (tested alone
// in api_test.cc). Internal to src/server: nlohmann::json may appear here.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace daisy::srv {

using Json = nlohmann::json;

// JSON text on one line; invalid UTF-8 in strings becomes U+FFFD instead of throwing.
std::string Dump(const Json& j);

// An error answer: the HTTP status and the OpenAI error object.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // or "server_error", "not_found_error"
  std::string param;                           // "" -> null
  std::string code;                            // "" -> null
};
// {"error": {"message", "type", "param", "code"}}
Json ErrorBody(const ApiError& e);
ApiError BadRequest(std::string message, std::string param = "");

// A request of /v1/completions or /v1/chat/completions, validated.
struct CompletionRequest {
  bool chat = false;
  std::string model;                               // "" when not given
  std::string prompt;                              // completions: the prompt text
  std::optional<std::vector<int32_t>> prompt_ids;  // completions: a prompt given as token ids
  Json messages;                                   // chat: the messages, content flattened to strings
  Json template_kwargs = Json::object();           // chat: chat_template_kwargs (extra template variables)
  std::optional<int> max_tokens;                   // nullopt: the default of the endpoint
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  std::optional<uint64_t> seed;   // nullopt: a fresh random seed
  std::vector<std::string> stop;  // at most 4, none empty
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool json_object = false;    // response_format {"type": "json_object"}
  std::string user;            // the prefix-cache key
};
// Parses a body; chat selects the chat endpoint's fields. Unknown fields are ignored;
// known fields of the wrong type, or features this server does not implement (n > 1,
// logprobs, penalties other than 0, tools, ...), are refused with the field named.
std::variant<CompletionRequest, ApiError> ParseCompletionRequest(std::string_view body, bool chat);

// The body of POST /api/generate (the UI), validated.
struct UiGenerateRequest {
  std::string prompt;
  int max_tokens = 60;
  int ctx = 0;
  float temperature = 0.0f;
  uint64_t seed = 1234;
  float top_p = 1.0f;
  int top_k = 0;
  bool verify = false;
  bool json = false;
  std::optional<int> stages;  // split over exactly N devices (the head included)
};
std::variant<UiGenerateRequest, ApiError> ParseUiGenerateRequest(std::string_view body);

// The body of POST /api/chat (the UI's chat), validated strictly: every field of the wrong
// type, every unknown field and every malformed message is refused with its name.
struct UiChatRequest {
  std::string conversation;  // the prefix-cache key ("" = none named: the longest shared prefix)
  // [{"role", "content"}]: roles system (first only), user and assistant; content a string;
  // the last message is the user's.
  Json messages;
  int max_tokens = 256;
  int ctx = 0;
  float temperature = 0.0f;
  uint64_t seed = 1234;
  float top_p = 1.0f;
  int top_k = 0;
  bool verify = false;
  std::optional<int> stages;
};
inline constexpr size_t kMaxChatMessages = 1000;
inline constexpr size_t kMaxChatChars = size_t{1} << 20;  // all contents together, in bytes
inline constexpr size_t kMaxConversationId = 64;
std::variant<UiChatRequest, ApiError> ParseUiChatRequest(std::string_view body);
// The prompt of a chat on a model without a chat template (plain completion): the contents
// one after the other, as written, so a reply continues the text it followed.
std::string PlainChatPrompt(const Json& messages);

// The body of POST /apply-template: messages, add_generation_prompt (default true) and
// every other field as a template variable (as llama.cpp's server does).
struct ApplyTemplateRequest {
  Json messages;
  bool add_generation_prompt = true;
  Json kwargs = Json::object();
};
std::variant<ApplyTemplateRequest, ApiError> ParseApplyTemplateRequest(std::string_view body);

// Checks an OpenAI messages array and flattens content given as parts
// ([{"type": "text", "text": ...}]) into one string per message.
std::variant<Json, ApiError> NormalizeMessages(const Json& messages, const std::string& param = "messages");

// What a finished (or partly finished) completion says.
struct CompletionResult {
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  std::string text;
  std::string finish_reason;  // "stop" | "length"
  int prompt_tokens = 0;
  int completion_tokens = 0;
};
Json CompletionResponse(const CompletionResult& r, bool chat);
// One streamed chunk: text (chat: delta.content; a first chat chunk: delta.role), and
// finish_reason on the last one ("" -> null).
Json CompletionChunk(const CompletionResult& r, bool chat, const std::string& text, bool first,
                     const std::string& finish_reason);
// The usage chunk after the last one when stream_options.include_usage: choices [].
Json UsageChunk(const CompletionResult& r, bool chat);
Json Usage(const CompletionResult& r);
// "cmpl-" or "chatcmpl-" and 24 random hex digits.
std::string NewCompletionId(bool chat);

// Server-sent events: "event: NAME\ndata: JSON\n\n", or "data: ...\n\n" without a name.
std::string SseEvent(std::string_view name, const Json& data);
std::string SseData(std::string_view data);

// Ends generation at the first occurrence of any stop string and cuts the text before it.
// Text is fed as it is decoded; Add returns what may be shown now, holding back a tail that
// could still become the start of a stop string. Not thread-safe.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Returns the newly safe text (possibly empty). After a stop string appears, returns
  // the text before it and then nothing.
  std::string Add(std::string_view text);
  // The held-back tail, at the end of generation (empty once stopped).
  std::string Finish();
  bool stopped() const { return stopped_; }
  // Everything shown so far (Add and Finish results).
  const std::string& text() const { return shown_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // text not shown yet
  std::string shown_;
  bool stopped_ = false;
};

}  // namespace daisy::srv
