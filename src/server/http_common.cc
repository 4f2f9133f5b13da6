#include "http_common.h"

namespace daisy::srv {

namespace {

double Mb(uint64_t bytes) {
  return static_cast<double>(bytes) / 1e6;
}

}  // namespace

std::string ClientOf(const httplib::Request& req, const SourceOf& source_of) {
  std::string who = source_of ? source_of(req.remote_port) : "";
  return who.empty() ? req.remote_addr : who;
}

ApiError FromStatus(const Status& st, const std::string& param) {
  ApiError e;
  e.message = st.message();
  e.param = param;
  switch (st.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kNotFound:
    case ErrorCode::kOutOfRange:
    case ErrorCode::kUnimplemented:
    case ErrorCode::kPermissionDenied:
    case ErrorCode::kUnauthenticated:
      e.status = 400;
      break;
    case ErrorCode::kUnavailable:
      e.status = 503;
      e.type = "server_error";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

ApiError NoModel() {
  ApiError e;
  e.status = 503;
  e.type = "server_error";
  e.code = "model_not_loaded";
  e.message = "no model is loaded: load one first (POST /api/load {\"model\": SRC} or `daisychain serve --model SRC`)";
  return e;
}

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(Dump(ErrorBody(e)), "application/json");
}

void SendJson(httplib::Response& res, const Json& j) {
  res.set_content(Dump(j), "application/json");
}

Json ModelJson(const ModelView& m, bool has_template) {
  return Json{{"source", m.source},
              {"model_id", m.model_id},
              {"revision", m.revision},
              {"architecture", m.spec.architecture},
              {"n_layers", m.spec.n_layers},
              {"hidden", m.spec.hidden},
              {"n_heads", m.spec.n_heads},
              {"n_kv_heads", m.spec.n_kv_heads},
              {"vocab", m.spec.vocab},
              {"max_positions", m.spec.max_positions},
              {"ctx", m.ctx},
              {"parameters", m.parameters},
              {"weight_bytes", m.weight_bytes},
              {"has_chat_template", has_template}};
}

Json StageJson(const StageAssignment& s, size_t index) {
  return Json{{"stage", static_cast<int>(index)},
              {"device_id", s.device_id},
              {"name", s.device_name},
              {"first", s.first},
              {"end", s.end},
              {"relayed", s.relayed}};
}

Json PlanJson(const Result<Plan>& plan) {
  if (!plan.ok()) {
    return Json{{"stages", Json::array()},
                {"est_ms_per_token", 0},
                {"fits", false},
                {"warning", plan.status().message()},
                {"notes", Json::array()}};
  }
  const Plan& p = *plan;
  Json stages = Json::array();
  for (size_t i = 0; i < p.stages.size(); ++i) {
    const auto& s = p.stages[i];
    Json j = StageJson(s, i);
    j["download_mb"] = Mb(s.download_bytes);
    j["hold_mb"] = Mb(s.hold_bytes);
    j["need_mb"] = Mb(s.need_bytes);
    j["budget_mb"] = Mb(s.budget_bytes);
    stages.push_back(std::move(j));
  }
  return Json{{"stages", stages},
              {"est_ms_per_token", p.est_seconds_per_token * 1e3},
              {"fits", p.fits},
              {"warning", p.warning},
              {"notes", p.notes}};
}

Json ProgressJson(const StageProgress& p) {
  return Json{{"stage", p.stage},
              {"device_id", p.device_id},
              {"name", p.device_name},
              {"bytes_done", p.bytes_done},
              {"bytes_total", p.bytes_total}};
}

}  // namespace daisy::srv
