#include "test_hub.h"

#include <fcntl.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <thread>

namespace daisy::testing {
namespace {

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

std::string Encode(std::string_view s) {
  constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

// Parses a single "bytes=a-b", "bytes=a-" or "bytes=-n" against `size`. Returns false when
// the header is not one range; sets *unsatisfiable when it starts past the end.
bool ParseRange(const std::string& h, uint64_t size, uint64_t* first, uint64_t* last, bool* unsatisfiable) {
  static const std::regex kRange(R"(bytes=(\d*)-(\d*))");
  std::smatch m;
  if (!std::regex_match(h, m, kRange) || (m[1].length() == 0 && m[2].length() == 0)) return false;
  *unsatisfiable = false;
  if (m[1].length() == 0) {  // suffix: the last n bytes
    uint64_t n = std::stoull(m[2].str());
    if (n == 0 || size == 0) return *unsatisfiable = true;
    *first = n >= size ? 0 : size - n;
    *last = size - 1;
    return true;
  }
  *first = std::stoull(m[1].str());
  *last = m[2].length() == 0 ? kNever : std::stoull(m[2].str());
  if (*last < *first) return false;
  if (*first >= size) return *unsatisfiable = true;
  if (*last >= size) *last = size - 1;  // like real servers: clamp to the end
  return true;
}

}  // namespace

struct TestHub::Impl {
  std::string root;
  httplib::Server hub;
  httplib::Server cdn;
  std::thread hub_thread;
  std::thread cdn_thread;
  int hub_port = 0;
  int cdn_port = 0;

  mutable std::mutex mu;
  std::set<std::string> gated;
  std::string token;
  std::map<std::string, std::string> renames;
  uint64_t redirect_above = kNever;
  bool ignore_ranges = false;
  int fail_next = 0;
  int fail_status = 503;
  uint64_t cut_after = kNever;
  uint64_t stall_after = kNever;
  int stall_ms = 0;
  uint64_t bytes_per_s = 0;  // 0: unlimited
  int first_byte_delay_ms = 0;
  uint64_t delay_min_length = 0;
  bool stopping = false;
  std::condition_variable stop_cv;  // wakes stalled responses when the hub stops
  std::vector<TestHubRequest> log;
  bool cdn_saw_auth = false;
  std::atomic<uint64_t> body_bytes{0};

  void Record(const std::string& server, const httplib::Request& req, int status) {
    std::lock_guard<std::mutex> lock(mu);
    bool auth = req.has_header("Authorization");
    if (server == "cdn" && auth) cdn_saw_auth = true;
    log.push_back({server, req.method, req.path, req.get_header_value("Range"), status, auth});
  }

  bool TakeFailure(int* status) {
    std::lock_guard<std::mutex> lock(mu);
    if (fail_next <= 0) return false;
    --fail_next;
    *status = fail_status;
    return true;
  }

  void Reply(const std::string& server, const httplib::Request& req, httplib::Response& res, int status,
             const std::string& error_code = "") {
    res.status = status;
    if (!error_code.empty()) res.set_header("X-Error-Code", error_code);
    res.set_content(error_code.empty() ? std::to_string(status) : error_code, "text/plain");
    Record(server, req, status);
  }

  // Serves one file, with our own Range handling (see the const_cast below).
  void ServeFile(const std::string& server, const httplib::Request& req, httplib::Response& res,
                 const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      if (fd >= 0) ::close(fd);
      return Reply(server, req, res, 404, "EntryNotFound");
    }
    auto file = std::shared_ptr<int>(new int(fd), [](int* p) {
      ::close(*p);
      delete p;
    });
    const auto size = static_cast<uint64_t>(st.st_size);
    uint64_t first = 0, last = size == 0 ? 0 : size - 1;
    int status = 200;
    std::string range = req.get_header_value("Range");
    bool ignore;
    {
      std::lock_guard<std::mutex> lock(mu);
      ignore = ignore_ranges;
    }
    if (!range.empty() && !ignore) {
      bool unsatisfiable = false;
      if (!ParseRange(range, size, &first, &last, &unsatisfiable)) return Reply(server, req, res, 400);
      if (unsatisfiable) {
        res.set_header("Content-Range", "bytes */" + std::to_string(size));
        return Reply(server, req, res, 416);
      }
      status = 206;
      res.set_header("Content-Range",
                     "bytes " + std::to_string(first) + "-" + std::to_string(last) + "/" + std::to_string(size));
    }
    res.status = status;
    Record(server, req, status);
    const uint64_t length = size == 0 ? 0 : last - first + 1;
    if (length == 0) {
      res.set_content("", "application/octet-stream");
      return;
    }
    uint64_t cut = kNever, stall = kNever, rate = 0;
    int pause_ms = 0, delay_ms = 0;
    if (req.method != "HEAD") {
      std::lock_guard<std::mutex> lock(mu);
      std::swap(cut, cut_after);
      std::swap(stall, stall_after);
      pause_ms = stall_ms;
      rate = bytes_per_s;
      if (length >= delay_min_length) delay_ms = first_byte_delay_ms;
    }
    auto sent = std::make_shared<uint64_t>(0);
    auto started = std::make_shared<std::chrono::steady_clock::time_point>();
    res.set_content_provider(
        static_cast<size_t>(length), "application/octet-stream",
        [this, file, first, cut, stall, pause_ms, sent, rate, delay_ms, started](size_t offset, size_t want,
                                                                                 httplib::DataSink& sink) mutable {
          char buf[64 * 1024];
          uint64_t n = std::min<uint64_t>(want, sizeof buf);
          if (*sent == 0 && delay_ms > 0) {  // a slow server: nothing at all for a while
            std::unique_lock<std::mutex> lock(mu);
            if (stop_cv.wait_for(lock, std::chrono::milliseconds(delay_ms), [this] { return stopping; })) return false;
            delay_ms = 0;
          }
          if (*sent == 0) *started = std::chrono::steady_clock::now();
          if (rate > 0) {
            // Paced: the bytes sent so far may not run ahead of rate x time.
            n = std::min<uint64_t>(n, std::max<uint64_t>(1, rate / 20));
            const auto due = *started + std::chrono::microseconds(*sent * 1000000 / rate);
            std::unique_lock<std::mutex> lock(mu);
            if (stop_cv.wait_until(lock, due, [this] { return stopping; })) return false;
          }
          if (cut != kNever) n = std::min<uint64_t>(n, cut - *sent);
          if (stall != kNever) {
            if (*sent >= stall) {
              std::unique_lock<std::mutex> lock(mu);
              stop_cv.wait_for(lock, std::chrono::milliseconds(pause_ms), [this] { return stopping; });
              stall = kNever;
            } else {
              n = std::min<uint64_t>(n, stall - *sent);
            }
          }
          if (n == 0) return false;  // the cut: httplib closes the connection mid-body
          ssize_t got = ::pread(*file, buf, static_cast<size_t>(n), static_cast<off_t>(first + offset));
          if (got <= 0 || !sink.write(buf, static_cast<size_t>(got))) return false;
          *sent += static_cast<uint64_t>(got);
          body_bytes += static_cast<uint64_t>(got);
          return cut == kNever || *sent < cut;
        });
  }

  // httplib 0.11 slices every body (error and redirect bodies included) by the parsed
  // ranges itself, without clamping a range past the end and without a way to ignore it;
  // this server decides instead. httplib owns the Request non-const: the cast is defined.
  static void TakeOverRanges(const httplib::Request& req) { const_cast<httplib::Request&>(req).ranges.clear(); }

  void HandleHub(const httplib::Request& req, httplib::Response& res) {
    TakeOverRanges(req);
    int fail = 0;
    if (TakeFailure(&fail)) return Reply("hub", req, res, fail);
    static const std::regex kResolve(R"(/([^/]+)/([^/]+)/resolve/(.+)/([^/]+))");
    std::smatch m;
    if (!std::regex_match(req.path, m, kResolve)) return Reply("hub", req, res, 404);
    const std::string repo = m[1].str() + "/" + m[2].str(), rev = m[3].str(), file = m[4].str();
    std::string auth = req.get_header_value("Authorization");
    bool is_gated;
    std::string valid_token, renamed_to;
    uint64_t redirect_limit;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto it = renames.find(repo); it != renames.end()) renamed_to = it->second;
      is_gated = gated.count(repo) > 0;
      valid_token = token;
      redirect_limit = redirect_above;
    }
    if (!renamed_to.empty()) {  // relative, as the Hub answers for a renamed repo
      res.set_header("Location", "/" + renamed_to + "/resolve/" + Encode(rev) + "/" + Encode(file));
      return Reply("hub", req, res, 307);
    }
    const std::string dir = root + "/" + repo;
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return Reply("hub", req, res, 404, "RepoNotFound");
    if (is_gated && auth.empty()) return Reply("hub", req, res, 401, "GatedRepo");
    if (is_gated && auth != "Bearer " + valid_token) return Reply("hub", req, res, 403, "GatedRepo");
    const std::string commit = CommitFor(repo);
    if (rev != "main" && rev != commit) return Reply("hub", req, res, 404, "RevisionNotFound");
    res.set_header("X-Repo-Commit", commit);  // also on EntryNotFound, as the Hub does
    const std::string path = dir + "/" + file;
    if (file == "." || file == ".." || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      return Reply("hub", req, res, 404, "EntryNotFound");
    if (static_cast<uint64_t>(st.st_size) > redirect_limit) {
      res.set_header("Location", "http://127.0.0.1:" + std::to_string(cdn_port) + "/" + repo + "/" + commit + "/" +
                                     Encode(file) + "?X-Amz-Signature=testsignature");
      res.set_header("X-Linked-Size", std::to_string(st.st_size));
      return Reply("hub", req, res, 302);
    }
    ServeFile("hub", req, res, path);
  }

  void HandleCdn(const httplib::Request& req, httplib::Response& res) {
    TakeOverRanges(req);
    int fail = 0;
    if (TakeFailure(&fail)) return Reply("cdn", req, res, fail);
    static const std::regex kCdnPath(R"(/([^/]+)/([^/]+)/([0-9a-f]{40})/([^/]+))");
    std::smatch m;
    if (!std::regex_match(req.path, m, kCdnPath) || m[4].str() == "..") return Reply("cdn", req, res, 404);
    ServeFile("cdn", req, res, root + "/" + m[1].str() + "/" + m[2].str() + "/" + m[4].str());
  }
};

TestHub::TestHub(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<TestHub>> TestHub::Start(std::string root, int port) {
  auto impl = std::make_unique<Impl>();
  impl->root = std::move(root);
  Impl* p = impl.get();
  for (httplib::Server* s : {&p->hub, &p->cdn}) {
    s->set_keep_alive_timeout(1);  // a stop waits at most this long for idle connections
  }
  p->hub.Get(R"(/.*)", [p](const httplib::Request& req, httplib::Response& res) { p->HandleHub(req, res); });
  p->cdn.Get(R"(/.*)", [p](const httplib::Request& req, httplib::Response& res) { p->HandleCdn(req, res); });
  // Browsers (the join page's tab fetches its own layers) read both servers across origins,
  // as they read the real Hub and its CDN: every answer allows any origin and shows the
  // headers the client reads; a preflight (a Range or an Authorization header makes one) is
  // granted for GET and HEAD.
  for (auto [s, name] : {std::pair{&p->hub, "hub"}, std::pair{&p->cdn, "cdn"}}) {
    s->set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
      res.set_header("Access-Control-Allow-Origin", "*");
      res.set_header("Access-Control-Expose-Headers",
                     "Content-Range, Content-Length, Accept-Ranges, ETag, Location, X-Repo-Commit, X-Linked-Size, "
                     "X-Linked-Etag, X-Error-Code");
    });
    s->Options(R"(/.*)", [p, name = std::string(name)](const httplib::Request& req, httplib::Response& res) {
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", "GET, HEAD");
      res.set_header("Access-Control-Allow-Headers", "Range, Authorization");
      res.set_header("Access-Control-Max-Age", "600");
      p->Record(name, req, 204);
    });
  }
  if (port == 0) {
    p->hub_port = p->hub.bind_to_any_port("127.0.0.1");
  } else if (p->hub.bind_to_port("127.0.0.1", port)) {
    p->hub_port = port;
  } else {
    p->hub_port = -1;
  }
  if (p->hub_port <= 0) return Unavailable("TestHub: cannot listen on 127.0.0.1:" + std::to_string(port));
  p->cdn_port = p->cdn.bind_to_any_port("127.0.0.1");
  if (p->cdn_port <= 0) return Unavailable("TestHub: cannot listen on 127.0.0.1 for the CDN server");
  // Both sockets already listen, so clients may connect before the threads run.
  p->hub_thread = std::thread([p] { p->hub.listen_after_bind(); });
  p->cdn_thread = std::thread([p] { p->cdn.listen_after_bind(); });
  // httplib's stop() does nothing until the listen loop runs: wait for it, or a hub
  // destroyed right away would never stop.
  while (!p->hub.is_running() || !p->cdn.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return std::unique_ptr<TestHub>(new TestHub(std::move(impl)));
}

TestHub::~TestHub() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->stop_cv.notify_all();
  impl_->hub.stop();
  impl_->cdn.stop();
  if (impl_->hub_thread.joinable()) impl_->hub_thread.join();
  if (impl_->cdn_thread.joinable()) impl_->cdn_thread.join();
}

std::string TestHub::endpoint() const {
  return "http://127.0.0.1:" + std::to_string(impl_->hub_port);
}
std::string TestHub::cdn_endpoint() const {
  return "http://127.0.0.1:" + std::to_string(impl_->cdn_port);
}
int TestHub::port() const {
  return impl_->hub_port;
}

std::string TestHub::CommitFor(std::string_view repo) {
  // FNV-1a with three salts: stable across processes and builds (std::hash is not).
  std::string out;
  for (uint64_t salt : {1ull, 2ull, 3ull}) {
    uint64_t h = 1469598103934665603ull ^ salt;
    for (char c : repo) {
      h ^= static_cast<unsigned char>(c);
      h *= 1099511628211ull;
    }
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    out += buf;
  }
  return out.substr(0, 40);
}

void TestHub::Gate(const std::string& repo) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->gated.insert(repo);
}
void TestHub::SetToken(const std::string& token) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->token = token;
}
void TestHub::SetRedirectAbove(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->redirect_above = bytes;
}
void TestHub::AddRename(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->renames[from] = to;
}
void TestHub::SetIgnoreRanges(bool ignore) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->ignore_ranges = ignore;
}
void TestHub::FailNextRequests(int n, int status) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->fail_next = n;
  impl_->fail_status = status;
}
void TestHub::CutNextResponseAfter(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->cut_after = bytes;
}
void TestHub::SetBandwidthLimit(uint64_t bytes_per_s) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->bytes_per_s = bytes_per_s;
}
void TestHub::SetFirstByteDelay(int ms, uint64_t min_length) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->first_byte_delay_ms = ms;
  impl_->delay_min_length = min_length;
}
void TestHub::StallNextResponseAfter(uint64_t bytes, int ms) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->stall_after = bytes;
  impl_->stall_ms = ms;
}
int TestHub::request_count() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<int>(impl_->log.size());
}
uint64_t TestHub::body_bytes_sent() const {
  return impl_->body_bytes.load();
}
std::vector<TestHubRequest> TestHub::requests() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->log;
}
bool TestHub::cdn_saw_authorization() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->cdn_saw_auth;
}
void TestHub::ResetCounters() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->log.clear();
  impl_->cdn_saw_auth = false;
  impl_->body_bytes = 0;
}

}  // namespace daisy::testing
