#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, build, fetch the default model, run CTest
# (unit tests, GPU tests report themselves skipped without a GPU) and the end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# Where the time goes (CI keeps the whole run under 40 minutes): each stage's end, in seconds.
stamp() { echo "test.sh: $1 done at +${SECONDS}s" >&2; }
SELFSERVE_PY_DEPS=1 tools/bootstrap.sh
stamp "install and build"
./build/selfserve fetch >/dev/null
ctest --test-dir build --output-on-failure -j "$(nproc)"
stamp ctest
# The Go SDK (go/) over the C ABI as `cmake --install` lays it out: vet, and its tests under the race
# detector (greedy output against the CLI's, cancellation, deadlines, typed errors; about a minute).
cmake --install build --prefix build/install >/dev/null
(cd go && export PKG_CONFIG_PATH="$PWD/../build/install/lib/pkgconfig" SELFSERVE_BIN="$PWD/../build/selfserve" &&
  go vet ./... && go test -race -count=1 ./...)
stamp "Go SDK tests"
# The server, engine, backend and C ABI tests again under AddressSanitizer + UBSan (a separate build of
# just them; the backend's SIMD kernels and packed layouts index raw memory). -g1 (line tables only):
# reports keep file:line, the code is RelWithDebInfo's (-O2), and g++ compiles the sanitized tree
# faster (src/server/server.cpp: 169 s against 236 s with -g; this was the script's longest stage).
# Not -O1: it compiles faster still (107 s) but changes floating-point contraction, and the
# transformers comparison of the Q8 KV cache (a top-1 rate near its bound) then differs.
if [ ! -f build-asan/build.ninja ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSELFSERVE_SANITIZE=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DSELFSERVE_CUDA=OFF >/dev/null
fi
cmake --build build-asan -j "$(nproc)" --target test_server test_engine test_backend test_capi_c
stamp "sanitizer build"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  sh -c 'build-asan/test_server --gtest_brief=1 && build-asan/test_engine --gtest_brief=1 &&
         build-asan/test_backend --gtest_brief=1 && build-asan/test_capi_c'
stamp "sanitizer tests"
# Every libFuzzer target (one per fuzz/*_fuzz.cpp, CMake's SELFSERVE_FUZZ section), built with clang
# in its own tree and run for 20 s on its committed corpus (fuzz/corpus/<name>), so that none of
# them rots. New units and any crash go to a scratch folder; a crash or sanitizer report fails the
# run. The long runs are in docs/fuzzing.md.
if [ ! -f build-fuzz/build.ninja ]; then
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DSELFSERVE_FUZZ=ON -DSELFSERVE_TESTS=OFF -DSELFSERVE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
    >/dev/null
fi
fuzzers=()
for src in fuzz/*_fuzz.cpp; do fuzzers+=("$(basename "$src" .cpp)"); done
cmake --build build-fuzz -j "$(nproc)" --target "${fuzzers[@]}"
stamp "fuzz build"
fuzz_scratch=$(mktemp -d)
for f in "${fuzzers[@]}"; do
  name=${f%_fuzz}
  opts=(-max_total_time=20 -print_final_stats=1 -artifact_prefix="$fuzz_scratch/$name-")
  if [ -f "fuzz/$name.dict" ]; then opts+=(-dict="fuzz/$name.dict"); fi
  mkdir -p "$fuzz_scratch/$name"
  if ! "build-fuzz/$f" "${opts[@]}" "$fuzz_scratch/$name" "fuzz/corpus/$name" >"$fuzz_scratch/$name.log" 2>&1; then
    tail -n 60 "$fuzz_scratch/$name.log"
    echo "fuzz: $f failed; its input is in $fuzz_scratch" >&2
    exit 1
  fi
  grep -E '^stat::number_of_executed_units' "$fuzz_scratch/$name.log" | sed "s/^/fuzz: $f: /"
done
rm -rf "$fuzz_scratch"
stamp "fuzz runs"
if [ -d tests/e2e ] && ls tests/e2e/test_*.py >/dev/null 2>&1; then
  SELFSERVE_BIN="$PWD/build/selfserve" python3 -m pytest -q tests/e2e
fi
stamp "end-to-end tests"
