#!/usr/bin/env bash
# Cross-builds for arm64 (Debian's g++-aarch64-linux-gnu) the modules the forward pass needs
# and their bit-identity tests (tests/arm64/CMakeLists.txt), and runs them under qemu-user:
#   - on a CPU with the dot-product extension (neoverse-n1): kernels and detmath tests, the
#     forward tests on synthetic models and on stories260K (split == unsplit, KV cache ==
#     recompute, chunked == one-shot prefill, NEON == scalar) and the x86-64 golden digest
#     of stories260K's logits, so arm64 gives x86's bits; NEON must run, never skip;
#   - on one without (cortex-a53): NEON must be reported unsupported and scalar pass.
# `make test-arm64` runs it, and `make test` runs that. See docs/KERNELS.md, "arm64".
#   needs: scripts/install-deps.sh (g++-aarch64-linux-gnu qemu-user; no binfmt registration)
#   env:   BUILD_DIR (default build-arm64, incremental), JOBS (default 2),
#          SKIP_DETMATH=1 skips detmath_test (the slowest part under qemu)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-arm64}
for tool in aarch64-linux-gnu-g++ qemu-aarch64 cmake ninja; do
  command -v "$tool" >/dev/null || { echo "test-arm64: $tool not found (run scripts/install-deps.sh)" >&2; exit 2; }
done
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

start=$SECONDS
cmake -S "$root/tests/arm64" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64-toolchain.cmake" "${launcher[@]}" >/dev/null
cmake --build "$build" -j"${JOBS:-2}"
built=$SECONDS
if [[ -n "${BUILD_ONLY:-}" ]]; then echo "test-arm64: built in $((built - start)) s (BUILD_ONLY: not run)"; exit 0; fi

# qemu-user (7.2) aborts when a child forked from a multithreaded guest starts a thread
# (TCG assertion "cpu == current_cpu"), so the fork test runs on real hardware only.
# GreedyAgreesWithReferencePrefix measures agreement with llama2.c's f32 run, not
# bit-identity; the golden digest already pins every logit bit to x86's.
qemu_excluded='-KernelsTest.ProductsWorkInAForkedChild:Stories.GreedyAgreesWithReferencePrefix'

run() {  # run CPU BINARY [gtest filter]
  local cpu=$1 bin=$2 filter=${3:-*}
  echo "== $bin on qemu-aarch64 -cpu $cpu ($filter)"
  # The test binaries find models/ and testdata/ themselves (tests/test_env.cc); a bounded
  # run: a hang under qemu ends the script rather than make test.
  timeout 600 qemu-aarch64 -cpu "$cpu" -L /usr/aarch64-linux-gnu "$build/$bin" --gtest_brief=1 \
    --gtest_filter="$filter$qemu_excluded"
}

# run_neon CPU BINARY FILTER: the NEON instances must all run and pass (none skipped).
run_neon() {
  local out
  out=$(run "$@") || { echo "$out"; exit 1; }
  echo "$out"
  if grep -q "SKIPPED" <<<"$out" || ! grep -q "PASSED" <<<"$out"; then
    echo "test-arm64: NEON tests were skipped on a dotprod CPU ($2 $3)" >&2
    exit 1
  fi
}

# With dotprod: everything passes, and the NEON instances really ran (none skipped).
run neoverse-n1 kernels_test
run_neon neoverse-n1 kernels_test '*/neon'
# The forward pass on arm64: synthetic models, then stories260K (its golden digest test
# checks scalar and NEON against the value computed on x86-64).
run neoverse-n1 forward_test
run_neon neoverse-n1 forward_test '*/neon'
out=$(run neoverse-n1 forward_stories_test) || { echo "$out"; exit 1; }
echo "$out"
if ! grep -q "digest on neon" <<<"$out"; then
  echo "test-arm64: the stories260K digest was not checked on NEON" >&2
  exit 1
fi
# The deterministic math must give the golden bits on arm64 too (slow under qemu: ~1.5 min).
if [[ -z "${SKIP_DETMATH:-}" ]]; then run neoverse-n1 detmath_test; fi

# Without dotprod: NEON is reported unsupported (its instances skip), scalar passes everything.
run cortex-a53 kernels_test
out=$(run cortex-a53 kernels_test '*/neon') || { echo "$out"; exit 1; }
if ! grep -q "SKIPPED" <<<"$out"; then
  echo "test-arm64: NEON was not skipped on a CPU without dotprod" >&2
  exit 1
fi
echo "test-arm64: all passed (build $((built - start)) s, tests under qemu $((SECONDS - built)) s)"
