// GET /api/key and POST /api/join (docs/HTTP.md): how a device that the rendezvous does
// not admit yet learns its key and asks the host to approve its own.
#include "join.h"

#include "api.h"
#include "daisy/net.h"

namespace daisy::srv {

namespace {

void Send(httplib::Response& res, int status, const Json& j) {
  res.status = status;
  res.set_content(Dump(j), "application/json");
}

void SendError(httplib::Response& res, int status, const std::string& message, const std::string& param = "",
               const std::string& type = "invalid_request_error") {
  ApiError e;
  e.status = status;
  e.message = message;
  e.param = param;
  e.type = type;
  Send(res, status, ErrorBody(e));
}

}  // namespace

void AddJoinRoutes(httplib::Server& http, net::Rendezvous* rv, std::string room_hint, const SourceOf& source_of,
                   std::string hub_endpoint) {
  http.Get("/api/key", [rv, room_hint, hub_endpoint](const httplib::Request&, httplib::Response& res) {
    if (!rv) return SendError(res, 503, "this server runs no rendezvous", "", "server_error");
    Send(res, 200,
         Json{{"public_key", rv->public_key()},
              {"fingerprint", net::Fingerprint(rv->public_key())},
              {"room", room_hint},
              {"hub_endpoint", hub_endpoint}});
  });
  http.Post("/api/join", [rv, source_of](const httplib::Request& req, httplib::Response& res) {
    if (!rv) return SendError(res, 503, "this server runs no rendezvous", "", "server_error");
    Json j = Json::parse(req.body, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return SendError(res, 400, "the body must be {\"room\", \"public_key\", \"name\"}");
    for (const char* field : {"room", "public_key"})
      if (!j.contains(field) || !j[field].is_string())
        return SendError(res, 400, std::string(field) + " must be a string", field);
    if (j.contains("name") && !j["name"].is_string()) return SendError(res, 400, "name must be a string", "name");
    net::JoinRequest q;
    q.room = j["room"];
    q.public_key = j["public_key"];
    q.name = j.value("name", std::string());
    q.source = source_of ? source_of(req.remote_port) : "";
    if (q.source.empty()) q.source = req.remote_addr;
    auto a = rv->RequestJoin(q);
    if (!a.ok()) {
      const ErrorCode c = a.status().code();
      if (c == ErrorCode::kResourceExhausted) {
        res.set_header("Retry-After", "10");
        return SendError(res, 429, a.status().message(), "", "rate_limit_error");
      }
      if (c == ErrorCode::kInvalidArgument) return SendError(res, 400, a.status().message());
      return SendError(res, 503, a.status().message(), "", "server_error");
    }
    Send(res, 200, Json{{"status", a->approved ? "approved" : "pending"}, {"fingerprint", a->fingerprint}});
  });
}

}  // namespace daisy::srv
