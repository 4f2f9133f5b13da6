// The host's controls in the UI: approve a device that asked to join (POST /api/approve)
// and load a model (POST /api/load). Internal to src/server; thread-safe.
#pragma once

#include <functional>

#include "guarded_http.h"

namespace daisy {
class HeadSession;
namespace net {
class Rendezvous;
}
}  // namespace daisy

namespace daisy::srv {

class ModelExtras;
class TurnRunner;

class AdminApi {
 public:
  // `rendezvous` may be null (approval then answers 503); `on_change` is called after a
  // device was approved or a model loaded.
  AdminApi(net::Rendezvous* rendezvous, HeadSession& session, TurnRunner& runner, ModelExtras& extras,
           std::function<void()> on_change);
  void AddRoutes(GuardedHttpServer& http);

 private:
  void HandleApprove(const httplib::Request& req, httplib::Response& res);
  void HandleLoad(const httplib::Request& req, httplib::Response& res);

  net::Rendezvous* const rendezvous_;
  HeadSession& session_;
  TurnRunner& runner_;
  ModelExtras& extras_;
  const std::function<void()> on_change_;
};

}  // namespace daisy::srv
