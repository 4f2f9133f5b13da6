#!/usr/bin/env bash
# Cross-builds the kernels module and its tests for arm64 (Debian's g++-aarch64-linux-gnu)
# and runs them under qemu-user twice: on a CPU with the dot-product extension
# (neoverse-n1: the NEON backend must be supported and pass every test) and on one without
# (cortex-a53: NEON must be reported unsupported and scalar used). See docs/KERNELS.md.
#   needs: apt-get install g++-aarch64-linux-gnu qemu-user   (no binfmt registration needed)
#   env:   BUILD_DIR (default build-arm64), JOBS (default 2), SKIP_DETMATH=1 to skip detmath_test
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-arm64}
for tool in aarch64-linux-gnu-g++ qemu-aarch64 cmake ninja; do
  command -v "$tool" >/dev/null || { echo "test-arm64: $tool not found (apt-get install g++-aarch64-linux-gnu qemu-user cmake ninja-build)" >&2; exit 2; }
done

cmake -S "$root/src/kernels/cross" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64-toolchain.cmake" >/dev/null
cmake --build "$build" -j"${JOBS:-2}"

# qemu-user (7.2) aborts when a child forked from a multithreaded guest starts a thread
# (TCG assertion "cpu == current_cpu"), so the fork test runs on real hardware only.
qemu_excluded='-KernelsTest.ProductsWorkInAForkedChild'

run() {  # run CPU BINARY [gtest filter]
  local cpu=$1 bin=$2 filter=${3:-*}
  echo "== $bin on qemu-aarch64 -cpu $cpu"
  DAISY_TESTDATA="$root/testdata" DAISY_SOURCE_DIR="$root" \
    qemu-aarch64 -cpu "$cpu" -L /usr/aarch64-linux-gnu "$build/$bin" --gtest_brief=1 \
    --gtest_filter="$filter$qemu_excluded"
}

# With dotprod: everything passes, and the NEON instances really ran (none skipped).
run neoverse-n1 kernels_test
out=$(run neoverse-n1 kernels_test '*/neon')
if grep -q "SKIPPED" <<<"$out" || ! grep -q "PASSED" <<<"$out"; then
  echo "test-arm64: NEON tests were skipped on a dotprod CPU" >&2
  exit 1
fi
# The deterministic math must give the golden bits on arm64 too (slow under qemu: ~1.5 min).
if [[ -x "$build/detmath_test" && -z "${SKIP_DETMATH:-}" ]]; then run neoverse-n1 detmath_test; fi

# Without dotprod: NEON is reported unsupported (its instances skip), scalar passes everything.
run cortex-a53 kernels_test
out=$(run cortex-a53 kernels_test '*/neon')
if ! grep -q "SKIPPED" <<<"$out"; then
  echo "test-arm64: NEON was not skipped on a CPU without dotprod" >&2
  exit 1
fi
echo "test-arm64: all passed"
