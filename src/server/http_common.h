// What the handlers of serve's HTTP server share: error answers, the client a request
// comes from, and the JSON views of the session's model, plan and progress. Internal to
// src/server.
#pragma once

#include <httplib.h>

#include <functional>
#include <string>

#include "api.h"
#include "daisy/head.h"
#include "daisy/status.h"
#include "join.h"

namespace daisy::srv {

// Where a request comes from: the port mux's client (SourceOf, join.h) for a relayed
// connection, else the peer's address.
std::string ClientOf(const httplib::Request& req, const SourceOf& source_of);

// The HTTP status and error type of a failed Status.
ApiError FromStatus(const Status& st, const std::string& param = "");
// The 503 answer while no model is loaded.
ApiError NoModel();
void SendError(httplib::Response& res, const ApiError& e);
void SendJson(httplib::Response& res, const Json& j);

Json ModelJson(const ModelView& m, bool has_template);
// One stage of a plan as every JSON answer names it: its index, device, name and layers
// (the plan preview adds its sizes, a finished turn's done event its hops).
Json StageJson(const StageAssignment& stage, size_t index);
// The one JSON shape of a plan, as the UI shows it: the preview, or why there is none.
Json PlanJson(const Result<Plan>& plan);
Json ProgressJson(const StageProgress& p);

}  // namespace daisy::srv
