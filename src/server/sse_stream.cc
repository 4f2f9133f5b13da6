#include "sse_stream.h"

#include <thread>

namespace daisy::srv {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kPingEvery = 1s;  // SSE comment while a stream has nothing to say

// Runs `work` on a worker thread and writes the outbox to the client until the work is
// done; SSE comments keep an idle stream checked. The worker sees the client leave
// through `gone`.
void Pump(httplib::DataSink& sink, const StreamWork& work) {
  auto box = std::make_shared<Outbox>();
  auto gone = std::make_shared<std::atomic<bool>>(false);
  std::thread worker([box, gone, &work] {
    work(box, [gone] { return !gone->load(); });
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

}  // namespace

void Outbox::Push(std::string s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(std::move(s));
  }
  cv_.notify_all();
}

void Outbox::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

std::pair<std::string, bool> Outbox::Take(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !q_.empty() || closed_; });
  std::string out;
  for (auto& s : q_) out += s;
  q_.clear();
  return {out, closed_};
}

void SetStreamHeaders(httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
}

void StreamFrom(httplib::Response& res, StreamWork work) {
  SetStreamHeaders(res);
  res.set_chunked_content_provider("text/event-stream", [work = std::move(work)](size_t, httplib::DataSink& sink) {
    Pump(sink, work);
    return true;
  });
}

}  // namespace daisy::srv
