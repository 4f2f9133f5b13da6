// Tests of daisy::detmath: (a) accuracy against the double-precision libm over strided
// sweeps of every documented range (the exhaustive numbers are in docs/KERNELS.md, made by
// `make_detmath_golden --measure`); (b) the golden bits in testdata/detmath_golden.txt,
// recomputed bit for bit, so any change of algorithm, constant or compiler behaviour
// (FMA contraction, excess precision) fails here before it can split a ring.
#include "daisy/detmath.h"

#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "internal.h"

namespace daisy::detmath {
namespace {

// Bounds (in f32 ulps) the sweeps must stay within: the exhaustively measured maxima of
// docs/KERNELS.md, rounded up a little.
constexpr double kExpMaxUlp = 1.0;
constexpr double kTanhMaxUlp = 0.51;
constexpr double kSinCosMaxUlp = 0.51;
constexpr double kLogMaxUlp = 0.51;

constexpr uint32_t kCanonicalNaN = 0x7fc00000u;

uint32_t Bits(float f) {
  return std::bit_cast<uint32_t>(f);
}
uint64_t Bits(double d) {
  return std::bit_cast<uint64_t>(d);
}

// |got - ref| in units of the f32 ulp at ref (subnormal spacing 2^-149 below 2^-126).
double UlpError(float got, double ref) {
  if (std::isnan(ref)) return std::isnan(got) ? 0 : INFINITY;
  if (std::fabs(ref) > FLT_MAX) {
    return static_cast<double>(got) == static_cast<double>(static_cast<float>(ref)) ? 0 : INFINITY;
  }
  if (std::isinf(got)) return INFINITY;
  const double a = std::fabs(ref);
  int exp2 = 0;
  std::frexp(a, &exp2);
  const double ulp = a < 0x1p-126 ? 0x1p-149 : std::ldexp(1.0, exp2 - 24);
  return std::fabs(static_cast<double>(got) - ref) / ulp;
}

// Relative error of a double in units of 2^-52.
double RelErrorD(double got, double ref) {
  if (ref == got) return 0;
  return std::fabs(got - ref) / std::fabs(ref) / 0x1p-52;
}

struct SweepResult {
  double max_ulp = 0;
  float worst_x = 0;
  uint64_t count = 0;
};

// Every `stride`-th float of [lo, hi] (by bit pattern, both signs), stride odd so that
// all mantissa residues are visited.
template <typename F, typename R>
SweepResult Sweep(float lo, float hi, uint32_t stride, F fn, R ref) {
  SweepResult res;
  auto visit = [&](uint32_t b0, uint32_t b1) {
    for (uint64_t b = b0; b <= b1; b += stride) {
      const float x = std::bit_cast<float>(static_cast<uint32_t>(b));
      const double e = UlpError(fn(x), ref(static_cast<double>(x)));
      ++res.count;
      if (!(e <= res.max_ulp)) {
        res.max_ulp = e;
        res.worst_x = x;
      }
    }
  };
  if (lo < 0) visit(Bits(hi < 0 ? hi : -0.0f), Bits(lo));
  if (hi >= 0) visit(Bits(lo > 0 ? lo : 0.0f), Bits(hi));
  return res;
}

TEST(DetMathTest, ExpAccuracyOverItsRange) {
  const SweepResult r = Sweep(-104.0f, 89.0f, 301, Exp, [](double x) { return std::exp(x); });
  EXPECT_GT(r.count, 7000000u);
  EXPECT_LE(r.max_ulp, kExpMaxUlp) << "at x = " << r.worst_x;
  // The softmax range x - max in [-30, 0], denser.
  const SweepResult s = Sweep(-30.0f, 0.0f, 31, Exp, [](double x) { return std::exp(x); });
  EXPECT_LE(s.max_ulp, kExpMaxUlp) << "at x = " << s.worst_x;
}

TEST(DetMathTest, ExpSpecialValues) {
  EXPECT_EQ(Bits(Exp(0.0f)), Bits(1.0f));
  EXPECT_EQ(Bits(Exp(-0.0f)), Bits(1.0f));
  EXPECT_EQ(Bits(Exp(-INFINITY)), Bits(0.0f));
  EXPECT_EQ(Bits(Exp(INFINITY)), Bits(INFINITY));
  EXPECT_EQ(Bits(Exp(NAN)), kCanonicalNaN);
  EXPECT_EQ(Bits(Exp(std::bit_cast<float>(0xffc12345u))), kCanonicalNaN);
  // Overflow exactly where exp(x) rounds past FLT_MAX: ln(FLT_MAX) = 88.7228391...
  EXPECT_EQ(Exp(std::bit_cast<float>(0x42b17218u)), INFINITY);         // 88.7228394
  EXPECT_TRUE(std::isfinite(Exp(std::bit_cast<float>(0x42b17217u))));  // 88.7228317
  EXPECT_EQ(Exp(1000.0f), INFINITY);
  // Gradual underflow: subnormal results, then 0 below ln(2^-150) = -103.972077.
  EXPECT_GT(Exp(-100.0f), 0.0f);
  EXPECT_LT(Exp(-100.0f), FLT_MIN);
  // The floats on either side of ln(2^-150) = -103.9720771: 2^-149 (the smallest
  // subnormal) and 0.
  EXPECT_EQ(Bits(Exp(std::bit_cast<float>(0xc2cff1b4u))), 1u);  // -103.972076
  EXPECT_EQ(Bits(Exp(std::bit_cast<float>(0xc2cff1b5u))), 0u);  // -103.972084
  EXPECT_EQ(Bits(Exp(-104.0f)), 0u);
  EXPECT_EQ(Bits(Exp(-1000.0f)), 0u);
  EXPECT_EQ(Exp(1.0f), 2.71828182845904523536f);
}

// Softmax and sampling rely on exp being monotone: a larger logit never gets a smaller
// probability.
// ExpN is Exp, lane by lane, on every 256th float bit pattern (16.7 million values: every
// exponent, both signs, NaN payloads, infinities, subnormals, both ScaleByPow2 paths) and on
// the boundaries of its special cases and of its one-step range, at every offset of a row
// (vector bodies and tails):
// the active ExpN and every compiled variant this CPU runs (rowops.inc, one per vector width).
TEST(DetMathTest, ExpNEqualsExpBitForBit) {
  std::vector<void (*)(float*, int)> fns = {&ExpN};
  for (const kernels::internal::RowOps& v : kernels::internal::RowOpsVariants())
    if (v.unsupported.empty()) fns.push_back(v.exp_n);
  std::vector<float> row, want, got;
  uint64_t mismatches = 0;
  uint32_t first = 0;
  auto check = [&]() {
    want.resize(row.size());
    for (size_t i = 0; i < row.size(); ++i) want[i] = Exp(row[i]);
    for (auto* fn : fns) {
      got = row;
      fn(got.data(), static_cast<int>(got.size()));
      for (size_t i = 0; i < row.size(); ++i)
        if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]) && mismatches++ == 0)
          first = std::bit_cast<uint32_t>(want[i]);
    }
  };
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += uint64_t{1} << 20) {
    row.clear();
    for (uint64_t u = base; u < base + (uint64_t{1} << 20); u += 256)
      row.push_back(std::bit_cast<float>(static_cast<uint32_t>(u + (u >> 20) % 256)));
    check();
  }
  EXPECT_EQ(mismatches, 0u) << "first expected bits " << std::hex << first;
  const float edges[] = {89.0f,
                         std::nextafter(89.0f, 100.0f),
                         -104.0f,
                         std::nextafter(-104.0f, -200.0f),
                         88.72283935546875f,
                         -87.33654022216797f,
                         -103.97208f,
                         0.0f,
                         -0.0f,
                         std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN(),
                         std::bit_cast<float>(0xffc12345u),
                         std::numeric_limits<float>::denorm_min(),
                         0.5f,
                         -0.5f,
                         1e-8f};
  for (size_t len = 1; len <= 19; ++len) {
    row.clear();
    for (size_t i = 0; i < len; ++i) row.push_back(edges[(i + len) % std::size(edges)]);
    check();
  }
  // A row wholly in [-87, 88] takes the one-step path alone. Rows with one value just past
  // either end must not: at -87.9 and -88 (k = -127) the one-step scaling gives 0 where Exp
  // gives a subnormal, at 88.5 (k = 128) inf where Exp is finite.
  for (const float past : {-87.9f, -88.0f, 88.5f}) {
    row = {-87.0f, -40.0f, 0.0f, 88.0f, 3.0f, past, -1.0f, 20.0f, 87.0f};
    check();
  }
  EXPECT_EQ(mismatches, 0u) << "first expected bits " << std::hex << first;
}

TEST(DetMathTest, ExpIsMonotone) {
  uint64_t state = 12345;
  for (int i = 0; i < 2000000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float x = -104.0f + 193.0f * static_cast<float>(state >> 40) * 0x1p-24f;
    const float next = std::nextafter(x, INFINITY);
    ASSERT_LE(Exp(x), Exp(next)) << "x = " << x;
  }
}

TEST(DetMathTest, TanhAccuracyOverAllFloats) {
  const SweepResult r = Sweep(-FLT_MAX, FLT_MAX, 1001, Tanh, [](double x) { return std::tanh(x); });
  EXPECT_GT(r.count, 4000000u);
  EXPECT_LE(r.max_ulp, kTanhMaxUlp) << "at x = " << r.worst_x;
  // GELU's inner argument range, denser.
  const SweepResult g = Sweep(-8.0f, 8.0f, 97, Tanh, [](double x) { return std::tanh(x); });
  EXPECT_LE(g.max_ulp, kTanhMaxUlp) << "at x = " << g.worst_x;
}

TEST(DetMathTest, TanhSpecialValuesAndSymmetry) {
  EXPECT_EQ(Bits(Tanh(0.0f)), Bits(0.0f));
  EXPECT_EQ(Bits(Tanh(-0.0f)), Bits(-0.0f));
  EXPECT_EQ(Tanh(INFINITY), 1.0f);
  EXPECT_EQ(Tanh(-INFINITY), -1.0f);
  EXPECT_EQ(Tanh(10.0f), 1.0f);
  EXPECT_EQ(Bits(Tanh(NAN)), kCanonicalNaN);
  EXPECT_EQ(Tanh(1e-30f), 1e-30f);
  for (float x = -12.0f; x <= 12.0f; x += 0.0137f) {
    ASSERT_EQ(Bits(Tanh(-x)), Bits(-Tanh(x))) << x;
    ASSERT_LE(std::fabs(Tanh(x)), 1.0f) << x;
  }
}

TEST(DetMathTest, SinCosAccuracyUpToOneMillion) {
  const SweepResult s = Sweep(-1e6f, 1e6f, 401, Sin, [](double x) { return std::sin(x); });
  EXPECT_GT(s.count, 5000000u);
  EXPECT_LE(s.max_ulp, kSinCosMaxUlp) << "sin at x = " << s.worst_x;
  const SweepResult c = Sweep(-1e6f, 1e6f, 401, Cos, [](double x) { return std::cos(x); });
  EXPECT_LE(c.max_ulp, kSinCosMaxUlp) << "cos at x = " << c.worst_x;
}

// The reduction is exact for every finite float, not only for RoPE's range.
TEST(DetMathTest, SinCosAccuracyForHugeArguments) {
  const SweepResult s = Sweep(1e6f, FLT_MAX, 1009, Sin, [](double x) { return std::sin(x); });
  EXPECT_LE(s.max_ulp, kSinCosMaxUlp) << "sin at x = " << s.worst_x;
  const SweepResult c = Sweep(-FLT_MAX, -1e6f, 1009, Cos, [](double x) { return std::cos(x); });
  EXPECT_LE(c.max_ulp, kSinCosMaxUlp) << "cos at x = " << c.worst_x;
  // Near multiples of pi/2 the reduction cancels many bits. 0x6f79be45 = 16367173 * 2^72
  // is the float closest to a multiple of pi/2 (J.-M. Muller, Elementary Functions: its
  // cosine is -1.6e-9); 0x40490fdb is f32(pi), 0x47c90fdb f32(32768 pi), 0x7f7fffff FLT_MAX.
  for (uint32_t b : {0x6f79be45u, 0x40490fdbu, 0x40c90fdbu, 0x47c90fdbu, 0x4a490fdbu, 0x7f7fffffu}) {
    const float x = std::bit_cast<float>(b);
    EXPECT_LE(UlpError(Sin(x), std::sin(static_cast<double>(x))), kSinCosMaxUlp) << std::hex << b;
    EXPECT_LE(UlpError(Cos(x), std::cos(static_cast<double>(x))), kSinCosMaxUlp) << std::hex << b;
  }
}

TEST(DetMathTest, SinCosSpecialValuesAndSymmetry) {
  EXPECT_EQ(Bits(Sin(0.0f)), Bits(0.0f));
  EXPECT_EQ(Bits(Sin(-0.0f)), Bits(-0.0f));
  EXPECT_EQ(Cos(0.0f), 1.0f);
  EXPECT_EQ(Cos(-0.0f), 1.0f);
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    EXPECT_EQ(Bits(Sin(bad)), kCanonicalNaN);
    EXPECT_EQ(Bits(Cos(bad)), kCanonicalNaN);
  }
  for (float x = -50.0f; x <= 50.0f; x += 0.0173f) {
    ASSERT_EQ(Bits(Sin(-x)), Bits(-Sin(x))) << x;
    ASSERT_EQ(Bits(Cos(-x)), Bits(Cos(x))) << x;
    const double s = Sin(x), c = Cos(x);
    ASSERT_NEAR(s * s + c * c, 1.0, 4e-7) << x;
  }
}

TEST(DetMathTest, LogAccuracy) {
  const SweepResult r = Sweep(0.0f, FLT_MAX, 1001, Log, [](double x) { return std::log(x); });
  EXPECT_LE(r.max_ulp, kLogMaxUlp) << "at x = " << r.worst_x;
  EXPECT_EQ(Log(0.0f), -INFINITY);
  EXPECT_EQ(Log(-0.0f), -INFINITY);
  EXPECT_EQ(Log(INFINITY), INFINITY);
  EXPECT_EQ(Log(1.0f), 0.0f);
  EXPECT_EQ(Bits(Log(-1.0f)), kCanonicalNaN);
  EXPECT_EQ(Bits(Log(NAN)), kCanonicalNaN);
}

TEST(DetMathTest, DoubleHelpersAreAccurate) {
  uint64_t state = 777;
  auto uniform = [&state](double lo, double hi) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * static_cast<double>(state >> 11) * 0x1p-53;
  };
  double max_exp = 0, max_log = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = uniform(-700.0, 700.0);
    max_exp = std::max(max_exp, RelErrorD(ExpD(x), std::exp(x)));
    const double y = std::ldexp(uniform(0.5, 1.0), static_cast<int>(uniform(-1070, 1020)));
    max_log = std::max(max_log, RelErrorD(LogD(y), std::log(y)));
  }
  EXPECT_LE(max_exp, 4.0);  // relative error below 4 * 2^-52
  EXPECT_LE(max_log, 2.0);
  EXPECT_EQ(ExpD(0.0), 1.0);
  EXPECT_EQ(ExpD(800.0), INFINITY);
  EXPECT_EQ(ExpD(-800.0), 0.0);
  EXPECT_GT(ExpD(-740.0), 0.0);  // subnormal
  EXPECT_EQ(LogD(1.0), 0.0);
  EXPECT_NEAR(LogD(std::ldexp(1.0, -1074)), -744.44007192138126, 1e-12);
}

// RoPE: inv_freq = theta^(-2i/d). Error in units of the double ulp of the result, which
// is ~2^29 times finer than the f32 the forward pass keeps.
TEST(DetMathTest, PowDForRopeFrequencies) {
  double worst = 0;
  for (double theta : {10000.0, 100000.0, 500000.0, 1000000.0}) {
    for (int d : {8, 64, 128}) {
      for (int i = 0; i < d / 2; ++i) {
        const double e = -2.0 * i / d;
        worst = std::max(worst, RelErrorD(PowD(theta, e), std::pow(theta, e)));
        // After rounding to f32 the frequency equals the one from the platform libm
        // except where libm itself sits on a rounding boundary (never in this set).
        EXPECT_EQ(static_cast<float>(PowD(theta, e)), static_cast<float>(std::pow(theta, e))) << theta << "^" << e;
      }
    }
  }
  EXPECT_LE(worst, 16.0);
  EXPECT_EQ(PowD(2.0, 10.0), 1024.0);
  EXPECT_EQ(PowD(5.0, 0.0), 1.0);
  EXPECT_EQ(PowD(0.0, 2.0), 0.0);
  EXPECT_EQ(PowD(0.0, -2.0), INFINITY);
  EXPECT_EQ(PowD(INFINITY, -1.0), 0.0);
  EXPECT_EQ(Bits(PowD(-2.0, 2.0)), 0x7ff8000000000000ull);
  EXPECT_EQ(Bits(PowD(NAN, 1.0)), 0x7ff8000000000000ull);
}

// (b) Golden bits.
std::string GoldenPath() {
  const char* dir = std::getenv("DAISY_TESTDATA");
  return std::string(dir != nullptr ? dir : "testdata") + "/detmath_golden.txt";
}

TEST(DetMathTest, GoldenBitsAreReproduced) {
  std::ifstream in(GoldenPath());
  ASSERT_TRUE(in.good()) << "cannot open " << GoldenPath() << " (set DAISY_TESTDATA)";
  std::map<std::string, int> checked;
  int mismatches = 0;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string fn, a, b, c;
    ss >> fn >> a >> b >> c;
    bool ok = false;
    std::string got;
    char buf[24];
    if (fn == "powd") {
      ASSERT_FALSE(c.empty()) << "line " << line_no;
      const double base = std::bit_cast<double>(std::stoull(a, nullptr, 16));
      const double e = std::bit_cast<double>(std::stoull(b, nullptr, 16));
      std::snprintf(buf, sizeof buf, "%016" PRIx64, Bits(PowD(base, e)));
      got = buf;
      ok = got == c;
    } else {
      ASSERT_FALSE(b.empty()) << "line " << line_no;
      const float x = std::bit_cast<float>(static_cast<uint32_t>(std::stoul(a, nullptr, 16)));
      float y = 0;
      if (fn == "exp")
        y = Exp(x);
      else if (fn == "tanh")
        y = Tanh(x);
      else if (fn == "sin")
        y = Sin(x);
      else if (fn == "cos")
        y = Cos(x);
      else if (fn == "log")
        y = Log(x);
      else
        FAIL() << "unknown function '" << fn << "' on line " << line_no;
      std::snprintf(buf, sizeof buf, "%08" PRIx32, Bits(y));
      got = buf;
      ok = got == b;
    }
    ++checked[fn];
    if (!ok && ++mismatches <= 20) {
      ADD_FAILURE() << "line " << line_no << ": " << line << " -> computed " << got;
    }
  }
  EXPECT_EQ(mismatches, 0);
  // The file must be complete: a truncated file would otherwise pass.
  EXPECT_EQ(checked["exp"], 2000);
  EXPECT_EQ(checked["tanh"], 2000);
  EXPECT_EQ(checked["sin"], 2000);
  EXPECT_EQ(checked["cos"], 2000);
  EXPECT_EQ(checked["powd"], 2000);
  EXPECT_EQ(checked["log"], 1000);
}

}  // namespace
}  // namespace daisy::detmath
