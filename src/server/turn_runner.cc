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
struct TurnState {
  std::mutex mu;
  TurnText text;
  std::atomic<bool> stop{false};
  explicit TurnState(std::vector<std::string> stops) : text(std::move(stops)) {}
};

}  // namespace

std::optional<std::string> TurnText::Add(std::string_view piece) {
  if (matcher_.stopped()) return std::nullopt;
  pieces_.emplace_back(piece);
  return matcher_.Add(piece);
}

void TurnText::HoldBack(std::string_view text) {
  held_back_ += text;
}

std::string TurnText::Retract(size_t kept) {
  pieces_.resize(std::min(pieces_.size(), kept));
  held_back_.clear();
  matcher_ = StopMatcher(stops_);
  for (const auto& piece : pieces_) matcher_.Add(piece);
  return matcher_.text();
}

std::string TurnText::Finish() {
  if (matcher_.stopped()) return "";
  std::string tail = matcher_.Add(held_back_);
  held_back_.clear();
  return tail + matcher_.Finish();
}

TurnRunner::TurnRunner(HeadSession& session, ModelExtras& extras, EventHub& hub, std::function<void()> on_change)
    : session_(session), turns_(session.turns()), extras_(extras), hub_(hub), on_change_(std::move(on_change)) {}

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
  auto m = session_.Load(ticket, source, ctx);
  if (!m.ok()) {
    hub_.Broadcast(SseEvent("status", Json{{"line", "could not load " + source + ": " + m.status().message()}}));
    return m.status();
  }
  extras_.LoadFor(*m);
  hub_.Broadcast(SseEvent("status", Json{{"line", "loaded " + m->model_id + " (" + std::to_string(m->spec.n_layers) +
                                                      " layers, context " + std::to_string(m->ctx) + ")"}}));
  return m;
}

TurnOutcome TurnRunner::Run(const TurnSpec& spec, const TurnHooks& hooks) {
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
    auto loaded = session_.Load(ticket, model->source, spec.ctx);
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

  auto st = std::make_shared<TurnState>(spec.stops);
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
  req.on_token = [st, on_text](int32_t id, std::string_view text) {
    std::optional<std::string> shown;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (id < 0) return st->text.HoldBack(text);
      shown = st->text.Add(text);
      if (!shown) return;
      if (st->text.stopped()) st->stop.store(true);
    }
    if (on_text) on_text(id, *shown);
  };
  auto on_retract = hooks.on_retract;
  req.on_retract = [st, on_retract](size_t kept) {
    std::string text;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      text = st->text.Retract(kept);
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
  auto report = session_.Generate(ticket, req);
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
      shown = st->text.tokens();
    }
    const std::string line = "turn stopped by the client after " + std::to_string(shown) + " token" +
                             (shown == 1 ? "" : "s") + "; the ring is free";
    LogInfo("serve: " + line);
    hub_.Broadcast(SseEvent("status", Json{{"line", line}}));
  }
  std::lock_guard<std::mutex> lock(st->mu);
  const std::string tail = st->text.Finish();
  if (!tail.empty() && hooks.on_text) hooks.on_text(-1, tail);
  out.text = st->text.text();
  out.finish_reason = st->text.stopped() ? "stop" : out.report.finish_reason;
  out.completion_tokens = st->text.tokens();
  return out;
}

}  // namespace daisy::srv
