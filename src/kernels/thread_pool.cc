#include "thread_pool.h"

#include <algorithm>
#include <chrono>

#include "daisy/kernels.h"

namespace daisy::kernels {
namespace {

// How long an idle worker spins before it sleeps on the condition variable.
constexpr auto kSpin = std::chrono::microseconds(100);

// Set while this thread runs a pool task: a task's own Run (a product inside an attention
// task) then runs in order on this thread instead of waiting for a pool it occupies.
thread_local bool t_in_task = false;

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> run(run_mu_);
    stop_.store(true);
    work_.store(static_cast<uint64_t>(++generation_) << 32, std::memory_order_seq_cst);
  }
  {
    std::lock_guard<std::mutex> lk(sleep_mu_);
    wake_.notify_all();
  }
  for (std::thread& t : workers_) t.join();
}

bool ThreadPool::Claim(int* first, int* last) {
  // Guided claims (thread_pool.h): a shrinking share of what is left.
  const uint64_t share = 4 * static_cast<uint64_t>(threads());
  uint64_t w = work_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t next = w & 0xFFFF, n = (w >> 16) & 0xFFFF;
    if (next >= n) return false;
    const uint64_t take = std::max<uint64_t>(1, (n - next) / share);
    if (work_.compare_exchange_weak(w, w + take, std::memory_order_acq_rel, std::memory_order_acquire)) {
      *first = static_cast<int>(next);
      *last = static_cast<int>(next + take);
      return true;
    }
  }
}

void ThreadPool::RunClaimed() {
  int first, last;
  int finished = 0;
  while (Claim(&first, &last)) {
    // fn_ and ctx_ belong to the run these tasks were claimed from: Run() does not return
    // (and cannot overwrite them) before they are counted done.
    t_in_task = true;
    for (int t = first; t < last; ++t) fn_(ctx_, t);
    t_in_task = false;
    finished += last - first;
  }
  if (finished > 0) done_.fetch_add(finished, std::memory_order_release);
}

void ThreadPool::WorkerLoop() {
  uint32_t seen = 0;
  for (;;) {
    uint64_t w = work_.load(std::memory_order_acquire);
    auto spin_start = std::chrono::steady_clock::now();
    for (int spins = 0; Generation(w) == seen; w = work_.load(std::memory_order_acquire)) {
      if (++spins % 256 == 0 && std::chrono::steady_clock::now() - spin_start > kSpin) {
        // Sleep. sleepers_ and work_ are seq_cst on both sides, so either Run() sees this
        // sleeper and notifies, or this predicate sees the new generation.
        std::unique_lock<std::mutex> lk(sleep_mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lk, [&] { return Generation(work_.load(std::memory_order_seq_cst)) != seen; });
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        spin_start = std::chrono::steady_clock::now();
      }
      CpuRelax();
    }
    seen = Generation(w);
    if (stop_.load(std::memory_order_acquire)) return;
    RunClaimed();
  }
}

void ThreadPool::Run(int n_tasks, TaskFn fn, void* ctx) {
  std::unique_lock<std::mutex> run(run_mu_, std::defer_lock);
  if (n_tasks <= 1 || n_tasks > kMaxTasks || workers_.empty() || t_in_task || !run.try_lock()) {
    for (int t = 0; t < n_tasks; ++t) fn(ctx, t);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  done_.store(0, std::memory_order_relaxed);
  // Publishing the new word (release) makes fn_, ctx_ and done_ visible to every claimer.
  work_.store((static_cast<uint64_t>(++generation_) << 32) | (static_cast<uint64_t>(n_tasks) << 16),
              std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lk(sleep_mu_);
    wake_.notify_all();
  }
  RunClaimed();  // the caller works too, and takes over whatever no worker has claimed
  for (int spins = 0; done_.load(std::memory_order_acquire) != n_tasks; ++spins) {
    if (spins >= 4096) std::this_thread::yield();  // a worker is mid-task: let it run
    CpuRelax();
  }
}

}  // namespace daisy::kernels
