// AVX-512 VNNI backend. Compiled alone with -mavx512f -mavx512bw -mavx512vl -mavx512vnni;
// dispatch.cc calls it only after cpuid + XGETBV said the CPU and the OS support it.
// See backends.h for the rule that keeps ISA-flagged code out of shared symbols.
//
// vpdpbusd multiplies unsigned bytes by signed bytes. For signed x signed we feed
// x' = x + 128 (x ^ 0x80 reinterpreted as uint8, in [1, 255]) and subtract 128 * sum(w):
//   sum_t x'_t w_t - 128 * sum_t w_t = sum_t x_t w_t.
// vpdpbusd (not the saturating vpdpbusds) wraps modulo 2^32, and so does the subtraction,
// so the result is exact modulo 2^32; the true sum lies in int32 (|x|, |w| <= 127,
// k <= kMaxK), hence the wrapped value IS the true value even when the biased sum
// sum x'_t w_t (up to 255 * 127 * k) overflowed on the way.
#include <immintrin.h>

// GCC 12's AVX-512 headers self-initialize "undefined" vectors (__Y = __Y), which
// -Wuninitialized reports at every inlined use (GCC PR 105593); harmless, silenced here only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "backends.h"

namespace daisy::kernels::avx512vnni {
namespace {

constexpr int kPrefetchTiles = 4;

// The four horizontal sums of a0..a3 as one vector (integer adds: any order is exact).
inline __m128i Reduce4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
  const __m512i s01 = _mm512_add_epi32(_mm512_shuffle_i64x2(a0, a1, 0x44), _mm512_shuffle_i64x2(a0, a1, 0xEE));
  const __m512i s23 = _mm512_add_epi32(_mm512_shuffle_i64x2(a2, a3, 0x44), _mm512_shuffle_i64x2(a2, a3, 0xEE));
  // 128-bit lane L now holds four partial sums of a_L.
  __m512i t = _mm512_add_epi32(_mm512_shuffle_i64x2(s01, s23, 0x88), _mm512_shuffle_i64x2(s01, s23, 0xDD));
  t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_BADC));
  t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_CDAB));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castsi512_si128(_mm512_permutexvar_epi32(idx, t));
}

// acc[i][r] = sum_t x'_i[t] * w_r[t] (wrapping) for MR x rows and kNr weight rows; with
// kSums also sums[r] = sum_t w_r[t] (exact: |sum| <= 127 * k).
// With kSums the tile is the first to touch its weight rows (they come from memory): it also
// prefetches the tile kPrefetchTiles ahead (rows ld bytes apart) in address order, because
// four row streams interleaved at a stride of k bytes defeat the hardware prefetcher
// (measured: 8 vs 14 GB/s). Rows further apart than k (attention's V^T: a row per head
// dimension, ctx bytes apart) are prefetched row by row; before, the lines after the first
// row's fell between the rows (a decode step's P.V per head from memory, 3 query rows, 128
// keys: 6.2-6.6 -> 4.1-5.1 us; docs/KERNELS.md "Tiling").
template <int MR, bool kSums>
inline void Tile(const int8_t* const* xr, const int8_t* const* wr, int k, int32_t (*acc_out)[kNr], int32_t* sums,
                 uintptr_t next, uintptr_t ld) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc[MR][kNr];
  __m512i sacc[kNr];
#pragma GCC unroll 4
  for (int r = 0; r < kNr; ++r) {
    sacc[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) acc[i][r] = _mm512_setzero_si512();
  }
  int t = 0;
  for (; t + 64 <= k; t += 64) {
    __m512i wv[kNr];
#pragma GCC unroll 4
    for (int r = 0; r < kNr; ++r) wv[r] = _mm512_loadu_si512(wr[r] + t);
    if constexpr (kSums) {
#pragma GCC unroll 4
      for (int r = 0; r < kNr; ++r) {
        sacc[r] = _mm512_dpbusd_epi32(sacc[r], ones, wv[r]);
        // A prefetch never faults, so `next` may lie past the matrix (an address, not a
        // pointer: pointer arithmetic past the end would be undefined).
        const uintptr_t at = ld == static_cast<uintptr_t>(k) ? next + static_cast<uintptr_t>(t) * kNr + 64 * r
                                                             : next + r * ld + static_cast<uintptr_t>(t);
        // NOLINTNEXTLINE(performance-no-int-to-ptr)
        _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T0);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m512i xv = _mm512_xor_si512(_mm512_loadu_si512(xr[i] + t), flip);
#pragma GCC unroll 4
      for (int r = 0; r < kNr; ++r) acc[i][r] = _mm512_dpbusd_epi32(acc[i][r], xv, wv[r]);
    }
  }
  if (t < k) {
    // Tail: masked loads read nothing past the row (masked lanes cannot fault) and give
    // w = 0 there, so those lanes add 0 to both the product and the weight sum.
    const __mmask64 mask = (~0ULL) >> (64 - (k - t));
    __m512i wv[kNr];
#pragma GCC unroll 4
    for (int r = 0; r < kNr; ++r) wv[r] = _mm512_maskz_loadu_epi8(mask, wr[r] + t);
    if constexpr (kSums) {
#pragma GCC unroll 4
      for (int r = 0; r < kNr; ++r) sacc[r] = _mm512_dpbusd_epi32(sacc[r], ones, wv[r]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m512i xv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, xr[i] + t), flip);
#pragma GCC unroll 4
      for (int r = 0; r < kNr; ++r) acc[i][r] = _mm512_dpbusd_epi32(acc[i][r], xv, wv[r]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(acc_out[i]), Reduce4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
  if constexpr (kSums) _mm_storeu_si128(reinterpret_cast<__m128i*>(sums), Reduce4(sacc[0], sacc[1], sacc[2], sacc[3]));
}

template <int MR>
inline void RunTile(bool with_sums, const int8_t* const* xr, const int8_t* const* wr, int k, int32_t (*acc)[kNr],
                    int32_t* sums, uintptr_t next, uintptr_t ld) {
  if (with_sums)
    Tile<MR, true>(xr, wr, k, acc, sums, next, ld);
  else
    Tile<MR, false>(xr, wr, k, acc, sums, next, ld);
}

// sum_t (w_t + 128) x_t over one weight row w, wrapping, in eight int32 lanes: the weights
// are the biased operand, vpdpbusd taking w ^ 0x80 = w + 128 as unsigned and x as signed, so
// sum_t (w_t + 128) x_t = sum_t w_t x_t + 128 * sum_t x_t, and the caller subtracts
// RowCorrection of this x row (computed once per product) modulo 2^32: one vpdpbusd per 32
// weight bytes and no second sum over the weights. 256-bit vectors (AVX-512 VL): on the AMD
// EPYC of docs/KERNELS.md ("Figures") the 512-bit loop this replaced streamed 27-32 GB/s on
// one core, this one 39-40, as much as a plain read. No software prefetch: see Gemv.
inline __m256i BiasedRowSum(const int8_t* xr, const int8_t* w, int k) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i a0 = _mm256_setzero_si256(), a1 = a0;  // two chains through vpdpbusd
  int t = 0;
  for (; t + 64 <= k; t += 64) {
    const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + t)), flip);
    const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + t + 32)), flip);
    a0 = _mm256_dpbusd_epi32(a0, w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + t)));
    a1 = _mm256_dpbusd_epi32(a1, w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + t + 32)));
  }
  for (; t < k; t += 32) {
    // Masked lanes load 0 from both: they add (0 + 128) * 0.
    const __mmask32 mask = k - t >= 32 ? ~0U : (~0U) >> (32 - (k - t));
    a0 = _mm256_dpbusd_epi32(a0, _mm256_xor_si256(_mm256_maskz_loadu_epi8(mask, w + t), flip),
                             _mm256_maskz_loadu_epi8(mask, xr + t));
  }
  return _mm256_add_epi32(a0, a1);
}

// One x row against kNr weight rows, one row after the other so the weights stream in
// address order: the last x row of a row panel whose rows do not fill a tile (a product of
// one x row goes through Gemv, below). `corr` is RowCorrection of this x row. Returns the
// exact signed sums.
inline void RowByRow(const int8_t* xr, const int8_t* const* wr, int k, uint32_t corr, int32_t* out) {
  __m256i d[kNr];
  for (int r = 0; r < kNr; ++r) d[r] = BiasedRowSum(xr, wr[r], k);
  // The four horizontal sums (integer adds: any order is exact), then - 128 * sum(x).
  const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_sub_epi32(s, _mm_set1_epi32(static_cast<int>(corr))));
}

// The same IEEE sequence as the scalar reference: s = xs * ws; v = float(acc) * s; v + b.
inline float Epilogue(int32_t acc, float xs, const QMatrixView& w, int j) {
  const float ws = w.scale ? w.scale[j] : 1.0f;
  const float s = xs * ws;
  float v = static_cast<float>(acc) * s;
  if (w.bias) v = v + w.bias[j];
  return v;
}

// ---- Packed weights, broadcast x: many x rows (a prefill) and short rows (Q.K^T) ----
// The tiles above sum each accumulator horizontally once per output (Reduce4) and finish
// every cell in scalar code; at k = 64 (attention's Q.K^T over head_dim) that is a whole
// Reduce4 per vpdpbusd, and at k = 576 still a third of the work. Here 32 columns of the
// weights are first laid out 4 bytes of k at a time across the columns, each byte + 128 as
// unsigned (w ^ 0x80), and each x row's 4 bytes are broadcast: a vector of accumulators
// holds 16 columns, with no horizontal sum, and the epilogue runs 16 cells at a time. The
// biased sum is sum_t (w_t + 128) x_t = sum_t w_t x_t + 128 * sum_t x_t, exact modulo 2^32
// as above, so subtracting 128 * sum(x) gives the same integer as every other path, and the
// epilogue is the same IEEE sequence per cell (s = xs * ws; acc * s; + bias; no contraction
// under -ffp-contract=off). k must be a multiple of 4 (every model dimension is).
constexpr int kPackRows = 8;     // x rows per tile: 8 x 2 accumulators
constexpr int kPackCols = 32;    // columns per tile: two vectors
constexpr int kPackMaxK = 5120;  // a packed tile is at most 32 x 5120 bytes (160 KiB, on the stack)
constexpr int kPackMaxGroups = kPackMaxK / 4;
constexpr int kPackPanelRows = 512;  // x rows whose 128 * sum(x) are kept at a time

// Whether a product takes the packed path: short rows from 2 x rows on (the tiles' reduction
// dominates at any m), longer rows from 8 (packing 32 columns, a 16 x 16 transpose per 64
// bytes of k, is then small beside the rows that reuse them; kernels_bench at m = 16: 110
// against the tiles' 170 us). One x row (decode) takes Gemv's weight stream.
inline bool UsePacked(int m, int k) {
  return k % 4 == 0 && k <= kPackMaxK && (k <= 64 ? m >= 2 : m >= 8);
}

// The 16 x 16 transpose of 32-bit words: o[c] = word c of r[0..15].
inline void Transpose16(__m512i* r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4q + c], lane L: word 4L + c of rows 4q .. 4q + 3
  for (int q = 0; q < 4; ++q) {
    u[4 * q] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
    u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), x23 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i y01 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i y23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(x01, y01, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(x01, y01, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(x23, y23, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(x23, y23, 0xDD);
  }
}

// Packs weight rows [row0, row0 + valid) (valid <= 16; the others 0) into dst[g * kPackCols +
// c], c < 16: the g-th 4 bytes of k of row row0 + c, each byte ^ 0x80.
inline void Pack16(const QMatrixView& w, int row0, int valid, uint32_t* dst) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int k = w.k;
  for (int t0 = 0; t0 < k; t0 += 64) {
    const __mmask64 mask = k - t0 >= 64 ? ~0ULL : (~0ULL) >> (64 - (k - t0));
    __m512i r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      r[i] = i < valid ? _mm512_xor_si512(
                             _mm512_maskz_loadu_epi8(mask, w.q + static_cast<size_t>(row0 + i) * w.ld + t0), flip)
                       : _mm512_setzero_si512();
    Transpose16(r);
    const int groups = k - t0 >= 64 ? 16 : (k - t0) / 4;
    uint32_t* out = dst + static_cast<size_t>(t0 / 4) * kPackCols;
    for (int g = 0; g < groups; ++g) _mm512_storeu_si512(out + static_cast<size_t>(g) * kPackCols, r[g]);
  }
}

// 128 * sum_t x_t of one x row, modulo 2^32 (the sum itself is exact: |sum| <= 127 * k).
inline uint32_t RowCorrection(const int8_t* xr, int k) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc = _mm512_setzero_si512();
  for (int t = 0; t < k; t += 64) {
    const __mmask64 mask = k - t >= 64 ? ~0ULL : (~0ULL) >> (64 - (k - t));
    acc = _mm512_dpbusd_epi32(acc, ones, _mm512_maskz_loadu_epi8(mask, xr + t));
  }
  return static_cast<uint32_t>(_mm512_reduce_add_epi32(acc)) << 7;
}

// One x row against the weight rows [j0, j1): the decode GEMV. The rows stream one after the
// other (sequential, as the hardware prefetcher follows best), eight at a time, their sums
// reduced and their epilogue done in one vector: Epilogue's IEEE sequence lane by lane (s =
// xs * ws; v = float(acc) * s; v + b). Each row's sum is BiasedRowSum's, with `corr`
// (RowCorrection) subtracted modulo 2^32. No software prefetch, and a function of
// its own (not inlined into MatMulQ, whose packed paths crowd the registers): at 1 thread a
// core's stream is bounded by the loads it keeps in flight, and every instruction between
// them (a prefetch, a tile's pointer set-up, spills, a scalar epilogue per row) takes room
// in the window. On the EPYC of the figures, SmolLM's 576-byte rows: 26.6-28.5 GB/s against
// the old path's 18.5-20.0 (RowByRow, prefetching, inside MatMulQ) and avx2's 24.9-25.4
// (docs/KERNELS.md, "Tiling").
__attribute__((noinline)) void Gemv(const int8_t* xr, float xs, const QMatrixView& w, float* y, int j0, int j1) {
  const int k = w.k;
  const uint32_t corr = RowCorrection(xr, k);
  const __m256 xsv = _mm256_set1_ps(xs);
  const __m256i corrv = _mm256_set1_epi32(static_cast<int32_t>(corr));
  int j = j0;
  for (; j + 8 <= j1; j += 8) {
    __m256i d[8];
    const int8_t* row = w.q + static_cast<size_t>(j) * w.ld;
    for (int r = 0; r < 8; ++r, row += w.ld) d[r] = BiasedRowSum(xr, row, k);
    // The eight horizontal sums in one vector (integer adds: any order is exact), then
    // - 128 * sum(x), wrapping.
    const __m256i t0 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
    const __m256i t1 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[4], d[5]), _mm256_hadd_epi32(d[6], d[7]));
    const __m256i acc = _mm256_sub_epi32(
        _mm256_add_epi32(_mm256_permute2x128_si256(t0, t1, 0x20), _mm256_permute2x128_si256(t0, t1, 0x31)), corrv);
    const __m256 ws = w.scale ? _mm256_loadu_ps(w.scale + j) : _mm256_set1_ps(1.0f);
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(xsv, ws));
    if (w.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(w.bias + j));
    _mm256_storeu_ps(y + j, v);
  }
  for (; j < j1; ++j) {  // the last rows, one at a time
    const __m256i d = BiasedRowSum(xr, w.q + static_cast<size_t>(j) * w.ld, k);
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1));
    const __m128i h4 = _mm_hadd_epi32(_mm_hadd_epi32(h, h), h);
    const auto acc = static_cast<int32_t>(static_cast<uint32_t>(_mm_cvtsi128_si32(h4)) - corr);
    y[j] = Epilogue(acc, xs, w, j);
  }
}

// y[i][j] for the tile's rows (xr, `rows` of them valid; R = 8, or 4 when no more are left:
// a decode step's group of query heads is 2 to 8 rows) and the 32 columns from j (only
// those below j_end).
template <int R>
inline void PackedTile(const uint32_t* pk, int groups, const int8_t* const* xr, const uint32_t* corr,
                       const float* xscale, int rows, const QMatrixView& w, int j, int j_end, float* y, size_t ldy) {
  __m512i acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
  for (int g = 0; g < groups; ++g) {
    const __m512i w0 = _mm512_loadu_si512(pk + static_cast<size_t>(g) * kPackCols);
    const __m512i w1 = _mm512_loadu_si512(pk + static_cast<size_t>(g) * kPackCols + 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i xb = _mm512_broadcastd_epi32(_mm_loadu_si32(xr[r] + 4 * g));
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], w0, xb);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], w1, xb);
    }
  }
  for (int h = 0; h < 2; ++h) {
    const int c0 = j + 16 * h;
    if (c0 >= j_end) break;
    const int cn = j_end - c0 < 16 ? j_end - c0 : 16;
    const __mmask16 mask = static_cast<__mmask16>((1u << cn) - 1u);
    const __m512 ws = w.scale ? _mm512_maskz_loadu_ps(mask, w.scale + c0) : _mm512_set1_ps(1.0f);
    const __m512 bias = w.bias ? _mm512_maskz_loadu_ps(mask, w.bias + c0) : _mm512_setzero_ps();
    for (int r = 0; r < rows; ++r) {
      // Undo the +128 bias (wrapping), then Epilogue's sequence: s = xs * ws; v = acc * s; v + b.
      const __m512i a = _mm512_sub_epi32(acc[r][h], _mm512_set1_epi32(static_cast<int32_t>(corr[r])));
      const __m512 s = _mm512_mul_ps(_mm512_set1_ps(xscale[r]), ws);
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(a), s);
      if (w.bias) v = _mm512_add_ps(v, bias);
      _mm512_mask_storeu_ps(y + static_cast<size_t>(r) * ldy + c0, mask, v);
    }
  }
}

void PackedProduct(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy,
                   int col_begin, int col_end) {
  const int k = w.k, groups = k / 4;
  alignas(64) uint32_t pk[kPackCols * kPackMaxGroups];
  uint32_t corr[kPackPanelRows];
  // Row panels: x rows stay in L2 while each packed tile (in L1 for k up to ~1500) serves them.
  const int mc_l2 = RowPanelRows(k, kPackRows);
  const int mc = mc_l2 < kPackPanelRows ? mc_l2 : kPackPanelRows;
  for (int p0 = 0; p0 < m; p0 += mc) {
    const int p1 = m - p0 < mc ? m : p0 + mc;
    for (int i = p0; i < p1; ++i) corr[i - p0] = RowCorrection(xq + static_cast<size_t>(i) * ldx, k);
    for (int j = col_begin; j < col_end; j += kPackCols) {
      const int cols = col_end - j < kPackCols ? col_end - j : kPackCols;
      Pack16(w, j, cols < 16 ? cols : 16, pk);
      Pack16(w, j + 16, cols > 16 ? cols - 16 : 0, pk + 16);
      // The next column tile's weight rows are read from memory by the next Pack16: ask for
      // them a slice per row tile now, into L2, so that read overlaps this tile's products.
      const int next_rows = col_end - (j + kPackCols) < kPackCols ? col_end - (j + kPackCols) : kPackCols;
      const int lines_per_row = (k + 63) / 64;
      const int lines = next_rows > 0 ? next_rows * lines_per_row : 0;
      const int row_tiles = (p1 - p0 + kPackRows - 1) / kPackRows;
      const int per_tile = (lines + row_tiles - 1) / row_tiles;
      int line = 0;
      for (int i0 = p0; i0 < p1; i0 += kPackRows) {
        for (int e = 0; e < per_tile && line < lines; ++e, ++line) {
          // An address, not a pointer: the last line may reach past the matrix (see Tile).
          const uintptr_t at = reinterpret_cast<uintptr_t>(w.q) +
                               static_cast<uintptr_t>(j + kPackCols + line / lines_per_row) * w.ld +
                               static_cast<uintptr_t>(line % lines_per_row) * 64;
          // NOLINTNEXTLINE(performance-no-int-to-ptr)
          _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T1);
        }
        const int rows = p1 - i0 < kPackRows ? p1 - i0 : kPackRows;
        // Rows past the last repeat it: valid memory, results discarded.
        const int8_t* xr[kPackRows];
        for (int r = 0; r < kPackRows; ++r) xr[r] = xq + static_cast<size_t>(i0 + (r < rows ? r : rows - 1)) * ldx;
        float* yr = y + static_cast<size_t>(i0) * ldy;
        if (rows <= 4)
          PackedTile<4>(pk, groups, xr, corr + (i0 - p0), xscale + i0, rows, w, j, col_end, yr, ldy);
        else
          PackedTile<8>(pk, groups, xr, corr + (i0 - p0), xscale + i0, rows, w, j, col_end, yr, ldy);
      }
    }
  }
}

// ---- Interleaved weights (QMatrixView::tile_stride > 0): the KV cache's keys and values ----
// The layout is already PackedProduct's packed tile, 16 rows at a time, as raw int8: each x
// row's 4 bytes of a group are broadcast against a tile's group (w ^ 0x80, the same biased
// sum and correction as PackedProduct), 8 x rows by two tiles of accumulators, with no packing
// at all: attention's Q.K^T and P.V read the cache as it lies.
// Where a tile's lanes start in y, scale and bias: view row 16 T - first_row, which is
// negative for a first tile entered mid-way; an address (masked lanes are never touched),
// not a pointer formed before an array.
template <typename T>
inline T* LaneBase(T* p, int row) {
  // NOLINTNEXTLINE(performance-no-int-to-ptr)
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) +
                              static_cast<uintptr_t>(static_cast<intptr_t>(row)) * static_cast<uintptr_t>(sizeof(T)));
}

// Rows [i0, i0 + rows) of x (R = 8, or 4 when no more are left) against tile t and, when
// `two`, t + 1; writes the view rows in [col_begin, col_end).
template <int R>
inline void InterleavedTile(const QMatrixView& w, const int8_t* const* xr, const uint32_t* corr, const float* xscale,
                            int rows, int t, bool two, int col_begin, int col_end, float* y, size_t ldy) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int groups = w.k / 4;
  const int8_t* t0 = w.q + static_cast<size_t>(t) * w.tile_stride;
  const int8_t* t1 = t0 + w.tile_stride;
  __m512i acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
  for (int g = 0; g < groups; ++g) {
    const size_t at = static_cast<size_t>(g) * w.group_stride;
    const __m512i w0 = _mm512_xor_si512(_mm512_loadu_si512(t0 + at), flip);
    const __m512i w1 = two ? _mm512_xor_si512(_mm512_loadu_si512(t1 + at), flip) : w0;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i xb = _mm512_broadcastd_epi32(_mm_loadu_si32(xr[r] + 4 * g));
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], w0, xb);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], w1, xb);
    }
  }
  for (int h = 0; h < (two ? 2 : 1); ++h) {
    const auto [base, lo, hi] = LanesOf(w, t + h, col_begin, col_end);
    if (lo >= hi) continue;
    const auto mask = static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
    const __m512 ws = w.scale ? _mm512_maskz_loadu_ps(mask, LaneBase(w.scale, base)) : _mm512_set1_ps(1.0f);
    const __m512 bias = w.bias ? _mm512_maskz_loadu_ps(mask, LaneBase(w.bias, base)) : _mm512_setzero_ps();
    for (int r = 0; r < rows; ++r) {
      // Undo the +128 bias (wrapping), then Epilogue's sequence: s = xs * ws; v = acc * s; v + b.
      const __m512i a = _mm512_sub_epi32(acc[r][h], _mm512_set1_epi32(static_cast<int32_t>(corr[r])));
      const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(xscale[r]), ws);
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(a), sc);
      if (w.bias) v = _mm512_add_ps(v, bias);
      _mm512_mask_storeu_ps(LaneBase(y + static_cast<size_t>(r) * ldy, base), mask, v);
    }
  }
}

void InterleavedProduct(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y,
                        size_t ldy, int col_begin, int col_end) {
  uint32_t corr[kPackPanelRows];
  const InterleavedTiles tiles = TilesOf(w, col_begin, col_end);
  for (int p0 = 0; p0 < m; p0 += kPackPanelRows) {
    const int p1 = m - p0 < kPackPanelRows ? m : p0 + kPackPanelRows;
    for (int i = p0; i < p1; ++i) corr[i - p0] = RowCorrection(xq + static_cast<size_t>(i) * ldx, w.k);
    for (int t = tiles.begin; t < tiles.end; t += 2) {
      const bool two = t + 1 < tiles.end;
      for (int i0 = p0; i0 < p1; i0 += kPackRows) {
        const int rows = p1 - i0 < kPackRows ? p1 - i0 : kPackRows;
        // Rows past the last repeat it: valid memory, results discarded.
        const int8_t* xr[kPackRows];
        for (int r = 0; r < kPackRows; ++r) xr[r] = xq + static_cast<size_t>(i0 + (r < rows ? r : rows - 1)) * ldx;
        float* yr = y + static_cast<size_t>(i0) * ldy;
        if (rows <= 4)
          InterleavedTile<4>(w, xr, corr + (i0 - p0), xscale + i0, rows, t, two, col_begin, col_end, yr, ldy);
        else
          InterleavedTile<8>(w, xr, corr + (i0 - p0), xscale + i0, rows, t, two, col_begin, col_end, yr, ldy);
      }
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
  if (m == 1) {  // the decode GEMV
    Gemv(xq, xscale[0], w, y, col_begin, col_end);
    return;
  }
  // Many x rows, or short rows against two or more: see PackedProduct.
  if (UsePacked(m, k)) {
    PackedProduct(xq, xscale, m, ldx, w, y, ldy, col_begin, col_end);
    return;
  }
  // Row panels of about 192 KiB of x stay in L2 while the panel's weight tiles stream by.
  const int mc = k > 0 ? RowPanelRows(k, kMr) : m;
  int corr_row = -1;  // the x row whose RowCorrection `corr` holds
  uint32_t corr = 0;
  for (int i0 = 0; i0 < m; i0 += mc) {
    const int i1 = m - i0 < mc ? m : i0 + mc;
    for (int j = col_begin; j < col_end; j += kNr) {
      const int nr = col_end - j < kNr ? col_end - j : kNr;
      // A column tail repeats its last row: valid memory, results discarded.
      const int8_t* wr[kNr];
      for (int r = 0; r < kNr; ++r) wr[r] = w.q + static_cast<size_t>(j + (r < nr ? r : nr - 1)) * w.ld;
      // Where the tile kPrefetchTiles ahead starts (see Tile); an address, maybe past the end.
      const uintptr_t next = reinterpret_cast<uintptr_t>(w.q) + static_cast<uintptr_t>(j + kPrefetchTiles * kNr) * w.ld;
      int32_t sums[kNr] = {0, 0, 0, 0};
      bool have_sums = false;  // the first block of >= 2 x rows in a panel sums the weight rows
      for (int i = i0; i < i1;) {
        const int mr = i1 - i < kMr ? i1 - i : kMr;
        const int8_t* xr[kMr];
        for (int ii = 0; ii < mr; ++ii) xr[ii] = xq + static_cast<size_t>(i + ii) * ldx;
        int32_t acc[kMr][kNr];
        if (mr == 1) {
          // One x row: its correction once per row, not per weight tile (a decode product
          // has a single row, so this runs once).
          if (corr_row != i) {
            corr = RowCorrection(xr[0], k);
            corr_row = i;
          }
          RowByRow(xr[0], wr, k, corr, acc[0]);  // already corrected
        } else {
          switch (mr) {
            case 2:
              RunTile<2>(!have_sums, xr, wr, k, acc, sums, next, w.ld);
              break;
            case 3:
              RunTile<3>(!have_sums, xr, wr, k, acc, sums, next, w.ld);
              break;
            default:
              RunTile<4>(!have_sums, xr, wr, k, acc, sums, next, w.ld);
              break;
          }
          have_sums = true;
          // Undo the +128 bias modulo 2^32 (exact, see the top of this file).
          for (int ii = 0; ii < mr; ++ii)
            for (int r = 0; r < kNr; ++r)
              acc[ii][r] =
                  static_cast<int32_t>(static_cast<uint32_t>(acc[ii][r]) - (static_cast<uint32_t>(sums[r]) << 7));
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

}  // namespace daisy::kernels::avx512vnni
