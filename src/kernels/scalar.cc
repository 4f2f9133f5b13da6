// The scalar backend: the algorithmic reference and the fallback. Deliberately naive and
// shares no code with the SIMD backends, so a gate comparison is a real cross-check.
#include "backends.h"

namespace daisy::kernels::scalar {

float Cell(const int8_t* xr, float xs, const QMatrixView& w, int j) {
  // Exact: |x|, |w| <= 127 and k <= kMaxK keep every partial sum inside int32.
  int32_t acc = 0;
  if (w.interleaved()) {
    for (int t = 0; t < w.k; ++t) acc += static_cast<int32_t>(xr[t]) * static_cast<int32_t>(*w.At(j, t));
  } else {
    const int8_t* wr = w.q + static_cast<size_t>(j) * w.ld;
    for (int t = 0; t < w.k; ++t) acc += static_cast<int32_t>(xr[t]) * static_cast<int32_t>(wr[t]);
  }
  // Epilogue: one fixed order of IEEE operations (docs/KERNELS.md).
  const float ws = w.scale ? w.scale[j] : 1.0f;
  const float s = xs * ws;
  float v = static_cast<float>(acc) * s;
  if (w.bias) v = v + w.bias[j];
  return v;
}

void MatMulQ(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy,
             int col_begin, int col_end) {
  for (int i = 0; i < m; ++i) {
    const int8_t* xr = xq + static_cast<size_t>(i) * ldx;
    for (int j = col_begin; j < col_end; ++j)
      y[static_cast<size_t>(i) * ldy + static_cast<size_t>(j)] = Cell(xr, xscale[i], w, j);
  }
}

}  // namespace daisy::kernels::scalar
