#include "daisy/turn_queue.h"

#include <algorithm>
#include <utility>

namespace daisy {

TurnQueue::Ticket::Ticket(Ticket&& other) noexcept
    : queue_(std::exchange(other.queue_, nullptr)),
      number_(std::exchange(other.number_, 0)),
      held_(std::exchange(other.held_, false)) {}

TurnQueue::Ticket& TurnQueue::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    queue_ = std::exchange(other.queue_, nullptr);
    number_ = std::exchange(other.number_, 0);
    held_ = std::exchange(other.held_, false);
  }
  return *this;
}

void TurnQueue::Ticket::Release() {
  if (queue_) queue_->Leave(number_, held_);
  queue_ = nullptr;
  held_ = false;
}

TurnQueue::Ticket TurnQueue::Join() {
  Ticket t;
  std::lock_guard<std::mutex> lock(mu_);
  t.queue_ = this;
  t.number_ = next_++;
  line_.push_back(t.number_);
  return t;
}

bool TurnQueue::Wait(Ticket& ticket, const WaitOptions& options) {
  if (ticket.queue_ != this) return false;
  if (ticket.held_) return true;
  std::unique_lock<std::mutex> lock(mu_);
  int last = -1;
  for (;;) {
    auto it = std::find(line_.begin(), line_.end(), ticket.number_);
    const int ahead = static_cast<int>(it - line_.begin()) + (holder_ != 0 ? 1 : 0);
    if (ahead == 0 && !idle_work_) {
      line_.pop_front();
      holder_ = ticket.number_;
      ticket.held_ = true;
      return true;
    }
    // Upkeep between turns is not a turn: a ticket first in line waits for it unannounced.
    if (ahead > 0 && ahead != last && options.on_position) {
      last = ahead;
      lock.unlock();
      options.on_position(ahead);
      lock.lock();
      continue;
    }
    if (options.cancelled) {
      lock.unlock();
      const bool leave = options.cancelled();
      lock.lock();
      if (leave) {
        line_.erase(std::find(line_.begin(), line_.end(), ticket.number_));
        ticket.queue_ = nullptr;
        lock.unlock();
        cv_.notify_all();
        return false;
      }
    }
    cv_.wait_for(lock, options.poll_every);
  }
}

TurnQueue::Ticket TurnQueue::Take() {
  Ticket t = Join();
  Wait(t);
  return t;
}

void TurnQueue::Leave(uint64_t number, bool held) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (held) {
      if (holder_ == number) holder_ = 0;
    } else {
      auto it = std::find(line_.begin(), line_.end(), number);
      if (it != line_.end()) line_.erase(it);
    }
  }
  cv_.notify_all();
}

bool TurnQueue::RunIfIdle(const std::function<void()>& work, std::chrono::milliseconds wait) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, wait, [&] { return holder_ == 0 && line_.empty() && !idle_work_; })) return false;
    idle_work_ = true;
  }
  struct Done {
    TurnQueue* q;
    ~Done() {
      {
        std::lock_guard<std::mutex> lock(q->mu_);
        q->idle_work_ = false;
      }
      q->cv_.notify_all();
    }
  } done{this};
  work();
  return true;
}

void TurnQueue::WakeWaiters() {
  cv_.notify_all();
}

bool TurnQueue::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return holder_ != 0;
}

size_t TurnQueue::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return line_.size();
}

bool TurnQueue::Holds(const Ticket& ticket) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ticket.queue_ == this && ticket.held_ && holder_ == ticket.number_;
}

}  // namespace daisy
