// Deterministic f32 transcendentals built only from IEEE basic operations (+, -, *, /,
// sqrt, comparisons, bit manipulation), so results are the same bits on every platform,
// compiler and libc (glibc, macOS, Android libm all differ). Used by every f32 op of the
// forward pass: softmax (Exp), GELU (Tanh), SiLU (Exp), RoPE (Sin, Cos). Pure functions,
// thread-safe. Accuracy (max ulp error vs a correctly rounded result) is in docs/KERNELS.md.
//
// Every NaN result is the canonical quiet NaN 0x7fc00000 (never a payload or sign that
// depends on the CPU). The default floating-point environment is assumed: round to
// nearest even, no flush-to-zero / denormals-are-zero.
#pragma once

namespace daisy::detmath {

// exp(x). Uses only f32 operations (a SIMD f32 backend can reproduce it lane by lane).
// Correct 0 below -103.97 (subnormal results are produced, rounded once), +inf above
// ln(FLT_MAX); Exp(-inf) = 0, Exp(+inf) = +inf.
float Exp(float x);
// Exp of n values in place: x[i] = Exp(x[i]), the same bits lane by lane. Written without
// branches (both paths computed, then selected) so the compiler vectorizes it with the
// baseline ISA: softmax and SiLU call it on whole rows.
void ExpN(float* x, int n);
// tanh(x) over all floats; +-1 for |x| >= 10, x itself for tiny |x|.
float Tanh(float x);
// Sin and Cos of a float argument (RoPE angles reach ~1e6 rad for long contexts, so the
// argument reduction must be exact enough for large |x|: it is exact for every finite
// float, see docs/KERNELS.md). Non-finite arguments give NaN.
float Sin(float x);
float Cos(float x);
// Natural logarithm: Log(0) = -inf, Log(x < 0) = NaN, Log(+inf) = +inf. For log-softmax.
float Log(float x);
// Pow computed in double where the forward pass needs a double-precision power, e.g. RoPE
// frequencies theta^(-2i/d): Pow(base, e) = exp(e * log(base)) from the same basic ops.
// Defined for base >= 0 (0^e is 0 for e > 0, +inf for e < 0); x^0 = 1; a negative or NaN
// base or a NaN exponent gives NaN.
double PowD(double base, double exponent);
// The double-precision helpers behind Tanh and PowD (relative error below ~2^-51).
double ExpD(double x);
double LogD(double x);

}  // namespace daisy::detmath
