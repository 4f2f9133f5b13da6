// AVX2 backend. Compiled alone with -mavx2; dispatch.cc calls it only after cpuid + XGETBV
// said the CPU and the OS support it. See backends.h for the rule that keeps ISA-flagged
// code out of shared symbols.
//
// Both operands are sign-extended to int16 and multiplied with vpmaddwd, which adds two
// int16 x int16 products into an int32: |product| <= 128 * 128, so the pair sum fits in
// int32 exactly (vpmaddubsw is avoided: its int16 saturation is not exact for int8 x int8).
// The int32 lanes then add exactly because the whole sum lies in int32 (k <= kMaxK).
#include <immintrin.h>

#include <cstring>

#include "backends.h"

namespace daisy::kernels::avx2 {
namespace {

constexpr int kPrefetchTiles = 4;
// How far ahead of its reads the decode GEMV prefetches its weight stream. The hardware
// prefetcher alone leaves one core's stream at about 2/3 of what it can read from memory.
// 1 KiB: on the AMD EPYC (Zen 3) of session 22, 4 KiB held the GEMV at 0.70-0.78 of the
// read ceiling and 1 KiB reached 0.88-1.05, on short and long rows, 1 and 2 threads
// (docs/KERNELS.md, "Tiling").
constexpr uintptr_t kStreamAhead = 1024;

// The four horizontal sums of a0..a3 as one vector (integer adds: any order is exact).
inline __m128i Reduce4(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
  const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
  return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

inline __m256i Load16(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// acc[i][r] = sum_t x_i[t] * w_r[t] for MR x rows and kNr weight rows. With kPrefetch (the
// first tile of a panel to touch these weight rows, which come from memory) it also
// prefetches `next` (the tile kPrefetchTiles ahead, rows ld bytes apart) in address order:
// four row streams interleaved at a stride of k bytes defeat the hardware prefetcher. Rows
// further apart than k (attention's V^T, a row per head dimension ctx bytes apart) are
// prefetched row by row, a line of each in turn.
template <int MR, bool kPrefetch>
inline void Tile(const int8_t* const* xr, const int8_t* const* wr, int k, int32_t (*acc_out)[kNr], uintptr_t next,
                 uintptr_t ld) {
  __m256i acc[MR][kNr];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < kNr; ++r) acc[i][r] = _mm256_setzero_si256();
  auto step = [&](const int8_t* const* xp, const int8_t* const* wp, int t) {
    __m256i wv[kNr];
#pragma GCC unroll 4
    for (int r = 0; r < kNr; ++r) wv[r] = Load16(wp[r] + t);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256i xv = Load16(xp[i] + t);
#pragma GCC unroll 4
      for (int r = 0; r < kNr; ++r) acc[i][r] = _mm256_add_epi32(acc[i][r], _mm256_madd_epi16(xv, wv[r]));
    }
  };
  int t = 0;
  for (; t + 16 <= k; t += 16) {
    // One 64-byte line of the next tile per 16 columns covers its kNr * k bytes. A prefetch
    // never faults, so `next` may lie past the matrix (an address, not a pointer: pointer
    // arithmetic past the end would be undefined).
    if constexpr (kPrefetch) {
      const auto ut = static_cast<uintptr_t>(t);
      const uintptr_t at =
          ld == static_cast<uintptr_t>(k) ? next + ut * kNr : next + (ut / 16 % kNr) * ld + (ut & ~uintptr_t{63});
      // NOLINTNEXTLINE(performance-no-int-to-ptr)
      _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T0);
    }
    step(xr, wr, t);
  }
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
  for (int i = 0; i < MR; ++i)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(acc_out[i]), Reduce4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
}

// The sum of x times one weight row w over [0, k16) (k16 a multiple of 16) in eight int32
// lanes, streaming w in address order with its prefetch kStreamAhead bytes on (an address:
// it may lie past the matrix, and a prefetch never faults). Two chains through vpmaddwd + add.
inline __m256i RowSum16(const int8_t* xr, const int8_t* w, int k16) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0;
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(w) + kStreamAhead;
  int t = 0;
  for (; t + 64 <= k16; t += 64) {
    // NOLINTNEXTLINE(performance-no-int-to-ptr)
    _mm_prefetch(reinterpret_cast<const char*>(ahead + static_cast<uintptr_t>(t)), _MM_HINT_T0);
    a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(Load16(xr + t), Load16(w + t)));
    a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(Load16(xr + t + 16), Load16(w + t + 16)));
    a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(Load16(xr + t + 32), Load16(w + t + 32)));
    a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(Load16(xr + t + 48), Load16(w + t + 48)));
  }
  if (t < k16) {
    // NOLINTNEXTLINE(performance-no-int-to-ptr)
    _mm_prefetch(reinterpret_cast<const char*>(ahead + static_cast<uintptr_t>(t)), _MM_HINT_T0);
    for (; t < k16; t += 16) a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(Load16(xr + t), Load16(w + t)));
  }
  return _mm256_add_epi32(a0, a1);
}

// One x row against kNr weight rows, one weight row after the other so the weights stream
// in address order (sequential streams are what the hardware prefetcher follows best): the
// last x row of a row panel whose rows do not fill a tile, and Gemv's last rows.
inline void RowByRow(const int8_t* xr, const int8_t* const* wr, int k, int32_t* out) {
  __m256i d[kNr];
  const int k16 = k & ~15;
  for (int r = 0; r < kNr; ++r) {
    d[r] = RowSum16(xr, wr[r], k16);
    if (k16 < k) {
      // Tail: zero-padded copies so no load passes a row's end.
      alignas(16) int8_t xb[16] = {}, wb[16] = {};
      std::memcpy(xb, xr + k16, static_cast<size_t>(k - k16));
      std::memcpy(wb, wr[r] + k16, static_cast<size_t>(k - k16));
      d[r] = _mm256_add_epi32(d[r], _mm256_madd_epi16(Load16(xb), Load16(wb)));
    }
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), Reduce4(d[0], d[1], d[2], d[3]));
}

// The same IEEE sequence as the scalar reference: s = xs * ws; v = float(acc) * s; v + b.
inline float Epilogue(int32_t acc, float xs, const QMatrixView& w, int j) {
  const float ws = w.scale ? w.scale[j] : 1.0f;
  const float s = xs * ws;
  float v = static_cast<float>(acc) * s;
  if (w.bias) v = v + w.bias[j];
  return v;
}

// Epilogue for the 8 cells y[j .. j + 8) at once, lane by lane the same IEEE sequence.
inline void Epilogue8(__m256i acc, __m256 xsv, const QMatrixView& w, int j, float* y) {
  const __m256 ws = w.scale ? _mm256_loadu_ps(w.scale + j) : _mm256_set1_ps(1.0f);
  __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(xsv, ws));
  if (w.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(w.bias + j));
  _mm256_storeu_ps(y + j, v);
}

// One x row against the weight rows [j0, j1): the decode GEMV. RowSum16's stream (rows one
// after the other, the prefetch kStreamAhead bytes ahead), eight rows at a time, their sums
// reduced and their epilogue done in one vector: Epilogue's IEEE sequence lane by lane (s =
// xs * ws; v = float(acc) * s; v + b). A function of its own, not inlined into MatMulQ: at 1
// thread a core's stream is bounded by the loads it keeps in flight, and the instructions
// between them (a tile's pointer set-up, spills, a scalar epilogue per row) take room in the
// window (docs/KERNELS.md, "Tiling").
__attribute__((noinline)) void Gemv(const int8_t* xr, float xs, const QMatrixView& w, float* y, int j0, int j1) {
  const int k = w.k;
  const __m256 xsv = _mm256_set1_ps(xs);
  int j = j0;
  // Rows whose length is a multiple of 16 need no zero-padded tail copy.
  for (; k % 16 == 0 && j + 8 <= j1; j += 8) {
    __m256i d[8];
    const int8_t* row = w.q + static_cast<size_t>(j) * w.ld;
    for (int r = 0; r < 8; ++r, row += w.ld) d[r] = RowSum16(xr, row, k);
    // The eight horizontal sums in one vector (integer adds: any order is exact).
    const __m256i t0 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
    const __m256i t1 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[4], d[5]), _mm256_hadd_epi32(d[6], d[7]));
    const __m256i acc =
        _mm256_add_epi32(_mm256_permute2x128_si256(t0, t1, 0x20), _mm256_permute2x128_si256(t0, t1, 0x31));
    Epilogue8(acc, xsv, w, j, y);
  }
  // The last rows (all of them when k is not a multiple of 16): RowByRow, four at a time.
  for (; j < j1; j += kNr) {
    const int nr = j1 - j < kNr ? j1 - j : kNr;
    // A short last group repeats its last row: valid memory, results discarded.
    const int8_t* wr[kNr];
    for (int r = 0; r < kNr; ++r) wr[r] = w.q + static_cast<size_t>(j + (r < nr ? r : nr - 1)) * w.ld;
    int32_t acc[kNr];
    RowByRow(xr, wr, k, acc);
    for (int r = 0; r < nr; ++r) y[j + r] = Epilogue(acc[r], xs, w, j + r);
  }
}

// ---- Interleaved weights (QMatrixView::tile_stride > 0): the KV cache's keys and values ----
// A tile's group is 16 rows x 4 bytes: widened to int16 four rows at a time and multiplied
// with vpmaddwd by the x row's 4 bytes (broadcast as a dword, widened: the 4 int16 repeated),
// each int32 lane the sum of two products of one row; the two lanes of a row are added once,
// after the last group. Two x rows per pass (a last odd row alone, not beside a repeated
// one): 8 accumulators and one weight quarter in registers, the x operands read from memory.
// Three rows per pass spilled an accumulator and ran slower.

// Lanes [lo, hi) of the 16 cells of one x row and tile: Epilogue8 where all 8 lanes of a
// half hold view rows, Epilogue lane by lane where only some do.
inline void InterleavedEpilogue(__m256i a0, __m256i a1, __m256i a2, __m256i a3, float xs, const QMatrixView& w,
                                float* yr, int base, int lo, int hi) {
  // hadd per 128-bit half: [r0 r1 r4 r5 | r2 r3 r6 r7]; the permutation restores row order.
  const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  const __m256i sums[2] = {_mm256_permutevar8x32_epi32(_mm256_hadd_epi32(a0, a1), order),
                           _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(a2, a3), order)};
  const __m256 xsv = _mm256_set1_ps(xs);
  for (int h = 0; h < 2; ++h) {
    const int c0 = 8 * h;
    if (hi <= c0 || lo >= c0 + 8) continue;
    if (lo <= c0 && hi >= c0 + 8) {  // all 8 lanes are rows of the view
      Epilogue8(sums[h], xsv, w, base + c0, yr);
    } else {
      int32_t lanes[8];
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), sums[h]);
      const int e = hi < c0 + 8 ? hi : c0 + 8;
      for (int c = lo > c0 ? lo : c0; c < e; ++c) yr[base + c] = Epilogue(lanes[c - c0], xs, w, base + c);
    }
  }
}

// x rows' groups [g0, g1) as vpmaddwd operands: each row's 4 bytes of a group broadcast as a
// dword and widened (the 4 int16 repeated), at xb[(g - g0) * R + r].
template <int R>
inline void WidenGroups(const int8_t* xq, size_t ldx, int g0, int g1, __m256i* xb) {
  for (int g = g0; g < g1; ++g)
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, xq + static_cast<size_t>(r) * ldx + 4 * static_cast<size_t>(g), 4);
      xb[(g - g0) * R + r] = _mm256_cvtepi8_epi16(_mm_set1_epi32(four));
    }
}

// R x rows against the tiles holding columns [col_begin, col_end). The x operands are made
// once for all tiles when they fit the stack buffer (a decode step's Q.K^T, k = head_dim;
// its P.V up to kChunk * 4 keys), else once per tile and chunk of groups.
template <int R>
__attribute__((noinline)) void InterleavedPass(const int8_t* xq, const float* xscale, size_t ldx, const QMatrixView& w,
                                               float* y, size_t ldy, int col_begin, int col_end) {
  constexpr int kChunk = 256;
  __m256i xb[kChunk * R];
  const int groups = w.k / 4;
  const bool once = groups <= kChunk;
  if (once) WidenGroups<R>(xq, ldx, 0, groups, xb);
  const InterleavedTiles tiles = TilesOf(w, col_begin, col_end);
  PrefetchCursor& cursor = ThreadPrefetchCursor();
  uintptr_t pf = cursor.next;
  uintptr_t pf_end = cursor.end;
  for (int t = tiles.begin; t < tiles.end; ++t) {
    const int8_t* tile = w.q + static_cast<size_t>(t) * w.tile_stride;
    __m256i acc[R][4];
    for (auto& a : acc)
      for (__m256i& v : a) v = _mm256_setzero_si256();
    for (int g0 = 0; g0 < groups; g0 += kChunk) {
      const int g1 = groups - g0 < kChunk ? groups : g0 + kChunk;
      if (!once) WidenGroups<R>(xq, ldx, g0, g1, xb);
      const int8_t* grp = tile + static_cast<size_t>(g0) * w.group_stride;
      const __m256i* xg = xb;
      for (int g = g0; g < g1; ++g, grp += w.group_stride, xg += R) {
        if (pf < pf_end) {
          // NOLINTNEXTLINE(performance-no-int-to-ptr)
          _mm_prefetch(reinterpret_cast<const char*>(pf), _MM_HINT_T1);
          pf += 64;
          if (pf >= pf_end) NextPrefetchRange(cursor, &pf, &pf_end);
        }
        for (int q = 0; q < 4; ++q) {
          const __m256i wv = Load16(grp + 16 * q);
          for (int r = 0; r < R; ++r) acc[r][q] = _mm256_add_epi32(acc[r][q], _mm256_madd_epi16(xg[r], wv));
        }
      }
    }
    const auto [base, lo, hi] = LanesOf(w, t, col_begin, col_end);
    for (int r = 0; r < R; ++r)
      InterleavedEpilogue(acc[r][0], acc[r][1], acc[r][2], acc[r][3], xscale[r], w, y + static_cast<size_t>(r) * ldy,
                          base, lo, hi);
  }
  cursor.next = pf;
  cursor.end = pf_end;
}

void InterleavedProduct(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y,
                        size_t ldy, int col_begin, int col_end) {
  int i = 0;
  for (; i + 2 <= m; i += 2)
    InterleavedPass<2>(xq + static_cast<size_t>(i) * ldx, xscale + i, ldx, w, y + static_cast<size_t>(i) * ldy, ldy,
                       col_begin, col_end);
  if (i < m)
    InterleavedPass<1>(xq + static_cast<size_t>(i) * ldx, xscale + i, ldx, w, y + static_cast<size_t>(i) * ldy, ldy,
                       col_begin, col_end);
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
  if (m == 1) {  // the decode GEMV
    Gemv(xq, xscale[0], w, y, col_begin, col_end);
    return;
  }
  // Row panels of about 192 KiB of x stay in L2 while the panel's weight tiles stream by.
  const int mc = k > 0 ? RowPanelRows(k, kMr) : m;
  for (int i0 = 0; i0 < m; i0 += mc) {
    const int i1 = m - i0 < mc ? m : i0 + mc;
    for (int j = col_begin; j < col_end; j += kNr) {
      const int nr = col_end - j < kNr ? col_end - j : kNr;
      // A column tail repeats its last row: valid memory, results discarded.
      const int8_t* wr[kNr];
      for (int r = 0; r < kNr; ++r) wr[r] = w.q + static_cast<size_t>(j + (r < nr ? r : nr - 1)) * w.ld;
      // Where the tile kPrefetchTiles ahead starts (see Tile); an address, maybe past the end.
      const uintptr_t next = reinterpret_cast<uintptr_t>(w.q) + static_cast<uintptr_t>(j + kPrefetchTiles * kNr) * w.ld;
      for (int i = i0; i < i1;) {
        const int mr = i1 - i < kMr ? i1 - i : kMr;
        const int8_t* xr[kMr];
        for (int ii = 0; ii < mr; ++ii) xr[ii] = xq + static_cast<size_t>(i + ii) * ldx;
        int32_t acc[kMr][kNr];
        if (mr == 1)
          RowByRow(xr[0], wr, k, acc[0]);
        else if (i == i0)
          Tile<2, true>(xr, wr, k, acc, next, w.ld);
        else
          Tile<2, false>(xr, wr, k, acc, next, w.ld);
        for (int ii = 0; ii < mr; ++ii) {
          float* yr = y + static_cast<size_t>(i + ii) * ldy;
          for (int r = 0; r < nr; ++r) yr[j + r] = Epilogue(acc[ii][r], xscale[i + ii], w, j + r);
        }
        i += mr;
      }
    }
  }
}

}  // namespace daisy::kernels::avx2
