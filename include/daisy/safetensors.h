// safetensors headers, dtype widening, the tensor index of a (possibly sharded) repo, and
// the range planner that turns "the tensors of layers a..b" into few coalesced reads.
// Everything here validates before trusting: a header is checked completely (bounds,
// overlaps, sizes with overflow-safe arithmetic, dtypes) before any tensor is used.
// Value types are thread-compatible; functions are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/source.h"
#include "daisy/status.h"

namespace daisy {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI8,
  kU8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kBool,
  kF8E4M3,
  kF8E5M2
};
std::string_view DTypeName(DType dtype);
size_t DTypeSize(DType dtype);
// Weights may be F32, F16 or BF16; every other recognised dtype is refused by name.
bool IsWeightDType(DType dtype);

// The largest header accepted (the format's own reference implementation uses 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;

struct TensorInfo {
  std::string name;
  std::string file;  // the .safetensors file holding it
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute byte offset in `file`
  uint64_t bytes = 0;   // = product(shape) * DTypeSize(dtype)
  uint64_t Elements() const;
};

struct SafetensorsHeader {
  std::string file;
  uint64_t file_size = 0;
  uint64_t header_len = 0;          // JSON length; data starts at 8 + header_len
  std::vector<TensorInfo> tensors;  // sorted by offset
  std::map<std::string, std::string> metadata;
};

// Parses and validates the JSON header of `file` (file_size bytes long).
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view file, std::string_view header_json,
                                                 uint64_t header_len, uint64_t file_size);
// Reads the 8-byte length and the JSON header from a source (two small reads).
Result<SafetensorsHeader> ReadSafetensorsHeader(ByteSource& source, std::string_view file);

// Exact widening of every 16-bit pattern (subnormals, signed zero, inf, NaN payloads).
float WidenBF16(uint16_t bits);
float WidenF16(uint16_t bits);
// Converts raw little-endian weight bytes of a weight dtype to f32.
Status WidenToF32(DType dtype, std::span<const uint8_t> raw, std::span<float> out);

// All tensors of a model: model.safetensors, or the shards named by
// model.safetensors.index.json. Open() reads only the index (or the single file's header);
// a shard's header is read when one of its tensors is first needed, so a stage touches
// only the shards that hold its layers.
class TensorIndex {
 public:
  // Reads model.safetensors.index.json if present, else model.safetensors' header.
  static Result<TensorIndex> Open(ModelSource& source);
  // Open() plus every shard's header (inspect, parameter counts).
  static Result<TensorIndex> Load(ModelSource& source);
  // Reads the headers of the shards holding `names` that are not read yet.
  Status LoadHeadersFor(ModelSource& source, const std::vector<std::string>& names);
  Status LoadAllHeaders(ModelSource& source);

  // Whether the model has this tensor (from the weight map; no header needed).
  bool Has(std::string_view name) const;
  // The tensor's header entry, or nullptr when absent or its shard's header is not read.
  const TensorInfo* Find(std::string_view name) const;
  // Tensors of the headers read so far, ordered by (file, offset).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<std::string>& files() const { return files_; }
  bool sharded() const { return sharded_; }
  bool AllHeadersLoaded() const;
  uint64_t ParameterCount() const;                        // exact element count over the headers read
  uint64_t HeaderBytes() const { return header_bytes_; }  // bytes read for headers so far

 private:
  Status AddHeader(SafetensorsHeader header);
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;          // into tensors_
  std::map<std::string, std::string, std::less<>> weight_map_;  // name -> file
  std::vector<std::string> files_;
  std::map<std::string, bool, std::less<>> file_loaded_;
  bool sharded_ = false;
  uint64_t header_bytes_ = 0;
};

// One read of a file. Coalescing merges ranges of the same file whose gap is at most
// `max_gap` bytes (the gap bytes are read and discarded): kDefaultCoalesceGap = 1 MiB,
// small next to a layer of any real model and far cheaper than a request round trip.
inline constexpr uint64_t kDefaultCoalesceGap = 1u << 20;
struct ByteRange {
  std::string file;
  uint64_t offset = 0;
  uint64_t length = 0;
};
std::vector<ByteRange> CoalesceRanges(std::vector<ByteRange> ranges, uint64_t max_gap = kDefaultCoalesceGap);

// A block of whole rows of one tensor, as its bytes arrive. The tensor is seen as
// (rows, row_elements): rows = shape[0] (1 for a scalar), row_elements = the product of
// the other dimensions (1 for a vector). Blocks of a tensor come in order, rows [0, rows),
// each at most kTensorBlockBytes of f32 (but at least one row); a tensor with no elements
// comes as one empty block.
inline constexpr uint64_t kTensorBlockBytes = 4u << 20;
// How far the download may run ahead of the conversion (bytes held in between).
inline constexpr uint64_t kPrefetchBytes = 8u << 20;
struct TensorBlock {
  const TensorInfo* info = nullptr;
  int64_t rows = 0;  // of the whole tensor
  int64_t row_elements = 0;
  int64_t row_begin = 0;          // first row of this block
  int64_t n_rows = 0;             // rows in this block
  std::span<const uint8_t> raw;   // the file's bytes of these rows (info->dtype, little-endian)
  std::span<const float> values;  // the same values widened to f32 (exact)
  bool first() const { return row_begin == 0; }
  bool last() const { return row_begin + n_rows == rows; }
};
using TensorBlockSink = std::function<Status(const TensorBlock& block)>;

// Fetches the named tensors with few requests (one per coalesced range; the gap merged is
// at most max_gap and at most 1% of the bytes wanted from that file, so the bytes fetched
// stay within 1% of the tensors' bytes) and hands them to `sink` block by block as the
// bytes arrive, tensors in file-offset order. The bytes are read on a thread of their own,
// up to kPrefetchBytes ahead of the sink, so downloading the next range overlaps
// converting this one (a wasm build without threads reads and converts on the calling
// thread, chunk by chunk); `sink` and `progress` run on the calling thread. Memory is one read
// chunk, the bytes read ahead, and one block (raw and f32), whatever the size of a tensor
// or a file: a caller that converts each block to its resident form never holds a whole
// tensor at any width. The source is used only by the reader thread while this runs. `progress`
// (optional) sees the bytes consumed over all ranges after every read chunk and every
// block (so at least once per tensor, and while a big tensor is being converted).
Status FetchTensorBlocks(ModelSource& source, const TensorIndex& index, const std::vector<std::string>& names,
                         const TensorBlockSink& sink, const ProgressFn& progress = {},
                         uint64_t max_gap = kDefaultCoalesceGap);

// FetchTensorBlocks, assembled: hands each tensor to `sink` whole, as f32, once all its
// bytes have arrived. Memory is bounded by the largest tensor in f32 (tests, tools; the
// forward pass loads through FetchTensorBlocks).
using TensorSink = std::function<Status(const TensorInfo& info, std::span<const float> values)>;
Status FetchTensors(ModelSource& source, const TensorIndex& index, const std::vector<std::string>& names,
                    const TensorSink& sink, const ProgressFn& progress = {}, uint64_t max_gap = kDefaultCoalesceGap);

}  // namespace daisy
