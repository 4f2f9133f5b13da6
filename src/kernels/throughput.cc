// Throughput figures for `daisychain bench` and the ring planner's capacity.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>
#include <vector>

#include "internal.h"

namespace daisy::kernels {
namespace {

// Random int8 in [-127, 127] (the quantizer's range), 8 bytes per generator step.
void FillQ(std::span<int8_t> q, uint64_t seed) {
  for (size_t i = 0; i < q.size(); i += 8) {
    uint64_t r = internal::SplitMix64(seed + i);
    for (size_t b = 0; b < 8 && i + b < q.size(); ++b, r >>= 8) {
      const int v = static_cast<int>(r & 0xFF) - 128;
      q[i + b] = static_cast<int8_t>(v == -128 ? 0 : v);
    }
  }
}

struct Case {
  int m, n, k;
  std::vector<int8_t> x;
  LargePageBytes w;  // as a model's weights are held
  std::vector<float> xs, ws, y;
  Case(int m_, int n_, int k_) : m(m_), n(n_), k(k_) {
    x.resize(static_cast<size_t>(m) * static_cast<size_t>(k));
    w.resize(static_cast<size_t>(n) * static_cast<size_t>(k));
    FillQ(x, 1);
    FillQ(w, 2);
    xs.assign(static_cast<size_t>(m), 0.01f);
    ws.assign(static_cast<size_t>(n), 0.02f);
    y.resize(static_cast<size_t>(m) * static_cast<size_t>(n));
  }
  QMatrixView View() const { return QMatrixView{w.data(), ws.data(), nullptr, n, k, static_cast<size_t>(k)}; }
  // Seconds per product through `fn`: one warm-up, then repeats for about `seconds`.
  double SecondsPerProduct(MatMulQFn fn, double seconds) {
    const QMatrixView v = View();
    auto run = [&] {
      internal::RunProduct(fn, x.data(), xs.data(), m, static_cast<size_t>(k), v, y.data(), static_cast<size_t>(n));
    };
    run();
    const auto start = std::chrono::steady_clock::now();
    int reps = 0;
    double elapsed = 0.0;
    do {
      run();
      ++reps;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (elapsed < seconds);
    return elapsed / reps;
  }
  double Ops() const { return 2.0 * m * n * static_cast<double>(k); }
};

// Seconds of one call of `run`.
template <typename F>
double Seconds(F&& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

namespace internal {

ShapeTimings MeasureShapes(const BackendTable& entries, std::span<const Backend> backends) {
  // gemv: decode's weight stream, 48 MB of int8 (more than the caches hold near a core) in
  // two products, rows of 576 and of 896 bytes (SmolLM's and Qwen's hidden widths: a short
  // row's reduction and epilogue weigh more, and the backends' one-row paths differ most
  // there, 26-28 against 25-26 GB/s); gemm: a prefill chunk's projection; attention: one
  // decode step of a KV head (group of 8 query rows) against 512 cached keys, Q.K (k =
  // head_dim 64) then P.V (k = the keys), both over the KV cache's interleaved layouts
  // (forward.h KvCache: keys in tiles of 16 positions, values in groups of 4).
  Case gemv_short(1, 40960, 576), gemv(1, 26624, 896), gemm(64, 512, 896), qk(8, 512, 64), pv(8, 64, 512);
  const QMatrixView qk_view{qk.w.data(), qk.ws.data(), nullptr, 512, 64, 64, 64 * kInterleavedRows, 64, 0};
  const QMatrixView pv_view{pv.w.data(), nullptr, nullptr, 64, 512, 512, 64, 64 * 4, 0};
  ShapeTimings t{};  // 0: not measured (yet)
  // Rounds of every backend on every shape in turn, best of the rounds after a warm-up: on a
  // shared machine a burst of other work then slows one round of every backend, not every
  // round of one backend (which once made scalar look fastest for the GEMV).
  constexpr int kRounds = 4;
  for (int round = 0; round <= kRounds; ++round) {
    for (Backend b : backends) {
      const MatMulQFn fn = entries[static_cast<size_t>(b)];
      if (fn == nullptr) continue;
      auto whole = [fn](Case& c, const QMatrixView& v) {
        fn(c.x.data(), c.xs.data(), c.m, static_cast<size_t>(c.k), v, c.y.data(), static_cast<size_t>(c.n), 0, v.n);
      };
      const double times[kProductShapes] = {Seconds([&] {
                                              whole(gemv_short, gemv_short.View());
                                              whole(gemv, gemv.View());
                                            }),
                                            Seconds([&] { whole(gemm, gemm.View()); }), Seconds([&] {
                                              for (int rep = 0; rep < 8; ++rep) {
                                                whole(qk, qk_view);
                                                whole(pv, pv_view);
                                              }
                                            })};
      if (round == 0) continue;  // warm-up
      for (int sh = 0; sh < kProductShapes; ++sh) {
        double& best = t[static_cast<size_t>(sh)][static_cast<size_t>(b)];
        if (best == 0 || times[sh] < best) best = times[sh];
      }
    }
  }
  return t;
}

}  // namespace internal

std::vector<KernelThroughput> MeasureKernelThroughput(double seconds_per_case) {
  Case gemv(1, 73728, 896), gemm(64, 2048, 896);
  std::vector<KernelThroughput> out;
  for (const BackendStatus& s : BackendReport()) {
    if (!s.supported || !s.gate_passed) continue;
    const MatMulQFn fn = internal::LiveEntryFor(s.backend);
    KernelThroughput t{s.backend};
    const double gemv_s = gemv.SecondsPerProduct(fn, seconds_per_case);
    t.gemv_gops = gemv.Ops() / gemv_s * 1e-9;
    t.gemv_gbps = static_cast<double>(gemv.w.size()) / gemv_s * 1e-9;
    t.gemm_gops = gemm.Ops() / gemm.SecondsPerProduct(fn, seconds_per_case) * 1e-9;
    out.push_back(t);
  }
  return out;
}

namespace {
struct ReadTask {
  const uint64_t* data;
  size_t words_per_task;
  bool prefetch;
  uint64_t sums[64];
};
// Sums one task's share with eight independent chains (the compiler vectorizes it with the
// baseline ISA); the sum is kept so the loads cannot be optimized away. With `prefetch` it
// also prefetches 4 KiB ahead, as the decode GEMV does: on some cores the hardware
// prefetcher alone leaves a single stream well below what memory delivers, and the ceiling
// must be the best read this device can do, not the easiest.
void SumShare(void* ctx, int t) {
  auto* task = static_cast<ReadTask*>(ctx);
  const uint64_t* p = task->data + static_cast<size_t>(t) * task->words_per_task;
  uint64_t a[8] = {};
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(p) + 4096;  // an address, maybe past the buffer
  for (size_t i = 0; i < task->words_per_task; i += 8) {
    if (task->prefetch)
      // NOLINTNEXTLINE(performance-no-int-to-ptr)
      __builtin_prefetch(reinterpret_cast<const void*>(ahead + i * 8), 0, 3);
    for (int j = 0; j < 8; ++j) a[j] += p[i + static_cast<size_t>(j)];
  }
  uint64_t s = 0;
  for (uint64_t v : a) s += v;
  task->sums[t] = s;
}
}  // namespace

ReadBandwidth MeasureReadBandwidth(double seconds) {
  constexpr size_t kBytes = size_t{256} << 20;
  constexpr int kTasks = 64;  // claimed dynamically: a descheduled thread holds up one share
  // The same buffer is also an int8 matrix for the third kind of pass: kRows x kK, values
  // within [-127, 127] as every backend requires.
  constexpr int kK = 4096;
  constexpr int kRows = static_cast<int>(kBytes / kK);
  // In weight memory, as the weights are (memory.h): the ceiling is what a read of such
  // memory can do, large pages included.
  std::vector<uint64_t, LargePageAllocator<uint64_t>> buf(kBytes / 8);
  auto* bytes = reinterpret_cast<int8_t*>(buf.data());
  for (size_t i = 0; i < kBytes; ++i) bytes[i] = static_cast<int8_t>(static_cast<int>(i & 0x7F) - 64);  // every page
  std::vector<int8_t> x(kK, 1);
  std::vector<float> y(kRows);
  const float xscale = 1.0f;
  const QMatrixView matrix{bytes, nullptr, nullptr, kRows, kK, kK};
  ReadTask task{buf.data(), buf.size() / kTasks, false, {}};
  constexpr int kKinds = 3;
  std::vector<double> times[kKinds];  // seconds of each pass, per kind
  const auto start = std::chrono::steady_clock::now();
  for (int pass = 0; pass < 150; ++pass) {  // bounded: at most 150 passes
    // Three kinds of pass take turns and the best counts: a plain read, one that prefetches
    // as the decode GEMV does, and the decode GEMV itself streaming the buffer as a matrix
    // (with wide loads it can out-read the summing loop, which is compiled for the baseline
    // ISA: on the AMD EPYC of docs/KERNELS.md, 40 against 32 GB/s on one core). The ceiling
    // must be the best read this device is seen to do, not the easiest.
    const int kind = pass % kKinds;
    task.prefetch = kind == 1;
    const auto t0 = std::chrono::steady_clock::now();
    if (kind == 2)
      MatMulQ(x.data(), &xscale, 1, kK, matrix, y.data(), kRows, ProductShape::kGemv);
    else
      ParallelFor(kTasks, &SumShare, &task);
    const auto t1 = std::chrono::steady_clock::now();
    times[kind].push_back(std::chrono::duration<double>(t1 - t0).count());
    if (pass >= 5 && std::chrono::duration<double>(t1 - start).count() > seconds) break;
  }
  volatile uint64_t sink = 0;
  for (uint64_t v : task.sums) sink = sink + v;
  return internal::SummarizeReadPasses(times, static_cast<double>(kBytes));
}

namespace internal {

ReadBandwidth SummarizeReadPasses(std::span<std::vector<double>> seconds_per_kind, double bytes) {
  ReadBandwidth out;
  for (std::vector<double>& t : seconds_per_kind) {
    out.passes += static_cast<int>(t.size());
    if (t.empty()) continue;
    std::sort(t.begin(), t.end());
    const double best = bytes / t.front() * 1e-9;
    if (best > out.best_gbps) {
      out.best_gbps = best;
      out.median_gbps = bytes / t[(t.size() - 1) / 2] * 1e-9;
    }
  }
  return out;
}

}  // namespace internal

double MeasureCapacityGemmsPerSecond() {
  Case ref(1, 4096, 4096);
  return 1.0 / ref.SecondsPerProduct(internal::LiveEntryFor(ActiveBackend()), 0.25);
}

}  // namespace daisy::kernels
