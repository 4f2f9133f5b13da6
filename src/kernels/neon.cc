// NEON dot-product backend (arm64). Compiled alone with -march=armv8.2-a+dotprod, and only
// when building for aarch64; dispatch.cc calls it only when getauxval(AT_HWCAP) reports
// HWCAP_ASIMDDP. See backends.h for the rule that keeps ISA-flagged code out of shared
// symbols.
//
// sdot multiplies signed bytes by signed bytes and adds groups of four products into each
// int32 lane: exact, no bias trick needed; the lanes add exactly because the whole sum lies
// in int32 (|x|, |w| <= 127, k <= kMaxK).
#include <arm_neon.h>

#include <cstring>

#include "backends.h"

namespace daisy::kernels::neon {
namespace {

// The four horizontal sums of a0..a3 as one vector (integer adds: any order is exact).
inline int32x4_t Reduce4(int32x4_t a0, int32x4_t a1, int32x4_t a2, int32x4_t a3) {
  return vpaddq_s32(vpaddq_s32(a0, a1), vpaddq_s32(a2, a3));
}

// acc[i][r] = sum_t x_i[t] * w_r[t] for MR x rows and kNr weight rows.
template <int MR>
inline void Tile(const int8_t* const* xr, const int8_t* const* wr, int k, int32_t (*acc_out)[kNr]) {
  int32x4_t acc[MR][kNr];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < kNr; ++r) acc[i][r] = vdupq_n_s32(0);
  auto step = [&](const int8_t* const* xp, const int8_t* const* wp, int t) {
    int8x16_t wv[kNr];
#pragma GCC unroll 4
    for (int r = 0; r < kNr; ++r) wv[r] = vld1q_s8(wp[r] + t);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const int8x16_t xv = vld1q_s8(xp[i] + t);
#pragma GCC unroll 4
      for (int r = 0; r < kNr; ++r) acc[i][r] = vdotq_s32(acc[i][r], xv, wv[r]);
    }
  };
  int t = 0;
  for (; t + 16 <= k; t += 16) step(xr, wr, t);
  if (t < k) {
    // Tail: copy the last k - t bytes into zero-padded blocks so no load passes a row's end.
    alignas(16) int8_t xb[MR][16] = {};
    alignas(16) int8_t wb[kNr][16] = {};
    const int8_t* xp[MR];
    const int8_t* wp[kNr];
    for (int i = 0; i < MR; ++i) {
      std::memcpy(xb[i], xr[i] + t, static_cast<size_t>(k - t));
      xp[i] = xb[i];
    }
    for (int r = 0; r < kNr; ++r) {
      std::memcpy(wb[r], wr[r] + t, static_cast<size_t>(k - t));
      wp[r] = wb[r];
    }
    step(xp, wp, 0);
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) vst1q_s32(acc_out[i], Reduce4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
}

// One x row against kNr weight rows, one weight row after the other so the weights stream
// in address order (the decode GEMV is memory-bound; on x86 four interleaved row streams
// halved the bandwidth, and sequential streams suit every hardware prefetcher).
inline void RowByRow(const int8_t* xr, const int8_t* const* wr, int k, int32_t* out) {
  int32x4_t d[kNr];
  for (int r = 0; r < kNr; ++r) {
    int32x4_t a0 = vdupq_n_s32(0), a1 = a0;  // two chains through sdot
    const int8_t* w = wr[r];
    int t = 0;
    for (; t + 32 <= k; t += 32) {
      a0 = vdotq_s32(a0, vld1q_s8(xr + t), vld1q_s8(w + t));
      a1 = vdotq_s32(a1, vld1q_s8(xr + t + 16), vld1q_s8(w + t + 16));
    }
    if (t + 16 <= k) {
      a0 = vdotq_s32(a0, vld1q_s8(xr + t), vld1q_s8(w + t));
      t += 16;
    }
    if (t < k) {
      // Tail: zero-padded copies so no load passes a row's end.
      alignas(16) int8_t xb[16] = {}, wb[16] = {};
      std::memcpy(xb, xr + t, static_cast<size_t>(k - t));
      std::memcpy(wb, w + t, static_cast<size_t>(k - t));
      a1 = vdotq_s32(a1, vld1q_s8(xb), vld1q_s8(wb));
    }
    d[r] = vaddq_s32(a0, a1);
  }
  vst1q_s32(out, Reduce4(d[0], d[1], d[2], d[3]));
}

// The same IEEE sequence as the scalar reference: s = xs * ws; v = float(acc) * s; v + b.
// -ffp-contract=off (global) keeps the compiler from fusing the multiply and the add.
inline float Epilogue(int32_t acc, float xs, const QMatrixView& w, int j) {
  const float ws = w.scale ? w.scale[j] : 1.0f;
  const float s = xs * ws;
  float v = static_cast<float>(acc) * s;
  if (w.bias) v = v + w.bias[j];
  return v;
}

// ---- Interleaved weights (QMatrixView::tile_stride > 0): the KV cache's keys and values ----
// Group g of a tile is 16 rows x 4 bytes in 4 q registers (rows 4q .. 4q + 3 in register q);
// sdot by lane multiplies each row's 4 bytes by x's 4 bytes of group g, taken from a
// 16-byte load of x that covers 4 groups (lane g % 4): one accumulator per 4 rows, so a
// row's sum is one lane and needs no reduction. Up to kInterleavedXRows x rows per pass:
// 16 accumulators + 4 weights + 4 x in 32 q registers.
constexpr int kInterleavedXRows = 4;

// acc[s][i][q] += group g's 4 q registers times x row i's group in lane L of xv[i]. S sets
// of accumulators take turns (set L % S) so that one or two x rows still keep 8 or more sdot chains
// in flight.
template <int MR, int S, int L>
inline void InterleavedGroup(const int8_t* grp, const int8x16_t* xv, int32x4_t (*acc)[MR][4]) {
  int8x16_t wv[4];
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) wv[q] = vld1q_s8(grp + 16 * q);
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) acc[L % S][i][q] = vdotq_laneq_s32(acc[L % S][i][q], wv[q], xv[i], L);
}

// out[i][c] = sum_t x_i[t] * W(tile row c, t) for the MR x rows xr and all 16 rows of the
// tile whose group 0 is at `tile` (rows outside the product are computed and discarded:
// the view allows reading them).
template <int MR>
inline void InterleavedTile(const int8_t* tile, size_t group_stride, int groups, const int8_t* const* xr,
                            int32_t (*out)[kInterleavedRows]) {
  constexpr int S = MR <= 2 ? 2 : 1;
  int32x4_t acc[S][MR][4];
#pragma GCC unroll 2
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) acc[s][i][q] = vdupq_n_s32(0);
  int8x16_t xv[MR];
  const int8_t* grp = tile;
  int g = 0;
  for (; g + 4 <= groups; g += 4) {
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) xv[i] = vld1q_s8(xr[i] + 4 * g);
    InterleavedGroup<MR, S, 0>(grp, xv, acc);
    InterleavedGroup<MR, S, 1>(grp + group_stride, xv, acc);
    InterleavedGroup<MR, S, 2>(grp + 2 * group_stride, xv, acc);
    InterleavedGroup<MR, S, 3>(grp + 3 * group_stride, xv, acc);
    grp += 4 * group_stride;
  }
  // The last 1 to 3 groups: 4 bytes of x each (a 16-byte load could pass the row's end).
  for (; g < groups; ++g, grp += group_stride) {
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      int32_t four;
      std::memcpy(&four, xr[i] + 4 * g, 4);
      xv[i] = vreinterpretq_s8_s32(vdupq_n_s32(four));
    }
    InterleavedGroup<MR, S, 0>(grp, xv, acc);
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q)
      vst1q_s32(out[i] + 4 * q, S == 2 ? vaddq_s32(acc[0][i][q], acc[S - 1][i][q]) : acc[0][i][q]);
}

// y[j] for view rows j = base + c, lo <= c < hi, of one x row: Epilogue's operations, four
// rows at a time where all four are wanted (the same IEEE operations lane by lane:
// scvtf, then s = xs * ws, v * s, v + b), else one by one.
inline void InterleavedEpilogue(const int32_t* acc, float xs, const QMatrixView& w, int base, int lo, int hi,
                                float* yr) {
  for (int c = lo; c < hi;) {
    const int j = base + c;
    if (c % 4 == 0 && c + 4 <= hi) {
      const float32x4_t ws = w.scale ? vld1q_f32(w.scale + j) : vdupq_n_f32(1.0f);
      const float32x4_t s = vmulq_f32(vdupq_n_f32(xs), ws);
      float32x4_t v = vmulq_f32(vcvtq_f32_s32(vld1q_s32(acc + c)), s);
      if (w.bias) v = vaddq_f32(v, vld1q_f32(w.bias + j));
      vst1q_f32(yr + j, v);
      c += 4;
    } else {
      yr[j] = Epilogue(acc[c], xs, w, j);
      ++c;
    }
  }
}

void InterleavedProduct(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y,
                        size_t ldy, int col_begin, int col_end) {
  const int groups = w.k / 4;
  const InterleavedTiles tiles = TilesOf(w, col_begin, col_end);
  // Tile by tile, every x row against it: the tile's groups stay in cache across x blocks.
  for (int t = tiles.begin; t < tiles.end; ++t) {
    const int8_t* tile = w.q + static_cast<size_t>(t) * w.tile_stride;
    const auto [base, lo, hi] = LanesOf(w, t, col_begin, col_end);
    for (int i = 0; i < m;) {
      const int mr = m - i < kInterleavedXRows ? m - i : kInterleavedXRows;
      const int8_t* xr[kInterleavedXRows];
      for (int ii = 0; ii < mr; ++ii) xr[ii] = xq + static_cast<size_t>(i + ii) * ldx;
      alignas(16) int32_t acc[kInterleavedXRows][kInterleavedRows];
      switch (mr) {
        case 1:
          InterleavedTile<1>(tile, w.group_stride, groups, xr, acc);
          break;
        case 2:
          InterleavedTile<2>(tile, w.group_stride, groups, xr, acc);
          break;
        case 3:
          InterleavedTile<3>(tile, w.group_stride, groups, xr, acc);
          break;
        default:
          InterleavedTile<4>(tile, w.group_stride, groups, xr, acc);
          break;
      }
      for (int ii = 0; ii < mr; ++ii)
        InterleavedEpilogue(acc[ii], xscale[i + ii], w, base, lo, hi, y + static_cast<size_t>(i + ii) * ldy);
      i += mr;
    }
  }
}

}  // namespace

void MatMulQ(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy,
             int col_begin, int col_end) {
  if (m <= 0 || col_begin >= col_end) return;
  if (w.tile_stride != 0) {  // interleaved (not w.interleaved(): see backends.h)
    InterleavedProduct(xq, xscale, m, ldx, w, y, ldy, col_begin, col_end);
    return;
  }
  const int k = w.k;
  // Row panels of about 192 KiB of x stay in cache while the panel's weight tiles stream by.
  const int mc = k > 0 ? RowPanelRows(k, kMr) : m;
  for (int i0 = 0; i0 < m; i0 += mc) {
    const int i1 = m - i0 < mc ? m : i0 + mc;
    for (int j = col_begin; j < col_end; j += kNr) {
      const int nr = col_end - j < kNr ? col_end - j : kNr;
      // A column tail repeats its last row: valid memory, results discarded.
      const int8_t* wr[kNr];
      for (int r = 0; r < kNr; ++r) wr[r] = w.q + static_cast<size_t>(j + (r < nr ? r : nr - 1)) * w.ld;
      for (int i = i0; i < i1;) {
        const int mr = i1 - i < kMr ? i1 - i : kMr;
        const int8_t* xr[kMr];
        for (int ii = 0; ii < mr; ++ii) xr[ii] = xq + static_cast<size_t>(i + ii) * ldx;
        int32_t acc[kMr][kNr];
        switch (mr) {
          case 1:
            RowByRow(xr[0], wr, k, acc[0]);
            break;
          case 2:
            Tile<2>(xr, wr, k, acc);
            break;
          case 3:
            Tile<3>(xr, wr, k, acc);
            break;
          default:
            Tile<4>(xr, wr, k, acc);
            break;
        }
        for (int ii = 0; ii < mr; ++ii) {
          float* yr = y + static_cast<size_t>(i + ii) * ldy;
          for (int r = 0; r < nr; ++r) yr[j + r] = Epilogue(acc[ii][r], xscale[i + ii], w, j + r);
        }
        i += mr;
      }
    }
  }
}

}  // namespace daisy::kernels::neon
