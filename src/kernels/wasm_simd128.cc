// WebAssembly SIMD128 backend (the browser node). Compiled alone with -msimd128, and only
// when building for wasm32 with Emscripten (tests/wasm/CMakeLists.txt). A wasm engine
// validates a whole module before running any of it, so a module holding this unit loads
// only where SIMD128 runs: there is no run-time feature test to make, and the unit is
// gated against scalar at start-up like every other. See backends.h for the rule that
// keeps ISA-flagged code out of shared symbols.
//
// Both operands are sign-extended to int16 and multiplied with i32x4.dot_i16x8_s, which adds
// two int16 x int16 products into an int32 lane (as AVX2's vpmaddwd): |product| <= 127 * 127,
// so the pair sum is exact. The int32 lanes then add exactly because the whole sum lies in
// int32 (|x|, |w| <= 127, k <= kMaxK), so no order of the adds can change a bit.
#include <wasm_simd128.h>

#include <cstring>

#include "backends.h"

namespace daisy::kernels::wasm {
namespace {

// The four horizontal sums of a0..a3 as one vector (integer adds: any order is exact).
inline v128_t Reduce4(v128_t a0, v128_t a1, v128_t a2, v128_t a3) {
  // Transpose-free: interleave lanes pairwise, add, then again.
  const v128_t s01 = wasm_i32x4_add(wasm_i32x4_shuffle(a0, a1, 0, 4, 1, 5), wasm_i32x4_shuffle(a0, a1, 2, 6, 3, 7));
  const v128_t s23 = wasm_i32x4_add(wasm_i32x4_shuffle(a2, a3, 0, 4, 1, 5), wasm_i32x4_shuffle(a2, a3, 2, 6, 3, 7));
  // s01 = (a0[0]+a0[2], a1[0]+a1[2], a0[1]+a0[3], a1[1]+a1[3]), s23 likewise.
  return wasm_i32x4_add(wasm_i32x4_shuffle(s01, s23, 0, 1, 4, 5), wasm_i32x4_shuffle(s01, s23, 2, 3, 6, 7));
}

// 16 int8 at p as two vectors of eight int16 (low and high halves).
struct Wide {
  v128_t lo, hi;
};
inline Wide Load16(const int8_t* p) {
  const v128_t v = wasm_v128_load(p);
  return Wide{wasm_i16x8_extend_low_i8x16(v), wasm_i16x8_extend_high_i8x16(v)};
}

// acc + the eight pair sums of x . w over 16 int8 (two dot instructions).
inline v128_t Dot16(v128_t acc, const Wide& x, const Wide& w) {
  acc = wasm_i32x4_add(acc, wasm_i32x4_dot_i16x8(x.lo, w.lo));
  return wasm_i32x4_add(acc, wasm_i32x4_dot_i16x8(x.hi, w.hi));
}

// acc[i][r] = sum_t x_i[t] * w_r[t] for MR x rows and kNr weight rows.
template <int MR>
inline void Tile(const int8_t* const* xr, const int8_t* const* wr, int k, int32_t (*acc_out)[kNr]) {
  v128_t acc[MR][kNr];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < kNr; ++r) acc[i][r] = wasm_i32x4_splat(0);
  auto step = [&](const int8_t* const* xp, const int8_t* const* wp, int t) {
    Wide wv[kNr];
    for (int r = 0; r < kNr; ++r) wv[r] = Load16(wp[r] + t);
    for (int i = 0; i < MR; ++i) {
      const Wide xv = Load16(xp[i] + t);
      for (int r = 0; r < kNr; ++r) acc[i][r] = Dot16(acc[i][r], xv, wv[r]);
    }
  };
  int t = 0;
  for (; t + kLanes <= k; t += kLanes) step(xr, wr, t);
  if (t < k) {
    // Tail: copy the last k - t bytes into zero-padded blocks so no load passes a row's end.
    alignas(16) int8_t xb[MR][kLanes] = {};
    alignas(16) int8_t wb[kNr][kLanes] = {};
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
  for (int i = 0; i < MR; ++i) wasm_v128_store(acc_out[i], Reduce4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
}

// One x row against kNr weight rows, one weight row after the other so the weights stream
// in address order (the decode GEMV reads each weight once).
inline void RowByRow(const int8_t* xr, const int8_t* const* wr, int k, int32_t* out) {
  v128_t d[kNr];
  for (int r = 0; r < kNr; ++r) {
    v128_t a0 = wasm_i32x4_splat(0), a1 = a0;  // two chains of adds
    const int8_t* w = wr[r];
    int t = 0;
    for (; t + 2 * kLanes <= k; t += 2 * kLanes) {
      a0 = Dot16(a0, Load16(xr + t), Load16(w + t));
      a1 = Dot16(a1, Load16(xr + t + kLanes), Load16(w + t + kLanes));
    }
    if (t + kLanes <= k) {
      a0 = Dot16(a0, Load16(xr + t), Load16(w + t));
      t += kLanes;
    }
    if (t < k) {
      // Tail: zero-padded copies so no load passes a row's end.
      alignas(16) int8_t xb[kLanes] = {}, wb[kLanes] = {};
      std::memcpy(xb, xr + t, static_cast<size_t>(k - t));
      std::memcpy(wb, w + t, static_cast<size_t>(k - t));
      a1 = Dot16(a1, Load16(xb), Load16(wb));
    }
    d[r] = wasm_i32x4_add(a0, a1);
  }
  wasm_v128_store(out, Reduce4(d[0], d[1], d[2], d[3]));
}

// The same IEEE sequence as the scalar reference: s = xs * ws; v = float(acc) * s; v + b.
// wasm's f32 operations are IEEE binary32 with round-to-nearest-even and no fused forms
// (SIMD128 has no FMA; -ffp-contract=off is global), so each step rounds as on x86.
inline float Epilogue(int32_t acc, float xs, const QMatrixView& w, int j) {
  const float ws = w.scale ? w.scale[j] : 1.0f;
  const float s = xs * ws;
  float v = static_cast<float>(acc) * s;
  if (w.bias) v = v + w.bias[j];
  return v;
}

// ---- Interleaved weights (QMatrixView::tile_stride > 0): the KV cache's keys and values ----
// A group's 16 bytes of four rows (4 bytes each) widen to two int16 vectors of two rows, and
// i32x4.dot_i16x8_s against the x row's 4 bytes of that group (widened, repeated) gives two
// int32 lanes per row, each the sum of two products; a row's two lanes are added once, after
// the last group (integer adds: exact in any order, as above). A pass covers `4 * Q` rows of
// a tile for `MR` x rows: 2 * MR * Q accumulators, so 8 with one x row on the whole tile or
// two x rows on half of it, leaving registers for the weights and x on x86's 16 xmm.
template <int MR, int Q>
inline void InterleavedPass(const int8_t* const* xr, const int8_t* tile, size_t group_stride, int groups, int c0,
                            int32_t (*sums)[kInterleavedRows]) {
  v128_t acc[MR][2 * Q];
  for (int i = 0; i < MR; ++i)
    for (int a = 0; a < 2 * Q; ++a) acc[i][a] = wasm_i32x4_splat(0);
  const int8_t* grp = tile + static_cast<size_t>(c0) * 4;  // row c0's bytes in group 0
  for (int g = 0; g < groups; ++g, grp += group_stride) {
    v128_t xv[MR];  // [x0 x1 x2 x3 x0 x1 x2 x3]: a 4-byte load, never past the row's k bytes
    for (int i = 0; i < MR; ++i) xv[i] = wasm_i16x8_extend_low_i8x16(wasm_v128_load32_splat(xr[i] + 4 * g));
    for (int q = 0; q < Q; ++q) {
      const v128_t v = wasm_v128_load(grp + 16 * q);  // rows c0 + 4q .. c0 + 4q + 3
      const v128_t lo = wasm_i16x8_extend_low_i8x16(v), hi = wasm_i16x8_extend_high_i8x16(v);
      for (int i = 0; i < MR; ++i) {
        acc[i][2 * q] = wasm_i32x4_add(acc[i][2 * q], wasm_i32x4_dot_i16x8(xv[i], lo));
        acc[i][2 * q + 1] = wasm_i32x4_add(acc[i][2 * q + 1], wasm_i32x4_dot_i16x8(xv[i], hi));
      }
    }
  }
  // acc[i][2q] = (r0, r0, r1, r1) and acc[i][2q + 1] = (r2, r2, r3, r3): add each row's pair.
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < Q; ++q) {
      const v128_t a = acc[i][2 * q], b = acc[i][2 * q + 1];
      wasm_v128_store(sums[i] + c0 + 4 * q,
                      wasm_i32x4_add(wasm_i32x4_shuffle(a, b, 0, 2, 4, 6), wasm_i32x4_shuffle(a, b, 1, 3, 5, 7)));
    }
}

// Tile rows [lo, hi) for MR x rows, in passes of 4 * Q rows aligned in the tile: a pass may
// read rows of its groups outside [lo, hi) (allowed), whose sums are never written out.
template <int MR, int Q>
inline void InterleavedRows(const int8_t* const* xr, const int8_t* tile, size_t group_stride, int groups, int lo,
                            int hi, int32_t (*sums)[kInterleavedRows]) {
  for (int c0 = lo - lo % (4 * Q); c0 < hi; c0 += 4 * Q)
    InterleavedPass<MR, Q>(xr, tile, group_stride, groups, c0, sums);
}

void InterleavedProduct(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y,
                        size_t ldy, int col_begin, int col_end) {
  const int groups = w.k / 4;
  const InterleavedTiles tiles = TilesOf(w, col_begin, col_end);
  for (int t = tiles.begin; t < tiles.end; ++t) {
    const int8_t* tile = w.q + static_cast<size_t>(t) * w.tile_stride;
    const auto [base, lo, hi] = LanesOf(w, t, col_begin, col_end);
    for (int i = 0; i < m;) {
      const int mr = m - i < 2 ? 1 : 2;
      const int8_t* xr[2] = {xq + static_cast<size_t>(i) * ldx, xq + static_cast<size_t>(i + mr - 1) * ldx};
      alignas(16) int32_t sums[2][kInterleavedRows];
      // Two x rows share each weight load; a last single row (the decode's m = 1) reads each
      // group's 64 bytes in one pass.
      if (mr == 2)
        InterleavedRows<2, 2>(xr, tile, w.group_stride, groups, lo, hi, sums);
      else
        InterleavedRows<1, 4>(xr, tile, w.group_stride, groups, lo, hi, sums);
      for (int ii = 0; ii < mr; ++ii) {
        float* yr = y + static_cast<size_t>(i + ii) * ldy;
        for (int c = lo; c < hi; ++c) yr[base + c] = Epilogue(sums[ii][c], xscale[i + ii], w, base + c);
      }
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
        alignas(16) int32_t acc[kMr][kNr];
        if (mr == 1)
          RowByRow(xr[0], wr, k, acc[0]);
        else
          Tile<kMr>(xr, wr, k, acc);
        for (int ii = 0; ii < mr; ++ii) {
          float* yr = y + static_cast<size_t>(i + ii) * ldy;
          for (int r = 0; r < nr; ++r) yr[j + r] = Epilogue(acc[ii][r], xscale[i + ii], w, j + r);
        }
        i += mr;
      }
    }
  }
}

}  // namespace daisy::kernels::wasm
