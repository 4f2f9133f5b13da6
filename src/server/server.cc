// The HTTP server of `daisychain serve` (docs/HTTP.md): routes, the state snapshot and its
// event stream, the turn queue, and the OpenAI-compatible endpoints on top of HeadSession.
#include "daisy/server.h"

#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "access.h"
#include "api.h"
#include "assets.h"
#include "chat.h"
#include "guarded_http.h"
#include "join.h"
#include "daisy/head.h"
#include "daisy/log.h"
#include "daisy/net.h"
#include "daisy/sampling.h"
#include "daisy/tokenizer.h"
#include "daisy/wire.h"

namespace daisy {

namespace {

using srv::ApiError;
using srv::Json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kStateEvery = 2s;     // /api/events sends the state at least this often
constexpr auto kWatchEvery = 500ms;  // how often the snapshot is recomputed
constexpr auto kPingEvery = 1s;      // SSE comment while a stream has nothing to say


double Mb(uint64_t bytes) {
  return static_cast<double>(bytes) / 1e6;
}

// The HTTP status and error type of a failed Status.
ApiError FromStatus(const Status& st, const std::string& param = "") {
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

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(srv::Dump(srv::ErrorBody(e)), "application/json");
}

void SendJson(httplib::Response& res, const Json& j) {
  res.set_content(srv::Dump(j), "application/json");
}

ApiError NoModel() {
  ApiError e;
  e.status = 503;
  e.type = "server_error";
  e.code = "model_not_loaded";
  e.message = "no model is loaded: load one first (POST /api/load {\"model\": SRC} or `daisychain serve --model SRC`)";
  return e;
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

Json PlanJson(const Plan& p) {
  Json stages = Json::array();
  for (size_t i = 0; i < p.stages.size(); ++i) {
    const auto& s = p.stages[i];
    stages.push_back({{"stage", static_cast<int>(i)},
                      {"device_id", s.device_id},
                      {"name", s.device_name},
                      {"first", s.first},
                      {"end", s.end},
                      {"download_mb", Mb(s.download_bytes)},
                      {"hold_mb", Mb(s.hold_bytes)},
                      {"need_mb", Mb(s.need_bytes)},
                      {"budget_mb", Mb(s.budget_bytes)}});
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

// A stream's outgoing bytes: producers (the turn's callbacks, on any thread) append, the
// connection's thread writes. Thread-safe.
class Outbox {
 public:
  void Push(std::string s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(s));
    }
    cv_.notify_all();
  }
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  // Waits up to `timeout` for something to write; returns what is there (maybe nothing)
  // and whether the producer closed.
  std::pair<std::string, bool> Take(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !q_.empty() || closed_; });
    std::string out;
    for (auto& s : q_) out += s;
    q_.clear();
    return {out, closed_};
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> q_;
  bool closed_ = false;
};

srv::ConnectionLimits LimitsOf(const ServerOptions& o) {
  srv::ConnectionLimits l;
  l.max_threads = static_cast<size_t>(std::max(8, o.threads));
  l.header_timeout_s = o.header_timeout_s > 0 ? o.header_timeout_s : l.header_timeout_s;
  l.body_timeout_s = o.body_timeout_s > 0 ? o.body_timeout_s : l.body_timeout_s;
  return l;
}

}  // namespace

struct Server::Impl {
  explicit Impl(const ServerOptions& o) : options(o), http(LimitsOf(o)) {
    if (options.admin_secret.empty()) options.admin_secret = srv::NewSecret();
    policy.admin_secret = options.admin_secret;
    policy.api_key = options.api_key;
    policy.allowed_hosts = options.allowed_hosts;
  }
  ServerOptions options;
  srv::AccessPolicy policy;
  srv::GuardedHttpServer http;
  int port = 0;
  std::thread listen_thread;
  std::thread watch_thread;
  std::atomic<bool> stopping{false};

  // The model's extras the session does not keep: its chat template and JSON-mode table.
  std::mutex model_mu;
  std::string model_key;  // model_id@revision the extras belong to
  std::shared_ptr<const srv::ChatTemplateHandle> chat_template;
  std::shared_ptr<srv::JsonTable> json_table;

  // The turn queue: FIFO tickets; one turn (or load) at a time.
  std::mutex q_mu;
  std::condition_variable q_cv;
  std::deque<uint64_t> waiting;
  uint64_t next_ticket = 0;
  bool busy = false;

  // /api/events: the snapshot, its version, and each listener's pending events.
  struct Listener {
    std::deque<std::string> events;
  };
  std::mutex ev_mu;
  std::condition_variable ev_cv;
  std::string state_json = "{}";
  uint64_t state_version = 0;
  std::list<std::shared_ptr<Listener>> listeners;
  std::map<std::string, int> streams_by_client;  // open /api/events streams by client address
  std::atomic<bool> poke{false};  // recompute the snapshot now
  std::string plan_key;           // what the cached plan was computed for
  // The split a turn uses when its request names none (POST /api/load "stages", serve
  // --stages); 0: automatic (the head alone when it can hold the model).
  std::atomic<int> default_stages{0};
  std::optional<int> DefaultStages() const {
    const int n = default_stages.load();
    return n > 0 ? std::optional<int>(n) : std::nullopt;
  }
  Json plan_json;                 // null, or the last preview

  // ----- events -----

  void Broadcast(const std::string& event) {
    {
      std::lock_guard<std::mutex> lock(ev_mu);
      for (auto& l : listeners) l->events.push_back(event);
    }
    ev_cv.notify_all();
  }
  void Poke() {
    poke.store(true);
    ev_cv.notify_all();
  }

  // ----- the snapshot -----

  Json Devices() {
    std::vector<net::MemberInfo> members;
    if (options.rendezvous) {
      for (auto& m : options.rendezvous->Members())
        if (m.room == options.room) members.push_back(std::move(m));
    } else {
      for (auto& p : options.session->Peers())
        members.push_back(net::MemberInfo{options.room, p.address, p.hello, true, p.public_key});
    }
    const std::string& head_id = options.session->device_id();
    std::optional<uint64_t> head_probe;
    for (const auto& m : members)
      if (m.hello.device_id == head_id) head_probe = m.hello.probe_hash;
    Json out = Json::array();
    for (const auto& m : members) {
      const auto& h = m.hello;
      const bool compute = (h.capabilities & wire::kCapCompute) != 0;
      std::string probe = "unknown";
      if (head_probe && compute) probe = h.probe_hash == *head_probe ? "ok" : "differs";
      if (h.device_id == head_id) probe = "ok";
      const std::string fpr = net::Fingerprint(m.public_key);
      out.push_back({{"id", h.device_id},
                     {"short", fpr},
                     {"fingerprint", fpr},
                     {"name", h.name},
                     {"status", m.approved ? "approved" : "pending"},
                     {"is_head", h.device_id == head_id},
                     {"is_serve", h.device_id == options.compute_device_id},
                     {"backend", h.backend},
                     {"gemms_per_s", h.gemms_per_s},
                     {"free_memory", h.free_memory},
                     {"probe", probe},
                     {"compute", compute}});
    }
    // Devices that asked to join and wait for the host: only their key and name are known.
    if (options.rendezvous) {
      for (const auto& p : options.rendezvous->Pending()) {
        if (p.room != options.room) continue;
        out.push_back({{"id", p.device_id},
                       {"short", p.fingerprint},
                       {"fingerprint", p.fingerprint},
                       {"name", p.name},
                       {"status", "pending"},
                       {"is_head", false},
                       {"is_serve", false},
                       {"backend", ""},
                       {"gemms_per_s", 0.0},
                       {"free_memory", 0},
                       {"probe", "unknown"},
                       {"compute", false}});
      }
    }
    return out;
  }

  Json Snapshot(bool may_plan) {  // under snap_mu
    Json devices = Devices();
    auto model = options.session->model();
    bool is_busy;
    size_t queued;
    {
      std::lock_guard<std::mutex> lock(q_mu);
      is_busy = busy;
      queued = waiting.size();
    }
    Json model_json = nullptr;
    if (model) model_json = ModelJson(*model, HasTemplate(*model));
    // The plan is previewed again when the approved devices or the model changed, and only
    // while no turn runs (a preview must not wait for the ring).
    if (!model) {
      plan_json = nullptr;
      plan_key.clear();
    } else if (may_plan && !is_busy) {
      std::string key = model->model_id + "@" + model->revision + "/" + std::to_string(model->ctx) + "/" +
                        std::to_string(default_stages.load());
      for (const auto& d : devices)
        if (d["status"] == "approved")
          key += "|" + d["id"].get<std::string>() + ":" + std::to_string(d["free_memory"].get<uint64_t>());
      // The preview plans over the members the head has heard of, which can lag the room's
      // list by a peer-list round trip: keyed on both, a preview made in that gap is redone.
      key += "|head:";
      for (const auto& p : options.session->Peers()) key += p.hello.device_id + ",";
      if (key != plan_key) {
        auto plan = options.session->PreviewPlan(DefaultStages());
        if (plan.ok()) {
          plan_json = PlanJson(*plan);
        } else {
          plan_json = Json{{"stages", Json::array()},
                           {"est_ms_per_token", 0},
                           {"fits", false},
                           {"warning", plan.status().message()},
                           {"notes", Json::array()}};
        }
        plan_key = key;
      }
    }
    return Json{{"room", options.room},
                {"join", options.join_line},
                {"auto_approve", options.auto_approve},
                {"devices", devices},
                {"model", model_json},
                {"plan", plan_json},
                {"busy", is_busy},
                {"queue", queued}};
  }

  // Recomputes the snapshot (the watcher, and /api/state so it is never stale).
  std::mutex snap_mu;  // one Snapshot at a time: it owns plan_key / plan_json
  void Refresh() {
    std::unique_lock<std::mutex> snap(snap_mu);
    std::string s = srv::Dump(Snapshot(/*may_plan=*/true));
    snap.unlock();
    bool changed = false;
    {
      std::lock_guard<std::mutex> lock(ev_mu);
      if (s != state_json) {
        state_json = std::move(s);
        ++state_version;
        changed = true;
      }
    }
    if (changed) ev_cv.notify_all();
  }

  void WatchLoop() {
    while (!stopping.load()) {
      Refresh();
      std::unique_lock<std::mutex> lock(ev_mu);
      ev_cv.wait_for(lock, kWatchEvery, [&] { return stopping.load() || poke.load(); });
      poke.store(false);
    }
  }

  // ----- the model's extras -----

  bool HasTemplate(const ModelView& m) {
    std::lock_guard<std::mutex> lock(model_mu);
    return model_key == m.model_id + "@" + m.revision && chat_template != nullptr;
  }

  // Reads the chat template of the loaded model (once per model).
  void LoadExtras(const ModelView& m) {
    const std::string key = m.model_id + "@" + m.revision;
    {
      std::lock_guard<std::mutex> lock(model_mu);
      if (model_key == key) return;
    }
    std::shared_ptr<const srv::ChatTemplateHandle> tmpl;
    auto t = srv::LoadChatTemplateFor(m.source, options.hub);
    if (t.ok()) tmpl = *t;
    if (!t.ok() && t.status().code() != ErrorCode::kNotFound)
      LogWarning("serve: the chat template of " + m.model_id + " cannot be used: " + t.status().message());
    std::lock_guard<std::mutex> lock(model_mu);
    model_key = key;
    chat_template = tmpl;
    template_error = t.ok() ? "" : t.status().message();
    json_table.reset();
  }
  std::string template_error;

  // ----- the turn queue -----

  // Waits for the ring. on_position(n): n turns ahead of this one, called when it changes.
  // Returns false when alive() turns false (the client left) or the server stops.
  bool EnterTurn(const std::function<void(int)>& on_position, const std::function<bool()>& alive) {
    std::unique_lock<std::mutex> lock(q_mu);
    const uint64_t ticket = next_ticket++;
    waiting.push_back(ticket);
    lock.unlock();
    Poke();
    lock.lock();
    int last = -1;
    for (;;) {
      auto it = std::find(waiting.begin(), waiting.end(), ticket);
      const int ahead = static_cast<int>(it - waiting.begin()) + (busy ? 1 : 0);
      if (ahead == 0) {
        waiting.pop_front();
        busy = true;
        lock.unlock();
        Poke();
        return true;
      }
      if (ahead != last && on_position) {
        last = ahead;
        lock.unlock();
        on_position(ahead);
        lock.lock();
        continue;
      }
      q_cv.wait_for(lock, 500ms);
      bool leave = stopping.load();
      if (!leave && alive) {
        lock.unlock();
        leave = !alive();
        lock.lock();
      }
      if (leave) {
        waiting.erase(std::find(waiting.begin(), waiting.end(), ticket));
        lock.unlock();
        q_cv.notify_all();
        Poke();
        return false;
      }
    }
  }
  void LeaveTurn() {
    {
      std::lock_guard<std::mutex> lock(q_mu);
      busy = false;
    }
    q_cv.notify_all();
    Poke();
  }

  // ----- a turn -----

  struct TurnSpec {
    std::vector<int32_t> prompt_ids;
    std::shared_ptr<const Tokenizer> tokenizer;
    GenerateOptions generate;
    int ctx = 0;  // > 0: the context this turn wants (reloads the model when it differs)
    bool verify = false;
    bool json = false;
    std::optional<int> stages;
    std::string conversation;
    std::vector<std::string> stops;
  };
  struct TurnHooks {
    std::function<void(int)> on_queued;
    std::function<void()> on_started;
    // Text that may be shown now (possibly empty) for token `id`.
    std::function<void(int32_t id, const std::string& text)> on_text;
    std::function<void(const std::string& line)> on_status;
    std::function<void(const StageProgress&)> on_progress;
    // An audit withdrew tokens: only the first `kept` stand, and `text` is all shown now.
    std::function<void(size_t kept, const std::string& text)> on_retract;
    std::function<bool()> alive;  // false once the client is gone
  };
  struct TurnOutcome {
    Status status;
    bool cancelled = false;  // left the queue (client gone or stopping)
    HeadReport report;
    std::string text;           // as shown (stop strings cut)
    std::string finish_reason;  // "stop" | "length"
    int completion_tokens = 0;
  };

  TurnOutcome RunTurn(TurnSpec spec, const TurnHooks& hooks) {
    TurnOutcome out;
    if (!EnterTurn(hooks.on_queued, hooks.alive)) {
      out.cancelled = true;
      out.status = Aborted("the client went away before its turn");
      return out;
    }
    struct Release {
      Impl* self;
      ~Release() { self->LeaveTurn(); }
    } release{this};
    if (hooks.on_started) hooks.on_started();
    // The model may have changed while this request waited.
    if (options.session->tokenizer() != spec.tokenizer) {
      out.status = Aborted("the model was changed while this request waited; send it again");
      return out;
    }
    auto model = options.session->model();
    if (!model) {
      out.status = Unavailable(NoModel().message);
      return out;
    }
    if (spec.ctx > 0 && spec.ctx != model->ctx) {
      auto loaded = options.session->Load(model->source, spec.ctx);
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
    std::shared_ptr<srv::JsonTable> table;
    if (spec.json) {
      std::lock_guard<std::mutex> lock(model_mu);
      if (!json_table) json_table = srv::MakeJsonTable(*spec.tokenizer);
      table = json_table;
    }

    // Per-turn state shared by the callbacks (they may run on the session's threads).
    struct State {
      std::mutex mu;
      const Tokenizer& tokenizer;
      std::vector<int32_t> prompt;
      std::vector<std::string> stops;
      std::optional<TextStream> stream_box;
      std::optional<srv::StopMatcher> matcher_box;
      std::vector<int32_t> ids;  // the tokens shown so far
      int tokens = 0;
      std::atomic<bool> stop{false};
      TextStream& stream() { return *stream_box; }
      srv::StopMatcher& matcher() { return *matcher_box; }
      State(const Tokenizer& t, std::vector<int32_t> ctx, std::vector<std::string> s)
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
    auto st = std::make_shared<State>(*spec.tokenizer, spec.prompt_ids, spec.stops);
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
    std::atomic<bool>* stopping_flag = &stopping;
    const bool json = spec.json;
    req.fresh_hooks = [st, alive, stopping_flag, json, table](GenerateOptions& g) {
      g.stop_after = [st, alive, stopping_flag](int32_t) {
        return st->stop.load() || stopping_flag->load() || (alive && !alive());
      };
      if (json) srv::InstallJsonMode(g, table);
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
      Broadcast(srv::SseEvent("status", Json{{"line", std::string(line)}}));
      if (on_status) on_status(std::string(line));
    };
    auto on_progress = hooks.on_progress;
    req.on_progress = [this, on_progress](const StageProgress& p) {
      Broadcast(srv::SseEvent("progress", ProgressJson(p)));
      if (on_progress) on_progress(p);
    };
    auto report = options.session->Generate(req);
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
      Broadcast(srv::SseEvent("status", Json{{"line", line}}));
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

  // ----- streams -----

  // Runs `work` (which pushes to the outbox) on a worker thread and writes the outbox to
  // the client until the work is done; SSE comments keep an idle stream checked. The
  // worker sees the client leave through `gone`.
  static void Pump(httplib::DataSink& sink, const std::shared_ptr<Outbox>& box,
                   const std::shared_ptr<std::atomic<bool>>& gone, std::function<void()> work) {
    std::thread worker([box, work = std::move(work)] {
      work();
      box->Close();
    });
    auto last_write = Clock::now();
    for (;;) {
      auto [data, closed] = box->Take(200ms);
      if (!gone->load()) {
        if (data.empty() && Clock::now() - last_write >= kPingEvery) data = ": ping\n\n";
        if (!data.empty()) {
          if (!sink.write(data.data(), data.size())) gone->store(true);
          last_write = Clock::now();
        }
      }
      if (closed) {
        auto [rest, unused] = box->Take(0ms);
        (void)unused;
        if (!rest.empty() && !gone->load() && !sink.write(rest.data(), rest.size())) gone->store(true);
        break;
      }
    }
    worker.join();
    if (!gone->load()) sink.done();
  }

  static void SetStreamHeaders(httplib::Response& res) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
  }

  // ----- handlers -----

  void HandleState(httplib::Response& res) {
    Refresh();
    std::string s;
    {
      std::lock_guard<std::mutex> lock(ev_mu);
      s = state_json;
    }
    res.set_content(s, "application/json");
  }

  // Where a request comes from: the port mux's client for a relayed connection.
  std::string ClientOf(const httplib::Request& req) const {
    std::string who = options.source_of ? options.source_of(req.remote_port) : "";
    return who.empty() ? req.remote_addr : who;
  }

  void HandleEvents(const httplib::Request& req, httplib::Response& res) {
    // Each stream holds a connection and a thread while the tab is open: bounded per client
    // address and in all, refused with a message rather than left to pile up.
    const std::string client = ClientOf(req);
    auto listener = std::make_shared<Listener>();
    {
      std::lock_guard<std::mutex> lock(ev_mu);
      const int from_client = streams_by_client.count(client) ? streams_by_client[client] : 0;
      ApiError e;
      e.status = 0;  // 0: admitted
      if (from_client >= options.max_event_streams_per_client) {
        e.status = 429;
        e.type = "rate_limit_error";
        e.code = "too_many_event_streams";
        e.message = "too many event streams from " + client + ": " + std::to_string(from_client) +
                    " are open (at most " + std::to_string(options.max_event_streams_per_client) +
                    " per client address); close a tab of the UI or reuse one stream";
      } else if (static_cast<int>(listeners.size()) >= options.max_event_streams) {
        e.status = 503;
        e.type = "server_error";
        e.code = "too_many_event_streams";
        e.message = "too many event streams are open on this server (" + std::to_string(listeners.size()) +
                    ", at most " + std::to_string(options.max_event_streams) + "); try again later";
      }
      if (e.status != 0) {
        res.set_header("Retry-After", "10");
        return SendError(res, e);
      }
      listeners.push_back(listener);
      ++streams_by_client[client];
    }
    SetStreamHeaders(res);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, listener](size_t, httplib::DataSink& sink) {
          uint64_t seen = 0;
          bool first = true;
          auto last_state = Clock::now();
          while (!stopping.load()) {
            std::string out;
            {
              std::unique_lock<std::mutex> lock(ev_mu);
              ev_cv.wait_for(lock, 250ms, [&] {
                return stopping.load() || !listener->events.empty() || state_version != seen || first;
              });
              for (auto& e : listener->events) out += e;
              listener->events.clear();
              if (first || state_version != seen || Clock::now() - last_state >= kStateEvery) {
                out += "event: state\ndata: " + state_json + "\n\n";
                seen = state_version;
                last_state = Clock::now();
                first = false;
              }
            }
            if (!out.empty() && !sink.write(out.data(), out.size())) break;
          }
          sink.done();
          return true;
        },
        [this, listener, client](bool) {
          std::lock_guard<std::mutex> lock(ev_mu);
          listeners.remove(listener);
          if (--streams_by_client[client] <= 0) streams_by_client.erase(client);
        });
  }

  void HandleApprove(const httplib::Request& req, httplib::Response& res) {
    Json j = Json::parse(req.body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_string() ||
        j["id"].get<std::string>().empty())
      return SendError(res, srv::BadRequest("the body must be {\"id\": \"DEVICE_ID_OR_FINGERPRINT_PREFIX\"}", "id"));
    if (!options.rendezvous) return SendError(res, FromStatus(Unavailable("this server runs no rendezvous")));
    Status st = options.rendezvous->Approve(j["id"].get<std::string>());
    if (!st.ok()) {
      ApiError e = FromStatus(st, "id");
      if (st.code() == ErrorCode::kNotFound) e.status = 404;
      return SendError(res, e);
    }
    Poke();
    SendJson(res, Json{{"ok", true}});
  }

  Result<ModelView> LoadModel(const std::string& source, int ctx) {
    if (!EnterTurn({}, {})) return Aborted("the server is stopping");
    struct Release {
      Impl* self;
      ~Release() { self->LeaveTurn(); }
    } release{this};
    Broadcast(srv::SseEvent("status", Json{{"line", "loading " + source}}));
    auto m = options.session->Load(source, ctx);
    if (!m.ok()) {
      Broadcast(srv::SseEvent("status", Json{{"line", "could not load " + source + ": " + m.status().message()}}));
      return m.status();
    }
    LoadExtras(*m);
    Broadcast(srv::SseEvent("status", Json{{"line", "loaded " + m->model_id + " (" + std::to_string(m->spec.n_layers) +
                                                        " layers, context " + std::to_string(m->ctx) + ")"}}));
    return m;
  }

  void HandleLoad(const httplib::Request& req, httplib::Response& res) {
    Json j = Json::parse(req.body, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return SendError(res, srv::BadRequest("the request body is not a JSON object"));
    if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty())
      return SendError(res, srv::BadRequest("'model' must name a Hub repo (owner/name) or a local folder", "model"));
    int ctx = 0;
    if (j.contains("ctx") && !j["ctx"].is_null()) {
      if (!j["ctx"].is_number_integer() || j["ctx"].get<int64_t>() < 0 || j["ctx"].get<int64_t>() > (1 << 24))
        return SendError(res, srv::BadRequest("'ctx' must be a non-negative integer (0: the model's default)", "ctx"));
      ctx = static_cast<int>(j["ctx"].get<int64_t>());
    }
    int stages = default_stages.load();  // absent: the split stays as it was (serve --stages)
    if (j.contains("stages") && !j["stages"].is_null()) {
      if (!j["stages"].is_number_integer() || j["stages"].get<int64_t>() < 0 || j["stages"].get<int64_t>() > 64)
        return SendError(res, srv::BadRequest("'stages' must be an integer from 0 (automatic) to 64", "stages"));
      stages = static_cast<int>(j["stages"].get<int64_t>());
    }
    auto m = LoadModel(j["model"].get<std::string>(), ctx);
    if (!m.ok()) return SendError(res, FromStatus(m.status(), "model"));
    default_stages.store(stages);
    Json plan = nullptr;
    auto p = options.session->PreviewPlan(DefaultStages());
    if (p.ok()) {
      plan = PlanJson(*p);
    } else {
      plan = Json{{"stages", Json::array()},
                  {"est_ms_per_token", 0},
                  {"fits", false},
                  {"warning", p.status().message()},
                  {"notes", Json::array()}};
    }
    Poke();
    SendJson(res, Json{{"model", ModelJson(*m, HasTemplate(*m))}, {"plan", plan}});
  }

  // The loaded model and its tokenizer, or the 503 answer.
  std::variant<std::pair<ModelView, std::shared_ptr<const Tokenizer>>, ApiError> Loaded() {
    auto tok = options.session->tokenizer();
    auto model = options.session->model();
    if (!model || !tok) return NoModel();
    return std::make_pair(*model, tok);
  }

  void HandleUiGenerate(const httplib::Request& req, httplib::Response& res) {
    auto parsed = srv::ParseUiGenerateRequest(req.body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return SendError(res, *e);
    auto r = std::get<srv::UiGenerateRequest>(parsed);
    auto loaded = Loaded();
    if (auto* e = std::get_if<ApiError>(&loaded)) return SendError(res, *e);
    auto [model, tok] = std::get<0>(loaded);
    SamplingParams sp{r.temperature, r.top_k, r.top_p, r.seed};
    if (Status st = ValidateSamplingParams(sp); !st.ok()) return SendError(res, FromStatus(st));
    // Tokenized now, while an earlier turn may still hold the ring.
    auto ids = tok->Encode(r.prompt, /*add_special_tokens=*/true);
    if (!ids.ok()) return SendError(res, FromStatus(ids.status(), "prompt"));
    const int ctx = r.ctx > 0 ? r.ctx : model.ctx;
    if (static_cast<int>(ids->size()) >= ctx)
      return SendError(res, srv::BadRequest("the prompt has " + std::to_string(ids->size()) +
                                                " tokens; the context holds " + std::to_string(ctx),
                                            "prompt"));
    TurnSpec spec;
    spec.prompt_ids = std::move(*ids);
    spec.tokenizer = tok;
    spec.generate.max_tokens = r.max_tokens;
    spec.generate.sampling = sp;
    spec.ctx = r.ctx;
    spec.verify = r.verify;
    spec.json = r.json;
    spec.stages = r.stages ? r.stages : DefaultStages();
    StreamUiTurn(res, std::move(spec), Json::object());
  }

  // Answers a UI turn (/api/generate, /api/chat) with server-sent events: queued, status,
  // progress, token, retract, then done (DoneJson and `done_extra`) or error.
  void StreamUiTurn(httplib::Response& res, TurnSpec spec, Json done_extra) {
    SetStreamHeaders(res);
    res.set_chunked_content_provider("text/event-stream", [this, spec, done_extra](size_t, httplib::DataSink& sink) {
      auto box = std::make_shared<Outbox>();
      auto gone = std::make_shared<std::atomic<bool>>(false);
      Pump(sink, box, gone, [this, spec, done_extra, box, gone] {
        TurnHooks hooks;
        hooks.alive = [gone] { return !gone->load(); };
        hooks.on_queued = [box](int position) { box->Push(srv::SseEvent("queued", Json{{"position", position}})); };
        hooks.on_started = [box] {
          box->Push(srv::SseEvent("status", Json{{"line", "your turn: the ring is yours"}}));
        };
        hooks.on_text = [box](int32_t id, const std::string& text) {
          if (id < 0) {
            if (!text.empty()) box->Push(srv::SseEvent("token", Json{{"id", nullptr}, {"text", text}}));
            return;
          }
          box->Push(srv::SseEvent("token", Json{{"id", id}, {"text", text}}));
        };
        hooks.on_status = [box](const std::string& line) { box->Push(srv::SseEvent("status", Json{{"line", line}})); };
        hooks.on_retract = [box](size_t kept, const std::string& text) {
          box->Push(srv::SseEvent("retract", Json{{"kept", kept}, {"text", text}}));
        };
        hooks.on_progress = [box](const StageProgress& p) { box->Push(srv::SseEvent("progress", ProgressJson(p))); };
        TurnOutcome o = RunTurn(spec, hooks);
        if (o.cancelled) return;
        if (!o.status.ok()) {
          box->Push(srv::SseEvent("error", Json{{"message", o.status.message()}}));
          return;
        }
        Json done = DoneJson(o);
        done.update(done_extra);
        box->Push(srv::SseEvent("done", done));
      });
      return true;
    });
  }

  // ----- the UI's chat (POST /api/chat) -----

  // A conversation of the UI: rendered with the model's chat template (as
  // /v1/chat/completions), or as plain completion for a model without one; the
  // conversation id keys the prefix cache, so a next turn sends only its new positions.
  void HandleUiChat(const httplib::Request& req, httplib::Response& res) {
    auto parsed = srv::ParseUiChatRequest(req.body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return SendError(res, *e);
    auto r = std::get<srv::UiChatRequest>(parsed);
    auto loaded = Loaded();
    if (auto* e = std::get_if<ApiError>(&loaded)) return SendError(res, *e);
    auto [model, tok] = std::get<0>(loaded);
    SamplingParams sp{r.temperature, r.top_k, r.top_p, r.seed};
    if (Status st = ValidateSamplingParams(sp); !st.ok()) return SendError(res, FromStatus(st));
    // Rendered and tokenized now, while an earlier turn may still hold the ring.
    LoadExtras(model);
    const bool has_template = HasTemplate(model);
    Result<std::vector<int32_t>> ids = std::vector<int32_t>{};
    if (has_template) {
      auto text = RenderChat(model, r.messages, /*add_generation_prompt=*/true, Json::object());
      if (!text.ok()) return SendError(res, srv::BadRequest(text.status().message(), "messages"));
      ids = tok->Encode(*text, /*add_special_tokens=*/false);  // the template writes them
    } else {
      ids = tok->Encode(srv::PlainChatPrompt(r.messages), /*add_special_tokens=*/true);
    }
    if (!ids.ok()) return SendError(res, FromStatus(ids.status(), "messages"));
    if (ids->empty()) return SendError(res, srv::BadRequest("the conversation is empty (no tokens)", "messages"));
    const int ctx = r.ctx > 0 ? r.ctx : model.ctx;
    if (static_cast<int>(ids->size()) >= ctx)
      return SendError(
          res, srv::BadRequest("the conversation has " + std::to_string(ids->size()) + " tokens; the context holds " +
                                   std::to_string(ctx) + ": start a new chat or shorten it",
                               "messages"));
    TurnSpec spec;
    spec.prompt_ids = std::move(*ids);
    spec.tokenizer = tok;
    spec.generate.max_tokens = r.max_tokens;
    spec.generate.sampling = sp;
    spec.ctx = r.ctx;
    spec.verify = r.verify;
    spec.stages = r.stages ? r.stages : DefaultStages();
    // Its own key space: a UI conversation never takes the slot of an API `user`.
    if (!r.conversation.empty()) spec.conversation = "ui-chat:" + r.conversation;
    Json extra = {{"mode", has_template ? "template" : "plain"},
                  {"conversation", r.conversation.empty() ? Json(nullptr) : Json(r.conversation)},
                  {"prompt_tokens", spec.prompt_ids.size()}};
    StreamUiTurn(res, std::move(spec), std::move(extra));
  }

  static Json DoneJson(const TurnOutcome& o) {
    const HeadReport& r = o.report;
    Json stages = Json::array();
    for (size_t i = 0; i < r.plan.size(); ++i) {
      Json s = {{"stage", static_cast<int>(i)},
                {"device_id", r.plan[i].device_id},
                {"name", r.plan[i].device_name},
                {"first", r.plan[i].first},
                {"end", r.plan[i].end},
                {"hops", 0},
                {"ms_per_hop", 0.0}};
      for (const auto& l : r.stage_latency) {
        if (l.stage != static_cast<int>(i)) continue;
        s["hops"] = l.hops;
        s["ms_per_hop"] = l.hops > 0 ? l.compute_seconds * 1e3 / static_cast<double>(l.hops) : 0.0;
      }
      stages.push_back(std::move(s));
    }
    Json verified = nullptr;
    if (r.verified) verified = *r.verified;
    return Json{{"text", o.text},
                {"ids", r.ids},
                {"prompt_ids", r.prompt_ids},
                {"finish_reason", o.finish_reason},
                {"tokens_per_s", r.tokens_per_s},
                {"prefill_ms", r.prefill_seconds * 1e3},
                {"decode_ms", r.decode_seconds * 1e3},
                {"ring_hops", r.ring_hops},
                {"ring_positions", r.ring_positions},
                {"reused_positions", r.reused_positions},
                {"laps", r.laps},
                {"lap_ms", r.laps > 0 ? r.lap_seconds * 1e3 / static_cast<double>(r.laps) : 0.0},
                {"drafted", r.drafted},
                {"accepted", r.accepted},
                {"stages", stages},
                {"replays", r.replays},
                {"verified", verified},
                {"verify_message", r.verify_message},
                {"mismatch_position", r.mismatch_position ? Json(*r.mismatch_position) : Json(nullptr)},
                {"mismatch", r.mismatch.empty() ? Json(nullptr) : Json(r.mismatch)}};
  }

  void HandleModels(httplib::Response& res) {
    Json data = Json::array();
    if (auto m = options.session->model())
      data.push_back({{"id", m->model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "daisychain"}});
    SendJson(res, Json{{"object", "list"}, {"data", data}});
  }

  // Renders chat messages with the loaded model's template.
  Result<std::string> RenderChat(const ModelView& model, const Json& messages, bool add_generation_prompt,
                                 const Json& kwargs) {
    LoadExtras(model);
    std::shared_ptr<const srv::ChatTemplateHandle> tmpl;
    std::string why;
    {
      std::lock_guard<std::mutex> lock(model_mu);
      tmpl = chat_template;
      why = template_error;
    }
    if (!tmpl)
      return InvalidArgument("no chat template for " + model.model_id + ": " + why +
                             " (a plain prompt goes to /v1/completions)");
    return srv::RenderChatTemplate(*tmpl, messages, add_generation_prompt, kwargs);
  }

  void HandleApplyTemplate(const httplib::Request& req, httplib::Response& res) {
    auto parsed = srv::ParseApplyTemplateRequest(req.body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return SendError(res, *e);
    const auto& r = std::get<srv::ApplyTemplateRequest>(parsed);
    auto model = options.session->model();
    if (!model) {
      ApiError e = NoModel();
      e.status = 400;
      e.type = "invalid_request_error";
      return SendError(res, e);
    }
    auto text = RenderChat(*model, r.messages, r.add_generation_prompt, r.kwargs);
    if (!text.ok()) return SendError(res, srv::BadRequest(text.status().message(), "messages"));
    SendJson(res, Json{{"prompt", *text}});
  }

  void HandleCompletion(const httplib::Request& req, httplib::Response& res, bool chat) {
    auto parsed = srv::ParseCompletionRequest(req.body, chat);
    if (auto* e = std::get_if<ApiError>(&parsed)) return SendError(res, *e);
    auto r = std::get<srv::CompletionRequest>(parsed);
    auto loaded = Loaded();
    if (auto* e = std::get_if<ApiError>(&loaded)) return SendError(res, *e);
    auto [model, tok] = std::get<0>(loaded);
    if (!r.model.empty() && r.model != model.model_id && r.model != model.source) {
      ApiError e;
      e.status = 404;
      e.type = "invalid_request_error";
      e.code = "model_not_found";
      e.param = "model";
      e.message = "The model '" + r.model + "' does not exist here: this server has '" + model.model_id +
                  "' loaded (GET /v1/models)";
      return SendError(res, e);
    }
    // Tokenized now, while an earlier turn may still hold the ring.
    std::vector<int32_t> ids;
    if (chat) {
      auto text = RenderChat(model, r.messages, /*add_generation_prompt=*/true, r.template_kwargs);
      if (!text.ok()) return SendError(res, srv::BadRequest(text.status().message(), "messages"));
      // The template writes the special tokens itself (as transformers' apply_chat_template).
      auto e = tok->Encode(*text, /*add_special_tokens=*/false);
      if (!e.ok()) return SendError(res, FromStatus(e.status(), "messages"));
      ids = std::move(*e);
    } else if (r.prompt_ids) {
      for (int32_t id : *r.prompt_ids)
        if (id >= tok->vocab_size())
          return SendError(res, srv::BadRequest("'prompt' holds token id " + std::to_string(id) +
                                                    ", outside the vocabulary of " + std::to_string(tok->vocab_size()),
                                                "prompt"));
      ids = *r.prompt_ids;
    } else {
      auto e = tok->Encode(r.prompt, /*add_special_tokens=*/true);
      if (!e.ok()) return SendError(res, FromStatus(e.status(), "prompt"));
      ids = std::move(*e);
    }
    const char* prompt_param = chat ? "messages" : "prompt";
    if (ids.empty()) return SendError(res, srv::BadRequest("the prompt is empty (no tokens)", prompt_param));
    if (static_cast<int>(ids.size()) >= model.ctx)
      return SendError(res,
                       srv::BadRequest("the prompt has " + std::to_string(ids.size()) + " tokens; the context holds " +
                                           std::to_string(model.ctx) + " (this model's context at this server)",
                                       prompt_param));
    TurnSpec spec;
    spec.tokenizer = tok;
    spec.generate.max_tokens = r.max_tokens.value_or(chat ? model.ctx - static_cast<int>(ids.size()) : 16);
    spec.generate.sampling.temperature = r.temperature;
    spec.generate.sampling.top_p = r.top_p;
    spec.generate.sampling.top_k = r.top_k;
    spec.generate.sampling.seed = r.seed ? *r.seed : std::random_device{}() * 0x100000000ull + std::random_device{}();
    if (Status st = ValidateSamplingParams(spec.generate.sampling); !st.ok()) return SendError(res, FromStatus(st));
    spec.prompt_ids = std::move(ids);
    spec.json = r.json_object;
    spec.conversation = r.user;
    spec.stops = r.stop;
    spec.stages = DefaultStages();

    srv::CompletionResult base;
    base.id = srv::NewCompletionId(chat);
    base.created = static_cast<int64_t>(std::time(nullptr));
    base.model = model.model_id;
    base.prompt_tokens = static_cast<int>(spec.prompt_ids.size());

    if (!r.stream) {
      TurnOutcome o = RunTurn(spec, TurnHooks{});
      if (!o.status.ok()) return SendError(res, FromStatus(o.status));
      base.text = o.text;
      base.finish_reason = o.finish_reason;
      base.completion_tokens = o.completion_tokens;
      return SendJson(res, srv::CompletionResponse(base, chat));
    }
    SetStreamHeaders(res);
    const bool include_usage = r.include_usage;
    res.set_chunked_content_provider(
        "text/event-stream", [this, spec, base, chat, include_usage](size_t, httplib::DataSink& sink) {
          auto box = std::make_shared<Outbox>();
          auto gone = std::make_shared<std::atomic<bool>>(false);
          Pump(sink, box, gone, [this, spec, base, chat, include_usage, box, gone] {
            auto first = std::make_shared<bool>(true);
            TurnHooks hooks;
            hooks.alive = [gone] { return !gone->load(); };
            hooks.on_text = [box, base, chat, first](int32_t, const std::string& text) {
              if (text.empty() && !(*first && chat)) return;
              box->Push(srv::SseData(srv::Dump(srv::CompletionChunk(base, chat, text, *first, ""))));
              *first = false;
            };
            TurnOutcome o = RunTurn(spec, hooks);
            if (o.cancelled) return;
            if (!o.status.ok()) {
              box->Push(srv::SseData(srv::Dump(srv::ErrorBody(FromStatus(o.status)))));
              box->Push(srv::SseData("[DONE]"));
              return;
            }
            srv::CompletionResult done = base;
            done.text = o.text;
            done.finish_reason = o.finish_reason;
            done.completion_tokens = o.completion_tokens;
            box->Push(srv::SseData(srv::Dump(srv::CompletionChunk(done, chat, "", *first, o.finish_reason))));
            if (include_usage) box->Push(srv::SseData(srv::Dump(srv::UsageChunk(done, chat))));
            box->Push(srv::SseData("[DONE]"));
          });
          return true;
        });
  }

  // Access (access.h): decided on the headers, before the body is read.
  bool Refuse(const httplib::Request& req, httplib::Response& res) const {
    srv::AccessRequest a;
    a.method = req.method;
    a.path = req.path;
    if (req.has_header("Host")) a.host = req.get_header_value("Host");
    if (req.has_header("Origin")) a.origin = req.get_header_value("Origin");
    a.content_type = req.get_header_value("Content-Type");
    for (size_t i = 0, n = req.get_header_value_count("Cookie"); i < n; ++i)
      a.cookie += (i ? "; " : "") + req.get_header_value("Cookie", i);
    a.authorization = req.get_header_value("Authorization");
    a.token = req.get_param_value("token");
    a.client = ClientOf(req);
    auto refusal = srv::CheckAccess(policy, a);
    if (!refusal) return false;
    if (refusal->status == 401 && srv::ClassOf(req.path) == srv::EndpointClass::kPage) {
      // A person at a browser: say in words how to get in.
      res.status = 401;
      res.set_content("<!doctype html><meta charset=\"utf-8\"><title>DaisyChain</title><p>" + refusal->message +
                          "</p>\n",
                      "text/html; charset=utf-8");
      return true;
    }
    if (refusal->code == "invalid_api_key") res.set_header("WWW-Authenticate", "Bearer");
    SendError(res, *refusal);
    return true;
  }

  // GET / and /index.html: the UI for the holder of the admin cookie; GET /?token=SECRET
  // sets that cookie. It answers with a page that moves on to / itself rather than a 303:
  // a SameSite=Strict cookie is not sent on a redirect that a cross-site link started,
  // while a navigation the page makes is same-site. The token leaves the address bar.
  void HandlePage(const std::string& path, const httplib::Request& req, httplib::Response& res) const {
    const std::string token = req.get_param_value("token");
    if (!token.empty()) {
      res.set_header("Cache-Control", "no-store");
      res.set_header("Referrer-Policy", "no-referrer");
      if (!srv::SecretEquals(token, policy.admin_secret)) {
        res.status = 403;
        res.set_content(
            "<!doctype html><meta charset=\"utf-8\"><title>DaisyChain</title><p>This is not the admin secret of "
            "this server: open the URL that `daisychain serve` printed at its start.</p>\n",
            "text/html; charset=utf-8");
        return;
      }
      res.set_header("Set-Cookie", srv::AdminCookie(req.get_header_value("Host"), policy.admin_secret));
      res.set_content(
          "<!doctype html><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"0; url=/\">"
          "<title>DaisyChain</title><p><a href=\"/\">Open the web UI</a></p>\n",
          "text/html; charset=utf-8");
      return;
    }
    ServeAsset(path, res);
  }

  void Routes() {
    http.SetGuard([this](const httplib::Request& req, httplib::Response& res) { return Refuse(req, res); });
    http.Get("/", [this](const httplib::Request& req, httplib::Response& res) { HandlePage("/", req, res); });
    http.Get("/index.html",
             [this](const httplib::Request& req, httplib::Response& res) { HandlePage("/index.html", req, res); });
    http.Get("/app.js", [](const httplib::Request&, httplib::Response& res) { ServeAsset("/app.js", res); });
    http.Get("/style.css", [](const httplib::Request&, httplib::Response& res) { ServeAsset("/style.css", res); });
    http.Get("/chat.js", [](const httplib::Request&, httplib::Response& res) { ServeAsset("/chat.js", res); });
    http.Get("/chat.css", [](const httplib::Request&, httplib::Response& res) { ServeAsset("/chat.css", res); });
    http.Get("/api/state", [this](const httplib::Request&, httplib::Response& res) { HandleState(res); });
    http.Get("/api/events", [this](const httplib::Request& req, httplib::Response& res) { HandleEvents(req, res); });
    http.Post("/api/approve", [this](const httplib::Request& req, httplib::Response& res) { HandleApprove(req, res); });
    srv::AddJoinRoutes(http, options.rendezvous, options.room, options.source_of);
    http.Post("/api/load", [this](const httplib::Request& req, httplib::Response& res) { HandleLoad(req, res); });
    http.Post("/api/generate",
              [this](const httplib::Request& req, httplib::Response& res) { HandleUiGenerate(req, res); });
    http.Post("/api/chat", [this](const httplib::Request& req, httplib::Response& res) { HandleUiChat(req, res); });
    http.Post("/apply-template",
              [this](const httplib::Request& req, httplib::Response& res) { HandleApplyTemplate(req, res); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { HandleModels(res); });
    http.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { HandleCompletion(req, res, false); });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { HandleCompletion(req, res, true); });
    // Unknown paths and methods: the OpenAI error shape, not httplib's empty body.
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      ApiError e;
      e.status = res.status;
      e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
      e.message =
          res.status == 404 ? "no such endpoint: " + req.method + " " + req.path : "HTTP " + std::to_string(res.status);
      res.set_content(srv::Dump(srv::ErrorBody(e)), "application/json");
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      ApiError e;
      e.status = 500;
      e.type = "server_error";
      e.message = "Bug: unexpected exception: " + what;
      SendError(res, e);
    });
  }

  static void ServeAsset(const std::string& path, httplib::Response& res) {
    const srv::Asset* a = srv::FindAsset(path);
    if (!a) {
      res.status = 404;
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_content(std::string(a->bytes), std::string(a->content_type).c_str());
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  impl_->stopping.store(true);
  impl_->ev_cv.notify_all();
  impl_->q_cv.notify_all();
  impl_->http.stop();
  if (impl_->listen_thread.joinable()) impl_->listen_thread.join();
  if (impl_->watch_thread.joinable()) impl_->watch_thread.join();
}

int Server::port() const {
  return impl_->port;
}

bool ListensOnLoopbackOnly(const std::string& host) {
  return srv::IsLoopbackListen(host);
}

const std::string& Server::admin_secret() const {
  return impl_->options.admin_secret;
}

Status Server::Load(const std::string& source, int ctx) {
  auto m = impl_->LoadModel(source, ctx);
  impl_->Poke();
  return m.ok() ? Status() : m.status();
}

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  if (!options.session) return InvalidArgument("Bug: Server needs a HeadSession");
  // A client that hangs up must not kill the process with SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  auto impl = std::make_unique<Impl>(options);
  impl->default_stages.store(std::max(0, options.default_stages));
  impl->http.set_keep_alive_timeout(5);
  impl->http.set_read_timeout(30);
  impl->http.set_write_timeout(30);
  impl->http.set_payload_max_length(size_t{16} << 20);
  impl->Routes();
  impl->port = options.port == 0 ? impl->http.bind_to_any_port(options.host)
                                 : (impl->http.bind_to_port(options.host, options.port) ? options.port : -1);
  if (impl->port <= 0)
    return Unavailable("cannot listen for HTTP on " + options.host + ":" + std::to_string(options.port));
  impl->http.WidenBacklog();
  Impl* p = impl.get();
  impl->listen_thread = std::thread([p] { p->http.listen_after_bind(); });
  impl->Refresh();
  impl->watch_thread = std::thread([p] { p->WatchLoop(); });
  for (int i = 0; i < 500 && !impl->http.is_running(); ++i) std::this_thread::sleep_for(2ms);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

struct JoinServer::Impl {
  srv::GuardedHttpServer http{srv::ConnectionLimits{}};
  int port = 0;
  std::thread listen_thread;
};

JoinServer::JoinServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

JoinServer::~JoinServer() {
  impl_->http.stop();
  if (impl_->listen_thread.joinable()) impl_->listen_thread.join();
}

int JoinServer::port() const { return impl_->port; }

Result<std::unique_ptr<JoinServer>> JoinServer::Start(const JoinServerOptions& options) {
  if (!options.rendezvous) return InvalidArgument("Bug: JoinServer needs a rendezvous");
  ::signal(SIGPIPE, SIG_IGN);
  auto impl = std::make_unique<Impl>();
  impl->http.set_read_timeout(10);
  impl->http.set_payload_max_length(size_t{64} << 10);
  srv::AddJoinRoutes(impl->http, options.rendezvous, options.room, options.source_of);
  impl->port = options.port == 0 ? impl->http.bind_to_any_port(options.host)
                                 : (impl->http.bind_to_port(options.host, options.port) ? options.port : -1);
  if (impl->port <= 0) return Unavailable("cannot listen for HTTP on " + options.host + ":" + std::to_string(options.port));
  impl->http.WidenBacklog();
  Impl* p = impl.get();
  impl->listen_thread = std::thread([p] { p->http.listen_after_bind(); });
  for (int i = 0; i < 500 && !impl->http.is_running(); ++i) std::this_thread::sleep_for(2ms);
  return std::unique_ptr<JoinServer>(new JoinServer(std::move(impl)));
}

}  // namespace daisy
