// The forward pass: Embed -> RunLayers -> Readout, the KV cache and the in-process stages.
// Reads top to bottom like the model; every product is a verified INT8 unit, every f32 op
// is in ops.h with a fixed evaluation order.
#include "daisy/forward.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "daisy/detmath.h"
#include "ops.h"

namespace daisy {

namespace {

using kernels::QMatrixView;

std::string At(int layer, int position) {
  return "layer " + std::to_string(layer) + ", position " + std::to_string(position);
}

// The error for a product whose input x (m, k) was refused as non-finite: the first bad row
// of rows [i0, i1) (default: all) is named.
Status NonFiniteInput(const char* what, const float* x, int k, int layer, const std::vector<int32_t>& positions,
                      int i0 = 0, int i1 = -1) {
  if (i1 < 0) i1 = static_cast<int>(positions.size());
  const int64_t bad =
      ops::FirstNonFinite(x + static_cast<size_t>(i0) * static_cast<size_t>(k), static_cast<int64_t>(i1 - i0) * k);
  const int row = i0 + (bad < 0 ? 0 : static_cast<int>(bad / k));
  return DataLoss(At(layer, positions[static_cast<size_t>(row)]) + ": non-finite " + what + "; refused");
}

// Refuses hidden states holding inf or NaN in rows [i0, i1) (default: all), naming where.
Status CheckFinite(const HiddenStates& h, const std::string& where, int i0 = 0, int i1 = -1) {
  if (i1 < 0) i1 = h.n_tokens();
  const size_t dim = static_cast<size_t>(h.hidden);
  const int64_t bad =
      ops::FirstNonFinite(h.values.data() + static_cast<size_t>(i0) * dim, static_cast<int64_t>(i1 - i0) * h.hidden);
  if (bad < 0) return Status::Ok();
  const int row = i0 + static_cast<int>(bad / h.hidden);
  return DataLoss(where + ", position " + std::to_string(h.positions[static_cast<size_t>(row)]) +
                  ": non-finite hidden state; refused");
}

void Norm(const ModelSpec& spec, const float* x, const std::vector<float>& w, const std::vector<float>& b, float* out) {
  if (spec.norm == NormType::kLayerNorm)
    ops::LayerNorm(x, w.data(), b.data(), spec.hidden, spec.norm_eps, out);
  else
    ops::RmsNorm(x, w.data(), spec.hidden, spec.norm_eps, out);
}

// Norm of rows [i0, i1) of x (rows of spec.hidden values) into the same rows of out; RMS
// norms take several rows at once (ops::RmsNormRows: the same bits as one by one).
void NormRows(const ModelSpec& spec, const float* x, int i0, int i1, const std::vector<float>& w,
              const std::vector<float>& b, float* out) {
  const size_t dim = static_cast<size_t>(spec.hidden);
  if (spec.norm == NormType::kLayerNorm) {
    for (int i = i0; i < i1; ++i)
      Norm(spec, x + static_cast<size_t>(i) * dim, w, b, out + static_cast<size_t>(i) * dim);
    return;
  }
  ops::RmsNormRows(x + static_cast<size_t>(i0) * dim, dim, i1 - i0, w.data(), spec.hidden, spec.norm_eps,
                   out + static_cast<size_t>(i0) * dim);
}

// y (m, w.n) = x (m, w.k) . w^T with each row of x as `x_terms` int8 terms (1: QuantizeRow;
// 2: kernels::QuantizeRowTwoTerms) against each of w's terms (one, or two for a narrow
// model, model.h NarrowModel). x is quantized once; for each weight term, every x term goes
// through the same verified product as one stacked batch of x_terms * m rows (the weights
// are read once per term), without the bias, and each output is combined in one fixed
// order: y = ((x1.w1 + x2.w1) + (x1.w2 + x2.w2)) + bias, absent terms left out. Every step
// is per row, so batching changes nothing. False on a non-finite input (nothing is written).
bool MatMulTerms(const float* x, int m, int x_terms, const kernels::QuantizedMatrix& w, float* y) {
  // Reused per thread, as in kernels::MatMul: decode calls this for every product.
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xs, r, yw[2];
  const size_t k = static_cast<size_t>(w.k), mm = static_cast<size_t>(m), n = static_cast<size_t>(w.n);
  const size_t rows = static_cast<size_t>(x_terms) * mm;
  xq.resize(rows * k);
  xs.resize(rows);
  r.resize(k);
  for (size_t i = 0; i < mm; ++i) {
    const bool ok = x_terms == 2 ? kernels::QuantizeRowTwoTerms(x + i * k, w.k, &xq[i * k], &xs[i], &xq[(mm + i) * k],
                                                                &xs[mm + i], r.data())
                                 : kernels::QuantizeRow(x + i * k, w.k, &xq[i * k], &xs[i]);
    if (!ok) return false;
  }
  const int w_terms = w.two_terms() ? 2 : 1;
  for (int t = 0; t < w_terms; ++t) {
    QMatrixView v = t == 0 ? w.View() : w.ResidualView();
    v.bias = nullptr;
    yw[t].resize(rows * n);
    // Decode's row is still a GEMV in kind (its terms are more rows): the backend chosen
    // for GEMVs runs it. The bits are the same whichever runs it.
    kernels::MatMulQ(xq.data(), xs.data(), static_cast<int>(rows), k, v, yw[t].data(), n,
                     m == 1 ? kernels::ProductShape::kGemv : kernels::ProductShape::kGemm);
  }
  for (size_t i = 0; i < mm; ++i)
    for (size_t j = 0; j < n; ++j) {
      float per_term[2];
      for (int t = 0; t < w_terms; ++t)
        per_term[t] = x_terms == 2 ? yw[t][i * n + j] + yw[t][(mm + i) * n + j] : yw[t][i * n + j];
      float v = w_terms == 2 ? per_term[0] + per_term[1] : per_term[0];
      if (!w.bias.empty()) v = v + w.bias[j];
      y[i * n + j] = v;
    }
  return true;
}

// Every projection, MLP and LM-head product of the forward pass goes through here: the one
// place that says how an activation row enters a product (docs/KERNELS.md, "Activations:
// one int8 term or two"). Rows of at most kTwoTermMaxK values enter as two int8 terms;
// wider rows as one. A function of the product's shape only, so every device and every
// split makes the same choice. A wide row against a one-term matrix (every wide model's
// case) is kernels::MatMul, which quantizes the rows across the pool.
constexpr int kTwoTermMaxK = 256;
// Whether x enters w's product as one int8 term per row against one weight term: then
// Product is kernels::MatMul, QuantizeRow per row then MatMulQ, and a caller that has the
// rows in cache may quantize them itself (QuantizeForProduct, then LayerProduct).
bool OneTermProduct(const kernels::QuantizedMatrix& w) {
  return w.k > kTwoTermMaxK && !w.two_terms();
}
bool Product(const float* x, int m, const kernels::QuantizedMatrix& w, float* y) {
  if (OneTermProduct(w)) return kernels::MatMul(x, m, w.View(), y);
  return MatMulTerms(x, m, w.k <= kTwoTermMaxK ? 2 : 1, w, y);
}

// Query rows attended together: bounds the score buffer to kQueryBlock * group * ctx. A
// block's products run over all keys up to its last row's position, so the keys past each
// earlier row's own position are computed and then dropped: in a 520-token prefill 19% of
// the attention products with blocks of 128 rows, 11% with 64, 6% with 32. With 32 a piece's
// score, P' and output buffers also stay in L2 (the SmolLM shape's four score terms at 512
// keys: 0.8 MB against 1.6 MB with 64): attention in a 512-token prefill took 4-17% less
// than with 64 rows in 13 of 16 alternating pairs at 1 and 2 threads (SmolLM shape; the
// others +1 to +6%), 3-9% less on the Qwen shape; 16 rows were no better than 32. The bits
// do not depend on it (docs/KERNELS.md, "Attention").
constexpr int kQueryBlock = 32;

thread_local AttentionMassStats* g_mass_stats = nullptr;
thread_local LayerPhaseTimes* g_phase_times = nullptr;

// Adds the wall time since the last mark to a phase of g_phase_times (LayerPhaseTimes); a
// pointer test when that is off.
class PhaseClock {
 public:
  explicit PhaseClock(int rows) : t_(g_phase_times) {
    if (t_ == nullptr) return;
    ++t_->layer_runs;
    t_->rows += rows;
    last_ = std::chrono::steady_clock::now();
  }
  void Mark(LayerPhaseTimes::Phase phase) {
    if (t_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    t_->seconds[static_cast<size_t>(phase)] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  LayerPhaseTimes* t_;
  std::chrono::steady_clock::time_point last_;
};

// Measurement only: what the int8 terms of one P row lose. p (n) the f32 softmax, vscale
// the keys' V scales folded into the row, terms the row's int8 terms and their scales.
void RecordMass(const float* p, const float* vscale, int n, std::span<const int8_t* const> q,
                std::span<const float> qscale, AttentionMassStats& st) {
  double l1 = 0, flushed = 0;
  for (int t = 0; t < n; ++t) {
    if (vscale[t] == 0.0f) continue;  // an all-zero value row: p_t multiplies nothing
    double rep = 0;
    bool zero = true;
    for (size_t j = 0; j < q.size(); ++j) {
      rep += static_cast<double>(q[j][t]) * qscale[j];
      zero = zero && q[j][t] == 0;
    }
    rep /= vscale[t];
    l1 += std::fabs(static_cast<double>(p[t]) - rep);
    if (zero) flushed += p[t];
  }
  ++st.rows;
  st.l1_sum += l1;
  st.l1_max = std::max(st.l1_max, l1);
  st.flushed_sum += flushed;
  st.flushed_max = std::max(st.flushed_max, flushed);
}

// A decode step's RoPE and cache writes for one KV head (its query heads' RoPE, its key's, and
// its key and value into the cache), run inside the split attention's dispatch
// (AttendDecodeLanes) instead of on the caller alone before it.
struct PrepStep {
  Status (*fn)(void* ctx, int g);
  void* ctx;
};

// One layer's attention inputs, shared by every (KV head, query block) task.
struct AttentionArgs {
  const ModelSpec* spec;
  const LayerWeights* lw;
  const KvCache* kv;
  const KvCache::Layer* cache;
  const std::vector<int32_t>* positions;
  const float* q;
  size_t q_stride;
  float* att;
  // Set exactly when a decode step's attention splits across the pool (DecodeSplits): the
  // heads' RoPE and cache writes, which AttendDecodeLanes runs first; otherwise the caller
  // ran them before.
  const PrepStep* prep = nullptr;
};

// kernels::PrefetchDuringProducts over `ranges` on this thread for the scope's life (ranges
// left behind would be read ahead by the next attention on this thread).
class PrefetchScope {
 public:
  explicit PrefetchScope(std::span<const kernels::PrefetchRange> ranges) { kernels::PrefetchDuringProducts(ranges); }
  ~PrefetchScope() { kernels::PrefetchDuringProducts({}); }
  PrefetchScope(const PrefetchScope&) = delete;
  PrefetchScope& operator=(const PrefetchScope&) = delete;
};

// One piece of a layer's attention: KV head g (and its group of query heads) for the query
// rows [b0, b0 + bn), over the keys [k0, k0 + nk) the last of those rows sees, rounded out
// to whole groups of 4 (P.V reduces over the keys in the values' groups of 4; the keys a row
// does not see get 0 in P', so they add nothing: docs/KERNELS.md). A narrow model
// (model.h NarrowModel) takes each query row and each value row as two int8 terms: the
// query's terms are stacked as more rows of the same products; each value term has its own
// P' (the probabilities times that term's scales), so its own products.
struct Piece {
  // qh0: the first of its group of query heads (g * group for the KV head's whole group; a
  // decode step's lanes, AttendDecodeLanes, may take part of one).
  int g, qh0, b0, bn, group, rows, k0, nk, hd, window, q_terms, v_terms;
  size_t rows_nk, rows_hd;
  // Keys visible to the query at position p: [FirstKey(p), p].
  int FirstKey(int p) const { return window > 0 ? std::max(0, p - window + 1) : 0; }
  // The first of the `rows` rows of P' term `term` (0 or 1) of value term j in PieceBuffers'
  // pq, ps and out: value term j's first terms, then its second terms.
  size_t PRow(int j, int term) const { return static_cast<size_t>(2 * j + term) * static_cast<size_t>(rows); }
};

Piece MakePiece(const AttentionArgs& a, int g, int b0) {
  const ModelSpec& spec = *a.spec;
  const std::vector<int32_t>& positions = *a.positions;
  Piece pc{};
  pc.g = g;
  pc.b0 = b0;
  pc.bn = std::min(kQueryBlock, static_cast<int>(positions.size()) - b0);
  pc.group = spec.n_heads / spec.n_kv_heads;
  pc.qh0 = g * pc.group;
  pc.rows = pc.bn * pc.group;
  pc.hd = spec.head_dim;
  pc.window = a.lw->sliding_window ? spec.sliding_window : 0;
  pc.k0 = pc.FirstKey(positions[static_cast<size_t>(b0)]) / 4 * 4;
  pc.nk = (positions[static_cast<size_t>(b0 + pc.bn - 1)] + 1 - pc.k0 + 3) / 4 * 4;
  pc.q_terms = NarrowModel(spec) ? 2 : 1;
  pc.v_terms = a.cache->v_res.empty() ? 1 : 2;
  pc.rows_nk = static_cast<size_t>(pc.rows) * static_cast<size_t>(pc.nk);
  pc.rows_hd = static_cast<size_t>(pc.rows) * static_cast<size_t>(pc.hd);
  return pc;
}

// What the steps of a piece pass on: Q's int8 rows, the scores (softmax in place), P' as two
// int8 terms per value term, and each P' term's product with V. Both terms of a value term's
// P' are rows of one block (Piece::PRow), so they go through one product with V (its rows
// read once); ps and out follow the same layout.
struct PieceBuffers {
  std::vector<int8_t> qq, pq;
  std::vector<float> qs, scores, scores_res, ps, out;
  void Size(const Piece& pc) {
    qq.resize(static_cast<size_t>(pc.q_terms) * pc.rows_hd);
    qs.resize(static_cast<size_t>(pc.q_terms) * static_cast<size_t>(pc.rows));
    scores.resize(static_cast<size_t>(pc.q_terms) * pc.rows_nk);
    scores_res.resize(static_cast<size_t>(pc.q_terms) * pc.rows_nk);
    pq.resize(pc.PRow(pc.v_terms, 0) * static_cast<size_t>(pc.nk));
    ps.resize(pc.PRow(pc.v_terms, 0));
    out.resize(pc.PRow(pc.v_terms, 0) * static_cast<size_t>(pc.hd));
  }
};

// Per-thread working space of the steps below, reused across pieces, layers and tokens.
struct StepScratch {
  std::vector<float> pv, scratch, prob;
  std::vector<float*> row_at;
  std::vector<int> row_n;
  void Size(const Piece& pc) {
    pv.resize(static_cast<size_t>(pc.nk));
    scratch.resize(static_cast<size_t>(std::max(pc.nk, pc.hd)));
    row_at.resize(static_cast<size_t>(pc.rows));
    row_n.resize(static_cast<size_t>(pc.rows));
  }
};
StepScratch& ThreadStepScratch() {
  thread_local StepScratch s;
  return s;
}

// Q rows quantized per (query position, head); query head h uses kv head h / group. A
// second term of row r is row rows + r.
Status QuantizeQueries(const AttentionArgs& a, const Piece& pc, int8_t* qq, float* qs, float* scratch) {
  const int hd = pc.hd;
  for (int i = 0; i < pc.bn; ++i)
    for (int j = 0; j < pc.group; ++j) {
      const int r = i * pc.group + j;
      const float* qrow = a.q + static_cast<size_t>(pc.b0 + i) * a.q_stride + static_cast<size_t>(pc.qh0 + j) * hd;
      int8_t* q1 = &qq[static_cast<size_t>(r) * hd];
      const bool ok = pc.q_terms == 2 ? kernels::QuantizeRowTwoTerms(qrow, hd, q1, &qs[static_cast<size_t>(r)],
                                                                     &qq[static_cast<size_t>(pc.rows + r) * hd],
                                                                     &qs[static_cast<size_t>(pc.rows + r)], scratch)
                                      : kernels::QuantizeRow(qrow, hd, q1, &qs[static_cast<size_t>(r)]);
      if (!ok)
        return DataLoss(At(a.lw->layer, (*a.positions)[static_cast<size_t>(pc.b0) + static_cast<size_t>(i)]) +
                        ": non-finite query; refused");
    }
  return Status::Ok();
}

// scores = Q . K^T for the keys [t0, t1) of the piece's nk, as two products with the same Q
// rows (the keys' first int8 terms and their residual terms, each with its per-position
// scales), then the scaled sum where those keys are visible. Every score column is its own
// dot products and elementwise sums, so any split of [0, nk) gives the same bits.
void KeyScores(const AttentionArgs& a, const Piece& pc, const int8_t* qq, const float* qs, int t0, int t1,
               float* scores, float* scores_res) {
  const KvCache::Layer& cache = *a.cache;
  const int hd = pc.hd;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const QMatrixView kview = a.kv->KeyView(cache.k, cache.k_scale, pc.g, pc.k0 + t0, t1 - t0);
  const QMatrixView kres_view = a.kv->KeyView(cache.k_res, cache.k_res_scale, pc.g, pc.k0 + t0, t1 - t0);
  const auto ldy = static_cast<size_t>(pc.nk);
  kernels::MatMulQ(qq, qs, pc.q_terms * pc.rows, static_cast<size_t>(hd), kview, scores + t0, ldy,
                   kernels::ProductShape::kAttention);
  kernels::MatMulQ(qq, qs, pc.q_terms * pc.rows, static_cast<size_t>(hd), kres_view, scores_res + t0, ldy,
                   kernels::ProductShape::kAttention);
  for (int r = 0; r < pc.rows; ++r) {
    const int p = (*a.positions)[static_cast<size_t>(pc.b0) + static_cast<size_t>(r / pc.group)];
    const int first = std::max(t0, pc.FirstKey(p) - pc.k0);
    const int e = std::min(t1, p + 1 - pc.k0);
    if (first >= e) continue;
    const size_t at = static_cast<size_t>(r) * pc.nk;
    float* s = &scores[at];
    const float* s_res = &scores_res[at];
    if (pc.q_terms == 2) {
      // (first query term's two key products) + (second query term's), in this order
      const float* s2 = &scores[pc.rows_nk + at];
      const float* s2_res = &scores_res[pc.rows_nk + at];
      for (int t = first; t < e; ++t) s[t] = ((s[t] + s_res[t]) + (s2[t] + s2_res[t])) * scale;
    } else {
      kernels::AddScale(s + first, s_res + first, scale, e - first, s + first);
    }
  }
}

// Softmax over each row's visible keys in f32, in key order (all rows at once: SoftmaxRows);
// then V's scales folded into p, and P' as two int8 terms per value term.
Status Probabilities(const AttentionArgs& a, const Piece& pc, PieceBuffers& b, StepScratch& sc) {
  const KvCache::Layer& cache = *a.cache;
  const size_t kbase = static_cast<size_t>(pc.g) * static_cast<size_t>(a.kv->slots()) + static_cast<size_t>(pc.k0);
  const float* vscale[2] = {cache.v_scale.data() + kbase, pc.v_terms == 2 ? cache.v_res_scale.data() + kbase : nullptr};
  auto row_keys = [&](int r, int* first, int* e) {
    const int p = (*a.positions)[static_cast<size_t>(pc.b0) + static_cast<size_t>(r / pc.group)];
    *first = pc.FirstKey(p) - pc.k0;
    *e = p + 1 - pc.k0;
    return p;
  };
  for (int r = 0; r < pc.rows; ++r) {
    int first, e;
    row_keys(r, &first, &e);
    sc.row_at[static_cast<size_t>(r)] = &b.scores[static_cast<size_t>(r) * pc.nk + static_cast<size_t>(first)];
    sc.row_n[static_cast<size_t>(r)] = e - first;
  }
  ops::SoftmaxRows(sc.row_at.data(), sc.row_n.data(), pc.rows);
  for (int r = 0; r < pc.rows; ++r) {
    int first, e;
    const int p = row_keys(r, &first, &e);
    const size_t at = static_cast<size_t>(r) * pc.nk;
    const float* s = &b.scores[at];
    if (g_mass_stats) sc.prob.assign(s + first, s + e);
    for (int j = 0; j < pc.v_terms; ++j) {
      kernels::Mul(s + first, vscale[j] + first, e - first, sc.pv.data() + first);
      // p' as two int8 terms: what the first leaves below its half step (every key under
      // max/254 when attention is spread thin) the second keeps, to about max/65000.
      // Quantized over the visible keys only: zeros change neither amax nor their own 0,
      // so this gives the bits of quantizing the whole row with the invisible keys at 0.
      const size_t sat = pc.PRow(j, 0) + static_cast<size_t>(r), sat2 = pc.PRow(j, 1) + static_cast<size_t>(r);
      const size_t pat = sat * static_cast<size_t>(pc.nk), pat2 = sat2 * static_cast<size_t>(pc.nk);
      if (!kernels::QuantizeRowTwoTerms(sc.pv.data() + first, e - first, &b.pq[pat + static_cast<size_t>(first)],
                                        &b.ps[sat], &b.pq[pat2 + static_cast<size_t>(first)], &b.ps[sat2],
                                        sc.scratch.data()))
        return DataLoss(At(a.lw->layer, p) + ": non-finite attention scores; refused");
      // Invisible keys get exactly 0 in both terms: they add nothing to the int32 sums below.
      for (int8_t* t : {&b.pq[pat], &b.pq[pat2]}) {
        std::fill(t, t + first, int8_t{0});
        std::fill(t + e, t + pc.nk, int8_t{0});
      }
    }
    if (g_mass_stats) {  // the first value term's P' (the only one outside narrow models)
      const size_t r0 = pc.PRow(0, 0) + static_cast<size_t>(r), r1 = pc.PRow(0, 1) + static_cast<size_t>(r);
      const size_t nk = static_cast<size_t>(pc.nk);
      const int8_t* terms[] = {&b.pq[r0 * nk + static_cast<size_t>(first)],
                               &b.pq[r1 * nk + static_cast<size_t>(first)]};
      const float scales[] = {b.ps[r0], b.ps[r1]};
      RecordMass(sc.prob.data(), vscale[0] + first, e - first, terms, scales, *g_mass_stats);
    }
  }
  return Status::Ok();
}

// out = P' . V per value term for the head dimensions [d0, d1) (the values of the keys
// [k0, k0 + nk) as the rows of an interleaved view, a row per head dimension, k = the keys:
// KvCache::ValueAt; both P' terms' rows in one product), then into att:
// (first P' term's product) + (second's), one f32 add in this order; with two value terms,
// (that for the first value term) + (that for the second). Each dimension is its own column
// of the products and each row its own row, so any split of [0, head_dim) and any stacking
// of rows gives the same bits.
void ValueDims(const AttentionArgs& a, const Piece& pc, PieceBuffers& b, int d0, int d1) {
  const KvCache::Layer& cache = *a.cache;
  const int hd = pc.hd;
  for (int j = 0; j < pc.v_terms; ++j) {
    // k0 and nk are multiples of 4 (MakePiece).
    const QMatrixView vview = a.kv->ValueView(j == 0 ? cache.v : cache.v_res, pc.g, pc.k0, pc.nk, d0, d1);
    const size_t row = pc.PRow(j, 0);  // both P' terms: 2 * rows rows from here
    kernels::MatMulQ(&b.pq[row * static_cast<size_t>(pc.nk)], &b.ps[row], 2 * pc.rows, static_cast<size_t>(pc.nk),
                     vview, &b.out[row * static_cast<size_t>(hd) + static_cast<size_t>(d0)], static_cast<size_t>(hd),
                     kernels::ProductShape::kAttention);
  }
  // out of (value term, P' term): [0][0], [0][1], then [1][0], [1][1] with two value terms
  const float* o[2][2];
  for (int j = 0; j < pc.v_terms; ++j)
    for (int t = 0; t < 2; ++t) o[j][t] = &b.out[pc.PRow(j, t) * static_cast<size_t>(hd)];
  const int n_heads = a.spec->n_heads;
  for (int i = 0; i < pc.bn; ++i)
    for (int j = 0; j < pc.group; ++j) {
      float* dst = a.att + static_cast<size_t>(pc.b0 + i) * n_heads * hd + static_cast<size_t>(pc.qh0 + j) * hd;
      const size_t src = static_cast<size_t>(i * pc.group + j) * hd;
      for (int d = d0; d < d1; ++d) {
        const size_t at = src + static_cast<size_t>(d);
        const float o1 = o[0][0][at] + o[0][1][at];
        dst[d] = pc.v_terms == 2 ? o1 + (o[1][0][at] + o[1][1][at]) : o1;
      }
    }
}

// The bytes of KV head g's keys [p0, p0 + n) and of their residual terms.
std::array<kernels::PrefetchRange, 2> KeyRanges(const AttentionArgs& a, int g, int p0, int n) {
  const KvCache::Layer& cache = *a.cache;
  return {kernels::InterleavedBytes(a.kv->KeyView(cache.k, cache.k_scale, g, p0, n)),
          kernels::InterleavedBytes(a.kv->KeyView(cache.k_res, cache.k_res_scale, g, p0, n))};
}

// The bytes of KV head g's values over pc's keys, and of their second terms (none without).
std::array<kernels::PrefetchRange, 2> ValueRanges(const AttentionArgs& a, const Piece& pc, int g) {
  const KvCache::Layer& cache = *a.cache;
  return {kernels::InterleavedBytes(a.kv->ValueView(cache.v, g, pc.k0, pc.nk, 0, pc.hd)),
          cache.v_res.empty() ? kernels::PrefetchRange{}
                              : kernels::InterleavedBytes(a.kv->ValueView(cache.v_res, g, pc.k0, pc.nk, 0, pc.hd))};
}

// What a decode step's attention on one thread reads ahead (kernels::PrefetchDuringProducts),
// into `later`: every KV head's keys after the first head's, every head's values, then the
// output projection's weights (the product after it: its stream then starts from cache).
void LaterBytes(const AttentionArgs& a, std::vector<kernels::PrefetchRange>& later) {
  later.clear();
  const Piece pc = MakePiece(a, 0, 0);
  const int heads = a.spec->n_kv_heads;
  for (int g = 1; g < heads; ++g)
    for (const kernels::PrefetchRange& r : KeyRanges(a, g, pc.k0, pc.nk)) later.push_back(r);
  for (int g = 0; g < heads; ++g)
    for (const kernels::PrefetchRange& r : ValueRanges(a, pc, g))
      if (r.begin != nullptr) later.push_back(r);
  later.push_back({a.lw->o.q.data(), a.lw->o.q.size()});
}

// Attention of one piece, all its steps on this thread: Q.K^T, softmax, P as two int8 terms,
// P.V. Reads only the cache and q, writes only its own heads' columns of its rows of att,
// and computes the same bits whichever thread runs it.
Status AttendPiece(const AttentionArgs& a, const Piece& pc) {
  thread_local PieceBuffers b;
  StepScratch& sc = ThreadStepScratch();
  b.Size(pc);
  sc.Size(pc);
  DAISY_RETURN_IF_ERROR(QuantizeQueries(a, pc, b.qq.data(), b.qs.data(), sc.scratch.data()));
  KeyScores(a, pc, b.qq.data(), b.qs.data(), 0, pc.nk, b.scores.data(), b.scores_res.data());
  DAISY_RETURN_IF_ERROR(Probabilities(a, pc, b, sc));
  ValueDims(a, pc, b, 0, pc.hd);
  return Status::Ok();
}
Status AttendHeadBlock(const AttentionArgs& a, int g, int b0) {
  return AttendPiece(a, MakePiece(a, g, b0));
}

// task(t) for every t in [0, tasks) across the kernels' pool; the failure returned is that
// of the first failing task in task order, so its message does not depend on which thread
// finished first. The caller decides whether the work is worth the pool.
template <typename Task>
Status ParallelTasks(int tasks, Task& task) {
  // Up to kOnStack tasks' statuses live on the stack: a decode step's attention dispatch
  // allocates nothing per token.
  constexpr int kOnStack = 32;
  std::array<Status, kOnStack> on_stack;
  std::vector<Status> on_heap(tasks > kOnStack ? static_cast<size_t>(tasks) : 0);
  struct Ctx {
    Task* task;
    Status* results;
  } ctx{&task, tasks > kOnStack ? on_heap.data() : on_stack.data()};
  kernels::ParallelFor(
      tasks,
      [](void* c, int t) {
        const Ctx& k = *static_cast<const Ctx*>(c);
        k.results[t] = (*k.task)(t);
      },
      &ctx);
  for (int t = 0; t < tasks; ++t) DAISY_RETURN_IF_ERROR(std::move(ctx.results[t]));
  return Status::Ok();
}

// body(i0, i1) over blocks of rows covering [0, n) in order. A prefill's rows run in tasks
// of kRowsPerTask across the pool (the norms, RoPE and the cache's quantization were serial
// work while the other threads waited); a decode step's few rows stay on the caller, where
// waking the pool costs more than it saves. Every row's bits are the same on any thread; a
// failure is that of the first failing block in row order.
template <typename Body>
Status ForRowBlocks(int n, Body& body) {
  constexpr int kRowsPerTask = 16;
  if (n < 2 * kRowsPerTask || kernels::Threads() <= 1) return body(0, n);
  auto rows = [&](int t) { return body(t * kRowsPerTask, std::min(n, (t + 1) * kRowsPerTask)); };
  return ParallelTasks((n + kRowsPerTask - 1) / kRowsPerTask, rows);
}

// A decode step's attention across the kernels' pool in one dispatch of a task per thread,
// each a lane of the query heads: lane t of `lanes` takes query heads [Q t / lanes,
// Q (t + 1) / lanes) of Q, every step of them (Q.K^T, softmax, P', P.V) on its own thread,
// so nothing a lane computes crosses to another core (on the 2-core Zen 3, a cache line
// takes 300-350 ns each way). Per KV head it touches, a lane runs the part of the group in
// its range as one piece (the KV head's keys and values read once for those rows); the
// lane holding a KV head's first query head runs its RoPE and cache writes (a.prep) before
// any piece, and a lane that shares that KV head waits for them before its piece of it,
// which it runs last. Every score and output row is computed as in AttendHeadBlock, so the
// bits are the same.
//
// The waits cannot deadlock: a lane waits only for lanes before it, which run their
// preparations before they wait for anything (serially, lane order alone suffices).
//
// The failure returned is the first KV head's whose preparation failed (as on one thread,
// where every head's RoPE and cache writes run before attention), else the first lane's.
Status AttendDecodeLanes(const AttentionArgs& a, int threads) {
  const ModelSpec& spec = *a.spec;
  const int heads = spec.n_kv_heads, group = spec.n_heads / heads, q_heads = spec.n_heads;
  const int lanes = std::min(threads, q_heads);
  struct HeadState {
    std::atomic<int> prepared{0};  // 0: RoPE and cache writes pending, 1: done, 2: failed
  };
  // The caller's, shared by the lanes.
  thread_local std::vector<HeadState> states;  // atomics: built anew when too few, never moved
  thread_local std::vector<Status> prep_status;
  if (states.size() < static_cast<size_t>(heads)) states = std::vector<HeadState>(static_cast<size_t>(heads));
  prep_status.resize(static_cast<size_t>(heads));
  for (int g = 0; g < heads; ++g) states[static_cast<size_t>(g)].prepared.store(0, std::memory_order_relaxed);
  HeadState* const state = states.data();
  Status* const prep_result = prep_status.data();
  const PrepStep& prep = *a.prep;
  const Piece whole = MakePiece(a, 0, 0);  // every KV head's has this shape (one query row)
  // each(piece, own) for lane t's pieces in the order it runs them: those of the KV heads it
  // prepares (own), then the one whose preparation is an earlier lane's (the first KV head it
  // touches, when its range starts inside that head's group).
  auto lane_pieces = [&](int t, auto&& each) {
    const int h0 = q_heads * t / lanes, h1 = q_heads * (t + 1) / lanes;
    for (int pass = 0; pass < 2; ++pass)
      for (int g = h0 / group; g * group < h1; ++g) {
        const bool own = g * group >= h0;
        if (own != (pass == 0)) continue;
        Piece pc = whole;
        pc.g = g;
        pc.qh0 = std::max(h0, g * group);
        pc.group = std::min(h1, (g + 1) * group) - pc.qh0;
        pc.rows = pc.bn * pc.group;
        pc.rows_nk = static_cast<size_t>(pc.rows) * static_cast<size_t>(pc.nk);
        pc.rows_hd = static_cast<size_t>(pc.rows) * static_cast<size_t>(pc.hd);
        each(pc, own);
      }
  };
  auto lane = [&](int t) -> Status {
    // Reads ahead what the lane reads after its first piece (keys, their residual terms, the
    // values), then its share of the output projection's weights: the decode product after
    // attention gives task t the t-th segment of its rows (kernels' RunFromEnds), and the
    // pool's threads claim tasks in the same order in both dispatches. Which thread reads
    // what ahead changes no bit.
    std::array<kernels::PrefetchRange, kernels::kMaxPrefetchRanges> ahead;
    size_t n_ahead = 0;
    int pieces = 0;
    auto add = [&](const kernels::PrefetchRange& r) {
      if (r.begin != nullptr && n_ahead < ahead.size()) ahead[n_ahead++] = r;
    };
    // First the preparations this lane holds (before it waits for anything: no deadlock), and
    // the ranges to read ahead.
    lane_pieces(t, [&](const Piece& pc, bool own) {
      if (own) {
        Status p = prep.fn(prep.ctx, pc.g);
        const bool ok = p.ok();
        prep_result[pc.g] = std::move(p);
        state[pc.g].prepared.store(ok ? 1 : 2, std::memory_order_release);
      }
      if (pieces++ == 0) return;
      for (const kernels::PrefetchRange& r : KeyRanges(a, pc.g, pc.k0, pc.nk)) add(r);
      for (const kernels::PrefetchRange& r : ValueRanges(a, pc, pc.g)) add(r);
    });
    const size_t o_bytes = a.lw->o.q.size();
    const size_t o_from = o_bytes * static_cast<size_t>(t) / static_cast<size_t>(lanes);
    const size_t o_to = o_bytes * static_cast<size_t>(t + 1) / static_cast<size_t>(lanes);
    add({a.lw->o.q.data() + o_from, o_to - o_from});
    const PrefetchScope prefetch({ahead.data(), n_ahead});
    Status result = Status::Ok();
    lane_pieces(t, [&](const Piece& pc, bool) {
      // Another lane's preparation is an earlier lane's (see above: no deadlock).
      int prepared;
      while ((prepared = state[pc.g].prepared.load(std::memory_order_acquire)) == 0) kernels::CpuRelax();
      if (prepared != 1 || !result.ok()) return;  // a failed preparation reports itself
      result = AttendPiece(a, pc);
    });
    return result;
  };
  Status lanes_status = ParallelTasks(lanes, lane);
  for (int g = 0; g < heads; ++g) DAISY_RETURN_IF_ERROR(std::move(prep_result[g]));
  return lanes_status;
}

// Whether the kernels' pool takes a layer's attention (mass statistics are per thread, so a
// measured run stays on the caller).
bool AttentionOnPool() {
  return kernels::Threads() > 1 && g_mass_stats == nullptr;
}

// Whether a decode step's attention splits across the pool (AttendDecodeLanes): it sees at
// least kDecodeSplitMinKeys keys; below that, the passes' wake-ups cost more than they save.
bool DecodeSplits(const AttentionArgs& a) {
  return a.positions->size() == 1 && AttentionOnPool() && MakePiece(a, 0, 0).nk >= kDecodeSplitMinKeys;
}

// Causal attention of one layer for the batch, reading keys and values from the cache
// (which already holds this batch's). q (n, n_heads * head_dim) after RoPE; att the same.
// See docs/KERNELS.md "Attention and the KV cache" for why each step is batch-independent.
// The (KV head, query block) pieces are independent, so a prefill's run across the kernels'
// pool (softmax and P's quantization took half of a serial prefill); each piece's products
// then run on its own thread. A decode step past a short context splits its query heads
// across the pool (AttendDecodeLanes, when args.prep is set). Same bits either way.
Status Attention(const AttentionArgs& args) {
  const ModelSpec& spec = *args.spec;
  const std::vector<int32_t>& positions = *args.positions;
  const int n = static_cast<int>(positions.size());
  const int blocks = (n + kQueryBlock - 1) / kQueryBlock;
  const int tasks = blocks * spec.n_kv_heads;
  const bool pool = AttentionOnPool();
  if (args.prep != nullptr) return AttendDecodeLanes(args, kernels::Threads());
  // Below this many query-key-dimension products a piece is too small to be worth waking
  // the pool.
  constexpr int64_t kMinParallel = int64_t{1} << 16;
  const int64_t work = int64_t{n} * spec.n_heads * spec.head_dim * (positions.back() + 1);
  if (tasks <= 1 || work < kMinParallel || !pool) {
    // A decode step here reads ahead everything after its first head's keys (LaterBytes); a
    // prefill's attention, and the product after it, are compute-bound: nothing to gain there.
    thread_local std::vector<kernels::PrefetchRange> later;
    later.clear();
    if (n == 1) LaterBytes(args, later);
    const PrefetchScope prefetch(later);
    for (int b = 0; b < blocks; ++b)
      for (int g = 0; g < spec.n_kv_heads; ++g) DAISY_RETURN_IF_ERROR(AttendHeadBlock(args, g, b * kQueryBlock));
    return Status::Ok();
  }
  // The last query block sees the most keys: hand the pieces out from there, so the small
  // ones fill in at the end instead of one large one running alone (the pool's threads
  // claim tasks in order). A failure is still that of the first piece in query order.
  std::vector<Status> results(static_cast<size_t>(tasks), Status::Ok());
  auto piece = [&](int t) {
    const int natural = tasks - 1 - t;  // block-major, as the serial loop above
    results[static_cast<size_t>(natural)] =
        AttendHeadBlock(args, natural % spec.n_kv_heads, natural / spec.n_kv_heads * kQueryBlock);
    return Status::Ok();
  };
  DAISY_RETURN_IF_ERROR(ParallelTasks(tasks, piece));
  for (Status& st : results) DAISY_RETURN_IF_ERROR(std::move(st));
  return Status::Ok();
}

// The MLP's activation of one row: a = silu(gate) * up (gated) or act(gate), from g holding
// the row's gate then up.
void MlpActivationRow(const ModelSpec& s, const float* g, float* a) {
  const int ffn = s.intermediate;
  const float* u = s.gated_mlp ? g + ffn : nullptr;
  if (s.activation == Activation::kSilu) {
    // ops::Silu(x) * up, vectorized per CPU (kernels::Silu: the same bits)
    kernels::Silu(g, u, ffn, a);
  } else {
    for (int j = 0; j < ffn; ++j) a[j] = ops::GeluNew(g[j]);
    if (u != nullptr)
      for (int j = 0; j < ffn; ++j) a[j] = a[j] * u[j];
  }
}

// Rows [i0, i1) of x (k wide) quantized into xq / xs at the same rows, when `quantize` (the
// next product is a OneTermProduct: what kernels::MatMul would do, by the task that has the
// rows in cache); a non-finite row is refused as NonFiniteInput names it.
Status QuantizeForProduct(bool quantize, const float* x, int k, int i0, int i1, int8_t* xq, float* xs, const char* what,
                          int layer, const std::vector<int32_t>& positions) {
  if (!quantize) return Status::Ok();
  bool ok = true;
  for (int i = i0; i < i1; ++i) {
    const size_t at = static_cast<size_t>(i) * static_cast<size_t>(k);
    ok = kernels::QuantizeRow(x + at, k, xq + at, &xs[i]) && ok;
  }
  return ok ? Status::Ok() : NonFiniteInput(what, x, k, layer, positions, i0, i1);
}

// y = x . w^T for the batch's n rows: from xq / xs when QuantizeForProduct quantized them
// (the bits of kernels::MatMul), else through Product, which refuses a non-finite row.
Status LayerProduct(bool quantized, const int8_t* xq, const float* xs, const float* x, int n,
                    const kernels::QuantizedMatrix& w, float* y, const char* what, int layer,
                    const std::vector<int32_t>& positions) {
  if (quantized) {
    kernels::MatMulQ(xq, xs, n, static_cast<size_t>(w.k), w.View(), y, static_cast<size_t>(w.n));
    return Status::Ok();
  }
  if (!Product(x, n, w, y)) return NonFiniteInput(what, x, w.k, layer, positions);
  return Status::Ok();
}

// One transformer block over the batch, in place.
Status RunLayer(const StageWeights& w, int l, HiddenStates& h, KvCache& kv, const std::vector<float>& cos,
                const std::vector<float>& sin) {
  const ModelSpec& s = w.spec();
  const LayerWeights& lw = w.layer(l);
  KvCache::Layer& cache = kv.layer(l);
  const int n = h.n_tokens();
  const int dim = s.hidden, hd = s.head_dim, half = hd / 2;
  const int q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd, qkv_dim = q_dim + 2 * kv_dim;
  const int ffn = s.intermediate;
  const auto& pos = h.positions;
  float* x = h.values.data();
  PhaseClock clock(n);

  // Scratch reused across layers and tokens (per thread): no allocation per decoded token.
  // Every element is written before it is read.
  thread_local std::vector<float> xb, qkv, att, o, hb, act;
  xb.resize(static_cast<size_t>(n) * dim);
  qkv.resize(static_cast<size_t>(n) * qkv_dim);
  att.resize(static_cast<size_t>(n) * q_dim);
  o.resize(static_cast<size_t>(n) * dim);

  // The rows below may run on any of the pool's threads, and a lambda does not capture a
  // thread_local (each thread would see its own, empty, scratch): they use these pointers.
  float* const xb_rows = xb.data();
  float* const qkv_rows = qkv.data();
  // Rows that enter a one-term product (a norm's, the MLP activation's) are quantized by the
  // task that computed them, while they are in its cache (as kernels::MatMul would: the same
  // bits), saving the product a pass over them and the pool a dispatch.
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xs;
  xq.resize(static_cast<size_t>(n) * static_cast<size_t>(std::max(dim, ffn)));
  xs.resize(static_cast<size_t>(n));
  int8_t* const xq_rows = xq.data();
  float* const xs_rows = xs.data();
  // attention norm
  const bool qkv_quantized = OneTermProduct(lw.qkv);
  auto attn_norm = [&](int i0, int i1) {
    NormRows(s, x, i0, i1, lw.attn_norm, lw.attn_norm_bias, xb_rows);
    return QuantizeForProduct(qkv_quantized, xb_rows, dim, i0, i1, xq_rows, xs_rows, "attention input", l, pos);
  };
  DAISY_RETURN_IF_ERROR(ForRowBlocks(n, attn_norm));
  clock.Mark(LayerPhaseTimes::kAttentionNorm);
  // q, k, v projections (one product)
  DAISY_RETURN_IF_ERROR(
      LayerProduct(qkv_quantized, xq_rows, xs_rows, xb_rows, n, lw.qkv, qkv_rows, "attention input", l, pos));
  clock.Mark(LayerPhaseTimes::kQkv);
  // RoPE on q and k, then k and v enter the cache, per (position, kv head): k as two int8
  // terms (the second quantizes the first's residual, computed in f32 element by element), v
  // as one (two in a narrow model), each quantized into scratch and then scattered into the
  // cache's interleaved layouts (KvCache::KeyAt, ValueAt). Each (position, kv head) is its
  // own work: its query heads' RoPE, its key's, and its key and value into the cache.
  const bool v_two_terms = !cache.v_res.empty();
  auto rope_and_cache_head = [&](int i, int g) -> Status {
    // Scratch per thread (this may run on any of the pool's threads).
    thread_local std::vector<int8_t> terms;  // k, k_res, v, v_res of one (position, kv head)
    thread_local std::vector<float> kr;
    terms.resize(4 * static_cast<size_t>(hd));
    kr.resize(static_cast<size_t>(hd));
    int8_t* const k1 = terms.data();
    int8_t* const k2 = k1 + hd;
    int8_t* const v1 = k2 + hd;
    int8_t* const v2 = v1 + hd;
    float* row = qkv_rows + static_cast<size_t>(i) * qkv_dim;
    const int group = s.n_heads / s.n_kv_heads;
    if (!s.learned_positions) {
      const float* c = &cos[static_cast<size_t>(i) * half];
      const float* sn = &sin[static_cast<size_t>(i) * half];
      for (int hh = g * group; hh < (g + 1) * group; ++hh) ops::Rope(row + hh * hd, hd, c, sn);
      ops::Rope(row + (s.n_heads + g) * hd, hd, c, sn);
    }
    const int p = pos[static_cast<size_t>(i)];
    const float* krow = row + q_dim;
    const float* vrow = krow + kv_dim;
    const size_t slot = static_cast<size_t>(g) * static_cast<size_t>(kv.slots()) + static_cast<size_t>(p);
    if (!kernels::QuantizeRowTwoTerms(krow + g * hd, hd, k1, &cache.k_scale[slot], k2, &cache.k_res_scale[slot],
                                      kr.data()))
      return DataLoss(At(l, p) + ": non-finite key; refused");
    const bool v_ok = v_two_terms ? kernels::QuantizeRowTwoTerms(vrow + g * hd, hd, v1, &cache.v_scale[slot], v2,
                                                                 &cache.v_res_scale[slot], kr.data())
                                  : kernels::QuantizeRow(vrow + g * hd, hd, v1, &cache.v_scale[slot]);
    if (!v_ok) return DataLoss(At(l, p) + ": non-finite value; refused");
    // A key's groups of 4 dimensions lie a line apart; a value's bytes 4 apart.
    for (int d = 0; d < hd; d += 4) {
      const size_t at = kv.KeyAt(g, p, d);
      std::memcpy(&cache.k[at], k1 + d, 4);
      std::memcpy(&cache.k_res[at], k2 + d, 4);
    }
    for (int d = 0; d < hd; ++d) {
      const size_t at = kv.ValueAt(g, p, d);
      cache.v[at] = v1[d];
      if (v_two_terms) cache.v_res[at] = v2[d];
    }
    return Status::Ok();
  };
  AttentionArgs args{&s, &lw, &kv, &cache, &pos, qkv_rows, static_cast<size_t>(qkv_dim), att.data()};
  // A decode step whose attention splits across the pool runs each head's RoPE and cache
  // writes inside its dispatch (AttendDecodeLanes), so the caller no longer runs them alone
  // while the other threads wait (the phase clocks count them as attention).
  auto head = [&](int g) { return rope_and_cache_head(0, g); };
  const PrepStep prep{[](void* c, int g) { return (*static_cast<decltype(head)*>(c))(g); }, &head};
  if (DecodeSplits(args)) {
    args.prep = &prep;
  } else {
    // Rows run in blocks that end on multiples of kCacheBlock positions, whole tiles of keys
    // and groups of values, so the lines a block writes are its own: blocks on different
    // threads never share one.
    constexpr int kCacheBlock = 64;
    static_assert(kCacheBlock % kernels::kInterleavedRows == 0, "a block holds whole tiles of keys");
    const int p0 = pos[0];
    const int first_block_rows = std::min(n, kCacheBlock - p0 % kCacheBlock);
    const int blocks = 1 + (n - first_block_rows + kCacheBlock - 1) / kCacheBlock;
    auto rope_and_cache = [&](int b) -> Status {
      const int i0 = b == 0 ? 0 : first_block_rows + (b - 1) * kCacheBlock;
      const int i1 = b == 0 ? first_block_rows : std::min(n, i0 + kCacheBlock);
      for (int i = i0; i < i1; ++i)
        for (int g = 0; g < s.n_kv_heads; ++g) DAISY_RETURN_IF_ERROR(rope_and_cache_head(i, g));
      return Status::Ok();
    };
    if (blocks <= 1 || kernels::Threads() <= 1) {
      for (int b = 0; b < blocks; ++b) DAISY_RETURN_IF_ERROR(rope_and_cache(b));
    } else {
      DAISY_RETURN_IF_ERROR(ParallelTasks(blocks, rope_and_cache));
    }
  }
  clock.Mark(LayerPhaseTimes::kRopeAndCache);
  // attention (causal; sliding window where the layer has one)
  DAISY_RETURN_IF_ERROR(Attention(args));
  clock.Mark(LayerPhaseTimes::kAttention);
  // output projection
  DAISY_RETURN_IF_ERROR(
      LayerProduct(false, nullptr, nullptr, att.data(), n, lw.o, o.data(), "attention output", l, pos));
  clock.Mark(LayerPhaseTimes::kOutput);
  // residual, then the MLP norm, block by block (the rows' adds ran serially before)
  const float* const o_rows = o.data();
  const bool gate_up_quantized = OneTermProduct(lw.gate_up);
  auto mlp_norm = [&](int i0, int i1) {
    const size_t e0 = static_cast<size_t>(i0) * dim, e1 = static_cast<size_t>(i1) * dim;
    for (size_t e = e0; e < e1; ++e) x[e] = x[e] + o_rows[e];
    NormRows(s, x, i0, i1, lw.mlp_norm, lw.mlp_norm_bias, xb_rows);
    return QuantizeForProduct(gate_up_quantized, xb_rows, dim, i0, i1, xq_rows, xs_rows, "MLP input", l, pos);
  };
  DAISY_RETURN_IF_ERROR(ForRowBlocks(n, mlp_norm));
  clock.Mark(LayerPhaseTimes::kMlpNorm);
  // gate | up projections (one product)
  const int gu = lw.gate_up.n;
  hb.resize(static_cast<size_t>(n) * gu);
  DAISY_RETURN_IF_ERROR(
      LayerProduct(gate_up_quantized, xq_rows, xs_rows, xb_rows, n, lw.gate_up, hb.data(), "MLP input", l, pos));
  clock.Mark(LayerPhaseTimes::kGateUp);
  // SwiGLU: silu(gate) * up | GELU (tanh approximation)
  act.resize(static_cast<size_t>(n) * ffn);
  // Elementwise, so the rows are spread over the kernels' pool (exp / tanh took a quarter of
  // a serial prefill) once a batch is large enough to pay for waking it (a decode row, a few
  // thousand elements, stays on the caller); each row is quantized for the down product as
  // soon as it is computed.
  const bool down_quantized = OneTermProduct(lw.down);
  const float* const hb_rows = hb.data();
  float* const act_rows = act.data();
  auto activation = [&](int i) {
    MlpActivationRow(s, hb_rows + static_cast<size_t>(i) * gu, act_rows + static_cast<size_t>(i) * ffn);
    return QuantizeForProduct(down_quantized, act_rows, ffn, i, i + 1, xq_rows, xs_rows, "MLP activation", l, pos);
  };
  constexpr int64_t kMinParallelActivation = 32768;
  if (int64_t{n} * ffn < kMinParallelActivation || kernels::Threads() <= 1) {
    for (int i = 0; i < n; ++i) DAISY_RETURN_IF_ERROR(activation(i));
  } else {
    DAISY_RETURN_IF_ERROR(ParallelTasks(n, activation));
  }
  clock.Mark(LayerPhaseTimes::kActivation);
  // down projection
  DAISY_RETURN_IF_ERROR(
      LayerProduct(down_quantized, xq_rows, xs_rows, act_rows, n, lw.down, o.data(), "MLP activation", l, pos));
  clock.Mark(LayerPhaseTimes::kDown);
  // residual, block by block, and each block's rows refused if not finite (never forwarded)
  // while they are in cache; the first failing block in row order is the one reported
  const std::string where = "layer " + std::to_string(l);
  auto residual = [&](int i0, int i1) {
    const size_t e0 = static_cast<size_t>(i0) * dim, e1 = static_cast<size_t>(i1) * dim;
    for (size_t e = e0; e < e1; ++e) x[e] = x[e] + o_rows[e];
    return CheckFinite(h, where, i0, i1);
  };
  DAISY_RETURN_IF_ERROR(ForRowBlocks(n, residual));
  clock.Mark(LayerPhaseTimes::kResidual);
  return Status::Ok();
}

Status CheckBatch(const ModelSpec& spec, const HiddenStates& h) {
  if (h.n_tokens() == 0) return InvalidArgument("hidden states with no positions");
  if (h.hidden != spec.hidden)
    return InvalidArgument("hidden states of width " + std::to_string(h.hidden) + ", the model's is " +
                           std::to_string(spec.hidden));
  if (h.values.size() != static_cast<size_t>(h.n_tokens()) * static_cast<size_t>(h.hidden))
    return InvalidArgument("hidden states: " + std::to_string(h.values.size()) + " values for " +
                           std::to_string(h.n_tokens()) + " rows");
  for (int i = 1; i < h.n_tokens(); ++i)
    if (h.positions[static_cast<size_t>(i)] != h.positions[0] + i)
      return InvalidArgument("hidden states: positions are not consecutive");
  if (h.positions[0] < 0) return InvalidArgument("hidden states: negative position");
  return Status::Ok();
}

// The logits of rows [begin, n) of h into `logits` (resized: its storage is reused, and the
// final norm's rows are this thread's, so a decode step allocates nothing here).
Status ReadoutRows(const StageWeights& w, const HiddenStates& h, int begin, std::vector<float>& logits) {
  if (!w.has_head()) return Internal("Bug: Readout on a stage without the head");
  DAISY_RETURN_IF_ERROR(CheckBatch(w.spec(), h));
  const ModelSpec& s = w.spec();
  const HeadWeights& head = w.head();
  const int m = h.n_tokens() - begin;
  const int dim = s.hidden;
  // final norm
  thread_local std::vector<float> xb;
  xb.resize(static_cast<size_t>(m) * dim);
  for (int i = 0; i < m; ++i)
    Norm(s, h.Row(begin + i).data(), head.final_norm, head.final_norm_bias, &xb[static_cast<size_t>(i) * dim]);
  // LM head
  logits.resize(static_cast<size_t>(m) * head.lm_head.n);
  if (!Product(xb.data(), m, head.lm_head, logits.data()))
    return DataLoss("readout, position " + std::to_string(h.positions[static_cast<size_t>(begin)]) +
                    ": non-finite final norm; refused");
  return Status::Ok();
}

Result<std::vector<float>> ReadoutRows(const StageWeights& w, const HiddenStates& h, int begin) {
  std::vector<float> logits;
  DAISY_RETURN_IF_ERROR(ReadoutRows(w, h, begin, logits));
  return logits;
}

}  // namespace

HiddenStates HiddenStates::Slice(int begin, int end) const {
  HiddenStates out;
  out.hidden = hidden;
  out.positions.assign(positions.begin() + begin, positions.begin() + end);
  out.values.assign(values.begin() + static_cast<ptrdiff_t>(begin) * hidden,
                    values.begin() + static_cast<ptrdiff_t>(end) * hidden);
  return out;
}

void SetAttentionMassStats(AttentionMassStats* stats) {
  g_mass_stats = stats;
}

const char* LayerPhaseTimes::Name(int phase) {
  static constexpr const char* kNames[kPhases] = {"attention_norm", "qkv",      "rope_and_cache", "attention",
                                                  "output",         "mlp_norm", "gate_up",        "activation",
                                                  "down",           "residual"};
  return phase >= 0 && phase < kPhases ? kNames[phase] : "?";
}

void SetLayerPhaseTimes(LayerPhaseTimes* times) {
  g_phase_times = times;
}

// --- KvCache --------------------------------------------------------------------------

KvCache::KvCache(const ModelSpec& spec, int first, int end, int ctx)
    : first_(first),
      end_(end),
      ctx_(ctx),
      slots_((ctx + kernels::kInterleavedRows - 1) / kernels::kInterleavedRows * kernels::kInterleavedRows),
      head_dim_(spec.head_dim) {
  DAISY_CHECK(ctx > 0 && first <= end, "Bug: KvCache with an empty context or range");
  DAISY_CHECK(spec.head_dim % 4 == 0, "Bug: KvCache for a head_dim that is not a multiple of 4 (spec.cc refuses it)");
  const size_t scales = static_cast<size_t>(spec.n_kv_heads) * static_cast<size_t>(slots_);
  const size_t keys = scales * static_cast<size_t>(spec.head_dim);
  const size_t values = static_cast<size_t>(spec.n_kv_heads) * static_cast<size_t>(slots_ / 4) * ValueGroupStride();
  layers_.resize(static_cast<size_t>(end - first));
  for (Layer& l : layers_) {
    l.k.assign(keys, 0);
    l.k_scale.assign(scales, 0.0f);
    l.k_res.assign(keys, 0);
    l.k_res_scale.assign(scales, 0.0f);
    l.v.assign(values, 0);
    l.v_scale.assign(scales, 0.0f);
    if (NarrowModel(spec)) {
      l.v_res.assign(values, 0);
      l.v_res_scale.assign(scales, 0.0f);
    }
  }
}

kernels::QMatrixView KvCache::KeyView(const LargePageBytes& terms, const std::vector<float>& scales, int g, int p0,
                                      int n) const {
  // From inside the first tile of 16 positions: its row p0 % 16 is the view's row 0.
  const int row = p0 % kernels::kInterleavedRows;
  return kernels::QMatrixView{
      terms.data() + KeyAt(g, p0 - row, 0),
      scales.data() + static_cast<size_t>(g) * static_cast<size_t>(slots_) + static_cast<size_t>(p0),
      nullptr,
      n,
      head_dim_,
      static_cast<size_t>(head_dim_),
      KeyTileStride(),
      64,
      row};
}

kernels::QMatrixView KvCache::ValueView(const LargePageBytes& terms, int g, int k0, int nk, int d0, int d1) const {
  DAISY_CHECK(k0 % 4 == 0 && nk % 4 == 0, "Bug: a value view's keys must be whole groups of 4");
  const int row = d0 % kernels::kInterleavedRows;
  return kernels::QMatrixView{terms.data() + ValueAt(g, k0, d0 - row),
                              nullptr,
                              nullptr,
                              d1 - d0,
                              nk,
                              static_cast<size_t>(nk),
                              64,
                              ValueGroupStride(),
                              row};
}

size_t KvCache::PositionBytes(const ModelSpec& spec) {
  const size_t hd = static_cast<size_t>(spec.head_dim), terms = NarrowModel(spec) ? 2 : 1;
  const size_t value_row = (hd + kernels::kInterleavedRows - 1) / kernels::kInterleavedRows * kernels::kInterleavedRows;
  return static_cast<size_t>(spec.n_kv_heads) * (2 * hd + terms * value_row + 4 * (2 + terms));
}

KvCache KvCache::Copy() const {
  KvCache c;
  c.first_ = first_;
  c.end_ = end_;
  c.ctx_ = ctx_;
  c.slots_ = slots_;
  c.head_dim_ = head_dim_;
  c.length_ = length_;
  c.layers_ = layers_;
  return c;
}

void KvCache::Truncate(int n) {
  DAISY_CHECK(n >= 0 && n <= length_, "Bug: KvCache::Truncate beyond its length");
  length_ = n;
}

void KvCache::set_length(int n) {
  DAISY_CHECK(n >= 0 && n <= ctx_, "Bug: KvCache length beyond its context");
  length_ = n;
}

size_t KvCache::Bytes() const {
  size_t b = 0;
  for (const Layer& l : layers_)
    b += l.k.size() + l.k_res.size() + l.v.size() + l.v_res.size() +
         4 * (l.k_scale.size() + l.k_res_scale.size() + l.v_scale.size() + l.v_res_scale.size());
  return b;
}

KvCache::Layer& KvCache::layer(int l) {
  DAISY_CHECK(l >= first_ && l < end_, "Bug: KV cache layer outside its range");
  return layers_[static_cast<size_t>(l - first_)];
}

const KvCache::Layer& KvCache::layer(int l) const {
  DAISY_CHECK(l >= first_ && l < end_, "Bug: KV cache layer outside its range");
  return layers_[static_cast<size_t>(l - first_)];
}

// --- Embed / RunLayers / Readout ------------------------------------------------------

namespace {
// Embed into h, its storage reused (HeadStage's decode laps allocate nothing).
Status EmbedInto(const StageWeights& w, std::span<const int32_t> tokens, int first_position, HiddenStates& h) {
  if (!w.has_head()) return Internal("Bug: Embed on a stage without the head");
  const ModelSpec& s = w.spec();
  const HeadWeights& head = w.head();
  if (tokens.empty()) return InvalidArgument("no tokens to embed");
  if (first_position < 0) return InvalidArgument("negative position");
  h.hidden = s.hidden;
  h.positions.resize(tokens.size());
  h.values.resize(tokens.size() * static_cast<size_t>(s.hidden));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens[i];
    const int p = first_position + static_cast<int>(i);
    if (id < 0 || id >= s.vocab)
      return InvalidArgument("token id " + std::to_string(id) + " at position " + std::to_string(p) +
                             " is outside the model's vocabulary of " + std::to_string(s.vocab));
    h.positions[i] = p;
    // token embedding (exact row)
    float* row = h.Row(static_cast<int>(i)).data();
    head.embed.Row(id, row);
    // learned position embedding (GPT-2)
    if (s.learned_positions) {
      if (p >= s.max_positions)
        return OutOfRange("position " + std::to_string(p) + " is beyond the model's " +
                          std::to_string(s.max_positions) + " learned positions");
      const float* pe = &head.positions[static_cast<size_t>(p) * s.hidden];
      for (int j = 0; j < s.hidden; ++j) row[j] = row[j] + pe[j];
    }
  }
  return CheckFinite(h, "embedding");
}
}  // namespace

Result<HiddenStates> Embed(const StageWeights& w, std::span<const int32_t> tokens, int first_position) {
  HiddenStates h;
  DAISY_RETURN_IF_ERROR(EmbedInto(w, tokens, first_position, h));
  return h;
}

Status RunLayers(const StageWeights& w, int first, int end, HiddenStates& hidden, KvCache& kv) {
  const ModelSpec& s = w.spec();
  if (first < w.first() || end > w.end() || first > end || first < kv.first() || end > kv.end())
    return Internal("Bug: RunLayers range [" + std::to_string(first) + ", " + std::to_string(end) +
                    ") outside the stage's weights or cache");
  DAISY_RETURN_IF_ERROR(CheckBatch(s, hidden));
  const int p0 = hidden.positions[0];
  const int n = hidden.n_tokens();
  if (p0 > kv.length())
    return InvalidArgument("hidden states start at position " + std::to_string(p0) + " but the cache holds only " +
                           std::to_string(kv.length()) + " positions");
  if (p0 + n > kv.ctx())
    return OutOfRange("positions up to " + std::to_string(p0 + n - 1) + " do not fit in the context of " +
                      std::to_string(kv.ctx()));
  // Forget what follows p0 (a rewind); this batch's keys replace it.
  kv.Truncate(p0);
  // RoPE angles of this batch, shared by every layer and head
  const int half = s.head_dim / 2;
  thread_local std::vector<float> cos, sin;  // this thread's: a decode step allocates nothing
  if (!s.learned_positions) {
    cos.resize(static_cast<size_t>(n) * half);
    sin.resize(static_cast<size_t>(n) * half);
    for (int i = 0; i < n; ++i)
      ops::RopeAngles(hidden.positions[static_cast<size_t>(i)], w.rope_inv_freq().data(), half,
                      &cos[static_cast<size_t>(i) * half], &sin[static_cast<size_t>(i) * half]);
  }
  for (int l = first; l < end; ++l) DAISY_RETURN_IF_ERROR(RunLayer(w, l, hidden, kv, cos, sin));
  kv.set_length(p0 + n);
  return Status::Ok();
}

Result<std::vector<float>> Readout(const StageWeights& w, const HiddenStates& hidden) {
  if (hidden.n_tokens() == 0) return InvalidArgument("Readout of no positions");
  return ReadoutRows(w, hidden, hidden.n_tokens() - 1);
}

Result<std::vector<float>> ReadoutAll(const StageWeights& w, const HiddenStates& hidden) {
  if (hidden.n_tokens() == 0) return InvalidArgument("Readout of no positions");
  return ReadoutRows(w, hidden, 0);
}

// --- Stages ---------------------------------------------------------------------------

LocalStage::LocalStage(const StageWeights& weights, int ctx, StageLink* next)
    : weights_(weights), kv_(weights.spec(), weights.first(), weights.end(), ctx), next_(next) {}

Result<HiddenStates> LocalStage::Run(HiddenStates hidden) {
  DAISY_RETURN_IF_ERROR(RunLayers(weights_, weights_.first(), weights_.end(), hidden, kv_));
  if (next_ == nullptr) return hidden;
  return next_->Run(std::move(hidden));
}

void LocalStage::Truncate(int n) {
  if (kv_.length() > n) kv_.Truncate(n);
  if (next_ != nullptr) next_->Truncate(n);
}

void HeadStage::Truncate(int n) {
  if (kv_.length() > n) kv_.Truncate(n);
  if (rest_ != nullptr) rest_->Truncate(n);
}

HeadStage::HeadStage(const StageWeights& head, int ctx, StageLink* rest)
    : head_(head), kv_(head.spec(), head.first(), head.end(), ctx), rest_(rest) {
  DAISY_CHECK(head.has_head() && head.first() == 0, "Bug: HeadStage needs the head's weights from layer 0");
}

Status StageLink::Submit(HiddenStates hidden) {
  done_.push_back(Run(std::move(hidden)));
  return Status::Ok();
}

Result<HiddenStates> StageLink::Collect() {
  if (done_.empty()) return Internal("Bug: Collect without a Submit");
  Result<HiddenStates> r = std::move(done_.front());
  done_.pop_front();
  return r;
}

Status HeadStage::Local(std::span<const int32_t> tokens, int first_position, HiddenStates& h) {
  // embedding
  DAISY_RETURN_IF_ERROR(EmbedInto(head_, tokens, first_position, h));
  // the head's own layers
  return RunLayers(head_, head_.first(), head_.end(), h, kv_);
}

Status HeadStage::CheckReturned(const HiddenStates& back, const std::vector<int32_t>& sent) const {
  if (back.positions != sent || back.hidden != spec().hidden ||
      back.values.size() != sent.size() * static_cast<size_t>(spec().hidden))
    return DataLoss("the hidden states that came back do not match the positions sent");
  return CheckFinite(back, "returned hidden states");
}

Status HeadStage::Hidden(std::span<const int32_t> tokens, int first_position, HiddenStates& h) {
  DAISY_RETURN_IF_ERROR(Local(tokens, first_position, h));
  if (rest_ == nullptr) return Status::Ok();
  // the rest of the ring, back to the head
  const std::vector<int32_t> sent = h.positions;
  DAISY_ASSIGN_OR_RETURN(HiddenStates back, rest_->Run(std::move(h)));
  DAISY_RETURN_IF_ERROR(CheckReturned(back, sent));
  h = std::move(back);
  return Status::Ok();
}

Result<std::vector<float>> HeadStage::Prefill(std::span<const int32_t> tokens, int chunk, int in_flight, int first) {
  if (tokens.empty()) return InvalidArgument("the prompt has no tokens");
  if (first < 0 || first > kv_.length())
    return InvalidArgument("prefill from position " + std::to_string(first) + " leaves a gap in the cache");
  const int n = static_cast<int>(tokens.size());
  if (chunk <= 0) chunk = n;
  if (rest_ == nullptr || in_flight <= 1 || chunk >= n) {
    std::vector<float> logits;
    for (int at = 0; at < n; at += chunk) {
      const int len = std::min(chunk, n - at);
      DAISY_RETURN_IF_ERROR(
          Forward(tokens.subspan(static_cast<size_t>(at), static_cast<size_t>(len)), first + at, logits));
    }
    return logits;
  }
  // Chunk k+1 runs the head's layers and enters the ring while chunk k is still in it; each
  // stage sees the chunks in order, so its cache fills exactly as one at a time.
  std::deque<std::vector<int32_t>> outstanding;
  HiddenStates last;
  for (int at = 0; at < n; at += chunk) {
    const int len = std::min(chunk, n - at);
    HiddenStates h;
    DAISY_RETURN_IF_ERROR(Local(tokens.subspan(static_cast<size_t>(at), static_cast<size_t>(len)), first + at, h));
    outstanding.push_back(h.positions);
    DAISY_RETURN_IF_ERROR(rest_->Submit(std::move(h)));
    while (static_cast<int>(outstanding.size()) >= in_flight || (at + len >= n && !outstanding.empty())) {
      DAISY_ASSIGN_OR_RETURN(last, rest_->Collect());
      DAISY_RETURN_IF_ERROR(CheckReturned(last, outstanding.front()));
      outstanding.pop_front();
    }
  }
  KeepLastRow(last);
  return Readout(head_, last);
}

Status HeadStage::Forward(std::span<const int32_t> tokens, int first_position, std::vector<float>& logits) {
  DAISY_RETURN_IF_ERROR(Hidden(tokens, first_position, step_));
  KeepLastRow(step_);
  return ReadoutRows(head_, step_, step_.n_tokens() - 1, logits);
}

Status HeadStage::ForwardAll(std::span<const int32_t> tokens, int first_position, std::vector<float>& logits) {
  DAISY_RETURN_IF_ERROR(Hidden(tokens, first_position, step_));
  KeepLastRow(step_);
  rows_.assign(step_.values.begin(), step_.values.end());
  return ReadoutRows(head_, step_, 0, logits);
}

Result<std::vector<float>> HeadStage::Forward(std::span<const int32_t> tokens, int first_position) {
  std::vector<float> logits;
  DAISY_RETURN_IF_ERROR(Forward(tokens, first_position, logits));
  return logits;
}

Result<std::vector<float>> HeadStage::ForwardAll(std::span<const int32_t> tokens, int first_position) {
  std::vector<float> logits;
  DAISY_RETURN_IF_ERROR(ForwardAll(tokens, first_position, logits));
  return logits;
}

std::span<const float> HeadStage::row(int i) const {
  const size_t hidden = static_cast<size_t>(spec().hidden);
  DAISY_CHECK(i >= 0 && (static_cast<size_t>(i) + 1) * hidden <= rows_.size(),
              "Bug: HeadStage::row past the last ForwardAll");
  return std::span<const float>(rows_).subspan(static_cast<size_t>(i) * hidden, hidden);
}

void HeadStage::KeepLastRow(const HiddenStates& h) {
  if (h.n_tokens() == 0) {
    last_row_.clear();
    return;
  }
  const auto row = h.Row(h.n_tokens() - 1);
  last_row_.assign(row.begin(), row.end());
}

Result<std::vector<std::pair<int, int>>> StageRanges(int n_layers, std::span<const int> layer_counts) {
  if (layer_counts.empty()) return InvalidArgument("a split needs at least one stage");
  std::vector<std::pair<int, int>> ranges;
  int at = 0;
  for (int c : layer_counts) {
    if (c < 0) return InvalidArgument("a stage cannot hold a negative number of layers");
    ranges.emplace_back(at, at + c);
    at += c;
  }
  if (at != n_layers)
    return InvalidArgument("the split covers " + std::to_string(at) + " layers; the model has " +
                           std::to_string(n_layers));
  return ranges;
}

int DefaultContext(const ModelSpec& spec) {
  constexpr int kCap = 4096;
  return spec.max_positions > 0 ? std::min(spec.max_positions, kCap) : kCap;
}

Status CheckContext(const ModelSpec& spec, int ctx) {
  if (ctx < 1) return InvalidArgument("context length must be at least 1, got " + std::to_string(ctx));
  if (spec.max_positions > 0 && ctx > spec.max_positions)
    return InvalidArgument("context length " + std::to_string(ctx) + " exceeds the model's " +
                           std::to_string(spec.max_positions) + " positions");
  // P.V reduces over the keys rounded out to groups of 4 (MakePiece): whole groups within kMaxK.
  constexpr int kMaxKeys = kernels::kMaxK / 4 * 4;
  if (ctx > kMaxKeys)
    return InvalidArgument("context length " + std::to_string(ctx) + " exceeds the attention product's limit of " +
                           std::to_string(kMaxKeys) + " keys");
  return Status::Ok();
}

// --- LocalPipeline --------------------------------------------------------------------

Status LocalPipeline::Link(int ctx) {
  DAISY_RETURN_IF_ERROR(CheckContext(weights_[0]->spec(), ctx));
  stages_.clear();
  stages_.resize(weights_.size() > 0 ? weights_.size() - 1 : 0);
  StageLink* next = nullptr;
  for (size_t i = weights_.size(); i-- > 1;) {
    stages_[i - 1] = std::make_unique<LocalStage>(*weights_[i], ctx, next);
    next = stages_[i - 1].get();
  }
  head_ = std::make_unique<HeadStage>(*weights_[0], ctx, next);
  return Status::Ok();
}

Result<LocalPipeline> LocalPipeline::Load(ModelSource& source, const ModelInfo& info, std::span<const int> layer_counts,
                                          int ctx, const ProgressFn& progress) {
  DAISY_ASSIGN_OR_RETURN(auto ranges, StageRanges(info.spec.n_layers, layer_counts));
  DAISY_RETURN_IF_ERROR(CheckContext(info.spec, ctx));
  LocalPipeline p;
  for (size_t i = 0; i < ranges.size(); ++i) {
    DAISY_ASSIGN_OR_RETURN(StageWeights w,
                           StageWeights::Load(source, info, ranges[i].first, ranges[i].second, i == 0, progress));
    p.weights_.push_back(std::make_unique<StageWeights>(std::move(w)));
  }
  DAISY_RETURN_IF_ERROR(p.Link(ctx));
  return p;
}

Result<LocalPipeline> LocalPipeline::FromTensors(const ModelSpec& spec, const HostTensors& tensors,
                                                 std::span<const int> layer_counts, int ctx) {
  DAISY_ASSIGN_OR_RETURN(auto ranges, StageRanges(spec.n_layers, layer_counts));
  DAISY_RETURN_IF_ERROR(CheckContext(spec, ctx));
  LocalPipeline p;
  for (size_t i = 0; i < ranges.size(); ++i) {
    DAISY_ASSIGN_OR_RETURN(StageWeights w,
                           StageWeights::FromTensors(spec, tensors, ranges[i].first, ranges[i].second, i == 0));
    p.weights_.push_back(std::make_unique<StageWeights>(std::move(w)));
  }
  DAISY_RETURN_IF_ERROR(p.Link(ctx));
  return p;
}

size_t LocalPipeline::WeightBytes() const {
  size_t b = 0;
  for (const auto& w : weights_) b += w->Bytes();
  return b;
}

size_t LocalPipeline::CacheBytes() const {
  size_t b = head_ ? head_->CacheBytes() : 0;
  for (const auto& s : stages_) b += s->kv().Bytes();
  return b;
}

}  // namespace daisy
