// The web UI's files, embedded in the binary at build time (embed_assets.cmake writes
// web_assets.cc from web/index.html, web/app.js and web/style.css), so the UI works offline
// and needs no files next to the binary.
#pragma once

#include <cstddef>
#include <string_view>

namespace daisy::srv {

struct Asset {
  std::string_view path;          // "/index.html", "/app.js", "/style.css"
  std::string_view content_type;  // with charset
  std::string_view bytes;
};

// The embedded file for a request path ("/" is "/index.html"); nullptr when there is none.
const Asset* FindAsset(std::string_view path);

}  // namespace daisy::srv
