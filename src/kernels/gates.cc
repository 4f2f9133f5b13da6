// The exactness gates: a SIMD backend runs seeded shapes and must give the scalar
// reference's bits exactly, and write nothing outside its cells, before it may be used.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "internal.h"

namespace daisy::kernels::internal {
namespace {

enum class Fill : uint8_t {
  kRandom,        // uniform in [-127, 127]
  kZeroRows,      // random, but some x rows and some weight rows all zero (scale 0 for x)
  kExtremeSame,   // x = 127, w = 127 everywhere: the largest positive sum
  kExtremeMixed,  // x = -127, w = 127 and x = 127, w = -127: the largest negative sums
};

struct GateShape {
  int m, n, k;
  Fill fill;
  bool bias;
  bool scale;     // w.scale set (else nullptr: 1.0f)
  int pad;        // extra elements per row of x, w and y (strides > k, > n)
  int col_begin;  // the column range handed to the entry (col_end = n - col_begin / 2)
};

// Odd k, k not a multiple of any vector width (16, 32, 64), tails in n, m = 1 and m > 1,
// zero rows, all-extreme values, k at kMaxK, strides, and column ranges that start mid-tile.
constexpr GateShape kShapes[] = {
    {1, 1, 1, Fill::kRandom, false, true, 0, 0},          {1, 3, 7, Fill::kRandom, true, true, 0, 0},
    {1, 5, 15, Fill::kRandom, false, false, 1, 0},        {2, 7, 16, Fill::kRandom, true, true, 0, 0},
    {1, 9, 17, Fill::kRandom, true, true, 3, 1},          {3, 6, 31, Fill::kRandom, false, true, 0, 0},
    {1, 17, 63, Fill::kRandom, true, true, 0, 0},         {4, 4, 64, Fill::kRandom, true, true, 0, 0},
    {5, 13, 65, Fill::kRandom, true, true, 2, 3},         {1, 8, 127, Fill::kRandom, false, true, 0, 0},
    {6, 33, 128, Fill::kRandom, true, true, 0, 0},        {7, 10, 129, Fill::kRandom, true, true, 5, 2},
    {9, 19, 255, Fill::kRandom, true, true, 0, 0},        {1, 35, 257, Fill::kRandom, true, true, 0, 0},
    {2, 21, 576, Fill::kRandom, true, true, 0, 5},        {17, 23, 896, Fill::kRandom, true, true, 0, 0},
    {3, 5, 1001, Fill::kRandom, false, true, 7, 0},       {6, 11, 100, Fill::kZeroRows, true, true, 0, 0},
    {1, 6, 333, Fill::kZeroRows, true, true, 0, 0},       {5, 7, 191, Fill::kExtremeSame, true, true, 0, 0},
    {5, 7, 191, Fill::kExtremeMixed, false, true, 0, 0},  {2, 5, kMaxK, Fill::kExtremeSame, false, false, 0, 0},
    {3, 6, kMaxK, Fill::kExtremeMixed, true, true, 0, 0}, {1, 3, kMaxK - 2, Fill::kRandom, true, true, 0, 0},
};

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

std::string RunGate(MatMulQFn fn) {
  uint64_t state = 0x6A7E5EEDULL;
  for (const GateShape& g : kShapes) {
    const size_t ldx = static_cast<size_t>(g.k) + static_cast<size_t>(g.pad), ldw = ldx;
    const size_t ldy = static_cast<size_t>(g.n) + static_cast<size_t>(g.pad);
    std::vector<int8_t> x(static_cast<size_t>(g.m) * ldx), wq(static_cast<size_t>(g.n) * ldw);
    std::vector<float> xs(static_cast<size_t>(g.m)), ws(static_cast<size_t>(g.n)), bias(static_cast<size_t>(g.n));
    for (int i = 0; i < g.m; ++i) {
      xs[static_cast<size_t>(i)] = RandomScale(state);
      for (int t = 0; t < g.k; ++t) {
        int8_t v = RandomQ(state);
        if (g.fill == Fill::kExtremeSame) v = 127;
        if (g.fill == Fill::kExtremeMixed) v = (i % 2 == 0) ? -127 : 127;
        x[static_cast<size_t>(i) * ldx + static_cast<size_t>(t)] = v;
      }
      if (g.fill == Fill::kZeroRows && i % 3 == 1) {
        std::memset(&x[static_cast<size_t>(i) * ldx], 0, static_cast<size_t>(g.k));
        xs[static_cast<size_t>(i)] = 0.0f;
      }
    }
    for (int j = 0; j < g.n; ++j) {
      ws[static_cast<size_t>(j)] = RandomScale(state);
      bias[static_cast<size_t>(j)] = static_cast<float>(RandomQ(state)) * 0.03125f;
      for (int t = 0; t < g.k; ++t) {
        int8_t v = RandomQ(state);
        if (g.fill == Fill::kExtremeSame) v = 127;
        if (g.fill == Fill::kExtremeMixed) v = (j % 2 == 0) ? 127 : -127;
        wq[static_cast<size_t>(j) * ldw + static_cast<size_t>(t)] = v;
      }
      if (g.fill == Fill::kZeroRows && j % 4 == 2)
        std::memset(&wq[static_cast<size_t>(j) * ldw], 0, static_cast<size_t>(g.k));
    }
    const QMatrixView w{wq.data(), g.scale ? ws.data() : nullptr, g.bias ? bias.data() : nullptr, g.n, g.k, ldw};
    const int col_begin = g.col_begin, col_end = g.n - g.col_begin / 2;
    // Every float of y, padding included, starts as the same NaN pattern; untouched cells
    // and padding must keep it. Guard elements after the buffer catch overruns.
    constexpr size_t kGuard = 16;
    const size_t ny = static_cast<size_t>(g.m) * ldy + kGuard;
    constexpr uint32_t kPoison = 0x7FC0DEADu;
    std::vector<uint32_t> want(ny, kPoison), got(ny, kPoison);
    scalar::MatMulQ(x.data(), xs.data(), g.m, ldx, w, reinterpret_cast<float*>(want.data()), ldy, col_begin, col_end);
    fn(x.data(), xs.data(), g.m, ldx, w, reinterpret_cast<float*>(got.data()), ldy, col_begin, col_end);
    if (std::memcmp(want.data(), got.data(), ny * 4) == 0) continue;
    size_t at = 0;
    while (want[at] == got[at]) ++at;
    float fw, fg;
    std::memcpy(&fw, &want[at], 4);
    std::memcpy(&fg, &got[at], 4);
    return "m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) + ": element " +
           std::to_string(at) + " is " + Hex(fg) + ", scalar gives " + Hex(fw);
  }
  return "";
}

}  // namespace daisy::kernels::internal
