// The verified INT8 units (docs/KERNELS.md has the exact arithmetic). Every matrix product
// of the project goes through MatMul*, whose result bits are identical on every backend:
// int8 x int8 products accumulate exactly in int32, then one fixed sequence of IEEE f32
// operations (the epilogue) turns each int32 into the output. The backend is chosen at
// start-up from cpuid + OS support, gated bit-for-bit against the scalar reference, and
// can be forced with DAISY_KERNELS=scalar|avx2|avx512vnni|neon|wasm.
// Thread-safety: MatMul, MatMulQ, AuditCells and ProbeHash are thread-safe; SetBackend and
// SetThreads must not race with running products.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/memory.h"
#include "daisy/status.h"

namespace daisy::kernels {

// The largest reduction length: 127 * 127 * K must stay below 2^31 so int32 cannot overflow.
inline constexpr int kMaxK = 131071;

// kWasm: WebAssembly SIMD128, built only into the Emscripten build (the browser node).
enum class Backend : uint8_t { kScalar = 0, kAvx2 = 1, kAvx512Vnni = 2, kNeon = 3, kWasm = 4 };
inline constexpr int kBackendCount = 5;
std::string_view BackendName(Backend backend);

// Symmetric round-half-even quantization of one row of k floats:
//   amax = max_i |x_i|; scale = amax / 127 (0 when amax == 0);
//   q_i = clamp(round_half_even(x_i / scale), -127, 127) (0 when scale == 0).
// A non-finite input is reported by returning false (q and scale are then unspecified).
bool QuantizeRow(const float* x, int k, int8_t* q, float* scale);

// Rows per tile of the interleaved layout below.
inline constexpr int kInterleavedRows = 16;

// A read-only view of an int8 matrix of n rows (output channels) by k columns, with an
// optional per-row scale (nullptr means 1.0f) and optional bias. Two layouts, the same
// products (same bits):
// - row-major (tile_stride == 0): row r at q + r * ld;
// - interleaved (tile_stride > 0), the layout a broadcast product reads without repacking
//   (the KV cache's keys and values, docs/KERNELS.md "Attention and the KV cache"): rows in
//   tiles of kInterleavedRows, k in groups of 4. Group g of tile T is 64 bytes at
//   q + T * tile_stride + g * group_stride, holding bytes 4g .. 4g + 3 of the tile's row c at
//   offset 4c. View row r is layout row first_row + r (first_row < kInterleavedRows: a view
//   may start inside its first tile). k is a multiple of 4; a product may read every byte
//   of each tile's groups that holds one of its rows.
struct QMatrixView {
  const int8_t* q = nullptr;
  const float* scale = nullptr;
  const float* bias = nullptr;
  int n = 0;
  int k = 0;
  size_t ld = 0;            // elements between rows; >= k (row-major)
  size_t tile_stride = 0;   // interleaved: bytes from tile T to T + 1; 0: row-major
  size_t group_stride = 0;  // interleaved: bytes from group g to g + 1 of a tile
  int first_row = 0;        // interleaved: layout row of view row 0
  bool interleaved() const { return tile_stride != 0; }
  // Interleaved: the byte of (view row r, column t).
  const int8_t* At(int r, int t) const {
    const int row = first_row + r;
    return q + static_cast<size_t>(row / kInterleavedRows) * tile_stride + static_cast<size_t>(t / 4) * group_stride +
           static_cast<size_t>(row % kInterleavedRows) * 4 + static_cast<size_t>(t % 4);
  }
};

// Resident weights: quantized once at load, about 1 byte per parameter.
struct QuantizedMatrix {
  int n = 0;                 // output channels
  int k = 0;                 // input features
  LargePageBytes q;          // (n, k) row-major; large pages: a decode streams it every token
  std::vector<float> scale;  // (n)
  std::vector<float> bias;   // (n) or empty
  // The second int8 term of a two-term matrix (QuantizeRowTwoTerms per row), else empty.
  LargePageBytes q_res;          // (n, k)
  std::vector<float> scale_res;  // (n)
  bool two_terms() const { return !q_res.empty(); }
  QMatrixView View() const {
    return QMatrixView{q.data(), scale.data(), bias.empty() ? nullptr : bias.data(), n, k, static_cast<size_t>(k)};
  }
  // The second term without bias (two_terms() only).
  QMatrixView ResidualView() const {
    return QMatrixView{q_res.data(), scale_res.data(), nullptr, n, k, static_cast<size_t>(k)};
  }
  size_t Bytes() const { return q.size() + q_res.size() + 4 * (scale.size() + scale_res.size() + bias.size()); }
};

// x (k) as two int8 terms, x ~= s1 * q1 + s2 * q2: (q1, s1) = QuantizeRow(x), then the
// residual r[d] = x[d] - float(q1[d]) * s1 (one multiply, one subtract, no FMA) quantized
// the same way, so s2 <= s1 / 254 (up to rounding): about 15 bits instead of 8. Every step
// is a function of this one row. r is scratch (k), apart from x. False on a non-finite input.
bool QuantizeRowTwoTerms(const float* x, int k, int8_t* q1, float* s1, int8_t* q2, float* s2, float* r);

// ops::SoftmaxRows (src/forward/ops.h has the arithmetic) through the row operations'
// variant in use: the same bits at every vector width.
void SoftmaxRows(float* const* rows_at, const int* n, int rows);
// out[j] = g[j] / (1 + detmath::Exp(-g[j])), then times u[j] when u is not null (the
// bits of ops::Silu(g[j]) * u[j]), through the row operations' variant in use.
void Silu(const float* g, const float* u, int n, float* out);
// out[i] = (a[i] + b[i]) * c, and out[i] = a[i] * b[i]: the same IEEE operations at every
// vector width (out may be a or b).
void AddScale(const float* a, const float* b, float c, int n, float* out);
void Mul(const float* a, const float* b, int n, float* out);

// Quantizes w (n, k) row-major f32 (per output channel), with an optional bias (n).
// Refuses k > kMaxK and non-finite weights, naming `what`.
Result<QuantizedMatrix> QuantizeMatrix(std::span<const float> w, int n, int k, std::span<const float> bias,
                                       std::string_view what);

// The product shapes whose backend is chosen separately (each backend gives the same bits,
// so the choice is free and only speed differs): kGemv, one activation row against a weight
// matrix (decode: streams the weights from memory); kGemm, several rows (prefill: compute-
// bound); kAttention, attention's Q.K and P.V against the KV cache (small k or n).
enum class ProductShape : uint8_t { kGemv = 0, kGemm = 1, kAttention = 2 };
inline constexpr int kProductShapes = 3;
std::string_view ProductShapeName(ProductShape shape);

// y (m, n) with row stride ldy:
//   acc = sum_t xq[i][t] * w.q[j][t]                      (exact, int32)
//   y[i][j] = float(acc) * (xscale[i] * wscale[j])          (wscale 1.0f when w.scale null)
//   y[i][j] = y[i][j] + bias[j]                            (when w.bias set)
// xq rows have stride ldx. Uses the active backend and the configured threads; the bits do
// not depend on either. Contract: every int8 value is in [-127, 127] (what QuantizeRow
// produces) and 0 <= w.k <= kMaxK; a larger k is a bug and aborts ("Bug: ...").
// The shape is kGemv when m == 1, else kGemm.
void MatMulQ(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy);
// The same product through the backend chosen for `shape` (same bits whatever the shape).
void MatMulQ(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y, size_t ldy,
             ProductShape shape);

// Memory the calling thread's interleaved products (attention's, against the KV cache) read
// ahead into cache, a line at a time between their groups of weights, range after range in
// order, until all are covered or the ranges are replaced; none stops it. A decode step's
// attention is compute-bound while the memory idles, so the forward pass names what comes
// next: the following heads' keys and values, then the weights of the product after
// attention (docs/KERNELS.md, Figures, "Reading ahead during attention"). Only a hint: no
// bit depends on it, a range past a buffer is harmless (a prefetch never faults), and
// backends without a measured gain from it ignore it (the avx2 unit follows it). At most
// kMaxPrefetchRanges ranges; later ones are dropped.
struct PrefetchRange {
  const void* begin = nullptr;
  size_t bytes = 0;
};
inline constexpr int kMaxPrefetchRanges = 16;
void PrefetchDuringProducts(std::span<const PrefetchRange> ranges);
// The bytes a product over an interleaved view reads: from the start of its first tile's
// first group to the end of its last tile's last group (whole 64-byte groups; with tiles
// interleaved inside groups, as the KV cache's values are, the lines between belong to
// other tiles). Empty for a row-major or empty view.
PrefetchRange InterleavedBytes(const QMatrixView& w);

// Quantizes each of the m rows of x (m, k) and multiplies: y (m, n) = x . w^T.
// Returns false when x holds a non-finite value (nothing is written then).
bool MatMul(const float* x, int m, const QMatrixView& w, float* y);

// Backend selection, done once before the first product: BackendReport() lists every
// backend, whether this CPU and OS can run each (cpuid + XGETBV, HWCAP, the wasm build) and whether it
// passed its gate (bit-identical to scalar on seeded shapes: odd K, tails, zeros, extremes);
// a backend that failed is demoted, with a warning in the log.
struct BackendStatus {
  Backend backend;
  bool supported = false;    // CPU + OS can run it
  bool gate_passed = false;  // bit-identical to scalar on the gate shapes
  std::string reason;        // why not supported / why demoted
};
std::vector<BackendStatus> BackendReport();
// The backend each product shape uses. At start-up every backend that passed its gate is
// timed on one product of each shape (single thread, a fraction of a second) and the fastest
// is chosen per shape; the timings are cached per CPU model and kernel version in
// DAISY_HOME/kernels-choice-<cpu hash>.json (a corrupt or stale file is ignored with a log
// line and rewritten). DAISY_KERNELS or SetBackend forces one backend for every shape. A backend that
// failed its gate is never chosen.
struct BackendChoice {
  Backend shape[kProductShapes] = {Backend::kScalar, Backend::kScalar, Backend::kScalar};
  std::string source;  // "measured", "cache", "DAISY_KERNELS", "SetBackend", "only scalar"
  Backend For(ProductShape s) const { return shape[static_cast<int>(s)]; }
};
BackendChoice ActiveChoice();
// One line for logs, the hello and the UI (at most 64 bytes): "avx2" when every shape uses
// the same backend, else "gemv:avx2 gemm:avx512vnni attention:avx2".
std::string BackendChoiceSummary();
// The decode GEMV's backend (ActiveChoice().For(kGemv)): what capacity and the probe run on.
Backend ActiveBackend();
// Forces a backend for every shape (tests, DAISY_KERNELS). Fails if unsupported or it failed
// its gate.
Status SetBackend(Backend backend);
// Threads used over output columns (default: all cores), from a persistent pool; each output
// cell is computed whole by one thread, so the bits do not depend on the count. A wasm build
// without pthreads (the browser node) always uses 1.
void SetThreads(int n_threads);
int Threads();

// 64-bit hash of a seeded GEMM plus the f32 op set (detmath); equal on every honest device.
// Runs through the active backend and threads; the exact inputs are in docs/KERNELS.md.
uint64_t ProbeHash();

// Live audit: re-computes n_cells random cells (every cell when n_cells >= m * n) of a
// finished product y = MatMulQ(xq, xscale, m, ldx, w) with the scalar reference and compares
// the bits. Cells are drawn from a counter-based generator keyed by `seed`. Read-only.
struct AuditResult {
  int checked = 0;     // cells re-computed
  int mismatches = 0;  // cells whose bits differ from the reference
  int row = -1;        // first mismatching cell (row, col), -1 when none
  int col = -1;
  float expected = 0.0f;  // the reference value and the product's value there
  float got = 0.0f;
  bool ok() const { return mismatches == 0; }
};
AuditResult AuditCells(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, const float* y,
                       size_t ldy, int n_cells, uint64_t seed);

// The always-on sampled audit inside MatMulQ: every `every`-th product (0 = off) re-checks
// `cells` random cells against scalar. A mismatch is logged as an error, demotes the backend
// and the product is recomputed with scalar before MatMulQ returns. Default: every 1024th
// product, 1 cell; DAISY_AUDIT_EVERY=N sets `every` at start-up.
void SetAuditRate(int every, int cells);
struct AuditStats {
  uint64_t products = 0;    // products audited
  uint64_t cells = 0;       // cells checked
  uint64_t mismatches = 0;  // cells that disagreed
};
AuditStats GetAuditStats();

// Throughput of every backend that is supported and passed its gate, with the configured
// threads, each case run for about seconds_per_case: a decode GEMV (m = 1, n = 73728,
// k = 896: 66 MB of int8 weights, more than any cache, so it measures the weight stream) and
// a prefill GEMM (m = 64, n = 2048, k = 896). gops counts 2 * m * n * k operations; gbps
// counts weight bytes read. Leaves the active backend unchanged. Takes a few seconds.
struct KernelThroughput {
  Backend backend;
  double gemv_gops = 0.0;
  double gemv_gbps = 0.0;
  double gemm_gops = 0.0;
};
std::vector<KernelThroughput> MeasureKernelThroughput(double seconds_per_case);

// Memory read bandwidth in GB/s with the configured threads, from the passes run in about
// `seconds` over a 256 MiB buffer (far larger than the caches), taking turns between every
// thread summing its share (plainly, or prefetching ahead) and the decode GEMV streaming the
// buffer as a matrix. `best_gbps`, the fastest pass, is the ceiling a decode GEMV streaming
// its weights can approach; `median_gbps` (the median of the passes of the kind that gave the
// best) says how far apart this machine's passes are: a decode averages over all of its time.
struct ReadBandwidth {
  double best_gbps = 0.0;
  double median_gbps = 0.0;
  int passes = 0;  // passes of every kind
};
ReadBandwidth MeasureReadBandwidth(double seconds);

// Runs fn(ctx, t) for every t in [0, n_tasks) on the kernels' thread pool (the caller
// works too) and returns when all are done. What a task computes must not depend on which
// thread runs it. With one thread, or n_tasks <= 1, runs them in order on the caller.
void ParallelFor(int n_tasks, void (*fn)(void* ctx, int task), void* ctx);

// What a spin-wait issues each time round (the pool's workers, a pool task waiting for an
// earlier one): x86 pause, arm64 yield, nothing elsewhere.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

// Capacity for the ring planner: reference products per second through the live backend and
// threads. The reference product is decode-shaped: m = 1, n = 4096, k = 4096 (16 MiB of int8
// weights). Takes about 0.3 s.
double MeasureCapacityGemmsPerSecond();

}  // namespace daisy::kernels
