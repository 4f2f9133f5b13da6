// Tests of the exactness gates (gates.cc) against bugs that hide past the first panel: the
// gate shapes reach every row panel, column tile and k tail of every SIMD unit, and a unit
// with a bug confined to a later row panel is demoted at start-up. The bugs are injected by
// test-only wrappers handed to the start-up through internal::Reinitialize(table): each
// calls the real kernel and leaves exactly the cells the bug would get wrong wrong, so the
// shipped product path carries no injection code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "daisy/kernels.h"
#include "internal.h"

namespace daisy::kernels {
namespace {

constexpr Backend kBackends[] = {Backend::kScalar, Backend::kAvx2, Backend::kAvx512Vnni, Backend::kNeon,
                                 Backend::kWasm};

// The blocking a unit declares in backends.h (none for scalar: the naive reference).
struct Geometry {
  int mr, nr, lanes;
};
std::optional<Geometry> GeometryOf(Backend b) {
  switch (b) {
    case Backend::kAvx2:
      return Geometry{avx2::kMr, avx2::kNr, avx2::kLanes};
    case Backend::kAvx512Vnni:
      return Geometry{avx512vnni::kMr, avx512vnni::kNr, avx512vnni::kLanes};
    case Backend::kNeon:
      return Geometry{neon::kMr, neon::kNr, neon::kLanes};
    case Backend::kWasm:
      return Geometry{wasm::kMr, wasm::kNr, wasm::kLanes};
    case Backend::kScalar:
      break;
  }
  return std::nullopt;
}

BackendStatus StatusOf(Backend b) {
  for (const BackendStatus& s : BackendReport())
    if (s.backend == b) return s;
  ADD_FAILURE() << "BackendReport lacks " << BackendName(b);
  return BackendStatus{b, false, false, "missing"};
}

// The bugs, each confined to row panels after the first (rows i >= RowPanelRows(k, kMr)),
// i.e. to code a shape with one row panel never reaches.
enum class Bug : uint8_t {
  kNone,                 // the real kernel through the wrapper: must pass (the control)
  kSkipRowInLaterPanel,  // the last row of the second row panel is never written
  kDropTailLane,         // later panels lose the last lane of the k tail (t = k - 1)
  kStaleCorrection,      // later panels correct column tiles after the first with the
                         // previous tile's term: avx512vnni's 128 * sum(w), or the
                         // epilogue's weight scale on units without a sum correction
};

std::string BugName(Bug bug) {
  switch (bug) {
    case Bug::kNone:
      return "None";
    case Bug::kSkipRowInLaterPanel:
      return "SkipRowInLaterPanel";
    case Bug::kDropTailLane:
      return "DropTailLane";
    case Bug::kStaleCorrection:
      return "StaleCorrection";
  }
  return "Unknown";
}

int32_t Dot(const int8_t* xr, const QMatrixView& w, int j) {
  int64_t acc = 0;  // exact: the true sum lies in int32 (|x|, |w| <= 127, k <= kMaxK)
  for (int t = 0; t < w.k; ++t) acc += int64_t{xr[t]} * int64_t{w.q[static_cast<size_t>(j) * w.ld + t]};
  return static_cast<int32_t>(acc);
}

int64_t WeightSum(const QMatrixView& w, int j) {
  int64_t s = 0;
  for (int t = 0; t < w.k; ++t) s += w.q[static_cast<size_t>(j) * w.ld + t];
  return s;
}

// The epilogue of docs/KERNELS.md with the weight scale passed in.
float Epilogue(int32_t acc, float xs, float ws, const QMatrixView& w, int j) {
  const float s = xs * ws;
  float v = static_cast<float>(acc) * s;
  if (w.bias) v = v + w.bias[j];
  return v;
}

// Calls B's real entry, then makes the output what the kernel with `kBug` would write.
template <Backend B, Bug kBug>
void Injected(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy,
              int col_begin, int col_end) {
  const MatMulQFn real = internal::EntryFor(B);
  const Geometry g = *GeometryOf(B);
  const int mc = w.k > 0 ? RowPanelRows(w.k, g.mr) : m;
  // The bugs are of the row-major tiles (Dot and WeightSum read rows): interleaved views pass through.
  if (kBug == Bug::kNone || m <= mc || col_begin >= col_end || w.interleaved()) {
    real(xq, xscale, m, ldx, w, y, ldy, col_begin, col_end);
    return;
  }
  if constexpr (kBug == Bug::kSkipRowInLaterPanel) {
    float* row = y + static_cast<size_t>(std::min(2 * mc, m) - 1) * ldy;
    const std::vector<float> before(row + col_begin, row + col_end);
    real(xq, xscale, m, ldx, w, y, ldy, col_begin, col_end);
    std::copy(before.begin(), before.end(), row + col_begin);  // never written
  } else if constexpr (kBug == Bug::kDropTailLane) {
    if (w.k % g.lanes == 0) {  // no tail, nothing to drop
      real(xq, xscale, m, ldx, w, y, ldy, col_begin, col_end);
      return;
    }
    // A lost lane adds nothing: the same as that x byte being 0 (for avx512vnni, whose
    // masked-out lanes also add nothing to sum(w)).
    std::vector<int8_t> x(xq, xq + static_cast<size_t>(m - 1) * ldx + static_cast<size_t>(w.k));
    for (int i = mc; i < m; ++i) x[static_cast<size_t>(i) * ldx + static_cast<size_t>(w.k - 1)] = 0;
    real(x.data(), xscale, m, ldx, w, y, ldy, col_begin, col_end);
  } else if constexpr (kBug == Bug::kStaleCorrection) {
    real(xq, xscale, m, ldx, w, y, ldy, col_begin, col_end);
    for (int i0 = mc; i0 < m; i0 += mc) {
      const int i1 = std::min(i0 + mc, m);
      for (int i = i0; i < i1; ++i) {
        // avx512vnni's one-row path (a block of one row) computes its own sums.
        if (B == Backend::kAvx512Vnni && i == i1 - 1 && (i1 - i0) % g.mr == 1) continue;
        const int8_t* xr = xq + static_cast<size_t>(i) * ldx;
        for (int j = col_begin + g.nr; j < col_end; ++j) {
          const int prev = j - g.nr;  // same lane of the previous column tile
          const int32_t acc = Dot(xr, w, j);
          float v;
          if (B == Backend::kAvx512Vnni) {
            // biased - 128 * sum(w_prev) = true + 128 * (sum(w_j) - sum(w_prev)), modulo 2^32.
            const int64_t wrong = int64_t{acc} + 128 * (WeightSum(w, j) - WeightSum(w, prev));
            v = Epilogue(static_cast<int32_t>(static_cast<uint32_t>(wrong)), xscale[i], w.scale ? w.scale[j] : 1.0f, w,
                         j);
          } else {
            v = Epilogue(acc, xscale[i], w.scale ? w.scale[prev] : 1.0f, w, j);
          }
          y[static_cast<size_t>(i) * ldy + static_cast<size_t>(j)] = v;
        }
      }
    }
  }
}

template <Backend B>
MatMulQFn InjectedFor(Bug bug) {
  switch (bug) {
    case Bug::kNone:
      return &Injected<B, Bug::kNone>;
    case Bug::kSkipRowInLaterPanel:
      return &Injected<B, Bug::kSkipRowInLaterPanel>;
    case Bug::kDropTailLane:
      return &Injected<B, Bug::kDropTailLane>;
    case Bug::kStaleCorrection:
      return &Injected<B, Bug::kStaleCorrection>;
  }
  return nullptr;
}

MatMulQFn InjectedEntry(Backend b, Bug bug) {
  switch (b) {
    case Backend::kAvx2:
      return InjectedFor<Backend::kAvx2>(bug);
    case Backend::kAvx512Vnni:
      return InjectedFor<Backend::kAvx512Vnni>(bug);
    case Backend::kNeon:
      return InjectedFor<Backend::kNeon>(bug);
    case Backend::kWasm:
      return InjectedFor<Backend::kWasm>(bug);
    case Backend::kScalar:
      break;
  }
  return nullptr;
}

// Restores the start-up selection, the backend and the threads after a test.
class SelectionGuard {
 public:
  SelectionGuard() : backend_(ActiveBackend()) {}
  ~SelectionGuard() {
    internal::Reinitialize();
    (void)SetBackend(backend_);
  }

 private:
  Backend backend_;
};

// ---- The shapes reach every panel (pure geometry: every unit, whatever this CPU) ----

class GateShapesTest : public ::testing::TestWithParam<Backend> {};

// One shape must have, for this unit's blocking: a second full row panel and a partial third
// whose rows are not a multiple of kMr, a column range of two full tiles and a tail, a k
// tail, and strides longer than the rows.
TEST_P(GateShapesTest, ReachEveryPanel) {
  const std::optional<Geometry> g = GeometryOf(GetParam());
  if (!g) GTEST_SKIP() << "scalar is the reference the gates compare against: no panels, never gated";
  bool found = false;
  for (const internal::GateShape& s : internal::GateShapes()) {
    const int mc = RowPanelRows(s.k, g->mr);
    const int cols = (s.n - s.col_begin / 2) - s.col_begin;
    const bool rows = s.m > 2 * mc && (s.m % mc) % g->mr != 0;
    const bool columns = cols > 2 * g->nr && cols % g->nr != 0 && s.col_begin % g->nr != 0;
    if (rows && columns && s.k % g->lanes != 0 && s.pad > 0 && s.scale && s.bias) found = true;
  }
  EXPECT_TRUE(found) << "no gate shape reaches a third row panel with column and k tails for "
                     << BackendName(GetParam());
}

INSTANTIATE_TEST_SUITE_P(AllBackends, GateShapesTest, ::testing::ValuesIn(kBackends),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return std::string(BackendName(info.param));
                         });

// The interleaved shapes reach what a unit reading the KV cache's layouts must get right:
// both layouts, one x row, x rows past a tile of 8 with a short last tile, a view starting
// inside its first tile, a column range starting past the first tile and ending inside one.
TEST(GateShapes, ReachEveryInterleavedCase) {
  bool keys = false, values = false, one_row = false, short_last = false, mid_tile = false, later_tile = false,
       partial_end = false;
  for (const internal::GateShape& s : internal::GateShapes()) {
    if (s.layout == internal::GateLayout::kRowMajor) continue;
    keys = keys || s.layout == internal::GateLayout::kInterleavedKeys;
    values = values || s.layout == internal::GateLayout::kInterleavedValues;
    one_row = one_row || s.m == 1;
    short_last = short_last || (s.m > 8 && s.m % 8 != 0 && s.m % 8 <= 4);
    const int first = s.first_row + s.col_begin, end = s.first_row + s.n - s.col_begin / 2;
    mid_tile = mid_tile || first % kInterleavedRows != 0;
    later_tile = later_tile || first >= kInterleavedRows;
    partial_end = partial_end || end % kInterleavedRows != 0;
    EXPECT_EQ(s.k % 4, 0) << "an interleaved view's k is a multiple of 4";
  }
  EXPECT_TRUE(keys && values && one_row && short_last && mid_tile && later_tile && partial_end);
}

// The gates compare every SIMD unit on an interleaved view with scalar on the row-major
// rows; scalar reads the layout itself through QMatrixView::At, so on the same views it must
// give those bits too.
TEST(GateShapes, ScalarReadsInterleavedViewsAsTheirRows) {
  EXPECT_EQ(internal::RunGate(&scalar::MatMulQ), "");
}

// ---- A unit with a later-panel bug is demoted ----

class GateInjectionTest : public ::testing::TestWithParam<std::tuple<Backend, Bug>> {};

TEST_P(GateInjectionTest, DemotesTheBackend) {
  const auto [b, bug] = GetParam();
  if (b == Backend::kScalar) GTEST_SKIP() << "scalar is the reference the gates compare against: never gated";
  const BackendStatus before = StatusOf(b);
  if (!before.supported) GTEST_SKIP() << BackendName(b) << " is not supported here: " << before.reason;
  ASSERT_TRUE(before.gate_passed) << before.reason;
  SelectionGuard guard;
  internal::BackendTable entries = internal::LiveEntries();
  entries[static_cast<size_t>(b)] = InjectedEntry(b, bug);
  internal::Reinitialize(entries);
  const BackendStatus s = StatusOf(b);
  if (bug == Bug::kNone) {
    EXPECT_TRUE(s.gate_passed) << "the wrapper alone must not change a bit: " << s.reason;
    return;
  }
  EXPECT_FALSE(s.gate_passed) << BackendName(b) << " with " << BugName(bug) << " passed its gate";
  EXPECT_NE(s.reason.find("failed its exactness gate"), std::string::npos) << s.reason;
  EXPECT_NE(ActiveBackend(), b);
  EXPECT_FALSE(SetBackend(b).ok());
  // The gates share operands across units: the others still pass.
  for (Backend other : kBackends)
    if (other != b && StatusOf(other).supported) EXPECT_TRUE(StatusOf(other).gate_passed) << BackendName(other);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, GateInjectionTest,
                         ::testing::Combine(::testing::ValuesIn(kBackends),
                                            ::testing::Values(Bug::kNone, Bug::kSkipRowInLaterPanel, Bug::kDropTailLane,
                                                              Bug::kStaleCorrection)),
                         [](const ::testing::TestParamInfo<std::tuple<Backend, Bug>>& info) {
                           return std::string(BackendName(std::get<0>(info.param))) + "_" +
                                  BugName(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace daisy::kernels
