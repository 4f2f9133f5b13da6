// Server-sent event streams that a worker fills: the turn's callbacks push events (from
// any thread) into an outbox, and the connection's own thread writes them, with a ": ping"
// while idle so a client that left is seen. Internal to src/server.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace daisy::srv {

// A stream's outgoing bytes: producers append, the connection's thread writes.
// Thread-safe.
class Outbox {
 public:
  void Push(std::string s);
  void Close();
  // Waits up to `timeout` for something to write; returns what is there (maybe nothing)
  // and whether the producer closed.
  std::pair<std::string, bool> Take(std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> q_;
  bool closed_ = false;
};

// The headers of every event stream (no caching, no proxy buffering).
void SetStreamHeaders(httplib::Response& res);

// What fills a stream: runs on a worker thread, pushes to `out`, and sees the client leave
// through `alive` turning false.
using StreamWork = std::function<void(const std::shared_ptr<Outbox>& out, const std::function<bool()>& alive)>;
// Answers `res` with a text/event-stream that `work` fills; the stream ends when work returns.
void StreamFrom(httplib::Response& res, StreamWork work);

}  // namespace daisy::srv
