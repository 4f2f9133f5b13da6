#include "state_watcher.h"

#include <chrono>
#include <optional>
#include <vector>

#include "daisy/head.h"
#include "daisy/net.h"
#include "daisy/wire.h"
#include "event_hub.h"
#include "http_common.h"
#include "model_extras.h"
#include "turn_runner.h"

namespace daisy::srv {

namespace {

constexpr auto kWatchEvery = std::chrono::milliseconds(500);  // how often the snapshot is recomputed

}  // namespace

StateWatcher::StateWatcher(const ServerOptions& options, const TurnRunner& runner, ModelExtras& extras, EventHub& hub)
    : options_(options), runner_(runner), extras_(extras), hub_(hub) {}

void StateWatcher::Start() {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      lock.unlock();
      Refresh();
      lock.lock();
      cv_.wait_for(lock, kWatchEvery, [&] { return stopping_ || poke_; });
      poke_ = false;
    }
  });
}

void StateWatcher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StateWatcher::Poke() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    poke_ = true;
  }
  cv_.notify_all();
}

void StateWatcher::Refresh() {
  std::unique_lock<std::mutex> snap(snap_mu_);
  std::string s = Dump(Snapshot(/*may_plan=*/true));
  snap.unlock();
  hub_.PublishState(std::move(s));
}

Json StateWatcher::Devices() const {
  std::vector<net::MemberInfo> members;
  if (options_.rendezvous) {
    for (auto& m : options_.rendezvous->Members())
      if (m.room == options_.room) members.push_back(std::move(m));
  } else {
    for (auto& p : options_.session->Peers())
      members.push_back(net::MemberInfo{options_.room, p.address, p.hello, true, p.public_key});
  }
  const std::string& head_id = options_.session->device_id();
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
                   {"is_serve", h.device_id == options_.compute_device_id},
                   {"backend", h.backend},
                   {"gemms_per_s", h.gemms_per_s},
                   {"free_memory", h.free_memory},
                   {"probe", probe},
                   {"compute", compute}});
  }
  // Devices that asked to join and wait for the host: only their key and name are known.
  if (options_.rendezvous) {
    for (const auto& p : options_.rendezvous->Pending()) {
      if (p.room != options_.room) continue;
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

Json StateWatcher::Snapshot(bool may_plan) {
  Json devices = Devices();
  auto model = options_.session->model();
  const bool is_busy = runner_.busy();
  const size_t queued = runner_.waiting();
  Json model_json = nullptr;
  if (model) model_json = ModelJson(*model, extras_.HasTemplate(*model));
  // The plan is previewed again when the approved devices or the model changed, and only
  // while no turn runs (a preview must not wait for the ring).
  if (!model) {
    plan_json_ = nullptr;
    plan_key_.clear();
  } else if (may_plan && !is_busy) {
    std::string key = model->model_id + "@" + model->revision + "/" + std::to_string(model->ctx) + "/" +
                      std::to_string(runner_.default_stages());
    for (const auto& d : devices)
      if (d["status"] == "approved")
        key += "|" + d["id"].get<std::string>() + ":" + std::to_string(d["free_memory"].get<uint64_t>());
    // The preview plans over the members the head has heard of, which can lag the room's
    // list by a peer-list round trip: keyed on both, a preview made in that gap is redone.
    key += "|head:";
    for (const auto& p : options_.session->Peers()) key += p.hello.device_id + ",";
    if (key != plan_key_) {
      plan_json_ = PlanJson(options_.session->PreviewPlan(runner_.DefaultStages()));
      plan_key_ = key;
    }
  }
  return Json{{"room", options_.room},
              {"join", options_.join_line},
              {"join_url", options_.join_url},
              {"auto_approve", options_.auto_approve},
              {"devices", devices},
              {"model", model_json},
              {"plan", plan_json_},
              {"busy", is_busy},
              {"queue", queued}};
}

}  // namespace daisy::srv
