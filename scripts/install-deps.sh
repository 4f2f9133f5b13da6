#!/usr/bin/env bash
# Installs the Debian 12 packages the build and the tests need. Idempotent: when every
# package is already installed it changes nothing and asks no network.
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
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
