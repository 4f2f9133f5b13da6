// The per-shape backend choice: only among backends that passed their gates, the cache in
// DAISY_HOME (round trip, corrupt and stale files ignored), DAISY_KERNELS forcing one
// backend, and each product shape running on its own choice.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daisy/kernels.h"
#include "daisy/log.h"
#include "internal.h"

namespace daisy::kernels {
namespace {

constexpr Backend kAll[] = {Backend::kScalar, Backend::kAvx2, Backend::kAvx512Vnni, Backend::kNeon, Backend::kWasm};
constexpr ProductShape kShapes[] = {ProductShape::kGemv, ProductShape::kGemm, ProductShape::kAttention};

std::vector<Backend> Passing() {
  std::vector<Backend> out;
  for (const BackendStatus& s : BackendReport())
    if (s.supported && s.gate_passed) out.push_back(s.backend);
  return out;
}

std::optional<std::string> Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}
void Restore(const char* name, const std::optional<std::string>& v) {
  if (v)
    ::setenv(name, v->c_str(), 1);
  else
    ::unsetenv(name);
}

class LogLines {
 public:
  LogLines() {
    SetLogSink([this](LogLevel, std::string_view line) {
      std::lock_guard<std::mutex> lock(mu_);
      text_ += std::string(line) + "\n";
    });
  }
  ~LogLines() { SetLogSink(nullptr); }
  std::string Text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }

 private:
  std::mutex mu_;
  std::string text_;
};

// Each test gets its own DAISY_HOME and no DAISY_KERNELS; afterwards the environment, the
// start-up selection and the audit rate are restored.
class ChoiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_env_ = Env("DAISY_HOME");
    kernels_env_ = Env("DAISY_KERNELS");
    home_ = std::filesystem::temp_directory_path() / ("daisy_choice_test_" + std::to_string(::getpid()) + "_" +
                                                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(home_);
    std::filesystem::create_directories(home_);
    ::setenv("DAISY_HOME", home_.c_str(), 1);
    ::unsetenv("DAISY_KERNELS");
  }
  void TearDown() override {
    for (Backend b : kAll) internal::SetFaultInjection(b, false);
    Restore("DAISY_HOME", home_env_);
    Restore("DAISY_KERNELS", kernels_env_);
    internal::Reinitialize();
    SetAuditRate(1024, 1);
    std::filesystem::remove_all(home_);
  }
  std::string CachePath() const {
    const std::string path = internal::ChoiceCachePath();
    EXPECT_EQ(path.rfind(home_.string() + "/kernels-choice-", 0), 0u) << path;
    return path;
  }
  // Timings that make `fast` the fastest backend for every shape by far.
  static internal::ShapeTimings FastestIs(Backend fast) {
    internal::ShapeTimings t{};
    for (auto& row : t)
      for (Backend b : kAll) row[static_cast<size_t>(b)] = b == fast ? 1e-9 : 1.0;
    return t;
  }
  void WriteFile(const std::string& text) const { std::ofstream(CachePath(), std::ios::trunc) << text; }

  std::filesystem::path home_;
  std::optional<std::string> home_env_, kernels_env_;
};

template <Backend B>
void CorruptingEntry(const int8_t* xq, const float* xscale, int m, size_t ldx, const QMatrixView& w, float* y,
                     size_t ldy, int col_begin, int col_end) {
  internal::EntryFor(B)(xq, xscale, m, ldx, w, y, ldy, col_begin, col_end);
  if (m > 0 && col_begin < col_end) y[col_begin] = y[col_begin] + 1.0f;
}

MatMulQFn Corrupting(Backend b) {
  switch (b) {
    case Backend::kAvx2:
      return &CorruptingEntry<Backend::kAvx2>;
    case Backend::kAvx512Vnni:
      return &CorruptingEntry<Backend::kAvx512Vnni>;
    case Backend::kNeon:
      return &CorruptingEntry<Backend::kNeon>;
    case Backend::kWasm:
      return &CorruptingEntry<Backend::kWasm>;
    case Backend::kScalar:
      break;
  }
  return nullptr;
}

TEST_F(ChoiceTest, NeverChoosesABackendThatFailedItsGate) {
  int tested = 0;
  for (Backend b : Passing()) {
    if (b == Backend::kScalar) continue;
    ++tested;
    ASSERT_EQ(internal::WriteChoiceCache(CachePath(), FastestIs(b)), "");
    // Control: with its real entry the cached timings make it the choice for every shape.
    internal::Reinitialize();
    for (ProductShape s : kShapes) EXPECT_EQ(ActiveChoice().For(s), b) << ProductShapeName(s);
    EXPECT_EQ(ActiveChoice().source, "cache");
    // The same timings, but the unit is broken: it fails its gate and is never chosen.
    internal::BackendTable entries = internal::LiveEntries();
    entries[static_cast<size_t>(b)] = Corrupting(b);
    internal::Reinitialize(entries);
    ASSERT_FALSE(BackendReport()[static_cast<size_t>(b)].gate_passed) << BackendName(b);
    for (ProductShape s : kShapes) {
      EXPECT_NE(ActiveChoice().For(s), b) << ProductShapeName(s);
      const BackendStatus chosen = BackendReport()[static_cast<size_t>(ActiveChoice().For(s))];
      EXPECT_TRUE(chosen.supported && chosen.gate_passed) << BackendName(chosen.backend);
    }
    EXPECT_NE(ActiveBackend(), b);
  }
  if (tested == 0) GTEST_SKIP() << "no SIMD backend passes its gate on this CPU";
}

TEST_F(ChoiceTest, CacheRoundTripAndReuse) {
  const std::vector<Backend> passing = Passing();
  if (passing.size() < 2) GTEST_SKIP() << "only scalar here: nothing is measured";
  internal::ShapeTimings t{};
  for (size_t s = 0; s < t.size(); ++s)
    for (Backend b : passing)
      t[s][static_cast<size_t>(b)] = 0.001 * static_cast<double>(s + 1) + 1e-5 * static_cast<int>(b);
  ASSERT_EQ(internal::WriteChoiceCache(CachePath(), t), "");
  internal::ShapeTimings back{};
  ASSERT_EQ(internal::ReadChoiceCache(CachePath(), passing, &back), "");
  EXPECT_EQ(back, t);
  // A file that lacks a backend this process needs is not used.
  internal::ShapeTimings partial = t;
  for (auto& row : partial) row[static_cast<size_t>(passing.back())] = 0;
  ASSERT_EQ(internal::WriteChoiceCache(CachePath(), partial), "");
  EXPECT_NE(internal::ReadChoiceCache(CachePath(), passing, &back), "");

  // No file: measured, then written; the next start-up reads it.
  std::filesystem::remove(CachePath());
  internal::Reinitialize();
  EXPECT_EQ(ActiveChoice().source, "measured");
  ASSERT_TRUE(std::filesystem::exists(CachePath()));
  ASSERT_EQ(internal::ReadChoiceCache(CachePath(), passing, &back), "");
  internal::Reinitialize();
  EXPECT_EQ(ActiveChoice().source, "cache");
  // The choice is the fastest cached backend per shape.
  for (ProductShape s : kShapes) {
    Backend best = passing[0];
    for (Backend b : passing)
      if (back[static_cast<size_t>(s)][static_cast<size_t>(b)] <
          back[static_cast<size_t>(s)][static_cast<size_t>(best)])
        best = b;
    EXPECT_EQ(ActiveChoice().For(s), best) << ProductShapeName(s);
  }
}

TEST_F(ChoiceTest, CorruptOrStaleCacheIsIgnoredWithALogLine) {
  if (Passing().size() < 2) GTEST_SKIP() << "only scalar here: nothing is measured";
  const std::string cpu = internal::CpuModelKey();
  const struct {
    std::string text, why;
  } cases[] = {
      {"{\"format\": 1, \"kernel_ver", "not valid JSON"},
      {"[1, 2, 3]", "not valid JSON"},
      {"{\"format\": 1, \"kernel_version\": 0, \"cpu\": \"" + cpu + "\", \"seconds_per_product\": {}}",
       "another kernel version"},
      {"{\"format\": 1, \"kernel_version\": " + std::to_string(internal::kKernelVersion) +
           ", \"cpu\": \"some other cpu\", \"seconds_per_product\": {}}",
       "another CPU"},
      {"{\"format\": 1, \"kernel_version\": " + std::to_string(internal::kKernelVersion) + ", \"cpu\": \"" + cpu +
           "\", \"seconds_per_product\": {\"gemv\": {\"scalar\": \"fast\"}}}",
       "no valid timing"},
  };
  for (const auto& c : cases) {
    WriteFile(c.text);
    LogLines log;
    internal::Reinitialize();
    EXPECT_NE(log.Text().find("ignoring the cached backend timings in " + CachePath()), std::string::npos)
        << log.Text();
    EXPECT_NE(log.Text().find(c.why), std::string::npos) << log.Text();
    EXPECT_EQ(ActiveChoice().source, "measured") << c.text;
    // Rewritten with valid timings.
    internal::ShapeTimings back{};
    EXPECT_EQ(internal::ReadChoiceCache(CachePath(), Passing(), &back), "") << c.text;
  }
}

TEST_F(ChoiceTest, DaisyKernelsForcesEveryShape) {
  for (Backend fast : Passing()) {
    for (Backend b : Passing()) {
      // The cache says `fast` wins everywhere; DAISY_KERNELS still decides.
      ASSERT_EQ(internal::WriteChoiceCache(CachePath(), FastestIs(fast)), "");
      ::setenv("DAISY_KERNELS", std::string(BackendName(b)).c_str(), 1);
      internal::Reinitialize();
      for (ProductShape s : kShapes) EXPECT_EQ(ActiveChoice().For(s), b) << ProductShapeName(s);
      EXPECT_EQ(ActiveChoice().source, "DAISY_KERNELS");
      EXPECT_EQ(BackendChoiceSummary(), BackendName(b));
    }
  }
}

TEST_F(ChoiceTest, EachShapeRunsOnItsOwnBackend) {
  std::optional<Backend> simd;
  for (Backend b : Passing())
    if (b != Backend::kScalar) simd = b;
  if (!simd) GTEST_SKIP() << "no SIMD backend passes its gate on this CPU";
  SetAuditRate(0, 1);
  // attention on the SIMD unit, gemv and gemm on scalar (scalar fastest for those two)
  internal::ShapeTimings t = FastestIs(Backend::kScalar);
  t[static_cast<size_t>(ProductShape::kAttention)] = FastestIs(*simd)[0];
  ASSERT_EQ(internal::WriteChoiceCache(CachePath(), t), "");
  internal::Reinitialize();
  ASSERT_EQ(ActiveChoice().For(ProductShape::kAttention), *simd);
  ASSERT_EQ(ActiveChoice().For(ProductShape::kGemv), Backend::kScalar);
  EXPECT_EQ(BackendChoiceSummary(), "gemv:scalar gemm:scalar attention:" + std::string(BackendName(*simd)));
  // A fault injected into the SIMD unit shows only in the products routed to it.
  internal::SetFaultInjection(*simd, true);
  const int k = 40, n = 20;
  std::vector<int8_t> x(static_cast<size_t>(k), 3), w(static_cast<size_t>(n) * k, 5);
  const float xs = 0.5f;
  const QMatrixView v{w.data(), nullptr, nullptr, n, k, static_cast<size_t>(k)};
  std::vector<float> gemv(n), attention(n), want(n);
  for (int j = 0; j < n; ++j) want[static_cast<size_t>(j)] = scalar::Cell(x.data(), xs, v, j);
  MatMulQ(x.data(), &xs, 1, static_cast<size_t>(k), v, gemv.data(), static_cast<size_t>(n));
  MatMulQ(x.data(), &xs, 1, static_cast<size_t>(k), v, attention.data(), static_cast<size_t>(n),
          ProductShape::kAttention);
  EXPECT_EQ(0, std::memcmp(gemv.data(), want.data(), sizeof(float) * n));
  EXPECT_NE(0, std::memcmp(attention.data(), want.data(), sizeof(float) * n));
}

}  // namespace
}  // namespace daisy::kernels
