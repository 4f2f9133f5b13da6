// Internal: the per-backend entry points. Each backend is one translation unit compiled
// with its own target flags, in its own namespace; dispatch.cc picks one at run time.
//
// Rule for the ISA translation units (avx2.cc, avx512vnni.cc, neon.cc): they define only
// their one exported entry plus helpers with internal linkage (anonymous namespace), and
// odr-use no inline function or template from a shared header (no std::vector, std::min,
// Status...). Otherwise the linker could keep the ISA-flagged copy of a weak symbol and
// generic code would execute AVX-512 instructions on a CPU without them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "daisy/kernels.h"

namespace daisy::kernels {

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

// What the CPU and the OS can run (cpu_features.cc; compiled without ISA flags).
// Returns an empty string when `backend` can run here, else the reason it cannot.
std::string CpuSupportProblem(Backend backend);

}  // namespace daisy::kernels
