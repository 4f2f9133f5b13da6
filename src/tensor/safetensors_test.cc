#include "daisy/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

namespace daisy {
namespace {

namespace fs = std::filesystem;

// Builds the bytes of a safetensors file from a header JSON text and a data section.
std::string FileBytes(const std::string& header, size_t data_bytes, uint64_t declared_len = UINT64_MAX) {
  uint64_t len = declared_len == UINT64_MAX ? header.size() : declared_len;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  out += header;
  out += std::string(data_bytes, '\0');
  return out;
}

Status ParseBytes(const std::string& bytes, const std::string& name = "bad.safetensors") {
  auto dir = fs::temp_directory_path() / "daisy_st_test";
  fs::create_directories(dir);
  { std::ofstream(dir / name, std::ios::binary) << bytes; }
  auto src = OpenLocalFile((dir / name).string());
  if (!src.ok()) return src.status();
  return ReadSafetensorsHeader(**src, name).status();
}

void ExpectRefused(const std::string& bytes, const std::string& needle) {
  Status st = ParseBytes(bytes);
  ASSERT_FALSE(st.ok()) << "expected refusal mentioning: " << needle;
  EXPECT_NE(st.message().find("bad.safetensors"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(SafetensorsHeader, AcceptsAValidFileWithMetadata) {
  std::string h =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[16,28]},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  auto dir = fs::temp_directory_path() / "daisy_st_test";
  fs::create_directories(dir);
  { std::ofstream(dir / "ok.safetensors", std::ios::binary) << FileBytes(h, 28); }
  auto src = OpenLocalFile((dir / "ok.safetensors").string());
  ASSERT_TRUE(src.ok());
  auto hdr = ReadSafetensorsHeader(**src, "ok.safetensors");
  ASSERT_TRUE(hdr.ok()) << hdr.status().message();
  ASSERT_EQ(hdr->tensors.size(), 2u);
  EXPECT_EQ(hdr->tensors[0].name, "a");  // sorted by offset
  EXPECT_EQ(hdr->tensors[0].offset, 8 + h.size());
  EXPECT_EQ(hdr->tensors[1].dtype, DType::kBF16);
  EXPECT_EQ(hdr->tensors[1].Elements(), 6u);
  EXPECT_EQ(hdr->metadata.at("format"), "pt");
}

TEST(SafetensorsHeader, RefusesMalformedFilesWithClearErrors) {
  // Truncated: shorter than the length prefix, and a header cut short.
  ExpectRefused(std::string("\x05\x00\x00", 3), "shorter than the 8-byte length prefix");
  ExpectRefused(FileBytes("{\"a\":", 0, 100), "runs past the end of the file");
  // Header length beyond the file, and beyond the limit.
  ExpectRefused(FileBytes("{}", 0, 1ull << 40), "exceeds the limit");
  ExpectRefused(FileBytes("{}", 0, 3), "runs past the end of the file");
  ExpectRefused(FileBytes("{\"a\"", 4, 6), "invalid JSON");
  // Not an object / invalid JSON / nesting bomb.
  ExpectRefused(FileBytes("[1,2,3]", 0), "not a JSON object");
  ExpectRefused(FileBytes("{\"a\":{\"dtype\":\"F32\",", 0), "invalid JSON");
  ExpectRefused(FileBytes(std::string(5000, '[') + std::string(5000, ']'), 0), "nested too deeply");
  // Overlapping and out-of-range offsets.
  ExpectRefused(
      FileBytes(
          R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
          24),
      "overlap");
  ExpectRefused(FileBytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "outside the data section");
  ExpectRefused(FileBytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", 16), "begin > end");
  // Size / shape mismatch.
  ExpectRefused(FileBytes(R"({"a":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})", 16), "need 20");
  // Unknown dtype.
  ExpectRefused(FileBytes(R"({"a":{"dtype":"Q4_K","shape":[4],"data_offsets":[0,16]}})", 16), "unknown dtype 'Q4_K'");
  // Shapes whose product overflows 64 bits.
  ExpectRefused(FileBytes(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", 16),
                "overflows 64 bits");
  ExpectRefused(FileBytes(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,16]}})", 16),
                "overflows 64 bits");
  // Wrong field types.
  ExpectRefused(FileBytes(R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 16), "non-negative integer");
  ExpectRefused(FileBytes(R"({"a":{"dtype":"F32","shape":[4]}})", 16), "data_offsets");
  ExpectRefused(FileBytes(R"({"__metadata__":{"x":1}})", 0), "__metadata__");
  ExpectRefused(FileBytes(R"({"a":7})", 0), "is not an object");
}

TEST(SafetensorsHeader, RecognisesNonWeightDTypesAndRefusesThemAsWeights) {
  for (const char* d : {"I8", "U8", "I32", "I64", "F64", "BOOL", "F8_E4M3", "F8_E5M2"}) {
    std::string h = std::string(R"({"a":{"dtype":")") + d + R"(","shape":[0],"data_offsets":[0,0]}})";
    auto parsed = ParseSafetensorsHeader("x.safetensors", h, h.size(), 8 + h.size());
    ASSERT_TRUE(parsed.ok()) << d << ": " << parsed.status().message();
    DType dt = parsed->tensors[0].dtype;
    EXPECT_FALSE(IsWeightDType(dt));
    EXPECT_EQ(DTypeName(dt), d);
    std::vector<float> out;
    Status st = WidenToF32(dt, {}, out);
    EXPECT_EQ(st.code(), ErrorCode::kUnimplemented);
    EXPECT_NE(st.message().find(d), std::string::npos);
  }
}

TEST(Widening, Bf16IsExactForAll65536Patterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = WidenBF16(static_cast<uint16_t>(b));
    ASSERT_EQ(std::bit_cast<uint32_t>(f), b << 16) << b;
  }
}

TEST(Widening, F16IsExactForAll65536Patterns) {
  int nans = 0, subnormals = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = WidenF16(h);
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    if (((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff) != 0) {
      // NaN: sign and payload kept bit for bit (no quieting).
      ++nans;
      ASSERT_EQ(bits,
                (static_cast<uint32_t>(h & 0x8000) << 16) | 0x7f800000u | (static_cast<uint32_t>(h & 0x3ff) << 13))
          << b;
      continue;
    }
    // Independent reference: the compiler's own half-precision conversion.
    const float ref = static_cast<float>(std::bit_cast<_Float16>(h));
    ASSERT_EQ(bits, std::bit_cast<uint32_t>(ref)) << "pattern " << b;
    if (((h >> 10) & 0x1f) == 0 && (h & 0x3ff) != 0) ++subnormals;
  }
  EXPECT_EQ(nans, 2 * 1023);
  EXPECT_EQ(subnormals, 2 * 1023);
  EXPECT_TRUE(std::signbit(WidenF16(0x8000)));
  EXPECT_EQ(WidenF16(0x7c00), INFINITY);
  EXPECT_EQ(WidenF16(0x0001), std::ldexp(1.0f, -24));
}

TEST(RangePlanner, CoalescesNearbyRangesPerFile) {
  std::vector<ByteRange> r = {{"b", 100, 10}, {"a", 0, 10}, {"a", 10, 5}, {"a", 40, 10}, {"a", 1000, 1}, {"b", 0, 0}};
  auto out = CoalesceRanges(r, 30);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].file, "a");
  EXPECT_EQ(out[0].offset, 0u);
  EXPECT_EQ(out[0].length, 50u);    // gap of 25 <= 30 merged
  EXPECT_EQ(out[1].offset, 1000u);  // gap of 950 > 30 kept apart
  EXPECT_EQ(out[2].file, "b");
  EXPECT_EQ(out[2].length, 10u);
  EXPECT_EQ(CoalesceRanges(r, 0).size(), 4u);
}

// A ModelSource over a folder that counts reads and bytes, as the Hub test server does.
class CountingSource final : public ModelSource {
 public:
  explicit CountingSource(std::string dir) : inner_(OpenLocalFolder(dir).value()) {}
  std::string Describe() const override { return inner_->Describe(); }
  std::string ModelId() const override { return inner_->ModelId(); }
  std::string Revision() const override { return inner_->Revision(); }
  Result<std::string> ReadFile(std::string_view f) override {
    files_touched.insert(std::string(f));
    return inner_->ReadFile(f);
  }
  Result<std::unique_ptr<ByteSource>> OpenFile(std::string_view f) override;
  int reads = 0;
  uint64_t bytes = 0;
  std::set<std::string> files_touched;

 private:
  std::unique_ptr<ModelSource> inner_;
};

class CountingFile final : public ByteSource {
 public:
  CountingFile(std::unique_ptr<ByteSource> inner, CountingSource* owner) : inner_(std::move(inner)), owner_(owner) {}
  const std::string& name() const override { return inner_->name(); }
  Result<uint64_t> Size() override { return inner_->Size(); }
  Status ReadStream(uint64_t off, uint64_t len, const ChunkSink& sink) override {
    ++owner_->reads;
    owner_->bytes += len;
    return inner_->ReadStream(off, len, sink);
  }

 private:
  std::unique_ptr<ByteSource> inner_;
  CountingSource* owner_;
};

Result<std::unique_ptr<ByteSource>> CountingSource::OpenFile(std::string_view f) {
  files_touched.insert(std::string(f));
  DAISY_ASSIGN_OR_RETURN(auto inner, inner_->OpenFile(f));
  return std::unique_ptr<ByteSource>(new CountingFile(std::move(inner), this));
}

// Writes a safetensors file of F32 tensors t<i> of `n` floats each (value = i * 1000 + j).
void WriteShard(const fs::path& path, int first, int count, int n) {
  nlohmann::json h = nlohmann::json::object();
  for (int i = 0; i < count; ++i)
    h["t" + std::to_string(first + i)] = {
        {"dtype", "F32"}, {"shape", {n}}, {"data_offsets", {i * n * 4, (i + 1) * n * 4}}};
  std::string hs = h.dump();
  std::string bytes = FileBytes(hs, 0);
  for (int i = 0; i < count; ++i)
    for (int j = 0; j < n; ++j) {
      float v = static_cast<float>((first + i) * 1000 + j);
      bytes.append(reinterpret_cast<const char*>(&v), 4);
    }
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(TensorIndex, ShardedRepoTouchesOnlyTheShardsARequestNeeds) {
  auto dir = fs::temp_directory_path() / "daisy_sharded";
  fs::remove_all(dir);
  fs::create_directories(dir);
  WriteShard(dir / "model-00001-of-00003.safetensors", 0, 4, 8);
  WriteShard(dir / "model-00002-of-00003.safetensors", 4, 4, 8);
  WriteShard(dir / "model-00003-of-00003.safetensors", 8, 4, 8);
  nlohmann::json idx = {{"metadata", {{"total_size", 12 * 32}}}, {"weight_map", nlohmann::json::object()}};
  for (int i = 0; i < 12; ++i)
    idx["weight_map"]["t" + std::to_string(i)] = "model-0000" + std::to_string(i / 4 + 1) + "-of-00003.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();

  CountingSource src(dir.string());
  auto index = TensorIndex::Open(src);
  ASSERT_TRUE(index.ok()) << index.status().message();
  EXPECT_TRUE(index->Has("t11"));
  EXPECT_EQ(index->Find("t11"), nullptr);  // header not read yet
  std::vector<std::string> names = {"t5", "t6", "t7"};
  ASSERT_TRUE(index->LoadHeadersFor(src, names).ok());
  EXPECT_EQ(src.files_touched.count("model-00001-of-00003.safetensors"), 0u);
  EXPECT_EQ(src.files_touched.count("model-00003-of-00003.safetensors"), 0u);

  src.reads = 0;
  src.bytes = 0;
  std::vector<std::pair<std::string, float>> got;
  ASSERT_TRUE(FetchTensors(src, *index, names, [&](const TensorInfo& t, std::span<const float> v) {
                got.emplace_back(t.name, v[3]);
                return Status::Ok();
              }).ok());
  EXPECT_EQ(src.reads, 1);         // three adjacent tensors: one request
  EXPECT_EQ(src.bytes, 3u * 32u);  // exactly their bytes
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], (std::pair<std::string, float>("t5", 5003.0f)));
  EXPECT_EQ(got[2], (std::pair<std::string, float>("t7", 7003.0f)));
  EXPECT_EQ(src.files_touched.count("model-00001-of-00003.safetensors"), 0u);

  // A tensor the index names but its shard lacks is an error, not a crash.
  idx["weight_map"]["ghost"] = "model-00001-of-00003.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  auto index2 = TensorIndex::Open(src);
  ASSERT_TRUE(index2.ok());
  Status st = index2->LoadHeadersFor(src, {"ghost"});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("ghost"), std::string::npos);
  // An index that points outside the folder is refused.
  idx["weight_map"]["evil"] = "../../etc/passwd";
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  EXPECT_FALSE(TensorIndex::Open(src).ok());
  fs::remove_all(dir);
}

TEST(FetchTensors, DeliversEveryTensorOfTheBundledModelInOrder) {
  const char* models = std::getenv("DAISY_MODELS");
  ASSERT_NE(models, nullptr);
  CountingSource src(std::string(models) + "/stories260K");
  auto index = TensorIndex::Load(src);
  ASSERT_TRUE(index.ok()) << index.status().message();
  EXPECT_EQ(index->ParameterCount(), 260032u);
  std::vector<std::string> names;
  for (const auto& t : index->tensors()) names.push_back(t.name);
  src.reads = 0;
  uint64_t elements = 0;
  TransferProgress last;
  ASSERT_TRUE(FetchTensors(
                  src, *index, names,
                  [&](const TensorInfo& t, std::span<const float> v) {
                    EXPECT_EQ(v.size(), t.Elements());
                    elements += v.size();
                    return Status::Ok();
                  },
                  [&](const TransferProgress& p) { last = p; })
                  .ok());
  EXPECT_EQ(elements, 260032u);
  EXPECT_EQ(src.reads, 1);
  EXPECT_EQ(last.bytes_done, last.bytes_total);
  EXPECT_EQ(last.bytes_total, 260032u * 4);
}

// Blocks of whole rows, in order, each at most kTensorBlockBytes of f32, raw bytes and
// widened values side by side; a tensor without bytes comes as one empty block; progress
// ticks at every block.
TEST(FetchTensorBlocks, HandsOverBoundedBlocksOfWholeRows) {
  auto dir = fs::temp_directory_path() / ("daisy_blocks_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // big: BF16 (3000, 700): 1497 rows per 4 MiB block of f32, so blocks of 1497, 1497, 6.
  const int64_t big_rows = 3000, big_cols = 700;
  const uint64_t big_bytes = static_cast<uint64_t>(big_rows * big_cols) * 2;
  nlohmann::json h = nlohmann::json::object();
  h["big"] = {{"dtype", "BF16"}, {"shape", {big_rows, big_cols}}, {"data_offsets", {0, big_bytes}}};
  h["vec"] = {{"dtype", "F32"}, {"shape", {5}}, {"data_offsets", {big_bytes, big_bytes + 20}}};
  h["none"] = {{"dtype", "F16"}, {"shape", {0, 4}}, {"data_offsets", {big_bytes + 20, big_bytes + 20}}};
  h["one"] = {{"dtype", "F16"}, {"shape", nlohmann::json::array()}, {"data_offsets", {big_bytes + 20, big_bytes + 22}}};
  std::string bytes = FileBytes(h.dump(), 0);
  for (uint64_t i = 0; i < big_bytes / 2; ++i) {
    const uint16_t bits = static_cast<uint16_t>(i * 2654435761u >> 7);  // every pattern, NaNs included
    bytes.push_back(static_cast<char>(bits & 0xff));
    bytes.push_back(static_cast<char>(bits >> 8));
  }
  for (int i = 0; i < 5; ++i) {
    const float v = 0.5f + static_cast<float>(i);
    bytes.append(reinterpret_cast<const char*>(&v), 4);
  }
  bytes += std::string("\x00\x3c", 2);  // F16 1.0
  std::ofstream(dir / "model.safetensors", std::ios::binary) << bytes;

  CountingSource src(dir.string());
  auto index = TensorIndex::Load(src);
  ASSERT_TRUE(index.ok()) << index.status().message();
  src.reads = 0;
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> blocks;  // name -> (row_begin, n_rows)
  std::vector<float> big(static_cast<size_t>(big_rows * big_cols));
  std::vector<uint64_t> ticks;
  const Status st = FetchTensorBlocks(
      src, *index, {"vec", "big", "one", "none"},
      [&](const TensorBlock& b) -> Status {
        auto& seen = blocks[b.info->name];
        const int64_t expect_begin = seen.empty() ? 0 : seen.back().first + seen.back().second;
        EXPECT_EQ(b.row_begin, expect_begin) << b.info->name;
        seen.emplace_back(b.row_begin, b.n_rows);
        EXPECT_EQ(b.values.size(), static_cast<size_t>(b.n_rows * b.row_elements));
        EXPECT_EQ(b.raw.size(), b.values.size() * DTypeSize(b.info->dtype));
        EXPECT_TRUE(b.n_rows <= 1 || b.values.size() * sizeof(float) <= kTensorBlockBytes) << b.n_rows;
        std::vector<float> widened(b.values.size());
        EXPECT_TRUE(WidenToF32(b.info->dtype, b.raw, widened).ok());
        if (!widened.empty())
          EXPECT_EQ(std::memcmp(widened.data(), b.values.data(), widened.size() * 4), 0);  // no memcmp of null
        if (b.info->name == "big")
          std::copy(b.values.begin(), b.values.end(), big.begin() + b.row_begin * b.row_elements);
        if (b.info->name == "vec") {
          EXPECT_EQ(b.values[4], 4.5f);
        }
        if (b.info->name == "one") {
          EXPECT_EQ(b.values[0], 1.0f);
        }
        return Status::Ok();
      },
      [&](const TransferProgress& p) { ticks.push_back(p.bytes_done); });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(src.reads, 1);
  using Blocks = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(blocks["big"], (Blocks{{0, 1497}, {1497, 1497}, {2994, 6}}));
  EXPECT_EQ(blocks["vec"], (Blocks{{0, 5}}));
  EXPECT_EQ(blocks["none"], (Blocks{{0, 0}}));
  EXPECT_EQ(blocks["one"], (Blocks{{0, 1}}));
  for (size_t i = 0; i < big.size(); ++i) {
    const uint16_t bits = static_cast<uint16_t>(i * 2654435761u >> 7);
    ASSERT_EQ(std::bit_cast<uint32_t>(big[i]), static_cast<uint32_t>(bits) << 16) << i;
  }
  // One tick at the start, one per block, one per read chunk: ascending, ending at the total.
  ASSERT_GE(ticks.size(), 1u + 3u + 1u + 1u);
  EXPECT_TRUE(std::is_sorted(ticks.begin(), ticks.end()));
  EXPECT_EQ(ticks.front(), 0u);
  EXPECT_EQ(ticks.back(), big_bytes + 22);
  fs::remove_all(dir);
}

// A local folder whose files count the bytes a read has handed over (after the sink took
// them), and can fail once `fail_after` bytes have gone.
class ReadAheadSource final : public ModelSource {
 public:
  explicit ReadAheadSource(std::string dir) : inner_(OpenLocalFolder(dir).value()) {}
  std::string Describe() const override { return inner_->Describe(); }
  std::string ModelId() const override { return inner_->ModelId(); }
  std::string Revision() const override { return inner_->Revision(); }
  Result<std::string> ReadFile(std::string_view f) override { return inner_->ReadFile(f); }
  Result<std::unique_ptr<ByteSource>> OpenFile(std::string_view f) override {
    DAISY_ASSIGN_OR_RETURN(auto inner, inner_->OpenFile(f));
    return std::unique_ptr<ByteSource>(new File(std::move(inner), this));
  }
  std::atomic<uint64_t> handed{0};
  uint64_t fail_after = UINT64_MAX;

 private:
  class File final : public ByteSource {
   public:
    File(std::unique_ptr<ByteSource> inner, ReadAheadSource* owner) : inner_(std::move(inner)), owner_(owner) {}
    const std::string& name() const override { return inner_->name(); }
    Result<uint64_t> Size() override { return inner_->Size(); }
    Status ReadStream(uint64_t off, uint64_t len, const ChunkSink& sink) override {
      // Small chunks, as an HTTP body arrives.
      return inner_->ReadStream(off, len, [&](std::span<const uint8_t> chunk) -> Status {
        for (size_t at = 0; at < chunk.size(); at += 64 << 10) {
          if (owner_->handed >= owner_->fail_after) return Unavailable("connection reset (test)");
          const auto piece = chunk.subspan(at, std::min<size_t>(64 << 10, chunk.size() - at));
          DAISY_RETURN_IF_ERROR(sink(piece));
          owner_->handed += piece.size();
        }
        return Status::Ok();
      });
    }

   private:
    std::unique_ptr<ByteSource> inner_;
    ReadAheadSource* owner_;
  };
  std::unique_ptr<ModelSource> inner_;
};

// One BF16 tensor (rows, cols) of counting values in dir/model.safetensors; its byte count.
uint64_t WriteBf16Model(const fs::path& dir, int64_t rows, int64_t cols) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  const uint64_t n_bytes = static_cast<uint64_t>(rows * cols) * 2;
  nlohmann::json h = nlohmann::json::object();
  h["big"] = {{"dtype", "BF16"}, {"shape", {rows, cols}}, {"data_offsets", {0, n_bytes}}};
  std::string bytes = FileBytes(h.dump(), 0);
  for (uint64_t i = 0; i < n_bytes / 2; ++i) {
    const uint16_t bits = static_cast<uint16_t>(0x3f80 + (i % 64));  // finite values
    bytes.push_back(static_cast<char>(bits & 0xff));
    bytes.push_back(static_cast<char>(bits >> 8));
  }
  std::ofstream(dir / "model.safetensors", std::ios::binary) << bytes;
  return n_bytes;
}

// The download runs ahead of the conversion: while the sink still holds the first block,
// the reader goes on and hands over the rest of the range (it fits the read-ahead). A
// fetch that reads only when the sink returns never gets there and times out here.
TEST(FetchTensorBlocks, ReadsAheadWhileTheSinkConverts) {
  const auto dir = fs::temp_directory_path() / ("daisy_readahead_" + std::to_string(::getpid()));
  const uint64_t total = WriteBf16Model(dir, 3000, 700);  // 4.2 MB: blocks of 1497 rows
  ASSERT_LT(total, kPrefetchBytes);
  ReadAheadSource src(dir.string());
  auto index = TensorIndex::Load(src);
  ASSERT_TRUE(index.ok()) << index.status().message();
  src.handed = 0;  // the header's bytes
  int blocks = 0;
  uint64_t handed_then = 0;
  const Status st = FetchTensorBlocks(src, *index, {"big"}, [&](const TensorBlock& b) -> Status {
    if (blocks++ == 0) {
      EXPECT_LT(b.raw.size(), total);
      // Bounded wait: 10 s at most.
      for (int i = 0; i < 1000 && src.handed < total; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      handed_then = src.handed;
    }
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(handed_then, total) << "bytes read while the first block converted";
  EXPECT_EQ(blocks, 3);
  fs::remove_all(dir);
}

// A sink that fails stops the fetch with its own error (the reader is stopped and joined);
// a reader that fails mid-range reports where, after every block that arrived whole was
// converted.
TEST(FetchTensorBlocks, ErrorsFromEitherSideStopTheFetch) {
  const auto dir = fs::temp_directory_path() / ("daisy_readahead_err_" + std::to_string(::getpid()));
  const uint64_t total = WriteBf16Model(dir, 30000, 700);  // 42 MB: more than the read-ahead
  {
    ReadAheadSource src(dir.string());
    auto index = TensorIndex::Load(src);
    ASSERT_TRUE(index.ok());
    src.handed = 0;
    const Status st = FetchTensorBlocks(
        src, *index, {"big"}, [&](const TensorBlock&) -> Status { return InvalidArgument("the sink refuses (test)"); });
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.message().find("the sink refuses (test)"), std::string::npos) << st.ToString();
    EXPECT_LT(src.handed.load(), total);  // the reader stopped early
  }
  {
    ReadAheadSource src(dir.string());
    auto index = TensorIndex::Load(src);
    ASSERT_TRUE(index.ok());
    src.handed = 0;
    src.fail_after = 10u << 20;
    int64_t rows_done = 0;
    const Status st = FetchTensorBlocks(src, *index, {"big"}, [&](const TensorBlock& b) -> Status {
      rows_done = b.row_begin + b.n_rows;
      return Status::Ok();
    });
    EXPECT_EQ(st.code(), ErrorCode::kUnavailable) << st.ToString();
    EXPECT_NE(st.message().find("connection reset (test)"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("fetching model.safetensors bytes"), std::string::npos) << st.ToString();
    // 10 MiB arrived: every whole block in it was converted (blocks of 1497 rows of 1400 B).
    EXPECT_EQ(rows_done, (10 << 20) / (1497 * 1400) * 1497);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace daisy
