#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, build, fetch the default model, run CTest
# (unit tests, GPU tests report themselves skipped without a GPU) and the end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
SELFSERVE_PY_DEPS=1 tools/bootstrap.sh
./build/selfserve fetch >/dev/null
ctest --test-dir build --output-on-failure -j "$(nproc)"
# The server, engine and backend tests again under AddressSanitizer + UBSan (a separate build of
# just them; the backend's SIMD kernels and packed layouts index raw memory).
if [ ! -f build-asan/build.ninja ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSELFSERVE_SANITIZE=ON \
    -DSELFSERVE_CUDA=OFF >/dev/null
fi
cmake --build build-asan -j "$(nproc)" --target test_server test_engine test_backend
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  sh -c 'build-asan/test_server --gtest_brief=1 && build-asan/test_engine --gtest_brief=1 &&
         build-asan/test_backend --gtest_brief=1'
if [ -d tests/e2e ] && ls tests/e2e/test_*.py >/dev/null 2>&1; then
  SELFSERVE_BIN="$PWD/build/selfserve" python3 -m pytest -q tests/e2e
fi
