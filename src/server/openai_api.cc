#include "openai_api.h"

#include <ctime>
#include <random>

#include "daisy/head.h"
#include "daisy/sampling.h"
#include "http_common.h"
#include "model_extras.h"
#include "sse_stream.h"
#include "turn_runner.h"

namespace daisy::srv {

void OpenAiApi::AddRoutes(GuardedHttpServer& http) {
  using Req = httplib::Request;
  using Res = httplib::Response;
  http.Post("/apply-template", [this](const Req& req, Res& res) { HandleApplyTemplate(req, res); });
  http.Get("/v1/models", [this](const Req&, Res& res) { HandleModels(res); });
  http.Post("/v1/completions", [this](const Req& req, Res& res) { HandleCompletion(req, res, false); });
  http.Post("/v1/chat/completions", [this](const Req& req, Res& res) { HandleCompletion(req, res, true); });
}

void OpenAiApi::HandleModels(httplib::Response& res) {
  Json data = Json::array();
  if (auto m = session_.model())
    data.push_back({{"id", m->model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "daisychain"}});
  SendJson(res, Json{{"object", "list"}, {"data", data}});
}

void OpenAiApi::HandleApplyTemplate(const httplib::Request& req, httplib::Response& res) {
  auto parsed = ParseApplyTemplateRequest(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return SendError(res, *e);
  const auto& r = std::get<ApplyTemplateRequest>(parsed);
  auto model = session_.model();
  if (!model) {
    ApiError e = NoModel();
    e.status = 400;
    e.type = "invalid_request_error";
    return SendError(res, e);
  }
  auto text = extras_.RenderChat(*model, r.messages, r.add_generation_prompt, r.kwargs);
  if (!text.ok()) return SendError(res, BadRequest(text.status().message(), "messages"));
  SendJson(res, Json{{"prompt", *text}});
}

void OpenAiApi::HandleCompletion(const httplib::Request& req, httplib::Response& res, bool chat) {
  auto parsed = ParseCompletionRequest(req.body, chat);
  if (auto* e = std::get_if<ApiError>(&parsed)) return SendError(res, *e);
  auto r = std::get<CompletionRequest>(parsed);
  auto loaded = runner_.Loaded();
  if (auto* e = std::get_if<ApiError>(&loaded)) return SendError(res, *e);
  const ModelView model = std::get<LoadedModel>(loaded).model;
  const std::shared_ptr<const Tokenizer> tok = std::get<LoadedModel>(loaded).tokenizer;
  if (!r.model.empty() && r.model != model.model_id && r.model != model.source) {
    ApiError e;
    e.status = 404;
    e.type = "invalid_request_error";
    e.code = "model_not_found";
    e.param = "model";
    e.message = "The model '" + r.model + "' does not exist here: this server has '" + model.model_id +
                "' loaded (GET /v1/models)";
    return SendError(res, e);
  }
  // Tokenized now, while an earlier turn may still hold the ring.
  std::vector<int32_t> ids;
  if (chat) {
    auto text = extras_.RenderChat(model, r.messages, /*add_generation_prompt=*/true, r.template_kwargs);
    if (!text.ok()) return SendError(res, BadRequest(text.status().message(), "messages"));
    // The template writes the special tokens itself (as transformers' apply_chat_template).
    auto e = tok->Encode(*text, /*add_special_tokens=*/false);
    if (!e.ok()) return SendError(res, FromStatus(e.status(), "messages"));
    ids = std::move(*e);
  } else if (r.prompt_ids) {
    for (int32_t id : *r.prompt_ids)
      if (id >= tok->vocab_size())
        return SendError(res, BadRequest("'prompt' holds token id " + std::to_string(id) +
                                             ", outside the vocabulary of " + std::to_string(tok->vocab_size()),
                                         "prompt"));
    ids = *r.prompt_ids;
  } else {
    auto e = tok->Encode(r.prompt, /*add_special_tokens=*/true);
    if (!e.ok()) return SendError(res, FromStatus(e.status(), "prompt"));
    ids = std::move(*e);
  }
  const char* prompt_param = chat ? "messages" : "prompt";
  if (ids.empty()) return SendError(res, BadRequest("the prompt is empty (no tokens)", prompt_param));
  if (static_cast<int>(ids.size()) >= model.ctx)
    return SendError(res, BadRequest("the prompt has " + std::to_string(ids.size()) + " tokens; the context holds " +
                                         std::to_string(model.ctx) + " (this model's context at this server)",
                                     prompt_param));
  TurnSpec spec;
  spec.tokenizer = tok;
  spec.generate.max_tokens = r.max_tokens.value_or(chat ? model.ctx - static_cast<int>(ids.size()) : 16);
  spec.generate.sampling.temperature = r.temperature;
  spec.generate.sampling.top_p = r.top_p;
  spec.generate.sampling.top_k = r.top_k;
  spec.generate.sampling.seed = r.seed ? *r.seed : std::random_device{}() * 0x100000000ull + std::random_device{}();
  if (Status st = ValidateSamplingParams(spec.generate.sampling); !st.ok()) return SendError(res, FromStatus(st));
  spec.prompt_ids = std::move(ids);
  spec.json = r.json_object;
  spec.conversation = r.user;
  spec.stops = r.stop;
  spec.stages = runner_.DefaultStages();

  CompletionResult base;
  base.id = NewCompletionId(chat);
  base.created = static_cast<int64_t>(std::time(nullptr));
  base.model = model.model_id;
  base.prompt_tokens = static_cast<int>(spec.prompt_ids.size());

  if (!r.stream) {
    TurnOutcome o = runner_.Run(spec, TurnHooks{});
    if (!o.status.ok()) return SendError(res, FromStatus(o.status));
    base.text = o.text;
    base.finish_reason = o.finish_reason;
    base.completion_tokens = o.completion_tokens;
    return SendJson(res, CompletionResponse(base, chat));
  }
  const bool include_usage = r.include_usage;
  StreamFrom(res, [this, spec, base, chat, include_usage](const std::shared_ptr<Outbox>& box,
                                                          const std::function<bool()>& alive) {
    auto first = std::make_shared<bool>(true);
    TurnHooks hooks;
    hooks.alive = alive;
    hooks.on_text = [box, base, chat, first](int32_t, const std::string& text) {
      if (text.empty() && !(*first && chat)) return;
      box->Push(SseData(Dump(CompletionChunk(base, chat, text, *first, ""))));
      *first = false;
    };
    TurnOutcome o = runner_.Run(spec, hooks);
    if (o.cancelled) return;
    if (!o.status.ok()) {
      box->Push(SseData(Dump(ErrorBody(FromStatus(o.status)))));
      box->Push(SseData("[DONE]"));
      return;
    }
    CompletionResult done = base;
    done.text = o.text;
    done.finish_reason = o.finish_reason;
    done.completion_tokens = o.completion_tokens;
    box->Push(SseData(Dump(CompletionChunk(done, chat, "", *first, o.finish_reason))));
    if (include_usage) box->Push(SseData(Dump(UsageChunk(done, chat))));
    box->Push(SseData("[DONE]"));
  });
}

}  // namespace daisy::srv
