// Hub client tests against TestHub, a real HTTP server on 127.0.0.1 (no test reaches the
// internet: HF_ENDPOINT points at the test server and every test passes its endpoint).
#include "daisy/hub.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "daisy/log.h"
#include "test_hub.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;
using testing::TestHub;

constexpr uint64_t kModelSize = 3'000'000;

void WriteFile(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string Slice(const std::string& s, uint64_t offset, uint64_t length) {
  return s.substr(offset, length);
}

std::string AsString(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

class HubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/daisy_hub_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    root_ = tmp_ / "repos";
    cache_ = tmp_ / "cache";
    std::mt19937_64 rng(42);
    model_.resize(kModelSize);
    for (char& c : model_) c = static_cast<char>(rng());
    for (const char* repo : {"acme/tiny", "acme/gated"}) {
      WriteFile(root_ / repo / "config.json", std::string("{\"repo\": \"") + repo + "\"}");
      WriteFile(root_ / repo / "model.safetensors", model_);
    }
    WriteFile(root_ / "acme/tiny/empty.bin", "");
    // Nothing may fall back to the real Hub, a real token, a real cache, or a proxy.
    ::setenv("DAISY_CACHE_DIR", cache_.c_str(), 1);
    ::unsetenv("HF_TOKEN");
    ::setenv("HF_TOKEN_PATH", (tmp_ / "no-token-file").c_str(), 1);
    ::setenv("HF_HOME", (tmp_ / "hf_home").c_str(), 1);
    for (const char* v : {"http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"})
      ::unsetenv(v);
    auto hub = TestHub::Start(root_.string());
    ASSERT_TRUE(hub.ok()) << hub.status().ToString();
    hub_ = std::move(*hub);
    ::setenv("HF_ENDPOINT", hub_->endpoint().c_str(), 1);
  }

  void TearDown() override {
    SetLogSink(nullptr);
    SetLogLevel(LogLevel::kInfo);
    hub_.reset();
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }

  HubOptions Options() {
    HubOptions o;
    o.endpoint = hub_->endpoint();
    o.allow_token_prompt = false;
    o.initial_backoff_s = 0.01;  // fast retries
    o.max_attempts = 4;
    o.timeout_s = 10;
    return o;
  }

  std::unique_ptr<ModelSource> Open(const std::string& src, const HubOptions& o) {
    auto s = OpenModelSource(src, o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::vector<testing::TestHubRequest> RequestsFor(const std::string& file) {
    std::vector<testing::TestHubRequest> out;
    for (auto& r : hub_->requests())
      if (r.path.ends_with("/" + file)) out.push_back(r);
    return out;
  }

  fs::path tmp_, root_, cache_;
  std::string model_;
  std::unique_ptr<TestHub> hub_;
};

TEST(HubValidate, RepoIds) {
  for (const char* ok : {"acme/tiny", "HuggingFaceTB/SmolLM2-135M", "meta-llama/Llama-3.2-1B", "a/b", "a.b_c/d-e.f"})
    EXPECT_TRUE(ValidateRepoId(ok).ok()) << ok;
  const std::string long_part(97, 'a');
  for (const std::string& bad :
       {std::string("../x"),  std::string("a/b/c"),  std::string("a/b?x=1"), std::string("a%2Fb"), std::string("/b"),
        std::string("a/"),    std::string(""),       std::string("a"),       std::string("a//b"),  std::string(".a/b"),
        std::string("-a/b"),  std::string("a/.."),   std::string("a/b..c"),  std::string("a b/c"), std::string("a/b#c"),
        std::string("a/b\n"), std::string("a--b/c"), std::string("a/b."),    "a/" + long_part,     long_part + "/a"}) {
    Status st = ValidateRepoId(bad);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(ValidateRepoId("a/" + std::string(96, 'b')).ok());
}

TEST(HubValidate, Revisions) {
  for (const char* ok : {"main", "v1.0", "refs/pr/1", "0123456789abcdef0123456789abcdef01234567", "my_branch-2"})
    EXPECT_TRUE(ValidateRevision(ok).ok()) << ok;
  for (const std::string& bad :
       {std::string(""), std::string(".."), std::string("a/../b"), std::string("/main"), std::string("main/"),
        std::string("a//b"), std::string("a?b"), std::string("a%2Fb"), std::string(".hidden"), std::string("-x"),
        std::string(129, 'a'), std::string("a b"), std::string("a@b")})
    EXPECT_FALSE(ValidateRevision(bad).ok()) << bad;
}

TEST(HubValidate, ParseHubRef) {
  auto a = ParseHubRef("acme/tiny");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->repo, "acme/tiny");
  EXPECT_EQ(a->revision, "main");
  auto b = ParseHubRef("acme/tiny@refs/pr/3");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->revision, "refs/pr/3");
  EXPECT_FALSE(ParseHubRef("acme/tiny@").ok());
  EXPECT_FALSE(ParseHubRef("acme/tiny@a@b").ok());
  EXPECT_FALSE(ParseHubRef("@main").ok());
}

// Crafted ids and file names are refused before anything is sent.
TEST_F(HubTest, CraftedIdsAreRefusedBeforeAnyRequest) {
  for (const char* src : {"a/b/c", "a/b?x=1", "a%2Fb", "a/", "acme/tiny@../main", "acme/tiny@a?b", "acme/tiny@",
                          "acme//tiny", "acme/tiny#x"}) {
    auto s = OpenModelSource(src, Options());
    EXPECT_FALSE(s.ok()) << src;
    EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument) << src << ": " << s.status().ToString();
  }
  for (const char* local : {"../x", "/b", "./nope"}) EXPECT_FALSE(OpenModelSource(local, Options()).ok()) << local;
  for (const HubRef& ref : {HubRef{"../x", "main"}, HubRef{"acme/tiny", "../../etc"}, HubRef{"a/b/c", "main"},
                            HubRef{"acme/tiny", "main?x=1"}})
    EXPECT_FALSE(OpenHubRepo(ref, Options()).ok()) << ref.repo << "@" << ref.revision;
  auto src = Open("acme/tiny", Options());
  ASSERT_TRUE(src);
  for (const char* file : {"../tiny/config.json", "a/b", "", "..", "x\ny"}) {
    EXPECT_EQ(src->ReadFile(file).status().code(), ErrorCode::kInvalidArgument) << file;
    EXPECT_EQ(src->OpenFile(file).status().code(), ErrorCode::kInvalidArgument) << file;
  }
  EXPECT_EQ(hub_->request_count(), 0);
}

TEST_F(HubTest, LocalFolderNeedsNoServer) {
  auto src = Open((root_ / "acme/tiny").string(), Options());
  ASSERT_TRUE(src);
  EXPECT_EQ(src->Revision(), "local");
  auto cfg = src->ReadFile("config.json");
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(hub_->request_count(), 0);
}

TEST_F(HubTest, ReadsRangesStreamingAndLearnsSize) {
  HubOptions o = Options();
  o.use_cache = false;
  auto src = Open("acme/tiny", o);
  ASSERT_TRUE(src);
  auto file = src->OpenFile("model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto size = (*file)->Size();
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_EQ(*size, kModelSize);
  for (auto [off, len] : std::vector<std::pair<uint64_t, uint64_t>>{{0, 8}, {123457, 1000}, {kModelSize - 1, 1}}) {
    std::vector<uint8_t> buf(len);
    ASSERT_TRUE((*file)->ReadAt(off, buf).ok());
    EXPECT_EQ(AsString(buf), Slice(model_, off, len)) << off;
  }
  // A large range arrives in many small chunks: memory does not grow with the range.
  std::string got;
  size_t chunks = 0, biggest = 0;
  ASSERT_TRUE((*file)
                  ->ReadStream(5, 2'000'000,
                               [&](std::span<const uint8_t> c) {
                                 got.append(reinterpret_cast<const char*>(c.data()), c.size());
                                 ++chunks;
                                 biggest = std::max(biggest, c.size());
                                 return Status::Ok();
                               })
                  .ok());
  EXPECT_EQ(got, Slice(model_, 5, 2'000'000));
  EXPECT_GT(chunks, 10u);
  EXPECT_LE(biggest, 1u << 20);
  for (const auto& r : RequestsFor("model.safetensors")) {
    if (r.method == "HEAD") continue;
    EXPECT_EQ(r.status, 206);
    EXPECT_TRUE(r.range.starts_with("bytes=")) << r.range;
  }
  EXPECT_EQ(RequestsFor("model.safetensors").back().range, "bytes=5-2000004");
  // Past the end: refused locally once the size is known.
  int before = hub_->request_count();
  std::vector<uint8_t> tail(20);
  EXPECT_EQ((*file)->ReadAt(kModelSize - 10, tail).code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(hub_->request_count(), before);
}

TEST_F(HubTest, ReadPastEndOfUnknownSizeIsOutOfRange) {
  HubOptions o = Options();
  o.use_cache = false;
  auto src = Open("acme/tiny", o);
  auto file = src->OpenFile("model.safetensors");
  ASSERT_TRUE(file.ok());
  std::vector<uint8_t> tail(20);
  Status st = (*file)->ReadAt(kModelSize - 10, tail);
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange) << st.ToString();
  std::vector<uint8_t> beyond(4);
  EXPECT_EQ((*file)->ReadAt(kModelSize + 100, beyond).code(), ErrorCode::kOutOfRange);
}

TEST_F(HubTest, EmptyFileHasSizeZero) {
  auto src = Open("acme/tiny", Options());
  auto file = src->OpenFile("empty.bin");
  ASSERT_TRUE(file.ok());
  auto size = (*file)->Size();
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_EQ(*size, 0u);
}

TEST_F(HubTest, CutConnectionResumesWithoutRedelivering) {
  HubOptions o = Options();
  o.use_cache = false;
  auto src = Open("acme/tiny", o);
  auto file = src->OpenFile("model.safetensors");
  ASSERT_TRUE(file.ok());
  hub_->CutNextResponseAfter(100'000);
  std::string got;
  Status st = (*file)->ReadStream(1000, 1'500'000, [&](std::span<const uint8_t> c) {
    got.append(reinterpret_cast<const char*>(c.data()), c.size());
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(got.size(), 1'500'000u);  // no byte twice
  EXPECT_EQ(got, Slice(model_, 1000, 1'500'000));
  auto reqs = RequestsFor("model.safetensors");
  ASSERT_GE(reqs.size(), 2u);
  EXPECT_EQ(reqs[reqs.size() - 2].range, "bytes=1000-1500999");
  EXPECT_EQ(reqs.back().range, "bytes=101000-1500999");  // resumed where the cut left it
}

TEST_F(HubTest, CutConnectionOnTheRedirectHostResumes) {
  hub_->SetRedirectAbove(1 << 20);
  HubOptions o = Options();
  o.use_cache = false;
  auto src = Open("acme/tiny", o);
  auto file = src->OpenFile("model.safetensors");
  ASSERT_TRUE(file.ok());
  hub_->CutNextResponseAfter(4096);
  std::vector<uint8_t> buf(500'000);
  Status st = (*file)->ReadAt(77, buf);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(AsString(buf), Slice(model_, 77, 500'000));
  auto reqs = hub_->requests();
  ASSERT_GE(reqs.size(), 2u);
  EXPECT_EQ(reqs.back().server, "cdn");
  EXPECT_EQ(reqs.back().range, "bytes=4173-500076");
}

TEST_F(HubTest, StalledTransferTimesOutAndResumes) {
  HubOptions o = Options();
  o.use_cache = false;
  o.timeout_s = 1;  // no byte for a second: give up on this try
  auto src = Open("acme/tiny", o);
  auto file = src->OpenFile("model.safetensors");
  ASSERT_TRUE(file.ok());
  hub_->StallNextResponseAfter(50'000, 5000);
  std::vector<uint8_t> buf(400'000);
  Status st = (*file)->ReadAt(0, buf);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(AsString(buf), Slice(model_, 0, 400'000));
  EXPECT_EQ(RequestsFor("model.safetensors").back().range, "bytes=50000-399999");
}

// One source, several threads: shared pinning, connection pool and cache.
TEST_F(HubTest, ConcurrentReadsFromOneSource) {
  auto src = Open("acme/tiny", Options());
  auto file = src->OpenFile("model.safetensors");
  ASSERT_TRUE(file.ok());
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        uint64_t off = static_cast<uint64_t>(t) * 700'000 + static_cast<uint64_t>(i) * 30'000;
        std::vector<uint8_t> buf(20'000 + static_cast<size_t>(i));
        if (!(*file)->ReadAt(off, buf).ok() || AsString(buf) != Slice(model_, off, buf.size())) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_F(HubTest, ServerIgnoringRangesIsRefused) {
  HubOptions o = Options();
  o.use_cache = false;
  auto src = Open("acme/tiny", o);
  auto file = src->OpenFile("model.safetensors");
  ASSERT_TRUE(file.ok());
  hub_->SetIgnoreRanges(true);
  size_t delivered = 0;
  Status st = (*file)->ReadStream(10, 100, [&](std::span<const uint8_t> c) {
    delivered += c.size();
    return Status::Ok();
  });
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("the server ignored the byte range"), std::string::npos) << st.ToString();
  EXPECT_EQ(delivered, 0u);
  auto reqs = RequestsFor("model.safetensors");
  EXPECT_EQ(reqs.back().status, 200);
  EXPECT_EQ(std::count_if(reqs.begin(), reqs.end(), [](auto& r) { return r.method == "GET"; }), 1);  // no retry
}

TEST_F(HubTest, TransientFailuresAreRetriedThenGivenUp) {
  auto src = Open("acme/tiny", Options());
  hub_->FailNextRequests(2, 503);
  auto cfg = src->ReadFile("config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(*cfg, "{\"repo\": \"acme/tiny\"}");
  auto reqs = hub_->requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].status, 503);
  EXPECT_EQ(reqs[1].status, 503);
  EXPECT_EQ(reqs[2].status, 200);

  HubOptions o = Options();
  o.max_attempts = 3;
  auto src2 = Open("acme/tiny", o);
  hub_->ResetCounters();
  hub_->FailNextRequests(100, 502);
  auto failed = src2->ReadFile("config.json");
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), ErrorCode::kUnavailable);
  EXPECT_NE(failed.status().message().find("HTTP 502"), std::string::npos) << failed.status().ToString();
  EXPECT_NE(failed.status().message().find("gave up after 3 tries"), std::string::npos);
  EXPECT_EQ(hub_->request_count(), 3);
}

TEST_F(HubTest, GatedRepoWithoutTokenSaysAcceptTheLicence) {
  hub_->Gate("acme/gated");
  hub_->SetToken("hf_validtoken123");
  auto src = Open("acme/gated", Options());
  auto cfg = src->ReadFile("config.json");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), ErrorCode::kUnauthenticated);
  const std::string& m = cfg.status().message();
  EXPECT_NE(m.find("gated"), std::string::npos) << m;
  EXPECT_NE(m.find("HF_TOKEN"), std::string::npos) << m;
  EXPECT_NE(m.find("accept the licence on the model page first"), std::string::npos) << m;
  EXPECT_EQ(hub_->request_count(), 1);  // not retried, no prompt (not a terminal)
}

TEST_F(HubTest, WrongTokenIsPermissionDenied) {
  hub_->Gate("acme/gated");
  hub_->SetToken("hf_validtoken123");
  HubOptions o = Options();
  o.token = "hf_wrongtoken456";
  auto src = Open("acme/gated", o);
  auto cfg = src->ReadFile("config.json");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), ErrorCode::kPermissionDenied);
  EXPECT_NE(cfg.status().message().find("the token has no access to acme/gated"), std::string::npos)
      << cfg.status().ToString();
  EXPECT_EQ(cfg.status().message().find("hf_wrongtoken456"), std::string::npos);
}

TEST_F(HubTest, NotFoundSaysWhatIsMissing) {
  auto repo = Open("acme/missing", Options())->ReadFile("config.json");
  EXPECT_EQ(repo.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(repo.status().message().find("repo acme/missing not found"), std::string::npos) << repo.status().ToString();

  auto rev = Open("acme/tiny@nope", Options())->ReadFile("config.json");
  EXPECT_EQ(rev.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(rev.status().message().find("revision 'nope' not found in acme/tiny"), std::string::npos)
      << rev.status().ToString();

  auto src = Open("acme/tiny", Options());
  auto file = src->ReadFile("missing.json");
  EXPECT_EQ(file.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(file.status().message().find("file 'missing.json' not found"), std::string::npos)
      << file.status().ToString();
  auto missing = src->OpenFile("missing.bin");  // pinned already: opening sends nothing
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ((*missing)->Size().status().code(), ErrorCode::kNotFound);
}

TEST_F(HubTest, TokenNeverLeaksToLogsMessagesOrTheRedirectHost) {
  const std::string token = "hf_SECRETtoken1234567";
  std::vector<std::string> lines;
  SetLogLevel(LogLevel::kDebug);
  SetLogSink([&](LogLevel, std::string_view line) { lines.emplace_back(line); });
  hub_->Gate("acme/gated");
  hub_->SetToken(token);
  hub_->SetRedirectAbove(1 << 20);  // model.safetensors goes to the CDN server
  HubOptions o = Options();
  o.token = token;
  o.use_cache = false;
  auto src = Open("acme/gated", o);
  ASSERT_TRUE(src->ReadFile("config.json").ok());
  auto file = src->OpenFile("model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  hub_->FailNextRequests(1, 503);  // a retry, so warnings are logged too
  std::vector<uint8_t> buf(300'000);
  ASSERT_TRUE((*file)->ReadAt(1234, buf).ok());
  EXPECT_EQ(AsString(buf), Slice(model_, 1234, 300'000));

  bool saw_cdn = false;
  for (const auto& r : hub_->requests()) {
    if (r.server == "hub") {
      EXPECT_TRUE(r.had_auth) << r.path;
    }
    if (r.server == "cdn") {
      saw_cdn = true;
      EXPECT_FALSE(r.had_auth) << r.path;
    }
  }
  EXPECT_TRUE(saw_cdn);
  EXPECT_FALSE(hub_->cdn_saw_authorization());

  // A wrong token fails, and neither token appears in the message.
  HubOptions bad = o;
  bad.token = "hf_OTHERtoken7654321";
  auto refused = Open("acme/gated", bad)->ReadFile("config.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().ToString().find(token), std::string::npos);
  EXPECT_EQ(refused.status().ToString().find(*bad.token), std::string::npos);
  EXPECT_FALSE(lines.empty());
  for (const auto& line : lines) {
    EXPECT_EQ(line.find(token), std::string::npos) << line;
    EXPECT_EQ(line.find(*bad.token), std::string::npos) << line;
  }
  EXPECT_EQ(Redact("x " + token), "x [redacted]");  // registered as a secret when read
}

TEST_F(HubTest, RevisionIsPinnedByTheFirstRequest) {
  const std::string commit = TestHub::CommitFor("acme/tiny");
  auto src = Open("acme/tiny", Options());
  EXPECT_EQ(hub_->request_count(), 0);  // opening is free
  ASSERT_TRUE(src->ReadFile("config.json").ok());
  EXPECT_EQ(src->Revision(), commit);
  EXPECT_EQ(src->Describe(), "acme/tiny@" + commit);
  EXPECT_EQ(src->ModelId(), "acme/tiny");
  auto file = src->OpenFile("model.safetensors");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->name(), "acme/tiny@" + commit + "/model.safetensors");
  std::vector<uint8_t> buf(1000);
  ASSERT_TRUE((*file)->ReadAt(500, buf).ok());
  ASSERT_TRUE(src->ReadFile("empty.bin").ok());
  auto reqs = hub_->requests();
  ASSERT_GE(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].path, "/acme/tiny/resolve/main/config.json");
  for (size_t i = 1; i < reqs.size(); ++i)
    EXPECT_TRUE(reqs[i].path.starts_with("/acme/tiny/resolve/" + commit + "/")) << reqs[i].path;
}

TEST_F(HubTest, RevisionPinsWithOneRequestWhenNothingWasRead) {
  auto src = Open("acme/tiny", Options());
  EXPECT_EQ(src->Revision(), TestHub::CommitFor("acme/tiny"));
  ASSERT_EQ(hub_->request_count(), 1);
  EXPECT_EQ(hub_->requests()[0].method, "HEAD");
}

// One "run" of a stage: config, then the header and a slice of the weights.
std::string LoadSlice(ModelSource& src, const std::string& model) {
  auto cfg = src.ReadFile("config.json");
  EXPECT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto file = src.OpenFile("model.safetensors");
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  if (!file.ok()) return "";
  auto size = (*file)->Size();
  EXPECT_TRUE(size.ok());
  EXPECT_EQ(*size, model.size());
  std::vector<uint8_t> head(8), slice(1'200'000);
  EXPECT_TRUE((*file)->ReadAt(0, head).ok());
  EXPECT_TRUE((*file)->ReadAt(700'000, slice).ok());
  return AsString(head) + AsString(slice);
}

TEST_F(HubTest, SecondRunIsServedFromTheCache) {
  const std::string expect = Slice(model_, 0, 8) + Slice(model_, 700'000, 1'200'000);
  {
    auto src = Open("acme/tiny", Options());
    EXPECT_EQ(LoadSlice(*src, model_), expect);
  }
  EXPECT_FALSE(RequestsFor("model.safetensors").empty());
  hub_->ResetCounters();
  {
    auto src = Open("acme/tiny", Options());
    EXPECT_EQ(LoadSlice(*src, model_), expect);
  }
  // "main" needs one request to learn the commit (config.json); no weight request at all.
  EXPECT_EQ(hub_->request_count(), 1);
  EXPECT_LT(hub_->body_bytes_sent(), 100u);
  EXPECT_TRUE(RequestsFor("model.safetensors").empty());
  hub_->ResetCounters();
  {
    auto src = Open("acme/tiny@" + TestHub::CommitFor("acme/tiny"), Options());
    EXPECT_EQ(LoadSlice(*src, model_), expect);
  }
  EXPECT_EQ(hub_->request_count(), 0);  // pinned by the user: nothing to ask
}

TEST_F(HubTest, CorruptOrShortCacheEntriesAreRefetched) {
  const std::string expect = Slice(model_, 0, 8) + Slice(model_, 700'000, 1'200'000);
  {
    auto src = Open("acme/tiny", Options());
    EXPECT_EQ(LoadSlice(*src, model_), expect);
  }
  std::vector<fs::path> entries;
  for (auto& e : fs::recursive_directory_iterator(cache_))
    if (e.path().filename().string().starts_with("range-")) entries.push_back(e.path());
  ASSERT_EQ(entries.size(), 2u);
  for (auto& p : entries) {
    if (fs::file_size(p) > 1000) {  // the big slice: flip one payload byte
      int fd = ::open(p.c_str(), O_RDWR);
      ASSERT_GE(fd, 0);
      char c;
      ASSERT_EQ(::pread(fd, &c, 1, 5000), 1);
      c = static_cast<char>(c ^ 0x5a);
      ASSERT_EQ(::pwrite(fd, &c, 1, 5000), 1);
      ::close(fd);
    } else {
      fs::resize_file(p, 3);  // the header: short
    }
  }
  hub_->ResetCounters();
  {
    auto src = Open("acme/tiny", Options());
    EXPECT_EQ(LoadSlice(*src, model_), expect);
  }
  EXPECT_EQ(RequestsFor("model.safetensors").size(), 2u);  // both refetched
  hub_->ResetCounters();
  {
    auto src = Open("acme/tiny", Options());
    EXPECT_EQ(LoadSlice(*src, model_), expect);
  }
  EXPECT_TRUE(RequestsFor("model.safetensors").empty());  // and cached again
}

TEST_F(HubTest, NoCacheOptionFetchesEveryTime) {
  HubOptions o = Options();
  o.use_cache = false;
  for (int run = 0; run < 2; ++run) {
    hub_->ResetCounters();
    auto src = Open("acme/tiny", o);
    LoadSlice(*src, model_);
    EXPECT_GE(RequestsFor("model.safetensors").size(), 2u) << run;
  }
  EXPECT_FALSE(fs::exists(cache_));
}

TEST_F(HubTest, TokenComesFromEnvironmentOrTokenFile) {
  const std::string token = "hf_fromtheenvironment1";
  hub_->Gate("acme/gated");
  hub_->SetToken(token);
  HubOptions o = Options();
  o.use_cache = false;

  ::setenv("HF_TOKEN", token.c_str(), 1);
  auto env = Open("acme/gated", o)->ReadFile("config.json");
  EXPECT_TRUE(env.ok()) << env.status().ToString();
  ::unsetenv("HF_TOKEN");

  WriteFile(tmp_ / "token-file", token + "\n");  // huggingface-cli writes a trailing newline
  ::setenv("HF_TOKEN_PATH", (tmp_ / "token-file").c_str(), 1);
  auto file = Open("acme/gated", o)->ReadFile("config.json");
  EXPECT_TRUE(file.ok()) << file.status().ToString();

  ::unsetenv("HF_TOKEN_PATH");
  WriteFile(tmp_ / "hf_home" / "token", token);
  auto home = Open("acme/gated", o)->ReadFile("config.json");
  EXPECT_TRUE(home.ok()) << home.status().ToString();

  fs::remove(tmp_ / "hf_home" / "token");
  auto none = Open("acme/gated", o)->ReadFile("config.json");
  EXPECT_EQ(none.status().code(), ErrorCode::kUnauthenticated);
  for (const auto& r : hub_->requests()) EXPECT_EQ(r.status == 200, r.had_auth) << r.path;
  EXPECT_EQ(Redact(token), "[redacted]");
}

// The prompt: only on a terminal, only after a 401, and without echo. A child process gets
// a pseudo-terminal as stdin/stderr; the parent types the token.
TEST_F(HubTest, TokenPromptOnTerminalAfter401WithoutEcho) {
  const std::string token = "hf_typedatprompt99";
  hub_->Gate("acme/gated");
  hub_->SetToken(token);
  int master = -1, slave = -1;
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, nullptr), 0);
  HubOptions o = Options();
  o.allow_token_prompt = true;
  o.use_cache = false;
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(master);
    ::dup2(slave, STDIN_FILENO);
    ::dup2(slave, STDERR_FILENO);
    auto src = OpenModelSource("acme/gated", o);
    bool ok = src.ok() && (*src)->ReadFile("config.json").ok();
    ::_exit(ok ? 0 : 1);
  }
  ::close(slave);
  std::string seen;
  bool typed = false;
  char buf[256];
  while (true) {
    ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;  // EIO once the child exits
    seen.append(buf, static_cast<size_t>(n));
    if (!typed && seen.find("input hidden") != std::string::npos) {
      std::string line = token + "\n";
      ASSERT_EQ(::write(master, line.data(), line.size()), static_cast<ssize_t>(line.size()));
      typed = true;
    }
  }
  ::close(master);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << seen;
  EXPECT_TRUE(typed) << seen;
  EXPECT_NE(seen.find("accept the licence"), std::string::npos) << seen;  // says why it asks
  EXPECT_EQ(seen.find(token), std::string::npos) << "echoed: " << seen;
  auto reqs = hub_->requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].status, 401);
  EXPECT_FALSE(reqs[0].had_auth);
  EXPECT_EQ(reqs[1].status, 200);
  EXPECT_TRUE(reqs[1].had_auth);
}

TEST_F(HubTest, NoPromptWhenStdinIsNotATerminal) {
  hub_->Gate("acme/gated");
  hub_->SetToken("hf_validtoken123");
  HubOptions o = Options();
  o.allow_token_prompt = true;
  int saved = ::dup(STDIN_FILENO);
  int null = ::open("/dev/null", O_RDONLY);
  ::dup2(null, STDIN_FILENO);
  auto cfg = Open("acme/gated", o)->ReadFile("config.json");
  ::dup2(saved, STDIN_FILENO);
  ::close(null);
  ::close(saved);
  EXPECT_EQ(cfg.status().code(), ErrorCode::kUnauthenticated);
  EXPECT_EQ(hub_->request_count(), 1);
}

TEST_F(HubTest, RelativeRedirectIsFollowed) {
  hub_->AddRename("old-owner/tiny", "acme/tiny");
  auto src = Open("old-owner/tiny", Options());
  auto cfg = src->ReadFile("config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(*cfg, "{\"repo\": \"acme/tiny\"}");
  auto reqs = hub_->requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].status, 307);
  EXPECT_EQ(reqs[1].path, "/acme/tiny/resolve/main/config.json");
}

TEST_F(HubTest, RedirectLoopIsCapped) {
  hub_->AddRename("loop/a", "loop/b");
  hub_->AddRename("loop/b", "loop/a");
  auto cfg = Open("loop/a", Options())->ReadFile("config.json");
  ASSERT_FALSE(cfg.ok());
  EXPECT_NE(cfg.status().message().find("redirects"), std::string::npos) << cfg.status().ToString();
  EXPECT_EQ(hub_->request_count(), 11);  // the first request and 10 redirects, no retries
}

TEST_F(HubTest, ProgressIsReported) {
  std::vector<TransferProgress> seen;
  HubOptions o = Options();
  o.use_cache = false;
  o.progress = [&](const TransferProgress& p) { seen.push_back(p); };
  auto src = Open("acme/tiny", o);
  auto file = src->OpenFile("model.safetensors");
  ASSERT_TRUE(file.ok());
  std::vector<uint8_t> buf(2'000'000);
  ASSERT_TRUE((*file)->ReadAt(0, buf).ok());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().bytes_done, 2'000'000u);
  EXPECT_EQ(seen.back().bytes_total, 2'000'000u);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i].bytes_done, seen[i - 1].bytes_done);
}

TEST(HubProgressBar, EmptyWhenStderrIsNotATerminal) {
  int saved = ::dup(STDERR_FILENO);
  int null = ::open("/dev/null", O_WRONLY);
  ASSERT_GE(null, 0);
  ::dup2(null, STDERR_FILENO);
  ProgressFn bar = TerminalProgressBar("download");
  ::dup2(saved, STDERR_FILENO);
  ::close(null);
  ::close(saved);
  EXPECT_FALSE(bar);
}

// tools/testhub: the same server as a process, for multi-process tests.
TEST_F(HubTest, TesthubToolServesGatedRepoAndStopsOnSigterm) {
  const std::string token = "hf_toolprocesstoken1";
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<std::string> args = {DAISY_TESTHUB_BIN, "--root", root_.string(),     "--gate", "acme/gated",
                                   "--token",         token,    "--redirect-above", "1000000"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(::posix_spawn(&pid, DAISY_TESTHUB_BIN, &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  std::string line;
  char c;
  while (::read(out[0], &c, 1) == 1 && c != '\n') line += c;
  ::close(out[0]);
  ASSERT_FALSE(line.empty());
  HubOptions o = Options();
  o.endpoint = "http://127.0.0.1:" + line;
  o.use_cache = false;
  EXPECT_EQ(Open("acme/gated", o)->ReadFile("config.json").status().code(), ErrorCode::kUnauthenticated);
  o.token = token;
  auto src = Open("acme/gated", o);
  auto cfg = src->ReadFile("config.json");
  EXPECT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto file = src->OpenFile("model.safetensors");  // redirected to the tool's second server
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::vector<uint8_t> buf(100'000);
  ASSERT_TRUE((*file)->ReadAt(2'500'000, buf).ok());
  EXPECT_EQ(AsString(buf), Slice(model_, 2'500'000, 100'000));
  src.reset();
  file->reset();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
}

TEST_F(HubTest, EndpointComesFromHfEndpoint) {
  ::setenv("HF_ENDPOINT", (hub_->endpoint() + "/").c_str(), 1);  // a trailing slash is fine
  HubOptions o = Options();
  o.endpoint.clear();
  auto cfg = Open("acme/tiny", o)->ReadFile("config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(hub_->requests()[0].path, "/acme/tiny/resolve/main/config.json");
  ::setenv("HF_ENDPOINT", "ftp://example.invalid", 1);
  EXPECT_EQ(OpenModelSource("acme/tiny", o).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace daisy
