// Reading the float64 references' files in the tests (tests/reference/*.py writes them):
// whole files, float32 little-endian arrays, and the FNV-1a 64 hash that pins their bytes.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace daisy::reference_files {

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// FNV-1a 64 over the files in order, as the scripts compute it.
inline uint64_t Fnv1a64(const std::vector<std::string>& chunks) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const std::string& s : chunks)
    for (unsigned char c : s) {
      h ^= c;
      h *= 0x100000001b3ull;
    }
  return h;
}

// float32 little-endian values, whatever the host's byte order.
inline std::vector<float> ReadF32(const std::filesystem::path& path) {
  const std::string raw = ReadFile(path);
  std::vector<float> v(raw.size() / 4);
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t w = 0;
    for (int b = 0; b < 4; ++b) w |= static_cast<uint32_t>(static_cast<unsigned char>(raw[4 * i + b])) << (8 * b);
    std::memcpy(&v[i], &w, 4);
  }
  return v;
}

}  // namespace daisy::reference_files
