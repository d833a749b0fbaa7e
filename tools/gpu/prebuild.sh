#!/usr/bin/env bash
# On this machine (no GPU; nvcc 13.0 as on the GPU machine): builds the GPU machine's usual targets
# in build/ (configured with CUDA for sm_90, as tools/bootstrap.sh does where nvcc is), and packs
# stripped copies of them with the Debian runtime libraries they need into .prebuilt/ (~50 MiB,
# under the device call's 64 MiB). A device call that carries .prebuilt (instead of .gpu-deps) skips its ~95 s build:
# tools/gpu/build_on_device.sh puts the binaries in build-gpu/ when .prebuilt's source hash matches
# the tree it runs on, and builds as before when it does not (or when a target is missing).
# usage: tools/gpu/prebuild.sh [target ...]   (default: selfserve selfserve_cuda test_gpu
#        test_gpu_backend test_gpu_queues); then carry [".prebuilt"] in the device call.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(selfserve selfserve_cuda test_gpu test_gpu_backend test_gpu_queues)
[ -d .gpu-deps ] || tools/gpu/fetch_device_deps.sh
grep -q '^CMAKE_CUDA_COMPILER:' build/CMakeCache.txt 2>/dev/null || {
  echo "prebuild: build/ is not configured with CUDA (tools/bootstrap.sh configures it where nvcc is)" >&2
  exit 1
}
cmake --build build -j "$(nproc)" --target "${TARGETS[@]}"
rm -rf .prebuilt
mkdir -p .prebuilt/deps
for t in "${TARGETS[@]}"; do
  f=$(ss_target_file "$t")
  cp "build/$f" .prebuilt/ && strip ".prebuilt/$f"
done
# The runtime libraries only (ICU, prometheus-cpp's core, xxhash); the -dev packages build, they do
# not run.
for p in libicu72 libprometheus-cpp-core1.0 libxxhash0; do cp .gpu-deps/${p}_*.deb .prebuilt/deps/; done
ss_src_hash > .prebuilt/SOURCE_HASH
du -sh .prebuilt | awk '{print "prebuild: .prebuilt is " $1}'
