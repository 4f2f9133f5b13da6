// TurnQueue: first come, first served; positions as they change; leaving the line; upkeep
// that never counts as a turn; and several threads at once. No test waits on a clock: every
// wait below is for a condition, bounded only so that a bug fails instead of hanging.
#include "daisy/turn_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace daisy {
namespace {

using namespace std::chrono_literals;

// What the waiting threads report, and a way to wait for a report.
struct Log {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int>> positions;  // per waiter, each position it was told
  std::vector<int> admitted;                // waiters in the order they got the turn

  explicit Log(size_t n) : positions(n) {}
  template <class Pred>
  bool Until(Pred pred) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, 20s, [&] { return pred(); });
  }
  int Last(size_t w) { return positions[w].empty() ? -1 : positions[w].back(); }
};

TEST(TurnQueue, FirstComeFirstServedWithEachPositionAsItChanges) {
  TurnQueue q;
  TurnQueue::Ticket first = q.Take();
  ASSERT_TRUE(first.held());
  EXPECT_TRUE(q.busy());
  constexpr size_t kWaiters = 3;
  Log log(kWaiters);
  std::vector<std::thread> threads;
  std::vector<std::atomic<bool>> release(kWaiters);
  for (size_t w = 0; w < kWaiters; ++w) {
    threads.emplace_back([&, w] {
      TurnQueue::Ticket t = q.Join();
      TurnQueue::WaitOptions wo;
      wo.on_position = [&, w](int ahead) {
        std::lock_guard<std::mutex> lock(log.mu);
        log.positions[w].push_back(ahead);
        log.cv.notify_all();
      };
      wo.poll_every = 5ms;
      wo.cancelled = [] { return false; };
      ASSERT_TRUE(q.Wait(t, wo));
      {
        std::lock_guard<std::mutex> lock(log.mu);
        log.admitted.push_back(static_cast<int>(w));
        log.cv.notify_all();
      }
      // Holds the turn until the test lets it go.
      std::unique_lock<std::mutex> lock(log.mu);
      log.cv.wait_for(lock, 20s, [&] { return release[w].load(); });
    });
    // The next waiter joins only once this one is in line.
    ASSERT_TRUE(log.Until([&] { return log.Last(w) == static_cast<int>(w) + 1; })) << "waiter " << w;
  }
  EXPECT_EQ(q.waiting(), kWaiters);
  first.Release();
  for (size_t w = 0; w < kWaiters; ++w) {
    ASSERT_TRUE(log.Until([&] { return log.admitted.size() == w + 1; }));
    // Everyone behind the one admitted moved up by one.
    for (size_t later = w + 1; later < kWaiters; ++later)
      ASSERT_TRUE(log.Until([&] { return log.Last(later) == static_cast<int>(later - w); })) << later;
    {
      std::lock_guard<std::mutex> lock(log.mu);
      release[w] = true;
    }
    log.cv.notify_all();
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(log.admitted, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(log.positions[0], (std::vector<int>{1}));
  EXPECT_EQ(log.positions[1], (std::vector<int>{2, 1}));
  EXPECT_EQ(log.positions[2], (std::vector<int>{3, 2, 1}));
  EXPECT_FALSE(q.busy());
  EXPECT_EQ(q.waiting(), 0u);
}

TEST(TurnQueue, ALeavingWaiterGivesUpItsPlace) {
  TurnQueue q;
  TurnQueue::Ticket holder = q.Take();
  std::atomic<bool> gone{false};
  Log log(2);
  std::thread leaver([&] {
    TurnQueue::Ticket t = q.Join();
    TurnQueue::WaitOptions wo;
    wo.cancelled = [&] { return gone.load(); };
    wo.on_position = [&](int ahead) {
      std::lock_guard<std::mutex> lock(log.mu);
      log.positions[0].push_back(ahead);
      log.cv.notify_all();
    };
    EXPECT_FALSE(q.Wait(t, wo));
    EXPECT_FALSE(t.held());
  });
  ASSERT_TRUE(log.Until([&] { return log.Last(0) == 1; }));
  // A ticket dropped before it waits leaves the line too.
  { TurnQueue::Ticket dropped = q.Join(); }
  std::thread stayer([&] {
    TurnQueue::Ticket t = q.Join();
    TurnQueue::WaitOptions wo;
    wo.on_position = [&](int ahead) {
      std::lock_guard<std::mutex> lock(log.mu);
      log.positions[1].push_back(ahead);
      log.cv.notify_all();
    };
    ASSERT_TRUE(q.Wait(t, wo));
    std::lock_guard<std::mutex> lock(log.mu);
    log.admitted.push_back(1);
    log.cv.notify_all();
  });
  ASSERT_TRUE(log.Until([&] { return log.Last(1) == 2; }));
  gone = true;
  q.WakeWaiters();
  leaver.join();
  // The one behind moved up; the holder still holds the turn.
  ASSERT_TRUE(log.Until([&] { return log.Last(1) == 1; }));
  EXPECT_TRUE(log.admitted.empty());
  EXPECT_EQ(q.waiting(), 1u);
  holder.Release();
  stayer.join();
  EXPECT_EQ(log.admitted, (std::vector<int>{1}));
  EXPECT_EQ(log.positions[1], (std::vector<int>{2, 1}));
  EXPECT_FALSE(q.busy());
  EXPECT_EQ(q.waiting(), 0u);
}

TEST(TurnQueue, UpkeepRunsOnlyBetweenTurnsAndATurnWaitsForIt) {
  TurnQueue q;
  {
    TurnQueue::Ticket t = q.Take();
    EXPECT_TRUE(q.Holds(t));
    bool ran = false;
    EXPECT_FALSE(q.RunIfIdle([&] { ran = true; }, 0ms));
    EXPECT_FALSE(ran);
  }
  std::atomic<bool> in_upkeep{false}, admitted_during_upkeep{false};
  std::thread waiter;
  const bool ran = q.RunIfIdle(
      [&] {
        in_upkeep = true;
        EXPECT_FALSE(q.busy());  // upkeep is not a turn
        waiter = std::thread([&] {
          TurnQueue::Ticket t = q.Join();
          TurnQueue::WaitOptions wo;
          int told = 0;
          wo.on_position = [&](int) { ++told; };
          ASSERT_TRUE(q.Wait(t, wo));
          if (in_upkeep.load()) admitted_during_upkeep = true;
          EXPECT_EQ(told, 0);  // first in line: never told it waits behind a turn
        });
        for (int i = 0; i < 2000 && q.waiting() == 0; ++i) std::this_thread::sleep_for(1ms);
        EXPECT_EQ(q.waiting(), 1u);
        std::this_thread::sleep_for(20ms);  // room for a wrong admission to happen
        in_upkeep = false;
      },
      1s);
  EXPECT_TRUE(ran);
  waiter.join();
  EXPECT_FALSE(admitted_during_upkeep.load());
}

TEST(TurnQueue, ATicketFromAnotherQueueIsNotHeldHere) {
  TurnQueue a, b;
  TurnQueue::Ticket t = a.Take();
  EXPECT_TRUE(a.Holds(t));
  EXPECT_FALSE(b.Holds(t));
  EXPECT_FALSE(b.Wait(t));
  TurnQueue::Ticket moved = std::move(t);
  EXPECT_FALSE(t.held());
  EXPECT_TRUE(a.Holds(moved));
  moved.Release();
  EXPECT_FALSE(a.busy());
}

// Several threads take turns, some give up while waiting, one does upkeep: never two in the
// turn at once, tickets admitted in the order they were taken, nothing left over.
TEST(TurnQueue, ThreadsTakeTurnsOneAtATimeInOrder) {
  TurnQueue q;
  constexpr int kThreads = 6;
  constexpr int kRounds = 150;
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::mutex order_mu;
  std::vector<uint64_t> order;
  std::atomic<int> cancelled{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(static_cast<uint32_t>(w) + 1);
      for (int i = 0; i < kRounds; ++i) {
        TurnQueue::Ticket t = q.Join();
        TurnQueue::WaitOptions wo;
        const bool give_up = rng() % 5 == 0;
        wo.cancelled = [give_up] { return give_up; };
        wo.poll_every = 1ms;
        if (!q.Wait(t, wo)) {
          ++cancelled;
          continue;
        }
        if (inside.fetch_add(1) != 0) ++overlaps;
        {
          std::lock_guard<std::mutex> lock(order_mu);
          order.push_back(t.number());
        }
        if (rng() % 3 == 0) std::this_thread::yield();
        inside.fetch_sub(1);
      }
    });
  }
  std::atomic<bool> done{false};
  std::atomic<int> upkeep{0};
  std::thread idle([&] {
    while (!done.load()) {
      q.RunIfIdle(
          [&] {
            if (inside.load() != 0) ++overlaps;
            ++upkeep;
          },
          5ms);
    }
  });
  for (auto& t : threads) t.join();
  done = true;
  idle.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(static_cast<int>(order.size()) + cancelled.load(), kThreads * kRounds);
  // Give-ups are admitted when nobody is ahead of them, so some always stay in line first.
  EXPECT_GT(order.size(), 0u);
  for (size_t i = 1; i < order.size(); ++i) ASSERT_LT(order[i - 1], order[i]) << "admission " << i;
  EXPECT_FALSE(q.busy());
  EXPECT_EQ(q.waiting(), 0u);
}

}  // namespace
}  // namespace daisy
