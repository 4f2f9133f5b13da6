// detmath::ExpN: Exp over a row, vectorized by the compiler. Its own translation unit,
// compiled with -fno-trapping-math (src/kernels/CMakeLists.txt): without it GCC may not
// if-convert the selects below (a floating-point operation could raise a flag), so the loop
// would stay scalar. That flag changes no value: no reassociation, no contraction (still
// -ffp-contract=off), no assumption about NaN, infinities or signed zeros; the project
// never reads the floating-point flags. detmath_test checks ExpN against Exp bit for bit.
#include <bit>
#include <cstdint>
#include <limits>

#include "daisy/detmath.h"

#if defined(__FAST_MATH__)
#error "exp_batch.cc must not be compiled with fast-math: its results must be the same bits everywhere"
#endif

namespace daisy::detmath {

void ExpN(float* x, int n) {
  constexpr float kNaNf = std::bit_cast<float>(0x7fc00000u);
  constexpr float kInff = std::numeric_limits<float>::infinity();
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  for (int i = 0; i < n; ++i) {
    const float in = x[i];
    // Exp's special cases, as masks; the arithmetic below runs on 0 for those lanes (any
    // finite value would do: its result is not selected).
    const bool nan = in != in, big = in > 89.0f, small = in < -104.0f;
    const float v = (nan | big | small) ? 0.0f : in;  // bitwise: no branch
    // The same operations as Exp, in the same order.
    const float t = v * kLog2e;
    const float up = t + 0.5f, down = t - 0.5f;  // both computed: a select, not a branch
    const int k = static_cast<int>(t >= 0 ? up : down);
    const float kf = static_cast<float>(k);
    const float r1 = v - kf * kLn2Hi;
    const float c = kf * kLn2Lo;
    const float r = r1 - c;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    const float e = 1.0f + (r1 + ((r * r) * p - c));
    // ScaleByPow2(e, k): one power of two where 2^k is a normal float, else two halves.
    // Both are computed (the unselected one may hold meaningless bits, never UB).
    const int k1 = k / 2;
    const float one_step = e * std::bit_cast<float>(static_cast<uint32_t>(k + 127) << 23);
    const float two_steps = e * std::bit_cast<float>(static_cast<uint32_t>(k1 + 127) << 23) *
                            std::bit_cast<float>(static_cast<uint32_t>(k - k1 + 127) << 23);
    float y = ((k >= -126) & (k <= 127)) ? one_step : two_steps;
    y = small ? 0.0f : y;
    y = big ? kInff : y;
    x[i] = nan ? kNaNf : y;
  }
}

}  // namespace daisy::detmath
