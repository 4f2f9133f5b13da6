// The probe: a seeded product through the live backend plus the deterministic f32 op set,
// hashed to 64 bits. Every input is generated from integers (no libm), every output is
// serialized in a fixed little-endian byte order, so honest devices agree on every bit.
#include <cstring>
#include <vector>

#if defined(DAISY_XXHASH_INLINE)
#define XXH_INLINE_ALL  // cross builds without a target libxxhash (scripts/test-arm64.sh)
#endif
#include <xxhash.h>

#include "daisy/detmath.h"
#include "daisy/status.h"
#include "internal.h"

namespace daisy::kernels {
namespace {

void PutU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int b = 0; b < 4; ++b) out.push_back(static_cast<uint8_t>(v >> (8 * b)));
}
void PutF32(std::vector<uint8_t>& out, float f) {
  uint32_t v;
  std::memcpy(&v, &f, 4);
  PutU32(out, v);
}
void PutF64(std::vector<uint8_t>& out, double d) {
  uint64_t v;
  std::memcpy(&v, &d, 8);
  PutU32(out, static_cast<uint32_t>(v));
  PutU32(out, static_cast<uint32_t>(v >> 32));
}

// A float in [-range, range] on a grid of range / 2^20: exact from integers alone.
float SeededFloat(uint64_t counter, float range) {
  const int64_t r = static_cast<int64_t>(internal::SplitMix64(counter) % (2 * 1048576 + 1)) - 1048576;
  return static_cast<float>(r) * (range / 1048576.0f);
}

// The products: f32 inputs quantized by QuantizeMatrix/QuantizeRow (so the quantizer is
// covered too), multiplied through MatMul (live backend, threads, epilogue with bias).
void AppendProducts(std::vector<uint8_t>& out) {
  struct Shape {
    int m, n, k;
  };
  constexpr Shape kShapes[] = {{1, 67, 333}, {5, 40, 1000}, {3, 130, 64}};
  uint64_t counter = 0x9B0BE;
  for (const Shape& s : kShapes) {
    std::vector<float> wf(static_cast<size_t>(s.n) * static_cast<size_t>(s.k)), bias(static_cast<size_t>(s.n));
    std::vector<float> x(static_cast<size_t>(s.m) * static_cast<size_t>(s.k)),
        y(static_cast<size_t>(s.m) * static_cast<size_t>(s.n));
    for (float& v : wf) v = SeededFloat(counter++, 0.5f);
    for (float& v : bias) v = SeededFloat(counter++, 2.0f);
    for (float& v : x) v = SeededFloat(counter++, 8.0f);
    auto w = QuantizeMatrix(wf, s.n, s.k, bias, "probe");
    DAISY_CHECK(w.ok(), "Bug: probe weights refused");
    DAISY_CHECK(MatMul(x.data(), s.m, w->View(), y.data()), "Bug: probe activations refused");
    for (float v : w->scale) PutF32(out, v);
    for (float v : y) PutF32(out, v);
  }
}

// The f32 op set the forward pass uses (src/kernels/detmath.cc), on seeded arguments over
// each function's range.
void AppendDetmath(std::vector<uint8_t>& out) {
  uint64_t counter = 0xDE7A;
  for (int i = 0; i < 256; ++i) PutF32(out, detmath::Exp(SeededFloat(counter++, 90.0f)));
  for (int i = 0; i < 256; ++i) PutF32(out, detmath::Tanh(SeededFloat(counter++, 12.0f)));
  for (int i = 0; i < 256; ++i) {
    // Half small angles, half RoPE-sized ones (|x| up to 1e6 rad).
    const float a = SeededFloat(counter++, i % 2 == 0 ? 8.0f : 1.0e6f);
    PutF32(out, detmath::Sin(a));
    PutF32(out, detmath::Cos(a));
  }
  for (int i = 0; i < 32; ++i) PutF64(out, detmath::PowD(10000.0, -2.0 * i / 64.0));
}

}  // namespace

uint64_t internal::ProductProbeHash() {
  std::vector<uint8_t> bytes;
  PutU32(bytes, 0x31504344u);  // "DCP1": the probe's layout version
  AppendProducts(bytes);
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t ProbeHash() {
  std::vector<uint8_t> bytes;
  PutU32(bytes, 0x31504344u);  // "DCP1": the probe's layout version
  AppendProducts(bytes);
  AppendDetmath(bytes);
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace daisy::kernels
