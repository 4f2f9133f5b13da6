#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
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

// Large-page memory (memory.h): blocks of every size class are aligned, writable and apart;
// the regions are returned when their last block is freed; a freed block's pages leave at
// once while its region lives on; and the regions carry the large-page advice.
TEST(LargePages, BlocksAreAlignedApartAndRegionsAreReturned) {
  const LargePageStats before = GetLargePageStats();
  // Below 64 KiB (operator new), shared regions (a 64 MiB region fills and a second one
  // opens), and a region of its own (above 32 MiB).
  const std::vector<size_t> sizes = {100,       4096,      65536,     65537,           (1u << 20) + 3, 7u << 20,
                                     30u << 20, 30u << 20, 17u << 20, (40u << 20) + 1, 65536};
  std::vector<std::pair<unsigned char*, size_t>> blocks;
  for (size_t n : sizes) {
    auto* p = static_cast<unsigned char*>(AllocateLargePages(n));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << n;
    std::memset(p, static_cast<int>(blocks.size() + 1), n);
    blocks.emplace_back(p, n);
  }
  // Every byte of every block still holds the block's own value: none overlaps another.
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto [p, n] = blocks[i];
    EXPECT_EQ(std::count(p, p + n, static_cast<unsigned char>(i + 1)), static_cast<std::ptrdiff_t>(n)) << "block " << i;
  }
#if defined(__linux__)
  const LargePageStats during = GetLargePageStats();
  EXPECT_EQ(during.live_blocks, before.live_blocks + 9);  // all but the two small ones
  EXPECT_GE(during.regions, before.regions + 3);          // two shared, one of its own
#endif
  for (auto& [p, n] : blocks) FreeLargePages(p, n);
  const LargePageStats after = GetLargePageStats();
  EXPECT_EQ(after.regions, before.regions);
  EXPECT_EQ(after.live_blocks, before.live_blocks);
  EXPECT_EQ(after.region_bytes, before.region_bytes);
#if defined(__linux__)
  // And they are gone from the address space, not just from the count (mincore: ENOMEM).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t i : {size_t{3}, size_t{6}, size_t{7}, size_t{9}}) {  // both shared regions, one of its own
    const uintptr_t at = reinterpret_cast<uintptr_t>(blocks[i].first) / page * page;
    unsigned char v = 0;
    errno = 0;
    EXPECT_EQ(mincore(reinterpret_cast<void*>(at), page, &v), -1)
        << "block " << i;  // NOLINT(performance-no-int-to-ptr)
    EXPECT_EQ(errno, ENOMEM) << "block " << i;
  }
#endif
}

#if defined(__linux__)
// Whether each page of [p, p + bytes) is resident (mincore).
std::vector<bool> Resident(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t from = reinterpret_cast<uintptr_t>(p) / page * page;
  const size_t pages = (reinterpret_cast<uintptr_t>(p) + bytes - from + page - 1) / page;
  std::vector<unsigned char> v(pages);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(from), pages * page, v.data()), 0);  // NOLINT(performance-no-int-to-ptr)
  std::vector<bool> out;
  for (unsigned char c : v) out.push_back((c & 1) != 0);
  return out;
}

TEST(LargePages, AFreedBlockLeavesMemoryWhileItsRegionLivesOn) {
  const size_t n = size_t{4} << 20;
  auto* a = static_cast<unsigned char*>(AllocateLargePages(n));
  auto* b = static_cast<unsigned char*>(AllocateLargePages(n));
  std::memset(a, 1, n);
  std::memset(b, 2, n);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // a's whole pages: those that hold no byte of a neighbour.
  unsigned char* inner = a + (page - reinterpret_cast<uintptr_t>(a) % page) % page;
  const size_t inner_bytes = (a + n - inner) / page * page - page;
  for (bool r : Resident(inner, inner_bytes)) ASSERT_TRUE(r);
  FreeLargePages(a, n);
  size_t still = 0;
  for (bool r : Resident(inner, inner_bytes)) still += r ? 1 : 0;
  EXPECT_EQ(still, 0u) << "of " << inner_bytes / page << " pages";
  for (bool r : Resident(b, n)) ASSERT_TRUE(r);
  EXPECT_EQ(b[0], 2);
  EXPECT_EQ(b[n - 1], 2);
  FreeLargePages(b, n);
}

// The region holding a block carries the large-page advice: THPeligible in its
// /proc/self/smaps entry, which the kernel reports wherever THP is not switched off.
TEST(LargePages, RegionsCarryTheLargePageAdvice) {
  std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(mode, line) || line.find("[never]") != std::string::npos)
    GTEST_SKIP() << "transparent huge pages are off on this kernel: the advice has nothing to act on";
  const size_t n = size_t{3} << 20;
  auto* p = static_cast<unsigned char*>(AllocateLargePages(n));
  std::memset(p, 1, n);
  auto eligible_at = [](const void* at) {
    std::ifstream smaps("/proc/self/smaps");
    std::string l;
    bool inside = false;
    const auto a = reinterpret_cast<uintptr_t>(at);
    while (std::getline(smaps, l)) {
      unsigned long long lo = 0, hi = 0;
      if (std::sscanf(l.c_str(), "%llx-%llx ", &lo, &hi) == 2 && l.find(':') > l.find(' ')) {
        inside = a >= lo && a < hi;
        continue;
      }
      if (inside && l.rfind("THPeligible:", 0) == 0) return l.find('1') != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(eligible_at(p));
  std::vector<char> plain(n, 1);  // operator new's memory: not advised
  if (line.find("[madvise]") != std::string::npos) {
    EXPECT_FALSE(eligible_at(plain.data()));
  }
  FreeLargePages(p, n);
}
#endif

}  // namespace
}  // namespace daisy
