// Internal plumbing of the kernels module shared by dispatch.cc, gates.cc, probe.cc,
// throughput.cc and the tests. Not part of the public surface (include/daisy/kernels.h).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backends.h"

namespace daisy::kernels::internal {

// The entry of a backend built into this binary (nullptr when not built), without any
// injected fault.
MatMulQFn EntryFor(Backend backend);
// EntryFor, or a corrupting wrapper while a fault is injected for `backend`.
MatMulQFn LiveEntryFor(Backend backend);

// Computes all n columns of a product through `fn`, split into contiguous column blocks
// over the thread pool (each cell is computed whole by one thread, so the bits do not
// depend on the thread count).
void RunProduct(MatMulQFn fn, const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y,
                size_t ldy);

// The entries the start-up selection gates and chooses from, indexed by Backend; nullptr
// where a backend is not built. The start-up uses LiveEntries(); tests pass a table with a
// deliberately broken wrapper to Reinitialize(entries) to prove the gate demotes it, so no
// injection code sits in the product path.
using BackendTable = std::array<MatMulQFn, kBackendCount>;
BackendTable LiveEntries();

// Checks `fn` bit-for-bit against the scalar reference on the seeded gate shapes (gates.cc).
// Returns "" when identical, else a description of the first mismatch.
std::string RunGate(MatMulQFn fn);
// RunGate for several entries at once, one result per entry: each shape's operands and
// scalar reference are made once (the start-up gates every supported SIMD unit this way).
std::vector<std::string> RunGates(std::span<const MatMulQFn> fns);

// One gate shape (gates.cc): m x n x k, the column range [col_begin, n - col_begin / 2) handed
// to the entry, and `pad` extra elements per row of x, w and y.
enum class GateFill : uint8_t {
  kRandom,        // uniform in [-127, 127]
  kZeroRows,      // random, but some x rows and some weight rows all zero (scale 0 for x)
  kExtremeSame,   // x = 127, w = 127 everywhere: the largest positive sum
  kExtremeMixed,  // x = -127, w = 127 and x = 127, w = -127: the largest negative sums
};
// How a gate shape lays out its weights (QMatrixView): row-major, or interleaved as the KV
// cache holds them: keys (a tile's groups one after the other, group_stride 64) or values
// (every tile's group g, then group g + 1: tile_stride 64).
enum class GateLayout : uint8_t { kRowMajor, kInterleavedKeys, kInterleavedValues };
struct GateShape {
  int m, n, k;
  GateFill fill;
  bool bias;
  bool scale;     // w.scale set (else nullptr: 1.0f)
  int pad;        // extra elements per row of x, w and y (strides > k, > n); interleaved: 64-byte
                  // blocks between tiles (keys) or groups (values)
  int col_begin;  // the column range handed to the entry (col_end = n - col_begin / 2)
  GateLayout layout = GateLayout::kRowMajor;
  int first_row = 0;  // interleaved: the view's first row inside its first tile
};
std::span<const GateShape> GateShapes();

// ---- Per-shape backend choice (dispatch.cc, choice.cc, throughput.cc) ----
// Seconds per product of each shape (ProductShape) through each backend (Backend); 0 where
// not measured.
using ShapeTimings = std::array<std::array<double, kBackendCount>, kProductShapes>;
// Times every backend in `backends` (entries from `entries`) on one product of each shape,
// on the calling thread alone: the best of a few runs after a warm-up.
ShapeTimings MeasureShapes(const BackendTable& entries, std::span<const Backend> backends);
// MeasureReadBandwidth's figures from its passes' seconds, per kind of pass, over `bytes`:
// the fastest pass of any kind, the median (the lower one of an even count) of that kind's
// passes, and the passes of every kind. Sorts each kind's times.
ReadBandwidth SummarizeReadPasses(std::span<std::vector<double>> seconds_per_kind, double bytes);
// Bumped whenever a unit's code, or the memory its products read, changes, so cached timings
// of older units are not trusted (5: weights and KV caches in large-page memory; 6: the
// decode GEMV in a one-row path of its own, eight rows at a time; 7: attention over the KV
// cache's interleaved layouts; 8: avx2 prefetches its GEMV stream 1 KiB ahead, not 4, and
// reads interleaved layouts two x rows a pass with a vector epilogue; 9: its interleaved
// passes read the PrefetchDuringProducts ranges ahead).
constexpr int kKernelVersion = 9;
// A stable description of this CPU (x86: vendor, family/model/stepping and brand string;
// arm64: MIDR where readable): cached timings are valid only on the same model.
std::string CpuModelKey();
// DAISY_HOME/kernels-choice-<hash of CpuModelKey()>.json (DAISY_HOME, else
// $XDG_CONFIG_HOME/daisychain, else ~/.config/daisychain; "" when none of them is set).
std::string ChoiceCachePath();
// Reads the timings cached for this CPU and kernel version. Returns "" and fills `out` when
// the file is valid and covers every backend of `needed`; else why it is not used.
std::string ReadChoiceCache(const std::string& path, std::span<const Backend> needed, ShapeTimings* out);
// Writes the timings (to a temporary file, then rename: readers never see half a file).
// Returns "" or why it could not.
std::string WriteChoiceCache(const std::string& path, const ShapeTimings& timings);

// SplitMix64: the counter-based generator behind every seeded shape, probe and audit.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// ---- Row operations (rowops.inc, rowops.cc) ----
// One compiled variant of the row operations (rowops.inc);
// `unsupported` says why this CPU cannot run it ("" when it can).
struct RowOps {
  const char* name;
  bool (*quantize_row)(const float* x, int k, int8_t* q, float* scale);
  bool (*quantize_two_terms)(const float* x, int k, int8_t* q1, float* s1, int8_t* q2, float* s2, float* r);
  void (*exp_n)(float* x, int n);
  void (*softmax_rows)(float* const* rows_at, const int* n, int rows);
  void (*silu)(const float* g, const float* u, int n, float* out);
  void (*add_scale)(const float* a, const float* b, float c, int n, float* out);
  void (*mul)(const float* a, const float* b, int n, float* out);
  std::string unsupported;
};
// Every variant built into this binary, the baseline first.
std::vector<RowOps> RowOpsVariants();
// "" when `variant` gives the baseline's bits on the gate's seeded rows, else the first
// difference.
std::string GateRowOps(const RowOps& variant);
// The variant in use: the widest supported one that passed its gate (DAISY_KERNELS=scalar:
// the baseline).
const RowOps& ActiveRowOps();

// ---- Test hooks (kernels_test.cc) ----
// While on, `backend`'s entry flips the lowest bit of its first output cell of every call,
// as a miscompiled or faulty unit would. Lets tests prove that gates, the audit and the
// probe notice a single wrong bit.
void SetFaultInjection(Backend backend, bool on);
// Re-runs CPU detection, the gates and DAISY_KERNELS as at start-up (over `entries`, which
// only the gates and the choice see: products still run LiveEntryFor). Must not race with
// running products.
void Reinitialize();
void Reinitialize(const BackendTable& entries);
// The probe's product part alone (ProbeHash without the detmath op set): a golden value
// in kernels_test pins it across ISAs (x86-64 here, arm64 under qemu).
uint64_t ProductProbeHash();

}  // namespace daisy::kernels::internal
