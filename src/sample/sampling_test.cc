// Sampling tests. Every "random" input here comes from fixed seeds and positions, so a
// statistical check either always passes or always fails: it cannot flake.
#include "daisy/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "daisy/detmath.h"

namespace daisy {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> SmallLogits() {
  return {1.0f, 2.5f, -0.5f, 2.0f, 0.0f, 1.5f, -2.0f, 0.7f};
}

// Softmax in double with the platform libm: an independent reference for the frequencies.
std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  double max = -INFINITY;
  for (float l : logits) max = std::max(max, static_cast<double>(l));
  std::vector<double> p;
  double sum = 0;
  for (float l : logits) {
    p.push_back(std::exp((l - max) / temperature));
    sum += p.back();
  }
  for (double& v : p) v /= sum;
  return p;
}

std::vector<int> Counts(const std::vector<float>& logits, const SamplingParams& params, int draws) {
  std::vector<int> counts(logits.size(), 0);
  for (int pos = 0; pos < draws; ++pos) ++counts[SampleToken(logits, params, pos)];
  return counts;
}

// Pearson's chi-square over the tokens with expected probability > 0; a token with
// expected 0 that was drawn makes it infinite.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& expected_p, int draws) {
  double chi2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = expected_p[i] * draws;
    if (e == 0) {
      if (counts[i] != 0) return INFINITY;
      continue;
    }
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

// The 1e-6 upper quantile of chi-square with 7 degrees of freedom is ~35.3: a correct
// sampler essentially never exceeds 40; a wrong distribution at 20000 draws exceeds it by
// far (see the temperature test).
constexpr double kChi2Bound7 = 40.0;

TEST(SamplingTest, GreedyAtTemperatureZeroIsArgMax) {
  const std::vector<float> logits = SmallLogits();
  SamplingParams p;  // temperature 0
  for (int64_t pos = 0; pos < 100; ++pos) EXPECT_EQ(SampleToken(logits, p, pos), 1);
  EXPECT_EQ(ArgMax(logits), 1);
  p.temperature = -1.0f;  // below zero: still greedy
  EXPECT_EQ(SampleToken(logits, p, 7), 1);
}

// ArgMax (a blocked maximum, then a blocked search) must pick exactly the id of the total
// order (logit descending, NaN as -inf, then the lowest id) on inputs full of ties, NaN and
// infinities, at lengths below, at and across its 16-entry blocks.
TEST(SamplingTest, ArgMaxEqualsTheTotalOrderWithTiesNanAndInfinities) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  const float pool[] = {nan, -kInf, kInf, -0.0f, 0.0f, 1.0f, -1.0f, 3.5f, 3.5f, -3.5f, 1e30f, -1e30f};
  auto reference = [&](const std::vector<float>& l) {
    auto rank = [&](int32_t i) { return std::isnan(l[i]) ? -kInf : l[i]; };
    int32_t best = 0;
    for (int32_t i = 1; i < static_cast<int32_t>(l.size()); ++i)
      if (rank(i) > rank(best)) best = i;  // equal rank: the lower id stays
    return best;
  };
  uint64_t state = 12345;
  int checked = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const size_t n = 1 + trial % 53;  // ties and NaN at every position of 0 to 3 blocks and a tail
    std::vector<float> l(n);
    for (float& v : l) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = pool[(state >> 33) % std::size(pool)];
    }
    ASSERT_EQ(ArgMax(l), reference(l)) << "trial " << trial;
    ++checked;
  }
  EXPECT_EQ(checked, 20000);
  // -0.0 and +0.0 are equal: the lower id wins whichever sign comes first.
  EXPECT_EQ(ArgMax(std::vector<float>{-0.0f, 0.0f}), 0);
  EXPECT_EQ(ArgMax(std::vector<float>{0.0f, -0.0f}), 0);
  EXPECT_EQ(ArgMax(std::vector<float>{nan, -kInf, 2.0f, kInf, kInf}), 3);
}

TEST(SamplingTest, TiesGoToTheLowestId) {
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 3.0f, 3.0f};
  EXPECT_EQ(ArgMax(logits), 1);
  EXPECT_EQ(SampleToken(logits, SamplingParams{}, 0), 1);
  // Top-k = 1 among tied leaders also takes the lowest id.
  SamplingParams p{.temperature = 1.0f, .top_k = 1};
  for (int64_t pos = 0; pos < 50; ++pos) EXPECT_EQ(SampleToken(logits, p, pos), 1);
  // NaN never wins, even in first place; -inf and +inf are ordered as numbers.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(ArgMax(std::vector<float>{nan, -1.0f, nan}), 1);
  EXPECT_EQ(ArgMax(std::vector<float>{-kInf, -kInf}), 0);
  EXPECT_EQ(SampleToken(std::vector<float>{0.0f, kInf, 5.0f, kInf}, SamplingParams{.temperature = 1.0f}, 3), 1);
}

TEST(SamplingTest, TopKOneAndTinyTopPEqualGreedy) {
  std::vector<float> logits(1000);
  uint64_t s = 99;
  for (float& l : logits) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    l = static_cast<float>(s >> 40) * 0x1p-20f;  // [0, 16)
  }
  const int32_t greedy = ArgMax(logits);
  for (int64_t pos = 0; pos < 200; ++pos) {
    EXPECT_EQ(SampleToken(logits, {.temperature = 1.5f, .top_k = 1}, pos), greedy);
    EXPECT_EQ(SampleToken(logits, {.temperature = 1.5f, .top_p = 1e-6f}, pos), greedy);
  }
}

TEST(SamplingTest, ReplayGivesTheSameTokens) {
  const std::vector<float> logits = SmallLogits();
  const SamplingParams p{.temperature = 1.0f, .top_k = 5, .top_p = 0.9f, .seed = 42};
  std::vector<int32_t> first, second;
  for (int64_t pos = 0; pos < 500; ++pos) first.push_back(SampleToken(logits, p, pos));
  // In reverse order: a position's token depends on nothing that came before it.
  second.resize(first.size());
  for (int64_t pos = 499; pos >= 0; --pos) second[pos] = SampleToken(logits, p, pos);
  EXPECT_EQ(first, second);
  // A different seed gives a different sequence.
  std::vector<int32_t> other;
  for (int64_t pos = 0; pos < 500; ++pos)
    other.push_back(SampleToken(logits, {.temperature = 1.0f, .top_k = 5, .top_p = 0.9f, .seed = 43}, pos));
  EXPECT_NE(first, other);
}

TEST(SamplingTest, UniformDrawIsPerPositionAndInRange) {
  std::set<float> seen;
  for (int64_t pos = 0; pos < 10000; ++pos) {
    const float u = UniformDraw(1234, pos);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_EQ(u, std::ldexp(std::floor(std::ldexp(u, 24)), -24)) << "not a 24-bit value";
    seen.insert(u);
  }
  EXPECT_GT(seen.size(), 9990u);  // 24-bit values: collisions are rare
  EXPECT_NE(UniformDraw(1234, 0), UniformDraw(1234, 1));
  EXPECT_NE(UniformDraw(1234, 5), UniformDraw(1235, 5));
  // Pinned values (k * 2^-24): the draw is part of the replay contract across versions
  // and machines, so a change to the generator must be deliberate.
  EXPECT_EQ(UniformDraw(1234, 0), 3817894 * 0x1p-24f);
  EXPECT_EQ(UniformDraw(1234, 1), 9646823 * 0x1p-24f);
  EXPECT_EQ(UniformDraw(0, 0), 1086683 * 0x1p-24f);
  EXPECT_EQ(UniformDraw(1234, 100000), 1956876 * 0x1p-24f);
  // Mean and a coarse histogram of 100000 draws.
  std::vector<int> bins(10, 0);
  double mean = 0;
  for (int64_t pos = 0; pos < 100000; ++pos) {
    const float u = UniformDraw(7, pos);
    mean += u;
    ++bins[static_cast<int>(u * 10)];
  }
  EXPECT_NEAR(mean / 100000, 0.5, 0.005);
  for (int b : bins) EXPECT_NEAR(b, 10000, 500);
}

TEST(SamplingTest, FrequenciesFollowTheSoftmax) {
  const std::vector<float> logits = SmallLogits();
  constexpr int kDraws = 20000;
  for (uint64_t seed : {1ull, 1234ull, 987654321ull}) {
    const SamplingParams p{.temperature = 1.0f, .seed = seed};
    const double chi2 = ChiSquare(Counts(logits, p, kDraws), Softmax(logits, 1.0), kDraws);
    EXPECT_LT(chi2, kChi2Bound7) << "seed " << seed;
  }
}

TEST(SamplingTest, TopKAndTopPRenormalize) {
  const std::vector<float> logits = SmallLogits();
  constexpr int kDraws = 20000;
  // top-k 3: tokens 1 (2.5), 3 (2.0), 5 (1.5), renormalized.
  std::vector<float> top3(logits.size(), -kInf);
  for (int i : {1, 3, 5}) top3[i] = logits[i];
  std::vector<int> counts = Counts(logits, {.temperature = 1.0f, .top_k = 3, .seed = 5}, kDraws);
  EXPECT_LT(ChiSquare(counts, Softmax(top3, 1.0), kDraws), 30.0);  // 2 dof
  // top-p 0.75: the sorted softmax starts 0.399, 0.242, 0.147 -> the nucleus is {1, 3, 5}
  // (0.641 < 0.75 <= 0.788).
  const std::vector<double> sm = Softmax(logits, 1.0);
  ASSERT_LT(sm[1] + sm[3], 0.75);
  ASSERT_GE(sm[1] + sm[3] + sm[5], 0.75);
  counts = Counts(logits, {.temperature = 1.0f, .top_p = 0.75f, .seed = 6}, kDraws);
  EXPECT_LT(ChiSquare(counts, Softmax(top3, 1.0), kDraws), 30.0);
}

TEST(SamplingTest, TemperatureChangesTheDistribution) {
  const std::vector<float> logits = SmallLogits();
  constexpr int kDraws = 20000;
  const std::vector<int> cold = Counts(logits, {.temperature = 0.5f, .seed = 11}, kDraws);
  const std::vector<int> hot = Counts(logits, {.temperature = 2.0f, .seed = 11}, kDraws);
  EXPECT_LT(ChiSquare(cold, Softmax(logits, 0.5), kDraws), kChi2Bound7);
  EXPECT_LT(ChiSquare(hot, Softmax(logits, 2.0), kDraws), kChi2Bound7);
  // Each is far from the other's distribution (the check has power), and a colder run
  // picks the leader more often.
  EXPECT_GT(ChiSquare(cold, Softmax(logits, 2.0), kDraws), 10 * kChi2Bound7);
  EXPECT_GT(ChiSquare(hot, Softmax(logits, 0.5), kDraws), 10 * kChi2Bound7);
  EXPECT_GT(cold[1], hot[1]);
}

// A large vocabulary with top-p alone exercises the growing sorted prefix: the result
// must equal sampling from the nucleus computed here with one full sort (as the header
// specifies it), expressed as top_k = nucleus size.
TEST(SamplingTest, TopPOverALargeVocabularyMatchesAFullSort) {
  std::vector<float> logits(20000);
  uint64_t s = 3;
  for (float& l : logits) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    l = static_cast<float>(s >> 40) * 0x1p-21f;  // [0, 8)
  }
  for (float top_p : {0.05f, 0.5f, 0.95f}) {
    const float temperature = 0.7f;
    float max = logits[ArgMax(logits)];
    std::vector<float> w(logits.size());
    double mass = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      w[i] = detmath::Exp((logits[i] - max) / temperature);
      mass += w[i];
    }
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
    double cum = 0;
    int nucleus = 0;
    while (nucleus < static_cast<int>(order.size())) {
      cum += w[order[nucleus++]];
      if (cum >= static_cast<double>(top_p) * mass) break;
    }
    ASSERT_GT(nucleus, 64) << "the nucleus must outgrow the first sorted block";
    for (int64_t pos = 0; pos < 40; ++pos) {
      const float coin = UniformDraw(77, pos);
      ASSERT_EQ(SampleTokenWithCoin(logits, {.temperature = temperature, .top_p = top_p}, coin),
                SampleTokenWithCoin(logits, {.temperature = temperature, .top_k = nucleus}, coin))
          << "top_p " << top_p << " pos " << pos;
    }
  }
}

TEST(SamplingTest, ValidateRefusesOutOfRangeValues) {
  EXPECT_TRUE(ValidateSamplingParams({}).ok());
  EXPECT_TRUE(ValidateSamplingParams({.temperature = 0.8f, .top_k = 40, .top_p = 0.95f}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.temperature = -0.1f}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.temperature = std::numeric_limits<float>::quiet_NaN()}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.temperature = kInf}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.top_k = -1}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.top_p = 0.0f}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.top_p = 1.5f}).ok());
  EXPECT_NE(ValidateSamplingParams({.top_p = 1.5f}).message().find("top_p"), std::string::npos);
}

TEST(SamplingTest, StopSetContains) {
  const StopSet stops{{2, 1}};
  EXPECT_TRUE(stops.Contains(1));
  EXPECT_TRUE(stops.Contains(2));
  EXPECT_FALSE(stops.Contains(0));
  EXPECT_FALSE(StopSet{}.Contains(2));
}

}  // namespace
}  // namespace daisy
