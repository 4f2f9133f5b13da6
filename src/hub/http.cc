#include "http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "daisy/hub.h"

namespace daisy::hub {
namespace {

void GlobalInitOnce() {
  static std::once_flag once;
  // Never cleaned up: other threads may still be using curl at exit.
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r' || s[e - 1] == '\n')) --e;
  return std::string(s.substr(b, e - b));
}

struct UrlHandle {
  CURLU* h = curl_url();
  ~UrlHandle() { curl_url_cleanup(h); }
  std::optional<std::string> Get(CURLUPart part, unsigned flags = 0) const {
    char* out = nullptr;
    if (curl_url_get(h, part, &out, flags) != CURLUE_OK || out == nullptr) return std::nullopt;
    std::string s(out);
    curl_free(out);
    return s;
  }
};

struct Exchange {
  const HopRequest* request;
  const StartFn* on_start;
  const BodyFn* on_body;
  CURL* curl;
  HopResponse* response;
  bool started = false;
  bool deliver = false;
  uint64_t discarded = 0;
  // Stall detection: the last time a byte (or the head) arrived.
  std::chrono::steady_clock::time_point last_progress = std::chrono::steady_clock::now();
  curl_off_t last_now = -1;
  bool stalled = false;
};

// Aborts the exchange when nothing arrived for timeout_s (curl's own low-speed limit
// averages over several seconds, so it reacts late to a stall after a burst).
int OnProgress(void* user, curl_off_t, curl_off_t dlnow, curl_off_t, curl_off_t) {
  auto& ex = *static_cast<Exchange*>(user);
  auto now = std::chrono::steady_clock::now();
  if (dlnow != ex.last_now) {
    ex.last_now = dlnow;
    ex.last_progress = now;
    return 0;
  }
  if (std::chrono::duration<double>(now - ex.last_progress).count() > ex.request->timeout_s) {
    ex.stalled = true;
    return 1;
  }
  return 0;
}

// Runs on_start once; returns false if the transfer must stop.
bool Start(Exchange& ex) {
  ex.started = true;
  curl_easy_getinfo(ex.curl, CURLINFO_RESPONSE_CODE, &ex.response->status);
  Status st = (*ex.on_start)(ex.response->status, ex.response->headers, &ex.deliver);
  if (!st.ok()) {
    ex.response->body_status = st;
    return false;
  }
  return true;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto& ex = *static_cast<Exchange*>(user);
  std::string_view line(data, size * n);
  // A new status line (e.g. after "100 Continue") starts a new header block.
  if (line.starts_with("HTTP/")) {
    ex.response->headers.clear();
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon != std::string_view::npos)
    ex.response->headers[Lower(Trim(line.substr(0, colon)))] = Trim(line.substr(colon + 1));
  return size * n;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto& ex = *static_cast<Exchange*>(user);
  size_t len = size * n;
  if (!ex.started && !Start(ex)) return 0;  // 0 makes curl stop with CURLE_WRITE_ERROR
  if (!ex.deliver) {
    // Error and redirect bodies are short; a huge one is not worth reading.
    ex.discarded += len;
    return ex.discarded > (1u << 20) ? 0 : len;
  }
  Status st = (*ex.on_body)(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data), len));
  if (!st.ok()) {
    ex.response->body_status = st;
    return 0;
  }
  ex.response->body_bytes += len;
  return len;
}

}  // namespace

Result<Origin> ParseOrigin(const std::string& url) {
  GlobalInitOnce();
  UrlHandle u;
  if (u.h == nullptr || curl_url_set(u.h, CURLUPART_URL, url.c_str(), 0) != CURLUE_OK)
    return InvalidArgument("not a valid URL: " + UrlForMessage(url));
  Origin o;
  auto scheme = u.Get(CURLUPART_SCHEME);
  auto host = u.Get(CURLUPART_HOST);
  auto port = u.Get(CURLUPART_PORT, CURLU_DEFAULT_PORT);
  if (!scheme || !host || !port) return InvalidArgument("not a valid URL: " + UrlForMessage(url));
  o.scheme = Lower(*scheme);
  o.host = Lower(*host);
  o.port = *port;
  if (o.scheme != "http" && o.scheme != "https")
    return InvalidArgument("only http and https URLs are supported, not " + UrlForMessage(url));
  return o;
}

std::string UrlForMessage(const std::string& url) {
  size_t cut = url.find_first_of("?#");
  return cut == std::string::npos ? url : url.substr(0, cut);
}

struct ConnectionPool::Locks {
  std::mutex mu[CURL_LOCK_DATA_LAST];
};

ConnectionPool::ConnectionPool() : locks_(std::make_unique<Locks>()) {
  GlobalInitOnce();
  CURLSH* sh = curl_share_init();
  DAISY_CHECK(sh != nullptr, "curl_share_init failed");
  curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
  curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
  curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  curl_share_setopt(sh, CURLSHOPT_USERDATA, locks_.get());
  curl_lock_function lock = [](CURL*, curl_lock_data data, curl_lock_access, void* user) {
    static_cast<Locks*>(user)->mu[data].lock();
  };
  curl_unlock_function unlock = [](CURL*, curl_lock_data data, void* user) {
    static_cast<Locks*>(user)->mu[data].unlock();
  };
  curl_share_setopt(sh, CURLSHOPT_LOCKFUNC, lock);
  curl_share_setopt(sh, CURLSHOPT_UNLOCKFUNC, unlock);
  share_ = sh;
}

ConnectionPool::~ConnectionPool() {
  curl_share_cleanup(static_cast<CURLSH*>(share_));
}

HopResponse PerformHop(const ConnectionPool& pool, const HopRequest& request, const StartFn& on_start,
                       const BodyFn& on_body) {
  GlobalInitOnce();
  HopResponse response;
  CURL* curl = curl_easy_init();
  if (curl == nullptr) {
    response.transport_error = "curl_easy_init failed";
    return response;
  }
  Exchange ex{&request, &on_start, &on_body, curl, &response};
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_slist* headers = nullptr;
  if (!request.bearer_token.empty()) {
    std::string h = "Authorization: Bearer " + request.bearer_token;
    headers = curl_slist_append(headers, h.c_str());
  }
  std::string range;
  if (request.range) range = std::to_string(request.range->first) + "-" + std::to_string(request.range->second);
  long timeout = std::max(1L, static_cast<long>(std::ceil(request.timeout_s)));

  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_SHARE, pool.share());
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);  // the caller follows, to control the token
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, request.http_only ? "http" : "http,https");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // thread-safe timeouts
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "daisychain/0.1");
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, timeout);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, &OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &ex);
  if (request.post_json != nullptr) {
    headers = curl_slist_append(headers, "Content-Type: application/json");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.post_json->c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(request.post_json->size()));
  }
  if (headers != nullptr) curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (request.head) curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  if (!range.empty()) curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &ex);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &ex);

  CURLcode rc = curl_easy_perform(curl);
  if (rc == CURLE_OK) {
    response.transport_ok = true;
    if (!ex.started) Start(ex);  // empty body: the head is still judged
  } else if (!response.body_status.ok() || (ex.started && !ex.deliver)) {
    // We stopped it (body_status says why), or the head was all that counted and the
    // body being discarded broke off: either way the exchange itself worked.
    response.transport_ok = true;
  } else if (ex.stalled) {
    char msg[96];
    std::snprintf(msg, sizeof msg, "no data for %.1f s (timed out)", request.timeout_s);
    response.transport_error = msg;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  } else {
    response.transport_error = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  }
  char* redirect = nullptr;
  if (curl_easy_getinfo(curl, CURLINFO_REDIRECT_URL, &redirect) == CURLE_OK && redirect != nullptr)
    response.redirect_url = redirect;
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return response;
}

Result<LanAnswer> LanExchange(const std::string& url, const std::string* post_json) {
  static ConnectionPool pool;  // connections reused across joins; lives as long as the process
  HopRequest request;
  request.url = url;
  request.timeout_s = 10;
  request.post_json = post_json;
  request.http_only = true;
  LanAnswer answer;
  const HopResponse r = PerformHop(
      pool, request,
      [](long, const Headers&, bool* deliver) {
        *deliver = true;
        return Status::Ok();
      },
      [&](std::span<const uint8_t> chunk) {
        if (answer.body.size() + chunk.size() > (1u << 20))
          return DataLoss("the answer from " + url + " is over 1 MiB");
        answer.body.append(reinterpret_cast<const char*>(chunk.data()), chunk.size());
        return Status::Ok();
      });
  if (!r.transport_ok) return Unavailable(r.transport_error);
  if (!r.body_status.ok()) return r.body_status;
  answer.status = r.status;
  return answer;
}

}  // namespace daisy::hub
