// Deterministic transcendentals (see daisy/detmath.h and docs/KERNELS.md, "Deterministic f32
// math"). Only +, -, *, /, comparisons, integer conversions and bit manipulation are used:
// each of them is correctly rounded by IEEE 754, so the result bits depend on nothing but
// the order of operations written here. That order must not be changed by the compiler.
#include "daisy/detmath.h"

#include <bit>
#include <cfloat>
#include <cmath>  // std::signbit only (a bit test, not a libm function)
#include <cstdint>
#include <limits>

// Contraction of a*b+c into an FMA, reassociation or x87 excess precision would change
// the bits; refuse to build rather than produce different numbers on some machines.
#if defined(__FAST_MATH__)
#error "detmath.cc must not be compiled with fast-math: its results must be the same bits everywhere"
#endif
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "detmath.cc needs FLT_EVAL_METHOD == 0 (SSE2 / NEON arithmetic, no x87 excess precision)"
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace daisy::detmath {
namespace {

constexpr float kNaNf = std::bit_cast<float>(0x7fc00000u);
constexpr double kNaNd = std::bit_cast<double>(0x7ff8000000000000ull);
constexpr float kInff = std::numeric_limits<float>::infinity();
constexpr double kInfd = std::numeric_limits<double>::infinity();

bool IsNaN(float x) {
  return x != x;
}
bool IsNaN(double x) {
  return x != x;
}

// 2^k as a float, for -126 <= k <= 127 (exact, built from the exponent bits).
float Pow2f(int k) {
  return std::bit_cast<float>(static_cast<uint32_t>(k + 127) << 23);
}
// 2^k as a double, for -1022 <= k <= 1023.
double Pow2d(int k) {
  return std::bit_cast<double>(static_cast<uint64_t>(k + 1023) << 52);
}

// Rounds to the nearest integer, halves away from zero; |t| well inside int range.
int RoundToInt(float t) {
  return static_cast<int>(t >= 0 ? t + 0.5f : t - 0.5f);
}
int RoundToInt(double t) {
  return static_cast<int>(t >= 0 ? t + 0.5 : t - 0.5);
}

// p * 2^k for any k in [-160, 160] with a single rounding at the end (two exact steps
// then one possibly inexact one), so overflow gives inf and underflow a correctly
// rounded subnormal.
float ScaleByPow2(float p, int k) {
  if (k >= -126 && k <= 127) return p * Pow2f(k);
  const int k1 = k / 2;
  return p * Pow2f(k1) * Pow2f(k - k1);
}
double ScaleByPow2(double p, int k) {
  if (k >= -1022 && k <= 1023) return p * Pow2d(k);
  const int k1 = k / 2;
  return p * Pow2d(k1) * Pow2d(k - k1);
}

}  // namespace

// ---- exp, f32 only ---------------------------------------------------------------------
// x = k ln2 + r with |r| <= ln2/2 (+ a little); exp(x) = 2^k exp(r). ln2 is split so that
// k * kLn2Hi is exact (kLn2Hi has 9 significant bits, |k| <= 150) and x - k * kLn2Hi is
// exact too (the difference is a multiple of 2^-25 below 0.5 in magnitude).
// P is the Taylor polynomial of (exp(r) - 1 - r) / r^2 through r^5/7!: truncation error
// below 6e-9 relative (~0.05 ulp) on |r| <= 0.38.
float Exp(float x) {
  if (IsNaN(x)) return kNaNf;
  if (x > 89.0f) return kInff;   // exp(88.7228394) already rounds to inf
  if (x < -104.0f) return 0.0f;  // exp(-103.9721) < 2^-150 rounds to 0
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;     // 355/512
  constexpr float kLn2Lo = -2.12194440e-4f;  // ln2 - kLn2Hi
  const int k = RoundToInt(x * kLog2e);
  const float kf = static_cast<float>(k);
  const float r1 = x - kf * kLn2Hi;  // exact
  const float c = kf * kLn2Lo;       // |c| < 0.032
  const float r = r1 - c;            // rounded; only used in the small r^2 P(r) term
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  // exp(r) = 1 + (r1 + (r^2 P(r) - c)): r1 enters unrounded, so only two roundings of
  // size (the inner sum, then 1 + it) reach the result.
  const float e = 1.0f + (r1 + ((r * r) * p - c));
  return ScaleByPow2(e, k);
}

// ---- exp and log in double (helpers for Tanh, Log and PowD) --------------------------
// Same reduction as Exp with the fdlibm split of ln2 (kLn2Hi has 32 significant bits, so
// k * kLn2Hi is exact for |k| <= 1100); exp(r) by its Taylor series through r^13/13!
// (truncation below 5e-18 on |r| <= 0.35).
double ExpD(double x) {
  if (IsNaN(x)) return kNaNd;
  if (x > 709.8) return kInfd;  // exp(709.7827) is the largest finite double
  if (x < -745.2) return 0.0;   // below 2^-1075
  constexpr double kLog2e = 1.4426950408889634074;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 0x3fe62e42fee00000
  constexpr double kLn2Lo = 1.90821492927058770002e-10;  // 0x3dea39ef35793c76
  const int k = RoundToInt(x * kLog2e);
  const double kd = static_cast<double>(k);
  const double r = (x - kd * kLn2Hi) - kd * kLn2Lo;
  // Coefficients 1/n! for n = 13 down to 2.
  constexpr double kInvFact[] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                                 1.0 / 362880.0,     1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,
                                 1.0 / 120.0,        1.0 / 24.0,        1.0 / 6.0,        0.5};
  double p = kInvFact[0];
  for (int i = 1; i < 12; ++i) p = p * r + kInvFact[i];
  const double e = 1.0 + (r + (r * r) * p);
  return ScaleByPow2(e, k);
}

// x = 2^k m with m in [sqrt(1/2), sqrt(2)); f = m - 1 (exact); s = f / (2 + f);
// log(1 + f) = 2 atanh(s) = f - (f^2/2 - s (f^2/2 + R)), R = sum_{n>=1} 2 s^(2n) / (2n + 1)
// (the fdlibm arrangement, whose large terms are exact). |s| <= 0.1716, s^2 <= 0.0295:
// R through s^20 leaves a truncation below 1e-18.
double LogD(double x) {
  if (IsNaN(x) || x < 0) return kNaNd;
  if (x == 0) return -kInfd;
  if (x == kInfd) return kInfd;
  int k = 0;
  uint64_t bits = std::bit_cast<uint64_t>(x);
  if ((bits >> 52) == 0) {  // subnormal: scale into the normal range first
    bits = std::bit_cast<uint64_t>(x * 0x1p54);
    k = -54;
  }
  k += static_cast<int>(bits >> 52) - 1023;
  double m = std::bit_cast<double>((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
  if (m > 1.4142135623730951) {
    m = m * 0.5;
    k += 1;
  }
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  double r = 2.0 / 21.0;
  for (int n = 9; n >= 1; --n) r = r * z + 2.0 / (2 * n + 1);
  r = r * z;
  const double hfsq = 0.5 * f * f;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  const double kd = static_cast<double>(k);
  // kd * kLn2Hi is exact; the small terms are added before the large ones.
  return kd * kLn2Hi + (f - (hfsq - (s * (hfsq + r) + kd * kLn2Lo)));
}

// ---- tanh ------------------------------------------------------------------------------
// tanh(|x|) = (e - 1) / (e + 1), e = exp(2|x|) in double: e has relative error ~2^-52, so
// e - 1 keeps ~2^-30 relative accuracy down to |x| = 2^-21, far more than the f32 result
// needs. Below that tanh(x) = x - x^3/3 rounds to x; at |x| >= 10, 1 - tanh < 2^-25 so
// the result rounds to 1.
float Tanh(float x) {
  if (IsNaN(x)) return kNaNf;
  const float ax = x < 0 ? -x : x;
  if (ax < 0x1p-21f) return x;  // also keeps the sign of -0
  float t = 1.0f;
  if (ax < 10.0f) {
    const double e = ExpD(2.0 * static_cast<double>(ax));
    t = static_cast<float>((e - 1.0) / (e + 1.0));
  }
  return x < 0 ? -t : t;
}

float Log(float x) {
  if (IsNaN(x) || x < 0) return kNaNf;
  return static_cast<float>(LogD(static_cast<double>(x)));
}

double PowD(double base, double exponent) {
  if (IsNaN(base) || IsNaN(exponent) || base < 0) return kNaNd;
  if (exponent == 0) return 1.0;
  if (base == 0) return exponent > 0 ? 0.0 : kInfd;
  if (base == kInfd) return exponent > 0 ? kInfd : 0.0;
  if (base == 1.0) return 1.0;
  return ExpD(exponent * LogD(base));
}

// ---- sin, cos --------------------------------------------------------------------------
namespace {

// The bits of 2/pi, most significant first, after one word of zeros (so a window may start
// up to 31 bits before the binary point): table bit p (bit 0 = MSB of word 0) is the bit
// of weight 2^-(p - 31). 2/pi = 0.A2F9836E 4E441529 FC2757D1 ... (hex).
constexpr uint32_t kTwoOverPiBits[] = {
    0x00000000, 0xA2F9836E, 0x4E441529, 0xFC2757D1, 0xF534DDC0, 0xDB629599, 0x3C439041, 0xFE5163AB, 0xDEBBC561,
};

// 32 bits of the table starting at bit `pos` (bit 0 is the MSB of word 0).
uint64_t TableBits(int pos) {
  const int w = pos >> 5;
  const int sh = pos & 31;
  const uint32_t hi = kTwoOverPiBits[w];
  if (sh == 0) return hi;
  return static_cast<uint32_t>((hi << sh) | (kTwoOverPiBits[w + 1] >> (32 - sh)));
}

// Exact reduction (Payne-Hanek) of a finite float ax > pi/4: ax = n pi/2 + r with
// |r| <= pi/4, returned in double with relative error ~2^-52, n mod 4 in *quadrant.
// ax = m 2^e (m a 24-bit integer). Bits b_i (weight 2^-i) of 2/pi with i <= e - 2 add
// multiples of 4 to ax * 2/pi, so only the 96-bit window starting at i = e - 1 matters:
// ax * 2/pi = m * W * 2^-94 (mod 4) with W that window; the dropped tail is below
// m 2^-94 < 2^-70. The low 96 bits of m * W hold 2 integer bits and 94 fraction bits.
double ReduceLarge(float ax, int* quadrant) {
  const uint32_t xi = std::bit_cast<uint32_t>(ax);
  const int e = static_cast<int>(xi >> 23) - 150;  // ax = m 2^e; ax > pi/4 so e >= -24
  const uint64_t m = (xi & 0x7fffffu) | 0x800000u;
  const int pos = e - 1 + 31;  // table position of bit i = e - 1 (>= 6)
  const uint64_t w0 = TableBits(pos), w1 = TableBits(pos + 32), w2 = TableBits(pos + 64);
  const uint64_t lo = m * w2;
  const uint64_t mid = m * w1 + (lo >> 32);
  const uint64_t hi = m * w0 + (mid >> 32);
  const uint64_t top = (hi << 32) | (mid & 0xffffffffu);       // bits 32..95: 2 int + 62 frac
  const uint64_t n = (top + (1ull << 61)) >> 62;               // round to nearest (wraps mod 4)
  const int64_t frac = static_cast<int64_t>(top - (n << 62));  // in [-2^61, 2^61)
  *quadrant = static_cast<int>(n & 3);
  const double t = static_cast<double>(frac) + static_cast<double>(lo & 0xffffffffu) * 0x1p-32;
  constexpr double kPiOver2 = 1.57079632679489661923;
  return (t * 0x1p-62) * kPiOver2;
}

// Taylor series on |r| <= pi/4 in double: sin through r^15 (truncation < 5e-17), cos
// through r^16 (< 3e-18).
double SinPoly(double r) {
  const double z = r * r;
  double p = -1.0 / 1307674368000.0;  // -1/15!
  p = p * z + 1.0 / 6227020800.0;
  p = p * z - 1.0 / 39916800.0;
  p = p * z + 1.0 / 362880.0;
  p = p * z - 1.0 / 5040.0;
  p = p * z + 1.0 / 120.0;
  p = p * z - 1.0 / 6.0;
  return r + r * (z * p);
}
double CosPoly(double r) {
  const double z = r * r;
  double p = 1.0 / 20922789888000.0;  // 1/16!
  p = p * z - 1.0 / 87178291200.0;
  p = p * z + 1.0 / 479001600.0;
  p = p * z - 1.0 / 3628800.0;
  p = p * z + 1.0 / 40320.0;
  p = p * z - 1.0 / 720.0;
  p = p * z + 1.0 / 24.0;
  return 1.0 - (0.5 * z - (z * z) * p);
}

// sin (want_cos false) or cos of |x| = n pi/2 + r.
float SinCosAbs(float ax, bool want_cos) {
  // sin(x) = x (1 - x^2/6 ...) rounds to x below 2^-12 (x^2/6 < 2^-26.5, under half an
  // ulp); returning it directly also keeps the sign of -0 in Sin.
  if (!want_cos && ax < 0x1p-12f) return ax;
  int n = 0;
  double r = ax;
  if (ax > 0.785398163397448f) r = ReduceLarge(ax, &n);  // > pi/4 (rounded down to f32)
  if (want_cos) n += 1;                                  // cos(y) = sin(y + pi/2)
  double v;
  switch (n & 3) {
    case 0:
      v = SinPoly(r);
      break;
    case 1:
      v = CosPoly(r);
      break;
    case 2:
      v = -SinPoly(r);
      break;
    default:
      v = -CosPoly(r);
      break;
  }
  return static_cast<float>(v);
}

}  // namespace

float Sin(float x) {
  if (IsNaN(x) || x == kInff || x == -kInff) return kNaNf;
  if (std::signbit(x)) return -SinCosAbs(-x, false);
  return SinCosAbs(x, false);
}

float Cos(float x) {
  if (IsNaN(x) || x == kInff || x == -kInff) return kNaNf;
  return SinCosAbs(x < 0 ? -x : x, true);
}

}  // namespace daisy::detmath
