// Pulse: the heartbeat thread. It owns a send-only endpoint of its own (ZeroMQ sockets are
// not thread-safe, and the device's endpoint belongs to the thread that computes), so a
// member that is busy loading or computing is never taken for a dead one.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "daisy/net.h"

namespace daisy::net {

using Clock = std::chrono::steady_clock;

struct Pulse::Impl {
  PulseOptions o;
  std::unique_ptr<Endpoint> ep;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::atomic<int64_t> last_ok_ns{0};  // steady clock, 0: no attempt yet
  std::atomic<int64_t> first_try_ns{0};
  std::thread thread;

  static int64_t Now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  }

  void Loop() {
    auto last_join = Clock::now() - std::chrono::hours(1);
    const auto interval = std::chrono::duration<double>(o.interval_s);
    while (true) {
      std::vector<uint8_t> join;
      {
        std::unique_lock<std::mutex> lock(mu);
        if (stop) return;
        if (Clock::now() - last_join >= std::chrono::duration<double>(o.rejoin_s)) join = o.join_frame;
      }
      if (first_try_ns.load() == 0) first_try_ns = Now();
      // Sends wait at most half an interval: a rendezvous that is gone costs no more.
      const int wait_ms = std::max(50, static_cast<int>(o.interval_s * 500));
      Status st = ep->Send(o.rendezvous, wire::Message(wire::Heartbeat{0, o.device_id}), wait_ms);
      if (st.ok()) last_ok_ns = Now();
      if (!join.empty() && st.ok()) {
        if (ep->Send(o.rendezvous, join, wait_ms).ok()) last_join = Clock::now();
      }
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, interval, [&] { return stop; });
      if (stop) return;
    }
  }
};

Pulse::Pulse(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Pulse::~Pulse() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  // The last word on this connection: a join of ours still in flight on it cannot arrive
  // after the bye and put a departed member back in the room.
  (void)impl_->ep->Send(impl_->o.rendezvous, wire::Message(wire::Bye{impl_->o.device_id}), 300);
}

Result<std::unique_ptr<Pulse>> Pulse::Start(const PulseOptions& options) {
  if (options.interval_s <= 0 || options.rejoin_s <= 0) return InvalidArgument("Bug: Pulse intervals must be positive");
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  DAISY_ASSIGN_OR_RETURN(impl->ep, Endpoint::SendOnly(options.keys));
  impl->ep->SetPeerKey(options.rendezvous, options.server_key);
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Loop(); });
  return std::unique_ptr<Pulse>(new Pulse(std::move(impl)));
}

double Pulse::SilentFor() const {
  const int64_t ok = impl_->last_ok_ns.load();
  const int64_t since = ok != 0 ? ok : impl_->first_try_ns.load();
  if (since == 0) return 0;
  return static_cast<double>(Impl::Now() - since) / 1e9;
}

void Pulse::SetJoinFrame(std::vector<uint8_t> join_frame) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->o.join_frame = std::move(join_frame);
}

}  // namespace daisy::net
