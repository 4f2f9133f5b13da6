#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <vector>

#include "daisy/log.h"
#include "daisy/memory.h"
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

// Issue 11, item 10: a FIFO named like a model file used to block open() forever. Each
// read runs on its own thread with a bound; on a hang the FIFO is opened for writing to
// release the reader, and the test fails.
TEST(LocalSource, AFifoNamedLikeAModelFileIsRefusedAtOnce) {
  char tmpl[] = "/tmp/daisy_core_fifo_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::filesystem::path dir = tmpl;
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json"}) {
    const std::string path = (dir / name).string();
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
    auto folder = OpenLocalFolder(dir.string());
    ASSERT_TRUE(folder.ok());
    auto read = std::async(std::launch::async, [&] { return (*folder)->ReadFile(name).status(); });
    if (read.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      int w = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);  // lets the blocked open return
      read.wait();
      if (w >= 0) ::close(w);
      ADD_FAILURE() << name << ": opening a FIFO blocked";
    }
    Status st = read.get();
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.message();
    EXPECT_NE(st.message().find(path + " is a named pipe (FIFO), not a regular file"), std::string::npos)
        << st.message();
    std::filesystem::remove(path);
  }
  // Directories stay refused the same way.
  std::filesystem::create_directory(dir / "config.json");
  auto folder = OpenLocalFolder(dir.string());
  ASSERT_TRUE(folder.ok());
  Status st = (*folder)->ReadFile("config.json").status();
  EXPECT_NE(st.message().find("not a regular file"), std::string::npos) << st.message();
  std::filesystem::remove_all(dir);
}

TEST(Memory, SizesAsPeopleWriteThem) {
  EXPECT_EQ(*ParseMemorySize("512M"), 512ull << 20);
  EXPECT_EQ(*ParseMemorySize("4G"), 4ull << 30);
  EXPECT_EQ(*ParseMemorySize("4g"), 4ull << 30);
  EXPECT_EQ(*ParseMemorySize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseMemorySize("3500MB"), 3500000000ull);
  EXPECT_EQ(*ParseMemorySize("2 GB"), 2000000000ull);
  EXPECT_EQ(*ParseMemorySize("4096"), 4096ull);
  EXPECT_EQ(*ParseMemorySize("64KiB"), 65536ull);
  for (const char* bad : {"", "G", "-4G", "4X", "1.2.3G", "0", "0.1", "4 G B", "99999999T", "abc"}) {
    auto r = ParseMemorySize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(std::string(1, 0x27) + bad + std::string(1, 0x27)), std::string::npos)
        << r.status().message();
  }
  EXPECT_EQ(FormatBytes(3ull << 29), "1.50 GiB");
  EXPECT_EQ(FormatBytes(512ull << 20), "512.0 MiB");
}

TEST(Memory, PeakRssSeesAnAllocationAndCanStartOver) {
  if (PeakRssBytes() == 0) GTEST_SKIP() << "no /proc/self/status";
  const uint64_t before = PeakRssBytes();
  {
    std::vector<char> big(256u << 20, 1);  // touched: resident
    EXPECT_GE(PeakRssBytes(), before + (200ull << 20));
    EXPECT_EQ(big[12345], 1);
  }
  if (!ResetPeakRss()) GTEST_SKIP() << "clear_refs not writable";
  EXPECT_LT(PeakRssBytes(), before + (200ull << 20));
  EXPECT_GT(AvailableMemoryBytes(), 0u);
}

}  // namespace
}  // namespace daisy
