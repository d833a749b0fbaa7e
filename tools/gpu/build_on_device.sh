#!/usr/bin/env bash
# On the GPU machine (Ubuntu 24.04 image with nvcc, CMake, ninja and most -dev headers, but no ICU
# or prometheus-cpp development files): unpacks the Debian packages carried in .gpu-deps/
# (tools/gpu/fetch_device_deps.sh fetches them here), configures build-gpu/ against them with CUDA
# for sm_90 and builds the given targets (default: everything).
# usage: tools/gpu/build_on_device.sh [target ...]; afterwards `source build-gpu/env.sh` sets
# LD_LIBRARY_PATH for the carried libraries. BUILD_DIR (default build-gpu) and CMAKE_EXTRA (more
# -D settings, for an A/B baseline build beside the main one) are read from the environment.
#
# With .prebuilt/ carried (tools/gpu/prebuild.sh packs it on the development machine) whose source
# hash matches this tree and which holds every target asked for, those binaries go into build-gpu/
# with no build (~95 s saved a cold call); otherwise it builds, which needs .gpu-deps/.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
DEPS=${DEPS:-/tmp/ssdeps}
mkdir -p "$DEPS"
BD=${BUILD_DIR:-build-gpu}
if [ $# -gt 0 ] && [ -f .prebuilt/SOURCE_HASH ] && [ "$(cat .prebuilt/SOURCE_HASH)" = "$(ss_src_hash)" ]; then
  ok=1
  for t in "$@" selfserve_cuda; do [ -f ".prebuilt/$(ss_target_file "$t")" ] || ok=0; done
  if [ $ok = 1 ]; then
    for f in .prebuilt/deps/*.deb; do dpkg -x "$f" "$DEPS"; done
    mkdir -p "$BD"
    for t in "$@" selfserve_cuda; do cp ".prebuilt/$(ss_target_file "$t")" "$BD/"; done
    echo "export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" > "$BD/env.sh"
    echo "build_on_device: prebuilt binaries for $* (source hash $(cat .prebuilt/SOURCE_HASH | cut -c1-12))"
    exit 0
  fi
  echo "build_on_device: .prebuilt lacks a target asked for; building"
elif [ -f .prebuilt/SOURCE_HASH ]; then
  echo "build_on_device: .prebuilt was built from other sources; building"
fi
[ -d .gpu-deps ] || { echo "build_on_device: no .gpu-deps/ to build with (tools/gpu/fetch_device_deps.sh)" >&2; exit 1; }
for f in .gpu-deps/*.deb; do dpkg -x "$f" "$DEPS"; done
LIBDIR="$DEPS/usr/lib/x86_64-linux-gnu"
# prometheus-cpp's package config asks for civetweb, ZLIB and CURL (for its pull and push parts, which
# selfserve does not link): stand-ins that define their targets, empty.
SHIM="$DEPS/shim"
mkdir -p "$SHIM"
for pkg in civetweb:civetweb::civetweb-cpp ZLIB:ZLIB::ZLIB CURL:CURL::libcurl; do
  name=${pkg%%:*}; target=${pkg#*:}
  printf 'if(NOT TARGET %s)\n  add_library(%s INTERFACE IMPORTED)\nendif()\nset(%s_FOUND TRUE)\n' \
    "$target" "$target" "$name" > "$SHIM/${name}Config.cmake"
done
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# pkg-config files (libxxhash) name prefix=/usr: point them at the unpacked tree.
for pc in "$LIBDIR"/pkgconfig/*.pc; do
  [ -f "$pc" ] && sed -i "s|^prefix=/usr\$|prefix=$DEPS/usr|" "$pc"
done
export PKG_CONFIG_PATH="$LIBDIR/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
if [ ! -f "$BD/build.ninja" ]; then
  cmake -S . -B "$BD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DSELFSERVE_CUDA=ON -DSELFSERVE_WERROR=OFF \
    -DCMAKE_PREFIX_PATH="$DEPS/usr;$LIBDIR/cmake" -DICU_ROOT="$DEPS/usr" -DCMAKE_FIND_PACKAGE_PREFER_CONFIG=ON \
    -Dcivetweb_DIR="$SHIM" -DZLIB_DIR="$SHIM" -DCURL_DIR="$SHIM" \
    -DCMAKE_BUILD_RPATH="$LIBDIR" ${CMAKE_EXTRA:-} >/dev/null
fi
echo "export LD_LIBRARY_PATH=$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" > "$BD/env.sh"
if [ $# -gt 0 ]; then
  cmake --build "$BD" -j "$(nproc)" --target "$@" -- -k 0
else
  cmake --build "$BD" -j "$(nproc)" -- -k 0
fi
