// FindAsset over the generated tables (embed_assets.cmake).
#include "assets.h"

namespace daisy::srv {

const Asset* FindAsset(std::string_view path) {
  if (path == "/") path = "/index.html";
  if (path == "/join") path = "/join.html";
  for (std::span<const Asset> table : {WebAssets(), EngineAssets()})
    for (const Asset& a : table)
      if (a.path == path) return &a;
  return nullptr;
}

}  // namespace daisy::srv
