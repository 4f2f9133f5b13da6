// A ModelSource over synchronous XMLHttpRequest byte ranges, for the tab's Web Worker (a
// worker may block on sync XHR; a page's main thread may not). Files are read from
// `{endpoint}/{repo}/resolve/{commit}/{file}` as the Hub serves them: whole small files with
// a plain GET (200), large ones by `Range: bytes=a-b` (206 required: a server that ignores
// the range would send the whole file). A bearer token from the page, when given, goes in
// the Authorization header and nowhere else (never in a message or a log line). Built only
// by the Emscripten build.
#pragma once

#include <memory>
#include <string>

#include "daisy/source.h"

namespace daisy::wasm {

// `endpoint`: the Hub's base URL ("https://huggingface.co", or serve's own mirror);
// `repo`: "owner/name"; `commit`: the pinned revision the head named; `token`: the page's
// token as its tab holds it ("": none), shared so that a token given or forgotten later
// applies to every read from then on, of files already open too.
std::unique_ptr<ModelSource> OpenXhrModelSource(std::string endpoint, std::string repo, std::string commit,
                                                std::shared_ptr<const std::string> token);

}  // namespace daisy::wasm
