// What every request meets first, and the pages: the access guard (access.h, decided on
// the headers before a body is read), the UI's page with its admin cookie, the embedded
// assets (the join page and the browser node's module among them), and the OpenAI error
// shape for unknown paths and failed handlers. Internal to src/server; thread-safe.
#pragma once

#include <string>

#include "access.h"
#include "guarded_http.h"
#include "http_common.h"

namespace daisy::srv {

class FrontDoor {
 public:
  FrontDoor(AccessPolicy policy, SourceOf source_of) : policy_(std::move(policy)), source_of_(std::move(source_of)) {}

  // The guard, GET / and the assets, and the error handlers.
  void AddRoutes(GuardedHttpServer& http) const;

 private:
  // Writes the refusal and returns true when `req` may not be served.
  bool Refuse(const httplib::Request& req, httplib::Response& res) const;
  void HandlePage(const std::string& path, const httplib::Request& req, httplib::Response& res) const;
  static void ServeAsset(const std::string& path, const httplib::Request& req, httplib::Response& res);

  const AccessPolicy policy_;
  const SourceOf source_of_;
};

}  // namespace daisy::srv
