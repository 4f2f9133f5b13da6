#include "admin_api.h"

#include "daisy/head.h"
#include "daisy/net.h"
#include "http_common.h"
#include "model_extras.h"
#include "turn_runner.h"

namespace daisy::srv {

AdminApi::AdminApi(net::Rendezvous* rendezvous, HeadSession& session, TurnRunner& runner, ModelExtras& extras,
                   std::function<void()> on_change)
    : rendezvous_(rendezvous), session_(session), runner_(runner), extras_(extras), on_change_(std::move(on_change)) {}

void AdminApi::AddRoutes(GuardedHttpServer& http) {
  http.Post("/api/approve", [this](const httplib::Request& req, httplib::Response& res) { HandleApprove(req, res); });
  http.Post("/api/load", [this](const httplib::Request& req, httplib::Response& res) { HandleLoad(req, res); });
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
  if (!m.ok()) return SendError(res, FromStatus(m.status(), "model"));
  runner_.set_default_stages(stages);
  Json plan = PlanJson(session_.PreviewPlan(runner_.DefaultStages()));
  on_change_();
  SendJson(res, Json{{"model", ModelJson(*m, extras_.HasTemplate(*m))}, {"plan", plan}});
}

}  // namespace daisy::srv
