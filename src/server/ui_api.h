// The web UI's API: the state (GET /api/state), its event stream (GET /api/events), and
// the UI's turns, prompt (POST /api/generate) and chat (POST /api/chat), answered as
// server-sent events: queued, status, progress, token, retract, then done or error.
// Internal to src/server; thread-safe.
#pragma once

#include <optional>

#include "guarded_http.h"
#include "http_common.h"
#include "turn_runner.h"

namespace daisy::srv {

class EventHub;
class ModelExtras;
class StateWatcher;

class UiApi {
 public:
  UiApi(EventHub& hub, StateWatcher& state, TurnRunner& runner, ModelExtras& extras, SourceOf source_of);
  void AddRoutes(GuardedHttpServer& http);

 private:
  void HandleState(httplib::Response& res);
  void HandleGenerate(const httplib::Request& req, httplib::Response& res);
  void HandleChat(const httplib::Request& req, httplib::Response& res);

  // What both turns check before their prompt is made: the body parsed, a model loaded,
  // the sampling valid. nullopt: the refusal was written to `res`.
  template <class Request>
  struct Prelude {
    Request request;
    LoadedModel loaded;
    SamplingParams sampling;
  };
  template <class Request>
  std::optional<Prelude<Request>> Begin(std::variant<Request, ApiError> parsed, httplib::Response& res) const;
  // The turn of a prelude and its prompt: the fields both requests share.
  template <class Request>
  TurnSpec SpecOf(const Prelude<Request>& p, std::vector<int32_t> prompt_ids) const;
  // Streams the turn; its done event is DoneJson updated with `done_extra`.
  void StreamTurn(httplib::Response& res, TurnSpec spec, Json done_extra);

  EventHub& hub_;
  StateWatcher& state_;
  TurnRunner& runner_;
  ModelExtras& extras_;
  const SourceOf source_of_;
};

}  // namespace daisy::srv
