// XhrModelSource: a Hub repo at one commit, read with synchronous XMLHttpRequest (worker only).
#include "xhr_source.h"

#include <emscripten.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <utility>

#include "daisy/log.h"

// One synchronous GET of `url` (bytes [first, last] when first >= 0). Returns the HTTP
// status (0: the request failed without one, e.g. a network or CORS error), the body in a
// malloc'd buffer at *out (the caller frees it) and its length at *out_len, and for a range
// the total size from Content-Range at *total (-1 when absent).
// clang-format off
EM_JS(int, daisy_xhr_get, (const char* url, const char* token, double first, double last, uint8_t** out,
                           double* out_len, double* total), {
  HEAPU32[out >> 2] = 0;
  HEAPF64[out_len >> 3] = 0;
  HEAPF64[total >> 3] = -1;
  let xhr;
  try {
    xhr = new XMLHttpRequest();
    xhr.open('GET', UTF8ToString(url), false);
    xhr.responseType = 'arraybuffer';
    const t = UTF8ToString(token);
    if (t) xhr.setRequestHeader('Authorization', 'Bearer ' + t);
    if (first >= 0) xhr.setRequestHeader('Range', 'bytes=' + first + '-' + last);
    xhr.send();
  } catch (e) {
    return 0;
  }
  const range = xhr.getResponseHeader('Content-Range');
  if (range && range.lastIndexOf('/') >= 0) {
    const n = Number(range.substring(range.lastIndexOf('/') + 1).trim());
    if (Number.isFinite(n)) HEAPF64[total >> 3] = n;
  }
  const body = xhr.response ? new Uint8Array(xhr.response) : new Uint8Array(0);
  const p = _malloc(Math.max(1, body.length));
  HEAPU8.set(body, p);
  HEAPU32[out >> 2] = p;
  HEAPF64[out_len >> 3] = body.length;
  return xhr.status;
});
// clang-format on

namespace daisy::wasm {
namespace {

struct Response {
  int status = 0;
  std::string body;
  double total = -1;
};

Response Get(const std::string& url, const std::string& token, double first, double last) {
  uint8_t* data = nullptr;
  double len = 0, total = -1;
  Response r;
  r.status = daisy_xhr_get(url.c_str(), token.c_str(), first, last, &data, &len, &total);
  if (data != nullptr) {
    r.body.assign(reinterpret_cast<const char*>(data), static_cast<size_t>(len));
    std::free(data);
  }
  r.total = total;
  return r;
}

// What went wrong, naming the file but never the token.
Status HttpError(int status, const std::string& what) {
  if (status == 0)
    return Unavailable(what +
                       ": the request failed without an answer (offline, or refused by the browser's CORS rules)");
  if (status == 401 || status == 403)
    return PermissionDenied(what + ": HTTP " + std::to_string(status) +
                            " (a gated or private repo needs the page's Hub token)");
  if (status == 404) return NotFound(what + ": HTTP 404");
  return Unavailable(what + ": HTTP " + std::to_string(status));
}

class XhrFile final : public ByteSource {
 public:
  XhrFile(std::string name, std::string url, std::shared_ptr<const std::string> token)
      : name_(std::move(name)), url_(std::move(url)), token_(std::move(token)) {}
  const std::string& name() const override { return name_; }
  Result<uint64_t> Size() override {
    if (size_ >= 0) return static_cast<uint64_t>(size_);
    Response r = Get(url_, *token_, 0, 0);
    if (r.status != 206) return r.status == 200 ? RangeRefused() : HttpError(r.status, name_);
    if (r.total < 0) return Unavailable(name_ + ": the answer to a range request has no readable Content-Range");
    size_ = r.total;
    return static_cast<uint64_t>(size_);
  }
  Status ReadStream(uint64_t offset, uint64_t length, const ChunkSink& sink) override {
    // Bounded requests: progress between them, and no single buffer of a whole slice.
    constexpr uint64_t kChunk = 8u << 20;
    for (uint64_t done = 0; done < length;) {
      const uint64_t n = std::min(kChunk, length - done);
      const double first = static_cast<double>(offset + done);
      Response r = Get(url_, *token_, first, first + static_cast<double>(n) - 1);
      if (r.status != 206) return r.status == 200 ? RangeRefused() : HttpError(r.status, name_);
      if (r.body.size() != n)
        return DataLoss(name_ + ": asked for " + std::to_string(n) + " bytes at offset " +
                        std::to_string(offset + done) + ", got " + std::to_string(r.body.size()));
      DAISY_RETURN_IF_ERROR(sink(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(r.body.data()), n)));
      done += n;
    }
    return Status::Ok();
  }

 private:
  Status RangeRefused() const {
    return Unavailable(name_ + ": the server answered a byte-range request with the whole file (200, not 206)");
  }
  std::string name_, url_;
  std::shared_ptr<const std::string> token_;
  double size_ = -1;
};

class XhrModelSource final : public ModelSource {
 public:
  XhrModelSource(std::string endpoint, std::string repo, std::string commit, std::shared_ptr<const std::string> token)
      : endpoint_(std::move(endpoint)), repo_(std::move(repo)), commit_(std::move(commit)), token_(std::move(token)) {
    while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
  }
  std::string Describe() const override { return repo_ + "@" + commit_; }
  std::string ModelId() const override { return repo_; }
  std::string Revision() const override { return commit_; }
  Result<std::string> ReadFile(std::string_view file) override {
    if (!IsSafeFileName(file)) return InvalidArgument("file name '" + std::string(file) + "' is refused");
    Response r = Get(Url(file), *token_, -1, -1);
    if (r.status != 200) return HttpError(r.status, Describe() + "/" + std::string(file));
    return std::move(r.body);
  }
  Result<std::unique_ptr<ByteSource>> OpenFile(std::string_view file) override {
    if (!IsSafeFileName(file)) return InvalidArgument("file name '" + std::string(file) + "' is refused");
    return std::unique_ptr<ByteSource>(
        std::make_unique<XhrFile>(Describe() + "/" + std::string(file), Url(file), token_));
  }

 private:
  std::string Url(std::string_view file) const {
    return endpoint_ + "/" + repo_ + "/resolve/" + commit_ + "/" + std::string(file);
  }
  std::string endpoint_, repo_, commit_;
  std::shared_ptr<const std::string> token_;
};

}  // namespace

std::unique_ptr<ModelSource> OpenXhrModelSource(std::string endpoint, std::string repo, std::string commit,
                                                std::shared_ptr<const std::string> token) {
  return std::make_unique<XhrModelSource>(std::move(endpoint), std::move(repo), std::move(commit), std::move(token));
}

}  // namespace daisy::wasm
