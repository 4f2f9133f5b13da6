// Quantization of activations and weights (the "Q" half of the verified units).
#include <cmath>
#include <cstring>

#include "daisy/kernels.h"

namespace daisy::kernels {

bool QuantizeRow(const float* x, int k, int8_t* q, float* scale) {
  float amax = 0.0f;
  for (int i = 0; i < k; ++i) {
    float v = x[i];
    if (!std::isfinite(v)) return false;
    float a = std::fabs(v);
    if (a > amax) amax = a;
  }
  // A zero row, or one so tiny (amax < ~1e-43) that amax / 127 underflows to 0, quantizes
  // to zeros with scale 0: dividing by a zero scale would give 0 / 0 = NaN, whose conversion
  // to int8 differs between CPUs.
  const float s = amax / 127.0f;
  if (s == 0.0f) {
    std::memset(q, 0, static_cast<size_t>(k));
    *scale = 0.0f;
    return true;
  }
  for (int i = 0; i < k; ++i) {
    // nearbyint rounds half to even in the default rounding mode, which the project never
    // changes; the division (not a multiplication by 1/s) is part of the contract.
    float r = std::nearbyint(x[i] / s);
    if (r > 127.0f) r = 127.0f;
    if (r < -127.0f) r = -127.0f;
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
