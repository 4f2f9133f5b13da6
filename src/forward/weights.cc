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

EmbeddingTable EmbeddingTable::Allocate(int rows, int cols, DType dtype) {
  EmbeddingTable t;
  t.rows_ = rows;
  t.cols_ = cols;
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  if (dtype == DType::kBF16 || dtype == DType::kF16) {
    t.dtype_ = dtype;
    t.narrow_.resize(n);
  } else {
    t.dtype_ = DType::kF32;
    t.wide_.resize(n);
  }
  return t;
}

void EmbeddingTable::SetRows(int row, int n, std::span<const uint8_t> raw) {
  const size_t base = static_cast<size_t>(row) * static_cast<size_t>(cols_);
  const size_t count = static_cast<size_t>(n) * static_cast<size_t>(cols_);
  const size_t esize = dtype_ == DType::kF32 ? 4 : 2;
  DAISY_CHECK(row >= 0 && n >= 0 && row + n <= rows_ && raw.size() == count * esize,
              "Bug: EmbeddingTable::SetRows outside the table or of the wrong width");
  if (dtype_ == DType::kF32) {
    std::memcpy(wide_.data() + base, raw.data(), raw.size());  // little-endian host (safetensors.cc)
    return;
  }
  for (size_t i = 0; i < count; ++i) narrow_[base + i] = static_cast<uint16_t>(raw[2 * i] | (raw[2 * i + 1] << 8));
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

// Receives a stage's tensors block by block as their bytes arrive (blocks of one tensor
// in order, tensors in any order) and converts each block at once into its resident form:
// matrix rows are quantized straight into the (fused) int8 matrix, embedding rows are
// copied at the file's width. No tensor is ever held whole in f32. The one exception is a
// Conv1D weight (GPT-2, stored (in, out)): an output row spans every row of the file, so
// that tensor is kept at the file's width until its last block, then quantized. Not
// thread-safe.
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

  // The next block of a tensor: the first block says where the tensor goes (and checks its
  // shape), every block is converted at once, the last one completes the tensor.
  Status Add(const TensorBlock& b) {
    const std::string& name = b.info->name;
    if (b.first()) {
      DAISY_RETURN_IF_ERROR(Start(*b.info));
    } else if (cur_.name != name) {
      return Internal("Bug: a block of " + name + " arrived while " + cur_.name + " was being received");
    }
    switch (cur_.kind) {
      case Kind::kVector:
        if (ops::FirstNonFinite(b.values.data(), static_cast<int64_t>(b.values.size())) >= 0)
          return InvalidArgument(name + ": non-finite value");
        cur_.vector->insert(cur_.vector->end(), b.values.begin(), b.values.end());
        break;
      case Kind::kRows:
        DAISY_RETURN_IF_ERROR(QuantizeRows(b.values.data(), b.row_begin, b.n_rows));
        break;
      case Kind::kStaged:
        cur_.staged.insert(cur_.staged.end(), b.raw.begin(), b.raw.end());
        break;
      case Kind::kEmbed:
        if (ops::FirstNonFinite(b.values.data(), static_cast<int64_t>(b.values.size())) >= 0)
          return InvalidArgument(name + ": non-finite value");
        head_.embed.SetRows(static_cast<int>(b.row_begin), static_cast<int>(b.n_rows), b.raw);
        // Tied: the LM head multiplies by the int8 copy; the lookup reads exact rows.
        if (cur_.matrix != nullptr) DAISY_RETURN_IF_ERROR(QuantizeRows(b.values.data(), b.row_begin, b.n_rows));
        break;
    }
    if (b.last()) return Complete();
    return Status::Ok();
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
      // q, k, v as one product (q rows, then k, then v), quantized in place as they came
      if (!p.has(Role::kQ)) return missing(n.q);
      if (spec_.fused_qkv) {
        lw.qkv = std::move(p.qkv);
        lw.qkv.bias = std::move(p.q_bias);
      } else {
        if (!p.has(Role::kK)) return missing(n.k);
        if (!p.has(Role::kV)) return missing(n.v);
        lw.qkv = std::move(p.qkv);
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
      if (!p.has(Role::kO)) return missing(n.o);
      lw.o = std::move(p.o);
      lw.o.bias = std::move(p.o_bias);
      // MLP norm
      if (p.mlp_norm.empty()) return missing(n.mlp_norm);
      if (layer_norm && p.mlp_norm_bias.empty()) return missing(n.mlp_norm_bias);
      lw.mlp_norm = std::move(p.mlp_norm);
      lw.mlp_norm_bias = std::move(p.mlp_norm_bias);
      // gate | up as one product
      if (!p.has(Role::kUp)) return missing(n.up);
      if (spec_.gated_mlp) {
        if (!p.has(Role::kGate)) return missing(n.gate);
        if (!p.up_bias.empty())
          return Unimplemented("layer " + std::to_string(l) + ": a bias on a gated MLP (" + n.up_bias + ")");
        lw.gate_up = std::move(p.gate_up);
      } else {
        lw.gate_up = std::move(p.gate_up);
        lw.gate_up.bias = std::move(p.up_bias);
      }
      if (!p.has(Role::kDown)) return missing(n.down);
      lw.down = std::move(p.down);
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
      if (!head_done_.count(Role::kEmbed)) return missing(n.embed);
      if (spec_.learned_positions && head_.positions.empty()) return missing(n.positions);
      if (head_.final_norm.empty()) return missing(n.final_norm);
      if (layer_norm && head_.final_norm_bias.empty()) return missing(n.final_norm_bias);
      if (!head_done_.count(spec_.tied_embeddings ? Role::kEmbed : Role::kLmHead))
        return missing(spec_.tied_embeddings ? n.embed : n.lm_head);
      w.head_ = std::make_unique<HeadWeights>(std::move(head_));
    }
    return w;
  }

 private:
  struct Pending {
    std::vector<float> attn_norm, attn_norm_bias, mlp_norm, mlp_norm_bias;
    // Allocated whole when their first part arrives, then filled part by part.
    QuantizedMatrix qkv, o, gate_up, down;
    std::set<Role> done;  // matrix parts received in full
    std::vector<float> q_bias, k_bias, v_bias, o_bias, up_bias, down_bias;
    bool has(Role r) const { return done.count(r) > 0; }
  };

  // Where the tensor being received goes.
  enum class Kind : uint8_t { kVector, kRows, kStaged, kEmbed };
  struct Current {
    std::string name;
    Slot slot;
    Kind kind = Kind::kVector;
    std::vector<float>* vector = nullptr;  // kVector
    int64_t vector_size = 0;
    QuantizedMatrix* matrix = nullptr;  // kRows, kStaged, kEmbed when tied
    int64_t row_offset = 0;             // of this part in the (fused) matrix
    int64_t rows = 0, cols = 0;         // of this part, as y = W x
    DType dtype = DType::kF32;          // kStaged
    std::vector<uint8_t> staged;        // kStaged: the file's bytes, (cols, rows)
  };

  // Checks the shape of the tensor about to arrive and prepares its destination.
  Status Start(const TensorInfo& t) {
    const std::string& name = t.name;
    auto it = slots_.find(name);
    if (it == slots_.end())
      return Internal("Bug: tensor " + name + " is not one the forward pass knows for layers [" +
                      std::to_string(first_) + ", " + std::to_string(end_) + ")");
    if (!seen_.insert(name).second) return InvalidArgument(name + ": delivered twice");
    cur_ = Current{};
    cur_.name = name;
    cur_.slot = it->second;
    const int64_t dim = spec_.hidden, hd = spec_.head_dim, ffn = spec_.intermediate, vocab = spec_.vocab;
    const int64_t q_rows = spec_.fused_qkv ? (spec_.n_heads + 2 * spec_.n_kv_heads) * hd : spec_.n_heads * hd;
    const int64_t kv_rows = spec_.n_kv_heads * hd;
    const int64_t o_cols = spec_.n_heads * hd;
    const int64_t qkv_rows = spec_.fused_qkv ? q_rows : q_rows + 2 * kv_rows;
    const int64_t gate_up_rows = spec_.gated_mlp ? 2 * ffn : ffn;
    if (cur_.slot.layer < 0) {
      switch (cur_.slot.role) {
        case Role::kEmbed: {
          DAISY_RETURN_IF_ERROR(CheckShape(name, t.shape, {vocab, dim}));
          if (spec_.tied_embeddings)
            DAISY_RETURN_IF_ERROR(Part(t, &head_.lm_head, 0, vocab, dim, vocab, WeightLayout::kOutIn));
          cur_.kind = Kind::kEmbed;
          // Held at the file's width: BF16 and F16 rows are kept as the file's 2-byte values.
          head_.embed = EmbeddingTable::Allocate(static_cast<int>(vocab), static_cast<int>(dim), t.dtype);
          return Status::Ok();
        }
        case Role::kPositions:
          return Vector(t, static_cast<int64_t>(spec_.max_positions) * dim, head_.positions,
                        {static_cast<int64_t>(spec_.max_positions), dim});
        case Role::kFinalNorm:
          return Vector(t, dim, head_.final_norm);
        case Role::kFinalNormBias:
          return Vector(t, dim, head_.final_norm_bias);
        case Role::kLmHead:  // nn.Linear (vocab, hidden) in every family
          return Part(t, &head_.lm_head, 0, vocab, dim, vocab, WeightLayout::kOutIn);
        default:
          return Internal("Bug: layer role on a head tensor");
      }
    }
    Pending& p = pending_[static_cast<size_t>(cur_.slot.layer - first_)];
    switch (cur_.slot.role) {
      case Role::kAttnNorm:
        return Vector(t, dim, p.attn_norm);
      case Role::kAttnNormBias:
        return Vector(t, dim, p.attn_norm_bias);
      case Role::kMlpNorm:
        return Vector(t, dim, p.mlp_norm);
      case Role::kMlpNormBias:
        return Vector(t, dim, p.mlp_norm_bias);
      case Role::kQBias:
        return Vector(t, q_rows, p.q_bias);
      case Role::kKBias:
        return Vector(t, kv_rows, p.k_bias);
      case Role::kVBias:
        return Vector(t, kv_rows, p.v_bias);
      case Role::kOBias:
        return Vector(t, dim, p.o_bias);
      case Role::kUpBias:
        return Vector(t, ffn, p.up_bias);
      case Role::kDownBias:
        return Vector(t, dim, p.down_bias);
      // Stacking rows is exact: quantization is per output row.
      case Role::kQ:
        return Part(t, &p.qkv, 0, q_rows, dim, qkv_rows, spec_.layout);
      case Role::kK:
        return Part(t, &p.qkv, q_rows, kv_rows, dim, qkv_rows, spec_.layout);
      case Role::kV:
        return Part(t, &p.qkv, q_rows + kv_rows, kv_rows, dim, qkv_rows, spec_.layout);
      case Role::kO:
        return Part(t, &p.o, 0, dim, o_cols, dim, spec_.layout);
      case Role::kGate:
        return Part(t, &p.gate_up, 0, ffn, dim, gate_up_rows, spec_.layout);
      case Role::kUp:
        return Part(t, &p.gate_up, spec_.gated_mlp ? ffn : 0, ffn, dim, gate_up_rows, spec_.layout);
      case Role::kDown:
        return Part(t, &p.down, 0, dim, ffn, dim, spec_.layout);
      default:
        break;
    }
    return Internal("Bug: head role on a layer tensor");
  }

  Status Vector(const TensorInfo& t, int64_t n, std::vector<float>& out, std::vector<int64_t> shape = {}) {
    DAISY_RETURN_IF_ERROR(CheckShape(t.name, t.shape, shape.empty() ? std::vector<int64_t>{n} : std::move(shape)));
    cur_.kind = Kind::kVector;
    cur_.vector = &out;
    cur_.vector_size = n;
    out.clear();
    out.reserve(static_cast<size_t>(n));
    return Status::Ok();
  }

  // Rows [offset, offset + rows) of `m` (total_rows, cols), a weight used as y = W x,
  // stored (rows, cols) for nn.Linear or (cols, rows) for Conv1D. `m` is allocated when
  // its first part arrives.
  Status Part(const TensorInfo& t, QuantizedMatrix* m, int64_t offset, int64_t rows, int64_t cols, int64_t total_rows,
              WeightLayout layout) {
    const bool in_out = layout == WeightLayout::kInOut;
    DAISY_RETURN_IF_ERROR(
        CheckShape(t.name, t.shape, in_out ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{rows, cols}));
    // QuantizeMatrix's refusals, made before any row is converted.
    if (rows <= 0 || cols <= 0) return InvalidArgument(t.name + ": empty matrix");
    if (cols > kernels::kMaxK)
      return Unimplemented(t.name + ": reduction length " + std::to_string(cols) +
                           " exceeds the int8 unit's limit of " + std::to_string(kernels::kMaxK));
    if (m->n == 0) {
      m->n = static_cast<int>(total_rows);
      m->k = static_cast<int>(cols);
      m->q.assign(static_cast<size_t>(total_rows) * static_cast<size_t>(cols), 0);
      m->scale.assign(static_cast<size_t>(total_rows), 0.0f);
      if (NarrowModel(spec_)) {  // every matrix of a narrow model as two int8 terms (model.h)
        m->q_res.assign(m->q.size(), 0);
        m->scale_res.assign(m->scale.size(), 0.0f);
      }
    } else if (m->k != cols || m->n != total_rows) {
      return Internal("Bug: " + t.name + ": stacked parts differ in shape");
    }
    cur_.kind = in_out ? Kind::kStaged : Kind::kRows;
    cur_.matrix = m;
    cur_.row_offset = offset;
    cur_.rows = rows;
    cur_.cols = cols;
    cur_.dtype = t.dtype;
    if (in_out) cur_.staged.reserve(static_cast<size_t>(t.bytes));
    return Status::Ok();
  }

  // Quantizes rows [row, row + n) of the current part (x: n rows of cols f32) into place,
  // exactly as QuantizeMatrix would (one QuantizeRow per output row), or as two terms
  // (QuantizeRowTwoTerms) where the matrix has a second term.
  Status QuantizeRows(const float* x, int64_t row, int64_t n) {
    QuantizedMatrix& m = *cur_.matrix;
    const size_t k = static_cast<size_t>(cur_.cols);
    if (m.two_terms()) residual_.resize(k);
    for (int64_t i = 0; i < n; ++i) {
      const size_t r = static_cast<size_t>(cur_.row_offset + row + i);
      const float* xr = x + static_cast<size_t>(i) * k;
      const bool ok = m.two_terms()
                          ? kernels::QuantizeRowTwoTerms(xr, static_cast<int>(k), m.q.data() + r * k, &m.scale[r],
                                                         m.q_res.data() + r * k, &m.scale_res[r], residual_.data())
                          : kernels::QuantizeRow(xr, static_cast<int>(k), m.q.data() + r * k, &m.scale[r]);
      if (!ok) return InvalidArgument(cur_.name + ": non-finite weight in row " + std::to_string(row + i));
    }
    return Status::Ok();
  }

  // The last block of the current tensor has arrived.
  Status Complete() {
    switch (cur_.kind) {
      case Kind::kVector:
        if (static_cast<int64_t>(cur_.vector->size()) != cur_.vector_size)
          return Internal("Bug: " + cur_.name + ": " + std::to_string(cur_.vector->size()) + " values delivered");
        break;
      case Kind::kStaged:
        DAISY_RETURN_IF_ERROR(QuantizeStaged());
        break;
      default:
        break;
    }
    if (cur_.slot.layer < 0)
      head_done_.insert(cur_.slot.role);
    else
      pending_[static_cast<size_t>(cur_.slot.layer - first_)].done.insert(cur_.slot.role);
    cur_ = Current{};  // frees a staged Conv1D tensor
    return Status::Ok();
  }

  // A Conv1D weight, staged (cols, rows) at the file's width: output rows are gathered a
  // bounded block at a time, widened to f32 (exact) and quantized as rows.
  Status QuantizeStaged() {
    const int64_t rows = cur_.rows, cols = cur_.cols;
    const size_t esize = DTypeSize(cur_.dtype);
    if (cur_.staged.size() != static_cast<size_t>(rows * cols) * esize)
      return Internal("Bug: " + cur_.name + ": staged bytes do not match its shape");
    const int64_t block = std::max<int64_t>(1, static_cast<int64_t>(kTensorBlockBytes / sizeof(float)) / cols);
    std::vector<float> x, line;
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
      const int64_t n = std::min(block, rows - r0);
      x.resize(static_cast<size_t>(n * cols));
      line.resize(static_cast<size_t>(n));
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t* src = cur_.staged.data() + static_cast<size_t>(c * rows + r0) * esize;
        DAISY_RETURN_IF_ERROR(WidenToF32(cur_.dtype, {src, static_cast<size_t>(n) * esize}, line));
        for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i * cols + c)] = line[static_cast<size_t>(i)];
      }
      DAISY_RETURN_IF_ERROR(QuantizeRows(x.data(), r0, n));
    }
    return Status::Ok();
  }

  const ModelSpec& spec_;
  std::vector<float> residual_;  // QuantizeRows' scratch for two-term rows
  int first_, end_;
  bool with_head_;
  std::map<std::string, Slot, std::less<>> slots_;
  std::set<std::string, std::less<>> seen_;
  std::vector<Pending> pending_;
  HeadWeights head_;
  std::set<Role> head_done_;  // head tensors received in full
  Current cur_;
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
  DAISY_RETURN_IF_ERROR(FetchTensorBlocks(
      source, info.index, names, [&](const TensorBlock& b) { return builder.Add(b); }, progress));
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
    // One block holding the whole tensor, as if read from an F32 file.
    TensorInfo t;
    t.name = name;
    t.shape = it->second.shape;
    t.bytes = static_cast<uint64_t>(elements) * sizeof(float);
    TensorBlock b;
    b.info = &t;
    b.rows = t.shape.empty() ? 1 : t.shape[0];
    b.row_elements = 1;
    for (size_t i = 1; i < t.shape.size(); ++i) b.row_elements *= t.shape[i];
    b.n_rows = b.rows;
    b.values = it->second.values;
    b.raw = {reinterpret_cast<const uint8_t*>(b.values.data()), static_cast<size_t>(t.bytes)};
    DAISY_RETURN_IF_ERROR(builder.Add(b));
  }
  return builder.Finish();
}

}  // namespace daisy
