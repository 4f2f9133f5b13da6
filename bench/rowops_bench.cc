// Time per value of the row operations (docs/KERNELS.md, "Row operations"), in the variant
// this CPU runs (DAISY_KERNELS=scalar runs the baseline, to compare widths): quantizing a row
// to int8 (one and two terms) and ExpN at lengths with and without a remainder after the
// last whole vector, and a prefill block's attention probabilities (192 rows of 193 to 256
// keys: SoftmaxRows, then per row P times V's scales and P' as two int8 terms).
// ExpN and the probabilities restore their input each iteration (a copy, inside the time).
// `s/value` prints as e.g. "250p" (picoseconds). Run: build/bench/rowops_bench
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "daisy/detmath.h"
#include "daisy/kernels.h"

namespace {

// Seeded values in about [-4, 4]: what attention scores and activations look like.
std::vector<float> Values(size_t n) {
  std::vector<float> v(n);
  uint64_t s = 88172645463325252ULL;
  for (float& f : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    f = static_cast<float>(static_cast<int>(s % 8001) - 4000) / 1000.0f;
  }
  return v;
}

void PerValue(benchmark::State& state, double values_per_iteration) {
  state.counters["s/value"] = benchmark::Counter(
      values_per_iteration, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void QuantizeRowBench(benchmark::State& state) {
  const int k = static_cast<int>(state.range(0));
  const std::vector<float> x = Values(static_cast<size_t>(k));
  std::vector<int8_t> q(x.size());
  float s = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(daisy::kernels::QuantizeRow(x.data(), k, q.data(), &s));
    benchmark::ClobberMemory();
  }
  PerValue(state, k);
}

void QuantizeRowTwoTermsBench(benchmark::State& state) {
  const int k = static_cast<int>(state.range(0));
  const std::vector<float> x = Values(static_cast<size_t>(k));
  std::vector<int8_t> q1(x.size()), q2(x.size());
  std::vector<float> r(x.size());
  float s1 = 0, s2 = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        daisy::kernels::QuantizeRowTwoTerms(x.data(), k, q1.data(), &s1, q2.data(), &s2, r.data()));
    benchmark::ClobberMemory();
  }
  PerValue(state, k);
}

void ExpNBench(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const std::vector<float> src = Values(static_cast<size_t>(n));  // within [-87, 88]: the one-step path
  std::vector<float> x = src;
  for (auto _ : state) {
    x = src;
    daisy::detmath::ExpN(x.data(), n);
    benchmark::ClobberMemory();
  }
  PerValue(state, n);
}

// A prefill piece's probabilities as forward.cc's Probabilities runs them (SmolLM: a block
// of 64 queries times a group of 3 heads, the rows seeing 193 to 256 keys).
void ProbabilitiesBench(benchmark::State& state) {
  constexpr int kRows = 192, kKeys = 256;
  const std::vector<float> src = Values(static_cast<size_t>(kRows) * kKeys);
  std::vector<float> scores = src, vscale(kKeys, 0.01f), pv(kKeys), scratch(kKeys), ps(2 * kRows);
  std::vector<int8_t> pq(static_cast<size_t>(2 * kRows) * kKeys);
  std::vector<float*> at(kRows);
  std::vector<int> n(kRows);
  double values = 0;
  for (int r = 0; r < kRows; ++r) {
    at[static_cast<size_t>(r)] = &scores[static_cast<size_t>(r) * kKeys];
    n[static_cast<size_t>(r)] = kKeys - 63 + r / 3;
    values += n[static_cast<size_t>(r)];
  }
  for (auto _ : state) {
    scores = src;
    daisy::kernels::SoftmaxRows(at.data(), n.data(), kRows);
    for (int r = 0; r < kRows; ++r) {
      const auto i = static_cast<size_t>(r);
      daisy::kernels::Mul(at[i], vscale.data(), n[i], pv.data());
      benchmark::DoNotOptimize(daisy::kernels::QuantizeRowTwoTerms(
          pv.data(), n[i], &pq[i * kKeys], &ps[i], &pq[(kRows + i) * kKeys], &ps[kRows + i], scratch.data()));
    }
    benchmark::ClobberMemory();
  }
  PerValue(state, values);
}

}  // namespace

BENCHMARK(QuantizeRowBench)->Arg(64)->Arg(255)->Arg(256)->Arg(576)->Arg(1536);
BENCHMARK(QuantizeRowTwoTermsBench)->Arg(64)->Arg(255)->Arg(256);
BENCHMARK(ExpNBench)->Arg(63)->Arg(64)->Arg(255)->Arg(256)->Arg(1536);
BENCHMARK(ProbabilitiesBench)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
