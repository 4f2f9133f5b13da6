// The OpenAI-compatible API: GET /v1/models, POST /v1/completions and
// /v1/chat/completions (whole answers or streamed chunks), and POST /apply-template.
// Internal to src/server; thread-safe.
#pragma once

#include "guarded_http.h"

namespace daisy {
class HeadSession;
}

namespace daisy::srv {

class ModelExtras;
class TurnRunner;

class OpenAiApi {
 public:
  OpenAiApi(HeadSession& session, TurnRunner& runner, ModelExtras& extras)
      : session_(session), runner_(runner), extras_(extras) {}
  void AddRoutes(GuardedHttpServer& http);

 private:
  void HandleModels(httplib::Response& res);
  void HandleApplyTemplate(const httplib::Request& req, httplib::Response& res);
  void HandleCompletion(const httplib::Request& req, httplib::Response& res, bool chat);

  HeadSession& session_;
  TurnRunner& runner_;
  ModelExtras& extras_;
};

}  // namespace daisy::srv
