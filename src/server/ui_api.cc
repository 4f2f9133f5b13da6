#include "ui_api.h"

#include "event_hub.h"
#include "model_extras.h"
#include "sse_stream.h"
#include "state_watcher.h"

namespace daisy::srv {

namespace {

// The done event of a UI turn: the text, the ids, the timings and each stage's share.
Json DoneJson(const TurnOutcome& o) {
  const HeadReport& r = o.report;
  Json stages = Json::array();
  for (size_t i = 0; i < r.plan.size(); ++i) {
    Json s = StageJson(r.plan[i], i);
    s["hops"] = 0;
    s["ms_per_hop"] = 0.0;
    for (const auto& l : r.stage_latency) {
      if (l.stage != static_cast<int>(i)) continue;
      s["hops"] = l.hops;
      s["ms_per_hop"] = l.hops > 0 ? l.compute_seconds * 1e3 / static_cast<double>(l.hops) : 0.0;
    }
    stages.push_back(std::move(s));
  }
  Json verified = nullptr;
  if (r.verified) verified = *r.verified;
  return Json{{"text", o.text},
              {"ids", r.ids},
              {"prompt_ids", r.prompt_ids},
              {"finish_reason", o.finish_reason},
              {"tokens_per_s", r.tokens_per_s},
              {"prefill_ms", r.prefill_seconds * 1e3},
              {"decode_ms", r.decode_seconds * 1e3},
              {"ring_hops", r.ring_hops},
              {"ring_positions", r.ring_positions},
              {"reused_positions", r.reused_positions},
              {"laps", r.laps},
              {"lap_ms", r.laps > 0 ? r.lap_seconds * 1e3 / static_cast<double>(r.laps) : 0.0},
              {"drafted", r.drafted},
              {"accepted", r.accepted},
              {"stages", stages},
              {"replays", r.replays},
              {"verified", verified},
              {"verify_message", r.verify_message},
              {"mismatch_position", r.mismatch_position ? Json(*r.mismatch_position) : Json(nullptr)},
              {"mismatch", r.mismatch.empty() ? Json(nullptr) : Json(r.mismatch)}};
}

}  // namespace

UiApi::UiApi(EventHub& hub, StateWatcher& state, TurnRunner& runner, ModelExtras& extras, SourceOf source_of)
    : hub_(hub), state_(state), runner_(runner), extras_(extras), source_of_(std::move(source_of)) {}

void UiApi::AddRoutes(GuardedHttpServer& http) {
  using Req = httplib::Request;
  using Res = httplib::Response;
  http.Get("/api/state", [this](const Req&, Res& res) { HandleState(res); });
  http.Get("/api/events", [this](const Req& req, Res& res) { hub_.Serve(ClientOf(req, source_of_), res); });
  http.Post("/api/generate", [this](const Req& req, Res& res) { HandleGenerate(req, res); });
  http.Post("/api/chat", [this](const Req& req, Res& res) { HandleChat(req, res); });
}

void UiApi::HandleState(httplib::Response& res) {
  state_.Refresh();
  res.set_content(hub_.state(), "application/json");
}

template <class Request>
std::optional<UiApi::Prelude<Request>> UiApi::Begin(std::variant<Request, ApiError> parsed,
                                                    httplib::Response& res) const {
  if (auto* e = std::get_if<ApiError>(&parsed)) {
    SendError(res, *e);
    return std::nullopt;
  }
  auto loaded = runner_.Loaded();
  if (auto* e = std::get_if<ApiError>(&loaded)) {
    SendError(res, *e);
    return std::nullopt;
  }
  Prelude<Request> p{std::move(std::get<Request>(parsed)), std::move(std::get<LoadedModel>(loaded)), {}};
  const Request& r = p.request;
  p.sampling = SamplingParams{r.temperature, r.top_k, r.top_p, r.seed};
  if (Status st = ValidateSamplingParams(p.sampling); !st.ok()) {
    SendError(res, FromStatus(st));
    return std::nullopt;
  }
  return p;
}

template <class Request>
TurnSpec UiApi::SpecOf(const Prelude<Request>& p, std::vector<int32_t> prompt_ids) const {
  const Request& r = p.request;
  TurnSpec spec;
  spec.prompt_ids = std::move(prompt_ids);
  spec.tokenizer = p.loaded.tokenizer;
  spec.generate.max_tokens = r.max_tokens;
  spec.generate.sampling = p.sampling;
  spec.ctx = r.ctx;
  spec.verify = r.verify;
  spec.stages = r.stages ? r.stages : runner_.DefaultStages();
  return spec;
}

void UiApi::HandleGenerate(const httplib::Request& req, httplib::Response& res) {
  auto p = Begin(ParseUiGenerateRequest(req.body), res);
  if (!p) return;
  const UiGenerateRequest& r = p->request;
  // Tokenized now, while an earlier turn may still hold the ring.
  auto ids = p->loaded.tokenizer->Encode(r.prompt, /*add_special_tokens=*/true);
  if (!ids.ok()) return SendError(res, FromStatus(ids.status(), "prompt"));
  const int ctx = r.ctx > 0 ? r.ctx : p->loaded.model.ctx;
  if (static_cast<int>(ids->size()) >= ctx)
    return SendError(res, BadRequest("the prompt has " + std::to_string(ids->size()) + " tokens; the context holds " +
                                         std::to_string(ctx),
                                     "prompt"));
  TurnSpec spec = SpecOf(*p, std::move(*ids));
  spec.json = r.json;
  StreamTurn(res, std::move(spec), Json::object());
}

// A conversation of the UI: rendered with the model's chat template (as
// /v1/chat/completions), or as plain completion for a model without one; the
// conversation id keys the prefix cache, so a next turn sends only its new positions.
void UiApi::HandleChat(const httplib::Request& req, httplib::Response& res) {
  auto p = Begin(ParseUiChatRequest(req.body), res);
  if (!p) return;
  const UiChatRequest& r = p->request;
  const ModelView& model = p->loaded.model;
  // Rendered and tokenized now, while an earlier turn may still hold the ring.
  extras_.LoadFor(model);
  const bool has_template = extras_.HasTemplate(model);
  Result<std::vector<int32_t>> ids = std::vector<int32_t>{};
  if (has_template) {
    auto text = extras_.RenderChat(model, r.messages, /*add_generation_prompt=*/true, Json::object());
    if (!text.ok()) return SendError(res, BadRequest(text.status().message(), "messages"));
    ids = p->loaded.tokenizer->Encode(*text, /*add_special_tokens=*/false);  // the template writes them
  } else {
    ids = p->loaded.tokenizer->Encode(PlainChatPrompt(r.messages), /*add_special_tokens=*/true);
  }
  if (!ids.ok()) return SendError(res, FromStatus(ids.status(), "messages"));
  if (ids->empty()) return SendError(res, BadRequest("the conversation is empty (no tokens)", "messages"));
  const int ctx = r.ctx > 0 ? r.ctx : model.ctx;
  if (static_cast<int>(ids->size()) >= ctx)
    return SendError(res,
                     BadRequest("the conversation has " + std::to_string(ids->size()) + " tokens; the context holds " +
                                    std::to_string(ctx) + ": start a new chat or shorten it",
                                "messages"));
  TurnSpec spec = SpecOf(*p, std::move(*ids));
  // Its own key space: a UI conversation never takes the slot of an API `user`.
  if (!r.conversation.empty()) spec.conversation = "ui-chat:" + r.conversation;
  Json extra = {{"mode", has_template ? "template" : "plain"},
                {"conversation", r.conversation.empty() ? Json(nullptr) : Json(r.conversation)},
                {"prompt_tokens", spec.prompt_ids.size()}};
  StreamTurn(res, std::move(spec), std::move(extra));
}

void UiApi::StreamTurn(httplib::Response& res, TurnSpec spec, Json done_extra) {
  StreamFrom(res, [this, spec = std::move(spec), done_extra = std::move(done_extra)](
                      const std::shared_ptr<Outbox>& box, const std::function<bool()>& alive) {
    TurnHooks hooks;
    hooks.alive = alive;
    hooks.on_queued = [box](int position) { box->Push(SseEvent("queued", Json{{"position", position}})); };
    hooks.on_started = [box] { box->Push(SseEvent("status", Json{{"line", "your turn: the ring is yours"}})); };
    hooks.on_text = [box](int32_t id, const std::string& text) {
      if (id < 0) {
        if (!text.empty()) box->Push(SseEvent("token", Json{{"id", nullptr}, {"text", text}}));
        return;
      }
      box->Push(SseEvent("token", Json{{"id", id}, {"text", text}}));
    };
    hooks.on_status = [box](const std::string& line) { box->Push(SseEvent("status", Json{{"line", line}})); };
    hooks.on_retract = [box](size_t kept, const std::string& text) {
      box->Push(SseEvent("retract", Json{{"kept", kept}, {"text", text}}));
    };
    hooks.on_progress = [box](const StageProgress& p) { box->Push(SseEvent("progress", ProgressJson(p))); };
    TurnOutcome o = runner_.Run(spec, hooks);
    if (o.cancelled) return;
    if (!o.status.ok()) {
      box->Push(SseEvent("error", Json{{"message", o.status.message()}}));
      return;
    }
    Json done = DoneJson(o);
    done.update(done_extra);
    box->Push(SseEvent("done", done));
  });
}

}  // namespace daisy::srv
