#include "ops.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "daisy/detmath.h"
#include "daisy/kernels.h"

namespace daisy::ops {

void RmsNorm(const float* x, const float* w, int n, float eps, float* out) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float ms = ss / static_cast<float>(n);
  // sqrt is IEEE correctly rounded, so this is the same everywhere (no rsqrt estimate).
  const float inv = 1.0f / std::sqrt(ms + eps);
  for (int i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

void RmsNormRows(const float* x, size_t ld, int rows, const float* w, int n, float eps, float* out) {
  constexpr int kG = 8;
  for (int r0 = 0; r0 < rows; r0 += kG) {
    const int g = rows - r0 < kG ? rows - r0 : kG;
    if (g == 1) {  // a decode step's row: one chain (the 8 below would do 8 times its work)
      RmsNorm(x + static_cast<size_t>(r0) * ld, w, n, eps, out + static_cast<size_t>(r0) * ld);
      continue;
    }
    // Rows past g repeat the first; their sums are not used.
    const float* xr[kG];
    for (int j = 0; j < kG; ++j) xr[j] = x + static_cast<size_t>(r0 + (j < g ? j : 0)) * ld;
    float ss[kG] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < kG; ++j) ss[j] += xr[j][i] * xr[j][i];
    for (int j = 0; j < g; ++j) {
      const float ms = ss[j] / static_cast<float>(n);
      const float inv = 1.0f / std::sqrt(ms + eps);
      float* o = out + static_cast<size_t>(r0 + j) * ld;
      for (int i = 0; i < n; ++i) o[i] = w[i] * (xr[j][i] * inv);
    }
  }
}

void LayerNorm(const float* x, const float* w, const float* b, int n, float eps, float* out) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(n);
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float d = x[i] - mean;
    ss += d * d;
  }
  const float var = ss / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(var + eps);
  for (int i = 0; i < n; ++i) out[i] = ((x[i] - mean) * inv) * w[i] + b[i];
}

void Rope(float* x, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float a = x[i];
    const float b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i] + a * sin[i];
  }
}

void RopeAngles(int position, const float* inv_freq, int half, float* cos, float* sin) {
  const float p = static_cast<float>(position);  // exact: positions < 2^24
  for (int i = 0; i < half; ++i) {
    const float angle = p * inv_freq[i];
    cos[i] = detmath::Cos(angle);
    sin[i] = detmath::Sin(angle);
  }
}

float Silu(float x) {
  return x / (1.0f + detmath::Exp(-x));
}

float GeluNew(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  const float inner = x + 0.044715f * ((x * x) * x);
  return (0.5f * x) * (1.0f + detmath::Tanh(kSqrt2OverPi * inner));
}

void Softmax(float* x, int n) {
  float m = x[0];
  for (int i = 1; i < n; ++i)
    if (x[i] > m) m = x[i];
  // e_i = Exp(x_i - m) over the row at once (ExpN: the same bits, vectorized), then the sum
  // in index order and the division, as before.
  for (int i = 0; i < n; ++i) x[i] = x[i] - m;
  detmath::ExpN(x, n);
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += x[i];
  for (int i = 0; i < n; ++i) x[i] = x[i] / s;
}

void SoftmaxRows(float* const* rows_at, const int* n, int rows) {
  kernels::SoftmaxRows(rows_at, n, rows);
}

int64_t FirstNonFinite(const float* x, int64_t n) {
  // Exponent all ones = inf or NaN; a bit test stays correct whatever the FP flags. Blocks
  // are tested without an early exit, so the compiler vectorizes the test (element by
  // element with an exit it stayed scalar: 2% of a 512-token prefill, once per layer); only
  // a block that holds one is searched.
  constexpr int64_t kBlock = 256;
  auto bad = [x](int64_t i) { return (std::bit_cast<uint32_t>(x[i]) & 0x7f800000u) == 0x7f800000u; };
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    bool any = false;
    for (int64_t i = b; i < e; ++i) any |= bad(i);
    if (!any) continue;
    for (int64_t i = b; i < e; ++i)
      if (bad(i)) return i;
  }
  return -1;
}

}  // namespace daisy::ops
