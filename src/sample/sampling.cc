// Sampling (see daisy/sampling.h for the exact procedure). Nothing here reads a clock, a
// global generator or the platform libm: the chosen token is a function of the logits, the
// parameters and the coin.
#include "daisy/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>

#include "daisy/detmath.h"

namespace daisy {
namespace {

uint64_t Mix64(uint64_t z) {  // the SplitMix64 output function
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The ranking key: NaN as -inf, so the order below is total and NaN never wins.
float RankValue(float logit) {
  return std::isnan(logit) ? -std::numeric_limits<float>::infinity() : logit;
}

// The total order of candidates: logit descending, then id ascending.
struct Before {
  std::span<const float> logits;
  bool operator()(int32_t a, int32_t b) const {
    const float la = RankValue(logits[a]), lb = RankValue(logits[b]);
    if (la != lb) return la > lb;
    return a < b;
  }
};

}  // namespace

Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature)) {
    return InvalidArgument("temperature must be a finite number >= 0, got " + std::to_string(p.temperature));
  }
  if (p.top_k < 0) return InvalidArgument("top_k must be >= 0 (0 = off), got " + std::to_string(p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1)) {
    return InvalidArgument("top_p must be in (0, 1] (1 = off), got " + std::to_string(p.top_p));
  }
  return Status::Ok();
}

float UniformDraw(uint64_t seed, int64_t position) {
  // Two mixing rounds so that neighbouring seeds and neighbouring positions decorrelate.
  const uint64_t key = Mix64(seed + 0x9e3779b97f4a7c15ull);
  const uint64_t h = Mix64(key ^ (static_cast<uint64_t>(position) * 0xd1342543de82ef95ull + 0x632be59bd9b4e019ull));
  return static_cast<float>(h >> 40) * 0x1p-24f;  // exact: 24 bits fit a float
}

int32_t ArgMax(std::span<const float> logits) {
  DAISY_CHECK(!logits.empty(), "Bug: ArgMax of an empty logits span");
  // The first id of the total order of Before, in two blocked passes over explicit vectors
  // (decode runs this on every token, over the whole vocabulary: scalar, its 16 chains
  // took 37 us a token for SmolLM's 49,152 logits). First the largest ranking value: a
  // strict `>` never lets NaN win, so NaN ranks as -inf. Then the first id holding it:
  // among equals (+0 and -0 compare equal) the lowest id, as Before says. When nothing ranks
  // above -inf, every entry ties at -inf and the lowest id, 0, is first. The select is
  // spelled with bits, which GCC and Clang (the wasm build) both take.
  using V = float __attribute__((vector_size(16)));
  using M = int32_t __attribute__((vector_size(16)));
  constexpr size_t kLanes = 4, kChains = 4, kBlock = kLanes * kChains;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float* l = logits.data();
  const size_t n = logits.size();
  auto load = [l](size_t at) {
    V v;
    std::memcpy(&v, l + at, sizeof v);
    return v;
  };
  V chain[kChains];
  for (V& c : chain) c = V{} + neg_inf;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (size_t c = 0; c < kChains; ++c) {
      const V v = load(i + c * kLanes);
      const M take = v > chain[c];
      chain[c] = reinterpret_cast<V>((reinterpret_cast<M>(v) & take) | (reinterpret_cast<M>(chain[c]) & ~take));
    }
  float best_v = neg_inf;
  for (; i < n; ++i) best_v = l[i] > best_v ? l[i] : best_v;
  for (const V& c : chain)
    for (size_t j = 0; j < kLanes; ++j) best_v = c[j] > best_v ? c[j] : best_v;
  if (!(best_v > neg_inf)) return 0;
  const V best = V{} + best_v;
  for (i = 0; i + kBlock <= n; i += kBlock) {
    M hit = load(i) == best;  // whether this block holds best_v, without a branch per entry
    for (size_t c = 1; c < kChains; ++c) hit |= load(i + c * kLanes) == best;
    int32_t any = 0;
    for (size_t j = 0; j < kLanes; ++j) any |= hit[j];
    if (any != 0) break;
  }
  for (; i < n; ++i)
    if (l[i] == best_v) return static_cast<int32_t>(i);
  DAISY_CHECK(false, "Bug: ArgMax lost its maximum");
  return 0;
}

int32_t SampleToken(std::span<const float> logits, const SamplingParams& params, int64_t position) {
  return SampleTokenWithCoin(logits, params, UniformDraw(params.seed, position));
}

int32_t SampleTokenWithCoin(std::span<const float> logits, const SamplingParams& params, float coin) {
  DAISY_CHECK(!logits.empty(), "Bug: sampling from an empty logits span");
  const int32_t n = static_cast<int32_t>(logits.size());
  if (!(params.temperature > 0)) return ArgMax(logits);
  const int32_t best = ArgMax(logits);
  const float max_logit = logits[best];
  // +inf dominates every finite logit; all -inf/NaN leaves no distribution to draw from.
  if (std::isinf(max_logit) || std::isnan(max_logit)) return best;

  // Weights in f32: w_i = exp((l_i - max) / T) <= 1, NaN weighs 0.
  thread_local std::vector<float> w;  // this thread's: sampling a token allocates nothing
  w.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const float l = logits[i];
    w[i] = std::isnan(l) ? 0.0f : detmath::Exp((l - max_logit) / params.temperature);
  }

  const bool use_top_k = params.top_k > 0 && params.top_k < n;
  const bool use_top_p = params.top_p < 1.0f;  // NaN compares false: off
  const Before before{logits};

  if (!use_top_k && !use_top_p) {
    // Plain sampling: id order, no sort needed.
    double mass = 0;
    for (int32_t i = 0; i < n; ++i) mass += w[i];
    const double target = static_cast<double>(coin) * mass;
    double cum = 0;
    int32_t last = best;
    for (int32_t i = 0; i < n; ++i) {
      if (w[i] == 0) continue;
      cum += w[i];
      last = i;
      if (target < cum) return i;
    }
    return last;
  }

  // The sorted candidates. The order is total, so any sorting algorithm gives the same
  // sequence; only the prefix that can matter is sorted.
  thread_local std::vector<int32_t> order;
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  int32_t n_cand = n;
  double mass = 0;
  if (use_top_k) {
    n_cand = params.top_k;
    std::partial_sort(order.begin(), order.begin() + n_cand, order.end(), before);
    for (int32_t j = 0; j < n_cand; ++j) mass += w[order[j]];
  } else {
    for (int32_t i = 0; i < n; ++i) mass += w[i];
  }

  if (use_top_p) {
    const double threshold = static_cast<double>(params.top_p) * mass;
    // Grow the sorted prefix block by block until the running sum reaches the threshold.
    // Everything after a sorted prefix ranks below it, so each block sorts only the rest.
    int32_t sorted = use_top_k ? n_cand : 0;
    int32_t block = 64;
    double cum = 0;
    int32_t j = 0;
    for (;;) {
      for (; j < sorted; ++j) {
        cum += w[order[j]];
        if (cum >= threshold) break;
      }
      if (j < sorted) {  // reached: the nucleus is order[0..j]
        n_cand = j + 1;
        break;
      }
      if (sorted == n_cand) break;  // rounding kept the sum below the threshold: keep all
      const int32_t want = static_cast<int32_t>(std::min<int64_t>(n_cand, static_cast<int64_t>(sorted) + block));
      std::partial_sort(order.begin() + sorted, order.begin() + want, order.end(), before);
      sorted = want;
      block *= 8;
    }
    mass = cum;
  }

  const double target = static_cast<double>(coin) * mass;
  double cum = 0;
  for (int32_t j = 0; j < n_cand; ++j) {
    cum += w[order[j]];
    if (target < cum) return order[j];
  }
  return order[n_cand - 1];
}

bool StopSet::Contains(int32_t id) const {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace daisy
