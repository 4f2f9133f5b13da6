#!/usr/bin/env bash
# `make test` after the main build: ctest, clang-tidy, then the ASan parsers, the fuzz smoke,
# arm64 under qemu and wasm under node.js. Most of ctest's wall time is its serial ring
# tests waiting on sockets and timers, so the builds of the last four stages (`make
# prebuild`) run beside ctest and tidy at the lowest CPU priority (nice 19: a test process
# that wants the CPU gets it); the stages then only run. Stops at the first failure, as a
# plain make would, and stops the background builds with it.
#   env: BUILD (main build folder), JOBS; the build folders of the stages as in the Makefile
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD:-build}
jobs=${JOBS:-$(nproc)}
log=$build/prebuild.log
start=$SECONDS

# setsid: the background builds are one process group, stopped together on a failure.
setsid nice -n 19 make --no-print-directory prebuild JOBS="$jobs" >"$log" 2>&1 &
pre=$!
stop_prebuild() {
  kill -- "-$pre" 2>/dev/null || true
  wait "$pre" 2>/dev/null || true
}
trap stop_prebuild EXIT

make --no-print-directory test-unit BUILD="$build" JOBS="$jobs"
echo "test-all: ctest done at $((SECONDS - start)) s"
make --no-print-directory tidy BUILD="$build" JOBS="$jobs"
echo "test-all: tidy done at $((SECONDS - start)) s"
if ! wait "$pre"; then
  trap - EXIT
  echo "test-all: the background builds (make prebuild) failed; the end of $log:" >&2
  tail -n 60 "$log" >&2
  exit 1
fi
trap - EXIT
echo "test-all: the background builds were done by $((SECONDS - start)) s ($log)"
make --no-print-directory test-asan fuzz-smoke test-arm64 test-wasm BUILD="$build" JOBS="$jobs"
echo "test-all: all passed in $((SECONDS - start)) s after the main build"
