#!/usr/bin/env bash
# Builds the Emscripten project tests/wasm (Debian's emscripten): the portable modules, their
# bit-identity tests and the JS-callable engine (apps/wasm). Configures BUILD_DIR once
# (emcmake), then builds incrementally; a CMakeLists change reconfigures by itself.
#   scripts/build-wasm.sh [TARGET...]   no target: everything (scripts/test-wasm.sh);
#                                       daisy_engine: the browser node's module, which the
#                                       native build embeds in serve (src/server/CMakeLists.txt);
#                                       daisy_tab_module: the tab's ring member, embedded beside it
#   env: BUILD_DIR (default build-wasm), JOBS (default 2)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-wasm}
for tool in em++ emcmake node cmake ninja; do
  command -v "$tool" >/dev/null || { echo "build-wasm: $tool not found (run scripts/install-deps.sh)" >&2; exit 2; }
done
# Debian's emscripten runs its JavaScript optimizer with the acorn parser of Debian's
# node-acorn (/usr/share/nodejs), which a node.js not from Debian does not search.
export NODE_PATH=/usr/share/nodejs${NODE_PATH:+:$NODE_PATH}
# Debian ships Emscripten's system libraries prebuilt in its read-only, frozen cache
# (/usr/share/emscripten/cache): the first run builds nothing there and works for any user.
# EM_CACHE, when set, must hold a complete cache of the same version.
# One build at a time in a folder (two ninjas in one tree can corrupt its logs): the native
# build's engine step and `make wasm-build` may be pointed at the same folder.
mkdir -p "$build"
exec 9>"$build/.daisy-build.lock"
flock 9
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  emcmake cmake -S "$root/tests/wasm" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build" -j"${JOBS:-2}" "${targets[@]}"
