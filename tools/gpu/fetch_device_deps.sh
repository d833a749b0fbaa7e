#!/usr/bin/env bash
# Here (Debian 12): downloads the -dev packages the GPU machine's image lacks into .gpu-deps/
# (git-ignored), to be carried to it (the device tool's `carry`); tools/gpu/build_on_device.sh
# unpacks them there.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu-deps
cd .gpu-deps
apt-get download libicu-dev libicu72 prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 \
  libprometheus-cpp-push1.0 libgtest-dev libxxhash-dev libxxhash0
