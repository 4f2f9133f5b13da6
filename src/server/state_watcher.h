// The state the UI shows (/api/state and the "state" event): the room's devices, the
// model, a plan preview and the line of turns. A watcher thread recomputes it every
// 500 ms and when poked, and publishes it to the event hub. Internal to src/server;
// thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "api.h"
#include "daisy/server.h"

namespace daisy::srv {

class EventHub;
class ModelExtras;
class TurnRunner;

class StateWatcher {
 public:
  // Reads `options` (room, rendezvous, session, join line) for as long as it lives.
  StateWatcher(const ServerOptions& options, const TurnRunner& runner, ModelExtras& extras, EventHub& hub);
  ~StateWatcher() { Stop(); }

  // Recomputes the snapshot now and publishes it (/api/state does, so it is never stale).
  void Refresh();
  // Asks the watcher to recompute soon.
  void Poke();
  void Start();  // the watcher thread
  void Stop();

 private:
  Json Devices() const;
  Json Snapshot(bool may_plan);  // under snap_mu_

  const ServerOptions& options_;
  const TurnRunner& runner_;
  ModelExtras& extras_;
  EventHub& hub_;

  std::mutex snap_mu_;    // one Snapshot at a time: it owns plan_key_ / plan_json_
  std::string plan_key_;  // what the cached preview was computed for
  Json plan_json_;        // null, or the last preview

  std::mutex mu_;
  std::condition_variable cv_;
  bool poke_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace daisy::srv
