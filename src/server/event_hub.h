// The /api/events streams of the UI: the state snapshot (sent first, on every change and
// at least every 2 s) and the events every open stream gets (status lines, progress).
// Streams are capped per client address and in all (docs/HTTP.md, "Limits"). Internal to
// src/server; thread-safe.
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace daisy::srv {

class EventHub {
 public:
  EventHub(int max_streams, int max_streams_per_client)
      : max_streams_(max_streams), max_per_client_(max_streams_per_client) {}

  // An event (SseEvent) for every open stream.
  void Broadcast(const std::string& event);
  // A new snapshot (JSON text): streams send it at once when it differs from the last.
  void PublishState(std::string state_json);
  std::string state() const;

  // Answers `res` with a stream for `client`, or with 429 (too many from that address) or
  // 503 (too many in all) and a message saying which limit.
  void Serve(const std::string& client, httplib::Response& res);
  // Ends every stream.
  void Stop();

 private:
  struct Listener {
    std::deque<std::string> events;
  };
  void Stream(const std::shared_ptr<Listener>& listener, httplib::DataSink& sink);

  const int max_streams_;
  const int max_per_client_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string state_json_ = "{}";
  uint64_t state_version_ = 0;
  std::list<std::shared_ptr<Listener>> listeners_;
  std::map<std::string, int> streams_by_client_;  // open streams by client address
  std::atomic<bool> stopping_{false};
};

}  // namespace daisy::srv
