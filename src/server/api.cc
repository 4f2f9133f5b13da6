// Request parsing, response shaping, SSE framing and stop strings (see api.h).
#include "api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace daisy::srv {

namespace {

// The value of `key` unless absent or null.
const Json* Field(const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string TypeName(const Json& v) {
  return v.type_name();
}

ApiError WrongType(const std::string& key, const char* want, const Json& got) {
  return BadRequest("'" + key + "' must be " + want + ", got " + TypeName(got) + " " + Dump(got).substr(0, 80), key);
}

// Reads an optional field into `out`; returns an error for a wrong type or range.
std::optional<ApiError> ReadInt(const Json& obj, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!(std::isfinite(d) && d == std::floor(d))) return WrongType(key, "an integer", *v);
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
      return BadRequest("'" + std::string(key) + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "], got " + Dump(*v),
                        key);
    out = static_cast<int64_t>(d);
    return std::nullopt;
  }
  if (!v->is_number_integer()) return WrongType(key, "an integer", *v);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return BadRequest("'" + std::string(key) + "' is too large: " + Dump(*v), key);
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    return BadRequest("'" + std::string(key) + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                          "], got " + std::to_string(x),
                      key);
  out = x;
  return std::nullopt;
}

std::optional<ApiError> ReadFloat(const Json& obj, const char* key, double lo, double hi, bool lo_open,
                                  std::optional<float>& out) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) return WrongType(key, "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo)) {
    auto fmt = [](double x) {
      std::string s = std::to_string(x);
      while (s.size() > 1 && s.back() == '0') s.pop_back();
      if (!s.empty() && s.back() == '.') s.pop_back();
      return s;
    };
    return BadRequest("'" + std::string(key) + "' must be in " + (lo_open ? "(" : "[") + fmt(lo) + ", " + fmt(hi) +
                          "], got " + Dump(*v),
                      key);
  }
  out = static_cast<float>(d);
  return std::nullopt;
}

std::optional<ApiError> ReadBool(const Json& obj, const char* key, std::optional<bool>& out) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return WrongType(key, "true or false", *v);
  out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> ReadString(const Json& obj, const char* key, std::optional<std::string>& out) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) return WrongType(key, "a string", *v);
  out = v->get<std::string>();
  return std::nullopt;
}

// Fields this server does not implement: refused unless they hold their neutral value.
std::optional<ApiError> RefuseUnsupported(const Json& obj, bool chat) {
  std::optional<int64_t> n;
  if (auto e = ReadInt(obj, "n", 1, 128, n)) return e;
  if (n && *n != 1) return BadRequest("'n' must be 1: this server makes one choice per request", "n");
  std::optional<int64_t> best_of;
  if (auto e = ReadInt(obj, "best_of", 1, 128, best_of)) return e;
  if (best_of && *best_of != 1)
    return BadRequest("'best_of' must be 1: this server makes one choice per request", "best_of");
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    std::optional<float> p;
    if (auto e = ReadFloat(obj, key, -2.0, 2.0, false, p)) return e;
    if (p && *p != 0.0f) return BadRequest("'" + std::string(key) + "' is not supported (only 0)", key);
  }
  if (const Json* v = Field(obj, "logit_bias")) {
    if (!v->is_object()) return WrongType("logit_bias", "an object", *v);
    if (!v->empty()) return BadRequest("'logit_bias' is not supported", "logit_bias");
  }
  if (const Json* v = Field(obj, "logprobs")) {
    const bool on = v->is_boolean() ? v->get<bool>() : v->is_number() ? v->get<double>() != 0 : true;
    if (!v->is_boolean() && !v->is_number()) return WrongType("logprobs", chat ? "true or false" : "an integer", *v);
    if (on) return BadRequest("'logprobs' is not supported", "logprobs");
  }
  if (const Json* v = Field(obj, "top_logprobs")) {
    if (!v->is_number_integer()) return WrongType("top_logprobs", "an integer", *v);
    if (v->get<int64_t>() != 0) return BadRequest("'top_logprobs' is not supported", "top_logprobs");
  }
  if (const Json* v = Field(obj, "echo")) {
    if (!v->is_boolean()) return WrongType("echo", "true or false", *v);
    if (v->get<bool>()) return BadRequest("'echo' is not supported", "echo");
  }
  if (const Json* v = Field(obj, "suffix")) {
    if (!v->is_string()) return WrongType("suffix", "a string", *v);
    if (!v->get<std::string>().empty()) return BadRequest("'suffix' is not supported", "suffix");
  }
  for (const char* key : {"tools", "functions"}) {
    if (const Json* v = Field(obj, key)) {
      if (!v->is_array()) return WrongType(key, "an array", *v);
      if (!v->empty()) return BadRequest("'" + std::string(key) + "' (function calling) is not supported", key);
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ReadStop(const Json& obj, std::vector<std::string>& out) {
  const Json* v = Field(obj, "stop");
  if (!v) return std::nullopt;
  if (v->is_string()) {
    if (!v->get<std::string>().empty()) out.push_back(v->get<std::string>());
    return std::nullopt;
  }
  if (!v->is_array()) return WrongType("stop", "a string or an array of strings", *v);
  if (v->size() > 4) return BadRequest("'stop' takes at most 4 strings, got " + std::to_string(v->size()), "stop");
  for (const auto& s : *v) {
    if (!s.is_string()) return WrongType("stop", "a string or an array of strings", s);
    if (!s.get<std::string>().empty()) out.push_back(s.get<std::string>());
  }
  return std::nullopt;
}

std::variant<Json, ApiError> ParseObject(std::string_view body) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return BadRequest("the request body is not valid JSON");
  if (!j.is_object()) return BadRequest("the request body must be a JSON object, got " + TypeName(j));
  return j;
}

}  // namespace

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Json ErrorBody(const ApiError& e) {
  Json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return Json{{"error", err}};
}

ApiError BadRequest(std::string message, std::string param) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

std::variant<Json, ApiError> NormalizeMessages(const Json& messages, const std::string& param) {
  if (!messages.is_array()) return WrongType(param, "an array of messages", messages);
  if (messages.empty()) return BadRequest("'" + param + "' must hold at least one message", param);
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string where = param + "[" + std::to_string(i) + "]";
    if (!m.is_object()) return WrongType(where, "an object", m);
    const Json* role = Field(m, "role");
    if (!role || !role->is_string() || role->get<std::string>().empty())
      return BadRequest("'" + where + ".role' must be a non-empty string", where + ".role");
    Json n = m;
    const Json* content = Field(m, "content");
    if (content && content->is_array()) {
      // Content parts: only text can be rendered by a text model.
      std::string text;
      for (const auto& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          return BadRequest("'" + where + ".content' may hold only text parts ({\"type\": \"text\", \"text\": ...})",
                            where + ".content");
        text += part["text"].get<std::string>();
      }
      n["content"] = text;
    } else if (content && !content->is_string()) {
      return WrongType(where + ".content", "a string or an array of text parts", *content);
    } else if (!content) {
      n["content"] = "";
    }
    out.push_back(std::move(n));
  }
  return out;
}

std::variant<CompletionRequest, ApiError> ParseCompletionRequest(std::string_view body, bool chat) {
  auto parsed = ParseObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& j = std::get<Json>(parsed);
  CompletionRequest r;
  r.chat = chat;
  std::optional<std::string> model;
  if (auto e = ReadString(j, "model", model)) return *e;
  r.model = model.value_or("");
  if (chat) {
    const Json* m = Field(j, "messages");
    if (!m) return BadRequest("'messages' is required", "messages");
    auto n = NormalizeMessages(*m);
    if (auto* e = std::get_if<ApiError>(&n)) return *e;
    r.messages = std::get<Json>(n);
    if (const Json* k = Field(j, "chat_template_kwargs")) {
      if (!k->is_object()) return WrongType("chat_template_kwargs", "an object", *k);
      r.template_kwargs = *k;
    }
  } else {
    const Json* p = Field(j, "prompt");
    if (!p) return BadRequest("'prompt' is required", "prompt");
    if (p->is_string()) {
      r.prompt = p->get<std::string>();
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
      r.prompt = (*p)[0].get<std::string>();
    } else if (p->is_array() && !p->empty() &&
               std::all_of(p->begin(), p->end(), [](const Json& x) { return x.is_number_integer(); })) {
      std::vector<int32_t> ids;
      for (const auto& x : *p) {
        const int64_t id = x.get<int64_t>();
        if (id < 0 || id > std::numeric_limits<int32_t>::max())
          return BadRequest("'prompt' holds a token id out of range: " + std::to_string(id), "prompt");
        ids.push_back(static_cast<int32_t>(id));
      }
      r.prompt_ids = std::move(ids);
    } else if (p->is_array()) {
      return BadRequest(
          "'prompt' must be one string or one list of token ids (this server makes one choice per request)", "prompt");
    } else {
      return WrongType("prompt", "a string", *p);
    }
  }
  std::optional<int64_t> max_tokens;
  if (auto e = ReadInt(j, "max_tokens", 1, 1 << 24, max_tokens)) return *e;
  if (chat) {
    std::optional<int64_t> mct;
    if (auto e = ReadInt(j, "max_completion_tokens", 1, 1 << 24, mct)) return *e;
    if (mct) max_tokens = mct;
  }
  if (max_tokens) r.max_tokens = static_cast<int>(*max_tokens);
  std::optional<float> temperature, top_p;
  if (auto e = ReadFloat(j, "temperature", 0.0, 2.0, false, temperature)) return *e;
  if (auto e = ReadFloat(j, "top_p", 0.0, 1.0, true, top_p)) return *e;
  r.temperature = temperature.value_or(1.0f);
  r.top_p = top_p.value_or(1.0f);
  std::optional<int64_t> top_k, seed;
  if (auto e = ReadInt(j, "top_k", 0, 1 << 24, top_k)) return *e;
  r.top_k = static_cast<int>(top_k.value_or(0));
  if (auto e = ReadInt(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), seed))
    return *e;
  if (seed) r.seed = static_cast<uint64_t>(*seed);
  if (auto e = ReadStop(j, r.stop)) return *e;
  std::optional<bool> stream;
  if (auto e = ReadBool(j, "stream", stream)) return *e;
  r.stream = stream.value_or(false);
  if (const Json* so = Field(j, "stream_options")) {
    if (!so->is_object()) return WrongType("stream_options", "an object", *so);
    std::optional<bool> usage;
    if (auto e = ReadBool(*so, "include_usage", usage)) {
      e->param = "stream_options.include_usage";
      return *e;
    }
    r.include_usage = usage.value_or(false);
  }
  if (const Json* rf = Field(j, "response_format")) {
    if (!rf->is_object()) return WrongType("response_format", "an object", *rf);
    const Json* type = Field(*rf, "type");
    if (!type || !type->is_string()) return BadRequest("'response_format.type' must be a string", "response_format");
    const std::string t = type->get<std::string>();
    if (t == "json_object") {
      r.json_object = true;
    } else if (t != "text") {
      return BadRequest("'response_format.type' must be 'text' or 'json_object', got '" + t + "'", "response_format");
    }
  }
  std::optional<std::string> user;
  if (auto e = ReadString(j, "user", user)) return *e;
  r.user = user.value_or("");
  if (auto e = RefuseUnsupported(j, chat)) return *e;
  return r;
}

std::variant<UiGenerateRequest, ApiError> ParseUiGenerateRequest(std::string_view body) {
  auto parsed = ParseObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& j = std::get<Json>(parsed);
  UiGenerateRequest r;
  std::optional<std::string> prompt;
  if (auto e = ReadString(j, "prompt", prompt)) return *e;
  if (!prompt || prompt->empty()) return BadRequest("'prompt' is required", "prompt");
  r.prompt = *prompt;
  std::optional<int64_t> max_tokens, ctx, seed, top_k, stages;
  if (auto e = ReadInt(j, "stages", 1, 64, stages)) return *e;
  if (stages) r.stages = static_cast<int>(*stages);
  if (auto e = ReadInt(j, "max_tokens", 1, 1 << 24, max_tokens)) return *e;
  if (auto e = ReadInt(j, "ctx", 0, 1 << 24, ctx)) return *e;
  if (auto e = ReadInt(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), seed))
    return *e;
  if (auto e = ReadInt(j, "top_k", 0, 1 << 24, top_k)) return *e;
  std::optional<float> temperature, top_p;
  if (auto e = ReadFloat(j, "temperature", 0.0, 100.0, false, temperature)) return *e;
  if (auto e = ReadFloat(j, "top_p", 0.0, 1.0, true, top_p)) return *e;
  std::optional<bool> verify, json;
  if (auto e = ReadBool(j, "verify", verify)) return *e;
  if (auto e = ReadBool(j, "json", json)) return *e;
  r.max_tokens = static_cast<int>(max_tokens.value_or(60));
  r.ctx = static_cast<int>(ctx.value_or(0));
  r.seed = static_cast<uint64_t>(seed.value_or(1234));
  r.top_k = static_cast<int>(top_k.value_or(0));
  r.temperature = temperature.value_or(0.0f);
  r.top_p = top_p.value_or(1.0f);
  r.verify = verify.value_or(false);
  r.json = json.value_or(false);
  return r;
}

std::variant<UiChatRequest, ApiError> ParseUiChatRequest(std::string_view body) {
  auto parsed = ParseObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& j = std::get<Json>(parsed);
  static const char* const kKnown[] = {"conversation", "messages", "max_tokens", "ctx",    "temperature",
                                       "seed",         "top_p",    "top_k",      "verify", "stages"};
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (std::find_if(std::begin(kKnown), std::end(kKnown), [&name = key](const char* k) { return name == k; }) ==
        std::end(kKnown))
      return BadRequest("unknown field '" + key.substr(0, 64) +
                            "' (known: conversation, messages, max_tokens, ctx, temperature, seed, top_p, top_k, "
                            "verify, stages)",
                        key.substr(0, 64));
  }
  UiChatRequest r;
  std::optional<std::string> conversation;
  if (auto e = ReadString(j, "conversation", conversation)) return *e;
  if (conversation) {
    // An id the UI makes (letters, digits, '-', '_', '.', ':'): it names a cache slot and
    // shows up in status lines, so nothing else is let in.
    const std::string& c = *conversation;
    const bool ok_chars = std::all_of(c.begin(), c.end(), [](char ch) {
      return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
             ch == '_' || ch == '.' || ch == ':';
    });
    if (c.empty() || c.size() > kMaxConversationId || !ok_chars)
      return BadRequest("'conversation' must be 1 to " + std::to_string(kMaxConversationId) +
                            " letters, digits, '-', '_', '.' or ':'",
                        "conversation");
    r.conversation = c;
  }
  const Json* m = Field(j, "messages");
  if (!m) return BadRequest("'messages' is required", "messages");
  if (!m->is_array()) return WrongType("messages", "an array of {\"role\", \"content\"}", *m);
  if (m->empty()) return BadRequest("'messages' must hold at least one message", "messages");
  if (m->size() > kMaxChatMessages)
    return BadRequest(
        "'messages' holds " + std::to_string(m->size()) + " messages, at most " + std::to_string(kMaxChatMessages),
        "messages");
  size_t chars = 0;
  r.messages = Json::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const Json& msg = (*m)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) return WrongType(where, "an object {\"role\", \"content\"}", msg);
    for (const auto& [key, value] : msg.items()) {
      (void)value;
      if (key != "role" && key != "content")
        return BadRequest("'" + where + "' has an unknown field '" + key.substr(0, 64) + "' (only role and content)",
                          where + "." + key.substr(0, 64));
    }
    const Json* role = Field(msg, "role");
    if (!role) return BadRequest("'" + where + ".role' is required", where + ".role");
    if (!role->is_string()) return WrongType(where + ".role", "a string", *role);
    const std::string rs = role->get<std::string>();
    if (rs != "system" && rs != "user" && rs != "assistant")
      return BadRequest(
          "'" + where + ".role' must be \"system\", \"user\" or \"assistant\", got " + Dump(*role).substr(0, 40),
          where + ".role");
    if (rs == "system" && i != 0)
      return BadRequest("'" + where + "' is a system message: only the first message may be one", where + ".role");
    const Json* content = Field(msg, "content");
    if (!content) return BadRequest("'" + where + ".content' is required", where + ".content");
    if (!content->is_string()) return WrongType(where + ".content", "a string", *content);
    const std::string& text = content->get_ref<const std::string&>();
    if (text.empty() && rs == "user")
      return BadRequest("'" + where + ".content' is empty: a user message must say something", where + ".content");
    chars += text.size();
    if (chars > kMaxChatChars)
      return BadRequest(
          "the messages are too long: more than " + std::to_string(kMaxChatChars) + " bytes of content in all",
          where + ".content");
    r.messages.push_back(Json{{"role", rs}, {"content", text}});
  }
  if (r.messages.back()["role"] != "user")
    return BadRequest("the last message must be the user's (the reply answers it), got " +
                          r.messages.back()["role"].get<std::string>(),
                      "messages[" + std::to_string(m->size() - 1) + "].role");
  std::optional<int64_t> max_tokens, ctx, seed, top_k, stages;
  if (auto e = ReadInt(j, "max_tokens", 1, 1 << 24, max_tokens)) return *e;
  if (auto e = ReadInt(j, "ctx", 0, 1 << 24, ctx)) return *e;
  if (auto e = ReadInt(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), seed))
    return *e;
  if (auto e = ReadInt(j, "top_k", 0, 1 << 24, top_k)) return *e;
  if (auto e = ReadInt(j, "stages", 1, 64, stages)) return *e;
  std::optional<float> temperature, top_p;
  if (auto e = ReadFloat(j, "temperature", 0.0, 100.0, false, temperature)) return *e;
  if (auto e = ReadFloat(j, "top_p", 0.0, 1.0, true, top_p)) return *e;
  std::optional<bool> verify;
  if (auto e = ReadBool(j, "verify", verify)) return *e;
  r.max_tokens = static_cast<int>(max_tokens.value_or(256));
  r.ctx = static_cast<int>(ctx.value_or(0));
  r.seed = static_cast<uint64_t>(seed.value_or(1234));
  r.top_k = static_cast<int>(top_k.value_or(0));
  if (stages) r.stages = static_cast<int>(*stages);
  r.temperature = temperature.value_or(0.0f);
  r.top_p = top_p.value_or(1.0f);
  r.verify = verify.value_or(false);
  return r;
}

std::string PlainChatPrompt(const Json& messages) {
  std::string out;
  for (const auto& m : messages) out += m.value("content", "");
  return out;
}

std::variant<ApplyTemplateRequest, ApiError> ParseApplyTemplateRequest(std::string_view body) {
  auto parsed = ParseObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& j = std::get<Json>(parsed);
  ApplyTemplateRequest r;
  const Json* m = Field(j, "messages");
  if (!m) return BadRequest("'messages' is required", "messages");
  auto n = NormalizeMessages(*m);
  if (auto* e = std::get_if<ApiError>(&n)) return *e;
  r.messages = std::get<Json>(n);
  std::optional<bool> agp;
  if (auto e = ReadBool(j, "add_generation_prompt", agp)) return *e;
  r.add_generation_prompt = agp.value_or(true);
  for (const auto& [key, value] : j.items()) {
    if (key == "messages" || key == "add_generation_prompt") continue;
    if (key == "chat_template_kwargs") {
      if (!value.is_object()) return WrongType("chat_template_kwargs", "an object", value);
      for (const auto& [k, v] : value.items()) r.kwargs[k] = v;
      continue;
    }
    r.kwargs[key] = value;
  }
  return r;
}

Json Usage(const CompletionResult& r) {
  return Json{{"prompt_tokens", r.prompt_tokens},
              {"completion_tokens", r.completion_tokens},
              {"total_tokens", r.prompt_tokens + r.completion_tokens}};
}

Json CompletionResponse(const CompletionResult& r, bool chat) {
  Json choice = {{"index", 0}, {"finish_reason", r.finish_reason}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
    choice["logprobs"] = nullptr;
  } else {
    choice["text"] = r.text;
    choice["logprobs"] = nullptr;
  }
  return Json{{"id", r.id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", r.created},
              {"model", r.model},
              {"choices", Json::array({choice})},
              {"usage", Usage(r)}};
}

Json CompletionChunk(const CompletionResult& r, bool chat, const std::string& text, bool first,
                     const std::string& finish_reason) {
  Json choice = {{"index", 0}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish_reason.empty() ? Json(nullptr) : Json(finish_reason);
  if (chat) {
    Json delta = Json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (!first && finish_reason.empty())) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return Json{{"id", r.id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", r.created},
              {"model", r.model},
              {"choices", Json::array({choice})}};
}

Json UsageChunk(const CompletionResult& r, bool chat) {
  return Json{{"id", r.id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", r.created},
              {"model", r.model},
              {"choices", Json::array()},
              {"usage", Usage(r)}};
}

std::string NewCompletionId(bool chat) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = chat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 24; ++i) id.push_back(kHex[rng() & 15]);
  return id;
}

std::string SseEvent(std::string_view name, const Json& data) {
  std::string s = "event: ";
  s.append(name);
  s += "\ndata: ";
  s += Dump(data);
  s += "\n\n";
  return s;
}

std::string SseData(std::string_view data) {
  std::string s = "data: ";
  s.append(data);
  s += "\n\n";
  return s;
}

std::string StopMatcher::Add(std::string_view text) {
  if (stopped_) return "";
  pending_.append(text);
  // The earliest complete stop string ends the text.
  size_t cut = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = pending_.find(s);
    if (at != std::string::npos && at < cut) cut = at;
  }
  std::string out;
  if (cut != std::string::npos) {
    out = pending_.substr(0, cut);
    pending_.clear();
    stopped_ = true;
  } else {
    // Hold back the longest tail that is a proper prefix of some stop string.
    size_t hold = 0;
    for (const auto& s : stops_) {
      for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
        if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
          hold = len;
          break;
        }
      }
    }
    out = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
  }
  shown_ += out;
  return out;
}

std::string StopMatcher::Finish() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  shown_ += out;
  return out;
}

}  // namespace daisy::srv
