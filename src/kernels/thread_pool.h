// A small persistent thread pool for the column blocks of one product. Decode calls MatMul
// hundreds of times per token, so threads are created once, spin briefly between runs
// (the next product usually follows within microseconds) and then sleep.
// Tasks are claimed dynamically: the caller and every awake worker take the next unclaimed
// tasks until none is left, so a worker the OS has descheduled delays only what it has
// already claimed. A claim takes 1 / (4 * threads) of the tasks still unclaimed, at least
// one: a run of up to 4 tasks per thread (a product's column blocks) is still claimed a task
// at a time, while a run of a thousand small tasks costs a few dozen claims, not a thousand
// (each claim moves the counter's cache line between cores: on a 2-core VM, 0.3 µs per
// task made SiLU over 1,024 tasks of 768 values slower on 2 threads than on 1). A thread
// counts its finished tasks once, when it finds nothing left to claim. Which thread runs a
// task never changes what the task computes.
// Thread-safety: Run() may be called from any thread; a caller that finds the pool busy, or
// that is itself running one of this pool's tasks (a task that runs a product), runs its
// tasks itself, in order.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace daisy::kernels {

class ThreadPool {
 public:
  using TaskFn = void (*)(void* ctx, int task);
  static constexpr int kMaxTasks = 0xFFFF;

  // n_threads counts the caller: n_threads - 1 workers are started.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Runs fn(ctx, t) for every t in [0, n_tasks) (n_tasks <= kMaxTasks) and returns when all
  // are done.
  void Run(int n_tasks, TaskFn fn, void* ctx);

 private:
  // work_ packs [generation: 32][n_tasks: 16][next unclaimed task: 16], so a claim (one
  // compare-exchange) can never take a task of a run other than the one it read.
  static uint32_t Generation(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
  bool Claim(int* first, int* last);
  void RunClaimed();
  void WorkerLoop();

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one Run at a time on the workers
  std::mutex sleep_mu_;
  std::condition_variable wake_;
  std::atomic<uint64_t> work_{0};
  std::atomic<int> done_{0};  // tasks of the current run finished
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  uint32_t generation_ = 0;  // guarded by run_mu_
  // The current run; written before work_ is published, read only after a successful claim.
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
};

}  // namespace daisy::kernels
