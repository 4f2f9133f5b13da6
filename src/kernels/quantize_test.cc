// Golden cases of the quantizer (docs/KERNELS.md, "Quantization"): round half to even at
// .5 boundaries, the division x / scale (not a multiplication by 1 / scale), -0.0, zero
// rows, clamping, refusal of non-finite values; guard bytes after every output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "daisy/kernels.h"
#include "internal.h"

namespace daisy::kernels {
namespace {

constexpr int8_t kGuardByte = 0x5A;
constexpr int kGuard = 16;

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// QuantizeRow into a guarded buffer; fails the test if a guard byte changes.
std::vector<int8_t> Quantize(const std::vector<float>& x, float* scale, bool* ok) {
  std::vector<int8_t> q(x.size() + kGuard, kGuardByte);
  *ok = QuantizeRow(x.data(), static_cast<int>(x.size()), q.data(), scale);
  for (size_t g = x.size(); g < q.size(); ++g) EXPECT_EQ(q[g], kGuardByte) << "guard byte " << g;
  q.resize(x.size());
  return q;
}

TEST(QuantizeTest, RoundsHalfToEven) {
  // amax = 127 gives scale exactly 1, so x / scale = x and the .5 cases are exact ties.
  const std::vector<float> x = {127.0f, 63.5f, -63.5f, 62.5f, 0.5f, 1.5f, -0.0f, 2.5f, -2.5f, -0.5f, -127.0f, 3.49f};
  float scale;
  bool ok;
  const auto q = Quantize(x, &scale, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(q, (std::vector<int8_t>{127, 64, -64, 62, 0, 2, 0, 2, -2, 0, -127, 3}));
}

// The reference formula of docs/KERNELS.md, with libm's nearbyint: QuantizeRow (integer
// amax, rounding without libm) must give the same scale and int8 values on rows full of
// exact ties, signed zeros, subnormals and extremes.
TEST(QuantizeTest, EqualsTheNearbyintReferenceOnTiesAndExtremes) {
  auto reference = [](const std::vector<float>& x, std::vector<int8_t>& q, float* scale) {
    float amax = 0.0f;
    for (float v : x) amax = std::fabs(v) > amax ? std::fabs(v) : amax;
    const float s = amax / 127.0f;
    *scale = s == 0.0f ? 0.0f : s;
    for (size_t i = 0; i < x.size(); ++i) {
      float r = s == 0.0f ? 0.0f : std::nearbyint(x[i] / s);
      r = std::min(127.0f, std::max(-127.0f, r));
      q[i] = static_cast<int8_t>(r);
    }
  };
  uint64_t state = 99;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  int rows = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int k = 1 + static_cast<int>(next() % 300);
    std::vector<float> x(static_cast<size_t>(k));
    const float unit = trial % 3 == 0 ? 1.0f : (trial % 3 == 1 ? 0x1p-140f : 0x1p100f);
    for (float& v : x) {
      const uint64_t r = next();
      switch (r % 5) {
        case 0:  // halves: x / s lands on .5 ties when amax is 127 units
          v = unit * (static_cast<float>(static_cast<int>(r >> 8) % 255 - 127) + 0.5f);
          break;
        case 1:
          v = unit * static_cast<float>(static_cast<int>(r >> 8) % 255 - 127);
          break;
        case 2:
          v = (r >> 8) % 2 ? -0.0f : 0.0f;
          break;
        default:
          v = unit * (static_cast<float>(static_cast<int>(r >> 8) % 200001) / 1000.0f - 100.0f);
      }
    }
    if (trial % 2 == 0) x[next() % static_cast<size_t>(k)] = unit * 127.0f;  // amax = 127 units
    std::vector<int8_t> got(static_cast<size_t>(k)), want(static_cast<size_t>(k));
    float gs = -1, ws = -1;
    ASSERT_TRUE(QuantizeRow(x.data(), k, got.data(), &gs));
    reference(x, want, &ws);
    ASSERT_EQ(std::memcmp(&gs, &ws, 4), 0) << "trial " << trial;
    ASSERT_EQ(got, want) << "trial " << trial;
    ++rows;
  }
  EXPECT_EQ(rows, 3000);
}

TEST(QuantizeTest, ScaleIsAmaxOver127AndTiesSurviveTheDivision) {
  // amax = 254: scale = 2 exactly; 1 / 2 = 0.5 -> 0 (even), 3 / 2 = 1.5 -> 2, -5 / 2 -> -2.
  const std::vector<float> x = {1.0f, 3.0f, -5.0f, -254.0f, 7.0f};
  float scale;
  bool ok;
  const auto q = Quantize(x, &scale, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(Bits(scale), Bits(254.0f / 127.0f));
  EXPECT_EQ(q, (std::vector<int8_t>{0, 2, -2, -127, 4}));
}

TEST(QuantizeTest, DividesByTheScaleRatherThanMultiplyingByItsInverse) {
  // Find inputs where round(x / s) and round(x * (1 / s)) differ; the contract is division.
  int differing = 0;
  for (int a = 1; a < 2000 && differing < 20; ++a) {
    const float amax = 1.0f + static_cast<float>(a) * 0.013f;
    const float s = amax / 127.0f;
    for (int t = -1000; t <= 1000; ++t) {
      const float v = static_cast<float>(t) * 0.0627f;
      if (std::fabs(v) > amax) continue;
      const float by_div = std::nearbyint(v / s), by_inv = std::nearbyint(v * (1.0f / s));
      if (by_div == by_inv) continue;
      ++differing;
      float scale;
      bool ok;
      const auto q = Quantize({amax, v}, &scale, &ok);
      ASSERT_TRUE(ok);
      ASSERT_EQ(Bits(scale), Bits(s));
      EXPECT_EQ(q[1], static_cast<int8_t>(by_div)) << "v=" << v << " amax=" << amax;
    }
  }
  EXPECT_GT(differing, 0) << "the search found no case that tells division from multiplication";
}

TEST(QuantizeTest, ZeroAndNegativeZeroRowsHaveScaleZero) {
  for (float z : {0.0f, -0.0f}) {
    float scale = -1.0f;
    bool ok;
    const auto q = Quantize(std::vector<float>(33, z), &scale, &ok);
    ASSERT_TRUE(ok);
    EXPECT_EQ(Bits(scale), Bits(0.0f));  // +0.0, whatever the sign of the inputs
    EXPECT_EQ(q, std::vector<int8_t>(33, 0));
  }
}

TEST(QuantizeTest, RefusesNonFinite) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = {1.0f, 2.0f, bad, 3.0f};
    float scale;
    bool ok = true;
    Quantize(x, &scale, &ok);
    EXPECT_FALSE(ok) << bad;
  }
}

TEST(QuantizeTest, RowTooSmallForAScaleIsZero) {
  // amax / 127 underflows to 0: zeros with scale 0, never 0 / 0.
  float scale = -1.0f;
  bool ok;
  const auto q = Quantize({1e-44f, 0.0f, -1e-44f}, &scale, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(Bits(scale), Bits(0.0f));
  EXPECT_EQ(q, (std::vector<int8_t>{0, 0, 0}));
}

TEST(QuantizeTest, TinyAndHugeMagnitudes) {
  // Subnormal scale and amax near FLT_MAX stay finite and in range.
  for (float amax : {1e-40f, 3.0e38f}) {
    float scale;
    bool ok;
    const auto q = Quantize({amax, -amax, amax / 2}, &scale, &ok);
    ASSERT_TRUE(ok);
    EXPECT_TRUE(std::isfinite(scale));
    EXPECT_EQ(q[0], 127);
    EXPECT_EQ(q[1], -127);
  }
}

TEST(QuantizeTest, MatrixQuantizesEachRowAndKeepsBias) {
  const std::vector<float> w = {1.1f,   -2.0f, 0.5f,  //
                                0.0f,   0.0f,  0.0f,  //
                                254.0f, 1.0f,  3.0f};
  auto m = QuantizeMatrix(w, 3, 3, std::vector<float>{0.25f, -1.0f, 2.0f}, "layer.weight");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->n, 3);
  EXPECT_EQ(m->k, 3);
  EXPECT_EQ(std::vector<int8_t>(m->q.begin(), m->q.end()), (std::vector<int8_t>{70, -127, 32, 0, 0, 0, 127, 0, 2}));
  EXPECT_EQ(Bits(m->scale[0]), Bits(2.0f / 127.0f));
  EXPECT_EQ(Bits(m->scale[1]), Bits(0.0f));
  EXPECT_EQ(Bits(m->scale[2]), Bits(2.0f));
  EXPECT_EQ(m->bias, (std::vector<float>{0.25f, -1.0f, 2.0f}));
  EXPECT_EQ(m->Bytes(), 9u + 4u * 6u);
  const QMatrixView v = m->View();
  EXPECT_EQ(v.ld, 3u);
  EXPECT_NE(v.bias, nullptr);
  EXPECT_EQ(QuantizeMatrix(w, 3, 3, {}, "w")->View().bias, nullptr);
}

TEST(QuantizeTest, MatrixRefusesBadInputNamingIt) {
  std::vector<float> w = {1.0f, 2.0f, std::numeric_limits<float>::infinity(), 4.0f};
  auto bad = QuantizeMatrix(w, 2, 2, {}, "blk.3.attn_q");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("blk.3.attn_q"), std::string::npos);
  EXPECT_NE(bad.status().message().find("row 1"), std::string::npos);

  w[2] = 3.0f;
  auto bad_bias = QuantizeMatrix(w, 2, 2, std::vector<float>{0.0f, std::nanf("")}, "b");
  EXPECT_FALSE(bad_bias.ok());
  EXPECT_FALSE(QuantizeMatrix(w, 0, 2, {}, "empty").ok());
  EXPECT_FALSE(QuantizeMatrix(w, 3, 2, {}, "short").ok());
}

// Every compiled variant of QuantizeRow (rowops.inc: one source per vector width) gives the
// baseline's bits: the start-up gate's rows, then 20,000 seeded rows of every length class.
TEST(RowOpsTest, EveryVariantGivesTheBaselineBits) {
  const std::vector<internal::RowOps> all = internal::RowOpsVariants();
  ASSERT_FALSE(all.empty());
  EXPECT_STREQ(all[0].name, "base");
  uint64_t state = 99;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  int checked = 0;
  for (const internal::RowOps& v : all) {
    if (!v.unsupported.empty()) continue;
    ++checked;
    EXPECT_EQ(internal::GateRowOps(v), "") << v.name;
    for (int row = 0; row < 20000; ++row) {
      const int k = 1 + static_cast<int>(next() % (row % 10 == 0 ? 4096 : 200));
      const float mag = std::ldexp(1.0f, static_cast<int>(next() % 60) - 30);
      std::vector<float> x(static_cast<size_t>(k));
      for (float& f : x) f = mag * (static_cast<float>(next() % 20001) - 10000.0f) / 10000.0f;
      std::vector<int8_t> qa(x.size()), qb(x.size());
      float sa = 0, sb = 0;
      ASSERT_EQ(all[0].quantize_row(x.data(), k, qa.data(), &sa), v.quantize_row(x.data(), k, qb.data(), &sb));
      ASSERT_EQ(std::memcmp(qa.data(), qb.data(), qa.size()), 0) << v.name << " row " << row;
      ASSERT_EQ(std::memcmp(&sa, &sb, sizeof sa), 0) << v.name << " row " << row;
      // The same row as two terms (the residual's arithmetic).
      std::vector<int8_t> qa2(x.size()), qb2(x.size());
      std::vector<float> r(x.size());
      float sa2 = 0, sb2 = 0;
      ASSERT_EQ(all[0].quantize_two_terms(x.data(), k, qa.data(), &sa, qa2.data(), &sa2, r.data()),
                v.quantize_two_terms(x.data(), k, qb.data(), &sb, qb2.data(), &sb2, r.data()));
      ASSERT_TRUE(qa == qb && qa2 == qb2) << v.name << " row " << row;
      ASSERT_EQ(std::memcmp(&sa2, &sb2, sizeof sa2), 0) << v.name << " row " << row;
    }
    // SoftmaxRows on attention-sized batches: a decode step's group of heads over a long
    // context, a prefill block's rows of growing length.
    for (int batch = 0; batch < 40; ++batch) {
      const int rows = 1 + static_cast<int>(next() % 24);
      std::vector<std::vector<float>> a(static_cast<size_t>(rows));
      std::vector<int> n(static_cast<size_t>(rows));
      for (int i = 0; i < rows; ++i) {
        n[static_cast<size_t>(i)] = 1 + static_cast<int>(next() % (batch % 4 == 0 ? 2048 : 300));
        for (int t = 0; t < n[static_cast<size_t>(i)]; ++t)
          a[static_cast<size_t>(i)].push_back((static_cast<float>(next() % 20001) - 10000.0f) / 500.0f);
      }
      std::vector<std::vector<float>> b = a;
      std::vector<float*> pa, pb;
      for (int i = 0; i < rows; ++i) {
        pa.push_back(a[static_cast<size_t>(i)].data());
        pb.push_back(b[static_cast<size_t>(i)].data());
      }
      all[0].softmax_rows(pa.data(), n.data(), rows);
      v.softmax_rows(pb.data(), n.data(), rows);
      ASSERT_TRUE(a == b) << v.name << " softmax batch " << batch;
      // SiLU times up over an MLP chunk of the same values
      std::vector<float>& gate = b[0];
      std::vector<float> up(gate.size()), sa_out(gate.size()), sb_out(gate.size());
      for (float& f : up) f = (static_cast<float>(next() % 2001) - 1000.0f) / 100.0f;
      for (float& f : gate) f = (static_cast<float>(next() % 20001) - 10000.0f) / 300.0f;
      all[0].silu(gate.data(), up.data(), static_cast<int>(gate.size()), sa_out.data());
      v.silu(gate.data(), up.data(), static_cast<int>(gate.size()), sb_out.data());
      ASSERT_TRUE(sa_out == sb_out) << v.name << " silu batch " << batch;
    }
  }
  EXPECT_GE(checked, 1);
  // The active variant is one that passed.
  EXPECT_EQ(internal::GateRowOps(internal::ActiveRowOps()), "");
}

// The gate notices one wrong value from either operation.
bool FlipFirstQ(const float* x, int k, int8_t* q, float* scale) {
  const bool ok = internal::RowOpsVariants()[0].quantize_row(x, k, q, scale);
  if (ok && k > 200) q[0] = static_cast<int8_t>(q[0] ^ 1);
  return ok;
}
void ExpOffByOneUlp(float* x, int n) {
  internal::RowOpsVariants()[0].exp_n(x, n);
  for (int i = 0; i < n; ++i)
    if (x[i] > 1.5f && x[i] < 1.6f) x[i] = std::nextafter(x[i], 2.0f);
}
bool SecondTermOff(const float* x, int k, int8_t* q1, float* s1, int8_t* q2, float* s2, float* r) {
  const bool ok = internal::RowOpsVariants()[0].quantize_two_terms(x, k, q1, s1, q2, s2, r);
  if (ok && k > 250 && q2[k - 1] < 127) ++q2[k - 1];
  return ok;
}
// One ulp on the last value of the last row of a batch of more than 8 (the group tail).
void SoftmaxLastRowOffByOneUlp(float* const* rows_at, const int* n, int rows) {
  internal::RowOpsVariants()[0].softmax_rows(rows_at, n, rows);
  if (rows > 8) rows_at[rows - 1][n[rows - 1] - 1] = std::nextafter(rows_at[rows - 1][n[rows - 1] - 1], 2.0f);
}
// Attention's AddScale and Mul are their formulas, bit for bit, in every variant and through
// the public entry points (rows of every length to 50: every vector tail; out aliasing a).
TEST(RowOpsTest, AddScaleAndMulAreTheirFormulas) {
  uint64_t state = 5;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int64_t>(state >> 40) % 200001 - 100000) / 977.0f;
  };
  for (const internal::RowOps& v : internal::RowOpsVariants()) {
    if (!v.unsupported.empty()) continue;
    for (int n = 1; n <= 50; ++n) {
      std::vector<float> a(static_cast<size_t>(n)), b(a.size()), out(a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        a[i] = next();
        b[i] = next();
      }
      const float c = 0.1f;  // not a power of two: (a + b) * c and a * c + b * c differ
      v.add_scale(a.data(), b.data(), c, n, out.data());
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(Bits(out[i]), Bits((a[i] + b[i]) * c)) << v.name << " " << n;
      v.mul(a.data(), b.data(), n, out.data());
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(Bits(out[i]), Bits(a[i] * b[i])) << v.name << " " << n;
      std::vector<float> in_place = a;
      AddScale(in_place.data(), b.data(), c, n, in_place.data());
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(Bits(in_place[i]), Bits((a[i] + b[i]) * c)) << n;
      in_place = a;
      Mul(in_place.data(), b.data(), n, in_place.data());
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(Bits(in_place[i]), Bits(a[i] * b[i])) << n;
    }
  }
}

// QuantizeRowTwoTerms is its definition in kernels.h, in every variant: QuantizeRow of x,
// the residual r[d] = x[d] - float(q1[d]) * s1 in scalar code, QuantizeRow of r. The fused
// passes (one pass for q1, r and r's amax) must not change a bit: rows of every length to
// 300 and some of 4096, magnitudes from subnormal to huge, exact ties, all-zero rows, rows
// whose residual is zero (every value on the grid), and a non-finite value in either place.
TEST(RowOpsTest, QuantizeRowTwoTermsIsItsDefinition) {
  uint64_t state = 11;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  for (const internal::RowOps& v : internal::RowOpsVariants()) {
    if (!v.unsupported.empty()) continue;
    for (int row = 0; row < 3000; ++row) {
      const int k = row % 50 == 0 ? 4096 : 1 + row % 300;
      const float unit = std::ldexp(1.0f, static_cast<int>(next() % 280) - 140);
      std::vector<float> x(static_cast<size_t>(k));
      for (float& f : x) {
        switch (row % 7) {
          case 0:  // on the grid of amax / 127: the residual is exactly zero
            f = static_cast<float>(static_cast<int>(next() % 255) - 127) * 0x1p-3f;
            break;
          case 1:  // ties of the first step
            f = (static_cast<float>(static_cast<int>(next() % 255) - 127) + 0.5f) * unit;
            break;
          case 2:
            f = 0.0f;
            break;
          default:
            f = unit * (static_cast<float>(next() % 2000001) - 1000000.0f) / 1000000.0f;
        }
      }
      if (row % 7 == 1 || row % 7 == 0) x[0] = 127.0f * (row % 7 == 1 ? unit : 0x1p-3f);
      if (row % 97 == 5) x[static_cast<size_t>(k) / 2] = std::numeric_limits<float>::infinity();
      if (row % 97 == 6) x[static_cast<size_t>(k) - 1] = std::numeric_limits<float>::quiet_NaN();
      // FLT_MAX: 127 * fl(FLT_MAX / 127) rounds to infinity, so the residual is not finite
      if (row % 97 == 7) x[0] = std::numeric_limits<float>::max();
      std::vector<int8_t> want1(x.size()), want2(x.size()), got1(x.size()), got2(x.size());
      std::vector<float> r(x.size()), scratch(x.size());
      float ws1 = -1, ws2 = -1, gs1 = -1, gs2 = -1;
      bool want_ok = v.quantize_row(x.data(), k, want1.data(), &ws1);
      if (want_ok) {
        for (size_t d = 0; d < x.size(); ++d) r[d] = x[d] - static_cast<float>(want1[d]) * ws1;
        want_ok = v.quantize_row(r.data(), k, want2.data(), &ws2);
      }
      const bool got_ok = v.quantize_two_terms(x.data(), k, got1.data(), &gs1, got2.data(), &gs2, scratch.data());
      ASSERT_EQ(got_ok, want_ok) << v.name << " row " << row;
      if (!want_ok) continue;
      ASSERT_TRUE(got1 == want1 && got2 == want2) << v.name << " row " << row << " of " << k;
      ASSERT_EQ(Bits(gs1), Bits(ws1)) << v.name << " row " << row;
      ASSERT_EQ(Bits(gs2), Bits(ws2)) << v.name << " row " << row;
    }
  }
}

void MulLastOffByOneUlp(const float* a, const float* b, int n, float* out) {
  internal::RowOpsVariants()[0].mul(a, b, n, out);
  if (n > 60) out[n - 1] = std::nextafter(out[n - 1], 1e30f);
}

// One ulp on the last value of a gated row of more than 60.
void GatedSiluOffByOneUlp(const float* g, const float* u, int n, float* out) {
  internal::RowOpsVariants()[0].silu(g, u, n, out);
  if (u != nullptr && n > 60) out[n - 1] = std::nextafter(out[n - 1], 1e30f);
}

TEST(RowOpsTest, TheGateRefusesAVariantThatDiffersOnce) {
  const internal::RowOps base = internal::RowOpsVariants()[0];
  // The gate's message for the baseline with one operation replaced by `fn`.
  auto gate_with = [&base](auto member, auto fn) {
    internal::RowOps bad = base;
    bad.*member = fn;
    return internal::GateRowOps(bad);
  };
  EXPECT_NE(gate_with(&internal::RowOps::quantize_row, &FlipFirstQ).find("QuantizeRow differs"), std::string::npos);
  EXPECT_NE(gate_with(&internal::RowOps::exp_n, &ExpOffByOneUlp).find("ExpN differs"), std::string::npos);
  EXPECT_NE(gate_with(&internal::RowOps::quantize_two_terms, &SecondTermOff).find("QuantizeRowTwoTerms differs"),
            std::string::npos);
  EXPECT_NE(gate_with(&internal::RowOps::silu, &GatedSiluOffByOneUlp).find("Silu (gated) differs"), std::string::npos);
  EXPECT_NE(gate_with(&internal::RowOps::mul, &MulLastOffByOneUlp).find("Mul differs"), std::string::npos);
  EXPECT_NE(gate_with(&internal::RowOps::softmax_rows, &SoftmaxLastRowOffByOneUlp).find("SoftmaxRows differs"),
            std::string::npos);
  EXPECT_EQ(internal::GateRowOps(base), "");
}

}  // namespace
}  // namespace daisy::kernels
