// StageWeights: fetch only a stage's tensors, quantize each matrix once as it arrives,
// assemble the fused products (qkv, gate|up) the forward pass runs.
#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "daisy/detmath.h"
#include "daisy/forward.h"
#include "ops.h"

namespace daisy {

namespace {

using kernels::QuantizedMatrix;

// f32 -> f16 bits when the value is exactly representable (it is when it was widened from
// an F16 file); nullopt otherwise.
std::optional<uint16_t> F32ToF16Exact(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const int exp = static_cast<int>((bits >> 23) & 0xffu);
  const uint32_t mant = bits & 0x7fffffu;
  if (exp == 0 && mant == 0) return sign;
  if (exp == 0 || exp == 0xff) return std::nullopt;  // f32 subnormal, inf, NaN
  const int e = exp - 127 + 15;
  uint16_t h;
  if (e >= 31) return std::nullopt;
  if (e >= 1) {
    if (mant & 0x1fffu) return std::nullopt;
    h = static_cast<uint16_t>(sign | (e << 10) | (mant >> 13));
  } else {
    // f16 subnormal: value = m * 2^-24 with m < 1024.
    const uint32_t full = mant | 0x800000u;
    const int shift = 126 - exp;
    if (shift > 24) return std::nullopt;
    if (full & ((1u << shift) - 1u)) return std::nullopt;
    h = static_cast<uint16_t>(sign | (full >> shift));
  }
  if (std::bit_cast<uint32_t>(WidenF16(h)) != bits) return std::nullopt;
  return h;
}

// The tensors of a stage by what they are, not by their family-specific names.
enum class Role : uint8_t {
  kAttnNorm,
  kAttnNormBias,
  kQ,
  kK,
  kV,
  kQBias,
  kKBias,
  kVBias,
  kO,
  kOBias,
  kMlpNorm,
  kMlpNormBias,
  kGate,
  kUp,
  kDown,
  kUpBias,
  kDownBias,
  kEmbed,
  kPositions,
  kFinalNorm,
  kFinalNormBias,
  kLmHead,
};
struct Slot {
  int layer = -1;  // -1: a head tensor
  Role role = Role::kEmbed;
};

std::string ShapeString(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status CheckShape(std::string_view name, std::span<const int64_t> shape, std::vector<int64_t> want) {
  if (std::equal(shape.begin(), shape.end(), want.begin(), want.end())) return Status::Ok();
  return InvalidArgument(std::string(name) + ": shape " + ShapeString(shape) + ", expected " + ShapeString(want) +
                         " from config.json");
}

// Appends parts row-wise (per-channel quantization makes this the same as quantizing
// the stacked f32 matrix) and frees them.
Result<QuantizedMatrix> Stack(std::vector<QuantizedMatrix*> parts, std::string_view what) {
  QuantizedMatrix out;
  out.k = parts[0]->k;
  size_t rows = 0;
  for (auto* p : parts) {
    if (p->k != out.k) return Internal("Bug: " + std::string(what) + ": stacked parts differ in width");
    rows += static_cast<size_t>(p->n);
  }
  out.q.reserve(rows * static_cast<size_t>(out.k));
  out.scale.reserve(rows);
  for (auto* p : parts) {
    out.q.insert(out.q.end(), p->q.begin(), p->q.end());
    out.scale.insert(out.scale.end(), p->scale.begin(), p->scale.end());
    out.n += p->n;
    *p = QuantizedMatrix{};
  }
  return out;
}

}  // namespace

// --- EmbeddingTable -------------------------------------------------------------------

EmbeddingTable EmbeddingTable::FromF32(std::span<const float> values, int rows, int cols, DType source_dtype) {
  EmbeddingTable t;
  t.rows_ = rows;
  t.cols_ = cols;
  if (source_dtype == DType::kBF16 || source_dtype == DType::kF16) {
    // Narrow back to the file's width; every value must round-trip exactly, or we keep f32.
    std::vector<uint16_t> narrow(values.size());
    bool exact = true;
    for (size_t i = 0; i < values.size() && exact; ++i) {
      if (source_dtype == DType::kBF16) {
        const uint32_t bits = std::bit_cast<uint32_t>(values[i]);
        exact = (bits & 0xffffu) == 0;
        narrow[i] = static_cast<uint16_t>(bits >> 16);
      } else {
        auto h = F32ToF16Exact(values[i]);
        exact = h.has_value();
        narrow[i] = h.value_or(0);
      }
    }
    if (exact) {
      t.dtype_ = source_dtype;
      t.narrow_ = std::move(narrow);
      return t;
    }
  }
  t.dtype_ = DType::kF32;
  t.wide_.assign(values.begin(), values.end());
  return t;
}

void EmbeddingTable::Row(int r, float* out) const {
  const size_t base = static_cast<size_t>(r) * static_cast<size_t>(cols_);
  switch (dtype_) {
    case DType::kBF16:
      for (int i = 0; i < cols_; ++i) out[i] = WidenBF16(narrow_[base + static_cast<size_t>(i)]);
      return;
    case DType::kF16:
      for (int i = 0; i < cols_; ++i) out[i] = WidenF16(narrow_[base + static_cast<size_t>(i)]);
      return;
    default:
      std::memcpy(out, wide_.data() + base, sizeof(float) * static_cast<size_t>(cols_));
  }
}

size_t LayerWeights::Bytes() const {
  return 4 * (attn_norm.size() + attn_norm_bias.size() + mlp_norm.size() + mlp_norm_bias.size()) + qkv.Bytes() +
         o.Bytes() + gate_up.Bytes() + down.Bytes();
}

size_t HeadWeights::Bytes() const {
  return embed.Bytes() + 4 * (positions.size() + final_norm.size() + final_norm_bias.size()) + lm_head.Bytes();
}

const LayerWeights& StageWeights::layer(int l) const {
  DAISY_CHECK(l >= first_ && l < end_, "Bug: layer outside the stage's range");
  return layers_[static_cast<size_t>(l - first_)];
}

const HeadWeights& StageWeights::head() const {
  DAISY_CHECK(head_ != nullptr, "Bug: head weights asked of a stage that is not the head");
  return *head_;
}

size_t StageWeights::Bytes() const {
  size_t b = head_ ? head_->Bytes() : 0;
  for (const auto& l : layers_) b += l.Bytes();
  return b;
}

// --- RoPE frequencies -----------------------------------------------------------------

std::vector<float> RopeInverseFrequencies(const ModelSpec& spec) {
  if (spec.learned_positions) return {};
  const int d = spec.head_dim;
  const int half = d / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    inv[static_cast<size_t>(i)] = 1.0 / detmath::PowD(spec.rope_theta, static_cast<double>(2 * i) / d);
  if (spec.rope_scaling.type == RopeScalingType::kLlama3) {
    // HF _compute_llama3_parameters, term by term.
    constexpr double kPi = 3.141592653589793;
    const auto& rs = spec.rope_scaling;
    const double old_len = static_cast<double>(rs.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / rs.low_freq_factor;
    const double high_freq_wavelen = old_len / rs.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * kPi / f;
      double scaled = wavelen > low_freq_wavelen ? f / rs.factor : f;
      const double smooth = (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      const double smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      f = medium ? smoothed : scaled;
    }
  }
  std::vector<float> out(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) out[static_cast<size_t>(i)] = static_cast<float>(inv[static_cast<size_t>(i)]);
  return out;
}

// --- StageBuilder ---------------------------------------------------------------------

// Receives a stage's tensors one at a time (any order), keeps each in its resident form
// at once, and assembles StageWeights at the end. Not thread-safe.
class StageBuilder {
 public:
  StageBuilder(const ModelSpec& spec, int first, int end, bool with_head)
      : spec_(spec), first_(first), end_(end), with_head_(with_head), pending_(static_cast<size_t>(end - first)) {
    for (int l = first; l < end; ++l) {
      const LayerNames n = NamesForLayer(spec, l);
      const std::pair<const std::string*, Role> roles[] = {{&n.attn_norm, Role::kAttnNorm},
                                                           {&n.attn_norm_bias, Role::kAttnNormBias},
                                                           {&n.q, Role::kQ},
                                                           {&n.k, Role::kK},
                                                           {&n.v, Role::kV},
                                                           {&n.q_bias, Role::kQBias},
                                                           {&n.k_bias, Role::kKBias},
                                                           {&n.v_bias, Role::kVBias},
                                                           {&n.o, Role::kO},
                                                           {&n.o_bias, Role::kOBias},
                                                           {&n.mlp_norm, Role::kMlpNorm},
                                                           {&n.mlp_norm_bias, Role::kMlpNormBias},
                                                           {&n.gate, Role::kGate},
                                                           {&n.up, Role::kUp},
                                                           {&n.down, Role::kDown},
                                                           {&n.up_bias, Role::kUpBias},
                                                           {&n.down_bias, Role::kDownBias}};
      for (const auto& [name, role] : roles)
        if (!name->empty()) slots_[*name] = Slot{l, role};
    }
    if (with_head) {
      const HeadNames h = NamesForHead(spec);
      const std::pair<const std::string*, Role> roles[] = {{&h.embed, Role::kEmbed},
                                                           {&h.positions, Role::kPositions},
                                                           {&h.final_norm, Role::kFinalNorm},
                                                           {&h.final_norm_bias, Role::kFinalNormBias},
                                                           {&h.lm_head, Role::kLmHead}};
      for (const auto& [name, role] : roles)
        if (!name->empty()) slots_[*name] = Slot{-1, role};
    }
  }

  Status Add(std::string_view name, std::span<const int64_t> shape, DType dtype, std::span<const float> v) {
    auto it = slots_.find(std::string(name));
    if (it == slots_.end())
      return Internal("Bug: tensor " + std::string(name) + " is not one the forward pass knows for layers [" +
                      std::to_string(first_) + ", " + std::to_string(end_) + ")");
    if (!seen_.insert(std::string(name)).second) return InvalidArgument(std::string(name) + ": delivered twice");
    const Slot slot = it->second;
    const int64_t dim = spec_.hidden, hd = spec_.head_dim, ffn = spec_.intermediate;
    const int64_t q_rows = spec_.fused_qkv ? (spec_.n_heads + 2 * spec_.n_kv_heads) * hd : spec_.n_heads * hd;
    const int64_t kv_rows = spec_.n_kv_heads * hd;
    const int64_t o_cols = spec_.n_heads * hd;
    if (slot.layer < 0) return AddHead(name, slot.role, shape, dtype, v);
    Pending& p = pending_[static_cast<size_t>(slot.layer - first_)];
    switch (slot.role) {
      case Role::kAttnNorm:
        return Vector(name, shape, v, dim, p.attn_norm);
      case Role::kAttnNormBias:
        return Vector(name, shape, v, dim, p.attn_norm_bias);
      case Role::kMlpNorm:
        return Vector(name, shape, v, dim, p.mlp_norm);
      case Role::kMlpNormBias:
        return Vector(name, shape, v, dim, p.mlp_norm_bias);
      case Role::kQBias:
        return Vector(name, shape, v, q_rows, p.q_bias);
      case Role::kKBias:
        return Vector(name, shape, v, kv_rows, p.k_bias);
      case Role::kVBias:
        return Vector(name, shape, v, kv_rows, p.v_bias);
      case Role::kOBias:
        return Vector(name, shape, v, dim, p.o_bias);
      case Role::kUpBias:
        return Vector(name, shape, v, ffn, p.up_bias);
      case Role::kDownBias:
        return Vector(name, shape, v, dim, p.down_bias);
      case Role::kQ:
        return Matrix(name, shape, v, q_rows, dim, spec_.layout, p.q);
      case Role::kK:
        return Matrix(name, shape, v, kv_rows, dim, spec_.layout, p.k);
      case Role::kV:
        return Matrix(name, shape, v, kv_rows, dim, spec_.layout, p.v);
      case Role::kO:
        return Matrix(name, shape, v, dim, o_cols, spec_.layout, p.o);
      case Role::kGate:
        return Matrix(name, shape, v, ffn, dim, spec_.layout, p.gate);
      case Role::kUp:
        return Matrix(name, shape, v, ffn, dim, spec_.layout, p.up);
      case Role::kDown:
        return Matrix(name, shape, v, dim, ffn, spec_.layout, p.down);
      default:
        break;
    }
    return Internal("Bug: head role on a layer tensor");
  }

  Result<StageWeights> Finish() {
    StageWeights w;
    w.spec_ = spec_;
    w.first_ = first_;
    w.end_ = end_;
    w.has_head_ = with_head_;
    w.inv_freq_ = RopeInverseFrequencies(spec_);
    const bool layer_norm = spec_.norm == NormType::kLayerNorm;
    for (int l = first_; l < end_; ++l) {
      Pending& p = pending_[static_cast<size_t>(l - first_)];
      const LayerNames n = NamesForLayer(spec_, l);
      auto missing = [&](const std::string& name) {
        return InvalidArgument("layer " + std::to_string(l) + ": tensor " +
                               (name.empty() ? std::string("(unnamed)") : name) + " missing");
      };
      LayerWeights lw;
      lw.layer = l;
      // attention norm
      if (p.attn_norm.empty()) return missing(n.attn_norm);
      if (layer_norm && p.attn_norm_bias.empty()) return missing(n.attn_norm_bias);
      lw.attn_norm = std::move(p.attn_norm);
      lw.attn_norm_bias = std::move(p.attn_norm_bias);
      // q, k, v as one product (q rows, then k, then v)
      if (!p.q) return missing(n.q);
      if (spec_.fused_qkv) {
        lw.qkv = std::move(*p.q);
        lw.qkv.bias = std::move(p.q_bias);
      } else {
        if (!p.k) return missing(n.k);
        if (!p.v) return missing(n.v);
        DAISY_ASSIGN_OR_RETURN(lw.qkv, Stack({&*p.q, &*p.k, &*p.v}, n.q));
        const int n_bias = !p.q_bias.empty() + !p.k_bias.empty() + !p.v_bias.empty();
        if (n_bias != 0 && n_bias != 3)
          return missing(p.q_bias.empty() ? n.q_bias : p.k_bias.empty() ? n.k_bias : n.v_bias);
        if (n_bias == 3) {
          lw.qkv.bias = std::move(p.q_bias);
          lw.qkv.bias.insert(lw.qkv.bias.end(), p.k_bias.begin(), p.k_bias.end());
          lw.qkv.bias.insert(lw.qkv.bias.end(), p.v_bias.begin(), p.v_bias.end());
        }
      }
      // output projection
      if (!p.o) return missing(n.o);
      lw.o = std::move(*p.o);
      lw.o.bias = std::move(p.o_bias);
      // MLP norm
      if (p.mlp_norm.empty()) return missing(n.mlp_norm);
      if (layer_norm && p.mlp_norm_bias.empty()) return missing(n.mlp_norm_bias);
      lw.mlp_norm = std::move(p.mlp_norm);
      lw.mlp_norm_bias = std::move(p.mlp_norm_bias);
      // gate | up as one product
      if (!p.up) return missing(n.up);
      if (spec_.gated_mlp) {
        if (!p.gate) return missing(n.gate);
        if (!p.up_bias.empty())
          return Unimplemented("layer " + std::to_string(l) + ": a bias on a gated MLP (" + n.up_bias + ")");
        DAISY_ASSIGN_OR_RETURN(lw.gate_up, Stack({&*p.gate, &*p.up}, n.gate));
      } else {
        lw.gate_up = std::move(*p.up);
        lw.gate_up.bias = std::move(p.up_bias);
      }
      if (!p.down) return missing(n.down);
      lw.down = std::move(*p.down);
      lw.down.bias = std::move(p.down_bias);
      // Every bias must have all the values for all the rows.
      for (const auto* m : {&lw.qkv, &lw.o, &lw.gate_up, &lw.down})
        if (!m->bias.empty() && m->bias.size() != static_cast<size_t>(m->n))
          return InvalidArgument("layer " + std::to_string(l) + ": a bias does not match its matrix");
      lw.sliding_window = spec_.use_sliding_window && spec_.sliding_window > 0 && l >= spec_.max_window_layers;
      w.layers_.push_back(std::move(lw));
    }
    if (with_head_) {
      const HeadNames n = NamesForHead(spec_);
      auto missing = [&](const std::string& name) {
        return InvalidArgument("head: tensor " + (name.empty() ? std::string("(unnamed)") : name) + " missing");
      };
      if (head_.embed.rows() == 0) return missing(n.embed);
      if (spec_.learned_positions && head_.positions.empty()) return missing(n.positions);
      if (head_.final_norm.empty()) return missing(n.final_norm);
      if (layer_norm && head_.final_norm_bias.empty()) return missing(n.final_norm_bias);
      if (head_.lm_head.n == 0) return missing(spec_.tied_embeddings ? n.embed : n.lm_head);
      w.head_ = std::make_unique<HeadWeights>(std::move(head_));
    }
    return w;
  }

 private:
  struct Pending {
    std::vector<float> attn_norm, attn_norm_bias, mlp_norm, mlp_norm_bias;
    std::optional<QuantizedMatrix> q, k, v, o, gate, up, down;
    std::vector<float> q_bias, k_bias, v_bias, o_bias, up_bias, down_bias;
  };

  static Status Vector(std::string_view name, std::span<const int64_t> shape, std::span<const float> v, int64_t n,
                       std::vector<float>& out) {
    DAISY_RETURN_IF_ERROR(CheckShape(name, shape, {n}));
    if (ops::FirstNonFinite(v.data(), static_cast<int64_t>(v.size())) >= 0)
      return InvalidArgument(std::string(name) + ": non-finite value");
    out.assign(v.begin(), v.end());
    return Status::Ok();
  }

  // A weight used as y = W x with W (rows, cols); stored (rows, cols) for nn.Linear or
  // (cols, rows) for Conv1D, which is transposed here, before quantizing.
  static Status Matrix(std::string_view name, std::span<const int64_t> shape, std::span<const float> v, int64_t rows,
                       int64_t cols, WeightLayout layout, std::optional<QuantizedMatrix>& out) {
    std::vector<float> transposed;
    if (layout == WeightLayout::kInOut) {
      DAISY_RETURN_IF_ERROR(CheckShape(name, shape, {cols, rows}));
      transposed.resize(v.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          transposed[static_cast<size_t>(r * cols + c)] = v[static_cast<size_t>(c * rows + r)];
      v = transposed;
    } else {
      DAISY_RETURN_IF_ERROR(CheckShape(name, shape, {rows, cols}));
    }
    DAISY_ASSIGN_OR_RETURN(out, kernels::QuantizeMatrix(v, static_cast<int>(rows), static_cast<int>(cols), {}, name));
    return Status::Ok();
  }

  Status AddHead(std::string_view name, Role role, std::span<const int64_t> shape, DType dtype,
                 std::span<const float> v) {
    const int64_t dim = spec_.hidden, vocab = spec_.vocab;
    switch (role) {
      case Role::kEmbed: {
        DAISY_RETURN_IF_ERROR(CheckShape(name, shape, {vocab, dim}));
        if (ops::FirstNonFinite(v.data(), static_cast<int64_t>(v.size())) >= 0)
          return InvalidArgument(std::string(name) + ": non-finite value");
        // Tied: the LM head multiplies by the int8 copy; the lookup reads exact rows.
        if (spec_.tied_embeddings) {
          DAISY_ASSIGN_OR_RETURN(head_.lm_head,
                                 kernels::QuantizeMatrix(v, static_cast<int>(vocab), static_cast<int>(dim), {}, name));
        }
        head_.embed = EmbeddingTable::FromF32(v, static_cast<int>(vocab), static_cast<int>(dim), dtype);
        return Status::Ok();
      }
      case Role::kPositions: {
        DAISY_RETURN_IF_ERROR(CheckShape(name, shape, {static_cast<int64_t>(spec_.max_positions), dim}));
        if (ops::FirstNonFinite(v.data(), static_cast<int64_t>(v.size())) >= 0)
          return InvalidArgument(std::string(name) + ": non-finite value");
        head_.positions.assign(v.begin(), v.end());
        return Status::Ok();
      }
      case Role::kFinalNorm:
        return Vector(name, shape, v, dim, head_.final_norm);
      case Role::kFinalNormBias:
        return Vector(name, shape, v, dim, head_.final_norm_bias);
      case Role::kLmHead: {
        // nn.Linear (vocab, hidden) in every family.
        std::optional<QuantizedMatrix> m;
        DAISY_RETURN_IF_ERROR(Matrix(name, shape, v, vocab, dim, WeightLayout::kOutIn, m));
        head_.lm_head = std::move(*m);
        return Status::Ok();
      }
      default:
        return Internal("Bug: layer role on a head tensor");
    }
  }

  const ModelSpec& spec_;
  int first_, end_;
  bool with_head_;
  std::map<std::string, Slot, std::less<>> slots_;
  std::set<std::string, std::less<>> seen_;
  std::vector<Pending> pending_;
  HeadWeights head_;
};

namespace {

Status CheckRange(const ModelSpec& spec, int first, int end) {
  if (first < 0 || end > spec.n_layers || first > end)
    return InvalidArgument("layer range [" + std::to_string(first) + ", " + std::to_string(end) +
                           ") is not within the model's " + std::to_string(spec.n_layers) + " layers");
  return Status::Ok();
}

}  // namespace

Result<StageWeights> StageWeights::Load(ModelSource& source, const ModelInfo& info, int first, int end, bool with_head,
                                        const ProgressFn& progress) {
  DAISY_RETURN_IF_ERROR(CheckRange(info.spec, first, end));
  const std::vector<std::string> names = StageTensorNames(info.spec, first, end, with_head);
  StageBuilder builder(info.spec, first, end, with_head);
  DAISY_RETURN_IF_ERROR(FetchTensors(
      source, info.index, names,
      [&](const TensorInfo& t, std::span<const float> values) { return builder.Add(t.name, t.shape, t.dtype, values); },
      progress));
  return builder.Finish();
}

Result<StageWeights> StageWeights::FromTensors(const ModelSpec& spec, const HostTensors& tensors, int first, int end,
                                               bool with_head) {
  DAISY_RETURN_IF_ERROR(CheckRange(spec, first, end));
  StageBuilder builder(spec, first, end, with_head);
  for (const std::string& name : StageTensorNames(spec, first, end, with_head)) {
    auto it = tensors.find(name);
    if (it == tensors.end()) return NotFound("tensor " + name + " is not in the given tensors");
    int64_t elements = 1;
    for (int64_t d : it->second.shape) elements *= d;
    if (elements != static_cast<int64_t>(it->second.values.size()))
      return InvalidArgument(name + ": " + std::to_string(it->second.values.size()) + " values for shape " +
                             ShapeString(it->second.shape));
    DAISY_RETURN_IF_ERROR(builder.Add(name, it->second.shape, DType::kF32, it->second.values));
  }
  return builder.Finish();
}

}  // namespace daisy
