// Writes testdata/detmath_golden.txt: seeded inputs of every detmath function with the
// output bits this build computes. detmath_test recomputes them bit for bit, so a changed
// algorithm, constant or compiler behaviour (FMA contraction, excess precision) is caught.
// Regenerate only on purpose, after checking the accuracy numbers in docs/KERNELS.md:
//   make_detmath_golden testdata/detmath_golden.txt
// With --measure it instead sweeps every float of each documented range against the
// double-precision libm (the numbers quoted in docs/KERNELS.md; this takes about half an
// hour on one core); --measure-double samples only the double helpers.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "daisy/detmath.h"

namespace {

namespace dm = daisy::detmath;

// SplitMix64: a fixed, portable stream for the inputs.
struct SplitMix64 {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi) from 53 random bits (exact double arithmetic on any machine).
  double Uniform(double lo, double hi) { return lo + (hi - lo) * (static_cast<double>(Next() >> 11) * 0x1p-53); }
  float UniformF(double lo, double hi) { return static_cast<float>(Uniform(lo, hi)); }
  float AnyFloat() { return std::bit_cast<float>(static_cast<uint32_t>(Next() >> 32)); }
};

std::vector<float> SpecialFloats() {
  const float inf = INFINITY;
  return {0.0f,
          -0.0f,
          1.0f,
          -1.0f,
          inf,
          -inf,
          std::bit_cast<float>(0x7fc00000u),
          std::bit_cast<float>(0xffc00001u),
          std::bit_cast<float>(0x00000001u),
          std::bit_cast<float>(0x807fffffu),
          std::bit_cast<float>(0x00800000u),
          FLT_MAX,
          -FLT_MAX,
          0.5f,
          1e-8f,
          -1e-8f,
          88.72283f,
          88.72284f,
          -87.33655f,
          -103.97208f,
          -103.97209f,
          -104.0f,
          89.0f,
          0.78539819f,
          1.5707964f,
          3.1415927f,
          6.2831855f,
          1e6f,
          -1e6f,
          16777216.0f,
          1e30f,
          9.0f,
          10.0f,
          -10.0f};
}

std::string Hex32(float f) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08" PRIx32, std::bit_cast<uint32_t>(f));
  return buf;
}
std::string Hex64(double d) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, std::bit_cast<uint64_t>(d));
  return buf;
}

// Inputs per function (the counts are checked by detmath_test).
constexpr int kPerFunction = 2000;
constexpr int kLogCount = 1000;

std::vector<float> ExpInputs(SplitMix64& g) {
  std::vector<float> v = SpecialFloats();
  while (v.size() < 800) v.push_back(g.UniformF(-104.0, 89.0));
  while (v.size() < 1400) v.push_back(g.UniformF(-20.0, 0.0));  // softmax: x - max
  while (v.size() < 1700) v.push_back(g.UniformF(-1.0, 1.0));
  while (v.size() < static_cast<size_t>(kPerFunction)) v.push_back(g.AnyFloat());
  return v;
}
std::vector<float> TanhInputs(SplitMix64& g) {
  std::vector<float> v = SpecialFloats();
  while (v.size() < 1000) v.push_back(g.UniformF(-6.0, 6.0));  // GELU inner range
  while (v.size() < 1400) v.push_back(g.UniformF(-0.1, 0.1));
  while (v.size() < static_cast<size_t>(kPerFunction)) v.push_back(g.AnyFloat());
  return v;
}
std::vector<float> SinCosInputs(SplitMix64& g) {
  std::vector<float> v = SpecialFloats();
  while (v.size() < 500) v.push_back(g.UniformF(-4.0, 4.0));
  while (v.size() < 900) v.push_back(g.UniformF(-1e4, 1e4));
  while (v.size() < 1300) v.push_back(g.UniformF(-1e6, 1e6));
  // RoPE angles: position * theta^(-2i/d) rounded to f32 as the forward pass does.
  while (v.size() < 1700) {
    const double pos = std::floor(g.Uniform(0, 131072));
    const double inv_freq = dm::PowD(500000.0, -std::floor(g.Uniform(0, 64)) / 64.0);
    v.push_back(static_cast<float>(pos) * static_cast<float>(inv_freq));
  }
  while (v.size() < static_cast<size_t>(kPerFunction)) v.push_back(g.AnyFloat());
  return v;
}
std::vector<float> LogInputs(SplitMix64& g) {
  std::vector<float> v = SpecialFloats();
  while (v.size() < 500) v.push_back(g.UniformF(0.0, 2.0));
  while (v.size() < static_cast<size_t>(kLogCount)) v.push_back(g.AnyFloat());
  return v;
}
std::vector<std::pair<double, double>> PowInputs(SplitMix64& g) {
  std::vector<std::pair<double, double>> v = {{2.0, 10.0},      {10000.0, -0.5}, {1e6, -1.0}, {0.0, 1.0},
                                              {0.0, -1.0},      {1.0, 1e300},    {-2.0, 2.0}, {INFINITY, 2.0},
                                              {INFINITY, -2.0}, {NAN, 1.0},      {3.0, 0.0},  {10.0, 400.0}};
  while (v.size() < 1000) {  // RoPE frequencies
    const double theta = std::vector<double>{10000.0, 100000.0, 500000.0, 1e6}[g.Next() % 4];
    const int d = std::vector<int>{8, 64, 128}[g.Next() % 3];
    v.push_back({theta, -static_cast<double>(2 * static_cast<int>(g.Next() % (d / 2))) / d});
  }
  while (v.size() < static_cast<size_t>(kPerFunction)) v.push_back({g.Uniform(1e-3, 1e7), g.Uniform(-3.0, 3.0)});
  return v;
}

int WriteGolden(const char* path) {
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path);
    return 1;
  }
  std::fprintf(f,
               "# Golden bits of daisy::detmath, written by tools/make_detmath_golden.cc.\n"
               "# fn input_bits output_bits (hex; powd: base exponent result, 64-bit).\n"
               "# detmath_test recomputes every line bit for bit; regenerate only on purpose.\n");
  SplitMix64 g{0x5eed0001u};
  for (float x : ExpInputs(g)) std::fprintf(f, "exp %s %s\n", Hex32(x).c_str(), Hex32(dm::Exp(x)).c_str());
  g = SplitMix64{0x5eed0002u};
  for (float x : TanhInputs(g)) std::fprintf(f, "tanh %s %s\n", Hex32(x).c_str(), Hex32(dm::Tanh(x)).c_str());
  g = SplitMix64{0x5eed0003u};
  for (float x : SinCosInputs(g)) std::fprintf(f, "sin %s %s\n", Hex32(x).c_str(), Hex32(dm::Sin(x)).c_str());
  g = SplitMix64{0x5eed0004u};
  for (float x : SinCosInputs(g)) std::fprintf(f, "cos %s %s\n", Hex32(x).c_str(), Hex32(dm::Cos(x)).c_str());
  g = SplitMix64{0x5eed0005u};
  for (float x : LogInputs(g)) std::fprintf(f, "log %s %s\n", Hex32(x).c_str(), Hex32(dm::Log(x)).c_str());
  g = SplitMix64{0x5eed0006u};
  for (auto [b, e] : PowInputs(g)) {
    std::fprintf(f, "powd %s %s %s\n", Hex64(b).c_str(), Hex64(e).c_str(), Hex64(dm::PowD(b, e)).c_str());
  }
  return std::fclose(f) == 0 ? 0 : 1;
}

// |got - ref| in units of the f32 ulp at ref (subnormal spacing 2^-149 below 2^-126).
double UlpError(float got, double ref) {
  if (std::isnan(ref)) return std::isnan(got) ? 0 : INFINITY;
  if (std::isinf(ref) || std::fabs(ref) > FLT_MAX) {
    // A reference beyond FLT_MAX rounds to inf unless it is within half an ulp of FLT_MAX.
    return static_cast<double>(got) == static_cast<double>(static_cast<float>(ref)) ? 0 : INFINITY;
  }
  if (std::isinf(got)) return INFINITY;
  const double a = std::fabs(ref);
  int exp2 = 0;
  std::frexp(a, &exp2);  // a = f 2^exp2, f in [0.5, 1)
  const double ulp = a < 0x1p-126 ? 0x1p-149 : std::ldexp(1.0, exp2 - 24);
  return std::fabs(static_cast<double>(got) - ref) / ulp;
}

// Every float in [lo, hi] (both signs handled by the bit ranges).
template <typename F, typename R>
void Sweep(const char* name, float lo, float hi, F fn, R ref) {
  double worst = 0;
  float worst_x = 0;
  uint64_t count = 0;
  auto visit = [&](uint32_t b0, uint32_t b1) {
    for (uint64_t b = b0; b <= b1; ++b) {
      const float x = std::bit_cast<float>(static_cast<uint32_t>(b));
      const double e = UlpError(fn(x), ref(static_cast<double>(x)));
      ++count;
      if (e > worst) {
        worst = e;
        worst_x = x;
      }
    }
  };
  // Negative floats order their bits by magnitude, so each sign is one bit range.
  if (lo < 0) visit(std::bit_cast<uint32_t>(hi < 0 ? hi : -0.0f), std::bit_cast<uint32_t>(lo));
  if (hi >= 0) visit(std::bit_cast<uint32_t>(lo > 0 ? lo : 0.0f), std::bit_cast<uint32_t>(hi));
  std::printf("%-5s [%g, %g]: %" PRIu64 " floats, max ulp error %.4f at x = %.9g (%s)\n", name, lo, hi, count, worst,
              worst_x, Hex32(worst_x).c_str());
  std::fflush(stdout);
}

// The double helpers, sampled (2^64 inputs cannot be swept): error in ulps of the double
// result.
void MeasureDouble() {
  auto ulp_d = [](double got, double ref) {
    if (got == ref) return 0.0;
    int e = 0;
    std::frexp(ref, &e);
    return std::fabs(got - ref) / std::ldexp(1.0, e - 53);
  };
  SplitMix64 g{0x5eed00ffu};
  double we = 0, wl = 0, wp = 0, wr = 0;
  for (int i = 0; i < 20000000; ++i) {
    const double x = g.Uniform(-708.0, 709.0);
    we = std::max(we, ulp_d(dm::ExpD(x), std::exp(x)));
    const double y = std::ldexp(g.Uniform(0.5, 1.0), static_cast<int>(g.Uniform(-1020, 1020)));
    wl = std::max(wl, ulp_d(dm::LogD(y), std::log(y)));
    const double b = g.Uniform(1e-3, 1e7), e = g.Uniform(-3.0, 3.0);
    wp = std::max(wp, ulp_d(dm::PowD(b, e), std::pow(b, e)));
  }
  for (double theta : {10000.0, 100000.0, 500000.0, 1e6}) {
    for (int d = 2; d <= 256; d += 2) {
      for (int i = 0; i < d / 2; ++i)
        wr = std::max(wr, ulp_d(dm::PowD(theta, -2.0 * i / d), std::pow(theta, -2.0 * i / d)));
    }
  }
  std::printf(
      "double ulps: ExpD %.2f (2e7 x in [-708, 709]), LogD %.2f (2e7 normal x), PowD %.2f (2e7 base in "
      "[1e-3, 1e7], e in [-3, 3]), PowD %.2f (RoPE theta^(-2i/d), d <= 256)\n",
      we, wl, wp, wr);
}

int Measure() {
  MeasureDouble();
  Sweep("exp", -104.0f, 89.0f, dm::Exp, [](double x) { return std::exp(x); });
  // Tanh, Sin and Cos work on |x| and apply the sign exactly, so x >= 0 covers x < 0.
  Sweep("tanh", 0.0f, FLT_MAX, dm::Tanh, [](double x) { return std::tanh(x); });
  Sweep("sin", 0.0f, 1e6f, dm::Sin, [](double x) { return std::sin(x); });
  Sweep("cos", 0.0f, 1e6f, dm::Cos, [](double x) { return std::cos(x); });
  Sweep("sin", 1e6f, FLT_MAX, dm::Sin, [](double x) { return std::sin(x); });
  Sweep("cos", 1e6f, FLT_MAX, dm::Cos, [](double x) { return std::cos(x); });
  Sweep("log", 0.0f, FLT_MAX, dm::Log, [](double x) { return std::log(x); });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--measure") == 0) return Measure();
  if (argc == 2 && std::strcmp(argv[1], "--measure-double") == 0) {
    MeasureDouble();
    return 0;
  }
  if (argc != 2 || argv[1][0] == '-') {
    std::fprintf(stderr, "usage: make_detmath_golden OUT.txt | --measure | --measure-double\n");
    return 2;
  }
  return WriteGolden(argv[1]);
}
