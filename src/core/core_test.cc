#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "daisy/log.h"
#include "daisy/source.h"
#include "daisy/status.h"

namespace daisy {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  DAISY_ASSIGN_OR_RETURN(int h, Half(x));
  DAISY_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(Status, ResultPropagatesTheFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "odd: 3");
  EXPECT_EQ(r.status().WithContext("quarter").message(), "quarter: odd: 3");
}

TEST(Log, SecretsAreRedactedFromEveryLine) {
  std::vector<std::string> lines;
  SetLogSink([&](LogLevel, std::string_view l) { lines.emplace_back(l); });
  RegisterSecret("hf_abcdefSECRET");
  LogError("token hf_abcdefSECRET rejected, hf_abcdefSECRET again");
  SetLogSink(nullptr);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "token [redacted] rejected, [redacted] again");
  EXPECT_EQ(Redact("xhf_abcdefSECRETx"), "x[redacted]x");
}

TEST(LocalSource, ReadsRangesAndRefusesPastTheEnd) {
  auto dir = std::filesystem::temp_directory_path() / "daisy_core_test";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "a.bin", std::ios::binary);
    for (int i = 0; i < 1000; ++i) f.put(static_cast<char>(i & 0xff));
  }
  auto folder = OpenLocalFolder(dir.string());
  ASSERT_TRUE(folder.ok());
  auto file = (*folder)->OpenFile("a.bin");
  ASSERT_TRUE(file.ok()) << file.status().message();
  std::vector<uint8_t> buf(10);
  ASSERT_TRUE((*file)->ReadAt(300, buf).ok());
  EXPECT_EQ(buf[0], 300 & 0xff);
  EXPECT_EQ(buf[9], 309 & 0xff);
  Status past = (*file)->ReadAt(995, buf);
  EXPECT_EQ(past.code(), ErrorCode::kOutOfRange);
  EXPECT_NE(past.message().find("a.bin"), std::string::npos);
  EXPECT_FALSE((*folder)->OpenFile("../etc/passwd").ok());
  EXPECT_EQ((*folder)->OpenFile("missing.bin").status().code(), ErrorCode::kNotFound);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace daisy
