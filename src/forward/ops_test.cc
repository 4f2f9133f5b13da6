// The f32 ops of the forward pass against double-precision references (the references use
// libm; the ops under test must not), and the RoPE frequency rules against HF's formulas.
#include "ops.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

#include "daisy/forward.h"
#include "daisy/kernels.h"

namespace daisy {
namespace {

TEST(Ops, RmsNormMatchesDoubleReference) {
  std::vector<float> x = {1.0f, -2.0f, 3.5f, 0.25f, -7.0f, 0.0f, 1e-3f};
  std::vector<float> w = {1.0f, 0.5f, 2.0f, -1.0f, 1.5f, 3.0f, 1.0f};
  std::vector<float> out(x.size());
  ops::RmsNorm(x.data(), w.data(), static_cast<int>(x.size()), 1e-5f, out.data());
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + 1e-5);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(out[i], w[i] * x[i] * inv, 1e-6 * std::fabs(w[i] * x[i] * inv) + 1e-9);
}

TEST(Ops, LayerNormMatchesDoubleReference) {
  std::vector<float> x = {1.0f, -2.0f, 3.5f, 0.25f, -7.0f, 0.0f};
  std::vector<float> w = {1.0f, 0.5f, 2.0f, -1.0f, 1.5f, 3.0f};
  std::vector<float> b = {0.1f, 0.0f, -0.2f, 0.3f, 0.0f, 1.0f};
  std::vector<float> out(x.size());
  ops::LayerNorm(x.data(), w.data(), b.data(), static_cast<int>(x.size()), 1e-5f, out.data());
  double mean = 0, var = 0;
  for (float v : x) mean += v;
  mean /= static_cast<double>(x.size());
  for (float v : x) var += (v - mean) * (v - mean);
  var /= static_cast<double>(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = (x[i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i];
    EXPECT_NEAR(out[i], want, 2e-6);
  }
}

TEST(Ops, RopePairsIWithIPlusHalfDim) {
  // HF rotate_half: a unit vector on component 0 rotates into component d/2, not 1.
  const int d = 8;
  std::vector<float> cos(d / 2, 0.0f), sin(d / 2, 1.0f);  // a quarter turn
  std::vector<float> x(d, 0.0f);
  x[0] = 1.0f;
  x[d / 2 + 1] = 2.0f;
  ops::Rope(x.data(), d, cos.data(), sin.data());
  std::vector<float> want(d, 0.0f);
  want[d / 2] = 1.0f;  // x0' = x0 cos - x4 sin = 0; x4' = x4 cos + x0 sin = 1
  want[1] = -2.0f;     // x1' = x1 cos - x5 sin = -2
  EXPECT_EQ(x, want);
}

TEST(Ops, RopeAtPositionZeroIsIdentity) {
  const int d = 16;
  std::vector<float> inv(d / 2, 0.5f), cos(d / 2), sin(d / 2);
  ops::RopeAngles(0, inv.data(), d / 2, cos.data(), sin.data());
  std::vector<float> x(d);
  for (int i = 0; i < d; ++i) x[static_cast<size_t>(i)] = 0.1f * static_cast<float>(i) - 0.7f;
  std::vector<float> y = x;
  ops::Rope(y.data(), d, cos.data(), sin.data());
  EXPECT_EQ(x, y);
}

TEST(Ops, RopeAnglesMatchLibmWithinTolerance) {
  ModelSpec spec;
  spec.head_dim = 64;
  spec.rope_theta = 100000.0;
  const std::vector<float> inv = RopeInverseFrequencies(spec);
  ASSERT_EQ(inv.size(), 32u);
  std::vector<float> cos(32), sin(32);
  for (int p : {1, 7, 100, 511, 4095}) {
    ops::RopeAngles(p, inv.data(), 32, cos.data(), sin.data());
    for (int i = 0; i < 32; ++i) {
      const float angle = static_cast<float>(p) * inv[static_cast<size_t>(i)];
      EXPECT_NEAR(cos[static_cast<size_t>(i)], std::cos(static_cast<double>(angle)), 2e-6) << p << " " << i;
      EXPECT_NEAR(sin[static_cast<size_t>(i)], std::sin(static_cast<double>(angle)), 2e-6) << p << " " << i;
    }
  }
}

TEST(Ops, DefaultInverseFrequencies) {
  ModelSpec spec;
  spec.head_dim = 8;
  spec.rope_theta = 10000.0;
  const std::vector<float> inv = RopeInverseFrequencies(spec);
  ASSERT_EQ(inv.size(), 4u);
  for (int i = 0; i < 4; ++i)
    EXPECT_FLOAT_EQ(inv[static_cast<size_t>(i)], static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / 8)));
  EXPECT_EQ(inv[0], 1.0f);
  spec.learned_positions = true;  // GPT-2 has no RoPE
  EXPECT_TRUE(RopeInverseFrequencies(spec).empty());
}

// HF transformers _compute_llama3_parameters, written out in double as a second opinion.
std::vector<double> HfLlama3(double base, int dim, double factor, double low, double high, double old_len) {
  std::vector<double> out;
  for (int i = 0; i < dim / 2; ++i) {
    const double f = 1.0 / std::pow(base, static_cast<double>(2 * i) / dim);
    const double wavelen = 2 * std::numbers::pi / f;
    const double low_wl = old_len / low, high_wl = old_len / high;
    double v = wavelen > low_wl ? f / factor : f;
    const double smooth = (old_len / wavelen - low) / (high - low);
    const double smoothed = (1 - smooth) * v / factor + smooth * v;
    if (!(wavelen < high_wl) && !(wavelen > low_wl)) v = smoothed;
    out.push_back(v);
  }
  return out;
}

TEST(Ops, Llama3RopeScalingFollowsHf) {
  // Llama-3.2-1B's values (shared/configs/meta-llama__Llama-3.2-1B).
  ModelSpec spec;
  spec.head_dim = 64;
  spec.rope_theta = 500000.0;
  spec.rope_scaling.type = RopeScalingType::kLlama3;
  spec.rope_scaling.factor = 32.0;
  spec.rope_scaling.low_freq_factor = 1.0;
  spec.rope_scaling.high_freq_factor = 4.0;
  spec.rope_scaling.original_max_position_embeddings = 8192;
  const std::vector<float> inv = RopeInverseFrequencies(spec);
  const std::vector<double> want = HfLlama3(500000.0, 64, 32.0, 1.0, 4.0, 8192.0);
  ASSERT_EQ(inv.size(), want.size());
  int high = 0, low = 0, medium = 0;
  ModelSpec plain = spec;
  plain.rope_scaling.type = RopeScalingType::kNone;
  const std::vector<float> unscaled = RopeInverseFrequencies(plain);
  for (size_t i = 0; i < inv.size(); ++i) {
    EXPECT_NEAR(inv[i], want[i], 1e-6 * want[i]) << i;
    if (inv[i] == unscaled[i])
      ++high;
    else if (std::fabs(inv[i] * 32.0f - unscaled[i]) <= 1e-6f * unscaled[i])
      ++low;
    else
      ++medium;
  }
  // All three bands occur for these settings: kept, divided by the factor, smoothed.
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(medium, 0);
}

TEST(Ops, ActivationsMatchDoubleReference) {
  for (float x : {-20.0f, -5.0f, -1.0f, -0.1f, 0.0f, 0.3f, 1.0f, 2.5f, 9.0f, 30.0f}) {
    const double silu = x / (1.0 + std::exp(-static_cast<double>(x)));
    EXPECT_NEAR(ops::Silu(x), silu, 1e-6 * std::fabs(silu) + 1e-7) << x;
    const double xd = x;
    const double gelu =
        0.5 * xd * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (xd + 0.044715 * xd * xd * xd)));
    EXPECT_NEAR(ops::GeluNew(x), gelu, 2e-6 * std::fabs(gelu) + 1e-7) << x;
  }
  // Far negative inputs give (signed) zero, never NaN.
  EXPECT_EQ(ops::Silu(-200.0f), 0.0f);
  EXPECT_EQ(ops::GeluNew(-200.0f), 0.0f);
}

TEST(Ops, SoftmaxMatchesDoubleReference) {
  std::vector<float> x = {1.0f, 3.0f, -2.0f, 0.5f, 3.0f, -40.0f};
  std::vector<double> e;
  double sum = 0;
  for (float v : x) {
    e.push_back(std::exp(static_cast<double>(v) - 3.0));
    sum += e.back();
  }
  std::vector<float> y = x;
  ops::Softmax(y.data(), static_cast<int>(y.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], e[i] / sum, 1e-7);
  std::vector<float> one = {123.0f};
  ops::Softmax(one.data(), 1);
  EXPECT_EQ(one[0], 1.0f);
}

// SoftmaxRows gives Softmax's bits on every row: rows of different lengths (1 to 300, so
// the 8-row groups' rows end at different places), a row count that is not a multiple of 8,
// long rows (255 to 290: a sum taken in another order rounds differently, so it shows;
// reversing one row's interleaved sum fails here), and maxima that tie between +0 and -0.
// Rows whose x - max all lie in [-87, 0] take ExpN's one-step path alone (its range is
// [-87, 88]; a softmax's values are at most 0); the others, with values just below -87,
// below -104 (0) or an infinity, take the whole of ExpN. (Softmax's ExpN is the same on
// both sides: DetMathTest.ExpNEqualsExpBitForBit checks ExpN's paths against Exp.)
TEST(Ops, SoftmaxRowsEqualsSoftmaxOnEveryRowBitForBit) {
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<float>(static_cast<int>(state >> 40) % 20000) / 1000.0f - 10.0f;
  };
  const int lengths[] = {1, 2, 300, 17, 255, 256, 290, 264, 3, 128, 1, 299, 77};
  std::vector<std::vector<float>> rows, want;
  for (int n : lengths) {
    std::vector<float> r(static_cast<size_t>(n));
    for (float& v : r) v = next();
    rows.push_back(r);
  }
  rows[4].assign(255, -1.0f);  // the maximum is 0, first -0 then +0
  rows[4][3] = -0.0f;
  rows[4][200] = 0.0f;
  rows[4][250] = -0.0f;
  // every 1/64 from 0 down to -87 (the one-step path's whole range), then rows reaching
  // just past it, far past it, and an infinity
  std::vector<float> sweep;
  for (int i = 0; i <= 87 * 64; ++i) sweep.push_back(5.0f - static_cast<float>(i) / 64.0f);
  rows.push_back(sweep);
  rows.push_back({3.0f, -84.1f, -84.9f, 2.5f, -85.0f, 3.0f});  // x - max = -87.1, -87.9, -88
  rows.push_back({0.0f, -90.0f, -103.0f, -110.0f, -1.0f});
  rows.push_back({1.0f, -std::numeric_limits<float>::infinity(), 0.5f});
  std::vector<float*> at;
  std::vector<int> n;
  for (auto& r : rows) {
    want.push_back(r);
    ops::Softmax(want.back().data(), static_cast<int>(r.size()));
    at.push_back(r.data());
    n.push_back(static_cast<int>(r.size()));
  }
  ops::SoftmaxRows(at.data(), n.data(), static_cast<int>(rows.size()));
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t i = 0; i < rows[r].size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(rows[r][i]), std::bit_cast<uint32_t>(want[r][i])) << "row " << r << " at " << i;
}

// The MLP's vectorized activation (kernels::Silu) gives ops::Silu(g) * u bit for bit, and
// ops::Silu(g) without u: values across the range where Exp saturates, rows of every
// length up to 40 (the vector tails), and zeros.
TEST(Ops, KernelSiluEqualsSiluTimesUpBitForBit) {
  uint64_t state = 777;
  auto next = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<float>(static_cast<int>(state >> 40) % 200001) / 1000.0f - 100.0f;
  };
  // Seeded rows of every length up to 40 (short ones mostly within [-88, 87], longer ones
  // not), then rows that take ExpN's one-step path alone (-g in [-87, 88]: a sweep in steps
  // of 1/64) and rows just outside it (-g = 88.5: k = 128, where the one-step scaling gives
  // inf and Exp a finite value; moving the bound to 89 fails here; -g = -87.5).
  std::vector<std::vector<float>> rows;
  for (int n = 1; n <= 40; ++n) {
    std::vector<float> g(static_cast<size_t>(n));
    for (size_t i = 0; i < g.size(); ++i) g[i] = i % 9 == 4 ? 0.0f : next() / (i % 3 == 0 ? 10.0f : 1.0f);
    rows.push_back(g);
  }
  std::vector<float> sweep;
  for (int i = 0; i <= 175 * 64; ++i) sweep.push_back(-88.0f + static_cast<float>(i) / 64.0f);
  rows.push_back(sweep);
  rows.push_back({1.0f, -88.5f, 2.0f});
  rows.push_back({1.0f, 87.5f, -3.0f});
  for (const std::vector<float>& g : rows) {
    const int n = static_cast<int>(g.size());
    std::vector<float> u(g.size()), got(g.size()), plain(g.size());
    for (float& v : u) v = next();
    kernels::Silu(g.data(), u.data(), n, got.data());
    kernels::Silu(g.data(), nullptr, n, plain.data());
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(ops::Silu(g[i]) * u[i])) << n << " " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(plain[i]), std::bit_cast<uint32_t>(ops::Silu(g[i]))) << n << " " << i;
    }
  }
}

// RmsNormRows gives RmsNorm's bits on every row: 1 to 19 rows (every tail of the 8-row
// groups), rows with a stride wider than the norm, values of mixed magnitude.
TEST(Ops, RmsNormRowsEqualsRmsNormOnEveryRowBitForBit) {
  uint64_t state = 4242;
  auto next = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<float>(static_cast<int>(state >> 40) % 20001) / 1000.0f - 10.0f;
  };
  constexpr int kN = 77;
  constexpr size_t kLd = 80;
  std::vector<float> w(kN);
  for (float& v : w) v = next();
  for (int rows = 1; rows <= 19; ++rows) {
    std::vector<float> x(kLd * static_cast<size_t>(rows)), got(x.size(), -1.0f), want(kN);
    for (size_t i = 0; i < x.size(); ++i) x[i] = next() * (i % 5 == 0 ? 100.0f : 1.0f);
    ops::RmsNormRows(x.data(), kLd, rows, w.data(), kN, 1e-5f, got.data());
    for (int r = 0; r < rows; ++r) {
      ops::RmsNorm(x.data() + static_cast<size_t>(r) * kLd, w.data(), kN, 1e-5f, want.data());
      for (int i = 0; i < kN; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(r) * kLd + static_cast<size_t>(i)]),
                  std::bit_cast<uint32_t>(want[static_cast<size_t>(i)]))
            << rows << " rows, row " << r << " at " << i;
    }
  }
}

TEST(Ops, FirstNonFinite) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f};
  EXPECT_EQ(ops::FirstNonFinite(x.data(), 3), -1);
  x[2] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(ops::FirstNonFinite(x.data(), 3), 2);
  x[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(ops::FirstNonFinite(x.data(), 3), 1);
  // Longer rows are tested a block at a time: the first bad value in index order at every
  // place around the blocks' edges, with a second one after it, and none past n.
  for (int64_t n : {255, 256, 257, 511, 512, 1000}) {
    std::vector<float> y(static_cast<size_t>(n) + 1, 0.5f);
    y[static_cast<size_t>(n)] = std::numeric_limits<float>::infinity();  // past n: never reported
    EXPECT_EQ(ops::FirstNonFinite(y.data(), n), -1) << n;
    for (int64_t at : {int64_t{0}, int64_t{1}, int64_t{254}, int64_t{255}, int64_t{256}, int64_t{257}, n - 1}) {
      if (at < 0 || at >= n) continue;
      std::vector<float> z = y;
      z[static_cast<size_t>(at)] = -std::numeric_limits<float>::infinity();
      if (at + 300 < n) z[static_cast<size_t>(at + 300)] = std::numeric_limits<float>::quiet_NaN();
      if (at + 1 < n) z[static_cast<size_t>(at + 1)] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_EQ(ops::FirstNonFinite(z.data(), n), at) << "n " << n << ", first at " << at;
    }
  }
}

}  // namespace
}  // namespace daisy
