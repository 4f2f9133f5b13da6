// Internal: the f32 ops of the forward pass, each with one fixed evaluation order (loops
// run in index order, no reassociation; the build has -ffp-contract=off) and
// transcendentals from daisy::detmath only, so every platform computes the same bits.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace daisy::ops {

// out_i = w_i * (x_i * (1 / sqrt(sum_j x_j^2 / n + eps))), the sum in index order.
void RmsNorm(const float* x, const float* w, int n, float eps, float* out);
// RmsNorm of `rows` rows of n values, row r at x + r * ld (out likewise): the bits of
// RmsNorm on each row. The sums of squares of 8 rows run interleaved, each in its own index
// order: one row's adds wait on each other, not on the other rows'.
void RmsNormRows(const float* x, size_t ld, int rows, const float* w, int n, float eps, float* out);
// mean = sum x / n; var = sum (x - mean)^2 / n; out_i = ((x_i - mean) * (1 / sqrt(var + eps))) * w_i + b_i.
void LayerNorm(const float* x, const float* w, const float* b, int n, float eps, float* out);

// HF rotate_half RoPE on one head in place: pairs (i, i + d/2) for i < d/2 rotate by the
// angle whose cos/sin are given (d/2 each):
//   x_i' = x_i * cos_i - x_{i+d/2} * sin_i;  x_{i+d/2}' = x_{i+d/2} * cos_i + x_i * sin_i.
void Rope(float* x, int head_dim, const float* cos, const float* sin);
// cos/sin of angle_i = float(position) * inv_freq_i (one f32 product, as HF).
void RopeAngles(int position, const float* inv_freq, int half, float* cos, float* sin);

// x / (1 + Exp(-x)).
float Silu(float x);
// GPT-2 gelu_new: (0.5 x) * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * ((x * x) * x)))).
float GeluNew(float x);

// Softmax of x[0..n) in place: m = max; e_i = Exp(x_i - m); s = sum e_i in index order;
// x_i = e_i / s. n >= 1, x finite.
void Softmax(float* x, int n);
// Softmax of `rows` rows at once, row r being rows_at[r][0..n[r]): the bits of Softmax on
// each row. The maximum is taken in 8 interleaved chains (a maximum does not round, and Exp
// gives the same for -0 and +0), and the sums of 8 rows run interleaved, each still in its
// own index order, so the adds of one row wait on each other but not on the other rows'.
// Runs in the kernels' row operations (kernels::SoftmaxRows), vectorized per CPU.
void SoftmaxRows(float* const* rows_at, const int* n, int rows);

// Index of the first non-finite value of x[0..n), or -1.
int64_t FirstNonFinite(const float* x, int64_t n);

}  // namespace daisy::ops
