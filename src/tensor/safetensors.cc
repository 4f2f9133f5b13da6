// safetensors header parsing and validation. The header is untrusted input (it may come
// from any Hub repo): everything is checked before a tensor is used, with overflow-safe
// arithmetic, and every error names the file and the problem.
#include "daisy/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

namespace daisy {

namespace {

struct DTypeEntry {
  std::string_view name;
  DType dtype;
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {"F32", DType::kF32, 4},   {"F16", DType::kF16, 2},        {"BF16", DType::kBF16, 2},      {"F64", DType::kF64, 8},
    {"I8", DType::kI8, 1},     {"U8", DType::kU8, 1},          {"I16", DType::kI16, 2},        {"U16", DType::kU16, 2},
    {"I32", DType::kI32, 4},   {"U32", DType::kU32, 4},        {"I64", DType::kI64, 8},        {"U64", DType::kU64, 8},
    {"BOOL", DType::kBool, 1}, {"F8_E4M3", DType::kF8E4M3, 1}, {"F8_E5M2", DType::kF8E5M2, 1},
};

// Nesting deeper than any valid header is refused before the JSON parser sees it.
bool NestingWithin(std::string_view json, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    char c = json[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > max_depth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

bool MulOverflow(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return e.name;
  return "?";
}

size_t DTypeSize(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return e.size;
  return 0;
}

bool IsWeightDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

uint64_t TensorInfo::Elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // validated not to overflow at parse
  return n;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view file, std::string_view header_json,
                                                 uint64_t header_len, uint64_t file_size) {
  const std::string where(file);
  auto bad = [&](const std::string& what) {
    return InvalidArgument(where + ": malformed safetensors header: " + what);
  };
  if (header_len > kMaxSafetensorsHeader)
    return bad("header length " + std::to_string(header_len) + " exceeds the limit of " +
               std::to_string(kMaxSafetensorsHeader) + " bytes");
  if (file_size < 8 || header_len > file_size - 8)
    return bad("header length " + std::to_string(header_len) + " runs past the end of the file (" +
               std::to_string(file_size) + " bytes)");
  if (header_json.size() != header_len) return bad("header is truncated");
  if (!NestingWithin(header_json, 8)) return bad("JSON nested too deeply");

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header_json.begin(), header_json.end());
  } catch (const nlohmann::json::exception& e) {
    return bad(std::string("invalid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) return bad("the header is not a JSON object");

  SafetensorsHeader h;
  h.file = where;
  h.file_size = file_size;
  h.header_len = header_len;
  const uint64_t data_size = file_size - 8 - header_len;

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return bad("__metadata__ value '" + m.key() + "' is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string tname = "tensor '" + name + "'";
    if (!v.is_object()) return bad(tname + " is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return bad(tname + " has no string dtype");
    if (sh == v.end() || !sh->is_array()) return bad(tname + " has no shape array");
    if (off == v.end() || !off->is_array() || off->size() != 2) return bad(tname + " has no [begin, end] data_offsets");

    TensorInfo t;
    t.name = name;
    t.file = where;
    const std::string dname = dt->get<std::string>();
    size_t esize = 0;
    for (const auto& e : kDTypes)
      if (e.name == dname) {
        t.dtype = e.dtype;
        esize = e.size;
      }
    if (esize == 0) return bad(tname + " has unknown dtype '" + dname + "'");

    uint64_t elements = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) return bad(tname + " has a shape entry that is not a non-negative integer");
      uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return bad(tname + " has a dimension too large");
      if (MulOverflow(elements, dim, &elements)) return bad(tname + " has a shape whose product overflows 64 bits");
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t nbytes = 0;
    if (MulOverflow(elements, esize, &nbytes)) return bad(tname + " has a byte size that overflows 64 bits");

    if (!(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      return bad(tname + " has data_offsets that are not non-negative integers");
    uint64_t begin = (*off)[0].get<uint64_t>();
    uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end) return bad(tname + " has data_offsets with begin > end");
    if (end > data_size)
      return bad(tname + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                 ") outside the data section (" + std::to_string(data_size) + " bytes)");
    if (end - begin != nbytes)
      return bad(tname + " occupies " + std::to_string(end - begin) + " bytes but its shape and dtype " + dname +
                 " need " + std::to_string(nbytes));
    t.offset = 8 + header_len + begin;
    t.bytes = nbytes;
    h.tensors.push_back(std::move(t));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.bytes < b.bytes;
  });
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    const TensorInfo& prev = h.tensors[i - 1];
    const TensorInfo& cur = h.tensors[i];
    if (prev.bytes > 0 && cur.bytes > 0 && cur.offset < prev.offset + prev.bytes)
      return bad("tensors '" + prev.name + "' and '" + cur.name + "' overlap");
  }
  return h;
}

Result<SafetensorsHeader> ReadSafetensorsHeader(ByteSource& source, std::string_view file) {
  const std::string where(file);
  // The length prefix first: a ranged read also tells a remote source the file's size, so
  // the header costs two requests and no separate size probe.
  uint8_t len_bytes[8];
  Status first = source.ReadAt(0, len_bytes);
  DAISY_ASSIGN_OR_RETURN(uint64_t size, source.Size());
  if (size < 8)
    return InvalidArgument(where + ": malformed safetensors header: file is " + std::to_string(size) +
                           " bytes, shorter than the 8-byte length prefix");
  DAISY_RETURN_IF_ERROR(first);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];  // little-endian
  if (header_len > kMaxSafetensorsHeader || header_len > size - 8) {
    // Let the parser produce the message (it names both limits).
    return ParseSafetensorsHeader(file, {}, header_len, size);
  }
  std::string json(static_cast<size_t>(header_len), '\0');
  DAISY_RETURN_IF_ERROR(source.ReadAt(8, std::span<uint8_t>(reinterpret_cast<uint8_t*>(json.data()), json.size())));
  return ParseSafetensorsHeader(file, json, header_len, size);
}

float WidenBF16(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

float WidenF16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf, NaN (payload kept)
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  // Subnormal (or zero): mant * 2^-24 is exact in f32; the sign is applied by bits so -0 stays -0.
  float mag = static_cast<float>(mant) * 5.9604644775390625e-08f;
  return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
}

Status WidenToF32(DType dtype, std::span<const uint8_t> raw, std::span<float> out) {
  const size_t esize = DTypeSize(dtype);
  if (!IsWeightDType(dtype))
    return Unimplemented("dtype " + std::string(DTypeName(dtype)) +
                         " is not supported for weights (F32, F16, BF16 are)");
  if (raw.size() != out.size() * esize) return Internal("Bug: WidenToF32 size mismatch");
  static_assert(std::endian::native == std::endian::little, "big-endian hosts need byte swaps here");
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out.data(), raw.data(), raw.size());
      break;
    case DType::kBF16:
      for (size_t i = 0; i < out.size(); ++i)
        out[i] = WidenBF16(static_cast<uint16_t>(raw[2 * i] | (raw[2 * i + 1] << 8)));
      break;
    case DType::kF16:
      for (size_t i = 0; i < out.size(); ++i)
        out[i] = WidenF16(static_cast<uint16_t>(raw[2 * i] | (raw[2 * i + 1] << 8)));
      break;
    default:
      break;
  }
  return Status::Ok();
}

}  // namespace daisy
