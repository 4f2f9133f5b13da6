// The web UI's files and the join page's, embedded in the binary at build time
// (embed_assets.cmake writes web_assets.cc from web/ and engine_assets.cc from the browser
// node's wasm build), so the pages work offline and need no files next to the binary.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

namespace daisy::srv {

struct Asset {
  std::string_view path;          // "/index.html", "/app.js", "/daisy_engine.wasm", ...
  std::string_view content_type;  // with charset for text
  std::string_view bytes;
};

// The embedded file for a request path ("/" is "/index.html", "/join" is "/join.html");
// nullptr when there is none.
const Asset* FindAsset(std::string_view path);

// The two generated tables: web/'s files, and the browser node's module (daisy_engine.js
// and .wasm; empty when the binary was built without Emscripten).
std::span<const Asset> WebAssets();
std::span<const Asset> EngineAssets();

}  // namespace daisy::srv
