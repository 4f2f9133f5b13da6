// Start-up choice of the row operations' variant (rowops.inc): the widest this CPU runs,
// gated against the baseline variant bit for bit on seeded rows, as the product units are.
// DAISY_KERNELS=scalar keeps the baseline, like every other unit.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "daisy/detmath.h"
#include "daisy/log.h"
#include "internal.h"

namespace daisy::kernels {
namespace rowops {
namespace base {
bool QuantizeRow(const float* x, int k, int8_t* q, float* scale);
bool QuantizeRowTwoTerms(const float* x, int k, int8_t* q1, float* s1, int8_t* q2, float* s2, float* r);
void ExpN(float* x, int n);
void SoftmaxRows(float* const* rows_at, const int* n, int rows);
void Silu(const float* g, const float* u, int n, float* out);
void AddScale(const float* a, const float* b, float c, int n, float* out);
void Mul(const float* a, const float* b, int n, float* out);
}  // namespace base
#if defined(DAISY_KERNELS_X86)
namespace avx2 {
bool QuantizeRow(const float* x, int k, int8_t* q, float* scale);
bool QuantizeRowTwoTerms(const float* x, int k, int8_t* q1, float* s1, int8_t* q2, float* s2, float* r);
void ExpN(float* x, int n);
void SoftmaxRows(float* const* rows_at, const int* n, int rows);
void Silu(const float* g, const float* u, int n, float* out);
void AddScale(const float* a, const float* b, float c, int n, float* out);
void Mul(const float* a, const float* b, int n, float* out);
}  // namespace avx2
namespace avx512 {
bool QuantizeRow(const float* x, int k, int8_t* q, float* scale);
bool QuantizeRowTwoTerms(const float* x, int k, int8_t* q1, float* s1, int8_t* q2, float* s2, float* r);
void ExpN(float* x, int n);
void SoftmaxRows(float* const* rows_at, const int* n, int rows);
void Silu(const float* g, const float* u, int n, float* out);
void AddScale(const float* a, const float* b, float c, int n, float* out);
void Mul(const float* a, const float* b, int n, float* out);
}  // namespace avx512
#endif
}  // namespace rowops

namespace internal {

std::vector<RowOps> RowOpsVariants() {
  std::vector<RowOps> v;
  v.push_back({"base", &rowops::base::QuantizeRow, &rowops::base::QuantizeRowTwoTerms, &rowops::base::ExpN,
               &rowops::base::SoftmaxRows, &rowops::base::Silu, &rowops::base::AddScale, &rowops::base::Mul, ""});
#if defined(DAISY_KERNELS_X86)
  v.push_back({"avx2", &rowops::avx2::QuantizeRow, &rowops::avx2::QuantizeRowTwoTerms, &rowops::avx2::ExpN,
               &rowops::avx2::SoftmaxRows, &rowops::avx2::Silu, &rowops::avx2::AddScale, &rowops::avx2::Mul,
               CpuSupportProblem(Backend::kAvx2)});
  // AVX-512 F/BW/VL is all it needs; a CPU with the product unit's VNNI has them.
  v.push_back({"avx512", &rowops::avx512::QuantizeRow, &rowops::avx512::QuantizeRowTwoTerms, &rowops::avx512::ExpN,
               &rowops::avx512::SoftmaxRows, &rowops::avx512::Silu, &rowops::avx512::AddScale, &rowops::avx512::Mul,
               CpuSupportProblem(Backend::kAvx512Vnni)});
#endif
  return v;
}

namespace {
// Seeded values for the gate: every magnitude from denormals to near overflow, both signs,
// exact ties of the rounding step, zeros, and the inputs Exp treats specially.
float GateValue(uint64_t i) {
  const uint64_t h = SplitMix64(i);
  switch (h % 8) {
    case 0:
      return static_cast<float>(static_cast<int64_t>(h >> 40) % 255 - 127) + 0.5f;  // a tie at scale 1
    case 1:
      return __builtin_bit_cast(float, static_cast<uint32_t>(h >> 32));  // any pattern (NaN and inf included)
    case 2:
      return 0.0f;
    default: {
      const float mant = static_cast<float>(static_cast<int64_t>(h >> 40) - (int64_t{1} << 23)) / 8388608.0f;
      const int e = static_cast<int>((h >> 8) % 64) - 40;
      float v = mant;
      for (int j = 0; j < (e < 0 ? -e : e); ++j) v = e < 0 ? v * 0.5f : v * 2.0f;
      return v;
    }
  }
}

std::string Compare(const RowOps& want, const RowOps& got) {
  // QuantizeRow on rows of every length up to 300 (tails of every vector width), some rows
  // free of NaN and inf (case 1 draws are replaced) so that most rows quantize.
  uint64_t at = 0;
  for (int k = 1; k <= 300; ++k) {
    for (int clean = 0; clean < 2; ++clean) {
      std::vector<float> x(static_cast<size_t>(k));
      for (float& v : x) {
        v = GateValue(at++);
        if (clean && (v != v || v - v != 0.0f)) v = 1.0f;
      }
      if (k % 7 == 0) x[0] = 127.0f;  // scale exactly 1: the .5 values are exact ties
      std::vector<int8_t> qa(x.size()), qb(x.size());
      float sa = -1, sb = -1;
      const bool oka = want.quantize_row(x.data(), k, qa.data(), &sa);
      const bool okb = got.quantize_row(x.data(), k, qb.data(), &sb);
      if (oka != okb || (oka && (std::memcmp(qa.data(), qb.data(), qa.size()) != 0 ||
                                 __builtin_bit_cast(uint32_t, sa) != __builtin_bit_cast(uint32_t, sb))))
        return "QuantizeRow differs on a row of " + std::to_string(k) + " values";
    }
  }
  // QuantizeRowTwoTerms on the same kind of rows (the residual's arithmetic).
  for (int k = 1; k <= 300; k += 7) {
    std::vector<float> x(static_cast<size_t>(k)), r(x.size());
    for (float& v : x) {
      v = GateValue(at++);
      if (v != v || v - v != 0.0f) v = 0.75f;
    }
    std::vector<int8_t> a1(x.size()), a2(x.size()), b1(x.size()), b2(x.size());
    float sa[2] = {-1, -1}, sb[2] = {-1, -1};
    const bool oka = want.quantize_two_terms(x.data(), k, a1.data(), &sa[0], a2.data(), &sa[1], r.data());
    const bool okb = got.quantize_two_terms(x.data(), k, b1.data(), &sb[0], b2.data(), &sb[1], r.data());
    if (oka != okb ||
        (oka && (a1 != b1 || a2 != b2 || __builtin_bit_cast(uint64_t, sa) != __builtin_bit_cast(uint64_t, sb))))
      return "QuantizeRowTwoTerms differs on a row of " + std::to_string(k) + " values";
  }
  // SoftmaxRows over batches of rows of mixed lengths (attention scores: finite, spread
  // over tens of units), 1 to 11 rows so every grouping and tail is reached.
  for (int rows = 1; rows <= 11; ++rows) {
    std::vector<std::vector<float>> a(static_cast<size_t>(rows)), b;
    std::vector<int> n(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      n[static_cast<size_t>(r)] = 1 + static_cast<int>(SplitMix64(at++) % 150);
      for (int i = 0; i < n[static_cast<size_t>(r)]; ++i)
        a[static_cast<size_t>(r)].push_back(static_cast<float>(static_cast<int64_t>(SplitMix64(at++) % 4001) - 2000) /
                                            64.0f);
    }
    b = a;
    std::vector<float*> pa, pb;
    for (int r = 0; r < rows; ++r) {
      pa.push_back(a[static_cast<size_t>(r)].data());
      pb.push_back(b[static_cast<size_t>(r)].data());
    }
    want.softmax_rows(pa.data(), n.data(), rows);
    got.softmax_rows(pb.data(), n.data(), rows);
    for (int r = 0; r < rows; ++r)
      if (std::memcmp(a[static_cast<size_t>(r)].data(), b[static_cast<size_t>(r)].data(),
                      a[static_cast<size_t>(r)].size() * sizeof(float)) != 0)
        return "SoftmaxRows differs on row " + std::to_string(r) + " of " + std::to_string(rows);
  }
  // Silu, gated and not, over rows of every length up to 70 (activations: any finite
  // value, with exact zeros and the magnitudes where Exp saturates).
  for (int k = 1; k <= 70; ++k) {
    std::vector<float> g(static_cast<size_t>(k)), u(g.size()), a(g.size()), b(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = GateValue(at++);
      if (g[i] != g[i] || g[i] - g[i] != 0.0f) g[i] = i % 2 ? 95.0f : -110.0f;
      u[i] = GateValue(at++) / 1e20f;
      if (u[i] != u[i] || u[i] - u[i] != 0.0f) u[i] = -2.5f;
    }
    for (const float* up : {static_cast<const float*>(nullptr), static_cast<const float*>(u.data())}) {
      want.silu(g.data(), up, k, a.data());
      got.silu(g.data(), up, k, b.data());
      if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0)
        return std::string("Silu") + (up ? " (gated)" : "") + " differs on a row of " + std::to_string(k) + " values";
    }
  }
  // AddScale and Mul on rows of every length up to 70 (any finite values, zeros and
  // infinities; no NaN input: which operand's payload a NaN result carries is the
  // compiler's choice of operand order, and the forward pass refuses NaN anyway).
  for (int k = 1; k <= 70; ++k) {
    std::vector<float> x(static_cast<size_t>(k)), y(x.size()), a(x.size()), b(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = GateValue(at++);
      y[i] = GateValue(at++);
      if (x[i] != x[i]) x[i] = -__builtin_inff();
      if (y[i] != y[i]) y[i] = 3.0f;
    }
    const float c = 0.125f + static_cast<float>(k) / 1024.0f;
    want.add_scale(x.data(), y.data(), c, k, a.data());
    got.add_scale(x.data(), y.data(), c, k, b.data());
    if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0)
      return "AddScale differs on a row of " + std::to_string(k) + " values";
    want.mul(x.data(), y.data(), k, a.data());
    got.mul(x.data(), y.data(), k, b.data());
    if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0)
      return "Mul differs on a row of " + std::to_string(k) + " values";
  }
  // ExpN over 4096 values in rows of odd lengths, plus its boundaries.
  std::vector<float> e;
  e.reserve(4096 + 9 + 1024);
  for (int i = 0; i < 4096; ++i) e.push_back(GateValue(at++) / (i % 3 == 0 ? 1.0f : 1e30f));
  for (float v : {89.0f, 89.0001f, -104.0f, -104.0001f, 88.72f, -87.3f, -0.0f, __builtin_inff(), -__builtin_inff()})
    e.push_back(v);
  // and [-16, 16) in steps of 1/32: the softmax and SiLU range, every result size there
  for (int i = -512; i < 512; ++i) e.push_back(static_cast<float>(i) / 32.0f);
  for (size_t i0 = 0, len = 1; i0 < e.size(); i0 += len, len = len % 37 + 1) {
    const size_t n = std::min(len, e.size() - i0);
    std::vector<float> a(e.begin() + static_cast<long>(i0), e.begin() + static_cast<long>(i0 + n)), b = a;
    want.exp_n(a.data(), static_cast<int>(n));
    got.exp_n(b.data(), static_cast<int>(n));
    if (std::memcmp(a.data(), b.data(), n * sizeof(float)) != 0)
      return "ExpN differs near input " + std::to_string(e[i0]);
  }
  return "";
}
}  // namespace

std::string GateRowOps(const RowOps& variant) {
  return Compare(RowOpsVariants()[0], variant);
}

const RowOps& ActiveRowOps() {
  static const RowOps kChosen = [] {
    const std::vector<RowOps> all = RowOpsVariants();
    const char* env = std::getenv("DAISY_KERNELS");
    if (env != nullptr && std::string(env) == "scalar") return all[0];
    for (size_t i = all.size(); i-- > 1;) {
      if (!all[i].unsupported.empty()) continue;
      const std::string why = Compare(all[0], all[i]);
      if (why.empty()) return all[i];
      LogWarning("kernels: row operations " + std::string(all[i].name) + " demoted: " + why);
    }
    return all[0];
  }();
  return kChosen;
}

}  // namespace internal

bool QuantizeRow(const float* x, int k, int8_t* q, float* scale) {
  return internal::ActiveRowOps().quantize_row(x, k, q, scale);
}

bool QuantizeRowTwoTerms(const float* x, int k, int8_t* q1, float* s1, int8_t* q2, float* s2, float* r) {
  return internal::ActiveRowOps().quantize_two_terms(x, k, q1, s1, q2, s2, r);
}

void SoftmaxRows(float* const* rows_at, const int* n, int rows) {
  internal::ActiveRowOps().softmax_rows(rows_at, n, rows);
}

void Silu(const float* g, const float* u, int n, float* out) {
  internal::ActiveRowOps().silu(g, u, n, out);
}

void AddScale(const float* a, const float* b, float c, int n, float* out) {
  internal::ActiveRowOps().add_scale(a, b, c, n, out);
}

void Mul(const float* a, const float* b, int n, float* out) {
  internal::ActiveRowOps().mul(a, b, n, out);
}

}  // namespace daisy::kernels

namespace daisy::detmath {
void ExpN(float* x, int n) {
  kernels::internal::ActiveRowOps().exp_n(x, n);
}
}  // namespace daisy::detmath
