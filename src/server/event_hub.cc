#include "event_hub.h"

#include <chrono>

#include "http_common.h"
#include "sse_stream.h"

namespace daisy::srv {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kStateEvery = 2s;  // a stream sends the state at least this often

}  // namespace

void EventHub::Broadcast(const std::string& event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& l : listeners_) l->events.push_back(event);
  }
  cv_.notify_all();
}

void EventHub::PublishState(std::string state_json) {
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_json != state_json_) {
      state_json_ = std::move(state_json);
      ++state_version_;
      changed = true;
    }
  }
  if (changed) cv_.notify_all();
}

std::string EventHub::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_json_;
}

void EventHub::Stop() {
  stopping_.store(true);
  cv_.notify_all();
}

void EventHub::Serve(const std::string& client, httplib::Response& res) {
  // Each stream holds a connection and a thread while the tab is open: bounded per client
  // address and in all, refused with a message rather than left to pile up.
  auto listener = std::make_shared<Listener>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int from_client = streams_by_client_.count(client) ? streams_by_client_[client] : 0;
    ApiError e;
    e.status = 0;  // 0: admitted
    if (from_client >= max_per_client_) {
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "too_many_event_streams";
      e.message = "too many event streams from " + client + ": " + std::to_string(from_client) + " are open (at most " +
                  std::to_string(max_per_client_) + " per client address); close a tab of the UI or reuse one stream";
    } else if (static_cast<int>(listeners_.size()) >= max_streams_) {
      e.status = 503;
      e.type = "server_error";
      e.code = "too_many_event_streams";
      e.message = "too many event streams are open on this server (" + std::to_string(listeners_.size()) +
                  ", at most " + std::to_string(max_streams_) + "); try again later";
    }
    if (e.status != 0) {
      res.set_header("Retry-After", "10");
      return SendError(res, e);
    }
    listeners_.push_back(listener);
    ++streams_by_client_[client];
  }
  SetStreamHeaders(res);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, listener](size_t, httplib::DataSink& sink) {
        Stream(listener, sink);
        return true;
      },
      [this, listener, client](bool) {
        std::lock_guard<std::mutex> lock(mu_);
        listeners_.remove(listener);
        if (--streams_by_client_[client] <= 0) streams_by_client_.erase(client);
      });
}

void EventHub::Stream(const std::shared_ptr<Listener>& listener, httplib::DataSink& sink) {
  uint64_t seen = 0;
  bool first = true;
  auto last_state = Clock::now();
  while (!stopping_.load()) {
    std::string out;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, 250ms,
                   [&] { return stopping_.load() || !listener->events.empty() || state_version_ != seen || first; });
      for (auto& e : listener->events) out += e;
      listener->events.clear();
      if (first || state_version_ != seen || Clock::now() - last_state >= kStateEvery) {
        out += "event: state\ndata: " + state_json_ + "\n\n";
        seen = state_version_;
        last_state = Clock::now();
        first = false;
      }
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) break;
  }
  sink.done();
}

}  // namespace daisy::srv
