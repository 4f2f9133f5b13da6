// Quantization of activations and weights (the "Q" half of the verified units).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "daisy/kernels.h"

namespace daisy::kernels {

// QuantizeRow itself is in rowops.inc (one source, compiled for each vector width).

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
