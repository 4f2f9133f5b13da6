// Quantization of activations and weights (the "Q" half of the verified units).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "daisy/kernels.h"

namespace daisy::kernels {

bool QuantizeRow(const float* x, int k, int8_t* q, float* scale) {
  // amax on the bits: with the sign cleared, the order of finite floats is the order of
  // their bit patterns as integers, and inf / NaN are exactly the patterns >= 0x7f800000,
  // so one integer max (no branch, vectorized) gives both amax and the non-finite check.
  uint32_t amax_bits = 0;
  for (int i = 0; i < k; ++i) {
    uint32_t b;
    std::memcpy(&b, &x[i], 4);
    b &= 0x7fffffffu;
    amax_bits = b > amax_bits ? b : amax_bits;
  }
  if (amax_bits >= 0x7f800000u) return false;
  float amax;
  std::memcpy(&amax, &amax_bits, 4);
  // A zero row, or one so tiny (amax < ~1e-43) that amax / 127 underflows to 0, quantizes
  // to zeros with scale 0: dividing by a zero scale would give 0 / 0 = NaN, whose conversion
  // to int8 differs between CPUs.
  const float s = amax / 127.0f;
  if (s == 0.0f) {
    std::memset(q, 0, static_cast<size_t>(k));
    *scale = 0.0f;
    return true;
  }
  // Round half to even in the default rounding mode (which the project never changes),
  // without a libm call: |x_i / s| <= 127.x, and adding then subtracting 1.5 * 2^23 leaves
  // exactly the nearest integer, ties to even (the constant is even, so parity is kept).
  // The result equals nearbyint(x_i / s) except that -0.0 becomes +0.0: both give int8 0.
  // The division (not a multiplication by 1/s) is part of the contract.
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  for (int i = 0; i < k; ++i) {
    float r = (x[i] / s + kRound) - kRound;
    r = r > 127.0f ? 127.0f : r;
    r = r < -127.0f ? -127.0f : r;
    q[i] = static_cast<int8_t>(r);
  }
  *scale = s;
  return true;
}

Result<QuantizedMatrix> QuantizeMatrix(std::span<const float> w, int n, int k, std::span<const float> bias,
                                       std::string_view what) {
  if (n <= 0 || k <= 0) return InvalidArgument(std::string(what) + ": empty matrix");
  if (k > kMaxK)
    return Unimplemented(std::string(what) + ": reduction length " + std::to_string(k) +
                         " exceeds the int8 unit's limit of " + std::to_string(kMaxK));
  if (w.size() != static_cast<size_t>(n) * static_cast<size_t>(k))
    return Internal("Bug: " + std::string(what) + ": weight size does not match its shape");
  if (!bias.empty() && bias.size() != static_cast<size_t>(n))
    return Internal("Bug: " + std::string(what) + ": bias size does not match");
  QuantizedMatrix m;
  m.n = n;
  m.k = k;
  m.q.resize(static_cast<size_t>(n) * static_cast<size_t>(k));
  m.scale.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (!QuantizeRow(w.data() + static_cast<size_t>(r) * k, k, m.q.data() + static_cast<size_t>(r) * k,
                     &m.scale[static_cast<size_t>(r)]))
      return InvalidArgument(std::string(what) + ": non-finite weight in row " + std::to_string(r));
  }
  m.bias.assign(bias.begin(), bias.end());
  for (float b : m.bias)
    if (!std::isfinite(b)) return InvalidArgument(std::string(what) + ": non-finite bias");
  return m;
}

}  // namespace daisy::kernels
