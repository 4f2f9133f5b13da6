// The host's controls in the UI: approve a device that asked to join (POST /api/approve),
// load a model (POST /api/load), and give or forget the Hub token loads use (GET/POST
// /api/hub-token, POST /api/hub-token/forget). Internal to src/server; thread-safe.
#pragma once

#include <functional>
#include <memory>

#include "guarded_http.h"

namespace daisy {
class HeadSession;
class RuntimeToken;
namespace net {
class Rendezvous;
}
}  // namespace daisy

namespace daisy::srv {

class ModelExtras;
class TurnRunner;

class AdminApi {
 public:
  // `rendezvous` may be null (approval then answers 503); `token` may be null (the UI then
  // cannot give a token: 503); `on_change` is called after a device was approved or a model
  // loaded.
  AdminApi(net::Rendezvous* rendezvous, HeadSession& session, TurnRunner& runner, ModelExtras& extras,
           std::shared_ptr<RuntimeToken> token, std::function<void()> on_change);
  void AddRoutes(GuardedHttpServer& http);

 private:
  void HandleApprove(const httplib::Request& req, httplib::Response& res);
  void HandleLoad(const httplib::Request& req, httplib::Response& res);
  void HandleSetToken(const httplib::Request& req, httplib::Response& res);

  net::Rendezvous* const rendezvous_;
  HeadSession& session_;
  TurnRunner& runner_;
  ModelExtras& extras_;
  const std::shared_ptr<RuntimeToken> token_;
  const std::function<void()> on_change_;
};

}  // namespace daisy::srv
