// The exactness gates: a SIMD backend runs seeded shapes and must give the scalar
// reference's bits exactly, and write nothing outside its cells, before it may be used.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "internal.h"

namespace daisy::kernels::internal {
namespace {

// Odd k, k not a multiple of any vector width (16, 32, 64), tails in n, m = 1 and m > 1,
// zero rows, all-extreme values, k at kMaxK, strides, and column ranges that start mid-tile.
// The last shape reaches every panel of every SIMD unit (backends.h): k = 32805 makes
// RowPanelRows 4 rows for avx2 (kMr 2), avx512vnni and neon (kMr 4), so its 11 rows are two
// full row panels and a partial third (3 rows: avx2 ends with its one-row path), each
// walking columns [1, 11): two full column tiles and a tail of 2 after a start mid-tile;
// k % 64 = 37 leaves a tail in every lane width, and the strides exceed k. Without it no
// shape had a second row panel on a kMr = 4 unit, so a bug confined to later panels passed.
// Its cost (scalar 11 x 10 x 32805 multiply-adds) is kept near that of one kMaxK shape.
// The eleven after it reach avx512vnni's packed path (PackedProduct: k a multiple of 4 up to
// 5120, 2 or more x rows when k <= 64, else 8 or more): 8-row and 4-row tiles with partial
// last tiles, a second row panel (530 rows of k = 8: panels of 512), two column tiles and a
// tail after a start mid-tile, k tails inside a 64-byte block (36, 60, 100), nine full
// blocks (576), the largest k with extreme values, strides and zero rows. The last three reach
// the one-row GEMV paths (Gemv in avx2.cc and avx512vnni.cc: blocks of 8 rows and a vector
// epilogue, then the last rows one by one): blocks after a start mid-block with a tail, with
// strides, nine full 64-byte blocks per row; a row of 80 (avx2's 16-byte tail, extremes, no
// scale); and 8 + 1 rows at kMaxK with extreme values, where avx512vnni's biased sums wrap.
constexpr GateShape kShapes[] = {
    {1, 1, 1, GateFill::kRandom, false, true, 0, 0},
    {1, 3, 7, GateFill::kRandom, true, true, 0, 0},
    {1, 5, 15, GateFill::kRandom, false, false, 1, 0},
    {2, 7, 16, GateFill::kRandom, true, true, 0, 0},
    {1, 9, 17, GateFill::kRandom, true, true, 3, 1},
    {3, 6, 31, GateFill::kRandom, false, true, 0, 0},
    {1, 17, 63, GateFill::kRandom, true, true, 0, 0},
    {4, 4, 64, GateFill::kRandom, true, true, 0, 0},
    {5, 13, 65, GateFill::kRandom, true, true, 2, 3},
    {1, 8, 127, GateFill::kRandom, false, true, 0, 0},
    {6, 33, 128, GateFill::kRandom, true, true, 0, 0},
    {7, 10, 129, GateFill::kRandom, true, true, 5, 2},
    {9, 19, 255, GateFill::kRandom, true, true, 0, 0},
    {1, 35, 257, GateFill::kRandom, true, true, 0, 0},
    {2, 21, 576, GateFill::kRandom, true, true, 0, 5},
    {17, 23, 896, GateFill::kRandom, true, true, 0, 0},
    {3, 5, 1001, GateFill::kRandom, false, true, 7, 0},
    {6, 11, 100, GateFill::kZeroRows, true, true, 0, 0},
    {1, 6, 333, GateFill::kZeroRows, true, true, 0, 0},
    {5, 7, 191, GateFill::kExtremeSame, true, true, 0, 0},
    {5, 7, 191, GateFill::kExtremeMixed, false, true, 0, 0},
    {2, 5, kMaxK, GateFill::kExtremeSame, false, false, 0, 0},
    {3, 6, kMaxK, GateFill::kExtremeMixed, true, true, 0, 0},
    {1, 3, kMaxK - 2, GateFill::kRandom, true, true, 0, 0},
    {11, 11, 32805, GateFill::kRandom, true, true, 3, 1},
    {8, 33, 64, GateFill::kRandom, true, true, 3, 1},
    {13, 70, 36, GateFill::kRandom, true, false, 5, 2},
    {20, 300, 64, GateFill::kExtremeMixed, true, true, 0, 3},
    {9, 5, 8, GateFill::kExtremeSame, false, true, 1, 0},
    {16, 40, 4, GateFill::kRandom, false, false, 0, 0},
    {10, 17, 60, GateFill::kZeroRows, true, true, 2, 0},
    {3, 45, 64, GateFill::kRandom, true, true, 1, 3},
    {530, 70, 8, GateFill::kRandom, true, true, 1, 3},
    {9, 75, 576, GateFill::kRandom, true, true, 2, 3},
    {12, 37, 100, GateFill::kExtremeMixed, true, true, 0, 0},
    {8, 20, 5120, GateFill::kExtremeSame, false, true, 0, 0},
    {1, 29, 576, GateFill::kRandom, true, true, 3, 5},
    {1, 24, 80, GateFill::kExtremeMixed, true, false, 0, 0},
    {1, 9, kMaxK, GateFill::kExtremeSame, false, true, 0, 0},
    // Interleaved weights (the KV cache's keys and values): a decode step's Q.K^T (3 query
    // rows, 160 keys of head_dim 64) and P.V (6 P' rows, 64 dims, 160 keys); a view starting
    // inside its first tile with strides, column ranges starting mid-tile, and tails of a
    // tile; one x row (head_dim 8, a view across two tiles); a prefill block (96 rows: tiles
    // of 8 and 4 rows); k = 4; a long P.V from dimension 32 on; extremes at k = 1024 and at
    // the largest k that is a multiple of 4, where avx512vnni's biased sums wrap; zero rows.
    {3, 160, 64, GateFill::kRandom, false, true, 0, 0, GateLayout::kInterleavedKeys, 0},
    {6, 64, 160, GateFill::kRandom, false, false, 0, 0, GateLayout::kInterleavedValues, 0},
    {7, 37, 128, GateFill::kRandom, true, true, 1, 3, GateLayout::kInterleavedKeys, 5},
    {1, 17, 8, GateFill::kRandom, true, true, 0, 0, GateLayout::kInterleavedKeys, 15},
    {2, 8, 12, GateFill::kRandom, false, false, 0, 0, GateLayout::kInterleavedValues, 0},
    {96, 70, 64, GateFill::kRandom, false, true, 2, 5, GateLayout::kInterleavedKeys, 3},
    {9, 33, 4, GateFill::kZeroRows, true, true, 0, 1, GateLayout::kInterleavedKeys, 7},
    {14, 64, 2052, GateFill::kRandom, false, false, 1, 32, GateLayout::kInterleavedValues, 0},
    {1, 24, 36, GateFill::kRandom, true, true, 1, 5, GateLayout::kInterleavedValues, 9},
    {5, 20, 1024, GateFill::kExtremeMixed, false, true, 0, 0, GateLayout::kInterleavedValues, 0},
    {2, 16, kMaxK / 4 * 4, GateFill::kExtremeSame, false, false, 0, 0, GateLayout::kInterleavedValues, 0},
    {40, 45, 64, GateFill::kRandom, true, true, 3, 2, GateLayout::kInterleavedKeys, 9},
};

// The interleaved copy of the row-major rows `wq` (n rows of k, stride ldw) that `g` asks for,
// and its view: every byte of the layout that holds no row of the view is random (a unit
// may read it, and must not let it change a cell).
QMatrixView Interleave(const GateShape& g, const std::vector<int8_t>& wq, size_t ldw, uint64_t& state,
                       std::vector<int8_t>& out, const float* scale, const float* bias) {
  const int tiles = (g.first_row + g.n + kInterleavedRows - 1) / kInterleavedRows, groups = g.k / 4;
  const auto pad = static_cast<size_t>(g.pad) * 64;
  size_t tile_stride = 0, group_stride = 0;
  if (g.layout == GateLayout::kInterleavedKeys) {
    group_stride = 64;
    tile_stride = static_cast<size_t>(groups) * 64 + pad;
  } else {
    tile_stride = 64;
    group_stride = static_cast<size_t>(tiles) * 64 + pad;
  }
  out.resize(std::max(static_cast<size_t>(tiles) * tile_stride, static_cast<size_t>(groups) * group_stride) + 64);
  for (int8_t& b : out) b = static_cast<int8_t>(static_cast<int>(SplitMix64(state++) % 255) - 127);
  const QMatrixView w{out.data(),  scale,        bias,       g.n, g.k, static_cast<size_t>(g.k),
                      tile_stride, group_stride, g.first_row};
  // Placed from the layout's definition (kernels.h), not through QMatrixView::At, which
  // scalar reads with: a wrong At then fails scalar's own check (gates_test).
  for (int j = 0; j < g.n; ++j) {
    const int row = g.first_row + j, tile = row / kInterleavedRows, lane = row % kInterleavedRows;
    for (int t = 0; t < g.k; t += 4)
      std::memcpy(&out[static_cast<size_t>(tile) * tile_stride + static_cast<size_t>(t / 4) * group_stride +
                       static_cast<size_t>(lane) * 4],
                  &wq[static_cast<size_t>(j) * ldw + static_cast<size_t>(t)], 4);
  }
  return w;
}

int8_t RandomQ(uint64_t& state) {
  return static_cast<int8_t>(static_cast<int>(SplitMix64(state++) % 255) - 127);
}

// A float scale with a random mantissa in [2^-10, 2^-6): exercises the rounding of the epilogue.
float RandomScale(uint64_t& state) {
  const uint32_t bits = (uint32_t{117} << 23) + static_cast<uint32_t>(SplitMix64(state++) % (4u << 23));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::string Hex(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, b);
  return buf;
}

}  // namespace

std::span<const GateShape> GateShapes() {
  return kShapes;
}

std::string RunGate(MatMulQFn fn) {
  return RunGates(std::span<const MatMulQFn>(&fn, 1))[0];
}

std::vector<std::string> RunGates(std::span<const MatMulQFn> fns) {
  // Each shape's operands and scalar reference are made once for all entries: the seeded
  // generation and the scalar products are most of the gates' cost at start-up.
  std::vector<std::string> result(fns.size());
  std::vector<bool> failed(fns.size(), false);
  size_t n_failed = 0;
  uint64_t state = 0x6A7E5EEDULL;
  for (const GateShape& g : kShapes) {
    if (n_failed == fns.size()) break;
    const size_t ldx = static_cast<size_t>(g.k) + static_cast<size_t>(g.pad), ldw = ldx;
    const size_t ldy = static_cast<size_t>(g.n) + static_cast<size_t>(g.pad);
    std::vector<int8_t> x(static_cast<size_t>(g.m) * ldx), wq(static_cast<size_t>(g.n) * ldw);
    std::vector<float> xs(static_cast<size_t>(g.m)), ws(static_cast<size_t>(g.n)), bias(static_cast<size_t>(g.n));
    for (int i = 0; i < g.m; ++i) {
      xs[static_cast<size_t>(i)] = RandomScale(state);
      for (int t = 0; t < g.k; ++t) {
        int8_t v = RandomQ(state);
        if (g.fill == GateFill::kExtremeSame) v = 127;
        if (g.fill == GateFill::kExtremeMixed) v = (i % 2 == 0) ? -127 : 127;
        x[static_cast<size_t>(i) * ldx + static_cast<size_t>(t)] = v;
      }
      if (g.fill == GateFill::kZeroRows && i % 3 == 1) {
        std::memset(&x[static_cast<size_t>(i) * ldx], 0, static_cast<size_t>(g.k));
        xs[static_cast<size_t>(i)] = 0.0f;
      }
    }
    for (int j = 0; j < g.n; ++j) {
      ws[static_cast<size_t>(j)] = RandomScale(state);
      bias[static_cast<size_t>(j)] = static_cast<float>(RandomQ(state)) * 0.03125f;
      for (int t = 0; t < g.k; ++t) {
        int8_t v = RandomQ(state);
        if (g.fill == GateFill::kExtremeSame) v = 127;
        if (g.fill == GateFill::kExtremeMixed) v = (j % 2 == 0) ? 127 : -127;
        wq[static_cast<size_t>(j) * ldw + static_cast<size_t>(t)] = v;
      }
      if (g.fill == GateFill::kZeroRows && j % 4 == 2)
        std::memset(&wq[static_cast<size_t>(j) * ldw], 0, static_cast<size_t>(g.k));
    }
    const QMatrixView w{wq.data(), g.scale ? ws.data() : nullptr, g.bias ? bias.data() : nullptr, g.n, g.k, ldw};
    // The reference runs on the row-major rows; the units, on the layout the shape asks for.
    std::vector<int8_t> layout;
    const QMatrixView wu =
        g.layout == GateLayout::kRowMajor ? w : Interleave(g, wq, ldw, state, layout, w.scale, w.bias);
    const int col_begin = g.col_begin, col_end = g.n - g.col_begin / 2;
    // Every float of y, padding included, starts as the same NaN pattern; untouched cells
    // and padding must keep it. Guard elements after the buffer catch overruns.
    constexpr size_t kGuard = 16;
    const size_t ny = static_cast<size_t>(g.m) * ldy + kGuard;
    constexpr uint32_t kPoison = 0x7FC0DEADu;
    std::vector<uint32_t> want(ny, kPoison), got(ny);
    scalar::MatMulQ(x.data(), xs.data(), g.m, ldx, w, reinterpret_cast<float*>(want.data()), ldy, col_begin, col_end);
    for (size_t f = 0; f < fns.size(); ++f) {
      if (failed[f]) continue;  // report the first mismatch only
      std::fill(got.begin(), got.end(), kPoison);
      fns[f](x.data(), xs.data(), g.m, ldx, wu, reinterpret_cast<float*>(got.data()), ldy, col_begin, col_end);
      if (std::memcmp(want.data(), got.data(), ny * 4) == 0) continue;
      size_t at = 0;
      while (want[at] == got[at]) ++at;
      float fw, fg;
      std::memcpy(&fw, &want[at], 4);
      std::memcpy(&fg, &got[at], 4);
      result[f] = "m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
                  (g.layout == GateLayout::kRowMajor ? "" : " interleaved") + ": element " + std::to_string(at) +
                  " is " + Hex(fg) + ", scalar gives " + Hex(fw);
      failed[f] = true;
      ++n_failed;
    }
  }
  return result;
}

}  // namespace daisy::kernels::internal
