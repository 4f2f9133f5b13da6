// The live audit: random cells of a finished product re-computed by the scalar reference.
#include <cstring>

#include "internal.h"

namespace daisy::kernels {

AuditResult AuditCells(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, const float* y,
                       size_t ldy, int n_cells, uint64_t seed) {
  AuditResult result;
  if (m <= 0 || w.n <= 0 || n_cells <= 0) return result;
  const int64_t total = int64_t{m} * w.n;
  const bool every_cell = n_cells >= total;
  const int64_t count = every_cell ? total : n_cells;
  for (int64_t c = 0; c < count; ++c) {
    int64_t cell = c;
    if (!every_cell) cell = static_cast<int64_t>(internal::SplitMix64(seed * 0x100000001B3ULL + c) % total);
    const int i = static_cast<int>(cell / w.n);
    const int j = static_cast<int>(cell % w.n);
    const float want = scalar::Cell(xq + static_cast<size_t>(i) * ldx, xscale[i], w, j);
    const float got = y[static_cast<size_t>(i) * ldy + static_cast<size_t>(j)];
    ++result.checked;
    // Bits, not ==: a NaN payload or the sign of a zero counts.
    uint32_t want_bits, got_bits;
    std::memcpy(&want_bits, &want, 4);
    std::memcpy(&got_bits, &got, 4);
    if (want_bits == got_bits) continue;
    if (result.mismatches++ == 0) {
      result.row = i;
      result.col = j;
      result.expected = want;
      result.got = got;
    }
  }
  return result;
}

}  // namespace daisy::kernels
