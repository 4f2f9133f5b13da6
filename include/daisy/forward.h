// The forward pass of one pipeline stage: Embed (head) -> RunLayers(first, end) -> Readout
// (head). A stage holds the weights of its own contiguous layer range only (StageWeights),
// quantized once at load to int8 + per-channel scales; every matrix product, attention
// included, goes through the verified INT8 units (daisy/kernels.h), and every f32 op has a
// fixed evaluation order with transcendentals from daisy/detmath.h. So the bits of every
// activation are the same whatever the split, the backend, the batch (chunked prefill) and
// whether the KV cache or a full recomputation is used. docs/FORWARD.md describes the
// stage weights, the activations and the memory choices; docs/KERNELS.md the attention rule.
//
// The forward pass knows nothing of the network: it hands hidden states to a StageLink,
// whose in-process implementation (LocalStage) is what the split tests use.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/kernels.h"
#include "daisy/memory.h"
#include "daisy/model.h"
#include "daisy/safetensors.h"
#include "daisy/source.h"
#include "daisy/status.h"

namespace daisy {

// The hidden states of consecutive positions of one sequence: what crosses the ring.
// A plain value; thread-compatible.
struct HiddenStates {
  int hidden = 0;                  // width of one row
  std::vector<int32_t> positions;  // (n_tokens) consecutive, ascending
  std::vector<float> values;       // (n_tokens, hidden) row-major

  int n_tokens() const { return static_cast<int>(positions.size()); }
  std::span<const float> Row(int i) const {
    return {values.data() + static_cast<size_t>(i) * static_cast<size_t>(hidden), static_cast<size_t>(hidden)};
  }
  std::span<float> Row(int i) {
    return {values.data() + static_cast<size_t>(i) * static_cast<size_t>(hidden), static_cast<size_t>(hidden)};
  }
  // Rows [begin, end) as a new value (the positions come along).
  HiddenStates Slice(int begin, int end) const;
};

// An f32 tensor in memory, shaped as in the safetensors file (tests and tools build
// models this way without writing files).
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};
using HostTensors = std::map<std::string, HostTensor, std::less<>>;

// The embedding table, kept exact for the lookup at the width of the file it came from:
// 2 bytes per value for BF16/F16 files (widening is exact), 4 for F32. Thread-compatible.
class EmbeddingTable {
 public:
  EmbeddingTable() = default;
  // values (rows, cols) f32, widened from `source_dtype`.
  static EmbeddingTable FromF32(std::span<const float> values, int rows, int cols, DType source_dtype);
  // A table (rows, cols) held at the width of `dtype` (BF16, F16: 2 bytes per value; F32:
  // 4), filled by SetRows as the file's bytes arrive: loading never holds the table at any
  // other width.
  static EmbeddingTable Allocate(int rows, int cols, DType dtype);
  // Rows [row, row + n) from their bytes in the file (little-endian, the table's dtype).
  void SetRows(int row, int n, std::span<const uint8_t> raw);
  int rows() const { return rows_; }
  int cols() const { return cols_; }
  // Writes row r (cols values, exactly the file's values) to out.
  void Row(int r, float* out) const;
  size_t Bytes() const { return 2 * narrow_.size() + 4 * wide_.size(); }

 private:
  int rows_ = 0;
  int cols_ = 0;
  DType dtype_ = DType::kF32;     // kBF16, kF16 (narrow_) or kF32 (wide_)
  std::vector<uint16_t> narrow_;  // (rows, cols) bit patterns
  std::vector<float> wide_;       // (rows, cols)
};

// One transformer layer, resident. Matrices are int8 (out, in) with f32 scales per output
// channel; norms stay f32.
struct LayerWeights {
  int layer = 0;
  std::vector<float> attn_norm;       // (hidden)
  std::vector<float> attn_norm_bias;  // (hidden), LayerNorm only
  kernels::QuantizedMatrix qkv;       // ((n_heads + 2 n_kv_heads) head_dim, hidden): q rows, k rows, v rows
  kernels::QuantizedMatrix o;         // (hidden, n_heads head_dim)
  std::vector<float> mlp_norm;        // (hidden)
  std::vector<float> mlp_norm_bias;   // (hidden), LayerNorm only
  kernels::QuantizedMatrix
      gate_up;                    // gated: (2 intermediate, hidden) gate rows then up rows; else (intermediate, hidden)
  kernels::QuantizedMatrix down;  // (hidden, intermediate)
  bool sliding_window = false;    // attention limited to the last spec.sliding_window keys
  size_t Bytes() const;
};

// The head's own tensors: both ends of the model.
struct HeadWeights {
  EmbeddingTable embed;                // (vocab, hidden) exact rows for the lookup
  std::vector<float> positions;        // (max_positions, hidden) GPT-2 wpe; empty otherwise
  std::vector<float> final_norm;       // (hidden)
  std::vector<float> final_norm_bias;  // (hidden), LayerNorm only
  kernels::QuantizedMatrix lm_head;    // (vocab, hidden); the int8 copy of the embedding when tied
  size_t Bytes() const;
};

// The weights one stage holds: layers [first, end), plus the head's tensors when it is the
// head. Immutable after loading, so it may be shared by any number of threads. Move-only.
class StageWeights {
 public:
  // Fetches only the tensors of layers [first, end) (+ the head's) through
  // FetchTensorBlocks, converting each block of rows as it arrives straight into its
  // resident form (int8 rows, embedding rows at the file's width): peak memory is the
  // resident weights plus a few MB of blocks, whatever the file's dtype (docs/FORWARD.md).
  // `progress` ticks per read chunk and per block.
  static Result<StageWeights> Load(ModelSource& source, const ModelInfo& info, int first, int end, bool with_head,
                                   const ProgressFn& progress = {});
  // The same from tensors in memory (F32); `tensors` may hold more than the stage needs.
  static Result<StageWeights> FromTensors(const ModelSpec& spec, const HostTensors& tensors, int first, int end,
                                          bool with_head);

  StageWeights(StageWeights&&) noexcept = default;
  StageWeights& operator=(StageWeights&&) noexcept = default;
  StageWeights(const StageWeights&) = delete;
  StageWeights& operator=(const StageWeights&) = delete;

  const ModelSpec& spec() const { return spec_; }
  int first() const { return first_; }
  int end() const { return end_; }
  bool has_head() const { return has_head_; }
  // Layer l, first() <= l < end().
  const LayerWeights& layer(int l) const;
  // Bug if !has_head().
  const HeadWeights& head() const;
  // RoPE inverse frequencies, rope_scaling applied (head_dim / 2); empty for GPT-2.
  const std::vector<float>& rope_inv_freq() const { return inv_freq_; }
  // Resident bytes of all weights of this stage.
  size_t Bytes() const;

 private:
  friend class StageBuilder;
  StageWeights() = default;
  ModelSpec spec_;
  int first_ = 0;
  int end_ = 0;
  bool has_head_ = false;
  std::vector<LayerWeights> layers_;  // (end - first)
  std::unique_ptr<HeadWeights> head_;
  std::vector<float> inv_freq_;  // (head_dim / 2)
};

// RoPE inverse frequencies theta^(-2i/d), i < d/2, with rope_scaling applied exactly as
// HF _compute_llama3_parameters (computed in double, rounded once to f32).
std::vector<float> RopeInverseFrequencies(const ModelSpec& spec);

// The attention cache of layers [first, end) for up to ctx positions of one sequence.
// Keys and values are stored as they enter the cache, per (position, kv head): a key as
// two int8 terms k ~= k_scale * k + k_res_scale * k_res (the second quantizes what the
// first leaves over), a value as one int8 row with its scale. Both are interleaved for the
// broadcast products of attention (kernels.h QMatrixView): keys as the rows of Q.K^T, in
// tiles of 16 positions; values as the rows of P.V, one per head dimension, in groups of 4
// positions (docs/KERNELS.md, "Attention and the KV cache"). Not thread-safe; move-only
// (Copy() is the explicit, expensive copy).
class KvCache {
 public:
  KvCache(const ModelSpec& spec, int first, int end, int ctx);
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  KvCache Copy() const;

  int ctx() const { return ctx_; }
  // Positions held per kv head: ctx rounded up to whole tiles of keys, so that a product
  // over whole tiles, or over keys rounded out to groups of 4, stays inside the buffers.
  int slots() const { return slots_; }
  // Where dimension d of kv head g at position p lies in Layer::k and k_res (keys) and in
  // Layer::v and v_res (values); a scale of (g, p) is at g * slots() + p.
  size_t KeyAt(int g, int p, int d) const {
    return static_cast<size_t>(g) * static_cast<size_t>(slots_) * static_cast<size_t>(head_dim_) +
           static_cast<size_t>(p / kernels::kInterleavedRows) * KeyTileStride() + static_cast<size_t>(d / 4) * 64 +
           static_cast<size_t>(p % kernels::kInterleavedRows) * 4 + static_cast<size_t>(d % 4);
  }
  size_t ValueAt(int g, int p, int d) const {
    return static_cast<size_t>(g) * static_cast<size_t>(slots_ / 4) * ValueGroupStride() +
           static_cast<size_t>(p / 4) * ValueGroupStride() + static_cast<size_t>(d / kernels::kInterleavedRows) * 64 +
           static_cast<size_t>(d % kernels::kInterleavedRows) * 4 + static_cast<size_t>(p % 4);
  }
  // Keys [p0, p0 + n) of kv head g, from `terms` (Layer::k or k_res) with their `scales`, as
  // the rows of an interleaved view: Q.K^T's weights.
  kernels::QMatrixView KeyView(const LargePageBytes& terms, const std::vector<float>& scales, int g, int p0,
                               int n) const;
  // Head dimensions [d0, d1) of kv head g's values from `terms` (Layer::v or v_res) over the
  // keys [k0, k0 + nk), both multiples of 4, as the rows of an interleaved view: P.V's weights.
  kernels::QMatrixView ValueView(const LargePageBytes& terms, int g, int k0, int nk, int d0, int d1) const;
  // Bytes a layer holds per position (every kv head's terms and scales), slots aside.
  static size_t PositionBytes(const ModelSpec& spec);
  // The interleaved layouts' strides (QMatrixView): keys' tiles of 16 positions are
  // head_dim / 4 groups of 64 bytes; values' tiles of 16 dimensions are 64 bytes apart and
  // their groups of 4 positions ValueGroupStride() apart.
  size_t KeyTileStride() const { return static_cast<size_t>(head_dim_) * kernels::kInterleavedRows; }
  size_t ValueGroupStride() const {
    return static_cast<size_t>((head_dim_ + kernels::kInterleavedRows - 1) / kernels::kInterleavedRows) * 64;
  }
  int first() const { return first_; }
  int end() const { return end_; }
  // Positions [0, length()) are filled for every layer.
  int length() const { return length_; }
  // Forgets positions >= n (n <= length()).
  void Truncate(int n);
  size_t Bytes() const;

  // The int8 terms in large-page memory (memory.h): attention reads them every step.
  struct Layer {
    LargePageBytes k;                // keys at KeyAt: QuantizeRow(key)
    std::vector<float> k_scale;      // (n_kv_heads, slots)
    LargePageBytes k_res;            // keys at KeyAt: QuantizeRow(key - k_scale * k)
    std::vector<float> k_res_scale;  // (n_kv_heads, slots)
    LargePageBytes v;                // values at ValueAt
    std::vector<float> v_scale;      // (n_kv_heads, slots)
    // A narrow model's (model.h NarrowModel) second term of each value row, laid out as v;
    // empty otherwise.
    LargePageBytes v_res;            // values at ValueAt
    std::vector<float> v_res_scale;  // (n_kv_heads, slots)
  };
  // Layer l, first() <= l < end(). For the forward pass.
  Layer& layer(int l);
  const Layer& layer(int l) const;
  void set_length(int n);

 private:
  KvCache() = default;
  int first_ = 0;
  int end_ = 0;
  int ctx_ = 0;
  int slots_ = 0;
  int head_dim_ = 0;
  int length_ = 0;
  std::vector<Layer> layers_;
};

// Measurement only (daisychain eval --attention-stats): how much of each attention row's
// probability the int8 form of P loses. For every (query position, head) row, with p_t the
// f32 softmax and q_t what the int8 terms of P represent (dequantized, V's scale divided
// back out): l1 = sum_t |p_t - q_t| (the mass moved) and flushed = the sum of p_t over the
// keys whose int8 terms are all zero (the mass that vanished outright). Collected on the
// calling thread while a pointer is set; nullptr (the default) turns it off.
struct AttentionMassStats {
  int64_t rows = 0;
  double l1_sum = 0, l1_max = 0;            // sum_t |p_t - q_t|
  double flushed_sum = 0, flushed_max = 0;  // sum of p_t over keys represented by 0
};
void SetAttentionMassStats(AttentionMassStats* stats);

// A decode step's attention that sees at least this many keys splits across the kernels'
// pool, each KV head's RoPE and cache writes running inside its dispatch (so
// LayerPhaseTimes counts them as attention then); below it the caller runs everything.
inline constexpr int kDecodeSplitMinKeys = 64;

// Measurement only (daisychain bench): where a layer's time goes. While set on the calling
// thread, every layer run there adds the wall time of each of its phases (a phase's work
// may run across the kernels' pool; it is timed on the caller, start to end) and counts the
// layer runs and their rows. nullptr (the default) turns it off: then a layer pays one
// pointer test per phase.
struct LayerPhaseTimes {
  enum Phase {
    kAttentionNorm,  // the attention norm (and its rows' quantization)
    kQkv,            // the q/k/v product
    kRopeAndCache,   // RoPE, and k and v into the KV cache (in kAttention past
                     // kDecodeSplitMinKeys on the pool, above)
    kAttention,      // softmax(Q.K^T) V over the cache
    kOutput,         // the attention output product
    kMlpNorm,        // the residual add and the MLP norm
    kGateUp,         // the gate/up (or up) product
    kActivation,     // SiLU / GELU (and its rows' quantization)
    kDown,           // the down product
    kResidual,       // the residual add and the finite check
    kPhases
  };
  static const char* Name(int phase);
  std::array<double, kPhases> seconds{};
  int64_t layer_runs = 0;
  int64_t rows = 0;  // rows (positions) summed over the layer runs
};
void SetLayerPhaseTimes(LayerPhaseTimes* times);

// The head's first step: embedding rows (+ learned positions) of tokens at positions
// first_position, first_position + 1, ... Refuses ids outside the vocabulary.
Result<HiddenStates> Embed(const StageWeights& w, std::span<const int32_t> tokens, int first_position);

// Runs layers [first, end) (within w's range) over `hidden` in place, reading the keys of
// earlier positions from kv and appending this batch's. hidden.positions must start at or
// before kv.length() (later positions are forgotten first: a rewind) and fit in kv.ctx().
// A non-finite activation is refused with an error naming the layer and position.
Status RunLayers(const StageWeights& w, int first, int end, HiddenStates& hidden, KvCache& kv);

// Final norm + LM head of the last row of `hidden`: logits (vocab). Head only.
Result<std::vector<float>> Readout(const StageWeights& w, const HiddenStates& hidden);
// The same for every row: (n_tokens, vocab), row i predicting position i + 1 (eval).
Result<std::vector<float>> ReadoutAll(const StageWeights& w, const HiddenStates& hidden);

// "The rest of the ring" as one stage sees it: takes the hidden states after this stage's
// layers and returns them after every later stage's. In-process: LocalStage; the ring
// plugs a network implementation in here. Implementations say whether they are
// thread-safe; the forward pass calls one at a time.
class StageLink {
 public:
  virtual ~StageLink() = default;
  virtual Result<HiddenStates> Run(HiddenStates hidden) = 0;
  // Pipelined use (prefill with several chunks in flight): Submit hands a batch over
  // without waiting for it; Collect returns the results in submission order. The defaults
  // run each batch at once in Submit; the ring's link overlaps them.
  virtual Status Submit(HiddenStates hidden);
  virtual Result<HiddenStates> Collect();
  // Forgets positions >= n on every later stage (rejected lookahead drafts). The default does
  // nothing: the ring's stages forget them when the turn's done says how many they hold.
  virtual void Truncate(int /*n*/) {}

 private:
  std::deque<Result<HiddenStates>> done_;  // results of the default Submit
};

// A stage in this process: its own layers (with its own KV cache), then `next` (nullptr
// for the last stage). Holds a reference to weights that must outlive it. Not thread-safe.
class LocalStage final : public StageLink {
 public:
  LocalStage(const StageWeights& weights, int ctx, StageLink* next);
  Result<HiddenStates> Run(HiddenStates hidden) override;
  void Truncate(int n) override;
  const KvCache& kv() const { return kv_; }

 private:
  const StageWeights& weights_;
  KvCache kv_;
  StageLink* next_;
};

// The head's side of one forward step: Embed -> own layers -> the rest of the ring ->
// Readout. Owns the head's KV cache. Not thread-safe.
class HeadStage {
 public:
  // rest may be nullptr when the head holds every layer.
  HeadStage(const StageWeights& head, int ctx, StageLink* rest);
  const ModelSpec& spec() const { return head_.spec(); }
  int ctx() const { return kv_.ctx(); }
  // Positions with cached keys (the sequence so far).
  int length() const { return kv_.length(); }
  // Runs tokens at positions first_position.. (<= length(): earlier ones are kept, later
  // ones forgotten) and returns the logits of the last one.
  Result<std::vector<float>> Forward(std::span<const int32_t> tokens, int first_position);
  // The same, logits of every row (n_tokens, vocab).
  Result<std::vector<float>> ForwardAll(std::span<const int32_t> tokens, int first_position);
  // Forward and ForwardAll into `logits` (resized; its storage is reused): with no rest of
  // the ring, a decode lap then allocates nothing (the step's rows are kept here too).
  Status Forward(std::span<const int32_t> tokens, int first_position, std::vector<float>& logits);
  Status ForwardAll(std::span<const int32_t> tokens, int first_position, std::vector<float>& logits);
  // A prompt from position `first` (<= length(): a cached prefix is kept) in chunks of
  // `chunk` positions with up to `in_flight` chunks in the rest of the ring at once; the
  // logits of the last position. The same bits as Forward over the same chunks one at a time.
  Result<std::vector<float>> Prefill(std::span<const int32_t> tokens, int chunk, int in_flight, int first = 0);
  // The rest of the ring for the next calls (a new turn has a new link); nullptr: none.
  void set_link(StageLink* rest) { rest_ = rest; }
  // Forgets cached positions >= n, here and on the stages after this one.
  void Truncate(int n);
  size_t CacheBytes() const { return kv_.Bytes(); }
  // The final hidden row (before the final norm) of the position the last Forward, ForwardAll
  // or Prefill read out: what the ring returned for it. Verify digests it with the logits.
  std::span<const float> last_row() const { return last_row_; }
  // Row i of the final hidden rows the last ForwardAll read out (lookahead drafting: Verify
  // digests each position's row).
  std::span<const float> row(int i) const;

 private:
  // Embedding and the head's own layers, into h.
  Status Local(std::span<const int32_t> tokens, int first_position, HiddenStates& h);
  // Checks what came back from the rest of the ring.
  Status CheckReturned(const HiddenStates& back, const std::vector<int32_t>& sent) const;
  // Local, then the rest of the ring: the final hidden rows, into h.
  Status Hidden(std::span<const int32_t> tokens, int first_position, HiddenStates& h);
  // Keeps the last row of `h` as last_row_.
  void KeepLastRow(const HiddenStates& h);
  const StageWeights& head_;
  KvCache kv_;
  StageLink* rest_;
  std::vector<float> last_row_;  // (hidden)
  std::vector<float> rows_;      // (n_tokens, hidden) of the last ForwardAll
  HiddenStates step_;            // Forward's rows, kept for their storage
};

// Splits layers into consecutive stages of the given sizes; stage 0 is the head (it may
// hold zero layers). Refuses sizes that do not cover n_layers exactly.
Result<std::vector<std::pair<int, int>>> StageRanges(int n_layers, std::span<const int> layer_counts);

// A whole model split into stages in this process, each stage holding only its own
// StageWeights and KV cache, chained with LocalStage: single-device runs and the split
// equivalence tests. Not thread-safe; move-only.
class LocalPipeline {
 public:
  static Result<LocalPipeline> Load(ModelSource& source, const ModelInfo& info, std::span<const int> layer_counts,
                                    int ctx, const ProgressFn& progress = {});
  static Result<LocalPipeline> FromTensors(const ModelSpec& spec, const HostTensors& tensors,
                                           std::span<const int> layer_counts, int ctx);
  LocalPipeline(LocalPipeline&&) noexcept = default;
  LocalPipeline& operator=(LocalPipeline&&) noexcept = default;

  HeadStage& head() { return *head_; }
  const StageWeights& weights(int stage) const { return *weights_[static_cast<size_t>(stage)]; }
  int n_stages() const { return static_cast<int>(weights_.size()); }
  size_t WeightBytes() const;
  // Bytes of every stage's KV cache (allocated whole up front).
  size_t CacheBytes() const;

 private:
  LocalPipeline() = default;
  Status Link(int ctx);
  std::vector<std::unique_ptr<StageWeights>> weights_;
  std::vector<std::unique_ptr<LocalStage>> stages_;  // stages 1..n-1
  std::unique_ptr<HeadStage> head_;
};

// The default context length: the model's max_positions capped at 4096.
int DefaultContext(const ModelSpec& spec);
// Checks a requested context length against the model and the int8 unit's K limit.
Status CheckContext(const ModelSpec& spec, int ctx);

}  // namespace daisy
