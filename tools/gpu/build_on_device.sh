#!/usr/bin/env bash
# On the GPU machine (Ubuntu 24.04 image with nvcc, CMake, ninja and most -dev headers, but no ICU
# or prometheus-cpp development files): unpacks the Debian packages carried in .gpu-deps/
# (tools/gpu/fetch_device_deps.sh fetches them here), configures build-gpu/ against them with CUDA
# for sm_90 and builds the given targets (default: everything).
# usage: tools/gpu/build_on_device.sh [target ...]; afterwards `source build-gpu/env.sh` sets
# LD_LIBRARY_PATH for the carried libraries. BUILD_DIR (default build-gpu) and CMAKE_EXTRA (more
# -D settings, for an A/B baseline build beside the main one) are read from the environment.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEPS=${DEPS:-/tmp/ssdeps}
mkdir -p "$DEPS"
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
BD=${BUILD_DIR:-build-gpu}
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
