#include "admin_api.h"

#include "daisy/head.h"
#include "daisy/hub.h"
#include "daisy/log.h"
#include "daisy/net.h"
#include "http_common.h"
#include "model_extras.h"
#include "turn_runner.h"

namespace daisy::srv {

AdminApi::AdminApi(net::Rendezvous* rendezvous, HeadSession& session, TurnRunner& runner, ModelExtras& extras,
                   std::shared_ptr<RuntimeToken> token, std::function<void()> on_change)
    : rendezvous_(rendezvous),
      session_(session),
      runner_(runner),
      extras_(extras),
      token_(std::move(token)),
      on_change_(std::move(on_change)) {}

void AdminApi::AddRoutes(GuardedHttpServer& http) {
  http.Post("/api/approve", [this](const httplib::Request& req, httplib::Response& res) { HandleApprove(req, res); });
  http.Post("/api/load", [this](const httplib::Request& req, httplib::Response& res) { HandleLoad(req, res); });
  // The token itself never comes back: only whether one is held.
  http.Get("/api/hub-token", [this](const httplib::Request&, httplib::Response& res) {
    SendJson(res, Json{{"set", token_ && token_->has()}});
  });
  http.Post("/api/hub-token",
            [this](const httplib::Request& req, httplib::Response& res) { HandleSetToken(req, res); });
  http.Post("/api/hub-token/forget", [this](const httplib::Request&, httplib::Response& res) {
    if (token_) token_->Forget();
    LogInfo("serve: the Hub token given in the web UI was forgotten");
    SendJson(res, Json{{"set", false}});
  });
}

void AdminApi::HandleSetToken(const httplib::Request& req, httplib::Response& res) {
  if (!token_) return SendError(res, FromStatus(Unavailable("this server takes no Hub token from the web UI")));
  Json j = Json::parse(req.body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("token") || !j["token"].is_string())
    return SendError(res, BadRequest("the body must be {\"token\": \"hf_...\"}", "token"));
  // Held in this process's memory only: not written, not logged, not sent to any device
  // (each device fetches its own layers with its own credentials).
  Status st = token_->Set(j["token"].get<std::string>());
  if (!st.ok()) return SendError(res, FromStatus(st, "token"));
  LogInfo("serve: a Hub token was given in the web UI (held in memory only)");
  SendJson(res, Json{{"set", true}});
}

void AdminApi::HandleApprove(const httplib::Request& req, httplib::Response& res) {
  Json j = Json::parse(req.body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_string() ||
      j["id"].get<std::string>().empty())
    return SendError(res, BadRequest("the body must be {\"id\": \"DEVICE_ID_OR_FINGERPRINT_PREFIX\"}", "id"));
  if (!rendezvous_) return SendError(res, FromStatus(Unavailable("this server runs no rendezvous")));
  Status st = rendezvous_->Approve(j["id"].get<std::string>());
  if (!st.ok()) {
    ApiError e = FromStatus(st, "id");
    if (st.code() == ErrorCode::kNotFound) e.status = 404;
    return SendError(res, e);
  }
  on_change_();
  SendJson(res, Json{{"ok", true}});
}

void AdminApi::HandleLoad(const httplib::Request& req, httplib::Response& res) {
  Json j = Json::parse(req.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return SendError(res, BadRequest("the request body is not a JSON object"));
  if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty())
    return SendError(res, BadRequest("'model' must name a Hub repo (owner/name) or a local folder", "model"));
  int ctx = 0;
  if (j.contains("ctx") && !j["ctx"].is_null()) {
    if (!j["ctx"].is_number_integer() || j["ctx"].get<int64_t>() < 0 || j["ctx"].get<int64_t>() > (1 << 24))
      return SendError(res, BadRequest("'ctx' must be a non-negative integer (0: the model's default)", "ctx"));
    ctx = static_cast<int>(j["ctx"].get<int64_t>());
  }
  int stages = runner_.default_stages();  // absent: the split stays as it was (serve --stages)
  if (j.contains("stages") && !j["stages"].is_null()) {
    if (!j["stages"].is_number_integer() || j["stages"].get<int64_t>() < 0 || j["stages"].get<int64_t>() > 64)
      return SendError(res, BadRequest("'stages' must be an integer from 0 (automatic) to 64", "stages"));
    stages = static_cast<int>(j["stages"].get<int64_t>());
  }
  auto m = runner_.Load(j["model"].get<std::string>(), ctx);
  if (!m.ok()) {
    ApiError e = FromStatus(m.status(), "model");
    // The Hub refused for want of a token (401), or the token has no access (403): the UI
    // asks for one and loads again.
    const ErrorCode c = m.status().code();
    if ((c == ErrorCode::kUnauthenticated || c == ErrorCode::kPermissionDenied) &&
        ParseHubRef(j["model"].get<std::string>()).ok()) {
      e.code = "hub_token_required";
      e.message = "this model needs a Hugging Face token: " + m.status().message();
    }
    return SendError(res, e);
  }
  runner_.set_default_stages(stages);
  Json plan = PlanJson(session_.PreviewPlan(runner_.DefaultStages()));
  on_change_();
  SendJson(res, Json{{"model", ModelJson(*m, extras_.HasTemplate(*m))}, {"plan", plan}});
}

}  // namespace daisy::srv
