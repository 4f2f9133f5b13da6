#!/usr/bin/env bash
# Installs the Debian 12 packages the build and the tests need, and the npm packages of the
# web tests (tests/web, pinned by its package-lock.json). Idempotent: when every package is
# already installed and tests/web/node_modules matches the lock file it changes nothing and
# asks no network. Node.js 20 and npm are expected on the machine (Debian 12's nodejs is
# older); without npm the web tests fail with a message pointing here.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libcurl4-openssl-dev          # Hub client
  libzmq3-dev cppzmq-dev        # ring and rendezvous
  libcpp-httplib-dev            # HTTP server (and the test Hub server)
  nlohmann-json3-dev libcli11-dev
  libpcre2-dev libutf8proc-dev  # tokenizer
  libxxhash-dev                 # probe and activation hashes
  libgtest-dev libgmock-dev libbenchmark-dev
  libsodium-dev                 # key fingerprints (BLAKE2b)
  chromium fonts-dejavu-core    # browser tests (tests/web, driven by playwright-core)
  zbar-tools                    # zbarimg: decodes the UI's QR codes in the browser tests
  clang-14 libclang-rt-14-dev   # libFuzzer targets (make fuzz, the smoke in make test)
  clang-format clang-tidy       # make format, make lint (in make test): .clang-format, .clang-tidy
  tcpdump                       # the loopback capture test
  g++-aarch64-linux-gnu qemu-user  # arm64 tests under qemu (make test-arm64, in make test)
  emscripten                    # the wasm build and its tests under node (make test-wasm, in make test)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} > 0)); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The web tests' npm packages: `npm ci` when node_modules is missing or was installed from
# another package-lock.json (its hash is kept in node_modules after a successful install).
WEB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/web"
if [[ -f "$WEB_DIR/package-lock.json" ]]; then
  lock_hash="$(sha256sum "$WEB_DIR/package-lock.json" | cut -d' ' -f1)"
  stamp="$WEB_DIR/node_modules/.daisy-lock-sha256"
  if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$lock_hash" ]]; then
    if command -v npm >/dev/null 2>&1; then
      echo "install-deps: npm ci in tests/web"
      (cd "$WEB_DIR" && npm ci --no-audit --no-fund --loglevel=error)
      echo "$lock_hash" >"$stamp"
    else
      echo "install-deps: WARNING: npm not found; the web tests (tests/web) need Node.js 20 and npm" >&2
    fi
  fi
fi
