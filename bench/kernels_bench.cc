// Throughput of the verified INT8 products per backend and thread count (docs/KERNELS.md,
// "Figures"). GEMV (m = 1) is decode: memory-bound, so each shape cycles through enough
// copies of its weights (>= 256 MiB) that they stream from DRAM as a real model's layers do,
// and GB/s counts int8 weight bytes. GEMM (m = 16..512) is prefill: compute-bound, GOP/s
// counts 2 * m * n * k. Run: build-*/bench/kernels_bench [--benchmark_filter=gemv]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daisy/kernels.h"

namespace {

using daisy::kernels::Backend;
using daisy::kernels::QMatrixView;

constexpr size_t kStreamBytes = size_t{256} << 20;  // well above the 32 MiB L3 here

struct Operands {
  int m, n, k;
  std::vector<std::vector<int8_t>> w;  // copies of the weights, used round-robin
  std::vector<int8_t> x;
  std::vector<float> xs, ws, y;
  size_t next = 0;

  Operands(int m_, int n_, int k_, bool stream) : m(m_), n(n_), k(k_) {
    const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(k);
    const size_t copies = stream ? (kStreamBytes + bytes - 1) / bytes : 1;
    uint64_t s = 88172645463325252ULL;
    auto next_q = [&s] {  // xorshift64: any values in [-127, 127] will do
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      return static_cast<int8_t>(static_cast<int>(s % 255) - 127);
    };
    w.resize(copies);
    for (auto& c : w) {
      c.resize(bytes);
      for (auto& v : c) v = next_q();
    }
    x.resize(static_cast<size_t>(m) * static_cast<size_t>(k));
    for (auto& v : x) v = next_q();
    xs.assign(static_cast<size_t>(m), 0.01f);
    ws.assign(static_cast<size_t>(n), 0.02f);
    y.resize(static_cast<size_t>(m) * static_cast<size_t>(n));
  }
  void Run() {
    const std::vector<int8_t>& wq = w[next];
    next = (next + 1) % w.size();
    const QMatrixView v{wq.data(), ws.data(), nullptr, n, k, static_cast<size_t>(k)};
    daisy::kernels::MatMulQ(x.data(), xs.data(), m, static_cast<size_t>(k), v, y.data(), static_cast<size_t>(n));
  }
};

void ProductBenchmark(benchmark::State& state, Backend backend, int m, int n, int k, int threads) {
  if (!daisy::kernels::SetBackend(backend).ok()) {
    state.SkipWithError("backend not available");
    return;
  }
  daisy::kernels::SetThreads(threads);
  // Filling 256 MiB takes a while: keep the last shape's operands across the several calls
  // Google Benchmark makes per benchmark.
  static std::unique_ptr<Operands> cached;
  if (!cached || cached->m != m || cached->n != n || cached->k != k) {
    cached.reset();
    cached = std::make_unique<Operands>(m, n, k, /*stream=*/m == 1);
  }
  Operands& ops = *cached;
  ops.Run();
  for (auto _ : state) {
    ops.Run();
    benchmark::ClobberMemory();
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["GOP/s"] =
      benchmark::Counter(2.0 * m * n * static_cast<double>(k) * iters * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(n) * k * iters * 1e-9, benchmark::Counter::kIsRate);
}

}  // namespace

int main(int argc, char** argv) {
  struct Shape {
    int m, n, k;
  };
  // Decode shapes of the bundled models (q/o/up projections, the LM head) and prefill GEMMs,
  // the last two a prefill's attention products (SmolLM: a block of 128 queries times a
  // group of 3 heads, Q.K^T over 512 keys of head_dim 64, then P.V).
  const Shape gemv[] = {{1, 1536, 576}, {1, 4864, 896}, {1, 151936, 896}};
  const Shape gemm[] = {{16, 896, 896}, {64, 4864, 896}, {256, 896, 896}, {512, 1536, 576},
                        {384, 512, 64}, {384, 64, 512},  {8, 512, 64}};
  for (const auto& s : daisy::kernels::BackendReport()) {
    if (!s.supported || !s.gate_passed) continue;
    const std::string b(daisy::kernels::BackendName(s.backend));
    for (int threads : {1, 2}) {
      for (const Shape& sh : gemv)
        benchmark::RegisterBenchmark(
            ("gemv/" + b + "/t" + std::to_string(threads) + "/n" + std::to_string(sh.n) + "_k" + std::to_string(sh.k))
                .c_str(),
            ProductBenchmark, s.backend, sh.m, sh.n, sh.k, threads)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      for (const Shape& sh : gemm)
        benchmark::RegisterBenchmark(("gemm/" + b + "/t" + std::to_string(threads) + "/m" + std::to_string(sh.m) +
                                      "_n" + std::to_string(sh.n) + "_k" + std::to_string(sh.k))
                                         .c_str(),
                                     ProductBenchmark, s.backend, sh.m, sh.n, sh.k, threads)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
