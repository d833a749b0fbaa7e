#!/usr/bin/env bash
# Installs what selfserve needs on a fresh Debian 12 machine (as root or with sudo), configures
# and builds it in ./build. Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
APT_PACKAGES=(cmake ninja-build g++ pkg-config libssl-dev nlohmann-json3-dev libcli11-dev
              libgtest-dev libgmock-dev libbenchmark-dev libicu-dev libboost1.81-dev prometheus-cpp-dev libzstd-dev libxxhash-dev python3 python3-pip
              clang libclang-rt-14-dev  # clang + libFuzzer: tools/test.sh builds and runs the fuzzers
              golang-go)  # the Go SDK (go/) and its tests: Debian's toolchain, standard library only
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python tools for the end-to-end tests (the C++ tests need none: their references are committed).
if [ "${SELFSERVE_PY_DEPS:-0}" = 1 ]; then
  python3 -m pip install -q --disable-pip-version-check pytest numpy gguf openai requests matplotlib prometheus-client jsonschema opentelemetry-proto
fi

BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  # CUDA code is compiled for sm_90 only (the H200) so CI stays quick; no GPU is needed to build.
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
