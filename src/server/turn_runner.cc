#include "turn_runner.h"

#include <algorithm>
#include <mutex>

#include "chat.h"
#include "daisy/log.h"
#include "event_hub.h"
#include "http_common.h"
#include "model_extras.h"

namespace daisy::srv {

namespace {

// Ends the turn (or leaves the line) and says so, however the holder returns.
struct EndTurn {
  TurnQueue::Ticket& ticket;
  const std::function<void()>& on_change;
  ~EndTurn() {
    ticket.Release();
    if (on_change) on_change();
  }
};

// Per-turn state shared by the callbacks (they may run on the session's threads).
struct TextState {
  std::mutex mu;
  const Tokenizer& tokenizer;
  std::vector<int32_t> prompt;
  std::vector<std::string> stops;
  std::optional<TextStream> stream_box;
  std::optional<StopMatcher> matcher_box;
  std::vector<int32_t> ids;  // the tokens shown so far
  int tokens = 0;
  std::atomic<bool> stop{false};
  TextStream& stream() { return *stream_box; }
  StopMatcher& matcher() { return *matcher_box; }
  TextState(const Tokenizer& t, std::vector<int32_t> ctx, std::vector<std::string> s)
      : tokenizer(t), prompt(std::move(ctx)), stops(std::move(s)) {
    Restart();
  }
  void Restart() {
    stream_box.emplace(tokenizer, prompt);
    matcher_box.emplace(stops);
  }
  // An audit withdrew the tokens after the first `kept`: the text is rebuilt from those.
  std::string Retract(size_t kept) {
    ids.resize(std::min(ids.size(), kept));
    Restart();
    for (int32_t id : ids) matcher().Add(stream().Add(id));
    tokens = static_cast<int>(ids.size());
    return matcher().text();
  }
};

}  // namespace

TurnRunner::TurnRunner(HeadSession& session, TurnQueue& turns, ModelExtras& extras, EventHub& hub,
                       std::function<void()> on_change)
    : session_(session), turns_(turns), extras_(extras), hub_(hub), on_change_(std::move(on_change)) {}

std::optional<int> TurnRunner::DefaultStages() const {
  const int n = default_stages_.load();
  return n > 0 ? std::optional<int>(n) : std::nullopt;
}

std::variant<LoadedModel, ApiError> TurnRunner::Loaded() const {
  auto tok = session_.tokenizer();
  auto model = session_.model();
  if (!model || !tok) return NoModel();
  return LoadedModel{*model, tok};
}

void TurnRunner::Stop() {
  stopping_.store(true);
  turns_.WakeWaiters();
}

bool TurnRunner::Enter(TurnQueue::Ticket& ticket, const std::function<void(int)>& on_position,
                       const std::function<bool()>& alive) {
  ticket = turns_.Join();
  if (on_change_) on_change_();
  TurnQueue::WaitOptions wait;
  wait.on_position = on_position;
  wait.cancelled = [this, &alive] { return stopping_.load() || (alive && !alive()); };
  const bool admitted = turns_.Wait(ticket, wait);
  if (on_change_) on_change_();
  return admitted;
}

Result<ModelView> TurnRunner::Load(const std::string& source, int ctx) {
  TurnQueue::Ticket ticket;
  EndTurn end{ticket, on_change_};
  if (!Enter(ticket, {}, {})) return Aborted("the server is stopping");
  hub_.Broadcast(SseEvent("status", Json{{"line", "loading " + source}}));
  auto m = session_.Load(source, ctx);
  if (!m.ok()) {
    hub_.Broadcast(SseEvent("status", Json{{"line", "could not load " + source + ": " + m.status().message()}}));
    return m.status();
  }
  extras_.LoadFor(*m);
  hub_.Broadcast(SseEvent("status", Json{{"line", "loaded " + m->model_id + " (" + std::to_string(m->spec.n_layers) +
                                                      " layers, context " + std::to_string(m->ctx) + ")"}}));
  return m;
}

TurnOutcome TurnRunner::Run(TurnSpec spec, const TurnHooks& hooks) {
  TurnOutcome out;
  TurnQueue::Ticket ticket;
  EndTurn end{ticket, on_change_};
  if (!Enter(ticket, hooks.on_queued, hooks.alive)) {
    out.cancelled = true;
    out.status = Aborted("the client went away before its turn");
    return out;
  }
  if (hooks.on_started) hooks.on_started();
  // The model may have changed while this request waited.
  if (session_.tokenizer() != spec.tokenizer) {
    out.status = Aborted("the model was changed while this request waited; send it again");
    return out;
  }
  auto model = session_.model();
  if (!model) {
    out.status = Unavailable(NoModel().message);
    return out;
  }
  if (spec.ctx > 0 && spec.ctx != model->ctx) {
    auto loaded = session_.Load(model->source, spec.ctx);
    if (!loaded.ok()) {
      out.status = loaded.status();
      return out;
    }
    model = *loaded;
  }
  if (static_cast<int>(spec.prompt_ids.size()) >= model->ctx) {
    out.status = InvalidArgument("the prompt has " + std::to_string(spec.prompt_ids.size()) +
                                 " tokens; the context holds " + std::to_string(model->ctx));
    return out;
  }
  std::shared_ptr<JsonTable> table;
  if (spec.json) table = extras_.JsonTableFor(*spec.tokenizer);

  auto st = std::make_shared<TextState>(*spec.tokenizer, spec.prompt_ids, spec.stops);
  TurnRequest req;
  req.prompt_ids = spec.prompt_ids;
  req.generate = spec.generate;
  for (int id : model->spec.eos_ids)
    if (std::find(req.generate.stop_ids.begin(), req.generate.stop_ids.end(), id) == req.generate.stop_ids.end())
      req.generate.stop_ids.push_back(id);
  req.verify = spec.verify;
  req.conversation = spec.conversation;
  req.stages = spec.stages;
  auto alive = hooks.alive;
  std::atomic<bool>* stopping_flag = &stopping_;
  const bool json = spec.json;
  req.fresh_hooks = [st, alive, stopping_flag, json, table](GenerateOptions& g) {
    g.stop_after = [st, alive, stopping_flag](int32_t) {
      return st->stop.load() || stopping_flag->load() || (alive && !alive());
    };
    if (json) InstallJsonMode(g, table);
  };
  auto on_text = hooks.on_text;
  req.on_token = [st, on_text](int32_t id, std::string_view) {
    if (id < 0) return;  // the session's own held-back text: this turn keeps its own stream
    std::string shown;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->matcher().stopped()) return;
      ++st->tokens;
      st->ids.push_back(id);
      shown = st->matcher().Add(st->stream().Add(id));
      if (st->matcher().stopped()) st->stop.store(true);
    }
    if (on_text) on_text(id, shown);
  };
  auto on_retract = hooks.on_retract;
  req.on_retract = [st, on_retract](size_t kept) {
    std::string text;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      text = st->Retract(kept);
    }
    if (on_retract) on_retract(kept, text);
  };
  auto on_status = hooks.on_status;
  req.on_status = [this, on_status](std::string_view line) {
    hub_.Broadcast(SseEvent("status", Json{{"line", std::string(line)}}));
    if (on_status) on_status(std::string(line));
  };
  auto on_progress = hooks.on_progress;
  req.on_progress = [this, on_progress](const StageProgress& p) {
    hub_.Broadcast(SseEvent("progress", ProgressJson(p)));
    if (on_progress) on_progress(p);
  };
  auto report = session_.Generate(req);
  if (!report.ok()) {
    out.status = report.status();
    return out;
  }
  out.report = std::move(*report);
  if (hooks.alive && !hooks.alive()) {
    // The client stopped the turn (Stop in the UI closes the stream): the head ended it
    // at the next token and the ring is free for the next request.
    int shown;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      shown = st->tokens;
    }
    const std::string line = "turn stopped by the client after " + std::to_string(shown) + " token" +
                             (shown == 1 ? "" : "s") + "; the ring is free";
    LogInfo("serve: " + line);
    hub_.Broadcast(SseEvent("status", Json{{"line", line}}));
  }
  std::lock_guard<std::mutex> lock(st->mu);
  if (!st->matcher().stopped()) {
    std::string tail = st->matcher().Add(st->stream().Finish());
    tail += st->matcher().Finish();
    if (!tail.empty() && hooks.on_text) hooks.on_text(-1, tail);
  }
  out.text = st->matcher().text();
  out.finish_reason = st->matcher().stopped() ? "stop" : out.report.finish_reason;
  out.completion_tokens = st->tokens;
  return out;
}

}  // namespace daisy::srv
