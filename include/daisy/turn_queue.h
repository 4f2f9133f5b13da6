// The one line of turns on a head's ring: whoever runs a turn (or loads a model) takes a
// ticket, waits until every ticket taken before it is done, and holds the ring until the
// ticket is released. HeadSession owns one; `serve`'s HTTP server orders its requests on the
// same queue (HeadSession::turns()) and hands the held ticket to the session, so a turn the
// server admitted is never queued again inside the head.
//
// Thread-safe. A Ticket belongs to the thread that waits with it, and must not outlive its
// queue.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

namespace daisy {

class TurnQueue {
 public:
  // A place in the line, then (once Wait admits it) the turn itself. Move-only; destroying
  // it leaves the line or ends the turn.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { Release(); }

    // Admitted: this ticket holds the turn.
    bool held() const { return held_; }
    // Tickets are admitted in increasing number (cancelled ones are skipped).
    uint64_t number() const { return number_; }
    // Ends the turn, or leaves the line; the ticket is empty afterwards.
    void Release();

   private:
    friend class TurnQueue;
    TurnQueue* queue_ = nullptr;
    uint64_t number_ = 0;
    bool held_ = false;
  };

  struct WaitOptions {
    // How many turns are ahead (the one running included), called from the waiting thread
    // each time that count changes while it is above 0.
    std::function<void(int ahead)> on_position;
    // Polled at least every `poll_every` (and at WakeWaiters): true leaves the line.
    std::function<bool()> cancelled;
    std::chrono::milliseconds poll_every{500};
  };

  TurnQueue() = default;
  TurnQueue(const TurnQueue&) = delete;
  TurnQueue& operator=(const TurnQueue&) = delete;

  // Takes the next ticket, at the back of the line; returns at once.
  Ticket Join();
  // Waits until `ticket` is first in line and the turn is free, then holds the turn and
  // returns true; returns false (having left the line) when `cancelled` says so.
  bool Wait(Ticket& ticket, const WaitOptions& options);
  bool Wait(Ticket& ticket) { return Wait(ticket, WaitOptions()); }
  // Join and Wait without cancellation: the turn, once every earlier ticket is done.
  Ticket Take();

  // Runs `work` if no one holds the turn or waits for it within `wait`; returns whether it
  // ran. Meant for upkeep between turns (the head's idle thread keeps the room): such work
  // is not a turn (busy() stays false, positions do not count it), but a turn waits for it
  // to end, so it must be short.
  bool RunIfIdle(const std::function<void()>& work, std::chrono::milliseconds wait);

  // Wakes every waiter to poll its `cancelled` now (e.g. its server is stopping).
  void WakeWaiters();

  // True while a ticket holds the turn; waiting(): tickets in line behind it.
  bool busy() const;
  size_t waiting() const;
  // Whether `ticket` holds the turn of this queue.
  bool Holds(const Ticket& ticket) const;

 private:
  void Leave(uint64_t number, bool held);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint64_t> line_;  // tickets waiting, oldest first
  uint64_t next_ = 1;
  uint64_t holder_ = 0;  // the ticket holding the turn; 0: none
  bool idle_work_ = false;
};

}  // namespace daisy
