// The Hub client: URL building, redirects that keep the token on the Hub's own origin,
// revision pinning, error mapping, retries with resume, and the range cache.
#include "daisy/hub.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "daisy/log.h"
#include "http.h"
#include "range_cache.h"
#include "token.h"

namespace daisy {
namespace {

using hub::Headers;
using hub::Origin;
using hub::RangeCache;

constexpr int kMaxRedirects = 10;
constexpr uint64_t kMaxSmallFile = 64u << 20;  // ReadFile is for config/tokenizer/index files
constexpr double kMaxBackoffS = 30;
constexpr const char* kDefaultEndpoint = "https://huggingface.co";

struct Range {
  uint64_t first;
  uint64_t last;  // inclusive, as in the Range header
};

std::string EnvOr(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

bool IsCommitHash(std::string_view s) {
  if (s.size() != 40) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// Everything but RFC 3986 unreserved characters is escaped ('/' in refs/pr/1 included).
std::string PercentEncode(std::string_view s) {
  constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
        c == '_' || c == '~') {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

Result<std::string> ResolveEndpoint(const std::string& configured) {
  std::string e = !configured.empty() ? configured : EnvOr("HF_ENDPOINT");
  if (e.empty()) e = kDefaultEndpoint;
  while (!e.empty() && e.back() == '/') e.pop_back();
  if (!(e.starts_with("http://") || e.starts_with("https://")) || e.find_first_of("?# ") != std::string::npos)
    return InvalidArgument("the Hub endpoint (HF_ENDPOINT) must be an http:// or https:// URL without a query, not '" +
                           e + "'");
  return e;
}

std::string ResolveCacheDir(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (std::string d = EnvOr("DAISY_CACHE_DIR"); !d.empty()) return d;
  if (std::string x = EnvOr("XDG_CACHE_HOME"); !x.empty()) return x + "/daisychain";
  if (std::string h = EnvOr("HOME"); !h.empty()) return h + "/.cache/daisychain";
  return "";
}

// "bytes a-b/total", "bytes a-b/*" or (on 416) "bytes */total".
struct ContentRange {
  std::optional<Range> range;
  std::optional<uint64_t> total;
};

std::optional<uint64_t> ParseU64(std::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

std::optional<ContentRange> ParseContentRange(std::string_view v) {
  if (!v.starts_with("bytes ")) return std::nullopt;
  v.remove_prefix(6);
  size_t slash = v.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  ContentRange cr;
  std::string_view total = v.substr(slash + 1), span = v.substr(0, slash);
  if (total != "*") {
    cr.total = ParseU64(total);
    if (!cr.total) return std::nullopt;
  }
  if (span != "*") {
    size_t dash = span.find('-');
    if (dash == std::string_view::npos) return std::nullopt;
    auto a = ParseU64(span.substr(0, dash)), b = ParseU64(span.substr(dash + 1));
    if (!a || !b || *a > *b) return std::nullopt;
    cr.range = Range{*a, *b};
  }
  return cr;
}

std::string Header(const Headers& h, const std::string& name) {
  auto it = h.find(name);
  return it == h.end() ? std::string() : it->second;
}

// The outcome of one try of a request (one chain of redirects).
struct TryResult {
  Status status;
  bool transient = false;    // worth another try
  bool progressed = false;   // bytes were delivered: the failure count starts over
  bool needs_token = false;  // 401 and no token was sent: a prompt may help
  long http_status = 0;      // of the final response
  Headers headers;           // of the final response
  std::string commit;        // the commit that answered (URL or X-Repo-Commit), if known
  double retry_after_s = -1;
};

using HeadFn = std::function<Status(long status, const Headers& headers, bool* deliver)>;

class HubClient {
 public:
  HubClient(HubRef ref, HubOptions options, std::string endpoint, Origin origin, std::optional<RangeCache> cache,
            std::optional<std::string> token)
      : ref_(std::move(ref)),
        options_(std::move(options)),
        endpoint_(std::move(endpoint)),
        origin_(std::move(origin)),
        cache_(std::move(cache)),
        token_(std::move(token)) {
    // A commit id needs no resolving: the load is pinned before any request.
    if (IsCommitHash(ref_.revision)) pinned_ = ref_.revision;
  }

  const HubRef& ref() const { return ref_; }
  const RangeCache* cache() const { return cache_ ? &*cache_ : nullptr; }

  std::optional<std::string> pinned() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pinned_;
  }

  std::string Describe() const { return ref_.repo + "@" + pinned().value_or(ref_.revision); }

  // Pins the revision with a HEAD request if nothing has pinned it yet. With
  // tolerate_missing, a 404 for `file` that still told the commit counts as success.
  Status EnsurePinned(const std::string& file, bool tolerate_missing) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pinned_ || unpinnable_) return Status::Ok();
    }
    Status st = Run([&] {
      return TryOnce(
          file, /*head=*/true, std::nullopt,
          [](long, const Headers&, bool* deliver) {
            *deliver = false;
            return Status::Ok();
          },
          [](std::span<const uint8_t>) { return Status::Ok(); });
    });
    std::lock_guard<std::mutex> lock(mu_);
    if (pinned_) return tolerate_missing && st.code() == ErrorCode::kNotFound ? Status::Ok() : st;
    if (!st.ok()) return st;
    unpinnable_ = true;
    LogWarning(endpoint_ + " did not say which commit " + ref_.repo + "@" + ref_.revision +
               " is (no X-Repo-Commit header): reads are not pinned to one commit and are not cached");
    return Status::Ok();
  }

  // One try: follows up to kMaxRedirects redirects itself. The token goes only to the
  // endpoint's own scheme://host:port, and once a redirect leaves it, never again.
  TryResult TryOnce(const std::string& file, bool head, std::optional<Range> range, const HeadFn& on_success,
                    const hub::BodyFn& on_body) {
    TryResult result;
    std::optional<std::string> commit = pinned();
    std::string url = endpoint_ + "/" + ref_.repo + "/resolve/" + PercentEncode(commit.value_or(ref_.revision)) + "/" +
                      PercentEncode(file);
    if (commit) result.commit = *commit;
    std::optional<std::string> token = CurrentToken();
    bool token_allowed = true;
    bool sent_token = false;
    for (int hop = 0; hop <= kMaxRedirects; ++hop) {
      auto origin = hub::ParseOrigin(url);
      if (!origin.ok()) {
        result.status = origin.status();
        return result;
      }
      bool on_hub = *origin == origin_;
      if (!on_hub) token_allowed = false;
      hub::HopRequest req;
      req.url = url;
      req.head = head;
      req.range = range ? std::optional<std::pair<uint64_t, uint64_t>>({range->first, range->last}) : std::nullopt;
      sent_token = token_allowed && token;
      if (sent_token) req.bearer_token = *token;
      req.timeout_s = options_.timeout_s;
      auto on_start = [&](long status, const Headers& h, bool* deliver) -> Status {
        *deliver = false;
        // Only the Hub itself may pin the commit; a redirect host has no say.
        if (on_hub) DAISY_RETURN_IF_ERROR(CheckCommit(h, &result.commit));
        if (status >= 200 && status < 300) return on_success(status, h, deliver);
        return Status::Ok();  // redirects and errors are judged after the exchange
      };
      hub::HopResponse resp = hub::PerformHop(pool_, req, on_start, on_body);
      result.http_status = resp.status;
      result.progressed = resp.body_bytes > 0;
      if (!resp.body_status.ok()) {
        result.status = resp.body_status;
        return result;
      }
      if (!resp.transport_ok) {
        result.status = Unavailable(Where(file) + ": " + resp.transport_error + " (" + origin->host + ")");
        result.transient = true;
        return result;
      }
      long st = resp.status;
      if (st == 301 || st == 302 || st == 303 || st == 307 || st == 308) {
        if (head && on_hub && pinned()) return result;  // a HEAD only wanted the commit
        if (resp.redirect_url.empty()) {
          result.status = DataLoss(Where(file) + ": HTTP " + std::to_string(st) + " redirect without a Location");
          return result;
        }
        auto next = hub::ParseOrigin(resp.redirect_url);
        if (!next.ok()) {
          result.status = next.status().WithContext(Where(file) + ": refusing a redirect");
          return result;
        }
        if (origin->scheme == "https" && next->scheme == "http") {
          result.status = PermissionDenied(Where(file) + ": refusing a redirect from https to plain http (" +
                                           hub::UrlForMessage(resp.redirect_url) + ")");
          return result;
        }
        LogDebug(Where(file) + ": redirected to " + hub::UrlForMessage(resp.redirect_url));
        url = resp.redirect_url;
        continue;
      }
      result.headers = std::move(resp.headers);
      if (st >= 200 && st < 300) return result;
      MapHttpError(file, sent_token, &result);
      return result;
    }
    result.status = Unavailable(Where(file) + ": more than " + std::to_string(kMaxRedirects) + " redirects");
    return result;
  }

  // Runs tries until one succeeds, a failure is not transient, or max_attempts transient
  // failures in a row; the delay doubles from initial_backoff_s. A 401 without a token
  // asks for one once (on a terminal) and tries again.
  Status Run(const std::function<TryResult()>& once) {
    int failures = 0;
    bool prompted = false;
    const int max_attempts = std::max(1, options_.max_attempts);
    while (true) {
      TryResult r = once();
      if (r.status.ok()) return Status::Ok();
      if (r.needs_token && !prompted && options_.allow_token_prompt) {
        prompted = true;
        if (PromptToken(r.status.message())) continue;
      }
      if (!r.transient) return r.status;
      if (r.progressed) failures = 0;
      if (++failures >= max_attempts)
        return Status(r.status.code(),
                      r.status.message() + " (gave up after " + std::to_string(max_attempts) + " tries)");
      double delay = std::min(kMaxBackoffS, options_.initial_backoff_s * std::ldexp(1.0, failures - 1));
      if (r.retry_after_s > delay) delay = std::min(r.retry_after_s, 2 * kMaxBackoffS);
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f", delay);
      LogWarning(r.status.message() + "; trying again in " + buf + " s (" + std::to_string(failures) + " of " +
                 std::to_string(max_attempts - 1) + " retries)");
      std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, delay)));
    }
  }

  // Progress callbacks are serialized, whatever thread reads.
  void ReportProgress(const TransferProgress& p) {
    if (!options_.progress) return;
    std::lock_guard<std::mutex> lock(progress_mu_);
    options_.progress(p);
  }

  std::string Where(const std::string& file) const { return Describe() + "/" + file; }

 private:
  std::optional<std::string> CurrentToken() const {
    if (options_.runtime_token)
      if (auto t = options_.runtime_token->Get()) return t;
    std::lock_guard<std::mutex> lock(mu_);
    return token_;
  }

  bool PromptToken(const std::string& why) {
    std::lock_guard<std::mutex> prompt_lock(prompt_mu_);  // one prompt at a time
    if (CurrentToken()) return true;                      // another thread got one
    std::optional<std::string> token = hub::PromptForToken(why);
    if (!token || !hub::CheckTokenChars(*token).ok()) return false;
    std::lock_guard<std::mutex> lock(mu_);
    token_ = std::move(token);
    return true;
  }

  Status CheckCommit(const Headers& h, std::string* answered) {
    auto it = h.find("x-repo-commit");
    if (it == h.end()) return Status::Ok();
    const std::string& c = it->second;
    if (!IsCommitHash(c)) return DataLoss(ref_.repo + ": the Hub sent a malformed commit id in X-Repo-Commit");
    std::lock_guard<std::mutex> lock(mu_);
    if (!pinned_) {
      pinned_ = c;
      LogDebug("pinned " + ref_.repo + "@" + ref_.revision + " to commit " + c);
    } else if (*pinned_ != c) {
      return DataLoss(ref_.repo + ": the Hub answered with commit " + c + " but this load is pinned to " + *pinned_ +
                      "; refusing to mix files of two commits");
    }
    *answered = c;
    return Status::Ok();
  }

  // 401/403/404 into messages that say what to do; 429 and 5xx are transient.
  void MapHttpError(const std::string& file, bool had_token, TryResult* r) const {
    const long st = r->http_status;
    const std::string code = Header(r->headers, "x-error-code");
    const std::string page = endpoint_ + "/" + ref_.repo;
    const std::string http = "(HTTP " + std::to_string(st) + ")";
    const std::string login = "set HF_TOKEN, or log in with `huggingface-cli login`";
    if (st == 401) {
      r->needs_token = !had_token;
      if (code == "RepoNotFound") {
        r->status = Unauthenticated("repo " + ref_.repo + " not found on " + endpoint_ +
                                    ", or it is private or gated and needs a token " + http +
                                    (had_token ? ": the token sent has no access" : ": " + login));
      } else if (!had_token) {
        r->status = Unauthenticated(ref_.repo + (code == "GatedRepo" ? " is a gated repo and needs" : " needs") +
                                    " a Hugging Face token " + http + ": " + login +
                                    ". For a gated repo, accept the licence on the model page first: " + page);
      } else {
        r->status = Unauthenticated("the Hugging Face token was refused for " + ref_.repo + " " + http +
                                    ": it is invalid or expired" +
                                    (code == "GatedRepo" ? "; this is a gated repo: " : "; if the repo is gated, ") +
                                    "accept the licence on the model page first: " + page);
      }
    } else if (st == 403) {
      std::string gated = code == "GatedRepo" ? " it is a gated repo:" : " if the repo is gated,";
      r->status = PermissionDenied((had_token ? "the token has no access to " : "access denied to ") + ref_.repo + " " +
                                   http + ";" + gated + " accept the licence on the model page first (" + page +
                                   ") with the account the token belongs to");
    } else if (st == 404) {
      if (code == "RepoNotFound")
        r->status = NotFound("repo " + ref_.repo + " not found on " + endpoint_ + " " + http);
      else if (code == "RevisionNotFound")
        r->status = NotFound("revision '" + ref_.revision + "' not found in " + ref_.repo + " " + http);
      else if (code == "EntryNotFound")
        r->status = NotFound("file '" + file + "' not found in " + Describe() + " " + http);
      else
        r->status = NotFound(Where(file) + " not found: repo, revision or file " + http);
    } else if (st == 416) {
      r->status = OutOfRange(Where(file) + ": the requested range is past the end of the file " + http);
    } else if (st == 429 || st >= 500) {
      r->transient = true;
      if (auto s = ParseU64(Header(r->headers, "retry-after"))) r->retry_after_s = static_cast<double>(*s);
      r->status = Unavailable(Where(file) + ": the server answered HTTP " + std::to_string(st));
    } else {
      r->status = Internal(Where(file) + ": unexpected " + http);
    }
  }

  const HubRef ref_;
  HubOptions options_;
  const std::string endpoint_;
  const Origin origin_;
  const std::optional<RangeCache> cache_;
  hub::ConnectionPool pool_;

  mutable std::mutex mu_;  // guards pinned_, unpinnable_, token_
  std::optional<std::string> pinned_;
  bool unpinnable_ = false;
  std::optional<std::string> token_;
  std::mutex prompt_mu_;
  std::mutex progress_mu_;
};

class HubFile final : public ByteSource {
 public:
  HubFile(std::shared_ptr<HubClient> client, std::string file)
      : client_(std::move(client)), file_(std::move(file)), name_(client_->Describe() + "/" + file_) {}

  const std::string& name() const override { return name_; }

  Result<uint64_t> Size() override {
    if (auto s = KnownSize()) return *s;
    std::string entry = CacheEntry("size");
    if (!entry.empty()) {
      if (auto payload = client_->cache()->ReadSmall(entry, 32)) {
        if (auto v = ParseU64(*payload)) {
          LearnSize(*v);
          return *v;
        }
      }
    }
    // bytes=0-0: the Content-Range total is the size; an empty file answers 416 "bytes */0".
    Status st = client_->Run([&] {
      TryResult t = client_->TryOnce(
          file_, false, Range{0, 0},
          [&](long status, const Headers& h, bool* deliver) -> Status {
            auto cr = ParseContentRange(Header(h, "content-range"));
            if (status != 206) return RangeIgnored(status, Range{0, 0});
            if (!cr || !cr->total) return DataLoss(name_ + ": a 206 answer without the file size in Content-Range");
            LearnSize(*cr->total);
            *deliver = false;
            return Status::Ok();
          },
          [](std::span<const uint8_t>) { return Status::Ok(); });
      if (t.http_status == 416) {
        auto cr = ParseContentRange(Header(t.headers, "content-range"));
        if (cr && cr->total) {
          LearnSize(*cr->total);
          t.status = Status::Ok();
        }
      }
      return t;
    });
    DAISY_RETURN_IF_ERROR(st);
    auto size = KnownSize();
    if (!size) return DataLoss(name_ + ": the server did not tell the file size");
    if (std::string e = CacheEntry("size"); !e.empty()) client_->cache()->WriteSmall(e, std::to_string(*size));
    return *size;
  }

  Status ReadStream(uint64_t offset, uint64_t length, const ChunkSink& sink) override {
    if (auto size = KnownSize()) DAISY_RETURN_IF_ERROR(CheckBounds(offset, length, *size));
    if (length == 0) {
      DAISY_ASSIGN_OR_RETURN(uint64_t size, Size());
      return CheckBounds(offset, length, size);
    }
    if (client_->cache() != nullptr) DAISY_RETURN_IF_ERROR(client_->EnsurePinned(file_, false));
    std::string entry = CacheEntry("range-" + std::to_string(offset) + "-" + std::to_string(length));
    if (!entry.empty()) {
      DAISY_ASSIGN_OR_RETURN(bool served, client_->cache()->Serve(entry, length, sink));
      if (served) return Status::Ok();
    }
    std::optional<RangeCache::Writer> writer;
    if (!entry.empty()) writer.emplace(entry);

    const auto start = std::chrono::steady_clock::now();
    auto last_report = start;
    uint64_t done = 0;
    auto report = [&](bool force) {
      auto now = std::chrono::steady_clock::now();
      if (!force && now - last_report < std::chrono::milliseconds(50)) return;
      last_report = now;
      TransferProgress p;
      p.bytes_done = done;
      p.bytes_total = length;
      p.seconds = std::chrono::duration<double>(now - start).count();
      client_->ReportProgress(p);
    };
    // A try asks for what is still missing, so a cut transfer resumes where it stopped and
    // no byte reaches the sink twice.
    Status st = client_->Run([&] {
      const uint64_t before = done;
      const Range want{offset + done, offset + length - 1};
      TryResult t = client_->TryOnce(
          file_, false, want,
          [&](long status, const Headers& h, bool* deliver) -> Status {
            if (status != 206) return RangeIgnored(status, want);
            auto cr = ParseContentRange(Header(h, "content-range"));
            if (!cr || !cr->range) return DataLoss(name_ + ": a 206 answer without a valid Content-Range");
            if (cr->total) LearnSize(*cr->total);
            if (cr->range->first != want.first || cr->range->last != want.last) {
              if (cr->total) DAISY_RETURN_IF_ERROR(CheckBounds(offset, length, *cr->total));
              return DataLoss(name_ + ": asked for bytes " + std::to_string(want.first) + "-" +
                              std::to_string(want.last) + ", the server sent " + std::to_string(cr->range->first) +
                              "-" + std::to_string(cr->range->last));
            }
            *deliver = true;
            return Status::Ok();
          },
          [&](std::span<const uint8_t> chunk) -> Status {
            if (chunk.size() > length - done) return DataLoss(name_ + ": the server sent more bytes than asked");
            DAISY_RETURN_IF_ERROR(sink(chunk));
            if (writer) writer->Append(chunk);
            done += chunk.size();
            report(false);
            return Status::Ok();
          });
      if (t.http_status == 416) {
        auto cr = ParseContentRange(Header(t.headers, "content-range"));
        if (cr && cr->total) {
          LearnSize(*cr->total);
          t.status = CheckBounds(offset, length, *cr->total);
          if (t.status.ok()) t.status = DataLoss(name_ + ": the server refused a range inside the file (HTTP 416)");
        }
      }
      if (t.status.ok() && done != length) {
        t.status = Unavailable(name_ + ": the answer ended after " + std::to_string(done) + " of " +
                               std::to_string(length) + " bytes");
        t.transient = true;
      }
      t.progressed = done > before;
      return t;
    });
    DAISY_RETURN_IF_ERROR(st);
    report(true);
    if (writer) writer->Commit();
    return Status::Ok();
  }

 private:
  std::optional<uint64_t> KnownSize() {
    std::lock_guard<std::mutex> lock(mu_);
    return size_;
  }
  void LearnSize(uint64_t size) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (size_ == size) return;
      size_ = size;
    }
    // Remember it with the cached ranges, so a later load served from the cache needs no
    // size probe either.
    if (std::string e = CacheEntry("size"); !e.empty()) client_->cache()->WriteSmall(e, std::to_string(size));
  }

  // The cache path for `entry`, or "" when there is no cache or no pinned commit yet.
  std::string CacheEntry(const std::string& entry) const {
    if (client_->cache() == nullptr) return "";
    auto commit = client_->pinned();
    if (!commit) return "";
    return client_->cache()->EntryPath(client_->ref().repo, *commit, file_, entry);
  }

  Status CheckBounds(uint64_t offset, uint64_t length, uint64_t size) const {
    if (offset <= size && length <= size - offset) return Status::Ok();
    return OutOfRange(name_ + ": read of " + std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                      " runs past the end of the file (" + std::to_string(size) + " bytes)");
  }

  Status RangeIgnored(long status, Range want) const {
    if (status == 200)
      return DataLoss(name_ + ": the server ignored the byte range (asked for bytes " + std::to_string(want.first) +
                      "-" + std::to_string(want.last) +
                      ", got HTTP 200 with the whole file); refusing to download the whole file");
    return DataLoss(name_ + ": expected HTTP 206 for a byte range, got " + std::to_string(status));
  }

  std::shared_ptr<HubClient> client_;
  const std::string file_;
  const std::string name_;
  std::mutex mu_;
  std::optional<uint64_t> size_;
};

class HubModelSource final : public ModelSource {
 public:
  explicit HubModelSource(std::shared_ptr<HubClient> client) : client_(std::move(client)) {}

  std::string Describe() const override { return client_->Describe(); }
  std::string ModelId() const override { return client_->ref().repo; }

  std::string Revision() const override {
    Status st = client_->EnsurePinned("config.json", /*tolerate_missing=*/true);
    if (!st.ok()) LogWarning("could not pin " + client_->Describe() + " to a commit: " + st.message());
    return client_->pinned().value_or(client_->ref().revision);
  }

  Result<std::string> ReadFile(std::string_view file_view) override {
    std::string file(file_view);
    if (!IsSafeFileName(file)) return InvalidArgument("refusing file name '" + file + "'");
    const RangeCache* cache = client_->cache();
    if (auto commit = client_->pinned(); cache != nullptr && commit) {
      if (auto hit = cache->ReadSmall(cache->EntryPath(client_->ref().repo, *commit, file, "full"), kMaxSmallFile))
        return std::move(*hit);
    }
    std::string out;
    std::string commit;
    Status st = client_->Run([&] {
      out.clear();
      TryResult t = client_->TryOnce(
          file, false, std::nullopt,
          [&](long status, const Headers& h, bool* deliver) -> Status {
            if (status != 200)
              return DataLoss(client_->Where(file) + ": expected HTTP 200, got " + std::to_string(status));
            if (auto len = ParseU64(Header(h, "content-length")); len && *len > kMaxSmallFile) return TooLarge(file);
            *deliver = true;
            return Status::Ok();
          },
          [&](std::span<const uint8_t> chunk) -> Status {
            if (out.size() + chunk.size() > kMaxSmallFile) return TooLarge(file);
            out.append(reinterpret_cast<const char*>(chunk.data()), chunk.size());
            return Status::Ok();
          });
      commit = t.commit;
      return t;
    });
    DAISY_RETURN_IF_ERROR(st);
    // Cached only under the commit that actually answered.
    if (cache != nullptr && !commit.empty())
      cache->WriteSmall(cache->EntryPath(client_->ref().repo, commit, file, "full"), out);
    return out;
  }

  Result<std::unique_ptr<ByteSource>> OpenFile(std::string_view file_view) override {
    std::string file(file_view);
    if (!IsSafeFileName(file)) return InvalidArgument("refusing file name '" + file + "'");
    // Pin first, so the file's name (and every request for it) carries the commit.
    DAISY_RETURN_IF_ERROR(client_->EnsurePinned(file, false));
    return std::unique_ptr<ByteSource>(new HubFile(client_, file));
  }

 private:
  Status TooLarge(const std::string& file) const {
    return InvalidArgument(client_->Where(file) + " is larger than " + std::to_string(kMaxSmallFile >> 20) +
                           " MiB, too large to read whole");
  }

  std::shared_ptr<HubClient> client_;
};

}  // namespace

Result<std::string> HubEndpoint(const HubOptions& options) {
  return ResolveEndpoint(options.endpoint);
}

Status RuntimeToken::Set(std::string_view token) {
  if (token.size() < 4 || token.size() > 1024)
    return InvalidArgument("a Hugging Face token has 4 to 1024 characters (hf_...); this one has " +
                           std::to_string(token.size()));
  DAISY_RETURN_IF_ERROR(hub::CheckTokenChars(token));
  Forget();               // the one held before (it may be this one: registered again below)
  RegisterSecret(token);  // before anything could log it
  std::lock_guard<std::mutex> lock(mu_);
  token_ = token;
  return Status::Ok();
}

void RuntimeToken::Forget() {
  std::lock_guard<std::mutex> lock(mu_);
  if (token_.empty()) return;
  ForgetSecret(token_);
  std::fill(token_.begin(), token_.end(), '\0');  // the bytes, not only the length
  token_.clear();
}

bool RuntimeToken::has() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !token_.empty();
}

std::optional<std::string> RuntimeToken::Get() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (token_.empty()) return std::nullopt;
  return token_;
}

Result<std::unique_ptr<ModelSource>> OpenHubRepo(const HubRef& ref, const HubOptions& options) {
  DAISY_RETURN_IF_ERROR(ValidateRepoId(ref.repo));
  DAISY_RETURN_IF_ERROR(ValidateRevision(ref.revision));
  DAISY_ASSIGN_OR_RETURN(std::string endpoint, ResolveEndpoint(options.endpoint));
  DAISY_ASSIGN_OR_RETURN(Origin origin, hub::ParseOrigin(endpoint));
  std::optional<std::string> token;
  if (options.token && !options.token->empty()) {
    RegisterSecret(*options.token);
    token = options.token;
  } else {
    token = hub::TokenFromEnvironment();
  }
  if (token) DAISY_RETURN_IF_ERROR(hub::CheckTokenChars(*token));
  std::optional<RangeCache> cache;
  if (options.use_cache) {
    std::string dir = ResolveCacheDir(options.cache_dir);
    if (!dir.empty()) cache.emplace(dir);
  }
  auto client =
      std::make_shared<HubClient>(ref, options, std::move(endpoint), std::move(origin), std::move(cache), token);
  return std::unique_ptr<ModelSource>(new HubModelSource(std::move(client)));
}

}  // namespace daisy
