// Backend selection (cpuid + OS check, gates, the per-shape choice by measurement,
// DAISY_KERNELS), the thread pool over output columns, the sampled live audit, and the
// public MatMul entry points.
#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daisy/log.h"
#include "internal.h"
#include "thread_pool.h"

namespace daisy::kernels {

std::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kScalar:
      return "scalar";
    case Backend::kAvx2:
      return "avx2";
    case Backend::kAvx512Vnni:
      return "avx512vnni";
    case Backend::kNeon:
      return "neon";
    case Backend::kWasm:
      return "wasm";
  }
  return "unknown";
}

std::string_view ProductShapeName(ProductShape shape) {
  switch (shape) {
    case ProductShape::kGemv:
      return "gemv";
    case ProductShape::kGemm:
      return "gemm";
    case ProductShape::kAttention:
      return "attention";
  }
  return "unknown";
}

namespace {

constexpr std::array<Backend, kBackendCount> kAllBackends = {Backend::kScalar, Backend::kAvx2, Backend::kAvx512Vnni,
                                                             Backend::kNeon, Backend::kWasm};
// Preference when several pass: the widest first.
constexpr std::array<Backend, kBackendCount> kPreference = {Backend::kAvx512Vnni, Backend::kAvx2, Backend::kNeon,
                                                            Backend::kWasm, Backend::kScalar};
// Default sampled audit: every 1024th product re-checks one cell (about k multiply-adds per
// 1024 products: far below 0.1% of the work). DAISY_AUDIT_EVERY overrides (0 = off).
constexpr int kDefaultAuditEvery = 1024;
constexpr int kDefaultAuditCells = 1;
// Products smaller than this many multiply-adds run on the calling thread alone: waking
// workers costs more than it saves.
constexpr int64_t kMinParallelMacs = int64_t{1} << 16;
// Column blocks of a many-row product (and a decode product's chunks) are whole tiles of
// the widest kernel, and so whole cache lines of y: avx512vnni's
// packed tile computes 32 columns even when fewer are asked for, so a block of 80 columns
// cost as much as 96 (measured: SmolLM's 576-column products split 8 ways gave 7 blocks of 80
// and one of 16, 22 tiles of work for 18).
constexpr int kBlockAlign = 32;
// Blocks per thread: threads claim blocks as they come free, so a thread the OS has
// descheduled (other processes, big.LITTLE cores) holds up at most one small block.
constexpr int kBlocksPerThread = 4;
// Products of at most this many x rows (a decode step's) split their columns into one run
// per thread (RunFromEnds), claimed a chunk at a time: kEndsChunk columns, or 16 for one x
// row (the GEMV's one-row paths take 8 rows at a time). A product ends when its last chunk
// does, so the chunk bounds the threads' imbalance: on the 2-core Zen 3 EPYC, SmolLM-sized
// decode products at 2 threads streamed 0.80-0.86 of the read ceiling in chunks of 64
// columns and 0.85-0.88 in chunks of 16 (docs/KERNELS.md, "Threads"). 2-4 rows (drafts
// scored in a lap) were not measured and keep 64.
constexpr int kEndsMaxRows = 4;
constexpr int kEndsChunk = 2 * kBlockAlign;
constexpr int kEndsChunkOneRow = 16;
constexpr int kMaxEndSegments = 32;  // at most this many threads take part in a decode product

std::atomic<uint8_t> g_fault_mask{0};
// Set in a child after fork(): the pool's workers did not survive it.
std::atomic<bool> g_forked{false};
void OnForkChild() {
  g_forked.store(true);
}

template <Backend B>
void FaultyEntry(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy,
                 int col_begin, int col_end) {
  internal::EntryFor(B)(xq, xscale, m, ldx, w, y, ldy, col_begin, col_end);
  if (m <= 0 || col_begin >= col_end) return;
  uint32_t bits;
  std::memcpy(&bits, &y[col_begin], 4);
  bits ^= 1u;
  std::memcpy(&y[col_begin], &bits, 4);
}

struct Registry {
  std::mutex mu;  // guards status, the choice's source and timings, and the pool
  std::array<BackendStatus, kBackendCount> status;
  // The backend of each ProductShape; read without the lock by every product.
  std::array<std::atomic<uint8_t>, kProductShapes> choice{};
  std::string choice_source;
  bool forced = false;                // DAISY_KERNELS or SetBackend: one backend everywhere
  internal::ShapeTimings timings{};   // what the choice was made from (0: not measured)
  internal::ShapeTimings measured{};  // this process's own measurement, reused by Reinitialize
  bool have_measured = false;
  std::atomic<int> threads{1};
  std::unique_ptr<ThreadPool> pool;
  std::atomic<int> audit_every{kDefaultAuditEvery};
  std::atomic<int> audit_cells{kDefaultAuditCells};
  std::atomic<uint64_t> product_count{0};
  std::atomic<uint64_t> audited_products{0}, audited_cells{0}, audit_mismatches{0};
};

// A wasm build without pthreads (tests/wasm, the browser node) cannot start a thread: it
// computes on the calling thread alone, whatever SetThreads asks.
#if defined(__EMSCRIPTEN__) && !defined(__EMSCRIPTEN_PTHREADS__)
constexpr int kMaxThreads = 1;
#else
constexpr int kMaxThreads = std::numeric_limits<int>::max();
#endif

int DefaultThreads() {
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : std::min(static_cast<int>(hc), kMaxThreads);
}

// Best backend that is supported and passed its gate (caller holds r.mu).
Backend BestPassing(const Registry& r) {
  for (Backend b : kPreference) {
    const BackendStatus& s = r.status[static_cast<size_t>(b)];
    if (s.supported && s.gate_passed) return b;
  }
  return Backend::kScalar;
}

void SetAll(Registry& r, Backend b) {
  for (auto& c : r.choice) c.store(static_cast<uint8_t>(b));
}

// Per shape, the fastest backend in r.timings that is supported and passed its gate (ties
// and unmeasured shapes: the preference order). Caller holds r.mu.
void ChooseFromTimings(Registry& r) {
  const Backend fallback = BestPassing(r);
  for (int shape = 0; shape < kProductShapes; ++shape) {
    Backend best = fallback;
    double best_s = 0;
    for (Backend b : kPreference) {
      const BackendStatus& st = r.status[static_cast<size_t>(b)];
      const double sec = r.timings[static_cast<size_t>(shape)][static_cast<size_t>(b)];
      if (!st.supported || !st.gate_passed || !(sec > 0)) continue;
      if (best_s == 0 || sec < best_s) {
        best = b;
        best_s = sec;
      }
    }
    r.choice[static_cast<size_t>(shape)].store(static_cast<uint8_t>(best));
  }
}

// The per-shape choice among the backends that passed their gates: from the cached timings
// when they are valid for this CPU and kernel version, else measured now (and cached).
void ChooseByMeasurement(Registry& r, const internal::BackendTable& entries) {
  std::vector<Backend> passing;
  for (Backend b : kAllBackends)
    if (r.status[static_cast<size_t>(b)].supported && r.status[static_cast<size_t>(b)].gate_passed)
      passing.push_back(b);
  r.timings = {};
  if (passing.size() <= 1) {
    SetAll(r, BestPassing(r));
    r.choice_source = "only " + std::string(BackendName(BestPassing(r)));
    return;
  }
  const std::string path = internal::ChoiceCachePath();
  const std::string why = path.empty() ? "no DAISY_HOME" : internal::ReadChoiceCache(path, passing, &r.timings);
  if (why.empty()) {
    r.choice_source = "cache";
  } else {
    if (!path.empty() && why != "no cache file")
      LogInfo("kernels: ignoring the cached backend timings in " + path + " (" + why + "); measuring again");
    bool covered = r.have_measured;
    for (Backend b : passing)
      for (int shape = 0; shape < kProductShapes; ++shape)
        covered = covered && r.measured[static_cast<size_t>(shape)][static_cast<size_t>(b)] > 0;
    if (!covered) {
      r.measured = internal::MeasureShapes(entries, passing);
      r.have_measured = true;
    }
    r.timings = r.measured;
    r.choice_source = "measured";
    if (!path.empty()) {
      const std::string err = internal::WriteChoiceCache(path, r.timings);
      if (!err.empty()) LogInfo("kernels: backend timings not cached: " + err);
    }
  }
  ChooseFromTimings(r);
}

// Detects support, gates every supported SIMD entry of `entries` and chooses the backends.
void Initialize(Registry& r, const internal::BackendTable& entries) {
  std::lock_guard<std::mutex> lock(r.mu);
  for (Backend b : kAllBackends) {
    BackendStatus& s = r.status[static_cast<size_t>(b)];
    s = BackendStatus{b, false, false, ""};
    const MatMulQFn entry = entries[static_cast<size_t>(b)];
    std::string problem = CpuSupportProblem(b);
    if (problem.empty() && entry == nullptr) problem = "not built into this binary";
    if (!problem.empty()) {
      s.reason = std::move(problem);
      continue;
    }
    s.supported = true;
    s.gate_passed = b == Backend::kScalar;  // the reference itself; SIMD units are gated below
  }
  std::vector<Backend> gated;
  std::vector<MatMulQFn> fns;
  for (Backend b : kAllBackends)
    if (b != Backend::kScalar && r.status[static_cast<size_t>(b)].supported) {
      gated.push_back(b);
      fns.push_back(entries[static_cast<size_t>(b)]);
    }
  const std::vector<std::string> mismatches = internal::RunGates(fns);
  for (size_t i = 0; i < gated.size(); ++i) {
    BackendStatus& s = r.status[static_cast<size_t>(gated[i])];
    s.gate_passed = mismatches[i].empty();
    if (!s.gate_passed) {
      s.reason = "demoted: failed its exactness gate against scalar (" + mismatches[i] + ")";
      LogWarning("kernels: backend " + std::string(BackendName(gated[i])) + " " + s.reason);
    }
  }
  const Backend* forced = nullptr;
  if (const char* env = std::getenv("DAISY_KERNELS"); env != nullptr && *env != '\0') {
    const std::string want = env;
    const Backend* found = nullptr;
    for (const Backend& b : kAllBackends)
      if (BackendName(b) == want) found = &b;
    if (found == nullptr) {
      LogWarning("kernels: DAISY_KERNELS=" + want +
                 " is not a backend (scalar|avx2|avx512vnni|neon|wasm); choosing per product shape");
    } else {
      const BackendStatus& s = r.status[static_cast<size_t>(*found)];
      if (!s.supported || !s.gate_passed)
        LogWarning("kernels: DAISY_KERNELS=" + want + " cannot be used here (" + s.reason +
                   "); choosing per product shape");
      else
        forced = found;
    }
  }
  r.forced = forced != nullptr;
  if (forced != nullptr) {
    r.timings = {};
    SetAll(r, *forced);
    r.choice_source = "DAISY_KERNELS";
  } else {
    ChooseByMeasurement(r, entries);
  }
  int every = kDefaultAuditEvery;
  if (const char* env = std::getenv("DAISY_AUDIT_EVERY"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 0 || v > 1000000000)
      LogWarning("kernels: DAISY_AUDIT_EVERY=" + std::string(env) + " is not a count >= 0; using " +
                 std::to_string(every));
    else
      every = static_cast<int>(v);
  }
  r.audit_every.store(every);
  r.threads.store(DefaultThreads());
  r.pool.reset();
  std::string line = "kernels: backend per product shape (" + r.choice_source + "):";
  for (int shape = 0; shape < kProductShapes; ++shape)
    line += " " + std::string(ProductShapeName(static_cast<ProductShape>(shape))) + "=" +
            std::string(BackendName(static_cast<Backend>(r.choice[static_cast<size_t>(shape)].load())));
  LogDebug(line);
}

// Initialized once, thread-safely, before the first product (function-local static).
Registry& Reg() {
  static Registry* const kRegistry = [] {
    auto* r = new Registry;  // never destroyed: products may run during static destruction
    Initialize(*r, internal::LiveEntries());
    pthread_atfork(nullptr, nullptr, &OnForkChild);
    return r;
  }();
  return *kRegistry;
}

ThreadPool* PoolFor(Registry& r, int n_threads) {
  std::lock_guard<std::mutex> lock(r.mu);
  // After fork() the inherited pool has no workers and cannot be joined: abandon it.
  if (g_forked.exchange(false)) (void)r.pool.release();
  if (!r.pool || r.pool->threads() != n_threads) r.pool = std::make_unique<ThreadPool>(n_threads);
  return r.pool.get();
}

struct ProductTask {
  MatMulQFn fn;
  const int8_t* xq;
  const float* xscale;
  int m;
  size_t ldx;
  const QMatrixView* w;
  float* y;
  size_t ldy;
  int groups;   // kBlockAlign-column groups of the product
  int n_tasks;  // task t takes groups [groups * t / n_tasks, groups * (t + 1) / n_tasks)
};

// The tasks' group counts differ by at most one, so threads claiming them in turn end
// within one group of each other.
void RunColumnBlock(void* ctx, int t) {
  const auto& p = *static_cast<const ProductTask*>(ctx);
  const auto edge = [&p](int task) { return static_cast<int>(int64_t{p.groups} * task / p.n_tasks * kBlockAlign); };
  const int c0 = edge(t);
  const int c1 = std::min(p.w->n, edge(t + 1));
  if (c0 < c1) p.fn(p.xq, p.xscale, p.m, p.ldx, *p.w, p.y, p.ldy, c0, c1);
}

// A decode product's columns: each thread walks its own contiguous run. Every start of a new
// weight range costs a stream ramp (measured: a 0.9 MB GEMV on 2 threads took 22 us as 2
// blocks, 26 us as 8, 36 us as 32), so task t owns segment t and claims its chunks from the
// low end upward; a task whose segment is done takes chunks from the high end of the
// others', so a descheduled thread holds up nothing but the chunk it is in. Which thread
// computes a column changes no bit.
struct EndsTask {
  ProductTask p;
  int segments;
  int chunk;  // columns per claim
  // Each segment's [lo, hi) in chunks, packed in one word so both ends claim atomically;
  // one cache line each, so the owners' claims do not contend.
  struct alignas(64) Ends {
    std::atomic<uint64_t> v;
  } ends[kMaxEndSegments];
};

// Claims one chunk of a segment from its high or low end; false when it is empty.
bool ClaimChunk(std::atomic<uint64_t>& ends, bool from_high, uint32_t* chunk) {
  uint64_t v = ends.load(std::memory_order_relaxed);
  for (;;) {
    const auto lo = static_cast<uint32_t>(v), hi = static_cast<uint32_t>(v >> 32);
    if (lo >= hi) return false;
    *chunk = from_high ? hi - 1 : lo;
    const uint64_t next = from_high ? (uint64_t{*chunk} << 32) | lo : (uint64_t{hi} << 32) | (lo + 1);
    if (ends.compare_exchange_weak(v, next, std::memory_order_relaxed)) return true;
  }
}

void RunFromEnds(void* ctx, int t) {
  auto& e = *static_cast<EndsTask*>(ctx);
  auto run = [&](uint32_t c) {
    const int c0 = static_cast<int>(c) * e.chunk;
    const int c1 = std::min(e.p.w->n, c0 + e.chunk);
    e.p.fn(e.p.xq, e.p.xscale, e.p.m, e.p.ldx, *e.p.w, e.p.y, e.p.ldy, c0, c1);
  };
  uint32_t c;
  while (ClaimChunk(e.ends[t].v, false, &c)) run(c);
  for (int k = 1; k < e.segments; ++k)
    while (ClaimChunk(e.ends[(t + k) % e.segments].v, true, &c)) run(c);
}

void Demote(Registry& r, Backend b, const std::string& why) {
  std::lock_guard<std::mutex> lock(r.mu);
  BackendStatus& s = r.status[static_cast<size_t>(b)];
  s.gate_passed = false;
  s.reason = "demoted: " + why;
  // Every shape that used it moves to the next fastest passing backend (the preference
  // order when it was forced or nothing was measured).
  if (r.forced) r.timings = {};
  ChooseFromTimings(r);
  LogError("kernels: backend " + std::string(BackendName(b)) + " " + s.reason + "; now using " +
           std::string(BackendName(static_cast<Backend>(r.choice[0].load()))) + " for gemv");
}

}  // namespace

namespace internal {

MatMulQFn EntryFor(Backend backend) {
  switch (backend) {
    case Backend::kScalar:
      return &scalar::MatMulQ;
#if defined(DAISY_KERNELS_X86)
    case Backend::kAvx2:
      return &avx2::MatMulQ;
    case Backend::kAvx512Vnni:
      return &avx512vnni::MatMulQ;
#endif
#if defined(DAISY_KERNELS_NEON)
    case Backend::kNeon:
      return &neon::MatMulQ;
#endif
#if defined(DAISY_KERNELS_WASM)
    case Backend::kWasm:
      return &wasm::MatMulQ;
#endif
    default:
      return nullptr;
  }
}

MatMulQFn LiveEntryFor(Backend backend) {
  if (EntryFor(backend) == nullptr) return nullptr;
  if ((g_fault_mask.load(std::memory_order_relaxed) >> static_cast<int>(backend)) & 1u) {
    switch (backend) {
      case Backend::kScalar:
        return &FaultyEntry<Backend::kScalar>;
      case Backend::kAvx2:
        return &FaultyEntry<Backend::kAvx2>;
      case Backend::kAvx512Vnni:
        return &FaultyEntry<Backend::kAvx512Vnni>;
      case Backend::kNeon:
        return &FaultyEntry<Backend::kNeon>;
      case Backend::kWasm:
        return &FaultyEntry<Backend::kWasm>;
    }
  }
  return EntryFor(backend);
}

void RunProduct(MatMulQFn fn, const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y,
                size_t ldy) {
  if (m <= 0 || w.n <= 0) return;
  Registry& r = Reg();
  const int threads = r.threads.load(std::memory_order_relaxed);
  const int64_t macs = int64_t{m} * w.n * std::max(w.k, 1);
  const int col_groups = (w.n + kBlockAlign - 1) / kBlockAlign;
  const int n_tasks = macs < kMinParallelMacs || threads <= 1
                          ? 1
                          : std::min({threads * kBlocksPerThread, col_groups, ThreadPool::kMaxTasks});
  ProductTask task{fn, xq, xscale, m, ldx, &w, y, ldy, col_groups, n_tasks};
  if (n_tasks <= 1) {
    RunColumnBlock(&task, 0);
    return;
  }
  if (m <= kEndsMaxRows) {
    // A decode product streams its weights once: one run per thread (RunFromEnds).
    EndsTask e{task, std::min(threads, kMaxEndSegments), m == 1 ? kEndsChunkOneRow : kEndsChunk, {}};
    const int chunks = (w.n + e.chunk - 1) / e.chunk;
    for (int s = 0; s < e.segments; ++s) {
      const auto lo = static_cast<uint64_t>(chunks * s / e.segments);
      const auto hi = static_cast<uint64_t>(chunks * (s + 1) / e.segments);
      e.ends[s].v.store((hi << 32) | lo, std::memory_order_relaxed);
    }
    PoolFor(r, threads)->Run(e.segments, &RunFromEnds, &e);
    return;
  }
  PoolFor(r, threads)->Run(n_tasks, &RunColumnBlock, &task);
}

void SetFaultInjection(Backend backend, bool on) {
  const auto bit = static_cast<uint8_t>(1u << static_cast<int>(backend));
  if (on)
    g_fault_mask.fetch_or(bit);
  else
    g_fault_mask.fetch_and(static_cast<uint8_t>(~bit));
}

BackendTable LiveEntries() {
  BackendTable t{};
  for (Backend b : kAllBackends) t[static_cast<size_t>(b)] = LiveEntryFor(b);
  return t;
}

void Reinitialize() {
  Initialize(Reg(), LiveEntries());
}

void Reinitialize(const BackendTable& entries) {
  Initialize(Reg(), entries);
}

}  // namespace internal

PrefetchCursor& ThreadPrefetchCursor() {
  thread_local PrefetchCursor cursor;
  return cursor;
}

void PrefetchDuringProducts(std::span<const PrefetchRange> ranges) {
  PrefetchCursor& c = ThreadPrefetchCursor();
  c.count = static_cast<int>(std::min(ranges.size(), static_cast<size_t>(kMaxPrefetchRanges)));
  for (int i = 0; i < c.count; ++i) {
    const PrefetchRange& r = ranges[static_cast<size_t>(i)];
    const auto b = reinterpret_cast<uintptr_t>(r.begin);
    c.ranges[i] = {b, r.begin == nullptr ? b : b + r.bytes};
  }
  c.range = 0;
  NextPrefetchRange(c, &c.next, &c.end);
}

PrefetchRange InterleavedBytes(const QMatrixView& w) {
  if (!w.interleaved() || w.n <= 0 || w.k <= 0) return {};
  const InterleavedTiles tiles = TilesOf(w, 0, w.n);
  const size_t groups = static_cast<size_t>(w.k + 3) / 4;
  const int8_t* begin = w.q + static_cast<size_t>(tiles.begin) * w.tile_stride;
  const int8_t* end = w.q + static_cast<size_t>(tiles.end - 1) * w.tile_stride + (groups - 1) * w.group_stride + 64;
  return {begin, static_cast<size_t>(end - begin)};
}

std::vector<BackendStatus> BackendReport() {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  return std::vector<BackendStatus>(r.status.begin(), r.status.end());
}

BackendChoice ActiveChoice() {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  BackendChoice c;
  for (int shape = 0; shape < kProductShapes; ++shape)
    c.shape[shape] = static_cast<Backend>(r.choice[static_cast<size_t>(shape)].load());
  c.source = r.choice_source;
  return c;
}

std::string BackendChoiceSummary() {
  const BackendChoice c = ActiveChoice();
  bool same = true;
  for (int shape = 1; shape < kProductShapes; ++shape) same = same && c.shape[shape] == c.shape[0];
  if (same) return std::string(BackendName(c.shape[0]));
  std::string out;
  for (int shape = 0; shape < kProductShapes; ++shape)
    out += (shape ? " " : "") + std::string(ProductShapeName(static_cast<ProductShape>(shape))) + ":" +
           std::string(BackendName(c.shape[shape]));
  return out;
}

Backend ActiveBackend() {
  return static_cast<Backend>(Reg().choice[static_cast<size_t>(ProductShape::kGemv)].load());
}

Status SetBackend(Backend backend) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  const BackendStatus& s = r.status[static_cast<size_t>(backend)];
  if (!s.supported)
    return Unimplemented("kernels: backend " + std::string(BackendName(backend)) +
                         " is not supported here: " + s.reason);
  if (!s.gate_passed) return Unimplemented("kernels: backend " + std::string(BackendName(backend)) + " is " + s.reason);
  SetAll(r, backend);
  r.forced = true;
  r.timings = {};
  r.choice_source = "SetBackend";
  return Status::Ok();
}

void SetThreads(int n_threads) {
  Registry& r = Reg();
  r.threads.store(std::clamp(n_threads, 1, kMaxThreads));
  std::lock_guard<std::mutex> lock(r.mu);
  r.pool.reset();  // rebuilt at the next product with the new size
}

int Threads() {
  return Reg().threads.load();
}

void ParallelFor(int n_tasks, void (*fn)(void* ctx, int task), void* ctx) {
  if (n_tasks <= 0) return;
  Registry& r = Reg();
  const int threads = r.threads.load(std::memory_order_relaxed);
  if (threads <= 1 || n_tasks == 1) {
    for (int t = 0; t < n_tasks; ++t) fn(ctx, t);
    return;
  }
  // ThreadPool::Run takes at most kMaxTasks: larger counts run in rounds.
  for (int t0 = 0; t0 < n_tasks; t0 += ThreadPool::kMaxTasks) {
    struct Offset {
      void (*fn)(void*, int);
      void* ctx;
      int t0;
    } off{fn, ctx, t0};
    PoolFor(r, threads)
        ->Run(
            std::min(ThreadPool::kMaxTasks, n_tasks - t0),
            [](void* c, int t) {
              auto* o = static_cast<Offset*>(c);
              o->fn(o->ctx, o->t0 + t);
            },
            &off);
  }
}

void SetAuditRate(int every, int cells) {
  Registry& r = Reg();
  r.audit_every.store(every < 0 ? 0 : every);
  r.audit_cells.store(cells < 1 ? 1 : cells);
}

AuditStats GetAuditStats() {
  Registry& r = Reg();
  return AuditStats{r.audited_products.load(), r.audited_cells.load(), r.audit_mismatches.load()};
}

void MatMulQ(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy) {
  MatMulQ(xq, xscale, m, ldx, w, y, ldy, m == 1 ? ProductShape::kGemv : ProductShape::kGemm);
}

void MatMulQ(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy,
             ProductShape shape) {
  // k comes from validated specs (QuantizeMatrix refuses k > kMaxK), so this is a bug.
  DAISY_CHECK(w.k >= 0 && w.k <= kMaxK, "Bug: MatMulQ reduction length outside [0, kMaxK]: int32 could overflow");
  DAISY_CHECK(m >= 0 && w.n >= 0 && (w.interleaved() || w.ld >= static_cast<size_t>(w.k)) &&
                  (m <= 1 || (ldx >= static_cast<size_t>(w.k) && ldy >= static_cast<size_t>(w.n))),
              "Bug: MatMulQ shape or stride inconsistent");
  DAISY_CHECK(!w.interleaved() || (w.k % 4 == 0 && w.first_row >= 0 && w.first_row < kInterleavedRows &&
                                   w.group_stride >= 64 && w.tile_stride >= 64),
              "Bug: MatMulQ interleaved view inconsistent (k a multiple of 4, first_row < 16, groups of 64 bytes)");
  if (m == 0 || w.n == 0) return;
  Registry& r = Reg();
  const auto b = static_cast<Backend>(r.choice[static_cast<size_t>(shape)].load(std::memory_order_relaxed));
  internal::RunProduct(internal::LiveEntryFor(b), xq, xscale, m, ldx, w, y, ldy);

  // Sampled live audit: re-check a few random cells of this finished product.
  const int every = r.audit_every.load(std::memory_order_relaxed);
  if (b == Backend::kScalar || every <= 0) return;
  const uint64_t count = r.product_count.fetch_add(1, std::memory_order_relaxed);
  if (count % static_cast<uint64_t>(every) != 0) return;
  const int cells = r.audit_cells.load(std::memory_order_relaxed);
  const AuditResult a = AuditCells(xq, xscale, m, ldx, w, y, ldy, cells, count);
  r.audited_products.fetch_add(1);
  r.audited_cells.fetch_add(static_cast<uint64_t>(a.checked));
  if (a.ok()) return;
  r.audit_mismatches.fetch_add(static_cast<uint64_t>(a.mismatches));
  Demote(r, b,
         "live audit mismatch at y[" + std::to_string(a.row) + "][" + std::to_string(a.col) +
             "] (m=" + std::to_string(m) + " n=" + std::to_string(w.n) + " k=" + std::to_string(w.k) + ")");
  // Never hand on a wrong product: redo it with the reference.
  internal::RunProduct(&scalar::MatMulQ, xq, xscale, m, ldx, w, y, ldy);
}

namespace {

// Rows quantized per task when a batch's rows are quantized across the pool.
constexpr int kQuantizeRowsPerTask = 8;

struct QuantizeTask {
  const float* x;
  int m, k;
  int8_t* xq;
  float* xs;
  std::atomic<bool> finite{true};
};

void QuantizeRows(void* ctx, int t) {
  auto* q = static_cast<QuantizeTask*>(ctx);
  const int i1 = std::min(q->m, (t + 1) * kQuantizeRowsPerTask);
  const auto k = static_cast<size_t>(q->k);
  for (int i = t * kQuantizeRowsPerTask; i < i1; ++i)
    if (!QuantizeRow(q->x + static_cast<size_t>(i) * k, q->k, q->xq + static_cast<size_t>(i) * k, &q->xs[i]))
      q->finite.store(false, std::memory_order_relaxed);
}

}  // namespace

bool MatMul(const float* x, int m, const QMatrixView& w, float* y) {
  // Reused per thread: decode calls this hundreds of times per token.
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xs;
  const size_t k = static_cast<size_t>(std::max(w.k, 0));
  xq.resize(static_cast<size_t>(std::max(m, 0)) * k);
  xs.resize(static_cast<size_t>(std::max(m, 0)));
  // Each row is quantized whole by one thread, so the bits do not depend on the split; a
  // prefill batch spreads its rows over the pool (serial, they took a quarter of a prefill).
  QuantizeTask task{x, m, w.k, xq.data(), xs.data()};
  ParallelFor(m <= 0 ? 0 : (m + kQuantizeRowsPerTask - 1) / kQuantizeRowsPerTask, &QuantizeRows, &task);
  if (!task.finite.load()) return false;
  MatMulQ(xq.data(), xs.data(), m, k, w, y, static_cast<size_t>(w.n));
  return true;
}

}  // namespace daisy::kernels
