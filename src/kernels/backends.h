// Internal: the per-backend entry points. Each backend is one translation unit compiled
// with its own target flags, in its own namespace; dispatch.cc picks one at run time.
//
// Rule for the ISA translation units (avx2.cc, avx512vnni.cc, neon.cc, wasm_simd128.cc): they define only
// their one exported entry plus helpers with internal linkage (anonymous namespace), and
// odr-use no inline function or template from a shared header (no std::vector, std::min,
// Status...). Otherwise the linker could keep the ISA-flagged copy of a weak symbol and
// generic code would execute AVX-512 instructions on a CPU without them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "daisy/kernels.h"

namespace daisy::kernels {

// Register blocking of the SIMD units, here so the gates (gates.cc) can size shapes that
// reach every panel and tests can emulate panel bugs. GEMM: tiles of kMr x rows by kNr
// weight rows (columns of y), walked inside row panels of RowPanelRows(k, kMr) x rows;
// k is consumed in vectors of kLanes int8, the rest (k % kLanes) is the tail. GEMV (one x
// row) walks kNr weight rows one after the other. Plain constants and a static function:
// internal linkage, so no ISA-flagged copy can become a shared symbol (rule above).
constexpr int kRowPanelBytes = 192 * 1024;  // x rows of a panel stay in L2
static constexpr int RowPanelRows(int k, int mr) {
  const int mc = kRowPanelBytes / k;  // k > 0
  return mc < mr ? mr : mc - mc % mr;
}
namespace avx2 {
constexpr int kMr = 2, kNr = 4, kLanes = 16;  // 8 accumulators + 4 weights + 1 x in 16 ymm
}  // namespace avx2
namespace avx512vnni {
constexpr int kMr = 4, kNr = 4, kLanes = 64;  // 16 accumulators + 4 weights + 1 x in 32 zmm
}  // namespace avx512vnni
namespace neon {
constexpr int kMr = 4, kNr = 4, kLanes = 16;  // 16 accumulators + 4 weights + 1 x in 32 q regs
}  // namespace neon
namespace wasm {
constexpr int kMr = 2, kNr = 4, kLanes = 16;  // 8 accumulators + 4 widened weights: 16 x86 xmm
}  // namespace wasm

// The calling thread's PrefetchDuringProducts ranges, as addresses, not pointers (a range
// may lie past a buffer; a prefetch never faults). The interleaved passes advance `next`
// a line at a time through [next, end), then through ranges[range..count).
struct PrefetchCursor {
  uintptr_t next = 0, end = 0;
  int range = 0, count = 0;
  struct Range {
    uintptr_t begin, end;
  } ranges[kMaxPrefetchRanges] = {};  // a plain array: no std:: member instantiated in an ISA unit
};
// The calling thread's cursor (dispatch.cc): a function, not a thread_local shared through
// this header, which would be a weak symbol of every ISA unit (the rule above).
PrefetchCursor& ThreadPrefetchCursor();
// [*next, *end) := c's next nonempty range, or an empty one after the last.
static inline void NextPrefetchRange(PrefetchCursor& c, uintptr_t* next, uintptr_t* end) {
  while (c.range < c.count) {
    const PrefetchCursor::Range r = c.ranges[c.range++];
    if (r.begin < r.end) {
      *next = r.begin;
      *end = r.end;
      return;
    }
  }
  *next = *end = 0;
}

// An interleaved view's (QMatrixView::tile_stride > 0) rows [col_begin, col_end) lie in its
// tiles [begin, end); lane c of tile t is view row t * kInterleavedRows - first_row + c.
// Static functions: internal linkage in every unit (rule above).
struct InterleavedTiles {
  int begin, end;
};
static inline InterleavedTiles TilesOf(const QMatrixView& w, int col_begin, int col_end) {
  return {(w.first_row + col_begin) / kInterleavedRows, (w.first_row + col_end - 1) / kInterleavedRows + 1};
}
// Tile t's view row of lane 0 (`base`, negative for a first tile entered mid-way) and the
// lanes [lo, hi) holding rows of [col_begin, col_end).
struct TileLanes {
  int base, lo, hi;
};
static inline TileLanes LanesOf(const QMatrixView& w, int t, int col_begin, int col_end) {
  const int base = t * kInterleavedRows - w.first_row;
  return {base, col_begin > base ? col_begin - base : 0,
          col_end - base < kInterleavedRows ? col_end - base : kInterleavedRows};
}

// Computes columns [col_begin, col_end) of y for all m rows (see MatMulQ in kernels.h).
// Writes exactly y[i * ldy + j] for i < m, col_begin <= j < col_end and nothing else.
using MatMulQFn = void (*)(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y,
                           size_t ldy, int col_begin, int col_end);

namespace scalar {
void MatMulQ(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy,
             int col_begin, int col_end);
// One output cell y[i][j] for x row `xr` with scale `xs`: the reference the audit uses.
float Cell(const int8_t* xr, float xs, const QMatrixView& w, int j);
}  // namespace scalar

#if defined(DAISY_KERNELS_X86)
namespace avx2 {
void MatMulQ(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy,
             int col_begin, int col_end);
}  // namespace avx2
namespace avx512vnni {
void MatMulQ(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy,
             int col_begin, int col_end);
}  // namespace avx512vnni
#endif

#if defined(DAISY_KERNELS_NEON)
namespace neon {
void MatMulQ(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy,
             int col_begin, int col_end);
}  // namespace neon
#endif

#if defined(DAISY_KERNELS_WASM)
namespace wasm {
void MatMulQ(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy,
             int col_begin, int col_end);
}  // namespace wasm
#endif

// What the CPU and the OS can run (cpu_features.cc; compiled without ISA flags).
// Returns an empty string when `backend` can run here, else the reason it cannot.
std::string CpuSupportProblem(Backend backend);

}  // namespace daisy::kernels
