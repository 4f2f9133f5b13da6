// Throughput figures for `daisychain bench` and the ring planner's capacity.
#include <chrono>
#include <cstring>
#include <vector>

#include "internal.h"

namespace daisy::kernels {
namespace {

// Random int8 in [-127, 127] (the quantizer's range), 8 bytes per generator step.
void FillQ(std::vector<int8_t>& q, uint64_t seed) {
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
  std::vector<int8_t> x, w;
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

}  // namespace

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

double MeasureCapacityGemmsPerSecond() {
  Case ref(1, 4096, 4096);
  return 1.0 / ref.SecondsPerProduct(internal::LiveEntryFor(ActiveBackend()), 0.25);
}

}  // namespace daisy::kernels
